//! TCP headers (RFC 9293) and the options the datapath reads or writes: MSS (for
//! tunneled TSO and clamping), window scale, SACK-permitted and timestamps (whose sizes
//! enter the segment-size arithmetic).

use crate::bytes;
use crate::checksum;
use crate::ipv4::protocol;
use crate::{Result, WireError};
use core::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

/// Length of a header without options.
pub const HEADER_LEN: usize = 20;
/// Longest header: data offset 15 words.
pub const MAX_HEADER_LEN: usize = 60;

/// Bits of the flags byte (byte 13).
pub mod flags {
    pub const FIN: u8 = 0x01;
    pub const SYN: u8 = 0x02;
    pub const RST: u8 = 0x04;
    pub const PSH: u8 = 0x08;
    pub const ACK: u8 = 0x10;
    pub const URG: u8 = 0x20;
    pub const ECE: u8 = 0x40;
    pub const CWR: u8 = 0x80;
}

/// Option kinds.
pub mod option_kind {
    pub const END: u8 = 0;
    pub const NOP: u8 = 1;
    pub const MSS: u8 = 2;
    pub const WINDOW_SCALE: u8 = 3;
    pub const SACK_PERMITTED: u8 = 4;
    pub const SACK: u8 = 5;
    pub const TIMESTAMPS: u8 = 8;
}

mod field {
    use core::ops::Range;
    pub const SRC_PORT: Range<usize> = 0..2;
    pub const DST_PORT: Range<usize> = 2..4;
    pub const SEQ_NUM: Range<usize> = 4..8;
    pub const ACK_NUM: Range<usize> = 8..12;
    pub const DATA_OFF: usize = 12;
    pub const FLAGS: usize = 13;
    pub const WIN_SIZE: Range<usize> = 14..16;
    pub const CHECKSUM: Range<usize> = 16..18;
    pub const URGENT: Range<usize> = 18..20;
}

/// A view of a TCP segment. The segment runs to the end of the buffer: slice the
/// buffer to the IP payload before wrapping it.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps a buffer after checking that the data offset covers the fixed header and
    /// that the header with options fits in the buffer.
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
        let hl = self.header_len();
        if hl < HEADER_LEN {
            return Err(WireError::Malformed("tcp data offset below 5"));
        }
        if hl > len {
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

    pub fn seq_number(&self) -> u32 {
        bytes::get_u32(self.buffer.as_ref(), field::SEQ_NUM)
    }

    pub fn ack_number(&self) -> u32 {
        bytes::get_u32(self.buffer.as_ref(), field::ACK_NUM)
    }

    /// Header length in bytes (data offset * 4).
    pub fn header_len(&self) -> usize {
        ((self.buffer.as_ref()[field::DATA_OFF] >> 4) as usize) * 4
    }

    /// The flags byte; test with the [`flags`] constants.
    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS]
    }

    pub fn window_len(&self) -> u16 {
        bytes::get_u16(self.buffer.as_ref(), field::WIN_SIZE)
    }

    pub fn checksum(&self) -> u16 {
        bytes::get_u16(self.buffer.as_ref(), field::CHECKSUM)
    }

    pub fn urgent_at(&self) -> u16 {
        bytes::get_u16(self.buffer.as_ref(), field::URGENT)
    }

    /// The raw options bytes.
    pub fn options(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..self.header_len()]
    }

    /// Iterates over the options.
    pub fn option_iter(&self) -> OptionIter<'_> {
        OptionIter::new(self.options())
    }

    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..]
    }

    /// True if the checksum over the pseudo-header and the whole buffer is valid.
    pub fn verify_checksum_v4(&self, src: Ipv4Addr, dst: Ipv4Addr) -> bool {
        let b = self.buffer.as_ref();
        let acc = checksum::pseudo_header_v4(src, dst, protocol::TCP, b.len() as u32);
        checksum::fold(checksum::sum(b, acc)) == 0xffff
    }

    pub fn verify_checksum_v6(&self, src: Ipv6Addr, dst: Ipv6Addr) -> bool {
        let b = self.buffer.as_ref();
        let acc = checksum::pseudo_header_v6(src, dst, protocol::TCP, b.len() as u32);
        checksum::fold(checksum::sum(b, acc)) == 0xffff
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_src_port(&mut self, v: u16) {
        bytes::set_u16(self.buffer.as_mut(), field::SRC_PORT, v);
    }

    pub fn set_dst_port(&mut self, v: u16) {
        bytes::set_u16(self.buffer.as_mut(), field::DST_PORT, v);
    }

    pub fn set_seq_number(&mut self, v: u32) {
        bytes::set_u32(self.buffer.as_mut(), field::SEQ_NUM, v);
    }

    pub fn set_ack_number(&mut self, v: u32) {
        bytes::set_u32(self.buffer.as_mut(), field::ACK_NUM, v);
    }

    /// Sets the data offset from a header length in bytes (a multiple of 4, 20..=60).
    pub fn set_header_len(&mut self, len: usize) {
        let b = &mut self.buffer.as_mut()[field::DATA_OFF];
        *b = (((len / 4) as u8) << 4) | (*b & 0x0f);
    }

    pub fn set_flags(&mut self, v: u8) {
        self.buffer.as_mut()[field::FLAGS] = v;
    }

    pub fn set_window_len(&mut self, v: u16) {
        bytes::set_u16(self.buffer.as_mut(), field::WIN_SIZE, v);
    }

    pub fn set_checksum(&mut self, v: u16) {
        bytes::set_u16(self.buffer.as_mut(), field::CHECKSUM, v);
    }

    pub fn set_urgent_at(&mut self, v: u16) {
        bytes::set_u16(self.buffer.as_mut(), field::URGENT, v);
    }

    pub fn options_mut(&mut self) -> &mut [u8] {
        let hl = self.header_len();
        &mut self.buffer.as_mut()[HEADER_LEN..hl]
    }

    pub fn payload_mut(&mut self) -> &mut [u8] {
        let hl = self.header_len();
        &mut self.buffer.as_mut()[hl..]
    }

    /// Computes the checksum over the pseudo-header and the whole buffer.
    pub fn fill_checksum_v4(&mut self, src: Ipv4Addr, dst: Ipv4Addr) {
        self.set_checksum(0);
        let b = self.buffer.as_ref();
        let acc = checksum::pseudo_header_v4(src, dst, protocol::TCP, b.len() as u32);
        let c = !checksum::fold(checksum::sum(b, acc));
        self.set_checksum(c);
    }

    pub fn fill_checksum_v6(&mut self, src: Ipv6Addr, dst: Ipv6Addr) {
        self.set_checksum(0);
        let b = self.buffer.as_ref();
        let acc = checksum::pseudo_header_v6(src, dst, protocol::TCP, b.len() as u32);
        let c = !checksum::fold(checksum::sum(b, acc));
        self.set_checksum(c);
    }

    /// Lowers an MSS option above `max` to `max` in place, patching the checksum
    /// incrementally (RFC 1624). Returns the MSS the option held before, if there was
    /// one. Malformed options are left alone (the walk stops at them).
    pub fn clamp_mss(&mut self, max: u16) -> Option<u16> {
        let hl = self.header_len();
        let mut off = HEADER_LEN;
        let mut found = None;
        // Find the option's offset first (immutable walk), then patch.
        for opt in OptionIter::new(&self.buffer.as_ref()[HEADER_LEN..hl]) {
            match opt {
                Ok((TcpOption::Mss(m), _)) => {
                    found = Some((off, m));
                    break;
                }
                Ok((_, len)) => off += len,
                Err(_) => break,
            }
        }
        let (at, old) = found?;
        if old > max {
            // The option's value sits at an even offset from the header start only when
            // `at` is even; RFC 1624 needs aligned words, so patch the whole 4-byte
            // option as two aligned byte pairs when it is odd.
            let old_bytes = [option_kind::MSS, 4, (old >> 8) as u8, old as u8];
            let new_bytes = [option_kind::MSS, 4, (max >> 8) as u8, max as u8];
            let check = if at % 2 == 0 {
                checksum::update(self.checksum(), &old_bytes, &new_bytes)
            } else {
                // Surround with the neighbouring bytes so the words are aligned.
                let b = self.buffer.as_ref();
                let (prev, next) = (b[at - 1], b[at + 4]);
                let old6 = [
                    prev,
                    old_bytes[0],
                    old_bytes[1],
                    old_bytes[2],
                    old_bytes[3],
                    next,
                ];
                let new6 = [
                    prev,
                    new_bytes[0],
                    new_bytes[1],
                    new_bytes[2],
                    new_bytes[3],
                    next,
                ];
                checksum::update(self.checksum(), &old6, &new6)
            };
            self.buffer.as_mut()[at + 2..at + 4].copy_from_slice(&max.to_be_bytes());
            self.set_checksum(check);
        }
        Some(old)
    }
}

/// One TCP option.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TcpOption<'a> {
    EndOfList,
    NoOperation,
    Mss(u16),
    WindowScale(u8),
    SackPermitted,
    /// Raw SACK blocks (pairs of left/right edges), 8 bytes each.
    Sack(&'a [u8]),
    Timestamps {
        tsval: u32,
        tsecr: u32,
    },
    Unknown {
        kind: u8,
        data: &'a [u8],
    },
}

impl TcpOption<'_> {
    /// Bytes this option takes when emitted.
    pub fn buffer_len(&self) -> usize {
        match self {
            TcpOption::EndOfList | TcpOption::NoOperation => 1,
            TcpOption::Mss(_) => 4,
            TcpOption::WindowScale(_) => 3,
            TcpOption::SackPermitted => 2,
            TcpOption::Sack(d) => 2 + d.len(),
            TcpOption::Timestamps { .. } => 10,
            TcpOption::Unknown { data, .. } => 2 + data.len(),
        }
    }

    /// Writes the option at the start of `buf`, returning its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        let len = self.buffer_len();
        let b = buf.get_mut(..len).ok_or(WireError::Truncated)?;
        let kl = |kind: u8| [kind, len as u8];
        match *self {
            TcpOption::EndOfList => b[0] = option_kind::END,
            TcpOption::NoOperation => b[0] = option_kind::NOP,
            TcpOption::Mss(m) => {
                b[..2].copy_from_slice(&kl(option_kind::MSS));
                b[2..].copy_from_slice(&m.to_be_bytes());
            }
            TcpOption::WindowScale(s) => {
                b[..2].copy_from_slice(&kl(option_kind::WINDOW_SCALE));
                b[2] = s;
            }
            TcpOption::SackPermitted => b.copy_from_slice(&kl(option_kind::SACK_PERMITTED)),
            TcpOption::Sack(d) => {
                b[..2].copy_from_slice(&kl(option_kind::SACK));
                b[2..].copy_from_slice(d);
            }
            TcpOption::Timestamps { tsval, tsecr } => {
                b[..2].copy_from_slice(&kl(option_kind::TIMESTAMPS));
                b[2..6].copy_from_slice(&tsval.to_be_bytes());
                b[6..].copy_from_slice(&tsecr.to_be_bytes());
            }
            TcpOption::Unknown { kind, data } => {
                b[..2].copy_from_slice(&kl(kind));
                b[2..].copy_from_slice(data);
            }
        }
        Ok(len)
    }
}

/// Iterator over TCP options, yielding each option with the bytes it took.
///
/// Stops after End of Option List or the first error: once one length is wrong the
/// rest cannot be framed.
pub struct OptionIter<'a> {
    rest: &'a [u8],
    done: bool,
}

impl<'a> OptionIter<'a> {
    pub fn new(options: &'a [u8]) -> OptionIter<'a> {
        OptionIter {
            rest: options,
            done: false,
        }
    }

    fn next_option(&mut self) -> Result<(TcpOption<'a>, usize)> {
        let kind = self.rest[0];
        match kind {
            option_kind::END => {
                self.done = true;
                return Ok((TcpOption::EndOfList, 1));
            }
            option_kind::NOP => {
                self.rest = &self.rest[1..];
                return Ok((TcpOption::NoOperation, 1));
            }
            _ => {}
        }
        let len = *self
            .rest
            .get(1)
            .ok_or(WireError::Malformed("tcp option without length"))? as usize;
        if len < 2 {
            return Err(WireError::Malformed("tcp option length below 2"));
        }
        let opt = self
            .rest
            .get(..len)
            .ok_or(WireError::Malformed("tcp option longer than the header"))?;
        let data = &opt[2..];
        let parsed = match (kind, len) {
            (option_kind::MSS, 4) => TcpOption::Mss(u16::from_be_bytes([data[0], data[1]])),
            (option_kind::MSS, _) => return Err(WireError::Malformed("tcp mss option length")),
            (option_kind::WINDOW_SCALE, 3) => TcpOption::WindowScale(data[0]),
            (option_kind::WINDOW_SCALE, _) => {
                return Err(WireError::Malformed("tcp window scale option length"))
            }
            (option_kind::SACK_PERMITTED, 2) => TcpOption::SackPermitted,
            (option_kind::SACK_PERMITTED, _) => {
                return Err(WireError::Malformed("tcp sack-permitted option length"))
            }
            (option_kind::SACK, l) if l >= 10 && (l - 2) % 8 == 0 => TcpOption::Sack(data),
            (option_kind::SACK, _) => return Err(WireError::Malformed("tcp sack option length")),
            (option_kind::TIMESTAMPS, 10) => TcpOption::Timestamps {
                tsval: u32::from_be_bytes([data[0], data[1], data[2], data[3]]),
                tsecr: u32::from_be_bytes([data[4], data[5], data[6], data[7]]),
            },
            (option_kind::TIMESTAMPS, _) => {
                return Err(WireError::Malformed("tcp timestamps option length"))
            }
            (kind, _) => TcpOption::Unknown { kind, data },
        };
        self.rest = &self.rest[len..];
        Ok((parsed, len))
    }
}

impl<'a> Iterator for OptionIter<'a> {
    type Item = Result<(TcpOption<'a>, usize)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done || self.rest.is_empty() {
            return None;
        }
        let r = self.next_option();
        if r.is_err() {
            self.done = true;
        }
        Some(r)
    }
}

/// A TCP header with the options the datapath understands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Repr {
    pub src_port: u16,
    pub dst_port: u16,
    pub seq_number: u32,
    pub ack_number: u32,
    pub flags: u8,
    pub window_len: u16,
    pub urgent_at: u16,
    pub mss: Option<u16>,
    pub window_scale: Option<u8>,
    pub sack_permitted: bool,
    pub timestamps: Option<(u32, u32)>,
}

impl Repr {
    /// Reads the header and its known options (NOP, EOL, SACK blocks and unknown
    /// options are skipped); a malformed option is an error.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Repr> {
        p.check_len()?;
        let mut r = Repr {
            src_port: p.src_port(),
            dst_port: p.dst_port(),
            seq_number: p.seq_number(),
            ack_number: p.ack_number(),
            flags: p.flags(),
            window_len: p.window_len(),
            urgent_at: p.urgent_at(),
            mss: None,
            window_scale: None,
            sack_permitted: false,
            timestamps: None,
        };
        for opt in p.option_iter() {
            match opt?.0 {
                TcpOption::Mss(m) => r.mss = Some(m),
                TcpOption::WindowScale(s) => r.window_scale = Some(s),
                TcpOption::SackPermitted => r.sack_permitted = true,
                TcpOption::Timestamps { tsval, tsecr } => r.timestamps = Some((tsval, tsecr)),
                _ => {}
            }
        }
        Ok(r)
    }

    /// Bytes of options before padding.
    fn options_len(&self) -> usize {
        let mut n = 0;
        if self.mss.is_some() {
            n += 4;
        }
        if self.window_scale.is_some() {
            n += 4; // NOP + 3
        }
        if self.sack_permitted {
            n += 2;
        }
        if self.timestamps.is_some() {
            n += 10;
        }
        n
    }

    /// Header length with options, padded to 4 bytes.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN + self.options_len().div_ceil(4) * 4
    }

    /// Writes the header (checksum zero; fill it after the payload is in place).
    /// Options go in Linux's SYN order: MSS, SACK-permitted + timestamps, NOP +
    /// window scale; padding is End of Option List bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) -> Result<()> {
        let hl = self.buffer_len();
        let buf = p.buffer.as_mut();
        if buf.len() < hl {
            return Err(WireError::Truncated);
        }
        buf[..hl].fill(0);
        p.set_src_port(self.src_port);
        p.set_dst_port(self.dst_port);
        p.set_seq_number(self.seq_number);
        p.set_ack_number(self.ack_number);
        p.set_header_len(hl);
        p.set_flags(self.flags);
        p.set_window_len(self.window_len);
        p.set_urgent_at(self.urgent_at);
        let opts = &mut p.buffer.as_mut()[HEADER_LEN..hl];
        let mut at = 0;
        if let Some(m) = self.mss {
            at += TcpOption::Mss(m).emit(&mut opts[at..])?;
        }
        if self.sack_permitted {
            at += TcpOption::SackPermitted.emit(&mut opts[at..])?;
        }
        if let Some((tsval, tsecr)) = self.timestamps {
            at += TcpOption::Timestamps { tsval, tsecr }.emit(&mut opts[at..])?;
        }
        if let Some(s) = self.window_scale {
            at += TcpOption::NoOperation.emit(&mut opts[at..])?;
            TcpOption::WindowScale(s).emit(&mut opts[at..])?;
        }
        Ok(())
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TCP src={} dst={}", self.src_port, self.dst_port)?;
        for (bit, name) in [
            (flags::SYN, " syn"),
            (flags::ACK, " ack"),
            (flags::FIN, " fin"),
            (flags::RST, " rst"),
            (flags::PSH, " psh"),
        ] {
            if self.flags & bit != 0 {
                write!(f, "{name}")?;
            }
        }
        write!(
            f,
            " seq={} ack={} win={}",
            self.seq_number, self.ack_number, self.window_len
        )?;
        if let Some(m) = self.mss {
            write!(f, " mss={m}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A Linux SYN, 10.0.0.1:40000 -> 10.0.0.2:80: MSS 1460, SACK-permitted,
    // timestamps 0x01020304/0, NOP, window scale 7 (checksum from scapy).
    static SYN_BYTES: [u8; 40] = [
        0x9c, 0x40, 0x00, 0x50, 0x00, 0x00, 0x03, 0xe8, 0x00, 0x00, 0x00, 0x00, 0xa0, 0x02, 0xfa,
        0xf0, 0x00, 0x00, 0x00, 0x00, 0x02, 0x04, 0x05, 0xb4, 0x04, 0x02, 0x08, 0x0a, 0x01, 0x02,
        0x03, 0x04, 0x00, 0x00, 0x00, 0x00, 0x01, 0x03, 0x03, 0x07,
    ];
    const SRC: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
    const DST: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

    fn syn() -> [u8; 40] {
        let mut b = SYN_BYTES;
        Packet::new_unchecked(&mut b[..]).fill_checksum_v4(SRC, DST);
        b
    }

    #[test]
    fn deconstruct() {
        let b = syn();
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.src_port(), 40000);
        assert_eq!(p.dst_port(), 80);
        assert_eq!(p.seq_number(), 1000);
        assert_eq!(p.ack_number(), 0);
        assert_eq!(p.header_len(), 40);
        assert_eq!(p.flags(), flags::SYN);
        assert_eq!(p.window_len(), 64240);
        assert!(p.verify_checksum_v4(SRC, DST));
        assert!(p.payload().is_empty());
        let opts: Vec<_> = p.option_iter().map(|o| o.unwrap().0).collect();
        assert_eq!(
            opts,
            vec![
                TcpOption::Mss(1460),
                TcpOption::SackPermitted,
                TcpOption::Timestamps {
                    tsval: 0x01020304,
                    tsecr: 0
                },
                TcpOption::NoOperation,
                TcpOption::WindowScale(7),
            ]
        );
    }

    #[test]
    fn parse_emit_round_trip() {
        let b = syn();
        let repr = Repr::parse(&Packet::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(repr.mss, Some(1460));
        assert_eq!(repr.window_scale, Some(7));
        assert!(repr.sack_permitted);
        assert_eq!(repr.timestamps, Some((0x01020304, 0)));
        assert_eq!(repr.buffer_len(), 40);
        let mut out = [0xffu8; 40];
        let mut p = Packet::new_unchecked(&mut out[..]);
        repr.emit(&mut p).unwrap();
        p.fill_checksum_v4(SRC, DST);
        assert_eq!(out, b);
        assert_eq!(
            repr.to_string(),
            "TCP src=40000 dst=80 syn seq=1000 ack=0 win=64240 mss=1460"
        );
    }

    #[test]
    fn malformed_options() {
        let cases: [(&[u8], &str); 7] = [
            (&[2, 3, 5], "tcp mss option length"),
            (&[3, 4, 7, 0], "tcp window scale option length"),
            (&[4, 3, 0], "tcp sack-permitted option length"),
            (&[8, 8, 0, 0, 0, 0, 0, 0], "tcp timestamps option length"),
            (&[5, 6, 0, 0, 0, 0], "tcp sack option length"),
            (&[99, 1], "tcp option length below 2"),
            (&[99, 9, 0, 0], "tcp option longer than the header"),
        ];
        for (opts, what) in cases {
            let r: Vec<_> = OptionIter::new(opts).collect();
            assert_eq!(r, vec![Err(WireError::Malformed(what))], "{opts:?}");
        }
        assert_eq!(
            OptionIter::new(&[1, 30]).collect::<Vec<_>>(),
            vec![
                Ok((TcpOption::NoOperation, 1)),
                Err(WireError::Malformed("tcp option without length"))
            ]
        );
        // EOL ends the list even when bytes follow.
        assert_eq!(
            OptionIter::new(&[0, 2, 4, 5, 0xb4]).collect::<Vec<_>>(),
            vec![Ok((TcpOption::EndOfList, 1))]
        );
        // Unknown options are carried with their data.
        assert_eq!(
            OptionIter::new(&[30, 4, 0xaa, 0xbb]).collect::<Vec<_>>(),
            vec![Ok((
                TcpOption::Unknown {
                    kind: 30,
                    data: &[0xaa, 0xbb]
                },
                4
            ))]
        );
        // A malformed option makes Repr::parse fail.
        let mut b = syn();
        b[21] = 5;
        assert_eq!(
            Repr::parse(&Packet::new_checked(&b[..]).unwrap()),
            Err(WireError::Malformed("tcp mss option length"))
        );
    }

    #[test]
    fn header_checks() {
        let b = syn();
        assert_eq!(
            Packet::new_checked(&b[..19]).unwrap_err(),
            WireError::Truncated
        );
        assert_eq!(
            Packet::new_checked(&b[..39]).unwrap_err(),
            WireError::Truncated
        );
        let mut bad = b;
        bad[12] = 0x40;
        assert_eq!(
            Packet::new_checked(&bad[..]).unwrap_err(),
            WireError::Malformed("tcp data offset below 5")
        );
    }

    #[test]
    fn clamp_mss_patches_checksum() {
        // Even offset (MSS first) and odd offset (after one NOP).
        for lead_nop in [false, true] {
            let repr = Repr {
                src_port: 1,
                dst_port: 2,
                seq_number: 3,
                ack_number: 0,
                flags: flags::SYN,
                window_len: 100,
                urgent_at: 0,
                mss: None,
                window_scale: None,
                sack_permitted: false,
                timestamps: None,
            };
            let mut b = [0u8; 28];
            let mut p = Packet::new_unchecked(&mut b[..]);
            repr.emit(&mut p).unwrap();
            p.set_header_len(28);
            let opts: &[u8] = if lead_nop {
                &[1, 2, 4, 0x23, 0x28, 1, 1, 1]
            } else {
                &[2, 4, 0x23, 0x28, 1, 1, 1, 1]
            };
            p.options_mut().copy_from_slice(opts);
            p.fill_checksum_v4(SRC, DST);
            assert_eq!(p.clamp_mss(8870), Some(9000));
            assert!(p.verify_checksum_v4(SRC, DST), "lead_nop={lead_nop}");
            assert_eq!(Repr::parse(&p).unwrap().mss, Some(8870));
            // Already below: untouched.
            assert_eq!(p.clamp_mss(9000), Some(8870));
            assert_eq!(Repr::parse(&p).unwrap().mss, Some(8870));
        }
    }
}
