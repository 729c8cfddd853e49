//! Reading the frames of a classic pcap file (what `tcpdump -w` writes) as raw bytes,
//! for checks tshark's decoded fields cannot make: which counter the XDP program
//! bumped for a malformed frame, whether a payload carries a hostile marker.

use crate::{Context, Error, Result};
use std::path::Path;
use std::time::{Duration, SystemTime};

/// One captured frame: when, the bytes kept (up to the snap length) and the on-wire
/// length.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub time: SystemTime,
    pub data: Vec<u8>,
    pub orig_len: u32,
}

/// Every frame of the pcap file at `path`.
pub fn read(path: &Path) -> Result<Vec<Record>> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    parse(&bytes).with_context(|| format!("pcap file {}", path.display()))
}

/// Parses a whole pcap file: a 24-byte global header whose magic number gives the
/// byte order and the timestamps' unit (micro- or nanoseconds), then records of a
/// 16-byte header (seconds, fraction, bytes kept, bytes on the wire) and the
/// captured bytes. A record cut short at the end (a capture
/// stopped mid-write) is an error, not silently dropped.
pub fn parse(bytes: &[u8]) -> Result<Vec<Record>> {
    let magic = bytes
        .get(..4)
        .ok_or_else(|| Error::new(format!("{} bytes: no pcap header", bytes.len())))?;
    // (little-endian, nanosecond timestamps) by magic number.
    let (little, nanos) = match magic {
        [0xd4, 0xc3, 0xb2, 0xa1] => (true, false),
        [0x4d, 0x3c, 0xb2, 0xa1] => (true, true),
        [0xa1, 0xb2, 0xc3, 0xd4] => (false, false),
        [0xa1, 0xb2, 0x3c, 0x4d] => (false, true),
        _ => {
            return Err(Error::new(format!(
                "magic number {magic:02x?} is not pcap's"
            )))
        }
    };
    let u32_at = |off: usize| -> Result<u32> {
        let b: [u8; 4] = bytes
            .get(off..off + 4)
            .and_then(|s| s.try_into().ok())
            .ok_or_else(|| Error::new(format!("cut short at byte {off}")))?;
        Ok(if little {
            u32::from_le_bytes(b)
        } else {
            u32::from_be_bytes(b)
        })
    };
    let mut records = Vec::new();
    let mut off = 24;
    while off < bytes.len() {
        let secs = Duration::from_secs(u64::from(u32_at(off)?));
        let frac = u64::from(u32_at(off + 4)?);
        let frac = Duration::from_nanos(if nanos { frac } else { frac * 1000 });
        let incl = u32_at(off + 8)? as usize;
        let orig_len = u32_at(off + 12)?;
        let start = off + 16;
        let data = bytes.get(start..start + incl).ok_or_else(|| {
            Error::new(format!(
                "record {} at byte {off} claims {incl} bytes, {} remain",
                records.len(),
                bytes.len().saturating_sub(start)
            ))
        })?;
        records.push(Record {
            time: SystemTime::UNIX_EPOCH + secs + frac,
            data: data.to_vec(),
            orig_len,
        });
        off = start + incl;
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(little: bool, frames: &[&[u8]]) -> Vec<u8> {
        let w = |v: u32| {
            if little {
                v.to_le_bytes()
            } else {
                v.to_be_bytes()
            }
        };
        let mut f = w(0xa1b2_c3d4).to_vec();
        f.extend_from_slice(&[0; 20]);
        for fr in frames {
            f.extend_from_slice(&w(1_700_000_000));
            f.extend_from_slice(&w(250_000));
            f.extend_from_slice(&w(fr.len() as u32));
            f.extend_from_slice(&w(fr.len() as u32 + 100));
            f.extend_from_slice(fr);
        }
        f
    }

    #[test]
    fn reads_both_byte_orders() {
        for little in [true, false] {
            let r = parse(&file(little, &[b"abc", b"", b"defg"])).unwrap();
            assert_eq!(r.len(), 3);
            assert_eq!(r[2].data, b"defg");
            assert_eq!(r[2].orig_len, 104);
            let t = SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_250);
            assert_eq!(r[0].time, t);
        }
    }

    #[test]
    fn refuses_garbage_and_cut_records() {
        assert!(parse(b"xy").is_err());
        assert!(parse(&[0u8; 24]).unwrap_err().0.contains("magic"));
        let mut f = file(true, &[b"abcdef"]);
        f.truncate(f.len() - 2);
        let e = parse(&f).unwrap_err();
        assert!(e.0.contains("claims 6 bytes, 4 remain"), "{e}");
    }
}
