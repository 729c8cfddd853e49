//! Any byte string given to `parse_inner` must either be refused or produce offsets in
//! order and inside the frame; the views built from those offsets must not panic.
//!
//! The same bytes as an AF_XDP buffer chain: `parse_inner_head` on a first piece of
//! `h` bytes must decide exactly as `parse_inner` on the whole frame, or not at all.
//! `h` comes from the first two bytes, the destination MAC, which no decision reads,
//! so every split of every frame the fuzzer reaches can be tried.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wire::meta::{parse_inner, parse_inner_head, L3};

fuzz_target!(|frame: &[u8]| {
    let whole = parse_inner(frame);
    let h = match frame {
        [a, b, ..] => usize::from(u16::from_be_bytes([*a, *b])) % (frame.len() + 1),
        _ => frame.len(),
    };
    let head = parse_inner_head(&frame[..h], frame.len());
    assert!(head.is_none() || head == Some(whole), "head {h}: {head:?}");
    // The whole frame as the head always decides, and a head longer than the claimed
    // total is parsed as the whole frame.
    assert_eq!(parse_inner_head(frame, frame.len()), Some(whole));
    assert_eq!(parse_inner_head(frame, h), Some(whole));

    let Ok(m) = whole else {
        return;
    };
    assert!(m.l3_off <= m.l4_off);
    assert!(m.l4_off <= m.payload_off);
    assert!(m.payload_off <= m.ip_end);
    assert!(m.ip_end <= frame.len());
    // A head holding every header decides.
    if h >= m.payload_off {
        assert!(head.is_some(), "head {h} of {m:?}");
    }
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
