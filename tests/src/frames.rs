//! Building frames byte by byte for the hostile-input tests: guest (inner) frames and
//! their Geneve/IPv6 encapsulation, with every length and checksum right, so a test
//! can then make exactly one of them lie. Written from the RFCs, not with the
//! datapath's own `wire` crate: the frames test that code, so they must not come
//! from it.
//!
//! Also the XDP program's verdict on a frame ([`xdp_verdict`], a model of
//! `xdp-prog/src/steer.bpf.c`), and the marker every hostile frame carries in its
//! payload so a capture can tell it from legitimate traffic.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Offsets in an outer frame: Ethernet 14, IPv6 40, UDP 8, Geneve 8.
pub const OUTER_IP: usize = 14;
pub const OUTER_UDP: usize = 54;
pub const GENEVE: usize = 62;
/// Where the options (and, without options, the inner frame) start.
pub const GENEVE_OPTIONS: usize = 70;
/// Where the inner frame's IP header starts (after its Ethernet header).
pub const L3: usize = 14;

pub const ETHERTYPE_IPV4: u16 = 0x0800;
pub const ETHERTYPE_ARP: u16 = 0x0806;
pub const ETHERTYPE_IPV6: u16 = 0x86dd;
pub const ETHERTYPE_VLAN: u16 = 0x8100;
/// Geneve protocol type of an Ethernet payload.
pub const TRANSPARENT_ETHERNET: u16 = 0x6558;
pub const GENEVE_PORT: u16 = 6081;
pub const PROTO_TCP: u8 = 6;
pub const PROTO_UDP: u8 = 17;
pub const PROTO_ICMP: u8 = 1;
pub const PROTO_ICMPV6: u8 = 58;
pub const PROTO_FRAGMENT: u8 = 44;
pub const PROTO_HOP_BY_HOP: u8 = 0;
/// The Oxide Geneve option class and its option types.
pub const OXIDE_CLASS: u16 = 0x0129;
pub const OXIDE_EXTERNAL: u8 = 0x00;
pub const OXIDE_MULTICAST: u8 = 0x01;
pub const OXIDE_MSS: u8 = 0x02;
/// TCP flags.
pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;
pub const TCP_PSH: u8 = 0x08;
pub const TCP_ACK: u8 = 0x10;

/// One end of an inner flow: a guest's MAC and one of its addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Host {
    pub mac: [u8; 6],
    pub ip: IpAddr,
}

/// The transport header of an inner frame.
#[derive(Clone, Copy, Debug)]
pub enum L4 {
    Tcp {
        sport: u16,
        dport: u16,
        seq: u32,
        ack: u32,
        flags: u8,
    },
    Udp {
        sport: u16,
        dport: u16,
    },
    /// ICMP (for IPv4) or ICMPv6 echo request.
    Echo {
        id: u16,
        seq: u16,
    },
}

impl L4 {
    fn header_len(&self) -> usize {
        match self {
            L4::Tcp { .. } => 20,
            L4::Udp { .. } | L4::Echo { .. } => 8,
        }
    }
}

/// The outer headers of an underlay frame.
#[derive(Clone, Copy, Debug)]
pub struct Outer {
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    pub src: Ipv6Addr,
    pub dst: Ipv6Addr,
    pub vni: u32,
}

/// An inner Ethernet frame from `src` to `dst` (both of one address family) carrying
/// `l4` and `payload`, every length and checksum right.
///
/// # Panics
/// If the families differ: a bug in the test that builds the frame.
pub fn inner(src: Host, dst: Host, l4: L4, payload: &[u8]) -> Vec<u8> {
    let mut f = ethernet(
        dst.mac,
        src.mac,
        match src.ip {
            IpAddr::V4(_) => ETHERTYPE_IPV4,
            IpAddr::V6(_) => ETHERTYPE_IPV6,
        },
    );
    let l4_len = l4.header_len() + payload.len();
    let proto = match (l4, src.ip) {
        (L4::Tcp { .. }, _) => PROTO_TCP,
        (L4::Udp { .. }, _) => PROTO_UDP,
        (L4::Echo { .. }, IpAddr::V4(_)) => PROTO_ICMP,
        (L4::Echo { .. }, IpAddr::V6(_)) => PROTO_ICMPV6,
    };
    match (src.ip, dst.ip) {
        (IpAddr::V4(s), IpAddr::V4(d)) => f.extend(ipv4_header(s, d, proto, l4_len)),
        (IpAddr::V6(s), IpAddr::V6(d)) => f.extend(ipv6_header(s, d, proto, l4_len)),
        _ => panic!("inner frame from {} to {}: mixed families", src.ip, dst.ip),
    }
    let l4_off = f.len();
    f.extend(l4_header(l4, l4_len, src.ip.is_ipv6()));
    f.extend_from_slice(payload);
    fill_l4_checksum(&mut f, L3);
    debug_assert_eq!(f.len(), l4_off + l4_len);
    f
}

/// An Ethernet header.
pub fn ethernet(dst: [u8; 6], src: [u8; 6], ethertype: u16) -> Vec<u8> {
    let mut f = Vec::with_capacity(128);
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f
}

/// A 20-byte IPv4 header (DF set, TTL 64) with its checksum.
fn ipv4_header(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, payload_len: usize) -> Vec<u8> {
    let total = u16::try_from(20 + payload_len).unwrap_or(u16::MAX);
    let mut h = vec![0x45, 0];
    h.extend_from_slice(&total.to_be_bytes());
    h.extend_from_slice(&[0x12, 0x34, 0x40, 0, 64, proto, 0, 0]);
    h.extend_from_slice(&src.octets());
    h.extend_from_slice(&dst.octets());
    let c = checksum(&h, 0);
    h[10..12].copy_from_slice(&c.to_be_bytes());
    h
}

/// A 40-byte IPv6 header (hop limit 64).
pub fn ipv6_header(src: Ipv6Addr, dst: Ipv6Addr, next: u8, payload_len: usize) -> Vec<u8> {
    let plen = u16::try_from(payload_len).unwrap_or(u16::MAX);
    let mut h = vec![0x60, 0, 0, 0];
    h.extend_from_slice(&plen.to_be_bytes());
    h.extend_from_slice(&[next, 64]);
    h.extend_from_slice(&src.octets());
    h.extend_from_slice(&dst.octets());
    h
}

/// The transport header, checksum zero (filled in once the payload is there).
fn l4_header(l4: L4, l4_len: usize, v6: bool) -> Vec<u8> {
    match l4 {
        L4::Tcp {
            sport,
            dport,
            seq,
            ack,
            flags,
        } => {
            let mut h = Vec::with_capacity(20);
            h.extend_from_slice(&sport.to_be_bytes());
            h.extend_from_slice(&dport.to_be_bytes());
            h.extend_from_slice(&seq.to_be_bytes());
            h.extend_from_slice(&ack.to_be_bytes());
            h.extend_from_slice(&[0x50, flags, 0xff, 0xff, 0, 0, 0, 0]);
            h
        }
        L4::Udp { sport, dport } => {
            let len = u16::try_from(l4_len).unwrap_or(u16::MAX);
            let mut h = Vec::with_capacity(8);
            h.extend_from_slice(&sport.to_be_bytes());
            h.extend_from_slice(&dport.to_be_bytes());
            h.extend_from_slice(&len.to_be_bytes());
            h.extend_from_slice(&[0, 0]);
            h
        }
        L4::Echo { id, seq } => {
            let mut h = vec![if v6 { 128 } else { 8 }, 0, 0, 0];
            h.extend_from_slice(&id.to_be_bytes());
            h.extend_from_slice(&seq.to_be_bytes());
            h
        }
    }
}

/// Computes the transport checksum (TCP, UDP, ICMP, ICMPv6) of the IPv4/IPv6 packet
/// at `l3` in `f`, over the bytes the IP header's own length says: call it before
/// making that length lie, and again after editing the transport header.
pub fn fill_l4_checksum(f: &mut [u8], l3: usize) {
    let v4 = f[l3] >> 4 == 4;
    let (proto, l4, end) = if v4 {
        let ihl = usize::from(f[l3] & 0x0f) * 4;
        (f[l3 + 9], l3 + ihl, l3 + usize::from(be16(f, l3 + 2)))
    } else {
        (f[l3 + 6], l3 + 40, l3 + 40 + usize::from(be16(f, l3 + 4)))
    };
    let csum_at = match proto {
        PROTO_TCP => l4 + 16,
        PROTO_UDP => l4 + 6,
        PROTO_ICMP | PROTO_ICMPV6 => l4 + 2,
        _ => return,
    };
    f[csum_at..csum_at + 2].fill(0);
    let pseudo = match (v4, proto) {
        (true, PROTO_ICMP) => 0,
        (true, _) => pseudo_sum(&f[l3 + 12..l3 + 20], proto, end - l4),
        (false, _) => pseudo_sum(&f[l3 + 8..l3 + 40], proto, end - l4),
    };
    let c = checksum(&f[l4..end], pseudo);
    f[csum_at..csum_at + 2].copy_from_slice(&c.to_be_bytes());
}

/// Recomputes the IPv4 header checksum at `l3` (after editing a header field, so
/// the checksum is not what gets the frame refused).
pub fn fill_ipv4_checksum(f: &mut [u8], l3: usize) {
    let ihl = (usize::from(f[l3] & 0x0f) * 4).max(20);
    let end = (l3 + ihl).min(f.len());
    f[l3 + 10..l3 + 12].fill(0);
    let c = checksum(&f[l3..end], 0);
    f[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
}

/// Sum of the pseudo-header: both addresses, the protocol and the L4 length.
fn pseudo_sum(addrs: &[u8], proto: u8, l4_len: usize) -> u64 {
    sum(addrs, u64::from(proto) + l4_len as u64)
}

/// One's-complement sum of 16-bit big-endian words (an odd last byte padded).
fn sum(data: &[u8], acc: u64) -> u64 {
    data.chunks(2)
        .map(|c| u64::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .fold(acc, |a, w| a + w)
}

/// The Internet checksum of `data` on top of `acc` (RFC 1071).
pub fn checksum(data: &[u8], acc: u64) -> u16 {
    let mut s = sum(data, acc);
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

/// A Geneve option TLV: class, type (bit 7 = critical), length in 4-byte words of
/// `body` (whose length must be a multiple of 4).
pub fn geneve_option(class: u16, typ: u8, body: &[u8]) -> Vec<u8> {
    let words = u8::try_from(body.len() / 4).unwrap_or(0x1f) & 0x1f;
    let mut o = class.to_be_bytes().to_vec();
    o.extend_from_slice(&[typ, words]);
    o.extend_from_slice(body);
    o
}

/// The Oxide Mss option carrying `mss`.
pub fn mss_option(mss: u32) -> Vec<u8> {
    geneve_option(OXIDE_CLASS, OXIDE_MSS, &mss.to_be_bytes())
}

/// Ethernet / IPv6 / UDP 6081 / Geneve (version 0, no flags, Ethernet payload)
/// around `inner`, with `options` (whole 4-byte words) after the Geneve header. UDP
/// checksum 0, as tunnels over IPv6 send (RFC 6935).
pub fn geneve(o: &Outer, options: &[u8], inner: &[u8]) -> Vec<u8> {
    let udp_len = 8 + 8 + options.len() + inner.len();
    let mut f = ethernet(o.dst_mac, o.src_mac, ETHERTYPE_IPV6);
    f.extend(ipv6_header(o.src, o.dst, PROTO_UDP, udp_len));
    f.extend_from_slice(&0xc000u16.to_be_bytes());
    f.extend_from_slice(&GENEVE_PORT.to_be_bytes());
    f.extend_from_slice(&u16::try_from(udp_len).unwrap_or(u16::MAX).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    let opt_words = u8::try_from(options.len() / 4).unwrap_or(0x3f) & 0x3f;
    f.extend_from_slice(&[opt_words, 0]);
    f.extend_from_slice(&TRANSPARENT_ETHERNET.to_be_bytes());
    f.extend_from_slice(&o.vni.to_be_bytes()[1..]);
    f.push(0);
    f.extend_from_slice(options);
    f.extend_from_slice(inner);
    f
}

/// Big-endian u16 at `off`.
pub fn be16(f: &[u8], off: usize) -> u16 {
    u16::from_be_bytes([f[off], f[off + 1]])
}

/// Writes a big-endian u16 at `off`.
pub fn set16(f: &mut [u8], off: usize, v: u16) {
    f[off..off + 2].copy_from_slice(&v.to_be_bytes());
}

/// Adds `delta` to the big-endian u16 at `off` (wrapping: a lie may go anywhere).
pub fn add16(f: &mut [u8], off: usize, delta: i32) {
    let v = i32::from(be16(f, off)).wrapping_add(delta) as u16;
    set16(f, off, v);
}

/// What the steering XDP program does with `frame` arriving at a sled whose
/// underlay addresses are `ours`: the name of the counter it bumps. A model of
/// `xdp-prog/src/steer.bpf.c` (with a socket bound on every queue, so never
/// `redirect_failed`).
pub fn xdp_verdict(frame: &[u8], ours: &[Ipv6Addr]) -> &'static str {
    if frame.len() < 14 {
        return "passed_truncated";
    }
    match be16(frame, 12) {
        0x8100 | 0x88a8 => return "passed_vlan_tagged",
        ETHERTYPE_IPV6 => {}
        _ => return "passed_not_ipv6",
    }
    if frame.len() < OUTER_UDP {
        return "passed_truncated";
    }
    if frame[OUTER_IP + 6] != PROTO_UDP {
        return "passed_not_udp";
    }
    if frame.len() < GENEVE {
        return "passed_truncated";
    }
    if be16(frame, OUTER_UDP + 2) != GENEVE_PORT {
        return "passed_not_geneve";
    }
    let dst: [u8; 16] = frame[OUTER_IP + 24..OUTER_IP + 40]
        .try_into()
        .unwrap_or([0; 16]);
    if !ours.contains(&Ipv6Addr::from(dst)) {
        return "passed_not_ours";
    }
    "redirected"
}

/// Every counter [`xdp_verdict`] can name.
pub const XDP_COUNTERS: [&str; 8] = [
    "redirected",
    "redirect_failed",
    "passed_truncated",
    "passed_not_ipv6",
    "passed_not_udp",
    "passed_not_geneve",
    "passed_not_ours",
    "passed_vlan_tagged",
];

/// The start of every hostile frame's payload marker.
pub const MARKER: &[u8] = b"XDE-HOSTILE:";

/// A payload naming the frame: [`MARKER`], the class and a sequence number, padded
/// to `len` bytes (at least the marker's own length).
pub fn marker_payload(class: &str, seq: u32, len: usize) -> Vec<u8> {
    let mut p = MARKER.to_vec();
    p.extend_from_slice(format!("{class}#{seq};").as_bytes());
    if p.len() < len {
        p.resize(len, b'.');
    }
    p
}

/// The `class#seq` a frame's marker names, if it carries one.
pub fn find_marker(frame: &[u8]) -> Option<String> {
    let at = frame.windows(MARKER.len()).position(|w| w == MARKER)? + MARKER.len();
    let rest = &frame[at..];
    let end = rest.iter().position(|&b| b == b';').unwrap_or(rest.len());
    Some(String::from_utf8_lossy(&rest[..end]).into_owned())
}

/// SplitMix64: a seeded, reproducible generator for the random corruptions.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`; the bias of the modulo is irrelevant here).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}

/// A copy of `base` with 1 to 4 random bytes in `from..until` overwritten by random
/// values, and in one case of eight also cut to a random length of at least 14
/// bytes (an Ethernet header: the kernel sends nothing shorter). Bytes outside the
/// range (the Ethernet addresses, the payload marker) stay as they are.
pub fn corrupt(base: &[u8], rng: &mut Rng, from: usize, until: usize) -> Vec<u8> {
    let mut f = base.to_vec();
    let until = until.min(f.len()).max(from + 1);
    for _ in 0..=rng.below(4) {
        let at = from + rng.below(until - from);
        f[at] = rng.next_u64() as u8;
    }
    if rng.below(8) == 0 {
        let keep = 14 + rng.below(f.len() - 13);
        f.truncate(keep);
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(v6: bool) -> (Host, Host) {
        let (a, b): (IpAddr, IpAddr) = if v6 {
            ("fd00:1::b".parse().unwrap(), "fd00:1::d".parse().unwrap())
        } else {
            ([10, 0, 0, 11].into(), [10, 0, 0, 13].into())
        };
        (Host { mac: [2; 6], ip: a }, Host { mac: [4; 6], ip: b })
    }

    /// Checksums verify the way a receiver checks them: the sum over the covered
    /// bytes, checksum included, folds to 0xffff (a zero complement).
    #[test]
    fn built_frames_carry_valid_checksums_and_lengths() {
        for v6 in [false, true] {
            let (a, b) = hosts(v6);
            for l4 in [
                L4::Tcp {
                    sport: 1,
                    dport: 2,
                    seq: 3,
                    ack: 4,
                    flags: TCP_ACK,
                },
                L4::Udp { sport: 1, dport: 2 },
                L4::Echo { id: 1, seq: 2 },
            ] {
                let f = inner(a, b, l4, b"hello");
                let (l4_off, pseudo) = if v6 {
                    assert_eq!(usize::from(be16(&f, 18)), f.len() - 54);
                    (54, pseudo_sum(&f[22..54], f[20], f.len() - 54))
                } else {
                    assert_eq!(checksum(&f[14..34], 0), 0, "IPv4 header checksum");
                    assert_eq!(usize::from(be16(&f, 16)), f.len() - 14);
                    let p = if f[23] == PROTO_ICMP {
                        0
                    } else {
                        pseudo_sum(&f[26..34], f[23], f.len() - 34)
                    };
                    (34, p)
                };
                assert_eq!(checksum(&f[l4_off..], pseudo), 0, "{l4:?} v6={v6}");
            }
        }
    }

    #[test]
    fn geneve_lengths_and_xdp_verdicts() {
        let (a, b) = hosts(false);
        let us: Ipv6Addr = "fd00:99::1".parse().unwrap();
        let o = Outer {
            src_mac: [6; 6],
            dst_mac: [8; 6],
            src: "fd00:99::2".parse().unwrap(),
            dst: us,
            vni: 10,
        };
        let inner = inner(a, b, L4::Udp { sport: 1, dport: 2 }, b"x");
        let f = geneve(&o, &mss_option(1400), &inner);
        assert_eq!(
            usize::from(be16(&f, 18)),
            f.len() - 54,
            "IPv6 payload length"
        );
        assert_eq!(be16(&f, 58), be16(&f, 18), "UDP length");
        assert_eq!(f[62], 2, "two option words");
        assert_eq!(&f[66..69], &[0, 0, 10], "VNI");
        assert_eq!(&f[78..], &inner[..]);
        assert_eq!(xdp_verdict(&f, &[us]), "redirected");
        assert_eq!(xdp_verdict(&f, &[]), "passed_not_ours");
        assert_eq!(xdp_verdict(&f[..60], &[us]), "passed_truncated");
        assert_eq!(xdp_verdict(&f[..13], &[us]), "passed_truncated");
        let mut g = f.clone();
        set16(&mut g, 56, 4789);
        assert_eq!(xdp_verdict(&g, &[us]), "passed_not_geneve");
        g[20] = PROTO_FRAGMENT;
        assert_eq!(xdp_verdict(&g, &[us]), "passed_not_udp");
        set16(&mut g, 12, ETHERTYPE_VLAN);
        assert_eq!(xdp_verdict(&g, &[us]), "passed_vlan_tagged");
        set16(&mut g, 12, ETHERTYPE_ARP);
        assert_eq!(xdp_verdict(&g, &[us]), "passed_not_ipv6");
    }

    #[test]
    fn markers_are_found_and_named() {
        let p = marker_payload("bad_udp_length", 7, 64);
        assert_eq!(p.len(), 64);
        let mut f = vec![0u8; 30];
        f.extend(&p);
        assert_eq!(find_marker(&f).as_deref(), Some("bad_udp_length#7"));
        assert_eq!(find_marker(&f[..40]), None);
    }

    #[test]
    fn corruption_is_reproducible_and_stays_in_range() {
        let base: Vec<u8> = (0..200u8).collect();
        let (mut r1, mut r2) = (Rng::new(42), Rng::new(42));
        for _ in 0..1000 {
            let a = corrupt(&base, &mut r1, 12, 120);
            assert_eq!(a, corrupt(&base, &mut r2, 12, 120));
            assert!(a.len() >= 14);
            assert_eq!(a[..12], base[..12]);
            assert_eq!(a[120.min(a.len())..], base[120.min(a.len())..a.len()]);
        }
    }
}
