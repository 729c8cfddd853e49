//! Ethernet II frames (IEEE 802.3), with 802.1Q/802.1ad tag skipping.
//!
//! Guests may send tagged frames; the datapath does not switch on VLANs, so the parsers
//! look through up to two tags (QinQ) to find the EtherType of the payload.

use crate::{MacAddr, Result, WireError};
use core::fmt;

/// EtherType values the datapath recognises.
pub mod ethertype {
    pub const IPV4: u16 = 0x0800;
    pub const ARP: u16 = 0x0806;
    /// Transparent Ethernet bridging: the Geneve protocol type for an Ethernet payload.
    pub const TRANSPARENT_ETHERNET: u16 = 0x6558;
    /// 802.1Q customer VLAN tag.
    pub const VLAN: u16 = 0x8100;
    pub const IPV6: u16 = 0x86dd;
    /// 802.1ad service VLAN tag (outer tag of QinQ).
    pub const QINQ: u16 = 0x88a8;
}

/// Length of an untagged Ethernet header.
pub const HEADER_LEN: usize = 14;
/// Length of one 802.1Q/802.1ad tag (TPID + TCI).
pub const VLAN_TAG_LEN: usize = 4;
/// Most tags looked through before giving up: QinQ is two; more is not a real frame.
pub const MAX_VLAN_TAGS: usize = 2;

mod field {
    use core::ops::Range;
    pub const DESTINATION: Range<usize> = 0..6;
    pub const SOURCE: Range<usize> = 6..12;
    pub const ETHERTYPE: Range<usize> = 12..14;
    pub const PAYLOAD: usize = 14;
}

/// A view of an Ethernet frame.
#[derive(Debug, Clone)]
pub struct Frame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Frame<T> {
    /// Wraps a buffer without checking its length; accessors may panic on a short one.
    pub const fn new_unchecked(buffer: T) -> Frame<T> {
        Frame { buffer }
    }

    /// Wraps a buffer that holds at least an untagged header.
    pub fn new_checked(buffer: T) -> Result<Frame<T>> {
        let f = Self::new_unchecked(buffer);
        f.check_len()?;
        Ok(f)
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

    pub fn dst_addr(&self) -> MacAddr {
        let b = self.buffer.as_ref();
        MacAddr([b[0], b[1], b[2], b[3], b[4], b[5]])
    }

    pub fn src_addr(&self) -> MacAddr {
        let b = self.buffer.as_ref();
        MacAddr([b[6], b[7], b[8], b[9], b[10], b[11]])
    }

    /// The EtherType/TPID field right after the addresses (a VLAN TPID if tagged).
    pub fn ethertype(&self) -> u16 {
        let b = &self.buffer.as_ref()[field::ETHERTYPE];
        u16::from_be_bytes([b[0], b[1]])
    }

    /// The EtherType of the payload and the payload's offset, after skipping up to
    /// [`MAX_VLAN_TAGS`] 802.1Q/802.1ad tags.
    pub fn payload_type(&self) -> Result<(u16, usize)> {
        skip_vlan_tags(self.buffer.as_ref())
    }

    /// Bytes after the untagged header (includes any VLAN tag).
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[field::PAYLOAD..]
    }
}

/// The payload EtherType and its offset in `frame`, looking through VLAN tags.
///
/// A free function so the fast parsers can call it without building a view.
#[inline]
pub fn skip_vlan_tags(frame: &[u8]) -> Result<(u16, usize)> {
    let mut off = field::ETHERTYPE.start;
    for _ in 0..=MAX_VLAN_TAGS {
        let ty = match frame.get(off..off + 2) {
            Some(b) => u16::from_be_bytes([b[0], b[1]]),
            None => return Err(WireError::Truncated),
        };
        if ty != ethertype::VLAN && ty != ethertype::QINQ {
            return Ok((ty, off + 2));
        }
        off += VLAN_TAG_LEN;
    }
    Err(WireError::Unsupported("more than two VLAN tags"))
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Frame<T> {
    pub fn set_dst_addr(&mut self, addr: MacAddr) {
        self.buffer.as_mut()[field::DESTINATION].copy_from_slice(&addr.0);
    }

    pub fn set_src_addr(&mut self, addr: MacAddr) {
        self.buffer.as_mut()[field::SOURCE].copy_from_slice(&addr.0);
    }

    pub fn set_ethertype(&mut self, ty: u16) {
        self.buffer.as_mut()[field::ETHERTYPE].copy_from_slice(&ty.to_be_bytes());
    }

    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::PAYLOAD..]
    }
}

/// An untagged Ethernet header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Repr {
    pub src_addr: MacAddr,
    pub dst_addr: MacAddr,
    pub ethertype: u16,
}

impl Repr {
    /// Reads the header; a tagged frame yields the TPID as `ethertype` (use
    /// [`Frame::payload_type`] to look through tags).
    pub fn parse<T: AsRef<[u8]>>(frame: &Frame<T>) -> Result<Repr> {
        frame.check_len()?;
        Ok(Repr {
            src_addr: frame.src_addr(),
            dst_addr: frame.dst_addr(),
            ethertype: frame.ethertype(),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header; the frame must hold at least [`HEADER_LEN`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, frame: &mut Frame<T>) {
        frame.set_dst_addr(self.dst_addr);
        frame.set_src_addr(self.src_addr);
        frame.set_ethertype(self.ethertype);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Ethernet src={} dst={} type=0x{:04x}",
            self.src_addr, self.dst_addr, self.ethertype
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // An ARP request as captured: broadcast from a8:40:25:ff:00:01.
    static FRAME_BYTES: [u8; 16] = [
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xa8, 0x40, 0x25, 0xff, 0x00, 0x01, 0x08, 0x06, 0x00,
        0x01,
    ];

    #[test]
    fn deconstruct() {
        let f = Frame::new_checked(&FRAME_BYTES[..]).unwrap();
        assert_eq!(f.dst_addr(), MacAddr::BROADCAST);
        assert_eq!(f.src_addr(), MacAddr([0xa8, 0x40, 0x25, 0xff, 0x00, 0x01]));
        assert_eq!(f.ethertype(), ethertype::ARP);
        assert_eq!(f.payload(), &[0x00, 0x01]);
        assert_eq!(f.payload_type(), Ok((ethertype::ARP, 14)));
    }

    #[test]
    fn construct_round_trip() {
        let repr = Repr::parse(&Frame::new_checked(&FRAME_BYTES[..]).unwrap()).unwrap();
        let mut buf = [0u8; 16];
        buf[14..].copy_from_slice(&FRAME_BYTES[14..]);
        let mut f = Frame::new_checked(&mut buf[..]).unwrap();
        repr.emit(&mut f);
        assert_eq!(buf, FRAME_BYTES);
        assert_eq!(repr.buffer_len(), 14);
        assert_eq!(
            repr.to_string(),
            "Ethernet src=a8:40:25:ff:00:01 dst=ff:ff:ff:ff:ff:ff type=0x0806"
        );
    }

    #[test]
    fn short_buffer_rejected() {
        assert_eq!(
            Frame::new_checked(&FRAME_BYTES[..13]).unwrap_err(),
            WireError::Truncated
        );
    }

    #[test]
    fn vlan_tags_skipped() {
        let mut one = vec![0u8; 12];
        one.extend_from_slice(&[0x81, 0x00, 0x00, 0x05, 0x86, 0xdd]);
        assert_eq!(skip_vlan_tags(&one), Ok((ethertype::IPV6, 18)));

        let mut two = vec![0u8; 12];
        two.extend_from_slice(&[0x88, 0xa8, 0x00, 0x05, 0x81, 0x00, 0x00, 0x07, 0x08, 0x00]);
        assert_eq!(skip_vlan_tags(&two), Ok((ethertype::IPV4, 22)));

        let mut three = vec![0u8; 12];
        for _ in 0..3 {
            three.extend_from_slice(&[0x81, 0x00, 0x00, 0x01]);
        }
        three.extend_from_slice(&[0x08, 0x00]);
        assert_eq!(
            skip_vlan_tags(&three),
            Err(WireError::Unsupported("more than two VLAN tags"))
        );

        // Tag present but the inner EtherType is cut off.
        assert_eq!(skip_vlan_tags(&one[..17]), Err(WireError::Truncated));
    }
}
