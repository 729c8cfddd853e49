//! Any byte string given to `parse_underlay` must either be refused with a reason or
//! yield an inner frame inside the buffer that holds at least an Ethernet header.
//!
//! The same bytes as an AF_XDP buffer chain: `parse_underlay_head` on a first piece of
//! `h` bytes must decide exactly as `parse_underlay` on the whole frame, or not at
//! all, and must decide once the piece holds `OUTER_MAX_LEN` bytes; so must
//! `parse_inner_head` on the inner frame's part of that piece. `h` comes from the first
//! two bytes, the outer destination MAC, which no decision reads.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wire::meta::{
    parse_inner, parse_inner_head, parse_underlay, parse_underlay_head, UnderlayDrop, OUTER_MAX_LEN,
};

fuzz_target!(|frame: &[u8]| {
    let whole = parse_underlay(frame);
    let h = match frame {
        [a, b, ..] => usize::from(u16::from_be_bytes([*a, *b])) % (frame.len() + 1),
        _ => frame.len(),
    };
    let head = parse_underlay_head(&frame[..h], frame.len());
    assert!(head.is_none() || head == Some(whole), "head {h}: {head:?}");
    if h >= OUTER_MAX_LEN.min(frame.len()) {
        assert!(head.is_some(), "head {h} of {} undecided", frame.len());
    }
    // A head longer than the claimed total is parsed as the whole frame.
    assert_eq!(parse_underlay_head(frame, h), Some(whole));
    match whole {
        Ok(m) => {
            assert!(m.inner_off + 14 <= m.inner_end);
            assert!(m.inner_end <= frame.len());
            assert!(m.vni <= wire::geneve::MAX_VNI);
            if let Some(mss) = m.mss {
                assert!(mss != 0 && mss <= u16::MAX as u32);
            }
            // The engine parses the inner frame next, from the same first piece when
            // the underlay parse decided from it.
            let inner = parse_inner(&frame[m.inner_off..m.inner_end]);
            if head.is_some() {
                let inner_head = parse_inner_head(
                    &frame[m.inner_off..m.inner_end.min(h)],
                    m.inner_end - m.inner_off,
                );
                assert!(inner_head.is_none() || inner_head == Some(inner));
            }
        }
        Err(reason) => assert!(UnderlayDrop::ALL.contains(&reason)),
    }
});
