//! ICMPv6 (RFC 4443): echo and Packet Too Big, plus the checksum over the IPv6
//! pseudo-header that every ICMPv6 message (NDP included, see `ndp`) carries.

use crate::bytes;
use crate::checksum;
use crate::{Result, WireError};
use core::fmt;
use std::net::Ipv6Addr;

/// Length of the fixed ICMPv6 header (type, code, checksum, 4 message-specific bytes).
pub const HEADER_LEN: usize = 8;
/// IPv6 next-header value of ICMPv6.
pub const NEXT_HEADER: u8 = 58;
/// RFC 4443 §2.4(c): an ICMPv6 error must not make the IPv6 packet exceed the
/// minimum IPv6 MTU.
pub const MIN_MTU: usize = 1280;

/// Message types.
pub mod msg {
    pub const DST_UNREACHABLE: u8 = 1;
    pub const PACKET_TOO_BIG: u8 = 2;
    pub const TIME_EXCEEDED: u8 = 3;
    pub const PARAM_PROBLEM: u8 = 4;
    pub const ECHO_REQUEST: u8 = 128;
    pub const ECHO_REPLY: u8 = 129;
    pub const ROUTER_SOLICIT: u8 = 133;
    pub const ROUTER_ADVERT: u8 = 134;
    pub const NEIGHBOR_SOLICIT: u8 = 135;
    pub const NEIGHBOR_ADVERT: u8 = 136;
    pub const REDIRECT: u8 = 137;

    /// Types below 128 are errors: no ICMPv6 error may be sent about one
    /// (RFC 4443 §2.4(e)).
    pub fn is_error(t: u8) -> bool {
        t < 128
    }
}

mod field {
    use core::ops::Range;
    pub const TYPE: usize = 0;
    pub const CODE: usize = 1;
    pub const CHECKSUM: Range<usize> = 2..4;
    pub const ECHO_IDENT: Range<usize> = 4..6;
    pub const ECHO_SEQNO: Range<usize> = 6..8;
    pub const MTU: Range<usize> = 4..8;
    pub const DATA: usize = 8;
}

/// Checksum field offset inside any ICMPv6 message.
pub const CHECKSUM_OFFSET: usize = 2;

/// True when `msg` (a whole ICMPv6 message, checksum field included) carries a valid
/// checksum for the given addresses.
pub fn verify_checksum(src: Ipv6Addr, dst: Ipv6Addr, msg: &[u8]) -> bool {
    let acc = checksum::pseudo_header_v6(src, dst, NEXT_HEADER, msg.len() as u32);
    checksum::fold(checksum::sum(msg, acc)) == 0xffff
}

/// Computes and writes the checksum of `msg` (a whole ICMPv6 message). Does nothing
/// on a buffer too short to hold the field.
pub fn fill_checksum(src: Ipv6Addr, dst: Ipv6Addr, msg: &mut [u8]) {
    let Some(field) = msg.get_mut(CHECKSUM_OFFSET..CHECKSUM_OFFSET + 2) else {
        return;
    };
    field.fill(0);
    let acc = checksum::pseudo_header_v6(src, dst, NEXT_HEADER, msg.len() as u32);
    let c = !checksum::fold(checksum::sum(msg, acc));
    msg[field::CHECKSUM].copy_from_slice(&c.to_be_bytes());
}

/// A view of an ICMPv6 message (the whole IPv6 payload after extension headers).
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps a buffer holding at least the 8-byte header.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < HEADER_LEN {
            Err(WireError::Truncated)
        } else {
            Ok(())
        }
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    pub fn msg_type(&self) -> u8 {
        self.buffer.as_ref()[field::TYPE]
    }
    pub fn msg_code(&self) -> u8 {
        self.buffer.as_ref()[field::CODE]
    }
    pub fn checksum(&self) -> u16 {
        bytes::get_u16(self.buffer.as_ref(), field::CHECKSUM)
    }
    pub fn echo_ident(&self) -> u16 {
        bytes::get_u16(self.buffer.as_ref(), field::ECHO_IDENT)
    }
    pub fn echo_seq_no(&self) -> u16 {
        bytes::get_u16(self.buffer.as_ref(), field::ECHO_SEQNO)
    }
    /// The MTU field of Packet Too Big.
    pub fn mtu(&self) -> u32 {
        let b = &self.buffer.as_ref()[field::MTU];
        u32::from_be_bytes([b[0], b[1], b[2], b[3]])
    }
    pub fn data(&self) -> &[u8] {
        &self.buffer.as_ref()[field::DATA..]
    }
    pub fn verify_checksum(&self, src: Ipv6Addr, dst: Ipv6Addr) -> bool {
        verify_checksum(src, dst, self.buffer.as_ref())
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_msg_type(&mut self, v: u8) {
        self.buffer.as_mut()[field::TYPE] = v;
    }
    pub fn set_msg_code(&mut self, v: u8) {
        self.buffer.as_mut()[field::CODE] = v;
    }
    pub fn set_echo_ident(&mut self, v: u16) {
        self.buffer.as_mut()[field::ECHO_IDENT].copy_from_slice(&v.to_be_bytes());
    }
    pub fn set_echo_seq_no(&mut self, v: u16) {
        self.buffer.as_mut()[field::ECHO_SEQNO].copy_from_slice(&v.to_be_bytes());
    }
    pub fn set_mtu(&mut self, v: u32) {
        self.buffer.as_mut()[field::MTU].copy_from_slice(&v.to_be_bytes());
    }
    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::DATA..]
    }
    pub fn fill_checksum(&mut self, src: Ipv6Addr, dst: Ipv6Addr) {
        fill_checksum(src, dst, self.buffer.as_mut());
    }
}

/// A decoded ICMPv6 message of a kind handled here (NDP is in `ndp`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Repr<'a> {
    EchoRequest {
        ident: u16,
        seq_no: u16,
        data: &'a [u8],
    },
    EchoReply {
        ident: u16,
        seq_no: u16,
        data: &'a [u8],
    },
    PacketTooBig {
        mtu: u32,
        /// As much of the offending packet as fits.
        data: &'a [u8],
    },
}

impl<'a> Repr<'a> {
    /// Decodes a message after checking its checksum against the IPv6 addresses.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(
        p: &Packet<&'a T>,
        src: Ipv6Addr,
        dst: Ipv6Addr,
    ) -> Result<Repr<'a>> {
        p.check_len()?;
        if !p.verify_checksum(src, dst) {
            return Err(WireError::Malformed("icmpv6 checksum"));
        }
        let buf: &'a T = p.buffer;
        let data = &buf.as_ref()[field::DATA..];
        match (p.msg_type(), p.msg_code()) {
            (msg::ECHO_REQUEST, 0) => Ok(Repr::EchoRequest {
                ident: p.echo_ident(),
                seq_no: p.echo_seq_no(),
                data,
            }),
            (msg::ECHO_REPLY, 0) => Ok(Repr::EchoReply {
                ident: p.echo_ident(),
                seq_no: p.echo_seq_no(),
                data,
            }),
            (msg::PACKET_TOO_BIG, 0) => Ok(Repr::PacketTooBig { mtu: p.mtu(), data }),
            _ => Err(WireError::Unsupported("icmpv6 message type")),
        }
    }

    pub fn buffer_len(&self) -> usize {
        HEADER_LEN
            + match self {
                Repr::EchoRequest { data, .. }
                | Repr::EchoReply { data, .. }
                | Repr::PacketTooBig { data, .. } => data.len(),
            }
    }

    /// Writes the message and its checksum; the buffer must be exactly `buffer_len()`.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        p: &mut Packet<T>,
        src: Ipv6Addr,
        dst: Ipv6Addr,
    ) -> Result<()> {
        if p.buffer.as_ref().len() != self.buffer_len() {
            return Err(WireError::Truncated);
        }
        match *self {
            Repr::EchoRequest {
                ident,
                seq_no,
                data,
            } => {
                p.set_msg_type(msg::ECHO_REQUEST);
                p.set_echo_ident(ident);
                p.set_echo_seq_no(seq_no);
                p.data_mut().copy_from_slice(data);
            }
            Repr::EchoReply {
                ident,
                seq_no,
                data,
            } => {
                p.set_msg_type(msg::ECHO_REPLY);
                p.set_echo_ident(ident);
                p.set_echo_seq_no(seq_no);
                p.data_mut().copy_from_slice(data);
            }
            Repr::PacketTooBig { mtu, data } => {
                p.set_msg_type(msg::PACKET_TOO_BIG);
                p.set_mtu(mtu);
                p.data_mut().copy_from_slice(data);
            }
        }
        p.set_msg_code(0);
        p.fill_checksum(src, dst);
        Ok(())
    }
}

impl fmt::Display for Repr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Repr::EchoRequest {
                ident,
                seq_no,
                data,
            } => write!(
                f,
                "ICMPv6 echo request id={ident} seq={seq_no} len={}",
                data.len()
            ),
            Repr::EchoReply {
                ident,
                seq_no,
                data,
            } => write!(
                f,
                "ICMPv6 echo reply id={ident} seq={seq_no} len={}",
                data.len()
            ),
            Repr::PacketTooBig { mtu, data } => {
                write!(f, "ICMPv6 packet too big mtu={mtu} quoted={}", data.len())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addrs() -> (Ipv6Addr, Ipv6Addr) {
        (
            "fe80::aa40:25ff:feff:1".parse().unwrap(),
            "fe80::aa40:25ff:fe00:1".parse().unwrap(),
        )
    }

    /// Echo request id 0x1234 seq 1 data "ABCD" between the two link-locals above;
    /// bytes from scapy: bytes(ICMPv6EchoRequest(id=0x1234, seq=1, data=b"ABCD"))
    /// under IPv6(src=..., dst=...).
    static ECHO_REQUEST: [u8; 12] = [
        0x80, 0x00, 0x4e, 0x79, 0x12, 0x34, 0x00, 0x01, 0x41, 0x42, 0x43, 0x44,
    ];

    #[test]
    fn echo_round_trip_with_pseudo_header() {
        let (s, d) = addrs();
        let p = Packet::new_checked(&ECHO_REQUEST[..]).unwrap();
        let r = Repr::parse(&p, s, d).unwrap();
        assert_eq!(
            r,
            Repr::EchoRequest {
                ident: 0x1234,
                seq_no: 1,
                data: b"ABCD"
            }
        );
        let mut buf = [0u8; 12];
        r.emit(&mut Packet::new_unchecked(&mut buf[..]), s, d)
            .unwrap();
        assert_eq!(buf, ECHO_REQUEST);
        // The same bytes between other addresses fail the pseudo-header check (a
        // swap would not: the sum is commutative).
        let other: Ipv6Addr = "fe80::2".parse().unwrap();
        assert_eq!(
            Repr::parse(&p, other, d).map(|_| ()).unwrap_err(),
            WireError::Malformed("icmpv6 checksum")
        );
    }

    #[test]
    fn packet_too_big_round_trip() {
        let (s, d) = addrs();
        let quoted = [0x60u8; 48];
        let r = Repr::PacketTooBig {
            mtu: 1500,
            data: &quoted,
        };
        let mut buf = vec![0u8; r.buffer_len()];
        r.emit(&mut Packet::new_unchecked(&mut buf[..]), s, d)
            .unwrap();
        assert_eq!(&buf[..2], &[2, 0]);
        assert_eq!(&buf[4..8], &1500u32.to_be_bytes());
        let p = Packet::new_checked(&buf[..]).unwrap();
        assert_eq!(Repr::parse(&p, s, d).unwrap(), r);
    }

    #[test]
    fn fill_checksum_ignores_short_buffers() {
        let (s, d) = addrs();
        let mut b = [0x80u8; 3];
        fill_checksum(s, d, &mut b);
        assert_eq!(b, [0x80; 3]);
        assert!(Packet::new_checked(&b[..]).is_err());
    }
}
