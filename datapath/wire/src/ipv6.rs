//! IPv6 headers (RFC 8200) and a walker over the extension headers a guest may send.

use crate::{Result, WireError};
use core::fmt;
use std::net::Ipv6Addr;

pub use crate::ipv4::protocol;

/// Length of the fixed header.
pub const HEADER_LEN: usize = 40;

/// Most extension headers walked before the packet is refused. RFC 8200 §4.1 allows
/// each kind once (destination options twice), so a longer chain is an attack on the
/// parser's time budget rather than traffic.
pub const MAX_EXT_HEADERS: usize = 8;

mod field {
    use core::ops::Range;
    pub const VER_TC_FLOW: Range<usize> = 0..4;
    pub const LENGTH: Range<usize> = 4..6;
    pub const NXT_HDR: usize = 6;
    pub const HOP_LIMIT: usize = 7;
    pub const SRC_ADDR: Range<usize> = 8..24;
    pub const DST_ADDR: Range<usize> = 24..40;
}

/// A view of an IPv6 packet.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps a buffer after checking the version and that the payload length fits
    /// (bytes after it, e.g. Ethernet padding, are allowed).
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
        if self.version() != 6 {
            return Err(WireError::Malformed("ipv6 version"));
        }
        if HEADER_LEN + self.payload_len() as usize > len {
            return Err(WireError::Truncated);
        }
        Ok(())
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn first_word(&self) -> u32 {
        let b = &self.buffer.as_ref()[field::VER_TC_FLOW];
        u32::from_be_bytes([b[0], b[1], b[2], b[3]])
    }

    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[0] >> 4
    }

    pub fn traffic_class(&self) -> u8 {
        (self.first_word() >> 20) as u8
    }

    pub fn flow_label(&self) -> u32 {
        self.first_word() & 0x000f_ffff
    }

    pub fn payload_len(&self) -> u16 {
        let b = &self.buffer.as_ref()[field::LENGTH];
        u16::from_be_bytes([b[0], b[1]])
    }

    pub fn next_header(&self) -> u8 {
        self.buffer.as_ref()[field::NXT_HDR]
    }

    pub fn hop_limit(&self) -> u8 {
        self.buffer.as_ref()[field::HOP_LIMIT]
    }

    pub fn src_addr(&self) -> Ipv6Addr {
        addr_at(self.buffer.as_ref(), field::SRC_ADDR.start)
    }

    pub fn dst_addr(&self) -> Ipv6Addr {
        addr_at(self.buffer.as_ref(), field::DST_ADDR.start)
    }

    /// The payload (extension headers included) up to the payload length.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..HEADER_LEN + self.payload_len() as usize]
    }

    /// Walks the extension headers of this packet; offsets in the result are from the
    /// start of the IPv6 header.
    pub fn extension_headers(&self) -> Result<ExtHeaders> {
        let end = HEADER_LEN + self.payload_len() as usize;
        walk_extension_headers(&self.buffer.as_ref()[..end], self.next_header(), HEADER_LEN)
    }
}

/// Reads 16 bytes at `off` as an address; the caller has checked the bound.
#[inline]
pub(crate) fn addr_at(b: &[u8], off: usize) -> Ipv6Addr {
    let mut o = [0u8; 16];
    o.copy_from_slice(&b[off..off + 16]);
    Ipv6Addr::from(o)
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    fn set_first_word(&mut self, w: u32) {
        self.buffer.as_mut()[field::VER_TC_FLOW].copy_from_slice(&w.to_be_bytes());
    }

    /// Writes version 6, the traffic class and the 20-bit flow label together.
    pub fn set_version_tc_flow(&mut self, traffic_class: u8, flow_label: u32) {
        self.set_first_word((6 << 28) | (u32::from(traffic_class) << 20) | (flow_label & 0xf_ffff));
    }

    pub fn set_payload_len(&mut self, v: u16) {
        self.buffer.as_mut()[field::LENGTH].copy_from_slice(&v.to_be_bytes());
    }

    pub fn set_next_header(&mut self, v: u8) {
        self.buffer.as_mut()[field::NXT_HDR] = v;
    }

    pub fn set_hop_limit(&mut self, v: u8) {
        self.buffer.as_mut()[field::HOP_LIMIT] = v;
    }

    pub fn set_src_addr(&mut self, a: Ipv6Addr) {
        self.buffer.as_mut()[field::SRC_ADDR].copy_from_slice(&a.octets());
    }

    pub fn set_dst_addr(&mut self, a: Ipv6Addr) {
        self.buffer.as_mut()[field::DST_ADDR].copy_from_slice(&a.octets());
    }

    pub fn payload_mut(&mut self) -> &mut [u8] {
        let end = HEADER_LEN + self.payload_len() as usize;
        &mut self.buffer.as_mut()[HEADER_LEN..end]
    }
}

/// An IPv6 fragment header's fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FragmentInfo {
    /// Offset in bytes.
    pub offset: u16,
    pub more: bool,
    pub ident: u32,
}

/// Where the extension-header chain ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExtHeaders {
    /// The upper-layer protocol (the last next-header value).
    pub next_header: u8,
    /// Offset of the upper-layer header. For a non-first fragment this is where the
    /// fragment's data starts, and there is no upper-layer header there.
    pub l4_off: usize,
    /// Present when a fragment header was seen.
    pub fragment: Option<FragmentInfo>,
}

/// Walks hop-by-hop (0), routing (43), fragment (44) and destination options (60)
/// headers in `buf` starting at `off` with first next header `next`, and returns the
/// upper-layer protocol and its offset. `buf` must end where the IPv6 payload ends.
///
/// Bounded by [`MAX_EXT_HEADERS`]; every length is checked against `buf`. Hop-by-hop
/// anywhere but first is refused (RFC 8200 §4.3). The walk stops at a non-first
/// fragment because what follows is not a header.
pub fn walk_extension_headers(buf: &[u8], next: u8, off: usize) -> Result<ExtHeaders> {
    // All of `buf` is at hand, so no header lies past it and `None` cannot occur;
    // mapping it to `Truncated` keeps this function free of a panic path.
    walk_extension_headers_head(buf, buf.len(), next, off).unwrap_or(Err(WireError::Truncated))
}

/// [`walk_extension_headers`] over a packet of which only the first bytes, `head`, are
/// at hand (the first buffer of a chain, see `wire::meta`); the payload ends at offset
/// `end` of the buffer `head` begins.
///
/// Returns exactly what [`walk_extension_headers`] returns for a buffer of `end` bytes
/// that begins with `head`, or `None` when the walk needs the fixed part of a header
/// (next header and length, or the whole 8-byte fragment header) that lies past `head`
/// but before `end`. Lengths are checked against `end` before anything is read, so
/// bytes of `head` past `end` are never used, and the bodies of the other headers are
/// skipped by their length without being read.
pub fn walk_extension_headers_head(
    head: &[u8],
    end: usize,
    mut next: u8,
    mut off: usize,
) -> Option<Result<ExtHeaders>> {
    let mut fragment = None;
    for i in 0..=MAX_EXT_HEADERS {
        match next {
            protocol::HOP_BY_HOP | protocol::IPV6_ROUTING | protocol::IPV6_DEST_OPTS => {
                if i == MAX_EXT_HEADERS {
                    break;
                }
                if next == protocol::HOP_BY_HOP && i != 0 {
                    return Some(Err(WireError::Malformed(
                        "ipv6 hop-by-hop header not first",
                    )));
                }
                if off + 2 > end {
                    return Some(Err(WireError::Truncated));
                }
                let h = head.get(off..off + 2)?;
                let len = (h[1] as usize + 1) * 8;
                if off + len > end {
                    return Some(Err(WireError::Truncated));
                }
                next = h[0];
                off += len;
            }
            protocol::IPV6_FRAGMENT => {
                if i == MAX_EXT_HEADERS {
                    break;
                }
                if off + 8 > end {
                    return Some(Err(WireError::Truncated));
                }
                let h = head.get(off..off + 8)?;
                if fragment.is_some() {
                    return Some(Err(WireError::Malformed("ipv6 second fragment header")));
                }
                let offmf = u16::from_be_bytes([h[2], h[3]]);
                let info = FragmentInfo {
                    offset: offmf & 0xfff8,
                    more: offmf & 1 != 0,
                    ident: u32::from_be_bytes([h[4], h[5], h[6], h[7]]),
                };
                fragment = Some(info);
                next = h[0];
                off += 8;
                if info.offset != 0 {
                    return Some(Ok(ExtHeaders {
                        next_header: next,
                        l4_off: off,
                        fragment,
                    }));
                }
            }
            _ => {
                return Some(Ok(ExtHeaders {
                    next_header: next,
                    l4_off: off,
                    fragment,
                }))
            }
        }
    }
    Some(Err(WireError::Unsupported(
        "ipv6 extension header chain longer than 8",
    )))
}

/// A fixed IPv6 header (extension headers are part of the payload).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Repr {
    pub src_addr: Ipv6Addr,
    pub dst_addr: Ipv6Addr,
    pub next_header: u8,
    pub payload_len: usize,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub flow_label: u32,
}

impl Repr {
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Repr> {
        p.check_len()?;
        Ok(Repr {
            src_addr: p.src_addr(),
            dst_addr: p.dst_addr(),
            next_header: p.next_header(),
            payload_len: p.payload_len() as usize,
            hop_limit: p.hop_limit(),
            traffic_class: p.traffic_class(),
            flow_label: p.flow_label(),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the fixed header into a buffer of at least [`HEADER_LEN`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) -> Result<()> {
        let len = u16::try_from(self.payload_len)
            .map_err(|_| WireError::Unsupported("ipv6 payload over 65535 (jumbogram)"))?;
        if self.flow_label > 0xf_ffff {
            return Err(WireError::Malformed("ipv6 flow label over 20 bits"));
        }
        if p.buffer.as_ref().len() < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        p.set_version_tc_flow(self.traffic_class, self.flow_label);
        p.set_payload_len(len);
        p.set_next_header(self.next_header);
        p.set_hop_limit(self.hop_limit);
        p.set_src_addr(self.src_addr);
        p.set_dst_addr(self.dst_addr);
        Ok(())
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "IPv6 src={} dst={} nxt={} len={} hop_limit={}",
            self.src_addr, self.dst_addr, self.next_header, self.payload_len, self.hop_limit
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // fd00::1 -> fd00::2, tc 0xb8, flow 0x12345, UDP, payload 8, hop limit 64.
    static PACKET_BYTES: [u8; 48] = [
        0x6b, 0x81, 0x23, 0x45, 0x00, 0x08, 0x11, 0x40, 0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        0, 0, 1, 0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0x30, 0x39, 0x17, 0xc1, 0x00,
        0x08, 0x00, 0x00,
    ];

    #[test]
    fn deconstruct() {
        let p = Packet::new_checked(&PACKET_BYTES[..]).unwrap();
        assert_eq!(p.version(), 6);
        assert_eq!(p.traffic_class(), 0xb8);
        assert_eq!(p.flow_label(), 0x12345);
        assert_eq!(p.payload_len(), 8);
        assert_eq!(p.next_header(), protocol::UDP);
        assert_eq!(p.hop_limit(), 64);
        assert_eq!(p.src_addr(), "fd00::1".parse::<Ipv6Addr>().unwrap());
        assert_eq!(p.dst_addr(), "fd00::2".parse::<Ipv6Addr>().unwrap());
        assert_eq!(p.payload(), &PACKET_BYTES[40..]);
        let ext = p.extension_headers().unwrap();
        assert_eq!((ext.next_header, ext.l4_off, ext.fragment), (17, 40, None));
    }

    #[test]
    fn parse_emit_round_trip() {
        let repr = Repr::parse(&Packet::new_checked(&PACKET_BYTES[..]).unwrap()).unwrap();
        let mut out = [0u8; 40];
        repr.emit(&mut Packet::new_unchecked(&mut out[..])).unwrap();
        assert_eq!(out[..], PACKET_BYTES[..40]);
        assert_eq!(
            repr.to_string(),
            "IPv6 src=fd00::1 dst=fd00::2 nxt=17 len=8 hop_limit=64"
        );
    }

    #[test]
    fn checks() {
        assert_eq!(
            Packet::new_checked(&PACKET_BYTES[..39]).unwrap_err(),
            WireError::Truncated
        );
        assert_eq!(
            Packet::new_checked(&PACKET_BYTES[..47]).unwrap_err(),
            WireError::Truncated
        );
        let mut bad = PACKET_BYTES;
        bad[0] = 0x4b;
        assert_eq!(
            Packet::new_checked(&bad[..]).unwrap_err(),
            WireError::Malformed("ipv6 version")
        );
    }

    /// An 8-byte extension header with the given next header.
    fn ext(next: u8) -> [u8; 8] {
        [next, 0, 1, 4, 0, 0, 0, 0]
    }

    /// Hop-by-hop (8 bytes), routing (24), destination options (8), first fragment
    /// (8), then a TCP header: the walk's fixed parts end at 2, 10, 34 and 48.
    fn chain() -> Vec<u8> {
        let mut b = vec![];
        b.extend_from_slice(&ext(protocol::IPV6_ROUTING));
        // Routing header of 24 bytes (hdr ext len 2).
        b.extend_from_slice(&[protocol::IPV6_DEST_OPTS, 2]);
        b.extend_from_slice(&[0; 22]);
        b.extend_from_slice(&ext(protocol::IPV6_FRAGMENT));
        // First fragment, M=1, ident 0xdeadbeef, then TCP.
        b.extend_from_slice(&[protocol::TCP, 0, 0x00, 0x01, 0xde, 0xad, 0xbe, 0xef]);
        b.extend_from_slice(&[0; 20]);
        b
    }

    #[test]
    fn walks_hbh_routing_dstopts_fragment() {
        let b = chain();
        let e = walk_extension_headers(&b, protocol::HOP_BY_HOP, 0).unwrap();
        assert_eq!(e.next_header, protocol::TCP);
        assert_eq!(e.l4_off, 8 + 24 + 8 + 8);
        assert_eq!(
            e.fragment,
            Some(FragmentInfo {
                offset: 0,
                more: true,
                ident: 0xdeadbeef
            })
        );
    }

    /// Over a first piece of every length the walk decides as over the whole buffer or
    /// not at all, and decides once the last fixed part it reads is in the piece.
    #[test]
    fn walk_over_the_head_of_a_buffer() {
        let b = chain();
        let whole = walk_extension_headers(&b, protocol::HOP_BY_HOP, 0);
        for h in 0..=b.len() {
            let got = walk_extension_headers_head(&b[..h], b.len(), protocol::HOP_BY_HOP, 0);
            assert_eq!(got.is_some(), h >= 48, "head {h}");
            assert!(got.is_none() || got == Some(whole), "head {h}");
        }
        // A header length past the end is refused from the two bytes that hold it.
        let b = [protocol::UDP, 1, 0, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(
            walk_extension_headers_head(&b[..2], b.len(), protocol::IPV6_DEST_OPTS, 0),
            Some(Err(WireError::Truncated))
        );
    }

    #[test]
    fn non_first_fragment_stops_the_walk() {
        // Offset 1448 bytes (181 * 8), last fragment; what follows is data that looks
        // like a header but must not be walked.
        let mut b = vec![protocol::IPV6_DEST_OPTS, 0, 0x05, 0xa8, 0, 0, 0, 7];
        b.extend_from_slice(&[0xff; 16]);
        let e = walk_extension_headers(&b, protocol::IPV6_FRAGMENT, 0).unwrap();
        assert_eq!(e.next_header, protocol::IPV6_DEST_OPTS);
        assert_eq!(e.l4_off, 8);
        assert_eq!(e.fragment.unwrap().offset, 1448);
        assert!(!e.fragment.unwrap().more);
    }

    #[test]
    fn refusals() {
        // Hop-by-hop after another header.
        let mut b = ext(protocol::HOP_BY_HOP).to_vec();
        b.extend_from_slice(&ext(protocol::UDP));
        assert_eq!(
            walk_extension_headers(&b, protocol::IPV6_DEST_OPTS, 0),
            Err(WireError::Malformed("ipv6 hop-by-hop header not first"))
        );
        // Length running past the payload.
        let b = [protocol::UDP, 1, 0, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(
            walk_extension_headers(&b, protocol::IPV6_DEST_OPTS, 0),
            Err(WireError::Truncated)
        );
        // Empty payload where a header should be.
        assert_eq!(
            walk_extension_headers(&[], protocol::IPV6_ROUTING, 0),
            Err(WireError::Truncated)
        );
        // A chain of destination options longer than the bound.
        let mut b = vec![];
        for _ in 0..MAX_EXT_HEADERS + 1 {
            b.extend_from_slice(&ext(protocol::IPV6_DEST_OPTS));
        }
        assert!(matches!(
            walk_extension_headers(&b, protocol::IPV6_DEST_OPTS, 0),
            Err(WireError::Unsupported(_))
        ));
        // Exactly the bound is fine.
        let mut b = vec![];
        for _ in 0..MAX_EXT_HEADERS - 1 {
            b.extend_from_slice(&ext(protocol::IPV6_DEST_OPTS));
        }
        b.extend_from_slice(&ext(protocol::UDP));
        let e = walk_extension_headers(&b, protocol::IPV6_DEST_OPTS, 0).unwrap();
        assert_eq!(e.l4_off, 8 * MAX_EXT_HEADERS);
        // Two fragment headers.
        let mut b = vec![protocol::IPV6_FRAGMENT, 0, 0, 1, 0, 0, 0, 1];
        b.extend_from_slice(&[protocol::UDP, 0, 0, 1, 0, 0, 0, 1]);
        assert_eq!(
            walk_extension_headers(&b, protocol::IPV6_FRAGMENT, 0),
            Err(WireError::Malformed("ipv6 second fragment header"))
        );
    }
}
