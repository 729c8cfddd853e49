//! Header rewrites: one end of a packet (address and port, or an echo identifier)
//! changed in place with its checksums updated incrementally (RFC 1624), and the
//! same for the packet an ICMP error quotes.
//!
//! NAT decides what to rewrite (`vpc::nat`); this is how, for whoever builds or
//! passes a frame: segmentation applies a flow's compiled [`SrcNat`] as it writes
//! each segment, the coalescer a flow's inbound [`Rewrite`] once per merged frame.
//! A compiled rewrite carries its checksum changes, worked out once per flow, so a
//! packet costs a few stores and two checksum adjustments.

use crate::machinery::flow::{
    is_echo, quoted_packet, FlowKey, PROTO_ICMP, PROTO_ICMPV6, PROTO_TCP, PROTO_UDP,
};
use std::net::IpAddr;
use wire::checksum;
use wire::meta::{InnerMeta, L3};

/// One end of a flow's packets rewritten to (`ip`, `port`) (echo: the identifier),
/// with the checksum changes worked out when the flow is compiled: every packet of
/// a flow has the same old address and port (they are in its key), so a packet
/// needs stores and two checksum adjustments, not sums of the old and new values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rewrite {
    pub ip: IpAddr,
    pub port: u16,
    /// `!old + new` over the address's 16-bit words (RFC 1624), folded.
    addr_delta: u16,
    /// The same for the port.
    port_delta: u16,
}

impl Rewrite {
    /// The rewrite of address `old_ip` and port `old_port` to `ip` and `port`.
    pub fn new(old_ip: IpAddr, old_port: u16, ip: IpAddr, port: u16) -> Rewrite {
        fn words(a: IpAddr) -> u64 {
            match a {
                IpAddr::V4(a) => sum_words(&a.octets()),
                IpAddr::V6(a) => sum_words(&a.octets()),
            }
        }
        // `!x` of a folded sum is the sum of each word's complement, folded.
        let addr = u64::from(!checksum::fold(words(old_ip))) + words(ip);
        Rewrite {
            ip,
            port,
            addr_delta: checksum::fold(addr),
            port_delta: checksum::fold(u64::from(!old_port) + u64::from(port)),
        }
    }

    /// The checksum changes (address, port) of the rewrite, for a holder that keeps
    /// its new address elsewhere (NAT's inbound target: the port's private address
    /// is the port's, not the flow's) and puts them back with [`Rewrite::with_deltas`].
    pub fn deltas(&self) -> (u16, u16) {
        (self.addr_delta, self.port_delta)
    }

    /// The rewrite to `ip` and `port` whose [`Rewrite::deltas`] were `deltas`, as
    /// [`Rewrite::new`] worked them out for that address and port.
    #[inline]
    pub fn with_deltas(ip: IpAddr, port: u16, (addr_delta, port_delta): (u16, u16)) -> Rewrite {
        Rewrite {
            ip,
            port,
            addr_delta,
            port_delta,
        }
    }

    /// What the rewrite adds to an unfolded pseudo-header sum (RFC 1624: the
    /// address words' `!old + new`): a sum taken before it stands, with this added,
    /// for the rewritten packet, so it need not be taken again.
    pub fn pseudo_delta(&self) -> u64 {
        u64::from(self.addr_delta)
    }

    /// Rewrites the `end` of the IP packet `m` describes in `frame`, which must
    /// hold the old address and port this was made for, fixing the IPv4 header
    /// checksum and the L4 checksum incrementally. The checksums must be complete
    /// (outbound, the frame is rewritten as segmentation builds it, after a
    /// `NEEDS_CSUM` checksum is completed). A UDP/IPv4 checksum of 0 (none) stays
    /// 0; a UDP checksum that comes out 0 is sent as 0xffff. A packet of the other
    /// family is left as it is (the callers choose by the packet's family).
    #[inline(always)]
    pub fn apply(&self, frame: &mut [u8], m: &InnerMeta, end: End) {
        let src = end == End::Src;
        let addr = u64::from(self.addr_delta);
        // Each family's address is stored at its fixed size (no length-generic
        // copy, a `memcpy` call, on the fast path of every NATed packet), into a
        // view of the whole fixed header: one bounds check for all its fields.
        match (self.ip, m.l3) {
            (IpAddr::V4(a), L3::Ipv4) => {
                let Some(h) = chunk_mut::<20>(frame, m.l3_off) else {
                    return;
                };
                let at = if src { 12 } else { 16 };
                h[at..at + 4].copy_from_slice(&a.octets());
                adjust(&mut h[10..12], addr, Csum::Plain);
            }
            (IpAddr::V6(a), L3::Ipv6) => {
                let Some(h) = chunk_mut::<40>(frame, m.l3_off) else {
                    return;
                };
                let at = if src { 8 } else { 24 };
                h[at..at + 16].copy_from_slice(&a.octets());
            }
            _ => return,
        }
        // A non-first fragment has no L4 header: only its address changes (the
        // first fragment's L4 checksum covers the whole datagram).
        if m.fragment && m.payload_off == m.l4_off {
            return;
        }
        let l4 = m.l4_off;
        let port = u64::from(self.port_delta);
        let port_at = if src { 0 } else { 2 };
        // The port and the checksum are looked for apart: the packet an ICMP error
        // quotes may end before the checksum (8 bytes of its L4 header).
        let (csum_at, delta, kind) = match m.proto {
            PROTO_TCP => {
                // The fixed header in one view, as every segment has it; a quoted
                // one may stop short of it, then field by field.
                if let Some(h) = chunk_mut::<20>(frame, l4) {
                    h[port_at..port_at + 2].copy_from_slice(&self.port.to_be_bytes());
                    adjust(&mut h[16..18], addr + port, Csum::Plain);
                    return;
                }
                self.store_port(frame, l4 + port_at);
                (l4 + 16, addr + port, Csum::Plain)
            }
            PROTO_UDP => {
                self.store_port(frame, l4 + port_at);
                let kind = if m.l3 == L3::Ipv4 {
                    Csum::Udp4
                } else {
                    Csum::Udp6
                };
                (l4 + 6, addr + port, kind)
            }
            // An echo identifier is at 4, the same place for either end. ICMPv4's
            // checksum has no pseudo-header.
            PROTO_ICMP if is_echo(m.proto, m.icmp_type) => {
                self.store_port(frame, l4 + 4);
                (l4 + 2, port, Csum::Plain)
            }
            PROTO_ICMPV6 if is_echo(m.proto, m.icmp_type) => {
                self.store_port(frame, l4 + 4);
                (l4 + 2, addr + port, Csum::Plain)
            }
            PROTO_ICMPV6 => (l4 + 2, addr, Csum::Plain),
            // Other ICMPv4 messages (their checksum covers no address) and other
            // protocols: nothing more changes.
            _ => return,
        };
        if let Some(c) = chunk_mut::<2>(frame, csum_at) {
            adjust(c, delta, kind);
        }
    }

    /// Stores the new port (echo: identifier) at `at`, if `frame` reaches that far.
    #[inline]
    fn store_port(&self, frame: &mut [u8], at: usize) {
        if let Some(p) = chunk_mut::<2>(frame, at) {
            *p = self.port.to_be_bytes();
        }
    }
}

/// The `N` bytes of `frame` from `at` on, if it holds them: one bounds check, after
/// which fields at fixed offsets need none.
#[inline]
fn chunk_mut<const N: usize>(frame: &mut [u8], at: usize) -> Option<&mut [u8; N]> {
    frame.get_mut(at..)?.first_chunk_mut::<N>()
}

/// The compiled outbound NAT of one flow: its source rewrite, and for an ICMP
/// error about a packet that came in through NAT, the rewrite of the quoted
/// packet's destination back to what its sender sent it to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SrcNat {
    pub rewrite: Rewrite,
    pub quote: Option<Rewrite>,
}

impl SrcNat {
    /// Rewrites `frame` (laid out as `m` says; its checksums complete) as it
    /// leaves: its source, and an ICMP error's quote, whose checksum is then
    /// computed afresh over the changed quote.
    pub fn apply(&self, frame: &mut [u8], m: &InnerMeta) {
        self.rewrite.apply(frame, m, End::Src);
        if let Some(q) = &self.quote {
            let to = q.ip;
            if let Some((_, quoted)) = quote_of(m, frame) {
                q.apply(frame, &quoted, End::Dst);
                icmp_checksum(frame, m, to, m.dst_ip);
            }
        }
    }
}

/// Unfolded sum of the 16-bit words of an address.
#[inline]
fn sum_words<const N: usize>(b: &[u8; N]) -> u64 {
    b.chunks_exact(2)
        .map(|w| u64::from(u16::from_be_bytes([w[0], w[1]])))
        .sum()
}

/// The flow of the packet the ICMP error `m` (in `frame`) quotes, and its
/// metadata: its own addresses and ports, its headers where they lie in `frame`
/// (what [`Rewrite::apply`] needs of it).
pub fn quote_of(m: &InnerMeta, frame: &[u8]) -> Option<(FlowKey, InnerMeta)> {
    let q_l3 = m.payload_off;
    let (q, q_l4) = quoted_packet(0, m.proto, frame.get(q_l3..m.ip_end)?)?;
    let meta = InnerMeta {
        l3_off: q_l3,
        l4_off: q_l3 + q_l4,
        proto: q.proto,
        icmp_type: q.icmp_type,
        src_ip: q.src_ip,
        dst_ip: q.dst_ip,
        src_port: q.src_port,
        dst_port: q.dst_port,
        ..*m
    };
    Some((q, meta))
}

/// Computes the checksum of the ICMP message of packet `m` in `frame` afresh (an
/// ICMPv6 one over the pseudo-header of `src` and `dst`, the packet's addresses).
pub fn icmp_checksum(frame: &mut [u8], m: &InnerMeta, src: IpAddr, dst: IpAddr) {
    let Some(icmp) = frame.get_mut(m.l4_off..m.ip_end) else {
        return;
    };
    let Some(field) = icmp.get_mut(2..4) else {
        return;
    };
    field.fill(0);
    let pseudo = match (src, dst) {
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            checksum::pseudo_header_v6(s, d, m.proto, icmp.len() as u32)
        }
        _ => 0,
    };
    let c = !checksum::fold(checksum::sum(icmp, pseudo));
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
}

/// The port of an inbound packet that names the local end: the destination port, or
/// for echo the identifier (which the parser puts in `src_port`).
pub fn local_port(m: &InnerMeta) -> u16 {
    if is_echo(m.proto, m.icmp_type) {
        m.src_port
    } else {
        m.dst_port
    }
}

/// The metadata of packet `m` after [`rewrite`] changed its `end` to (`ip`,
/// `port`). The parser keeps an echo identifier in `src_port`, whichever end.
pub fn rewritten_meta(m: &InnerMeta, end: End, ip: IpAddr, port: u16) -> InnerMeta {
    let mut r = *m;
    match end {
        End::Src => r.src_ip = ip,
        End::Dst => r.dst_ip = ip,
    }
    if end == End::Src || is_echo(m.proto, m.icmp_type) {
        r.src_port = port;
    } else {
        r.dst_port = port;
    }
    r
}

/// Which end of a packet a rewrite changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    Src,
    Dst,
}

/// Rewrites one end of the IP packet `m` describes in `frame` to (`ip`, `port`)
/// (echo: `port` is the identifier): [`Rewrite::apply`] of the rewrite worked out
/// from the packet's own address and port, for a packet no compiled flow stands
/// for (an ICMP error, a packet it quotes, a flow's first packet).
pub fn rewrite(frame: &mut [u8], m: &InnerMeta, end: End, ip: IpAddr, port: u16) {
    let old = match end {
        End::Src => (m.src_ip, m.src_port),
        // The parser keeps an echo identifier in `src_port`, whichever end.
        End::Dst => (m.dst_ip, local_port(m)),
    };
    Rewrite::new(old.0, old.1, ip, port).apply(frame, m, end);
}

/// Which checksum [`adjust`] updates: UDP's has a form for "none" and another
/// for zero.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Csum {
    Plain,
    /// UDP over IPv4: 0 means no checksum, which stays 0.
    Udp4,
    /// UDP over IPv6: a checksum is mandatory.
    Udp6,
}

/// Applies `delta` (a sum of `!old + new` words, RFC 1624) to the checksum in
/// `field`, its two bytes (the callers' fixed-size views give exactly two). A UDP
/// checksum that comes out 0 is sent as 0xffff, its other form: 0 would mean "no
/// checksum" (RFC 768).
#[inline]
fn adjust(field: &mut [u8], delta: u64, kind: Csum) {
    let [hi, lo] = field else {
        return;
    };
    let old = u16::from_be_bytes([*hi, *lo]);
    if old == 0 && kind == Csum::Udp4 {
        return;
    }
    // At most three 16-bit terms here: two end-around carries fold it.
    let sum = u64::from(!old) + delta;
    let sum = (sum & 0xffff) + (sum >> 16);
    let sum = (sum & 0xffff) + (sum >> 16);
    let c = match !(sum as u16) {
        0 if kind != Csum::Plain => 0xffff,
        c => c,
    };
    [*hi, *lo] = c.to_be_bytes();
}

#[cfg(test)]
mod tests {
    //! [`rewrite`]'s incremental checksums against etherparse computing them afresh,
    //! for either family, either end, TCP and UDP (with and without an IPv4 UDP
    //! checksum) and ICMP echo.
    use super::*;
    use etherparse::{IcmpEchoHeader, NetHeaders, PacketBuilder, PacketHeaders, TransportHeader};
    use proptest::prelude::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    /// A checksummed Ethernet/IP frame from (`src`, `dst`) of protocol `kind`
    /// (0 TCP, 1 UDP, 2 ICMP echo request) with ports (identifier) `ports`.
    fn frame(src: IpAddr, dst: IpAddr, kind: u8, ports: (u16, u16), payload: &[u8]) -> Vec<u8> {
        let b = PacketBuilder::ethernet2([2; 6], [4; 6]);
        let b = match (src, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => b.ipv4(s.octets(), d.octets(), 64),
            (IpAddr::V6(s), IpAddr::V6(d)) => b.ipv6(s.octets(), d.octets(), 64),
            _ => unreachable!("one family"),
        };
        let mut out = Vec::new();
        let echo = IcmpEchoHeader {
            id: ports.0,
            seq: 7,
        };
        match (kind, src.is_ipv4()) {
            (0, _) => b.tcp(ports.0, ports.1, 1, 4096).write(&mut out, payload),
            (1, _) => b.udp(ports.0, ports.1).write(&mut out, payload),
            (_, true) => b
                .icmpv4_echo_request(echo.id, echo.seq)
                .write(&mut out, payload),
            (_, false) => b
                .icmpv6_echo_request(echo.id, echo.seq)
                .write(&mut out, payload),
        }
        .expect("built");
        out
    }

    /// Whether every checksum of `f` is what etherparse computes for it (an IPv4
    /// UDP checksum of 0, none, passes).
    fn checksums_right(f: &[u8]) -> bool {
        let h = PacketHeaders::from_ethernet_slice(f).expect("parses");
        let payload = h.payload.slice();
        let Some(mut t) = h.transport.clone() else {
            return false;
        };
        match h.net.as_ref() {
            Some(NetHeaders::Ipv4(ip, _)) => {
                if ip.header_checksum != ip.calc_header_checksum() {
                    return false;
                }
                if matches!(&t, TransportHeader::Udp(u) if u.checksum == 0) {
                    return true;
                }
                t.update_checksum_ipv4(ip, payload).expect("sums");
            }
            Some(NetHeaders::Ipv6(ip, _)) => t.update_checksum_ipv6(ip, payload).expect("sums"),
            _ => return false,
        }
        h.transport.as_ref() == Some(&t)
    }

    fn addr(v4: bool, bytes: [u8; 16]) -> IpAddr {
        if v4 {
            IpAddr::V4(Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]))
        } else {
            IpAddr::V6(Ipv6Addr::from(bytes))
        }
    }

    proptest! {
        #[test]
        fn rewrite_keeps_every_checksum_right(
            v4 in any::<bool>(),
            kind in 0u8..3,
            src_end in any::<bool>(),
            addrs in any::<([u8; 16], [u8; 16], [u8; 16])>(),
            ports in any::<(u16, u16, u16)>(),
            payload in proptest::collection::vec(any::<u8>(), 0..64),
            udp_no_checksum in any::<bool>(),
        ) {
            let (src, dst, new) = (addr(v4, addrs.0), addr(v4, addrs.1), addr(v4, addrs.2));
            let mut f = frame(src, dst, kind, (ports.0, ports.1), &payload);
            let udp_none = kind == 1 && v4 && udp_no_checksum;
            if udp_none {
                f[14 + 20 + 6..14 + 20 + 8].fill(0);
            }
            let m = wire::meta::parse_inner(&f).expect("parses");
            let end = if src_end { End::Src } else { End::Dst };
            rewrite(&mut f, &m, end, new, ports.2);
            prop_assert!(checksums_right(&f), "{:02x?}", f);
            let after = wire::meta::parse_inner(&f).expect("still parses");
            prop_assert_eq!(after, rewritten_meta(&m, end, new, ports.2));
            if udp_none {
                prop_assert_eq!(&f[14 + 20 + 6..14 + 20 + 8], &[0, 0]);
            }
        }
    }
}
