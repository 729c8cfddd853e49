//! A pcapng writer for `xdeadm capture`: one Section Header Block, one Interface
//! Description Block (Ethernet, nanosecond timestamps), then one Enhanced Packet
//! Block per frame with its direction (`epb_flags`) and, for a frame the datapath
//! dropped, why (`opt_comment`). Format: draft-ietf-opsawg-pcapng; every block and
//! option is padded to 32 bits and option lists end with `opt_endofopt`.
//!
//! pcapng rather than pcap because pcap has nowhere to put a direction or a
//! comment per packet; tshark and tcpdump (libpcap >= 1.1) read it. Written in host
//! byte order, which the Section Header Block's byte-order magic announces.

use std::io::{self, Write};

const SHB: u32 = 0x0A0D_0D0A;
const IDB: u32 = 0x0000_0001;
const EPB: u32 = 0x0000_0006;
const BYTE_ORDER_MAGIC: u32 = 0x1A2B_3C4D;
const LINKTYPE_ETHERNET: u16 = 1;

const OPT_ENDOFOPT: u16 = 0;
const OPT_COMMENT: u16 = 1;
const IF_NAME: u16 = 2;
const IF_TSRESOL: u16 = 9;
const EPB_FLAGS: u16 = 2;

/// `epb_flags` bits 0-1: the packet's direction on the interface.
const FLAG_INBOUND: u32 = 1;
const FLAG_OUTBOUND: u32 = 2;

/// A packet's direction, as `epb_flags` records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Inbound,
    Outbound,
}

/// One packet to write.
#[derive(Clone, Copy, Debug)]
pub struct Packet<'a> {
    /// Nanoseconds since the Unix epoch.
    pub unix_ns: u64,
    /// Its length on the wire (`data` may be shorter: cut at the snapshot length).
    pub orig_len: u32,
    pub data: &'a [u8],
    pub direction: Direction,
    pub comment: Option<&'a str>,
}

/// Writes pcapng to `W`, one interface (id 0).
pub struct PcapngWriter<W: Write> {
    out: W,
    snaplen: u32,
    /// The block being built, kept for its capacity.
    block: Vec<u8>,
}

impl<W: Write> PcapngWriter<W> {
    /// Writes the section header and the description of interface `if_name`, whose
    /// packets are cut at `snaplen` bytes.
    pub fn new(out: W, if_name: &str, snaplen: u32) -> io::Result<PcapngWriter<W>> {
        let mut w = PcapngWriter {
            out,
            snaplen,
            block: Vec::new(),
        };
        // Section Header Block: byte-order magic, version 1.0, section length
        // unknown (-1), no options.
        let mut body = Vec::with_capacity(16);
        body.extend_from_slice(&BYTE_ORDER_MAGIC.to_ne_bytes());
        body.extend_from_slice(&1u16.to_ne_bytes());
        body.extend_from_slice(&0u16.to_ne_bytes());
        body.extend_from_slice(&u64::MAX.to_ne_bytes());
        w.write_block(SHB, &body)?;
        let mut body = Vec::new();
        body.extend_from_slice(&LINKTYPE_ETHERNET.to_ne_bytes());
        body.extend_from_slice(&0u16.to_ne_bytes());
        body.extend_from_slice(&snaplen.to_ne_bytes());
        option(&mut body, IF_NAME, if_name.as_bytes());
        // Timestamps in units of 10^-9 s.
        option(&mut body, IF_TSRESOL, &[9]);
        option(&mut body, OPT_ENDOFOPT, &[]);
        w.write_block(IDB, &body)?;
        Ok(w)
    }

    /// Writes one Enhanced Packet Block; data beyond the snapshot length is cut.
    pub fn packet(&mut self, p: &Packet<'_>) -> io::Result<()> {
        let data = p.data.get(..self.snaplen as usize).unwrap_or(p.data);
        let mut body = std::mem::take(&mut self.block);
        body.clear();
        body.extend_from_slice(&0u32.to_ne_bytes()); // interface id
        body.extend_from_slice(&((p.unix_ns >> 32) as u32).to_ne_bytes());
        body.extend_from_slice(&(p.unix_ns as u32).to_ne_bytes());
        // At most the snapshot length, a u32.
        body.extend_from_slice(&(data.len() as u32).to_ne_bytes());
        body.extend_from_slice(&p.orig_len.max(data.len() as u32).to_ne_bytes());
        body.extend_from_slice(data);
        pad(&mut body);
        let flags = match p.direction {
            Direction::Inbound => FLAG_INBOUND,
            Direction::Outbound => FLAG_OUTBOUND,
        };
        option(&mut body, EPB_FLAGS, &flags.to_ne_bytes());
        if let Some(c) = p.comment {
            option(&mut body, OPT_COMMENT, c.as_bytes());
        }
        option(&mut body, OPT_ENDOFOPT, &[]);
        let r = self.write_block(EPB, &body);
        self.block = body;
        r
    }

    /// Flushes and gives the output back.
    pub fn finish(mut self) -> io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }

    /// A block: type, total length, `body` (already padded), total length again.
    fn write_block(&mut self, kind: u32, body: &[u8]) -> io::Result<()> {
        let total = u32::try_from(body.len() + 12)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "pcapng block too long"))?;
        self.out.write_all(&kind.to_ne_bytes())?;
        self.out.write_all(&total.to_ne_bytes())?;
        self.out.write_all(body)?;
        self.out.write_all(&total.to_ne_bytes())
    }
}

/// Appends an option (code, length, value padded to 32 bits). Values longer than
/// an option can say are cut: they are names and comments this crate makes.
fn option(buf: &mut Vec<u8>, code: u16, value: &[u8]) {
    let value = value.get(..usize::from(u16::MAX)).unwrap_or(value);
    buf.extend_from_slice(&code.to_ne_bytes());
    buf.extend_from_slice(&(value.len() as u16).to_ne_bytes());
    buf.extend_from_slice(value);
    pad(buf);
}

fn pad(buf: &mut Vec<u8>) {
    buf.resize(buf.len().next_multiple_of(4), 0);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn u32_at(b: &[u8], at: usize) -> u32 {
        u32::from_ne_bytes(b[at..at + 4].try_into().unwrap())
    }

    /// The file's blocks as (type, body), checking that each block's two length
    /// fields agree and are multiples of 4.
    fn blocks(mut b: &[u8]) -> Vec<(u32, Vec<u8>)> {
        let mut v = Vec::new();
        while !b.is_empty() {
            let (kind, total) = (u32_at(b, 0), u32_at(b, 4) as usize);
            assert_eq!(total % 4, 0);
            assert_eq!(u32_at(b, total - 4) as usize, total);
            v.push((kind, b[8..total - 4].to_vec()));
            b = &b[total..];
        }
        v
    }

    fn sample() -> Vec<u8> {
        let mut w = PcapngWriter::new(Vec::new(), "opte0", 64).unwrap();
        let frame: Vec<u8> = (0..61u8).collect();
        w.packet(&Packet {
            unix_ns: 1_700_000_000_123_456_789,
            orig_len: 61,
            data: &frame,
            direction: Direction::Outbound,
            comment: Some("out dropped: no_v2p"),
        })
        .unwrap();
        let long = vec![7u8; 100];
        w.packet(&Packet {
            unix_ns: 1_700_000_001_000_000_000,
            orig_len: 100,
            data: &long,
            direction: Direction::Inbound,
            comment: None,
        })
        .unwrap();
        w.finish().unwrap()
    }

    #[test]
    fn blocks_are_padded_and_packets_cut_at_the_snapshot_length() {
        let b = sample();
        let bl = blocks(&b);
        let kinds: Vec<u32> = bl.iter().map(|(k, _)| *k).collect();
        assert_eq!(kinds, [SHB, IDB, EPB, EPB]);
        assert_eq!(u32_at(&bl[0].1, 0), BYTE_ORDER_MAGIC);
        assert_eq!(u32_at(&bl[1].1, 4), 64, "snaplen");
        let first = &bl[2].1;
        let ns = (u64::from(u32_at(first, 4)) << 32) | u64::from(u32_at(first, 8));
        assert_eq!(ns, 1_700_000_000_123_456_789);
        assert_eq!((u32_at(first, 12), u32_at(first, 16)), (61, 61));
        // 61 bytes padded to 64, then epb_flags (outbound).
        assert_eq!(&first[20 + 64..20 + 68], &[2, 0, 4, 0]);
        assert_eq!(u32_at(first, 20 + 68), FLAG_OUTBOUND);
        let cut = &bl[3].1;
        assert_eq!((u32_at(cut, 12), u32_at(cut, 16)), (64, 100));
        assert_eq!(u32_at(cut, 20 + 64 + 4), FLAG_INBOUND);
    }

    /// tshark, when installed, reads the file with the direction and comment.
    #[test]
    fn tshark_reads_direction_and_comment() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.pcapng");
        std::fs::write(&path, sample()).unwrap();
        let out = match Command::new("tshark")
            .arg("-r")
            .arg(&path)
            .args(["-T", "fields", "-e", "frame.p2p_dir", "-e", "frame.comment"])
            .args(["-e", "frame.len", "-e", "frame.cap_len"])
            .output()
        {
            Ok(o) => o,
            Err(e) => {
                eprintln!("tshark not run ({e}): skipped");
                return;
            }
        };
        assert!(out.status.success(), "{out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert_eq!(lines[0], "0\tout dropped: no_v2p\t61\t61", "{text}");
        assert_eq!(lines[1], "1\t\t100\t64", "{text}");
    }
}
