//! Small emitters for the Ethernet and IP headers of the frames the gateway builds.
//!
//! Gateway replies are built whole into a `TxBatch` slot: Ethernet, a fresh IP header
//! (no options, no extension headers) and the ICMP/NDP/ARP/DHCP message. These helpers
//! write only fixed-layout headers, so they need no parsing and cannot fail once the
//! caller sized the slot.

use crate::frames::output::{TxBatch, TxDest};
use crate::ids::PortId;
use std::net::{Ipv4Addr, Ipv6Addr};
use wire::vnet::VnetHdr;
use wire::{checksum, MacAddr};

pub(super) const ETH_LEN: usize = 14;
pub(super) const IPV4_LEN: usize = 20;
pub(super) const IPV6_LEN: usize = 40;
pub(super) const UDP_LEN: usize = 8;

pub(super) const ETHERTYPE_IPV4: u16 = 0x0800;
pub(super) const ETHERTYPE_ARP: u16 = 0x0806;
pub(super) const ETHERTYPE_IPV6: u16 = 0x86dd;

pub(super) const PROTO_ICMP: u8 = 1;
pub(super) const PROTO_UDP: u8 = 17;
pub(super) const PROTO_ICMPV6: u8 = 58;

/// TTL / hop limit of gateway replies that are not NDP (NDP requires 255).
pub(super) const REPLY_TTL: u8 = 64;

/// ff02::1, all nodes.
pub(super) const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
/// ff02::2, all routers.
pub(super) const ALL_ROUTERS: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 2);

/// Frames for the guest carry no offload request: the gateway fills every checksum.
pub(super) fn to_guest(port: PortId) -> TxDest {
    TxDest::Port {
        port,
        vnet: VnetHdr::default(),
    }
}

/// Reserves a frame of `len` bytes for the guest.
pub(super) fn push_to_guest<'b>(
    out: &'b mut TxBatch<'_>,
    port: PortId,
    len: usize,
) -> &'b mut [u8] {
    out.push(to_guest(port), len)
}

/// Writes an untagged Ethernet header into `b[..14]`.
pub(super) fn eth(b: &mut [u8], dst: MacAddr, src: MacAddr, ethertype: u16) {
    b[0..6].copy_from_slice(&dst.0);
    b[6..12].copy_from_slice(&src.0);
    b[12..14].copy_from_slice(&ethertype.to_be_bytes());
}

/// Writes a 20-byte IPv4 header (ident 0, no DF: the gateway's messages are small
/// and never need path-MTU discovery) with its checksum into `b[..20]`.
pub(super) fn ipv4(
    b: &mut [u8],
    src: Ipv4Addr,
    dst: Ipv4Addr,
    proto: u8,
    payload_len: usize,
    ttl: u8,
) {
    let total = (IPV4_LEN + payload_len) as u16;
    b[0] = 0x45;
    b[1] = 0;
    b[2..4].copy_from_slice(&total.to_be_bytes());
    b[4..8].fill(0);
    b[8] = ttl;
    b[9] = proto;
    b[10..12].fill(0);
    b[12..16].copy_from_slice(&src.octets());
    b[16..20].copy_from_slice(&dst.octets());
    let c = checksum::checksum(&b[..IPV4_LEN]);
    b[10..12].copy_from_slice(&c.to_be_bytes());
}

/// Writes a 40-byte IPv6 header (traffic class 0, flow label 0) into `b[..40]`.
pub(super) fn ipv6(
    b: &mut [u8],
    src: Ipv6Addr,
    dst: Ipv6Addr,
    next_header: u8,
    payload_len: usize,
    hop_limit: u8,
) {
    b[0..4].copy_from_slice(&[0x60, 0, 0, 0]);
    b[4..6].copy_from_slice(&(payload_len as u16).to_be_bytes());
    b[6] = next_header;
    b[7] = hop_limit;
    b[8..24].copy_from_slice(&src.octets());
    b[24..40].copy_from_slice(&dst.octets());
}

/// Writes a UDP header into `b[..8]` and the checksum over the pseudo-header and
/// `b[..8 + payload_len]`, which must already hold the payload.
pub(super) fn udp_v4(
    b: &mut [u8],
    src: Ipv4Addr,
    dst: Ipv4Addr,
    sport: u16,
    dport: u16,
    payload_len: usize,
) {
    let len = UDP_LEN + payload_len;
    udp_header(b, sport, dport, len);
    let acc = checksum::pseudo_header_v4(src, dst, PROTO_UDP, len as u32);
    finish_udp(b, len, acc);
}

/// IPv6 counterpart of [`udp_v4`].
pub(super) fn udp_v6(
    b: &mut [u8],
    src: Ipv6Addr,
    dst: Ipv6Addr,
    sport: u16,
    dport: u16,
    payload_len: usize,
) {
    let len = UDP_LEN + payload_len;
    udp_header(b, sport, dport, len);
    let acc = checksum::pseudo_header_v6(src, dst, PROTO_UDP, len as u32);
    finish_udp(b, len, acc);
}

fn udp_header(b: &mut [u8], sport: u16, dport: u16, len: usize) {
    b[0..2].copy_from_slice(&sport.to_be_bytes());
    b[2..4].copy_from_slice(&dport.to_be_bytes());
    b[4..6].copy_from_slice(&(len as u16).to_be_bytes());
    b[6..8].fill(0);
}

fn finish_udp(b: &mut [u8], len: usize, acc: u64) {
    let mut c = !checksum::fold(checksum::sum(&b[..len], acc));
    // RFC 768: a computed zero is sent as all ones (zero means "no checksum").
    if c == 0 {
        c = 0xffff;
    }
    b[6..8].copy_from_slice(&c.to_be_bytes());
}

/// The solicited-node multicast address of `a` (RFC 4291 §2.7.1).
pub(super) fn solicited_node(a: Ipv6Addr) -> Ipv6Addr {
    let o = a.octets();
    Ipv6Addr::from([
        0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, o[13], o[14], o[15],
    ])
}

/// fe80::/10.
pub(super) fn is_link_local(a: Ipv6Addr) -> bool {
    a.segments()[0] & 0xffc0 == 0xfe80
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn solicited_node_and_link_local() {
        let a: Ipv6Addr = "fe80::aa40:25ff:fe00:1".parse().unwrap();
        assert_eq!(solicited_node(a).to_string(), "ff02::1:ff00:1");
        assert!(is_link_local(a));
        assert!(!is_link_local("fec0::1".parse().unwrap()));
        assert!(!is_link_local("fd00::1".parse().unwrap()));
    }
}
