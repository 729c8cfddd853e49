//! ICMP for IPv4 (RFC 792), the messages the gateway answers or originates: echo,
//! and destination unreachable including "fragmentation needed" with the next-hop MTU
//! (RFC 1191 §4).

use crate::bytes;
use crate::checksum;
use crate::{Result, WireError};
use core::fmt;

/// Length of the fixed ICMP header (type, code, checksum, 4 message-specific bytes).
pub const HEADER_LEN: usize = 8;

/// Message types.
pub mod msg {
    pub const ECHO_REPLY: u8 = 0;
    pub const DST_UNREACHABLE: u8 = 3;
    pub const REDIRECT: u8 = 5;
    pub const ECHO_REQUEST: u8 = 8;
    pub const TIME_EXCEEDED: u8 = 11;
    pub const PARAM_PROBLEM: u8 = 12;

    /// Error messages: no ICMP error may be sent about one (RFC 1122 §3.2.2).
    pub fn is_error(t: u8) -> bool {
        matches!(
            t,
            DST_UNREACHABLE | 4 | REDIRECT | TIME_EXCEEDED | PARAM_PROBLEM
        )
    }
}

/// Destination-unreachable code "fragmentation needed and DF set".
pub const CODE_FRAG_NEEDED: u8 = 4;

mod field {
    use core::ops::Range;
    pub const TYPE: usize = 0;
    pub const CODE: usize = 1;
    pub const CHECKSUM: Range<usize> = 2..4;
    pub const ECHO_IDENT: Range<usize> = 4..6;
    pub const ECHO_SEQNO: Range<usize> = 6..8;
    /// Next-hop MTU of "fragmentation needed" (RFC 1191); bytes 4..6 are unused.
    pub const NEXT_HOP_MTU: Range<usize> = 6..8;
    pub const DATA: usize = 8;
}

/// A view of an ICMPv4 message (the whole IP payload).
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
    pub fn next_hop_mtu(&self) -> u16 {
        bytes::get_u16(self.buffer.as_ref(), field::NEXT_HOP_MTU)
    }
    /// Bytes after the 8-byte header: echo data, or the quoted datagram of an error.
    pub fn data(&self) -> &[u8] {
        &self.buffer.as_ref()[field::DATA..]
    }
    /// The checksum covers the whole message; a valid one sums to 0xffff.
    pub fn verify_checksum(&self) -> bool {
        checksum::fold(checksum::sum(self.buffer.as_ref(), 0)) == 0xffff
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_msg_type(&mut self, v: u8) {
        self.buffer.as_mut()[field::TYPE] = v;
    }
    pub fn set_msg_code(&mut self, v: u8) {
        self.buffer.as_mut()[field::CODE] = v;
    }
    pub fn set_checksum(&mut self, v: u16) {
        self.buffer.as_mut()[field::CHECKSUM].copy_from_slice(&v.to_be_bytes());
    }
    pub fn set_echo_ident(&mut self, v: u16) {
        self.buffer.as_mut()[field::ECHO_IDENT].copy_from_slice(&v.to_be_bytes());
    }
    pub fn set_echo_seq_no(&mut self, v: u16) {
        self.buffer.as_mut()[field::ECHO_SEQNO].copy_from_slice(&v.to_be_bytes());
    }
    /// Writes "unused" (bytes 4..6) as zero and the next-hop MTU.
    pub fn set_next_hop_mtu(&mut self, v: u16) {
        let b = self.buffer.as_mut();
        b[4] = 0;
        b[5] = 0;
        b[field::NEXT_HOP_MTU].copy_from_slice(&v.to_be_bytes());
    }
    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::DATA..]
    }
    /// Computes the checksum over the whole buffer.
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let c = checksum::checksum(self.buffer.as_ref());
        self.set_checksum(c);
    }
}

/// A decoded ICMPv4 message of a kind the gateway handles.
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
    /// Destination unreachable, code 4: the datagram needed fragmentation but had DF.
    FragNeeded {
        next_hop_mtu: u16,
        /// The quoted offending datagram (IP header and leading payload).
        data: &'a [u8],
    },
}

impl<'a> Repr<'a> {
    /// Decodes a message after checking its checksum.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Packet<&'a T>) -> Result<Repr<'a>> {
        p.check_len()?;
        if !p.verify_checksum() {
            return Err(WireError::Malformed("icmpv4 checksum"));
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
            (msg::DST_UNREACHABLE, CODE_FRAG_NEEDED) => Ok(Repr::FragNeeded {
                next_hop_mtu: p.next_hop_mtu(),
                data,
            }),
            _ => Err(WireError::Unsupported("icmpv4 message type")),
        }
    }

    pub fn buffer_len(&self) -> usize {
        HEADER_LEN
            + match self {
                Repr::EchoRequest { data, .. }
                | Repr::EchoReply { data, .. }
                | Repr::FragNeeded { data, .. } => data.len(),
            }
    }

    /// Writes the message and its checksum; the buffer must be exactly `buffer_len()`
    /// long (the checksum covers all of it).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) -> Result<()> {
        if p.buffer.as_ref().len() != self.buffer_len() {
            return Err(WireError::Truncated);
        }
        match *self {
            Repr::EchoRequest {
                ident,
                seq_no,
                data,
            }
            | Repr::EchoReply {
                ident,
                seq_no,
                data,
            } => {
                let t = if matches!(self, Repr::EchoRequest { .. }) {
                    msg::ECHO_REQUEST
                } else {
                    msg::ECHO_REPLY
                };
                p.set_msg_type(t);
                p.set_msg_code(0);
                p.set_echo_ident(ident);
                p.set_echo_seq_no(seq_no);
                p.data_mut().copy_from_slice(data);
            }
            Repr::FragNeeded { next_hop_mtu, data } => {
                p.set_msg_type(msg::DST_UNREACHABLE);
                p.set_msg_code(CODE_FRAG_NEEDED);
                p.set_next_hop_mtu(next_hop_mtu);
                p.data_mut().copy_from_slice(data);
            }
        }
        p.fill_checksum();
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
                "ICMPv4 echo request id={ident} seq={seq_no} len={}",
                data.len()
            ),
            Repr::EchoReply {
                ident,
                seq_no,
                data,
            } => write!(
                f,
                "ICMPv4 echo reply id={ident} seq={seq_no} len={}",
                data.len()
            ),
            Repr::FragNeeded { next_hop_mtu, data } => write!(
                f,
                "ICMPv4 frag needed mtu={next_hop_mtu} quoted={}",
                data.len()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo request as `ping -c1 -p 41` sends the first bytes of it (id 0x1234,
    /// seq 1, data "ABCD"); checksum computed independently with scapy.
    static ECHO_REQUEST: [u8; 12] = [
        0x08, 0x00, 0x61, 0x44, 0x12, 0x34, 0x00, 0x01, 0x41, 0x42, 0x43, 0x44,
    ];

    #[test]
    fn echo_round_trip() {
        let p = Packet::new_checked(&ECHO_REQUEST[..]).unwrap();
        let r = Repr::parse(&p).unwrap();
        assert_eq!(
            r,
            Repr::EchoRequest {
                ident: 0x1234,
                seq_no: 1,
                data: b"ABCD"
            }
        );
        let mut buf = [0u8; 12];
        r.emit(&mut Packet::new_unchecked(&mut buf[..])).unwrap();
        assert_eq!(buf, ECHO_REQUEST);
    }

    #[test]
    fn bad_checksum_and_short_buffers_are_refused() {
        let mut b = ECHO_REQUEST;
        b[3] ^= 1;
        assert_eq!(
            Repr::parse(&Packet::new_checked(&b[..]).unwrap()).unwrap_err(),
            WireError::Malformed("icmpv4 checksum")
        );
        assert_eq!(
            Packet::new_checked(&ECHO_REQUEST[..7]).unwrap_err(),
            WireError::Truncated
        );
        let r = Repr::EchoReply {
            ident: 1,
            seq_no: 2,
            data: b"xy",
        };
        let mut short = [0u8; 9];
        assert!(r.emit(&mut Packet::new_unchecked(&mut short[..])).is_err());
    }

    #[test]
    fn frag_needed_carries_mtu() {
        let quoted = [0x45u8, 0, 0, 0x1c, 0, 0, 0x40, 0, 0x40, 0x11, 0, 0];
        let r = Repr::FragNeeded {
            next_hop_mtu: 1500,
            data: &quoted,
        };
        let mut buf = vec![0u8; r.buffer_len()];
        r.emit(&mut Packet::new_unchecked(&mut buf[..])).unwrap();
        assert_eq!(&buf[..2], &[3, 4]);
        assert_eq!(&buf[4..8], &[0, 0, 0x05, 0xdc]);
        let p = Packet::new_checked(&buf[..]).unwrap();
        assert!(p.verify_checksum());
        assert_eq!(Repr::parse(&p).unwrap(), r);
    }
}
