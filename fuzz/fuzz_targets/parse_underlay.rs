//! Any byte string given to `parse_underlay` must either be refused with a reason or
//! yield an inner frame inside the buffer that holds at least an Ethernet header.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wire::meta::{parse_inner, parse_underlay, UnderlayDrop};

fuzz_target!(|frame: &[u8]| {
    match parse_underlay(frame) {
        Ok(m) => {
            assert!(m.inner_off + 14 <= m.inner_end);
            assert!(m.inner_end <= frame.len());
            assert!(m.vni <= wire::geneve::MAX_VNI);
            if let Some(mss) = m.mss {
                assert!(mss != 0 && mss <= u16::MAX as u32);
            }
            // The engine parses the inner frame next.
            let _ = parse_inner(&frame[m.inner_off..m.inner_end]);
        }
        Err(reason) => assert!(UnderlayDrop::ALL.contains(&reason)),
    }
});
