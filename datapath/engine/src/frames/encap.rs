//! Geneve encapsulation: the prebuilt outer headers of one flow, written in front of a
//! guest frame.
//!
//! Outer stack (opte-facts "Geneve on the underlay"): Ethernet / IPv6 (traffic class
//! from the inner packet's, `frames::ecn`; hop limit 128, next header UDP) / UDP
//! (destination 6081) / Geneve (version 0, protocol 0x6558, 24-bit VNI) / Oxide
//! options. Everything that does not depend on the inner frame is built once per flow
//! ([`OuterTemplate::new`]); per packet only the traffic class, the three length
//! fields, the option length and the optional Mss option are patched, so
//! encapsulating costs one 70-82-byte copy plus the inner frame's copy.

use crate::frames::ecn::{frame_tclass, OuterDscp};
use crate::frames::output::{TxBatch, TxDest};
use crate::ids::Vni;
use std::net::Ipv6Addr;
use wire::checksum;
use wire::ethernet::ethertype;
use wire::geneve::{self, OxideOption, ENCAP_LEN, GENEVE_PORT};
use wire::MacAddr;

/// Outer IPv6 hop limit (opte-facts).
pub const OUTER_HOP_LIMIT: u8 = 128;

const ETH_LEN: usize = 14;
const IPV6_LEN: usize = 40;
const UDP_LEN: usize = 8;
const GENEVE_LEN: usize = 8;
/// Option header (class, type, length) with no body: the External option.
const EXTERNAL_OPT_LEN: usize = OxideOption::External.buffer_len();
/// Option header plus the 4-byte big-endian MSS.
const MSS_OPT_LEN: usize = OxideOption::Mss(0).buffer_len();

/// Offsets of the fields patched per packet, from the start of the outer frame.
mod field {
    use core::ops::Range;
    pub const ETH_TYPE: Range<usize> = 12..14;
    pub const IPV6: usize = super::ETH_LEN;
    pub const IPV6_PAYLOAD_LEN: Range<usize> = IPV6 + 4..IPV6 + 6;
    pub const IPV6_SRC: Range<usize> = IPV6 + 8..IPV6 + 24;
    pub const IPV6_DST: Range<usize> = IPV6 + 24..IPV6 + 40;
    pub const UDP: usize = IPV6 + super::IPV6_LEN;
    pub const UDP_LEN: Range<usize> = UDP + 4..UDP + 6;
    pub const UDP_CHECKSUM: Range<usize> = UDP + 6..UDP + 8;
    pub const GENEVE: usize = UDP + super::UDP_LEN;
    pub const GENEVE_OPTS: usize = GENEVE + super::GENEVE_LEN;
}

/// The outer headers of one flow, built once and stamped in front of each inner frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OuterTemplate {
    /// Ethernet + IPv6 + UDP + Geneve base header + the External option if present;
    /// length fields zero until patched.
    bytes: [u8; ENCAP_LEN + EXTERNAL_OPT_LEN],
    /// Bytes of `bytes` in use (70, or 74 with the External option).
    base_len: usize,
    /// Whether to compute the outer UDP checksum. Off by default: RFC 6935/6936 allow
    /// a zero checksum for tunnels over IPv6, and the inner checksums protect the data.
    udp_checksum: bool,
    /// The outer traffic class is the inner one's bits `tclass_keep` with
    /// `tclass_set` added ([`OuterDscp::keep_and_set`]): no branch per packet.
    tclass_keep: u8,
    tclass_set: u8,
}

impl OuterTemplate {
    /// Builds the template. `flow_label` is truncated to its 20 bits; `udp_src_port` and
    /// `flow_label` should come from a hash of the inner flow so ECMP spreads flows.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        src_mac: MacAddr,
        dst_mac: MacAddr,
        src: Ipv6Addr,
        dst: Ipv6Addr,
        udp_src_port: u16,
        flow_label: u32,
        vni: Vni,
        external: bool,
        udp_checksum: bool,
    ) -> OuterTemplate {
        let mut b = [0u8; ENCAP_LEN + EXTERNAL_OPT_LEN];
        b[0..6].copy_from_slice(dst_mac.as_bytes());
        b[6..12].copy_from_slice(src_mac.as_bytes());
        b[field::ETH_TYPE].copy_from_slice(&ethertype::IPV6.to_be_bytes());
        let fl = flow_label & 0x000f_ffff;
        // Version 6, traffic class 0 (set per packet), 20-bit flow label.
        let vtcfl: u32 = (6 << 28) | fl;
        b[field::IPV6..field::IPV6 + 4].copy_from_slice(&vtcfl.to_be_bytes());
        b[field::IPV6 + 6] = 17; // next header: UDP
        b[field::IPV6 + 7] = OUTER_HOP_LIMIT;
        b[field::IPV6_SRC].copy_from_slice(&src.octets());
        b[field::IPV6_DST].copy_from_slice(&dst.octets());
        b[field::UDP..field::UDP + 2].copy_from_slice(&udp_src_port.to_be_bytes());
        b[field::UDP + 2..field::UDP + 4].copy_from_slice(&GENEVE_PORT.to_be_bytes());
        let mut base_len = ENCAP_LEN;
        let mut g = geneve::Packet::new_unchecked(&mut b[field::GENEVE..]);
        g.set_version0_and_options_len(0);
        g.set_flags(false, false); // our options are all non-critical
        g.set_protocol_type(ethertype::TRANSPARENT_ETHERNET);
        g.set_vni(vni.get());
        if external {
            // Cannot fail: the array has room for the option.
            base_len += OxideOption::External
                .emit(&mut b[field::GENEVE_OPTS..])
                .unwrap_or(0);
        }
        OuterTemplate {
            bytes: b,
            base_len,
            udp_checksum,
            tclass_keep: u8::MAX,
            tclass_set: 0,
        }
    }

    /// The template with its outer DSCP taken as `dscp` says (the default copies
    /// the inner packet's).
    pub fn with_dscp(mut self, dscp: OuterDscp) -> OuterTemplate {
        (self.tclass_keep, self.tclass_set) = dscp.keep_and_set();
        self
    }

    /// Bytes of outer header in front of the inner frame: 70, +4 with the External
    /// option, +8 with the Mss option.
    pub fn header_len(&self, with_mss: bool) -> usize {
        self.base_len + if with_mss { MSS_OPT_LEN } else { 0 }
    }

    /// Largest inner frame that fits the 16-bit IPv6 payload length with this header.
    pub fn max_inner_len(&self, with_mss: bool) -> usize {
        usize::from(u16::MAX) - (self.header_len(with_mss) - ETH_LEN - IPV6_LEN)
    }

    /// Writes the outer header into `buf[..header_len]`, where `buf[header_len..]`
    /// already holds the inner frame of `inner_len` bytes (needed only for the optional
    /// UDP checksum, which is why this is called after the inner frame is in place).
    ///
    /// The caller sizes `buf` from [`Self::header_len`] and keeps `inner_len` within
    /// [`Self::max_inner_len`]; a buffer too short for the header is left untouched
    /// (a caller bug, caught by the debug assertion, never a panic in release).
    pub fn write_header(&self, buf: &mut [u8], inner_len: usize, mss_option: Option<u32>) {
        let hlen = self.header_len(mss_option.is_some());
        debug_assert!(
            buf.len() >= hlen + inner_len,
            "buffer shorter than the frame"
        );
        debug_assert!(inner_len <= self.max_inner_len(mss_option.is_some()));
        let Some((h, inner)) = buf.split_at_mut_checked(hlen) else {
            return;
        };
        let udp_len = self.write_fields(h, frame_tclass(inner), inner_len, mss_option);
        if self.udp_checksum {
            let Some(datagram) = buf.get(field::UDP..hlen + inner_len) else {
                return;
            };
            let mut c = !checksum::fold(checksum::sum(datagram, self.pseudo_header(udp_len)));
            if c == 0 {
                // A computed zero is sent as all ones (RFC 8200 §8.1): zero means "none".
                c = 0xffff;
            }
            buf[field::UDP_CHECKSUM].copy_from_slice(&c.to_be_bytes());
        }
    }

    /// Whether frames of this flow carry an outer UDP checksum.
    pub fn udp_checksum(&self) -> bool {
        self.udp_checksum
    }

    /// Writes the outer header of a UDP-tunnel GSO super-frame into `h` (exactly
    /// [`Self::header_len`] bytes) for inner frame `inner`. With
    /// [`Self::udp_checksum`] the UDP checksum field holds the IPv6 pseudo-header
    /// seed, folded and not complemented, which the kernel's
    /// `__skb_udp_tunnel_segment` completes per segment (`F_UDP_TUNNEL_CSUM`);
    /// otherwise it is zero and copied into every segment as it is.
    pub fn write_gso_header(&self, h: &mut [u8], inner: &[u8], mss_option: Option<u32>) {
        debug_assert_eq!(h.len(), self.header_len(mss_option.is_some()));
        debug_assert!(inner.len() <= self.max_inner_len(mss_option.is_some()));
        let udp_len = self.write_fields(h, frame_tclass(inner), inner.len(), mss_option);
        if self.udp_checksum {
            let seed = checksum::fold(self.pseudo_header(udp_len));
            h[field::UDP_CHECKSUM].copy_from_slice(&seed.to_be_bytes());
        }
    }

    /// Copies the template into `h` (the whole outer header) and fills in the
    /// traffic class (for an inner packet of class `inner_tclass`), option and
    /// length fields; returns the UDP length. Inlined: as a call it cost every
    /// encapsulated frame 16 instructions.
    #[inline(always)]
    fn write_fields(
        &self,
        h: &mut [u8],
        inner_tclass: u8,
        inner_len: usize,
        mss_option: Option<u32>,
    ) -> u16 {
        let hlen = h.len();
        h[..self.base_len].copy_from_slice(&self.bytes[..self.base_len]);
        // The traffic class straddles the first two bytes; the template's are
        // version 6 with class 0 and the flow label's top nibble.
        let tc = (inner_tclass & self.tclass_keep) | self.tclass_set;
        h[field::IPV6] |= tc >> 4;
        h[field::IPV6 + 1] |= tc << 4;
        if let Some(mss) = mss_option {
            // `h` is exactly long enough for the option, so this cannot fail.
            let _ = OxideOption::Mss(mss).emit(&mut h[self.base_len..]);
        }
        geneve::Packet::new_unchecked(&mut h[field::GENEVE..])
            .set_version0_and_options_len(hlen - ENCAP_LEN);
        let udp_len = (hlen - field::UDP + inner_len) as u16;
        h[field::IPV6_PAYLOAD_LEN].copy_from_slice(&udp_len.to_be_bytes());
        h[field::UDP_LEN].copy_from_slice(&udp_len.to_be_bytes());
        udp_len
    }

    /// The unfolded IPv6 pseudo-header sum of a UDP datagram of `udp_len` bytes.
    fn pseudo_header(&self, udp_len: u16) -> u64 {
        let src = Ipv6Addr::from(octets16(&self.bytes[field::IPV6_SRC]));
        let dst = Ipv6Addr::from(octets16(&self.bytes[field::IPV6_DST]));
        checksum::pseudo_header_v6(src, dst, 17, u32::from(udp_len))
    }

    /// Appends one encapsulated frame holding `inner` to `out` and returns its length,
    /// or returns 0 and appends nothing when `inner` is longer than the IPv6 payload
    /// length can describe ([`Self::max_inner_len`]); the caller counts that drop.
    pub fn encapsulate(
        &self,
        inner: &[u8],
        mss_option: Option<u32>,
        dest: TxDest,
        out: &mut TxBatch,
    ) -> usize {
        if inner.len() > self.max_inner_len(mss_option.is_some()) {
            return 0;
        }
        let hlen = self.header_len(mss_option.is_some());
        let total = hlen + inner.len();
        let buf = out.push_unzeroed(dest, total);
        buf[hlen..total].copy_from_slice(inner);
        self.write_header(&mut buf[..total], inner.len(), mss_option);
        total
    }
}

fn octets16(b: &[u8]) -> [u8; 16] {
    let mut o = [0u8; 16];
    o.copy_from_slice(&b[..16]);
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(external: bool, udp_checksum: bool) -> OuterTemplate {
        OuterTemplate::new(
            "02:00:00:00:00:01".parse().unwrap(),
            "02:00:00:00:00:02".parse().unwrap(),
            "fd00::1".parse().unwrap(),
            "fd00::2".parse().unwrap(),
            0xabcd,
            0x123456, // 21 bits: the top bit must be dropped
            Vni::new(0x0a0b0c).unwrap(),
            external,
            udp_checksum,
        )
    }

    #[test]
    fn byte_exact_with_mss() {
        let t = template(false, false);
        let inner = [0xeeu8; 10];
        let mut out = TxBatch::new();
        let d = TxDest::Underlay { ifindex: 2 };
        assert_eq!(t.encapsulate(&inner, Some(8448), d, &mut out), 88);
        let (dest, f) = out.frame(0).unwrap();
        assert_eq!(dest, d);
        #[rustfmt::skip]
        let expect: [u8; 78] = [
            // Ethernet
            2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x86, 0xdd,
            // IPv6: version 6, tc 0, flow label 0x23456, payload 34, UDP, hop limit 128
            0x60, 0x02, 0x34, 0x56, 0, 34, 17, 128,
            0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1,
            0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2,
            // UDP: 0xabcd -> 6081, length 34, checksum 0
            0xab, 0xcd, 0x17, 0xc1, 0, 34, 0, 0,
            // Geneve: opt_len 2 words, protocol 0x6558, VNI 0x0a0b0c
            0x02, 0x00, 0x65, 0x58, 0x0a, 0x0b, 0x0c, 0x00,
            // Oxide Mss option: class 0x0129, type 2, 1 word, 8448
            0x01, 0x29, 0x02, 0x01, 0, 0, 0x21, 0x00,
        ];
        assert_eq!(&f[..78], &expect);
        assert_eq!(&f[78..], &inner);
    }

    #[test]
    fn plain_and_external_lengths() {
        let t = template(false, false);
        assert_eq!(t.header_len(false), ENCAP_LEN);
        assert_eq!(t.header_len(true), geneve::ENCAP_LEN_WITH_MSS);
        let mut out = TxBatch::new();
        let d = TxDest::Underlay { ifindex: 2 };
        assert_eq!(t.encapsulate(&[1, 2, 3, 4], None, d, &mut out), 74);
        let f = out.frame(0).unwrap().1;
        assert_eq!(f[field::GENEVE], 0);
        assert_eq!(&f[field::UDP_LEN], &[0, 20]);

        let e = template(true, false);
        assert_eq!(e.header_len(true), 82);
        e.encapsulate(&[9; 6], Some(1), d, &mut out);
        let f = out.frame(1).unwrap().1;
        // External (no body) then Mss: 3 words of options.
        assert_eq!(f[field::GENEVE], 3);
        assert_eq!(&f[70..74], &[0x01, 0x29, 0x00, 0x00]);
        assert_eq!(&f[74..82], &[0x01, 0x29, 0x02, 0x01, 0, 0, 0, 1]);
        assert_eq!(&f[field::IPV6_PAYLOAD_LEN], &[0, 8 + 8 + 12 + 6]);
    }

    #[test]
    fn udp_checksum_verifies_independently() {
        let t = template(false, true);
        let inner: Vec<u8> = (0..301u16).map(|i| (i * 7) as u8).collect();
        let mut out = TxBatch::new();
        t.encapsulate(
            &inner,
            Some(1448),
            TxDest::Underlay { ifindex: 1 },
            &mut out,
        );
        let f = out.frame(0).unwrap().1;
        let (ip, _) = etherparse::Ipv6HeaderSlice::from_slice(&f[14..])
            .map(|h| (h.to_header(), ()))
            .unwrap();
        let udp = etherparse::UdpHeaderSlice::from_slice(&f[54..]).unwrap();
        let want = udp.to_header().calc_checksum_ipv6(&ip, &f[62..]).unwrap();
        assert_eq!(udp.checksum(), want);
        assert_ne!(udp.checksum(), 0);
    }

    #[test]
    fn refuses_inner_beyond_ipv6_payload_length() {
        let t = template(false, false);
        let mut out = TxBatch::new();
        let d = TxDest::Underlay { ifindex: 1 };
        let max = t.max_inner_len(true);
        assert_eq!(t.encapsulate(&vec![0; max + 1], Some(1), d, &mut out), 0);
        assert!(out.is_empty());
        assert_eq!(t.encapsulate(&vec![0; max], Some(1), d, &mut out), max + 78);
        assert_eq!(
            &out.frame(0).unwrap().1[field::IPV6_PAYLOAD_LEN],
            &[0xff, 0xff]
        );
    }
}
