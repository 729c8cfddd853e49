//! IPv4 headers (RFC 791), options included in the view but never emitted.

use crate::bytes;
use crate::checksum;
use crate::{Result, WireError};
use core::fmt;
use std::net::Ipv4Addr;

/// IANA IP protocol numbers (also the IPv6 next-header values).
pub mod protocol {
    pub const HOP_BY_HOP: u8 = 0;
    pub const ICMP: u8 = 1;
    pub const TCP: u8 = 6;
    pub const UDP: u8 = 17;
    pub const IPV6_ROUTING: u8 = 43;
    pub const IPV6_FRAGMENT: u8 = 44;
    pub const ICMPV6: u8 = 58;
    pub const IPV6_NO_NEXT: u8 = 59;
    pub const IPV6_DEST_OPTS: u8 = 60;
}

/// Length of a header without options.
pub const HEADER_LEN: usize = 20;

mod field {
    use core::ops::Range;
    pub const VER_IHL: usize = 0;
    pub const DSCP_ECN: usize = 1;
    pub const LENGTH: Range<usize> = 2..4;
    pub const IDENT: Range<usize> = 4..6;
    pub const FLG_OFF: Range<usize> = 6..8;
    pub const TTL: usize = 8;
    pub const PROTOCOL: usize = 9;
    pub const CHECKSUM: Range<usize> = 10..12;
    pub const SRC_ADDR: Range<usize> = 12..16;
    pub const DST_ADDR: Range<usize> = 16..20;
}

const FLAG_DF: u16 = 0x4000;
const FLAG_MF: u16 = 0x2000;
const OFFSET_MASK: u16 = 0x1fff;

/// A view of an IPv4 packet.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps a buffer after checking that the version is 4, that IHL covers at least the
    /// fixed header, and that the header and the total length fit in the buffer (bytes
    /// after the total length, e.g. Ethernet padding, are allowed).
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        if self.version() != 4 {
            return Err(WireError::Malformed("ipv4 version"));
        }
        let hl = self.header_len();
        if hl < HEADER_LEN {
            return Err(WireError::Malformed("ipv4 header length (IHL < 5)"));
        }
        let total = self.total_len() as usize;
        if total < hl {
            return Err(WireError::Malformed(
                "ipv4 total length below header length",
            ));
        }
        if hl > len || total > len {
            return Err(WireError::Truncated);
        }
        Ok(())
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VER_IHL] >> 4
    }

    /// Header length in bytes (IHL * 4).
    pub fn header_len(&self) -> usize {
        ((self.buffer.as_ref()[field::VER_IHL] & 0x0f) as usize) * 4
    }

    pub fn dscp_ecn(&self) -> u8 {
        self.buffer.as_ref()[field::DSCP_ECN]
    }

    pub fn total_len(&self) -> u16 {
        bytes::get_u16(self.buffer.as_ref(), field::LENGTH)
    }

    pub fn ident(&self) -> u16 {
        bytes::get_u16(self.buffer.as_ref(), field::IDENT)
    }

    pub fn dont_frag(&self) -> bool {
        bytes::get_u16(self.buffer.as_ref(), field::FLG_OFF) & FLAG_DF != 0
    }

    pub fn more_frags(&self) -> bool {
        bytes::get_u16(self.buffer.as_ref(), field::FLG_OFF) & FLAG_MF != 0
    }

    /// Fragment offset in bytes.
    pub fn frag_offset(&self) -> u16 {
        (bytes::get_u16(self.buffer.as_ref(), field::FLG_OFF) & OFFSET_MASK) << 3
    }

    /// True for any fragment (first, middle or last).
    pub fn is_fragment(&self) -> bool {
        bytes::get_u16(self.buffer.as_ref(), field::FLG_OFF) & (FLAG_MF | OFFSET_MASK) != 0
    }

    pub fn ttl(&self) -> u8 {
        self.buffer.as_ref()[field::TTL]
    }

    pub fn protocol(&self) -> u8 {
        self.buffer.as_ref()[field::PROTOCOL]
    }

    pub fn checksum(&self) -> u16 {
        bytes::get_u16(self.buffer.as_ref(), field::CHECKSUM)
    }

    pub fn src_addr(&self) -> Ipv4Addr {
        let b = &self.buffer.as_ref()[field::SRC_ADDR];
        Ipv4Addr::new(b[0], b[1], b[2], b[3])
    }

    pub fn dst_addr(&self) -> Ipv4Addr {
        let b = &self.buffer.as_ref()[field::DST_ADDR];
        Ipv4Addr::new(b[0], b[1], b[2], b[3])
    }

    /// The options bytes between the fixed header and `header_len`.
    pub fn options(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..self.header_len()]
    }

    /// True when the header (with options) sums to zero.
    pub fn verify_checksum(&self) -> bool {
        checksum::fold(checksum::sum(&self.buffer.as_ref()[..self.header_len()], 0)) == 0xffff
    }

    /// The payload up to the total length (Ethernet padding excluded).
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..self.total_len() as usize]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_version_and_header_len(&mut self, header_len: usize) {
        self.buffer.as_mut()[field::VER_IHL] = 0x40 | ((header_len / 4) as u8 & 0x0f);
    }

    pub fn set_dscp_ecn(&mut self, v: u8) {
        self.buffer.as_mut()[field::DSCP_ECN] = v;
    }

    pub fn set_total_len(&mut self, v: u16) {
        bytes::set_u16(self.buffer.as_mut(), field::LENGTH, v);
    }

    pub fn set_ident(&mut self, v: u16) {
        bytes::set_u16(self.buffer.as_mut(), field::IDENT, v);
    }

    /// Sets DF/MF and the fragment offset (in bytes; must be a multiple of 8).
    pub fn set_frag(&mut self, dont_frag: bool, more_frags: bool, offset: u16) {
        let mut v = (offset >> 3) & OFFSET_MASK;
        if dont_frag {
            v |= FLAG_DF;
        }
        if more_frags {
            v |= FLAG_MF;
        }
        bytes::set_u16(self.buffer.as_mut(), field::FLG_OFF, v);
    }

    pub fn set_ttl(&mut self, v: u8) {
        self.buffer.as_mut()[field::TTL] = v;
    }

    pub fn set_protocol(&mut self, v: u8) {
        self.buffer.as_mut()[field::PROTOCOL] = v;
    }

    pub fn set_checksum(&mut self, v: u16) {
        bytes::set_u16(self.buffer.as_mut(), field::CHECKSUM, v);
    }

    pub fn set_src_addr(&mut self, a: Ipv4Addr) {
        self.buffer.as_mut()[field::SRC_ADDR].copy_from_slice(&a.octets());
    }

    pub fn set_dst_addr(&mut self, a: Ipv4Addr) {
        self.buffer.as_mut()[field::DST_ADDR].copy_from_slice(&a.octets());
    }

    /// Recomputes the header checksum over the header with options.
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let c = checksum::checksum(&self.buffer.as_ref()[..self.header_len()]);
        self.set_checksum(c);
    }

    /// Rewrites the total length and patches the header checksum incrementally
    /// (RFC 1624), as segmentation does for every segment.
    pub fn update_total_len(&mut self, v: u16) {
        let old = self.total_len();
        let c = checksum::update16(self.checksum(), old, v);
        self.set_total_len(v);
        self.set_checksum(c);
    }

    pub fn payload_mut(&mut self) -> &mut [u8] {
        let (s, e) = (self.header_len(), self.total_len() as usize);
        &mut self.buffer.as_mut()[s..e]
    }
}

/// A 20-byte IPv4 header (no options).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Repr {
    pub src_addr: Ipv4Addr,
    pub dst_addr: Ipv4Addr,
    pub protocol: u8,
    pub payload_len: usize,
    pub ttl: u8,
    pub dscp_ecn: u8,
    pub ident: u16,
    pub dont_frag: bool,
    pub more_frags: bool,
    /// Fragment offset in bytes.
    pub frag_offset: u16,
}

impl Repr {
    /// Reads a header whose checksum is valid. Options are skipped (not kept), so
    /// `emit` of the result writes an option-less header.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Repr> {
        p.check_len()?;
        if !p.verify_checksum() {
            return Err(WireError::Malformed("ipv4 header checksum"));
        }
        Ok(Repr {
            src_addr: p.src_addr(),
            dst_addr: p.dst_addr(),
            protocol: p.protocol(),
            payload_len: p.total_len() as usize - p.header_len(),
            ttl: p.ttl(),
            dscp_ecn: p.dscp_ecn(),
            ident: p.ident(),
            dont_frag: p.dont_frag(),
            more_frags: p.more_frags(),
            frag_offset: p.frag_offset(),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header with its checksum. The buffer must hold [`HEADER_LEN`] bytes;
    /// a payload length that does not fit the 16-bit total length is refused.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) -> Result<()> {
        let total = u16::try_from(HEADER_LEN + self.payload_len)
            .map_err(|_| WireError::Malformed("ipv4 payload length over 65515"))?;
        if p.buffer.as_ref().len() < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        p.set_version_and_header_len(HEADER_LEN);
        p.set_dscp_ecn(self.dscp_ecn);
        p.set_total_len(total);
        p.set_ident(self.ident);
        p.set_frag(self.dont_frag, self.more_frags, self.frag_offset);
        p.set_ttl(self.ttl);
        p.set_protocol(self.protocol);
        p.set_src_addr(self.src_addr);
        p.set_dst_addr(self.dst_addr);
        p.fill_checksum();
        Ok(())
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "IPv4 src={} dst={} proto={} len={} ttl={}",
            self.src_addr, self.dst_addr, self.protocol, self.payload_len, self.ttl
        )?;
        if self.dont_frag {
            write!(f, " DF")?;
        }
        if self.more_frags || self.frag_offset != 0 {
            write!(f, " frag(off={} mf={})", self.frag_offset, self.more_frags)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // 192.168.0.1 -> 192.168.0.199 UDP, DF, TTL 64, total length 0x73 (a classic
    // example header with checksum 0xb861), followed here by 4 payload bytes.
    static HEADER_BYTES: [u8; 20] = [
        0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8, 0x00,
        0x01, 0xc0, 0xa8, 0x00, 0xc7,
    ];

    fn packet() -> Vec<u8> {
        let mut v = HEADER_BYTES.to_vec();
        v.resize(0x73, 0xaa);
        v
    }

    #[test]
    fn deconstruct() {
        let buf = packet();
        let p = Packet::new_checked(&buf[..]).unwrap();
        assert_eq!(p.version(), 4);
        assert_eq!(p.header_len(), 20);
        assert_eq!(p.total_len(), 0x73);
        assert!(p.dont_frag());
        assert!(!p.more_frags());
        assert!(!p.is_fragment());
        assert_eq!(p.ttl(), 64);
        assert_eq!(p.protocol(), protocol::UDP);
        assert_eq!(p.checksum(), 0xb861);
        assert!(p.verify_checksum());
        assert_eq!(p.src_addr(), Ipv4Addr::new(192, 168, 0, 1));
        assert_eq!(p.dst_addr(), Ipv4Addr::new(192, 168, 0, 199));
        assert_eq!(p.payload().len(), 0x73 - 20);
    }

    #[test]
    fn parse_emit_round_trip() {
        let buf = packet();
        let repr = Repr::parse(&Packet::new_checked(&buf[..]).unwrap()).unwrap();
        let mut out = vec![0u8; 20];
        repr.emit(&mut Packet::new_unchecked(&mut out[..])).unwrap();
        assert_eq!(out, HEADER_BYTES);
        assert_eq!(
            repr.to_string(),
            "IPv4 src=192.168.0.1 dst=192.168.0.199 proto=17 len=95 ttl=64 DF"
        );
    }

    #[test]
    fn options_and_fragments() {
        // IHL 6 with one 4-byte option (NOP x3, EOL), MF set, offset 1480 bytes.
        let mut h = vec![
            0x46, 0x00, 0x00, 0x1c, 0x12, 0x34, 0x20, 0xb9, 0x40, 0x06, 0x00, 0x00, 10, 0, 0, 1,
            10, 0, 0, 2, 1, 1, 1, 0,
        ];
        h.extend_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
        let mut p = Packet::new_checked(&mut h[..]).unwrap();
        p.fill_checksum();
        assert!(p.verify_checksum());
        assert_eq!(p.header_len(), 24);
        assert_eq!(p.options(), &[1, 1, 1, 0]);
        assert!(p.more_frags() && p.is_fragment());
        assert_eq!(p.frag_offset(), 1480);
        assert_eq!(p.payload(), &[0xde, 0xad, 0xbe, 0xef]);
        let r = Repr::parse(&p).unwrap();
        assert_eq!(
            (r.payload_len, r.frag_offset, r.more_frags),
            (4, 1480, true)
        );
    }

    #[test]
    fn checks() {
        let buf = packet();
        assert_eq!(
            Packet::new_checked(&buf[..19]).unwrap_err(),
            WireError::Truncated
        );
        // Total length beyond the buffer.
        assert_eq!(
            Packet::new_checked(&buf[..0x72]).unwrap_err(),
            WireError::Truncated
        );
        let mut bad = buf.clone();
        bad[0] = 0x65;
        assert_eq!(
            Packet::new_checked(&bad[..]).unwrap_err(),
            WireError::Malformed("ipv4 version")
        );
        let mut bad = buf.clone();
        bad[0] = 0x44;
        assert!(matches!(
            Packet::new_checked(&bad[..]),
            Err(WireError::Malformed(_))
        ));
        let mut bad = buf.clone();
        bad[2..4].copy_from_slice(&19u16.to_be_bytes());
        assert!(matches!(
            Packet::new_checked(&bad[..]),
            Err(WireError::Malformed(_))
        ));
        let mut bad = buf.clone();
        bad[11] ^= 1;
        assert_eq!(
            Repr::parse(&Packet::new_checked(&bad[..]).unwrap()).unwrap_err(),
            WireError::Malformed("ipv4 header checksum")
        );
    }

    #[test]
    fn incremental_total_len_matches_full_recompute() {
        let mut buf = packet();
        let mut p = Packet::new_checked(&mut buf[..]).unwrap();
        p.update_total_len(0x40);
        let inc = p.checksum();
        p.fill_checksum();
        assert_eq!(inc, p.checksum());
    }
}
