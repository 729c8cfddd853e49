//! ARP for IPv4 over Ethernet (RFC 826).
//!
//! Only the Ethernet/IPv4 form exists on a guest link, so `Repr::parse` refuses any
//! other hardware or protocol type rather than carrying lengths it would never use.

use crate::bytes;
use crate::{MacAddr, Result, WireError};
use core::fmt;
use std::net::Ipv4Addr;

/// Length of an Ethernet/IPv4 ARP packet (without Ethernet padding).
pub const PACKET_LEN: usize = 28;
/// Hardware type Ethernet.
pub const HTYPE_ETHERNET: u16 = 1;
/// Protocol type IPv4 (the EtherType).
pub const PTYPE_IPV4: u16 = 0x0800;

mod field {
    use core::ops::Range;
    pub const HTYPE: Range<usize> = 0..2;
    pub const PTYPE: Range<usize> = 2..4;
    pub const HLEN: usize = 4;
    pub const PLEN: usize = 5;
    pub const OPER: Range<usize> = 6..8;
    pub const SHA: Range<usize> = 8..14;
    pub const SPA: Range<usize> = 14..18;
    pub const THA: Range<usize> = 18..24;
    pub const TPA: Range<usize> = 24..28;
}

/// ARP operation code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    Request,
    Reply,
    /// Any other code (RARP, InARP, ...): kept so the caller can count it.
    Unknown(u16),
}

impl From<u16> for Operation {
    fn from(v: u16) -> Self {
        match v {
            1 => Operation::Request,
            2 => Operation::Reply,
            o => Operation::Unknown(o),
        }
    }
}

impl From<Operation> for u16 {
    fn from(o: Operation) -> u16 {
        match o {
            Operation::Request => 1,
            Operation::Reply => 2,
            Operation::Unknown(v) => v,
        }
    }
}

/// A view of an Ethernet/IPv4 ARP packet.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer without checking its length; accessors may panic on a short one.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps a buffer holding at least [`PACKET_LEN`] bytes.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < PACKET_LEN {
            Err(WireError::Truncated)
        } else {
            Ok(())
        }
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn mac_at(&self, r: core::ops::Range<usize>) -> MacAddr {
        let mut m = [0u8; 6];
        m.copy_from_slice(&self.buffer.as_ref()[r]);
        MacAddr(m)
    }

    fn ip_at(&self, r: core::ops::Range<usize>) -> Ipv4Addr {
        let b = &self.buffer.as_ref()[r];
        Ipv4Addr::new(b[0], b[1], b[2], b[3])
    }

    pub fn hardware_type(&self) -> u16 {
        bytes::get_u16(self.buffer.as_ref(), field::HTYPE)
    }
    pub fn protocol_type(&self) -> u16 {
        bytes::get_u16(self.buffer.as_ref(), field::PTYPE)
    }
    pub fn hardware_len(&self) -> u8 {
        self.buffer.as_ref()[field::HLEN]
    }
    pub fn protocol_len(&self) -> u8 {
        self.buffer.as_ref()[field::PLEN]
    }
    pub fn operation(&self) -> Operation {
        bytes::get_u16(self.buffer.as_ref(), field::OPER).into()
    }
    pub fn source_hardware_addr(&self) -> MacAddr {
        self.mac_at(field::SHA)
    }
    pub fn source_protocol_addr(&self) -> Ipv4Addr {
        self.ip_at(field::SPA)
    }
    pub fn target_hardware_addr(&self) -> MacAddr {
        self.mac_at(field::THA)
    }
    pub fn target_protocol_addr(&self) -> Ipv4Addr {
        self.ip_at(field::TPA)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_hardware_type(&mut self, v: u16) {
        self.buffer.as_mut()[field::HTYPE].copy_from_slice(&v.to_be_bytes());
    }
    pub fn set_protocol_type(&mut self, v: u16) {
        self.buffer.as_mut()[field::PTYPE].copy_from_slice(&v.to_be_bytes());
    }
    pub fn set_hardware_len(&mut self, v: u8) {
        self.buffer.as_mut()[field::HLEN] = v;
    }
    pub fn set_protocol_len(&mut self, v: u8) {
        self.buffer.as_mut()[field::PLEN] = v;
    }
    pub fn set_operation(&mut self, v: Operation) {
        self.buffer.as_mut()[field::OPER].copy_from_slice(&u16::from(v).to_be_bytes());
    }
    pub fn set_source_hardware_addr(&mut self, m: MacAddr) {
        self.buffer.as_mut()[field::SHA].copy_from_slice(&m.0);
    }
    pub fn set_source_protocol_addr(&mut self, a: Ipv4Addr) {
        self.buffer.as_mut()[field::SPA].copy_from_slice(&a.octets());
    }
    pub fn set_target_hardware_addr(&mut self, m: MacAddr) {
        self.buffer.as_mut()[field::THA].copy_from_slice(&m.0);
    }
    pub fn set_target_protocol_addr(&mut self, a: Ipv4Addr) {
        self.buffer.as_mut()[field::TPA].copy_from_slice(&a.octets());
    }
}

/// A decoded Ethernet/IPv4 ARP packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Repr {
    pub operation: Operation,
    pub source_hardware_addr: MacAddr,
    pub source_protocol_addr: Ipv4Addr,
    pub target_hardware_addr: MacAddr,
    pub target_protocol_addr: Ipv4Addr,
}

impl Repr {
    /// Decodes a packet, refusing anything but Ethernet/IPv4 address types.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Repr> {
        p.check_len()?;
        if p.hardware_type() != HTYPE_ETHERNET || p.hardware_len() != 6 {
            return Err(WireError::Unsupported("arp hardware type"));
        }
        if p.protocol_type() != PTYPE_IPV4 || p.protocol_len() != 4 {
            return Err(WireError::Unsupported("arp protocol type"));
        }
        Ok(Repr {
            operation: p.operation(),
            source_hardware_addr: p.source_hardware_addr(),
            source_protocol_addr: p.source_protocol_addr(),
            target_hardware_addr: p.target_hardware_addr(),
            target_protocol_addr: p.target_protocol_addr(),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        PACKET_LEN
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_hardware_type(HTYPE_ETHERNET);
        p.set_protocol_type(PTYPE_IPV4);
        p.set_hardware_len(6);
        p.set_protocol_len(4);
        p.set_operation(self.operation);
        p.set_source_hardware_addr(self.source_hardware_addr);
        p.set_source_protocol_addr(self.source_protocol_addr);
        p.set_target_hardware_addr(self.target_hardware_addr);
        p.set_target_protocol_addr(self.target_protocol_addr);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ARP {:?} {}/{} -> {}/{}",
            self.operation,
            self.source_hardware_addr,
            self.source_protocol_addr,
            self.target_hardware_addr,
            self.target_protocol_addr
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Who has 172.30.0.1? Tell 172.30.0.5 (from a8:40:25:ff:00:01), as Linux sends it.
    static REQUEST_BYTES: [u8; 28] = [
        0x00, 0x01, 0x08, 0x00, 0x06, 0x04, 0x00, 0x01, 0xa8, 0x40, 0x25, 0xff, 0x00, 0x01, 0xac,
        0x1e, 0x00, 0x05, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xac, 0x1e, 0x00, 0x01,
    ];

    fn request_repr() -> Repr {
        Repr {
            operation: Operation::Request,
            source_hardware_addr: MacAddr([0xa8, 0x40, 0x25, 0xff, 0x00, 0x01]),
            source_protocol_addr: Ipv4Addr::new(172, 30, 0, 5),
            target_hardware_addr: MacAddr::ZERO,
            target_protocol_addr: Ipv4Addr::new(172, 30, 0, 1),
        }
    }

    #[test]
    fn parse_and_emit_are_inverse() {
        let p = Packet::new_checked(&REQUEST_BYTES[..]).unwrap();
        let r = Repr::parse(&p).unwrap();
        assert_eq!(r, request_repr());
        let mut buf = [0xffu8; PACKET_LEN];
        r.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, REQUEST_BYTES);
        assert_eq!(
            r.to_string(),
            "ARP Request a8:40:25:ff:00:01/172.30.0.5 -> 00:00:00:00:00:00/172.30.0.1"
        );
    }

    #[test]
    fn rejects_short_and_foreign_types() {
        assert_eq!(
            Packet::new_checked(&REQUEST_BYTES[..27]).unwrap_err(),
            WireError::Truncated
        );
        let mut b = REQUEST_BYTES;
        b[3] = 0xdd; // protocol type 0x08dd
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(
            Repr::parse(&p).unwrap_err(),
            WireError::Unsupported("arp protocol type")
        );
        let mut b = REQUEST_BYTES;
        b[4] = 8; // hardware length 8
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(
            Repr::parse(&p).unwrap_err(),
            WireError::Unsupported("arp hardware type")
        );
    }

    #[test]
    fn unknown_operation_is_kept() {
        let mut b = REQUEST_BYTES;
        b[7] = 8; // InARP request
        let r = Repr::parse(&Packet::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(r.operation, Operation::Unknown(8));
    }
}
