//! UDP headers (RFC 768), with the IPv4/IPv6 pseudo-header checksums.

use crate::bytes;
use crate::checksum;
use crate::ipv4::protocol;
use crate::{Result, WireError};
use core::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

pub const HEADER_LEN: usize = 8;

mod field {
    use core::ops::Range;
    pub const SRC_PORT: Range<usize> = 0..2;
    pub const DST_PORT: Range<usize> = 2..4;
    pub const LENGTH: Range<usize> = 4..6;
    pub const CHECKSUM: Range<usize> = 6..8;
}

/// A view of a UDP datagram.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps a buffer after checking that the length field covers the header and fits
    /// in the buffer.
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
        let l = self.len() as usize;
        if l < HEADER_LEN {
            return Err(WireError::Malformed("udp length below 8"));
        }
        if l > len {
            return Err(WireError::Truncated);
        }
        Ok(())
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    pub fn src_port(&self) -> u16 {
        bytes::get_u16(self.buffer.as_ref(), field::SRC_PORT)
    }

    pub fn dst_port(&self) -> u16 {
        bytes::get_u16(self.buffer.as_ref(), field::DST_PORT)
    }

    /// The length field (header + payload).
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> u16 {
        bytes::get_u16(self.buffer.as_ref(), field::LENGTH)
    }

    pub fn checksum(&self) -> u16 {
        bytes::get_u16(self.buffer.as_ref(), field::CHECKSUM)
    }

    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..self.len() as usize]
    }

    fn datagram(&self) -> &[u8] {
        &self.buffer.as_ref()[..self.len() as usize]
    }

    /// True if the checksum is valid or absent (zero means "not computed" over IPv4).
    pub fn verify_checksum_v4(&self, src: Ipv4Addr, dst: Ipv4Addr) -> bool {
        if self.checksum() == 0 {
            return true;
        }
        let acc = checksum::pseudo_header_v4(src, dst, protocol::UDP, u32::from(self.len()));
        checksum::fold(checksum::sum(self.datagram(), acc)) == 0xffff
    }

    /// True if the checksum is valid. Over IPv6 a zero checksum is only allowed for
    /// tunnels (RFC 6935), so it is reported as invalid here and the tunnel receive path
    /// does not call this.
    pub fn verify_checksum_v6(&self, src: Ipv6Addr, dst: Ipv6Addr) -> bool {
        if self.checksum() == 0 {
            return false;
        }
        let acc = checksum::pseudo_header_v6(src, dst, protocol::UDP, u32::from(self.len()));
        checksum::fold(checksum::sum(self.datagram(), acc)) == 0xffff
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_src_port(&mut self, v: u16) {
        bytes::set_u16(self.buffer.as_mut(), field::SRC_PORT, v);
    }

    pub fn set_dst_port(&mut self, v: u16) {
        bytes::set_u16(self.buffer.as_mut(), field::DST_PORT, v);
    }

    pub fn set_len(&mut self, v: u16) {
        bytes::set_u16(self.buffer.as_mut(), field::LENGTH, v);
    }

    pub fn set_checksum(&mut self, v: u16) {
        bytes::set_u16(self.buffer.as_mut(), field::CHECKSUM, v);
    }

    /// Computes the checksum over the pseudo-header and the datagram (up to the length
    /// field). A computed zero is sent as 0xffff (RFC 768) so it is not read as "none".
    fn fill_checksum_with(&mut self, pseudo: u64) {
        self.set_checksum(0);
        let c = !checksum::fold(checksum::sum(self.datagram(), pseudo));
        self.set_checksum(if c == 0 { 0xffff } else { c });
    }

    pub fn fill_checksum_v4(&mut self, src: Ipv4Addr, dst: Ipv4Addr) {
        let len = u32::from(self.len());
        self.fill_checksum_with(checksum::pseudo_header_v4(src, dst, protocol::UDP, len));
    }

    pub fn fill_checksum_v6(&mut self, src: Ipv6Addr, dst: Ipv6Addr) {
        let len = u32::from(self.len());
        self.fill_checksum_with(checksum::pseudo_header_v6(src, dst, protocol::UDP, len));
    }

    pub fn payload_mut(&mut self) -> &mut [u8] {
        let end = self.len() as usize;
        &mut self.buffer.as_mut()[HEADER_LEN..end]
    }
}

/// A UDP header; the checksum is filled separately because it needs the IP addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Repr {
    pub src_port: u16,
    pub dst_port: u16,
    pub payload_len: usize,
}

impl Repr {
    /// Reads the header; checksums are verified by the caller, which knows the
    /// addresses and whether a zero checksum is acceptable.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Repr> {
        p.check_len()?;
        Ok(Repr {
            src_port: p.src_port(),
            dst_port: p.dst_port(),
            payload_len: p.len() as usize - HEADER_LEN,
        })
    }

    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes ports and length with a zero checksum (call `fill_checksum_*` after the
    /// payload is in place, or leave it zero for a tunnel over IPv6).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) -> Result<()> {
        let len = u16::try_from(HEADER_LEN + self.payload_len)
            .map_err(|_| WireError::Malformed("udp payload length over 65527"))?;
        if p.buffer.as_ref().len() < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        p.set_src_port(self.src_port);
        p.set_dst_port(self.dst_port);
        p.set_len(len);
        p.set_checksum(0);
        Ok(())
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "UDP src={} dst={} len={}",
            self.src_port, self.dst_port, self.payload_len
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // 10.0.0.1:53 -> 10.0.0.2:4660, payload "hi!", checksum computed by hand:
    // pseudo 0a00+0001+0a00+0002+0011+000b = 0x141f; udp 0035+1234+000b+6869+2100 =
    // 0x9bdd; total 0xaffc, complement 0x5003 (scapy agrees).
    static PACKET_BYTES: [u8; 11] = [
        0x00, 0x35, 0x12, 0x34, 0x00, 0x0b, 0x50, 0x03, b'h', b'i', b'!',
    ];
    const SRC: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
    const DST: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

    #[test]
    fn deconstruct() {
        let p = Packet::new_checked(&PACKET_BYTES[..]).unwrap();
        assert_eq!(p.src_port(), 53);
        assert_eq!(p.dst_port(), 0x1234);
        assert_eq!(p.len(), 11);
        assert_eq!(p.payload(), b"hi!");
        assert!(p.verify_checksum_v4(SRC, DST));
        assert!(!p.verify_checksum_v4(DST, Ipv4Addr::new(10, 0, 0, 3)));
    }

    #[test]
    fn construct_and_round_trip() {
        let repr = Repr::parse(&Packet::new_checked(&PACKET_BYTES[..]).unwrap()).unwrap();
        assert_eq!(repr.payload_len, 3);
        let mut buf = [0u8; 11];
        buf[8..].copy_from_slice(b"hi!");
        let mut p = Packet::new_unchecked(&mut buf[..]);
        repr.emit(&mut p).unwrap();
        assert_eq!(p.checksum(), 0);
        p.fill_checksum_v4(SRC, DST);
        assert_eq!(buf, PACKET_BYTES);
        assert_eq!(repr.to_string(), "UDP src=53 dst=4660 len=3");
    }

    #[test]
    fn v6_checksum_fill_and_verify() {
        let (s, d): (Ipv6Addr, Ipv6Addr) = ("fd00::1".parse().unwrap(), "fd00::2".parse().unwrap());
        let mut buf = PACKET_BYTES;
        let mut p = Packet::new_checked(&mut buf[..]).unwrap();
        p.fill_checksum_v6(s, d);
        assert!(p.verify_checksum_v6(s, d));
        p.set_checksum(0);
        assert!(!p.verify_checksum_v6(s, d));
    }

    #[test]
    fn checks() {
        assert_eq!(
            Packet::new_checked(&PACKET_BYTES[..7]).unwrap_err(),
            WireError::Truncated
        );
        assert_eq!(
            Packet::new_checked(&PACKET_BYTES[..10]).unwrap_err(),
            WireError::Truncated
        );
        let mut bad = PACKET_BYTES;
        bad[5] = 7;
        assert_eq!(
            Packet::new_checked(&bad[..]).unwrap_err(),
            WireError::Malformed("udp length below 8")
        );
    }
}
