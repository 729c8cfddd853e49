//! Domain names in DNS wire format (RFC 1035 §3.1), as DHCP carries lists of them:
//! DHCPv4's domain search option 119 (RFC 3397) and DHCPv6's domain list option 24
//! (RFC 3646). Both are a sequence of names, each a run of length-prefixed labels
//! ending in a zero byte; one module so that both options encode a name the same way.
//!
//! Names are written uncompressed (RFC 3397 lets a server compress, never makes it);
//! [`parse_names`] follows RFC 3397's compression pointers all the same, since it is
//! also the decoder the tests check what we send with.

use crate::{Result, WireError};

/// The longest label (RFC 1035 §2.3.4).
pub const MAX_LABEL: usize = 63;
/// The longest name on the wire, length bytes and final zero included.
pub const MAX_NAME: usize = 255;

/// The labels of `name`, a trailing dot (the root) ignored.
fn labels(name: &str) -> impl Iterator<Item = &str> {
    name.strip_suffix('.').unwrap_or(name).split('.')
}

/// Encoded length of one name, or why it cannot be encoded: an empty label (`a..b`,
/// an empty name) or one longer than [`MAX_LABEL`], or a name longer than
/// [`MAX_NAME`].
pub fn name_len(name: &str) -> Result<usize> {
    let mut n = 1;
    for l in labels(name) {
        if l.is_empty() || l.len() > MAX_LABEL {
            return Err(WireError::Malformed("dns name label"));
        }
        n += 1 + l.len();
    }
    if n > MAX_NAME {
        return Err(WireError::Malformed("dns name length"));
    }
    Ok(n)
}

/// Encoded length of a list of names, one after the other.
pub fn names_len(names: &[&str]) -> Result<usize> {
    names.iter().map(|n| name_len(n)).sum()
}

/// Writes the names one after the other at the start of `b`, which holds at least
/// [`names_len`] bytes (checked first); returns the bytes written.
pub fn emit_names(b: &mut [u8], names: &[&str]) -> Result<usize> {
    let len = names_len(names)?;
    if b.len() < len {
        return Err(WireError::Truncated);
    }
    let mut at = 0;
    for name in names {
        for l in labels(name) {
            b[at] = l.len() as u8;
            b[at + 1..at + 1 + l.len()].copy_from_slice(l.as_bytes());
            at += 1 + l.len();
        }
        b[at] = 0;
        at += 1;
    }
    Ok(at)
}

/// The most pointers followed in one name: more means a loop.
const MAX_POINTERS: usize = 32;

/// Decodes a list of names (an option's whole value), following compression
/// pointers (two bytes, top bits 11, an offset into `data`) as RFC 3397 allows.
/// Names come back without the trailing dot. A name longer than [`MAX_NAME`] once
/// its pointers are followed is refused: pointers let a few bytes stand for a
/// long name, and a list of such names would otherwise take memory out of all
/// proportion to the input.
pub fn parse_names(data: &[u8]) -> Result<Vec<String>> {
    let mut names = Vec::new();
    let mut at = 0;
    while at < data.len() {
        let (name, next) = parse_name(data, at)?;
        names.push(name);
        at = next;
    }
    Ok(names)
}

/// One name starting at `at`: the name, and where the next one starts.
fn parse_name(data: &[u8], mut at: usize) -> Result<(String, usize)> {
    let mut labels: Vec<&str> = Vec::new();
    let mut resume = None;
    let mut pointers = 0;
    // The encoded length so far: the final zero byte and each label's.
    let mut total = 1;
    loop {
        let len = *data.get(at).ok_or(WireError::Truncated)?;
        match len {
            0 => {
                let next = resume.unwrap_or(at + 1);
                return Ok((labels.join("."), next));
            }
            l if l & 0xc0 == 0xc0 => {
                let low = *data.get(at + 1).ok_or(WireError::Truncated)?;
                pointers += 1;
                if pointers > MAX_POINTERS {
                    return Err(WireError::Malformed("dns name pointer loop"));
                }
                resume.get_or_insert(at + 2);
                at = usize::from(l & 0x3f) << 8 | usize::from(low);
            }
            l if usize::from(l) > MAX_LABEL => {
                return Err(WireError::Malformed("dns name label"));
            }
            l => {
                let end = at + 1 + usize::from(l);
                let label = data.get(at + 1..end).ok_or(WireError::Truncated)?;
                total += 1 + label.len();
                if total > MAX_NAME {
                    return Err(WireError::Malformed("dns name length"));
                }
                // A dot inside a label cannot be told from the one between labels
                // in a name's text form (what a name is here), so it is refused.
                let label = core::str::from_utf8(label)
                    .ok()
                    .filter(|l| !l.contains('.'))
                    .ok_or(WireError::Malformed("dns name label"))?;
                labels.push(label);
                at = end;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_one_after_the_other() {
        let names = ["eng.oxide.internal", "oxide.internal.", "example.com"];
        let len = names_len(&names).unwrap();
        assert_eq!(len, 20 + 16 + 13);
        let mut b = vec![0u8; len];
        assert_eq!(emit_names(&mut b, &names).unwrap(), len);
        assert!(b.starts_with(b"\x03eng\x05oxide\x08internal\x00\x05oxide"));
        assert_eq!(
            parse_names(&b).unwrap(),
            ["eng.oxide.internal", "oxide.internal", "example.com"]
        );
        assert_eq!(
            emit_names(&mut b[..len - 1], &names),
            Err(WireError::Truncated)
        );
    }

    /// RFC 3397 §3's example: "eng.apple.com." and "marketing.apple.com.", the
    /// second ending in a pointer to "apple.com." in the first.
    #[test]
    fn compression_pointers_are_followed() {
        let data = b"\x03eng\x05apple\x03com\x00\x09marketing\xc0\x04";
        assert_eq!(
            parse_names(data).unwrap(),
            ["eng.apple.com", "marketing.apple.com"]
        );
        // A label with a dot in it (found by the dns_names fuzz target: it came
        // back as two labels).
        assert_eq!(
            parse_names(b"\x03a.b\x00"),
            Err(WireError::Malformed("dns name label"))
        );
        let looped = b"\x03eng\xc0\x00";
        assert_eq!(
            parse_names(looped),
            Err(WireError::Malformed("dns name pointer loop"))
        );
        assert_eq!(parse_names(b"\x03en"), Err(WireError::Truncated));
        // Pointers that spell out a name longer than 255 bytes: refused.
        let mut long = b"\x3f".to_vec();
        long.extend_from_slice(&[b'x'; 63]);
        long.extend_from_slice(b"\x3f");
        long.extend_from_slice(&[b'y'; 63]);
        long.extend_from_slice(b"\xc0\x00");
        assert_eq!(
            parse_names(&long),
            Err(WireError::Malformed("dns name length"))
        );
    }

    #[test]
    fn bad_names_are_refused() {
        for bad in ["", "a..b", ".", &format!("{}.com", "x".repeat(64))] {
            assert_eq!(
                name_len(bad),
                Err(WireError::Malformed("dns name label")),
                "{bad:?}"
            );
        }
        let long = vec!["x".repeat(63); 4].join(".");
        assert_eq!(
            name_len(&long),
            Err(WireError::Malformed("dns name length"))
        );
        assert_eq!(name_len(&long[..250]).unwrap(), 252);
    }
}
