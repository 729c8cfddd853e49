//! Fast single-pass parsers that produce the metadata the engine's fast path needs:
//! offsets of each layer and the fields of the flow key, without copying.
//!
//! The type definitions here are the contract with the engine (docs/design.md);
//! `parse_inner` and `parse_underlay` fill them in.
//!
//! # Frames in pieces: `head` and `total`
//!
//! Underlay frames arrive from AF_XDP as chains of buffers: a 9014-byte frame is three
//! pieces of 3840, 3840 and 1334 bytes. Copying each chain into one buffer only to read
//! its headers would cost more than parsing them, and the headers sit in the first
//! piece in practice. So each parser has a form that reads headers from the first
//! piece, `head`, while checking every length field against the whole frame's length,
//! `total`: [`parse_underlay_head`] and [`parse_inner_head`]. The contract:
//!
//! - `Some(result)` is exactly what the contiguous parser returns for a frame of
//!   `total` bytes that begins with `head`: the same metadata, with offsets from the
//!   start of the frame (so `ip_end`, `inner_end` and even `payload_off` may lie past
//!   `head`), or the same refusal. A length field that runs past `total` is refused
//!   from `head` alone, with the reason the contiguous parser gives.
//! - `None` means the answer needs bytes past `head` that the frame has. The caller then
//!   copies the frame into one buffer and calls [`parse_underlay`] / [`parse_inner`].
//!
//! Precisely, the parsers read the frame as a sequence of spans, each read whole and
//! only once every check before it has passed; `None` is returned exactly when the next
//! span ends past `head` but inside the frame. A span that ends past the frame (for L4
//! and extension headers: past the IP packet's own length) is the refusal the
//! contiguous parser gives. The spans are:
//!
//! - underlay: the 70 bytes of outer Ethernet, IPv6, UDP and Geneve headers, then the
//!   Geneve options. A head of [`OUTER_MAX_LEN`] (322) bytes, or the whole frame, always
//!   decides; the inner frame's bytes are only counted, never read.
//! - inner: the 14-byte Ethernet header and the 2-byte type field of each VLAN tag;
//!   then the 20-byte IPv4 header and its options (for the header checksum), or the
//!   40-byte IPv6 header and the first 2 bytes of each extension header (all 8 of a
//!   fragment header; bodies are skipped by length); then the first 20 bytes of a TCP
//!   header (its options are not read), or the 8-byte UDP, ICMP or ICMPv6 header. Up
//!   to 102 bytes for any frame without IPv6 extension headers.
//!
//! [`parse_underlay`] and [`parse_inner`] are the same parsers given the whole frame as
//! the head, so there is one implementation of each.

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
    /// padding after it; the parser guarantees `ip_end <=` the frame's length).
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

/// Metadata of a validated underlay (outer) frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnderlayMeta {
    pub outer_src_mac: MacAddr,
    pub outer_dst_mac: MacAddr,
    pub outer_src: Ipv6Addr,
    pub outer_dst: Ipv6Addr,
    pub udp_src_port: u16,
    /// The outer IPv6 traffic class: DSCP in the top six bits, ECN in the bottom
    /// two (a switch's congestion mark, carried into the inner packet on
    /// decapsulation: RFC 6040).
    pub outer_tclass: u8,
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
    /// End of the inner frame (from the UDP length), `<=` the frame's length.
    pub inner_end: usize,
}

use crate::ethernet::{self, ethertype};
use crate::geneve::{self, OxideOption, OxideOptionError, Replication};
use crate::ipv4::protocol;
use crate::ipv6;
use crate::WireError;
use std::net::Ipv4Addr;

/// ICMPv4 echo request/reply types: their identifier stands in for a port.
const ICMP_ECHO_REPLY: u8 = 0;
const ICMP_ECHO_REQUEST: u8 = 8;
/// ICMPv6 echo request/reply types.
const ICMPV6_ECHO_REQUEST: u8 = 128;
const ICMPV6_ECHO_REPLY: u8 = 129;

/// Why a parse of a frame's first piece ended without metadata.
enum Stop<E> {
    /// Refused, for the reason the contiguous parser gives.
    Drop(E),
    /// Deciding needs bytes past the head that the frame has.
    NeedMore,
}

impl<E> From<E> for Stop<E> {
    #[inline(always)]
    fn from(e: E) -> Self {
        Stop::Drop(e)
    }
}

/// The result of a head parse: `None` for [`Stop::NeedMore`].
#[inline(always)]
fn decided<T, E>(r: Result<T, Stop<E>>) -> Option<Result<T, E>> {
    match r {
        Ok(v) => Some(Ok(v)),
        Err(Stop::Drop(e)) => Some(Err(e)),
        Err(Stop::NeedMore) => None,
    }
}

/// The result of a parse whose head is the whole frame. Nothing lies past the head
/// then, so [`Stop::NeedMore`] cannot occur; it maps to the parser's truncation reason
/// rather than to a panic path.
///
/// The contiguous parsers convert the shared parser's result once, here, rather than
/// unwrapping the `_head` functions' `Option`: going through both conversions keeps
/// LLVM from writing the metadata straight into the caller's return slot, which cost
/// `parse_inner` about 7% more instructions (278 instead of 261 for IPv4/TCP).
#[inline(always)]
fn whole<T, E>(r: Result<T, Stop<E>>, truncated: E) -> Result<T, E> {
    match r {
        Ok(v) => Ok(v),
        Err(Stop::Drop(e)) => Err(e),
        Err(Stop::NeedMore) => Err(truncated),
    }
}

/// The `n` bytes at `off` of a frame (or an IP packet) that ends at `end`, read from
/// the frame's first piece `head`: `Truncated` if they run past `end`,
/// [`Stop::NeedMore`] if they run past `head`. `end` is checked first, so bytes of
/// `head` past `end` (Ethernet padding) are never read.
#[inline(always)]
fn read(head: &[u8], end: usize, off: usize, n: usize) -> Result<&[u8], Stop<WireError>> {
    if off + n > end {
        return Err(Stop::Drop(WireError::Truncated));
    }
    head.get(off..off + n).ok_or(Stop::NeedMore)
}

/// Reads a big-endian u16 at `off`; the caller has checked the bound.
#[inline(always)]
fn be16(b: &[u8], off: usize) -> u16 {
    u16::from_be_bytes([b[off], b[off + 1]])
}

#[inline(always)]
fn mac_at(b: &[u8], off: usize) -> MacAddr {
    MacAddr([
        b[off],
        b[off + 1],
        b[off + 2],
        b[off + 3],
        b[off + 4],
        b[off + 5],
    ])
}

/// Parses a guest Ethernet frame in one pass: L2 (looking through up to two VLAN tags),
/// IPv4 (IHL, total length and header checksum checked) or IPv6 (payload length
/// checked, extension headers walked), then the TCP/UDP/ICMP/ICMPv6 fields the flow key
/// needs. Every offset is bounds-checked against the frame and against the IP packet's
/// own length (`ip_end`), so L4 fields never come from Ethernet padding.
///
/// For ARP and other EtherTypes only the L2 fields are filled in; `l4_off` and
/// `payload_off` equal `l3_off`, `ip_end` is the frame length, addresses are
/// `0.0.0.0` and ports zero.
///
/// Allocation-free and branch-light: it runs once per packet on the fast path.
pub fn parse_inner(frame: &[u8]) -> Result<InnerMeta, WireError> {
    whole(inner(frame, frame.len()), WireError::Truncated)
}

/// [`parse_inner`] on a frame of `total` bytes of which only the first piece, `head`,
/// is at hand: exactly `parse_inner`'s result on the whole frame, or `None` when that
/// needs bytes past `head` (see the module documentation for the spans read). Offsets
/// are from the start of the frame; for non-IP frames `ip_end` is `total`.
///
/// `head` must not be longer than `total`; if it is, `total` is taken to be
/// `head.len()`. For the inner frame of an underlay frame parsed with
/// [`parse_underlay_head`], pass `&head[m.inner_off..m.inner_end.min(head.len())]` and
/// `m.inner_end - m.inner_off`.
#[inline]
pub fn parse_inner_head(head: &[u8], total: usize) -> Option<Result<InnerMeta, WireError>> {
    decided(inner(head, total.max(head.len())))
}

/// The one implementation of [`parse_inner`] and [`parse_inner_head`];
/// `head.len() <= total`.
#[inline(always)]
fn inner(head: &[u8], total: usize) -> Result<InnerMeta, Stop<WireError>> {
    let l2 = read(head, total, 0, ethernet::HEADER_LEN)?;
    let (ety, l3_off) = match ethernet::skip_vlan_tags(head) {
        Err(WireError::Truncated) if head.len() < total => {
            return Err(vlan_tags_past_head(head, total))
        }
        r => r?,
    };
    let mut m = InnerMeta {
        dst_mac: mac_at(l2, 0),
        src_mac: mac_at(l2, 6),
        l3: L3::Other(ety),
        l3_off,
        l4_off: l3_off,
        payload_off: l3_off,
        ip_end: total,
        src_ip: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        dst_ip: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        proto: 0,
        src_port: 0,
        dst_port: 0,
        tcp_flags: 0,
        icmp_type: 0,
        icmp_code: 0,
        fragment: false,
        dont_fragment: false,
        hop_limit: 0,
    };
    match ety {
        ethertype::IPV4 => parse_inner_v4(head, total, &mut m)?,
        ethertype::IPV6 => parse_inner_v6(head, total, &mut m)?,
        ethertype::ARP => m.l3 = L3::Arp,
        _ => {}
    }
    Ok(m)
}

/// The VLAN walk ran out of `head` (shorter than the frame) before the EtherType. The
/// frame is truncated if the type field it was reading runs past `total`; otherwise the
/// walk needs the next piece. Decided by walking again over `head` followed by 0xff up
/// to `total`: no tag type ends in 0xff, so that walk stops at the first field reaching
/// past `head`, and it reports `Truncated` only when a field runs past `total` first.
#[cold]
fn vlan_tags_past_head(head: &[u8], total: usize) -> Stop<WireError> {
    const _: () = assert!(ethertype::VLAN & 0xff != 0xff && ethertype::QINQ & 0xff != 0xff);
    // The walk reads no further than this, so the head it ran out of is shorter.
    let mut buf = [0xff; ethernet::HEADER_LEN + ethernet::MAX_VLAN_TAGS * ethernet::VLAN_TAG_LEN];
    let known = head.len().min(buf.len());
    buf[..known].copy_from_slice(&head[..known]);
    match ethernet::skip_vlan_tags(&buf[..total.min(buf.len())]) {
        Err(WireError::Truncated) => Stop::Drop(WireError::Truncated),
        _ => Stop::NeedMore,
    }
}

#[inline(always)]
fn parse_inner_v4(head: &[u8], total: usize, m: &mut InnerMeta) -> Result<(), Stop<WireError>> {
    let l3 = m.l3_off;
    let h = read(head, total, l3, crate::ipv4::HEADER_LEN)?;
    if h[0] >> 4 != 4 {
        return Err(WireError::Malformed("ipv4 version").into());
    }
    let hl = ((h[0] & 0x0f) as usize) * 4;
    if hl < crate::ipv4::HEADER_LEN {
        return Err(WireError::Malformed("ipv4 header length (IHL < 5)").into());
    }
    let ip_len = be16(h, 2) as usize;
    if ip_len < hl {
        return Err(WireError::Malformed("ipv4 total length below header length").into());
    }
    let ip_end = l3 + ip_len;
    if ip_end > total {
        return Err(WireError::Truncated.into());
    }
    // hl <= ip_len and ip_end <= total, so the header with options is in the frame;
    // the checksum needs all of it in the head.
    let hdr = head.get(l3..l3 + hl).ok_or(Stop::NeedMore)?;
    if crate::checksum::fold(crate::checksum::sum(hdr, 0)) != 0xffff {
        return Err(WireError::Malformed("ipv4 header checksum").into());
    }
    let flg_off = be16(h, 6);
    m.l3 = L3::Ipv4;
    m.ip_end = ip_end;
    m.src_ip = IpAddr::V4(Ipv4Addr::new(h[12], h[13], h[14], h[15]));
    m.dst_ip = IpAddr::V4(Ipv4Addr::new(h[16], h[17], h[18], h[19]));
    m.proto = h[9];
    m.hop_limit = h[8];
    m.dont_fragment = flg_off & 0x4000 != 0;
    m.fragment = flg_off & 0x3fff != 0;
    m.l4_off = l3 + hl;
    m.payload_off = m.l4_off;
    if flg_off & 0x1fff != 0 {
        // Non-first fragment: no L4 header here.
        return Ok(());
    }
    parse_inner_l4(head, m, protocol::ICMP)
}

#[inline(always)]
fn parse_inner_v6(head: &[u8], total: usize, m: &mut InnerMeta) -> Result<(), Stop<WireError>> {
    let l3 = m.l3_off;
    let h = read(head, total, l3, ipv6::HEADER_LEN)?;
    if h[0] >> 4 != 6 {
        return Err(WireError::Malformed("ipv6 version").into());
    }
    let ip_end = l3 + ipv6::HEADER_LEN + be16(h, 4) as usize;
    if ip_end > total {
        return Err(WireError::Truncated.into());
    }
    m.l3 = L3::Ipv6;
    m.ip_end = ip_end;
    m.src_ip = IpAddr::V6(ipv6::addr_at(h, 8));
    m.dst_ip = IpAddr::V6(ipv6::addr_at(h, 24));
    m.hop_limit = h[7];
    let next = h[6];
    let (proto, l4_off, non_first) = match next {
        // Fast path: no extension headers.
        protocol::TCP | protocol::UDP | protocol::ICMPV6 => (next, l3 + ipv6::HEADER_LEN, false),
        _ => {
            let ext = ipv6::walk_extension_headers_head(head, ip_end, next, l3 + ipv6::HEADER_LEN)
                .ok_or(Stop::NeedMore)??;
            m.fragment = ext.fragment.is_some();
            let non_first = ext.fragment.is_some_and(|f| f.offset != 0);
            (ext.next_header, ext.l4_off, non_first)
        }
    };
    m.proto = proto;
    m.l4_off = l4_off;
    m.payload_off = l4_off;
    if non_first {
        return Ok(());
    }
    parse_inner_l4(head, m, protocol::ICMPV6)
}

/// Reads the L4 fields at `m.l4_off`, bounded by `m.ip_end` (`l4_off <= ip_end` holds:
/// the IHL is within the IPv4 total length, the IPv6 walk within the payload). `icmp`
/// is the ICMP protocol number of this IP version (ICMP in IPv4, ICMPv6 in IPv6).
#[inline(always)]
fn parse_inner_l4(head: &[u8], m: &mut InnerMeta, icmp: u8) -> Result<(), Stop<WireError>> {
    let (l4, end) = (m.l4_off, m.ip_end);
    match m.proto {
        protocol::TCP => {
            let h = read(head, end, l4, crate::tcp::HEADER_LEN)?;
            let hl = ((h[12] >> 4) as usize) * 4;
            if hl < crate::tcp::HEADER_LEN {
                return Err(WireError::Malformed("tcp data offset below 5").into());
            }
            // The options are not read, only bounded.
            if l4 + hl > end {
                return Err(WireError::Truncated.into());
            }
            m.src_port = be16(h, 0);
            m.dst_port = be16(h, 2);
            m.tcp_flags = h[13];
            m.payload_off = l4 + hl;
        }
        protocol::UDP => {
            let h = read(head, end, l4, crate::udp::HEADER_LEN)?;
            let ulen = be16(h, 4) as usize;
            if ulen < crate::udp::HEADER_LEN {
                return Err(WireError::Malformed("udp length below 8").into());
            }
            // A first fragment carries only part of the datagram the length covers.
            if l4 + ulen > end && !m.fragment {
                return Err(WireError::Truncated.into());
            }
            m.src_port = be16(h, 0);
            m.dst_port = be16(h, 2);
            m.payload_off = l4 + crate::udp::HEADER_LEN;
        }
        p if p == icmp => {
            let h = read(head, end, l4, 8)?;
            m.icmp_type = h[0];
            m.icmp_code = h[1];
            let echo = if icmp == protocol::ICMP {
                matches!(h[0], ICMP_ECHO_REQUEST | ICMP_ECHO_REPLY)
            } else {
                matches!(h[0], ICMPV6_ECHO_REQUEST | ICMPV6_ECHO_REPLY)
            };
            if echo {
                m.src_port = be16(h, 4);
            }
            m.payload_off = l4 + 8;
        }
        _ => {}
    }
    Ok(())
}

/// Why an underlay frame was dropped. Each reason is one counter; [`UnderlayDrop::name`]
/// is the counter's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnderlayDrop {
    /// Shorter than Ethernet + IPv6 + UDP + Geneve (70 bytes), or the IPv6/UDP length
    /// fields leave no room for the UDP and Geneve headers.
    Truncated,
    /// EtherType is not IPv6 (802.1Q-tagged underlay frames land here too: the
    /// underlay is untagged).
    NotIpv6,
    /// IPv6 EtherType but the version field is not 6.
    BadIpv6Version,
    /// The IPv6 payload length claims more bytes than the frame holds.
    BadIpv6Length,
    /// The outer IPv6 header is followed by an extension header. Our senders never add
    /// one, and walking them on the receive fast path buys nothing, so they are refused.
    Ipv6ExtensionHeader,
    /// The outer IPv6 next header is not UDP.
    NotUdp,
    /// UDP, but not to port 6081.
    NotGenevePort,
    /// The UDP length differs from the IPv6 payload length.
    BadUdpLength,
    /// Geneve version is not 0.
    BadGeneveVersion,
    /// Geneve O bit set: a control message, not data for a guest.
    GeneveOam,
    /// Geneve protocol type is not 0x6558 (Ethernet).
    NotEthernetPayload,
    /// The options area runs past the UDP datagram, an option runs past the options
    /// area, or an Oxide option has the wrong body length.
    BadOptionLength,
    /// An option this datapath does not understand has the critical bit set.
    UnknownCriticalOption,
    /// Oxide Multicast option with the reserved replication value 3.
    BadMulticastReplication,
    /// Oxide Mss option of 0 or above 65535 (not a TCP MSS).
    BadMssValue,
    /// Fewer than 14 bytes (an Ethernet header) after the Geneve header.
    InnerTruncated,
}

impl UnderlayDrop {
    /// Every reason, in declaration order, so a counter can be made per reason.
    pub const ALL: &'static [UnderlayDrop] = &[
        UnderlayDrop::Truncated,
        UnderlayDrop::NotIpv6,
        UnderlayDrop::BadIpv6Version,
        UnderlayDrop::BadIpv6Length,
        UnderlayDrop::Ipv6ExtensionHeader,
        UnderlayDrop::NotUdp,
        UnderlayDrop::NotGenevePort,
        UnderlayDrop::BadUdpLength,
        UnderlayDrop::BadGeneveVersion,
        UnderlayDrop::GeneveOam,
        UnderlayDrop::NotEthernetPayload,
        UnderlayDrop::BadOptionLength,
        UnderlayDrop::UnknownCriticalOption,
        UnderlayDrop::BadMulticastReplication,
        UnderlayDrop::BadMssValue,
        UnderlayDrop::InnerTruncated,
    ];

    /// The counter name (snake_case, stable: it appears in stats and docs).
    pub const fn name(&self) -> &'static str {
        match self {
            UnderlayDrop::Truncated => "truncated",
            UnderlayDrop::NotIpv6 => "not_ipv6",
            UnderlayDrop::BadIpv6Version => "bad_ipv6_version",
            UnderlayDrop::BadIpv6Length => "bad_ipv6_length",
            UnderlayDrop::Ipv6ExtensionHeader => "ipv6_extension_header",
            UnderlayDrop::NotUdp => "not_udp",
            UnderlayDrop::NotGenevePort => "not_geneve_port",
            UnderlayDrop::BadUdpLength => "bad_udp_length",
            UnderlayDrop::BadGeneveVersion => "bad_geneve_version",
            UnderlayDrop::GeneveOam => "geneve_oam",
            UnderlayDrop::NotEthernetPayload => "not_ethernet_payload",
            UnderlayDrop::BadOptionLength => "bad_option_length",
            UnderlayDrop::UnknownCriticalOption => "unknown_critical_option",
            UnderlayDrop::BadMulticastReplication => "bad_multicast_replication",
            UnderlayDrop::BadMssValue => "bad_mss_value",
            UnderlayDrop::InnerTruncated => "inner_truncated",
        }
    }
}

impl core::fmt::Display for UnderlayDrop {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::error::Error for UnderlayDrop {}

/// Offsets of the fixed outer headers of an underlay frame (untagged).
const OUTER_IP_OFF: usize = ethernet::HEADER_LEN;
const OUTER_UDP_OFF: usize = OUTER_IP_OFF + ipv6::HEADER_LEN;
const OUTER_GENEVE_OFF: usize = OUTER_UDP_OFF + crate::udp::HEADER_LEN;
/// Ethernet + IPv6 + UDP + Geneve without options: 70 bytes.
pub const OUTER_MIN_LEN: usize = OUTER_GENEVE_OFF + geneve::HEADER_LEN;
/// Ethernet + IPv6 + UDP + Geneve with the largest options area: 322 bytes.
/// [`parse_underlay_head`] never needs more of the frame than this.
pub const OUTER_MAX_LEN: usize = OUTER_MIN_LEN + geneve::MAX_OPTIONS_LEN;

/// Validates an underlay frame (Ethernet / IPv6 / UDP 6081 / Geneve / Ethernet) and
/// returns the outer addresses, the VNI, the decoded Oxide options and where the inner
/// frame is. Every refusal is a distinct [`UnderlayDrop`].
///
/// Not checked here: the outer UDP checksum (zero on our tunnels, RFC 6935; the inner
/// checksums protect the payload) and the inner frame beyond its Ethernet header (the
/// engine runs [`parse_inner`] on `frame[inner_off..inner_end]`, which checks the inner
/// IP lengths). Straight-line, allocation-free; the options loop is bounded by the
/// 252-byte options area.
pub fn parse_underlay(frame: &[u8]) -> Result<UnderlayMeta, UnderlayDrop> {
    whole(underlay(frame, frame.len()), UnderlayDrop::Truncated)
}

/// [`parse_underlay`] on a frame of `total` bytes of which only the first piece,
/// `head`, is at hand (an AF_XDP buffer chain): exactly `parse_underlay`'s result on
/// the whole frame, or `None` when the 70 bytes of fixed headers or the Geneve options
/// reach past `head` (never when `head` holds [`OUTER_MAX_LEN`] bytes). Offsets are
/// from the start of the frame; `inner_end` may lie past `head`, `inner_off` does not.
///
/// `head` must not be longer than `total`; if it is, `total` is taken to be
/// `head.len()`.
///
/// ```
/// use wire::meta::{parse_inner, parse_inner_head, parse_underlay, parse_underlay_head};
/// # let frame = vec![0u8; 100];
/// // `frame` stands for a chain; only its first piece is read.
/// let head = &frame[..frame.len().min(3840)];
/// let underlay = match parse_underlay_head(head, frame.len()) {
///     Some(r) => r,
///     None => parse_underlay(&frame), // headers past the first piece: copy, then parse
/// };
/// if let Ok(m) = underlay {
///     let inner_head = &head[m.inner_off..m.inner_end.min(head.len())];
///     let inner = parse_inner_head(inner_head, m.inner_end - m.inner_off)
///         .unwrap_or_else(|| parse_inner(&frame[m.inner_off..m.inner_end]));
///     # let _ = inner;
/// }
/// ```
// Always: the datapath's receive path needs it inlined (its result kept in
// registers), and a second caller would otherwise move it out of line.
#[inline(always)]
pub fn parse_underlay_head(
    head: &[u8],
    total: usize,
) -> Option<Result<UnderlayMeta, UnderlayDrop>> {
    decided(underlay(head, total.max(head.len())))
}

/// The one implementation of [`parse_underlay`] and [`parse_underlay_head`];
/// `head.len() <= total`.
#[inline(always)]
fn underlay(head: &[u8], total: usize) -> Result<UnderlayMeta, Stop<UnderlayDrop>> {
    if total < OUTER_MIN_LEN {
        return Err(UnderlayDrop::Truncated.into());
    }
    let fixed = head.first_chunk::<OUTER_MIN_LEN>().ok_or(Stop::NeedMore)?;
    let mut meta = outer_headers(fixed, total)?;
    // outer_headers bounded inner_off by the UDP datagram, hence by `total`.
    let opts = head
        .get(OUTER_MIN_LEN..meta.inner_off)
        .ok_or(Stop::NeedMore)?;
    geneve_options(opts, &mut meta)?;
    if meta.inner_end - meta.inner_off < ethernet::HEADER_LEN {
        return Err(UnderlayDrop::InnerTruncated.into());
    }
    Ok(meta)
}

/// Checks the fixed outer headers of a frame of `total` bytes and fills in everything
/// but the options.
#[inline(always)]
fn outer_headers(frame: &[u8; OUTER_MIN_LEN], total: usize) -> Result<UnderlayMeta, UnderlayDrop> {
    if be16(frame, 12) != ethertype::IPV6 {
        return Err(UnderlayDrop::NotIpv6);
    }
    let ip = &frame[OUTER_IP_OFF..OUTER_UDP_OFF];
    if ip[0] >> 4 != 6 {
        return Err(UnderlayDrop::BadIpv6Version);
    }
    let plen = be16(ip, 4) as usize;
    if OUTER_UDP_OFF + plen > total {
        return Err(UnderlayDrop::BadIpv6Length);
    }
    match ip[6] {
        protocol::UDP => {}
        protocol::HOP_BY_HOP
        | protocol::IPV6_ROUTING
        | protocol::IPV6_FRAGMENT
        | protocol::IPV6_DEST_OPTS => return Err(UnderlayDrop::Ipv6ExtensionHeader),
        _ => return Err(UnderlayDrop::NotUdp),
    }
    let udp = &frame[OUTER_UDP_OFF..OUTER_GENEVE_OFF];
    if be16(udp, 2) != geneve::GENEVE_PORT {
        return Err(UnderlayDrop::NotGenevePort);
    }
    let ulen = be16(udp, 4) as usize;
    if ulen != plen {
        return Err(UnderlayDrop::BadUdpLength);
    }
    if ulen < crate::udp::HEADER_LEN + geneve::HEADER_LEN {
        return Err(UnderlayDrop::Truncated);
    }
    // ulen == plen and the IPv6 check bound it, so udp_end <= total.
    let udp_end = OUTER_UDP_OFF + ulen;
    let g = &frame[OUTER_GENEVE_OFF..OUTER_MIN_LEN];
    if g[0] >> 6 != 0 {
        return Err(UnderlayDrop::BadGeneveVersion);
    }
    if g[1] & 0x80 != 0 {
        return Err(UnderlayDrop::GeneveOam);
    }
    if be16(g, 2) != ethertype::TRANSPARENT_ETHERNET {
        return Err(UnderlayDrop::NotEthernetPayload);
    }
    let inner_off = OUTER_MIN_LEN + ((g[0] & 0x3f) as usize) * 4;
    if inner_off > udp_end {
        return Err(UnderlayDrop::BadOptionLength);
    }
    Ok(UnderlayMeta {
        outer_dst_mac: mac_at(frame, 0),
        outer_src_mac: mac_at(frame, 6),
        outer_src: ipv6::addr_at(ip, 8),
        outer_dst: ipv6::addr_at(ip, 24),
        udp_src_port: be16(udp, 0),
        outer_tclass: (ip[0] << 4) | (ip[1] >> 4),
        vni: u32::from_be_bytes([0, g[4], g[5], g[6]]),
        external: false,
        multicast: None,
        mss: None,
        inner_off,
        inner_end: udp_end,
    })
}

/// Walks the Geneve options area `opts` and records the Oxide options in `meta`.
#[inline(always)]
fn geneve_options(mut opts: &[u8], meta: &mut UnderlayMeta) -> Result<(), UnderlayDrop> {
    while !opts.is_empty() {
        let (opt, rest) = geneve::read_option(opts).map_err(|_| UnderlayDrop::BadOptionLength)?;
        opts = rest;
        if opt.class != geneve::OXIDE_OPTION_CLASS {
            if opt.is_critical() {
                return Err(UnderlayDrop::UnknownCriticalOption);
            }
            continue;
        }
        match OxideOption::decode(&opt) {
            Ok(OxideOption::External) => meta.external = true,
            Ok(OxideOption::Multicast(r)) => meta.multicast = Some(r),
            Ok(OxideOption::Mss(m)) => {
                if m == 0 || m > u32::from(u16::MAX) {
                    return Err(UnderlayDrop::BadMssValue);
                }
                meta.mss = Some(m);
            }
            Err(OxideOptionError::BadLength) => return Err(UnderlayDrop::BadOptionLength),
            Err(OxideOptionError::BadReplication) => {
                return Err(UnderlayDrop::BadMulticastReplication)
            }
            Err(OxideOptionError::UnknownType(_)) => {
                if opt.is_critical() {
                    return Err(UnderlayDrop::UnknownCriticalOption);
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ethernet, geneve, ipv4, ipv6, tcp, udp};
    use std::collections::HashMap;

    /// Frames built by scapy (testdata/gen_vectors.py) with the expected parse results.
    static VECTORS: &str = include_str!("../testdata/vectors.txt");

    fn vectors(kind: &'static str) -> Vec<HashMap<&'static str, &'static str>> {
        let v: Vec<_> = VECTORS
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .map(|l| {
                l.split(' ')
                    .map(|kv| kv.split_once('=').expect("key=value"))
                    .collect::<HashMap<_, _>>()
            })
            .filter(|m| m["kind"] == kind)
            .collect();
        assert!(!v.is_empty(), "no {kind} vectors");
        v
    }

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn num<T: std::str::FromStr>(v: &HashMap<&str, &str>, k: &str) -> T
    where
        T::Err: std::fmt::Debug,
    {
        v[k].parse()
            .unwrap_or_else(|e| panic!("{k}={}: {e:?}", v[k]))
    }

    #[test]
    fn inner_vectors_from_scapy() {
        for v in vectors("inner") {
            let name = v["name"];
            let frame = unhex(v["frame"]);
            let m = parse_inner(&frame).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(m.dst_mac.to_string(), v["dst_mac"], "{name}");
            assert_eq!(m.src_mac.to_string(), v["src_mac"], "{name}");
            assert_eq!(m.l3_off, num::<usize>(&v, "l3_off"), "{name}");
            match v["l3"] {
                "arp" => {
                    assert_eq!(m.l3, L3::Arp, "{name}");
                    continue;
                }
                "ipv4" => assert_eq!(m.l3, L3::Ipv4, "{name}"),
                "ipv6" => assert_eq!(m.l3, L3::Ipv6, "{name}"),
                other => panic!("{name}: l3={other}"),
            }
            assert_eq!(m.l4_off, num::<usize>(&v, "l4_off"), "{name}");
            assert_eq!(m.payload_off, num::<usize>(&v, "payload_off"), "{name}");
            assert_eq!(m.ip_end, num::<usize>(&v, "ip_end"), "{name}");
            assert_eq!(m.src_ip, num::<IpAddr>(&v, "src_ip"), "{name}");
            assert_eq!(m.dst_ip, num::<IpAddr>(&v, "dst_ip"), "{name}");
            assert_eq!(m.proto, num::<u8>(&v, "proto"), "{name}");
            assert_eq!(m.src_port, num::<u16>(&v, "src_port"), "{name}");
            assert_eq!(m.dst_port, num::<u16>(&v, "dst_port"), "{name}");
            assert_eq!(m.tcp_flags, num::<u8>(&v, "tcp_flags"), "{name}");
            assert_eq!(m.icmp_type, num::<u8>(&v, "icmp_type"), "{name}");
            assert_eq!(m.icmp_code, num::<u8>(&v, "icmp_code"), "{name}");
            assert_eq!(m.fragment, v["fragment"] == "1", "{name}");
            assert_eq!(m.dont_fragment, v["df"] == "1", "{name}");
            assert_eq!(m.hop_limit, num::<u8>(&v, "hop_limit"), "{name}");
        }
    }

    fn vector(kind: &'static str, name: &str) -> Vec<u8> {
        let v = vectors(kind);
        let v = v.iter().find(|v| v["name"] == name).unwrap();
        unhex(v["frame"])
    }

    /// Our emitters reproduce scapy's bytes for a TCP SYN with options over IPv4.
    #[test]
    fn emit_ipv4_tcp_syn_matches_scapy() {
        let want = vector("inner", "ipv4_tcp_syn");
        let eth = ethernet::Repr::parse(&ethernet::Frame::new_checked(&want[..]).unwrap()).unwrap();
        let ip_view = ipv4::Packet::new_checked(&want[14..]).unwrap();
        let ip = ipv4::Repr::parse(&ip_view).unwrap();
        let t = tcp::Repr::parse(&tcp::Packet::new_checked(ip_view.payload()).unwrap()).unwrap();

        let mut out = vec![0u8; want.len()];
        eth.emit(&mut ethernet::Frame::new_unchecked(&mut out[..]));
        ip.emit(&mut ipv4::Packet::new_unchecked(&mut out[14..]))
            .unwrap();
        let mut tp = tcp::Packet::new_unchecked(&mut out[34..]);
        t.emit(&mut tp).unwrap();
        tp.fill_checksum_v4(ip.src_addr, ip.dst_addr);
        assert_eq!(out, want);
    }

    /// Same for IPv6/UDP.
    #[test]
    fn emit_ipv6_udp_matches_scapy() {
        let want = vector("inner", "ipv6_udp");
        let ip_view = ipv6::Packet::new_checked(&want[14..]).unwrap();
        let ip = ipv6::Repr::parse(&ip_view).unwrap();
        let u = udp::Repr::parse(&udp::Packet::new_checked(ip_view.payload()).unwrap()).unwrap();
        let mut out = want.clone();
        out[14..62].fill(0);
        ip.emit(&mut ipv6::Packet::new_unchecked(&mut out[14..]))
            .unwrap();
        let mut up = udp::Packet::new_unchecked(&mut out[54..]);
        u.emit(&mut up).unwrap();
        up.fill_checksum_v6(ip.src_addr, ip.dst_addr);
        assert_eq!(out, want);
        assert!(udp::Packet::new_checked(&want[54..])
            .unwrap()
            .verify_checksum_v6(ip.src_addr, ip.dst_addr));
    }

    fn replication(s: &str) -> Option<Replication> {
        match s {
            "-" => None,
            "external" => Some(Replication::External),
            "underlay" => Some(Replication::Underlay),
            "both" => Some(Replication::Both),
            other => panic!("replication {other}"),
        }
    }

    #[test]
    fn underlay_vectors_from_scapy_parse_and_emit() {
        for v in vectors("underlay") {
            let name = v["name"];
            let frame = unhex(v["frame"]);
            let m = parse_underlay(&frame).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(m.outer_src_mac.to_string(), v["outer_src_mac"], "{name}");
            assert_eq!(m.outer_dst_mac.to_string(), v["outer_dst_mac"], "{name}");
            assert_eq!(m.outer_src, num::<Ipv6Addr>(&v, "outer_src"), "{name}");
            assert_eq!(m.outer_dst, num::<Ipv6Addr>(&v, "outer_dst"), "{name}");
            assert_eq!(m.udp_src_port, num::<u16>(&v, "udp_src_port"), "{name}");
            assert_eq!(m.vni, num::<u32>(&v, "vni"), "{name}");
            assert_eq!(m.external, v["external"] == "1", "{name}");
            assert_eq!(m.multicast, replication(v["multicast"]), "{name}");
            let mss = (v["mss"] != "-").then(|| num::<u32>(&v, "mss"));
            assert_eq!(m.mss, mss, "{name}");
            assert_eq!(m.inner_off, num::<usize>(&v, "inner_off"), "{name}");
            assert_eq!(m.inner_end, num::<usize>(&v, "inner_end"), "{name}");
            // The inner frame parses too.
            parse_inner(&frame[m.inner_off..m.inner_end]).unwrap();

            // Rebuild the outer headers with our emitters. The frame with unknown
            // options cannot be reproduced (we only emit Oxide options), so only the
            // ones whose Geneve header is exactly ours are compared byte for byte.
            let geneve_len: usize = num(&v, "geneve_len");
            let g = geneve::Repr {
                vni: m.vni,
                oam: false,
                external: m.external,
                multicast: m.multicast,
                mss: m.mss,
            };
            if g.buffer_len() != geneve_len {
                continue;
            }
            let mut out = vec![0u8; frame.len()];
            let inner = &frame[m.inner_off..m.inner_end];
            out[m.inner_off..].copy_from_slice(inner);
            ethernet::Repr {
                src_addr: m.outer_src_mac,
                dst_addr: m.outer_dst_mac,
                ethertype: ethernet::ethertype::IPV6,
            }
            .emit(&mut ethernet::Frame::new_unchecked(&mut out[..]));
            let udp_len = udp::HEADER_LEN + geneve_len + inner.len();
            ipv6::Repr {
                src_addr: m.outer_src,
                dst_addr: m.outer_dst,
                next_header: ipv4::protocol::UDP,
                payload_len: udp_len,
                hop_limit: 128,
                traffic_class: 0,
                flow_label: 0,
            }
            .emit(&mut ipv6::Packet::new_unchecked(&mut out[14..]))
            .unwrap();
            udp::Repr {
                src_port: m.udp_src_port,
                dst_port: geneve::GENEVE_PORT,
                payload_len: udp_len - udp::HEADER_LEN,
            }
            .emit(&mut udp::Packet::new_unchecked(&mut out[54..]))
            .unwrap();
            if m.multicast.is_none() && !m.external {
                assert_eq!(
                    geneve::emit_header(&mut out[62..], m.vni, m.mss),
                    Ok(geneve_len)
                );
            } else {
                assert_eq!(g.emit_into(&mut out[62..]), Ok(geneve_len));
            }
            assert_eq!(out, frame, "{name}");
        }
    }

    #[test]
    fn drop_vectors_from_scapy() {
        let mut seen = std::collections::HashSet::new();
        for v in vectors("drop") {
            let frame = unhex(v["frame"]);
            let got = parse_underlay(&frame).map(|_| ()).unwrap_err();
            assert_eq!(got.name(), v["drop"], "{}", v["name"]);
            seen.insert(got);
        }
        // Every reason has at least one frame built by scapy.
        for d in UnderlayDrop::ALL {
            assert!(seen.contains(d), "no scapy vector for {d}");
        }
    }

    /// A valid underlay frame built by hand: Geneve with an Mss option around a small
    /// IPv4/UDP guest frame.
    fn good_underlay() -> Vec<u8> {
        underlay_around(&vector("inner", "vlan_ipv4_udp"))
    }

    /// Outer Ethernet/IPv6/UDP 6081 and Geneve with an Mss option (16 bytes) around
    /// `inner`, which starts at offset 78.
    fn underlay_around(inner: &[u8]) -> Vec<u8> {
        let geneve_len = 16;
        let udp_len = 8 + geneve_len + inner.len();
        let mut f = vec![0u8; OUTER_MIN_LEN + 8 + inner.len()];
        f[12..14].copy_from_slice(&ethernet::ethertype::IPV6.to_be_bytes());
        ipv6::Repr {
            src_addr: "fd00::1".parse().unwrap(),
            dst_addr: "fd00::2".parse().unwrap(),
            next_header: 17,
            payload_len: udp_len,
            hop_limit: 128,
            traffic_class: 0,
            flow_label: 0,
        }
        .emit(&mut ipv6::Packet::new_unchecked(&mut f[14..]))
        .unwrap();
        udp::Repr {
            src_port: 1,
            dst_port: 6081,
            payload_len: udp_len - 8,
        }
        .emit(&mut udp::Packet::new_unchecked(&mut f[54..]))
        .unwrap();
        geneve::emit_header(&mut f[62..], 99, Some(1448)).unwrap();
        f[78..].copy_from_slice(inner);
        f
    }

    /// Checks the head/total contract of a `_head` parser against its contiguous form
    /// on `f`, at every split point: each head of `f` either decides exactly as the
    /// whole frame does or is undecided, and once a head decides every longer one does.
    /// A head longer than the claimed total is parsed as the whole frame. Returns the
    /// shortest head that decides.
    pub(super) fn head_need<T: PartialEq + std::fmt::Debug>(
        f: &[u8],
        whole: impl Fn(&[u8]) -> T,
        head: impl Fn(&[u8], usize) -> Option<T>,
    ) -> usize {
        let want = whole(f);
        assert_eq!(head(f, 0), Some(whole(f)), "head longer than total");
        let mut need = None;
        for h in 0..=f.len() {
            match head(&f[..h], f.len()) {
                Some(got) => {
                    assert_eq!(got, want, "head {h} of {}", f.len());
                    need.get_or_insert(h);
                }
                None => assert!(need.is_none(), "head {h} undecided after {need:?}"),
            }
        }
        need.expect("the whole frame as head decides")
    }

    /// [`head_need`] for `parse_inner_head`; checks that a valid frame decides once
    /// its headers (up to `payload_off`) are in the head.
    pub(super) fn inner_need(f: &[u8]) -> usize {
        let need = head_need(f, parse_inner, parse_inner_head);
        if let Ok(m) = parse_inner(f) {
            assert!(need <= m.payload_off, "needs {need} > payload_off {m:?}");
        }
        need
    }

    /// [`head_need`] for `parse_underlay_head`: never more than `OUTER_MAX_LEN`, and
    /// no more than `inner_off` for a valid frame. At every split where the underlay
    /// decides, the inner frame's part of the same head obeys the contract too.
    pub(super) fn underlay_need(f: &[u8]) -> usize {
        let need = head_need(f, parse_underlay, parse_underlay_head);
        assert!(need <= OUTER_MAX_LEN, "needs {need}");
        let Ok(m) = parse_underlay(f) else {
            return need;
        };
        assert!(
            need <= m.inner_off,
            "needs {need} > inner_off {}",
            m.inner_off
        );
        let inner = &f[m.inner_off..m.inner_end];
        let want = parse_inner(inner);
        for h in need..=f.len() {
            let got = parse_inner_head(
                &f[m.inner_off..m.inner_end.min(h)],
                m.inner_end - m.inner_off,
            );
            assert!(got.is_none() || got == Some(want), "head {h}: {got:?}");
        }
        need
    }

    #[test]
    fn every_drop_reason_reachable() {
        assert!(parse_underlay(&good_underlay()).is_ok());
        type Mutation = fn(&mut Vec<u8>);
        let cases: [(UnderlayDrop, Mutation); 16] = [
            (UnderlayDrop::Truncated, |f| f.truncate(69)),
            (UnderlayDrop::NotIpv6, |f| f[12] = 0x08),
            (UnderlayDrop::BadIpv6Version, |f| f[14] = 0x40),
            (UnderlayDrop::BadIpv6Length, |f| f[19] += 1),
            (UnderlayDrop::Ipv6ExtensionHeader, |f| f[20] = 60),
            (UnderlayDrop::NotUdp, |f| f[20] = 6),
            (UnderlayDrop::NotGenevePort, |f| f[57] = 0xc2),
            (UnderlayDrop::BadUdpLength, |f| f[59] -= 1),
            (UnderlayDrop::BadGeneveVersion, |f| f[62] |= 0x80),
            (UnderlayDrop::GeneveOam, |f| f[63] = 0x80),
            (UnderlayDrop::NotEthernetPayload, |f| f[64] = 0x86),
            (UnderlayDrop::BadOptionLength, |f| f[73] = 2),
            (UnderlayDrop::UnknownCriticalOption, |f| f[72] = 0x82 | 0x01),
            (UnderlayDrop::BadMulticastReplication, |f| {
                f[72] = 1;
                f[74] = 0xc0;
            }),
            (UnderlayDrop::BadMssValue, |f| f[74..78].fill(0)),
            (UnderlayDrop::InnerTruncated, |f| {
                // Shrink the datagram to 13 inner bytes.
                let udp_len = (8 + 16 + 13) as u16;
                f[18..20].copy_from_slice(&udp_len.to_be_bytes());
                f[58..60].copy_from_slice(&udp_len.to_be_bytes());
            }),
        ];
        let mut covered = std::collections::HashSet::new();
        for (want, mutate) in cases {
            let mut f = good_underlay();
            mutate(&mut f);
            assert_eq!(parse_underlay(&f).map(|_| ()), Err(want), "{want}");
            underlay_need(&f);
            covered.insert(want);
        }
        assert_eq!(covered.len(), UnderlayDrop::ALL.len());
    }

    #[test]
    fn drop_names_are_unique_snake_case() {
        let names: std::collections::HashSet<_> = UnderlayDrop::ALL
            .iter()
            .map(super::UnderlayDrop::name)
            .collect();
        assert_eq!(names.len(), UnderlayDrop::ALL.len());
        for n in names {
            assert!(
                n.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
                "{n}"
            );
        }
    }

    #[test]
    fn ethernet_padding_is_not_l4() {
        // scapy's padded frame: ip_end stops before the 4 padding bytes.
        let f = vector("inner", "ipv4_tcp_data_padded");
        let m = parse_inner(&f).unwrap();
        assert_eq!(m.ip_end, f.len() - 4);
        assert_eq!(&f[m.payload_off..m.ip_end], b"hi");
    }

    #[test]
    fn inner_refusals() {
        let good = vector("inner", "ipv4_tcp_syn");
        let cases: [(usize, u8, WireError); 4] = [
            (14, 0x55, WireError::Malformed("ipv4 version")),
            (
                14,
                0x44,
                WireError::Malformed("ipv4 header length (IHL < 5)"),
            ),
            (24, 0x00, WireError::Malformed("ipv4 header checksum")),
            (46, 0x40, WireError::Malformed("tcp data offset below 5")),
        ];
        for (at, val, want) in cases {
            let mut f = good.clone();
            f[at] = val;
            assert_eq!(parse_inner(&f), Err(want), "byte {at} = {val:#x}");
        }
        // Every strict prefix of an IP frame is refused (no partial metadata).
        for n in 0..good.len() {
            assert!(parse_inner(&good[..n]).is_err(), "prefix {n}");
        }
        let v6 = vector("inner", "ipv6_ext_headers_tcp");
        for n in 0..v6.len() {
            assert!(parse_inner(&v6[..n]).is_err(), "v6 prefix {n}");
        }
        // IPv4 total length below the header length.
        let mut f = good.clone();
        f[16..18].copy_from_slice(&19u16.to_be_bytes());
        assert!(matches!(parse_inner(&f), Err(WireError::Malformed(_))));
        // UDP length below 8.
        let mut f = vector("inner", "ipv6_udp");
        f[58..60].copy_from_slice(&7u16.to_be_bytes());
        assert_eq!(
            parse_inner(&f),
            Err(WireError::Malformed("udp length below 8"))
        );
        // Non-IP frames: L2 only.
        let arp = vector("inner", "arp_request");
        let m = parse_inner(&arp).unwrap();
        assert_eq!(
            (m.l3, m.l3_off, m.l4_off, m.ip_end),
            (L3::Arp, 14, 14, arp.len())
        );
        let mut other = arp.clone();
        other[12..14].copy_from_slice(&0x88ccu16.to_be_bytes());
        assert_eq!(parse_inner(&other).unwrap().l3, L3::Other(0x88cc));
    }

    /// Every scapy frame, split at every point: the `_head` parsers decide exactly as
    /// the contiguous ones or not at all, and decide once the headers are in the head.
    #[test]
    fn head_parsers_agree_on_every_vector_and_split() {
        for v in vectors("inner") {
            let f = unhex(v["frame"]);
            let need = inner_need(&f);
            // The end of the last span read (module documentation).
            let m = parse_inner(&f).unwrap();
            let want = match (m.l3, m.proto) {
                (L3::Arp | L3::Other(_), _) => m.l3_off,
                (_, ipv4::protocol::TCP) if m.payload_off > m.l4_off => m.l4_off + tcp::HEADER_LEN,
                _ => m.payload_off,
            };
            assert_eq!(need, want, "{}", v["name"]);
        }
        for kind in ["underlay", "drop"] {
            for v in vectors(kind) {
                underlay_need(&unhex(v["frame"]));
            }
        }
    }

    /// A 9014-byte underlay frame (9000-byte MTU) as AF_XDP delivers it: 3840 + 3840 +
    /// 1334 bytes. The first piece alone yields the same metadata as the copied frame,
    /// for the outer headers and for the inner Ethernet/IPv6/TCP frame.
    #[test]
    fn jumbo_frame_parses_from_its_first_piece() {
        let payload = vec![0x5a; 9014 - OUTER_MIN_LEN - 8 - 14 - 40 - 32];
        let mut inner = Vec::new();
        etherparse::PacketBuilder::ethernet2([2, 8, 0x20, 1, 2, 3], [2, 8, 0x20, 4, 5, 6])
            .ipv6([0xfd; 16], [0xfe; 16], 64)
            .tcp(40000, 5201, 7, 512)
            .ack(1)
            .options(&[
                etherparse::TcpOptionElement::Noop,
                etherparse::TcpOptionElement::Noop,
                etherparse::TcpOptionElement::Timestamp(1, 2),
            ])
            .unwrap()
            .write(&mut inner, &payload)
            .unwrap();
        let f = underlay_around(&inner);
        assert_eq!(f.len(), 3840 + 3840 + 1334);
        let head = &f[..3840];

        let m = parse_underlay(&f).unwrap();
        assert_eq!(parse_underlay_head(head, f.len()), Some(Ok(m)));
        assert_eq!((m.inner_off, m.inner_end, m.mss), (78, 9014, Some(1448)));

        let im = parse_inner(&f[m.inner_off..m.inner_end]).unwrap();
        let inner_head = &head[m.inner_off..m.inner_end.min(head.len())];
        assert_eq!(
            parse_inner_head(inner_head, m.inner_end - m.inner_off),
            Some(Ok(im))
        );
        assert_eq!((im.l3, im.proto, im.dst_port), (L3::Ipv6, 6, 5201));
        assert_eq!((im.payload_off, im.ip_end), (14 + 40 + 32, inner.len()));
        assert!(im.ip_end > inner_head.len());
    }

    /// A length field that runs past the frame is refused from the head alone, with the
    /// reason the contiguous parser gives, even when the head holds none of the bytes
    /// the length claims: only the spans the parser reads must be in the head, and
    /// every length is checked against `total`. The bytes past the head are garbage
    /// here, to show they are not read.
    #[test]
    fn lengths_past_the_frame_are_refused_from_the_head() {
        fn garbage_after(mut f: Vec<u8>, head: usize, total: usize) -> Vec<u8> {
            f.resize(total, 0);
            f[head..].fill(0xa5);
            f
        }
        // Underlay: the 70 bytes of fixed headers are the head; the frame is 9014.
        type Mutation = fn(&mut Vec<u8>);
        let under: [(UnderlayDrop, Mutation); 4] = [
            // IPv6 payload length past the frame.
            (UnderlayDrop::BadIpv6Length, |f| {
                f[18..20].copy_from_slice(&9000u16.to_be_bytes());
            }),
            // UDP length past the frame (and so unlike the IPv6 payload length).
            (UnderlayDrop::BadUdpLength, |f| {
                f[58..60].copy_from_slice(&9000u16.to_be_bytes());
            }),
            // 60 bytes of options in a datagram that ends 4 bytes after the Geneve header.
            (UnderlayDrop::BadOptionLength, |f| {
                f[18..20].copy_from_slice(&20u16.to_be_bytes());
                f[58..60].copy_from_slice(&20u16.to_be_bytes());
                f[62] = 15;
            }),
            // 13 bytes after options that are all in the head.
            (UnderlayDrop::InnerTruncated, |f| {
                f[18..20].copy_from_slice(&37u16.to_be_bytes());
                f[58..60].copy_from_slice(&37u16.to_be_bytes());
            }),
        ];
        for (want, mutate) in under {
            let mut f = good_underlay();
            mutate(&mut f);
            let head = if want == UnderlayDrop::InnerTruncated {
                78
            } else {
                OUTER_MIN_LEN
            };
            let f = garbage_after(f, head, 9014);
            assert_eq!(parse_underlay(&f).map(|_| ()), Err(want));
            assert_eq!(
                parse_underlay_head(&f[..head], f.len()).map(|r| r.map(|_| ())),
                Some(Err(want)),
                "{want}"
            );
        }

        // Inner: each case names the frame, the bytes changed and the head it needs.
        let cases: [(&str, usize, &[u8], usize); 5] = [
            // IPv4 total length past the frame: only the 20-byte header in the head.
            ("ipv4_tcp_syn", 16, &4000u16.to_be_bytes(), 34),
            // IPv6 payload length past the frame.
            ("ipv6_udp", 18, &4000u16.to_be_bytes(), 54),
            // UDP length past the IPv6 payload.
            ("ipv6_udp", 58, &4000u16.to_be_bytes(), 62),
            // TCP data offset past the IPv4 packet (its options are not read).
            ("ipv4_tcp_data_padded", 46, &[0xf0], 54),
            // A routing header (after hop-by-hop) longer than the IPv6 payload: its
            // first two bytes are in the head, its body would not be.
            ("ipv6_ext_headers_tcp", 54 + 8 + 1, &[0xff], 54 + 8 + 2),
        ];
        for (name, at, bytes, head) in cases {
            let mut f = vector("inner", name);
            f[at..at + bytes.len()].copy_from_slice(bytes);
            let total = f.len();
            // Keep the IP lengths consistent with a frame of `total` bytes, so the
            // refusal comes from the field changed.
            let f = garbage_after(f, head, total);
            assert_eq!(parse_inner(&f), Err(WireError::Truncated), "{name}@{at}");
            assert_eq!(
                parse_inner_head(&f[..head], total),
                Some(Err(WireError::Truncated)),
                "{name}@{at}"
            );
        }

        // An ICMPv6 header cut short by the IPv6 payload length in a frame that has the
        // bytes (as padding): L4 reads are bounded by the IP packet, not by the head.
        let mut f = vector("inner", "ipv6_icmpv6_echo");
        f[18..20].copy_from_slice(&4u16.to_be_bytes());
        assert_eq!(parse_inner(&f), Err(WireError::Truncated));
        for head in [58, f.len()] {
            assert_eq!(
                parse_inner_head(&f[..head], f.len()),
                Some(Err(WireError::Truncated))
            );
        }

        // A VLAN tag whose type field runs past a 15-byte frame: decided with 14 bytes
        // in hand. In a longer frame that field is needed.
        let mut f = vector("inner", "arp_request");
        f[12..14].copy_from_slice(&ethertype::VLAN.to_be_bytes());
        f[16..18].copy_from_slice(&ethertype::ARP.to_be_bytes());
        assert_eq!(parse_inner(&f[..15]), Err(WireError::Truncated));
        assert_eq!(
            parse_inner_head(&f[..14], 15),
            Some(Err(WireError::Truncated))
        );
        assert_eq!(parse_inner_head(&f[..14], 18), None);
        assert_eq!(
            parse_inner_head(&f[..18], f.len()),
            Some(Ok(parse_inner(&f).unwrap()))
        );
    }

    mod prop {
        use super::super::*;
        use etherparse::{
            NetHeaders, PacketBuilder, PacketHeaders, TcpOptionElement, TransportHeader, VlanId,
        };
        use proptest::prelude::*;

        #[derive(Debug, Clone)]
        enum L4 {
            Tcp {
                seq: u32,
                win: u16,
                syn: bool,
                ack: Option<u32>,
                fin: bool,
                psh: bool,
                mss: Option<u16>,
            },
            Udp,
            Echo {
                id: u16,
                seq: u16,
            },
        }

        fn l4() -> impl Strategy<Value = L4> {
            prop_oneof![
                (
                    any::<u32>(),
                    any::<u16>(),
                    any::<bool>(),
                    any::<Option<u32>>(),
                    any::<bool>(),
                    any::<bool>(),
                    any::<Option<u16>>()
                )
                    .prop_map(|(seq, win, syn, ack, fin, psh, mss)| L4::Tcp {
                        seq,
                        win,
                        syn,
                        ack,
                        fin,
                        psh,
                        mss
                    }),
                Just(L4::Udp),
                (any::<u16>(), any::<u16>()).prop_map(|(id, seq)| L4::Echo { id, seq }),
            ]
        }

        /// Builds a frame with etherparse (an independent implementation).
        #[allow(clippy::too_many_arguments)]
        fn build(
            macs: ([u8; 6], [u8; 6]),
            vlan: Option<u16>,
            v6: bool,
            addrs: ([u8; 16], [u8; 16]),
            hop: u8,
            ports: (u16, u16),
            l4: &L4,
            payload: &[u8],
        ) -> Vec<u8> {
            let eth = PacketBuilder::ethernet2(macs.0, macs.1);
            let (s4, d4): ([u8; 4], [u8; 4]) = (
                addrs.0[..4].try_into().unwrap(),
                addrs.1[..4].try_into().unwrap(),
            );
            let ip = match (vlan, v6) {
                (None, false) => eth.ipv4(s4, d4, hop),
                (None, true) => eth.ipv6(addrs.0, addrs.1, hop),
                (Some(v), false) => eth
                    .single_vlan(VlanId::try_new(v).unwrap())
                    .ipv4(s4, d4, hop),
                (Some(v), true) => eth
                    .single_vlan(VlanId::try_new(v).unwrap())
                    .ipv6(addrs.0, addrs.1, hop),
            };
            let mut out = Vec::new();
            match *l4 {
                L4::Tcp {
                    seq,
                    win,
                    syn,
                    ack,
                    fin,
                    psh,
                    mss,
                } => {
                    let mut b = ip.tcp(ports.0, ports.1, seq, win);
                    if syn {
                        b = b.syn();
                    }
                    if let Some(a) = ack {
                        b = b.ack(a);
                    }
                    if fin {
                        b = b.fin();
                    }
                    if psh {
                        b = b.psh();
                    }
                    if let Some(m) = mss {
                        b = b
                            .options(&[
                                TcpOptionElement::MaximumSegmentSize(m),
                                TcpOptionElement::Noop,
                                TcpOptionElement::WindowScale(7),
                            ])
                            .unwrap();
                    }
                    b.write(&mut out, payload).unwrap();
                }
                L4::Udp => ip.udp(ports.0, ports.1).write(&mut out, payload).unwrap(),
                L4::Echo { id, seq } if v6 => ip
                    .icmpv6_echo_request(id, seq)
                    .write(&mut out, payload)
                    .unwrap(),
                L4::Echo { id, seq } => ip
                    .icmpv4_echo_request(id, seq)
                    .write(&mut out, payload)
                    .unwrap(),
            }
            out
        }

        fn tcp_flags(t: &etherparse::TcpHeader) -> u8 {
            [t.fin, t.syn, t.rst, t.psh, t.ack, t.urg, t.ece, t.cwr]
                .iter()
                .enumerate()
                .map(|(i, b)| u8::from(*b) << i)
                .sum()
        }

        proptest! {
            /// parse_inner agrees with etherparse on every field both report.
            #[test]
            fn parse_inner_matches_etherparse(
                macs in any::<([u8; 6], [u8; 6])>(),
                vlan in proptest::option::of(0u16..4095),
                v6 in any::<bool>(),
                addrs in any::<([u8; 16], [u8; 16])>(),
                hop in any::<u8>(),
                ports in any::<(u16, u16)>(),
                l4 in l4(),
                payload in proptest::collection::vec(any::<u8>(), 0..200),
                padding in 0usize..20,
            ) {
                let mut frame = build(macs, vlan, v6, addrs, hop, ports, &l4, &payload);
                let ip_len = frame.len();
                frame.resize(ip_len + padding, 0);
                let m = parse_inner(&frame).unwrap();
                super::inner_need(&frame);
                let h = PacketHeaders::from_ethernet_slice(&frame).unwrap();

                prop_assert_eq!(m.dst_mac.0, macs.1);
                prop_assert_eq!(m.src_mac.0, macs.0);
                prop_assert_eq!(m.l3_off, if vlan.is_some() { 18 } else { 14 });
                prop_assert_eq!(m.ip_end, ip_len);
                match h.net.unwrap() {
                    NetHeaders::Ipv4(ip, _) => {
                        prop_assert_eq!(m.l3, L3::Ipv4);
                        prop_assert_eq!(m.src_ip, IpAddr::from(ip.source));
                        prop_assert_eq!(m.dst_ip, IpAddr::from(ip.destination));
                        prop_assert_eq!(m.proto, ip.protocol.0);
                        prop_assert_eq!(m.hop_limit, ip.time_to_live);
                        prop_assert_eq!(m.dont_fragment, ip.dont_fragment);
                        prop_assert_eq!(m.l4_off, m.l3_off + ip.header_len());
                    }
                    NetHeaders::Ipv6(ip, _) => {
                        prop_assert_eq!(m.l3, L3::Ipv6);
                        prop_assert_eq!(m.src_ip, IpAddr::from(ip.source));
                        prop_assert_eq!(m.dst_ip, IpAddr::from(ip.destination));
                        prop_assert_eq!(m.proto, ip.next_header.0);
                        prop_assert_eq!(m.hop_limit, ip.hop_limit);
                        prop_assert_eq!(m.l4_off, m.l3_off + 40);
                    }
                    NetHeaders::Arp(_) => prop_assert!(false, "arp"),
                }
                prop_assert!(!m.fragment);
                // Where etherparse's payload starts is our payload_off.
                let pay = h.payload.slice();
                let pay_off = pay.as_ptr() as usize - frame.as_ptr() as usize;
                prop_assert_eq!(m.payload_off, pay_off);
                match h.transport.unwrap() {
                    TransportHeader::Tcp(t) => {
                        prop_assert_eq!((m.src_port, m.dst_port), (t.source_port, t.destination_port));
                        prop_assert_eq!(m.tcp_flags, tcp_flags(&t));
                    }
                    TransportHeader::Udp(u) => {
                        prop_assert_eq!((m.src_port, m.dst_port), (u.source_port, u.destination_port));
                    }
                    TransportHeader::Icmpv4(i) => {
                        let b = i.to_bytes();
                        prop_assert_eq!((m.icmp_type, m.icmp_code), (b[0], b[1]));
                        prop_assert_eq!(m.src_port, u16::from_be_bytes([b[4], b[5]]));
                    }
                    TransportHeader::Icmpv6(i) => {
                        let b = i.to_bytes();
                        prop_assert_eq!((m.icmp_type, m.icmp_code), (b[0], b[1]));
                        prop_assert_eq!(m.src_port, u16::from_be_bytes([b[4], b[5]]));
                    }
                    other => prop_assert!(false, "unexpected transport {:?}", other),
                }
            }

            /// Arbitrary corruption never panics, and whatever is accepted has
            /// offsets in order and inside the frame.
            #[test]
            fn corrupted_frames_never_panic(
                v6 in any::<bool>(),
                l4 in l4(),
                payload in proptest::collection::vec(any::<u8>(), 0..64),
                flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
                cut in any::<prop::sample::Index>(),
            ) {
                let mut frame = build(([2; 6], [4; 6]), None, v6, ([1; 16], [3; 16]), 64, (1, 2), &l4, &payload);
                for (i, v) in flips {
                    let i = i.index(frame.len());
                    frame[i] = v;
                }
                let n = cut.index(frame.len() + 1);
                frame.truncate(n);
                if let Ok(m) = parse_inner(&frame) {
                    prop_assert!(m.l3_off <= m.l4_off);
                    prop_assert!(m.l4_off <= m.payload_off);
                    prop_assert!(m.payload_off <= m.ip_end);
                    prop_assert!(m.ip_end <= frame.len());
                }
                let need = super::inner_need(&frame);
                // Without IPv6 extension headers the spans read end by 102 bytes: two
                // VLAN tags, an IPv4 header with options, a TCP header.
                let ext = ethernet::skip_vlan_tags(&frame).is_ok_and(|(ety, l3)| {
                    ety == ethertype::IPV6
                        && frame.get(l3 + 6).is_some_and(|&nh| {
                            matches!(
                                nh,
                                protocol::HOP_BY_HOP
                                    | protocol::IPV6_ROUTING
                                    | protocol::IPV6_FRAGMENT
                                    | protocol::IPV6_DEST_OPTS
                            )
                        })
                });
                prop_assert!(ext || need <= 22 + 60 + 20, "needs {}", need);
                // The same bytes behind an underlay header.
                let mut under = super::good_underlay();
                under.truncate(78);
                under.extend_from_slice(&frame);
                let ulen = (under.len() - 54) as u16;
                under[18..20].copy_from_slice(&ulen.to_be_bytes());
                under[58..60].copy_from_slice(&ulen.to_be_bytes());
                if let Ok(m) = parse_underlay(&under) {
                    prop_assert!(m.inner_off + 14 <= m.inner_end && m.inner_end <= under.len());
                }
                super::underlay_need(&under);
            }

            #[test]
            fn parse_underlay_random_bytes_never_panic(
                mut f in proptest::collection::vec(any::<u8>(), 0..200),
                make_plausible in any::<bool>(),
            ) {
                if make_plausible && f.len() >= OUTER_MIN_LEN {
                    // Push random bytes past the early checks to reach the option walk.
                    let n = f.len();
                    f[12..14].copy_from_slice(&[0x86, 0xdd]);
                    f[14] = 0x60;
                    let plen = (n - 54) as u16;
                    f[18..20].copy_from_slice(&plen.to_be_bytes());
                    f[20] = 17;
                    f[56..58].copy_from_slice(&6081u16.to_be_bytes());
                    f[58..60].copy_from_slice(&plen.to_be_bytes());
                    f[62] &= 0x3f;
                    f[63] &= 0x7f;
                    f[64..66].copy_from_slice(&[0x65, 0x58]);
                }
                if let Ok(m) = parse_underlay(&f) {
                    prop_assert!(m.inner_off + 14 <= m.inner_end && m.inner_end <= f.len());
                }
                super::underlay_need(&f);
            }

            /// Geneve-in-IPv6 around a guest TCP frame of up to a jumbo frame's size:
            /// the 3840-byte first piece of the AF_XDP chain decides both parsers, with
            /// the metadata of the copied frame; and any split obeys the contract.
            #[test]
            fn geneve_tcp_parses_from_a_3840_byte_first_piece(
                vlan in proptest::option::of(0u16..4095),
                v6 in any::<bool>(),
                l4 in l4().prop_filter("tcp", |l| matches!(l, L4::Tcp { .. })),
                payload_len in 0usize..8900,
                splits in proptest::collection::vec(any::<prop::sample::Index>(), 8),
            ) {
                let payload = vec![0x5a; payload_len];
                let (macs, addrs) = (([2; 6], [4; 6]), ([1; 16], [3; 16]));
                let inner = build(macs, vlan, v6, addrs, 64, (40000, 5201), &l4, &payload);
                let f = super::underlay_around(&inner);
                let head = &f[..f.len().min(3840)];
                let m = parse_underlay(&f).unwrap();
                prop_assert_eq!(parse_underlay_head(head, f.len()), Some(Ok(m)));
                let im = parse_inner(&inner).unwrap();
                let inner_head = &head[m.inner_off..m.inner_end.min(head.len())];
                let inner_total = m.inner_end - m.inner_off;
                prop_assert_eq!(parse_inner_head(inner_head, inner_total), Some(Ok(im)));
                for i in splits {
                    let h = i.index(f.len() + 1);
                    let u = parse_underlay_head(&f[..h], f.len());
                    prop_assert_eq!(u.is_some(), h >= m.inner_off, "head {}", h);
                    prop_assert!(u.is_none() || u == Some(Ok(m)), "head {}: {:?}", h, u);
                    let h = i.index(inner.len() + 1);
                    let r = parse_inner_head(&inner[..h], inner.len());
                    let need = im.l4_off + crate::tcp::HEADER_LEN;
                    prop_assert_eq!(r.is_some(), h >= need, "inner head {}", h);
                    prop_assert!(r.is_none() || r == Some(Ok(im)), "inner head {}: {:?}", h, r);
                }
            }
        }
    }
}
