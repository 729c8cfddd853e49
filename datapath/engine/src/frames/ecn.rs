//! DSCP and ECN across the tunnel.
//!
//! Encapsulation (RFC 6040 §4.1, normal mode; RFC 2983's uniform model for DSCP):
//! the outer traffic class carries the inner packet's ECN field as it is, so a
//! switch on the underlay can mark congestion on an ECN-capable flow instead of
//! dropping it, and the inner DSCP, so the fabric's QoS classes see the guest's —
//! or one class the sled gives all its tunnel traffic ([`OuterDscp::Fixed`]), for
//! fabrics that must not trust guests' markings.
//!
//! Decapsulation (RFC 6040 §4.2): the outer ECN field is combined into the inner
//! packet's. A CE mark a switch set on the outer header becomes a CE mark the
//! receiving guest's TCP sees (and echoes with ECE); outer ECT(1) over inner ECT(0)
//! becomes ECT(1); everything else leaves the inner packet as it is. Outer CE over
//! a Not-ECT inner packet is the one combination the RFC says to drop: the guest
//! cannot be told of the congestion, and dropping is what a switch would have done
//! to a Not-ECT packet.

use wire::checksum;
use wire::ethernet::ethertype;
use wire::meta::{InnerMeta, L3};

/// ECN codepoints (RFC 3168 §5), the two low bits of the traffic class.
pub const NOT_ECT: u8 = 0b00;
pub const ECT1: u8 = 0b01;
pub const ECT0: u8 = 0b10;
pub const CE: u8 = 0b11;
const ECN_MASK: u8 = 0b11;

/// The outer DSCP of encapsulated frames: the sled's `--outer-dscp`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OuterDscp {
    /// The inner packet's DSCP (RFC 2983 uniform model).
    #[default]
    Copy,
    /// This DSCP (0-63) for every frame, whatever the guest set.
    Fixed(u8),
}

impl OuterDscp {
    /// The largest DSCP: six bits.
    pub const MAX: u8 = 63;

    /// The outer traffic class for an inner packet of traffic class `inner`:
    /// the DSCP as configured, the ECN field copied (normal mode).
    pub fn outer_tclass(self, inner: u8) -> u8 {
        let (keep, set) = self.keep_and_set();
        (inner & keep) | set
    }

    /// [`Self::outer_tclass`] as the bits of the inner class kept and the bits
    /// set: what a flow's outer header template holds.
    pub fn keep_and_set(self) -> (u8, u8) {
        match self {
            OuterDscp::Copy => (u8::MAX, 0),
            OuterDscp::Fixed(d) => (ECN_MASK, d << 2),
        }
    }
}

/// The traffic class (IPv4 TOS, IPv6 traffic class) of the IP packet in Ethernet
/// frame `frame`, or 0 for a frame that is neither (ARP) or too short to tell.
#[inline(always)]
pub fn frame_tclass(frame: &[u8]) -> u8 {
    const V4: [u8; 2] = ethertype::IPV4.to_be_bytes();
    const V6: [u8; 2] = ethertype::IPV6.to_be_bytes();
    match frame.get(12..16) {
        Some(&[a, b, _, tos]) if [a, b] == V4 => tos,
        Some(&[a, b, hi, lo]) if [a, b] == V6 => (hi << 4) | (lo >> 4),
        _ => 0,
    }
}

/// What decapsulation does to the inner packet's ECN field (RFC 6040 §4.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decap {
    /// The inner packet goes on as it is: the common case.
    Keep,
    /// The inner ECN field becomes this codepoint.
    Set(u8),
    /// Outer CE over a Not-ECT inner packet: dropped.
    Drop,
}

/// RFC 6040 §4.2's table for an outer traffic class `outer_tclass` over an inner
/// packet whose ECN field is `inner_ecn`.
#[inline(always)]
pub fn decapsulate(outer_tclass: u8, inner_ecn: u8) -> Decap {
    let outer = outer_tclass & ECN_MASK;
    if outer == inner_ecn {
        // Normal-mode encapsulation copied it: nothing was marked on the way.
        return Decap::Keep;
    }
    match (outer, inner_ecn) {
        (CE, NOT_ECT) => Decap::Drop,
        (CE, _) => Decap::Set(CE),
        (ECT1, ECT0) => Decap::Set(ECT1),
        _ => Decap::Keep,
    }
}

/// [`decapsulate`] for the IP packet `m` describes in `head` (which holds its IP
/// header): an outer Not-ECT field, most traffic's, decides without reading the
/// inner packet.
#[inline(always)]
pub fn decapsulate_packet(outer_tclass: u8, head: &[u8], m: &InnerMeta) -> Decap {
    if outer_tclass & ECN_MASK == NOT_ECT {
        return Decap::Keep;
    }
    decapsulate(outer_tclass, inner_ecn(head, m))
}

/// The ECN field of the IP packet `m` describes in `head` (which holds its IP
/// header, as the parser guarantees).
#[inline(always)]
pub fn inner_ecn(head: &[u8], m: &InnerMeta) -> u8 {
    let b = head.get(m.l3_off + 1).copied().unwrap_or(0);
    match m.l3 {
        L3::Ipv4 => b & ECN_MASK,
        L3::Ipv6 => (b >> 4) & ECN_MASK,
        _ => NOT_ECT,
    }
}

/// Sets the ECN field of the IP packet `m` describes in `frame` (its headers) to
/// `ecn`, updating the IPv4 header checksum (RFC 1624). The transport checksums do
/// not cover the field.
pub fn set_inner_ecn(frame: &mut [u8], m: &InnerMeta, ecn: u8) {
    let l3 = m.l3_off;
    match m.l3 {
        L3::Ipv4 => {
            let Some(h) = frame.get_mut(l3..l3 + 12) else {
                return;
            };
            let old = u16::from_be_bytes([h[0], h[1]]);
            h[1] = (h[1] & !ECN_MASK) | ecn;
            let new = u16::from_be_bytes([h[0], h[1]]);
            let c = checksum::update16(u16::from_be_bytes([h[10], h[11]]), old, new);
            h[10..12].copy_from_slice(&c.to_be_bytes());
        }
        L3::Ipv6 => {
            if let Some(b) = frame.get_mut(l3 + 1) {
                *b = (*b & !(ECN_MASK << 4)) | (ecn << 4);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decapsulation_follows_rfc6040_table() {
        // Rows: inner Not-ECT, ECT(0), ECT(1), CE; columns: outer Not-ECT, ECT(0),
        // ECT(1), CE (RFC 6040 Figure 4), as the inner field that leaves.
        let table = [
            [Some(NOT_ECT), Some(NOT_ECT), Some(NOT_ECT), None],
            [Some(ECT0), Some(ECT0), Some(ECT1), Some(CE)],
            [Some(ECT1), Some(ECT1), Some(ECT1), Some(CE)],
            [Some(CE), Some(CE), Some(CE), Some(CE)],
        ];
        let codes = [NOT_ECT, ECT0, ECT1, CE];
        for (row, inner) in codes.iter().enumerate() {
            for (col, outer) in codes.iter().enumerate() {
                // The DSCP bits of the outer class must not matter.
                let got = match decapsulate((46 << 2) | outer, *inner) {
                    Decap::Keep => Some(*inner),
                    Decap::Set(e) => Some(e),
                    Decap::Drop => None,
                };
                assert_eq!(got, table[row][col], "inner {inner:02b} outer {outer:02b}");
            }
        }
    }

    #[test]
    fn outer_class_copies_or_fixes_dscp_and_always_copies_ecn() {
        let ef_ect0 = (46 << 2) | ECT0;
        assert_eq!(OuterDscp::Copy.outer_tclass(ef_ect0), ef_ect0);
        assert_eq!(OuterDscp::Fixed(10).outer_tclass(ef_ect0), (10 << 2) | ECT0);
        assert_eq!(OuterDscp::Fixed(0).outer_tclass(CE), CE);
    }

    fn eth(ethertype: u16, ip: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&ethertype.to_be_bytes());
        f.extend_from_slice(ip);
        f
    }

    #[test]
    fn frame_tclass_reads_both_families() {
        assert_eq!(frame_tclass(&eth(ethertype::IPV4, &[0x45, 0xb9])), 0xb9);
        // IPv6: version 6, traffic class 0xb9 across the first two bytes.
        assert_eq!(frame_tclass(&eth(ethertype::IPV6, &[0x6b, 0x90])), 0xb9);
        assert_eq!(frame_tclass(&eth(ethertype::ARP, &[0, 0])), 0);
        assert_eq!(frame_tclass(&[0u8; 13]), 0);
    }
}
