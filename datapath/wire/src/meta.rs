//! Fast single-pass parsers that produce the metadata the engine's fast path needs:
//! offsets of each layer and the fields of the flow key, without copying.
//!
//! The type definitions here are the contract with the engine (docs/design.md);
//! `parse_inner` and `parse_underlay` fill them in.

use crate::MacAddr;
use std::net::{IpAddr, Ipv6Addr};

/// What an Ethernet frame carries, after any 802.1Q tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum L3 {
    Ipv4,
    Ipv6,
    Arp,
    /// Any other EtherType (the value is kept for counters/logs).
    Other(u16),
}

/// Metadata of a guest (inner) Ethernet frame.
///
/// Offsets are from the start of the frame. For non-IP frames (`l3` is `Arp` or
/// `Other`) only the L2 fields and `l3_off` are meaningful; addresses are unspecified
/// and ports zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InnerMeta {
    pub dst_mac: MacAddr,
    pub src_mac: MacAddr,
    pub l3: L3,
    /// Offset of the L3 header (14, or 18 with a VLAN tag).
    pub l3_off: usize,
    /// Offset of the L4 header: the end of the IPv4 header with options, or of the
    /// IPv6 header and all extension headers.
    pub l4_off: usize,
    /// Offset of the L4 payload (after the TCP header with options, the UDP header, or
    /// the 8-byte ICMP/ICMPv6 header); equal to `l4_off` for other protocols.
    pub payload_off: usize,
    /// End of the IP packet as its own length fields say (frames may carry Ethernet
    /// padding after it; the parser guarantees `ip_end <= frame.len()`).
    pub ip_end: usize,
    pub src_ip: IpAddr,
    pub dst_ip: IpAddr,
    /// IPv4 protocol or the IPv6 final next header.
    pub proto: u8,
    /// TCP/UDP ports; for ICMP/ICMPv6 echo, `src_port` is the identifier. Zero otherwise.
    pub src_port: u16,
    pub dst_port: u16,
    /// TCP flags byte (FIN=0x01 SYN=0x02 RST=0x04 PSH=0x08 ACK=0x10 URG=0x20 ECE=0x40 CWR=0x80).
    pub tcp_flags: u8,
    /// ICMP/ICMPv6 type and code (zero for other protocols).
    pub icmp_type: u8,
    pub icmp_code: u8,
    /// A fragment (IPv4 MF or offset, or an IPv6 fragment header). Non-first fragments
    /// have no L4 header: ports are zero and `payload_off == l4_off`.
    pub fragment: bool,
    /// IPv4 Don't Fragment bit (false for IPv6).
    pub dont_fragment: bool,
    /// IPv4 TTL / IPv6 hop limit.
    pub hop_limit: u8,
}

/// Replication mode of the Oxide Multicast option (top 2 bits of its body).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replication {
    External,
    Underlay,
    Both,
}

/// Metadata of a validated underlay (outer) frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnderlayMeta {
    pub outer_src_mac: MacAddr,
    pub outer_dst_mac: MacAddr,
    pub outer_src: Ipv6Addr,
    pub outer_dst: Ipv6Addr,
    pub udp_src_port: u16,
    /// 24-bit VNI.
    pub vni: u32,
    /// Oxide External option present.
    pub external: bool,
    /// Oxide Multicast option.
    pub multicast: Option<Replication>,
    /// Oxide Mss option: the sending guest's TCP MSS for a segmented buffer.
    pub mss: Option<u32>,
    /// Offset of the inner Ethernet frame.
    pub inner_off: usize,
    /// End of the inner frame (from the UDP length), `<= frame.len()`.
    pub inner_end: usize,
}
