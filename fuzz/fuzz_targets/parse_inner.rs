//! Any byte string given to `parse_inner` must either be refused or produce offsets in
//! order and inside the frame; the views built from those offsets must not panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wire::meta::{parse_inner, L3};

fuzz_target!(|frame: &[u8]| {
    let Ok(m) = parse_inner(frame) else {
        return;
    };
    assert!(m.l3_off <= m.l4_off);
    assert!(m.l4_off <= m.payload_off);
    assert!(m.payload_off <= m.ip_end);
    assert!(m.ip_end <= frame.len());
    // The checked views accept what the fast parser accepted.
    let ip = &frame[m.l3_off..m.ip_end];
    match m.l3 {
        L3::Ipv4 => {
            let p = wire::ipv4::Packet::new_checked(ip).expect("ipv4 view");
            assert_eq!(m.l3_off + p.header_len(), m.l4_off);
            assert!(p.verify_checksum());
        }
        L3::Ipv6 => {
            let p = wire::ipv6::Packet::new_checked(ip).expect("ipv6 view");
            assert_eq!(p.hop_limit(), m.hop_limit);
        }
        L3::Arp | L3::Other(_) => return,
    }
    if m.proto == wire::ipv4::protocol::TCP && m.payload_off > m.l4_off {
        let t = wire::tcp::Packet::new_checked(&frame[m.l4_off..m.ip_end]).expect("tcp view");
        assert_eq!(m.l4_off + t.header_len(), m.payload_off);
        // Options may be malformed (the fast path does not read them); iterating must
        // still terminate without panicking.
        for opt in t.option_iter() {
            let _ = opt;
        }
    }
});
