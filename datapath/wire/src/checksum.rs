//! The Internet checksum (RFC 1071) and its incremental update (RFC 1624).
//!
//! Every header that carries a checksum computes it here. Sums are kept unfolded in a
//! `u32`/`u64` accumulator so that pieces (pseudo-header, header, payload) can be summed
//! separately and combined; `fold` turns an accumulator into the 16-bit value.

use std::net::{Ipv4Addr, Ipv6Addr};

/// One's-complement sum of `data` as big-endian 16-bit words (an odd trailing byte is
/// padded with zero), added to `acc`. Returned unfolded.
///
/// Hand-written rather than taken from a crate because the TSO path sums up to 64 KiB
/// per buffer: this reads 8 bytes at a time into a `u64` accumulator, which is what
/// makes checksumming run near memory speed.
#[inline]
pub fn sum(data: &[u8], acc: u64) -> u64 {
    let mut acc = acc;
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        // Big-endian 64-bit words summed with end-around carry are equivalent to
        // summing the four 16-bit words (RFC 1071 §2(B)).
        let w = u64::from_be_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        let (s, carry) = acc.overflowing_add(w);
        acc = s + carry as u64;
    }
    let rest = chunks.remainder();
    let mut pairs = rest.chunks_exact(2);
    for p in &mut pairs {
        let (s, carry) = acc.overflowing_add(u16::from_be_bytes([p[0], p[1]]) as u64);
        acc = s + carry as u64;
    }
    if let [last] = pairs.remainder() {
        let (s, carry) = acc.overflowing_add((*last as u64) << 8);
        acc = s + carry as u64;
    }
    acc
}

/// Folds an accumulator to 16 bits (without complementing).
#[inline]
pub fn fold(acc: u64) -> u16 {
    let mut a = (acc & 0xffff_ffff) + (acc >> 32);
    a = (a & 0xffff_ffff) + (a >> 32);
    let mut b = (a & 0xffff) + (a >> 16);
    b = (b & 0xffff) + (b >> 16);
    b = (b & 0xffff) + (b >> 16);
    b as u16
}

/// The checksum field value for `data`: the complement of its folded sum.
#[inline]
pub fn checksum(data: &[u8]) -> u16 {
    !fold(sum(data, 0))
}

/// Unfolded sum of the IPv4 pseudo-header (RFC 793/768).
#[inline]
pub fn pseudo_header_v4(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, l4_len: u32) -> u64 {
    let mut acc = sum(&src.octets(), 0);
    acc = sum(&dst.octets(), acc);
    acc + proto as u64 + l4_len as u64
}

/// Unfolded sum of the IPv6 pseudo-header (RFC 8200 §8.1).
#[inline]
pub fn pseudo_header_v6(src: Ipv6Addr, dst: Ipv6Addr, next_header: u8, l4_len: u32) -> u64 {
    let mut acc = sum(&src.octets(), 0);
    acc = sum(&dst.octets(), acc);
    acc + next_header as u64 + l4_len as u64
}

/// RFC 1624 eqn. 3: the new checksum field after a 16-bit word of the covered data
/// changed from `old` to `new`: HC' = ~(~HC + ~m + m').
#[inline]
pub fn update16(check: u16, old: u16, new: u16) -> u16 {
    let acc = (!check) as u64 + (!old) as u64 + new as u64;
    !fold(acc)
}

/// RFC 1624 over a run of bytes (even length, same alignment in the covered data),
/// e.g. an address that was rewritten.
#[inline]
pub fn update(check: u16, old: &[u8], new: &[u8]) -> u16 {
    debug_assert_eq!(old.len(), new.len());
    let mut acc = (!check) as u64;
    for (o, n) in old.chunks(2).zip(new.chunks(2)) {
        let o = u16::from_be_bytes([o[0], *o.get(1).unwrap_or(&0)]);
        let n = u16::from_be_bytes([n[0], *n.get(1).unwrap_or(&0)]);
        acc += (!o) as u64 + n as u64;
    }
    !fold(acc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Plain 16-bit-at-a-time RFC 1071 sum, as an independent reference.
    fn reference(data: &[u8]) -> u16 {
        let mut acc: u32 = 0;
        for c in data.chunks(2) {
            let w = if c.len() == 2 {
                u16::from_be_bytes([c[0], c[1]])
            } else {
                (c[0] as u16) << 8
            };
            acc += w as u32;
            acc = (acc & 0xffff) + (acc >> 16);
        }
        !(acc as u16)
    }

    #[test]
    fn rfc1071_example() {
        // RFC 1071 §3: 00 01 f2 03 f4 f5 f6 f7 sums to 0xddf2.
        let d = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(fold(sum(&d, 0)), 0xddf2);
    }

    #[test]
    fn ipv4_header_checksum_known_answer() {
        // A real IPv4 header (checksum field 0xb861 zeroed).
        let h = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(checksum(&h), 0xb861);
    }

    proptest! {
        #[test]
        fn matches_reference(data in proptest::collection::vec(any::<u8>(), 0..3000)) {
            prop_assert_eq!(checksum(&data), reference(&data));
        }

        #[test]
        fn incremental_update_matches_full(mut data in proptest::collection::vec(any::<u8>(), 2..200),
                                           idx in any::<prop::sample::Index>(), new in any::<u16>()) {
            let words = data.len() / 2;
            let i = idx.index(words) * 2;
            let before = checksum(&data);
            let old = u16::from_be_bytes([data[i], data[i + 1]]);
            data[i..i + 2].copy_from_slice(&new.to_be_bytes());
            let full = checksum(&data);
            let inc = update16(before, old, new);
            // 0x0000 and 0xffff are both "zero" in one's complement.
            prop_assert!(inc == full || (inc | full) == 0xffff && (inc & full) == 0);
        }
    }
}
