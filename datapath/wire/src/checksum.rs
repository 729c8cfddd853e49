//! The Internet checksum (RFC 1071) and its incremental update (RFC 1624).
//!
//! Every header that carries a checksum computes it here. Sums are kept unfolded in a
//! `u32`/`u64` accumulator so that pieces (pseudo-header, header, payload) can be summed
//! separately and combined; `fold` turns an accumulator into the 16-bit value.

// The AVX2 copy-and-sum kernel (CPU intrinsics) is the one `unsafe` code of the
// pure crates.
#![allow(unsafe_code)]

use std::net::{Ipv4Addr, Ipv6Addr};

/// One's-complement sum of `data` as big-endian 16-bit words (an odd trailing byte is
/// padded with zero), added to `acc`. Returned unfolded.
///
/// Hand-written rather than taken from a crate because tunneled TSO sums up to 64 KiB
/// per buffer and must run near memory speed. The bulk adds native-endian words with
/// no carry chain: an explicit AVX2 kernel when the CPU has it (see [`avx2`]), else
/// 32-bit words into eight independent `u64` lanes, which the compiler vectorizes.
/// 2^16 = 1 mod 0xffff makes a 32-bit word equivalent to its two 16-bit halves, and
/// the sum's byte-order independence (RFC 1071 §2(B)) turns the native-endian result
/// into the big-endian one by swapping the folded value's bytes. Inputs shorter than
/// [`SIMD_MIN`] (headers, pseudo-headers) skip the vector set-up and reduction.
#[inline]
pub fn sum(data: &[u8], acc: u64) -> u64 {
    let (words, rest) = data.split_at(data.len() & !3);
    let (bulk, short) = words.split_at(bulk_len(words.len()));
    let mut native = words_sum(short);
    if !bulk.is_empty() {
        native = add(native, bulk_sum(bulk));
    }
    tail_sum(rest, add(acc, native_to_be(native)))
}

/// Copies `src` into `dst` (equal lengths; the shorter decides) and returns the sum of
/// the copied bytes as [`sum`] would: one pass over the bytes for both, which is what
/// lets segmentation and coalescing checksum payload they have to copy anyway.
#[inline]
pub fn copy_and_sum(dst: &mut [u8], src: &[u8], acc: u64) -> u64 {
    let n = dst.len().min(src.len());
    let (dst, src) = (&mut dst[..n], &src[..n]);
    let bulk = bulk_len(n);
    let (mut native, summed) = if bulk > 0 {
        bulk_copy_sum(dst, src, bulk)
    } else {
        dst.copy_from_slice(src);
        (0, 0)
    };
    let (words, rest) = src[summed..].split_at((n - summed) & !3);
    native = add(native, words_sum(words));
    tail_sum(rest, add(acc, native_to_be(native)))
}

/// Bytes per iteration of the vectorized loops: eight 32-bit lanes.
const LANE_BLOCK: usize = 32;
/// Shortest input given to the vectorized loops; shorter ones are summed a 32-bit word
/// at a time, which for a 20-byte IPv4 header or a 32-byte TCP header is cheaper than
/// setting up and reducing vector accumulators.
const SIMD_MIN: usize = 128;

/// How much of `len` bytes goes to the vectorized loops: whole [`LANE_BLOCK`]s, or
/// nothing below [`SIMD_MIN`].
#[inline]
fn bulk_len(len: usize) -> usize {
    if len >= SIMD_MIN {
        len & !(LANE_BLOCK - 1)
    } else {
        0
    }
}

#[inline]
fn add(acc: u64, v: u64) -> u64 {
    let (s, carry) = acc.overflowing_add(v);
    s + u64::from(carry)
}

/// Native-endian unfolded sum of the whole 32-bit words of `data` (fewer than 2^32
/// of them, so the `u64` cannot overflow).
#[inline]
fn words_sum(data: &[u8]) -> u64 {
    data.chunks_exact(4)
        .map(|w| u64::from(u32::from_ne_bytes([w[0], w[1], w[2], w[3]])))
        .sum()
}

/// The folded native-endian sum as a big-endian one.
#[inline]
fn native_to_be(native: u64) -> u64 {
    u64::from(u16::from_be(fold(native)))
}

/// Big-endian 16-bit words of a short remainder (fewer than 4 bytes when called from
/// [`sum`] and [`copy_and_sum`]; any length is correct).
#[inline]
fn tail_sum(data: &[u8], mut acc: u64) -> u64 {
    let mut pairs = data.chunks_exact(2);
    for p in &mut pairs {
        acc = add(acc, u64::from(u16::from_be_bytes([p[0], p[1]])));
    }
    if let [last] = pairs.remainder() {
        acc = add(acc, u64::from(*last) << 8);
    }
    acc
}

/// The lane loop. Each lane gains less than 2^32 per block, so it cannot overflow
/// before 2^32 blocks (128 GiB), far beyond any frame.
#[inline(always)]
fn lanes_sum(data: &[u8]) -> u64 {
    let mut lanes = [0u64; 8];
    for c in data.chunks_exact(LANE_BLOCK) {
        for (i, lane) in lanes.iter_mut().enumerate() {
            let w = [c[4 * i], c[4 * i + 1], c[4 * i + 2], c[4 * i + 3]];
            *lane += u64::from(u32::from_ne_bytes(w));
        }
    }
    lanes.iter().fold(0, |a, &l| add(a, l))
}

#[inline(always)]
fn lanes_copy_sum(dst: &mut [u8], src: &[u8]) -> u64 {
    let mut lanes = [0u64; 8];
    for (d, c) in dst
        .chunks_exact_mut(LANE_BLOCK)
        .zip(src.chunks_exact(LANE_BLOCK))
    {
        d.copy_from_slice(c);
        for (i, lane) in lanes.iter_mut().enumerate() {
            let w = [c[4 * i], c[4 * i + 1], c[4 * i + 2], c[4 * i + 3]];
            *lane += u64::from(u32::from_ne_bytes(w));
        }
    }
    lanes.iter().fold(0, |a, &l| add(a, l))
}

/// The explicit AVX2 kernel (the CPU is checked at run time, see [`bulk_sum`]).
///
/// Why not the safe lane loop compiled for AVX2: the compiler splits that loop into a
/// `memcpy` followed by a second pass that re-reads the source to widen each 32-bit
/// word to 64 bits, so a copy-and-sum costs two passes. This kernel loads each 32
/// bytes once, stores them, and adds them as 16-bit words with `vpmaddwd` into 32-bit
/// lanes: three vector ALU operations per 32 bytes, with four independent
/// accumulators so the adds do not wait on each other. (An AVX-512 variant of the same
/// loop measured no faster here: the copy is bound by the cache, not by the vector
/// width, and it would need Rust 1.89.)
///
/// `vpmaddwd` multiplies *signed* 16-bit words, so each word is first biased by
/// -0x8000 (an XOR of its top bit): a lane then gains `(w0 - 0x8000) + (w1 - 0x8000)`,
/// which is exact, and the 0x8000 taken from every word is added back at the end. A
/// vector changes a lane by at most 0x10000 (both words 0: -0x10000), and an
/// accumulator takes at most `SPILL_ITERS + 1` vectors between spills, so even the
/// four accumulators added together (in 32 bits, the cheapest reduction) never
/// overflow: 4 * (0x1ff0 + 1) * 0x10000 < 2^31.
///
/// The loops index raw pointers rather than zipping `chunks_exact` iterators, and
/// reduce the accumulators in registers: for the 1,376 whole-vector bytes of a
/// 1400-byte segment the iterator version spent ~430 instructions (about 10 per
/// vector, a 32-lane spill through memory, and a `memcpy` call the compiler made of
/// the last vectors' stores), this one ~300; it also takes an even-length ragged end
/// off the caller (a `memcpy` call and a scalar loop before).
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::{
        __m256i, _mm256_add_epi32, _mm256_add_epi64, _mm256_and_si256, _mm256_castsi256_si128,
        _mm256_cvtepi32_epi64, _mm256_extracti128_si256, _mm256_loadu_si256, _mm256_madd_epi16,
        _mm256_set1_epi16, _mm256_setzero_si256, _mm256_storeu_si256, _mm256_xor_si256,
        _mm_add_epi64, _mm_cvtsi128_si64, _mm_unpackhi_epi64,
    };

    /// Bytes per vector.
    pub(super) const VECTOR: usize = 32;
    /// Unrolled iterations (four vectors each, one per accumulator) between spills of
    /// the accumulators (see the module doc).
    pub(super) const SPILL_ITERS: usize = 0x1ff0;
    const SPILL_VECTORS: usize = SPILL_ITERS * 4;

    /// Native-endian unfolded sum of the whole 32-byte vectors of `data` (callers pass
    /// a multiple of 32 bytes).
    #[target_feature(enable = "avx2")]
    pub(super) fn sum(data: &[u8]) -> u64 {
        run::<false>(&mut [], data).0
    }

    /// Copies `src` into `dst` (same length) and returns the native-endian unfolded
    /// sum of its first bytes, and how many: its whole 32-byte vectors, plus a ragged
    /// end of even length.
    #[target_feature(enable = "avx2")]
    pub(super) fn copy_sum(dst: &mut [u8], src: &[u8]) -> (u64, usize) {
        debug_assert_eq!(dst.len(), src.len());
        run::<true>(dst, src)
    }

    /// Sums the whole vectors of `src` and returns the sum and the bytes summed. With
    /// `COPY`, of the shorter of `src` and `dst`, all copied to `dst`: a ragged end
    /// (after at least one whole vector) as one more vector ending with it,
    /// overlapping bytes already copied, which costs less than a `memcpy` call for
    /// the few bytes left.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn run<const COPY: bool>(dst: &mut [u8], src: &[u8]) -> (u64, usize) {
        let len = if COPY {
            src.len().min(dst.len())
        } else {
            src.len()
        };
        let vectors = len / VECTOR;
        let (s, d) = (src.as_ptr(), dst.as_mut_ptr());
        let bias = _mm256_set1_epi16(i16::MIN);
        let ones = _mm256_set1_epi16(1);
        let step = |acc: __m256i, i: usize| {
            // SAFETY: callers pass `i < vectors`, so the VECTOR bytes at `i * VECTOR`
            // lie within `src` (and, with COPY, within `dst`, which we borrow
            // mutably); loads and stores are unaligned.
            let v = unsafe { _mm256_loadu_si256(s.add(i * VECTOR).cast()) };
            if COPY {
                // SAFETY: as above.
                unsafe { _mm256_storeu_si256(d.add(i * VECTOR).cast(), v) };
            }
            _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_xor_si256(v, bias), ones))
        };
        // A ragged end of even length is summed too (from a last vector ending at
        // `len`, its bytes already summed masked to zero), which spares the caller's
        // scalar loop; an odd one would pair the bytes across words differently.
        let rem = len % VECTOR;
        let sum_end = COPY && rem.is_multiple_of(2);
        let mut biased = 0i64;
        let mut i = 0;
        while i < vectors {
            let end = vectors.min(i + SPILL_VECTORS);
            let mut a = [_mm256_setzero_si256(); 4];
            while i + 4 <= end {
                a[0] = step(a[0], i);
                a[1] = step(a[1], i + 1);
                a[2] = step(a[2], i + 2);
                a[3] = step(a[3], i + 3);
                i += 4;
            }
            // The last one to three vectors, unrolled: as a loop, the compiler turns
            // its stores into a `memcpy` call and re-reads the source to sum it.
            for acc in &mut a[..3] {
                if i < end {
                    *acc = step(*acc, i);
                    i += 1;
                }
            }
            if COPY && rem != 0 && i == vectors {
                // SAFETY: `VECTOR <= len` (there is a whole vector), so the VECTOR
                // bytes ending at `len` lie within `src` and `dst`; they overlap
                // bytes already copied, with the same values.
                let v = unsafe {
                    let v = _mm256_loadu_si256(s.add(len - VECTOR).cast());
                    _mm256_storeu_si256(d.add(len - VECTOR).cast(), v);
                    v
                };
                if sum_end {
                    // SAFETY: `rem < VECTOR`, so the VECTOR bytes at `rem` lie within
                    // the 2 * VECTOR bytes of `TAIL_MASK`.
                    let mask = unsafe { _mm256_loadu_si256(TAIL_MASK.as_ptr().add(rem).cast()) };
                    // Masked words count as 0 (-0x8000 once biased, added back below
                    // with the other vectors').
                    let v = _mm256_and_si256(v, mask);
                    a[3] =
                        _mm256_add_epi32(a[3], _mm256_madd_epi16(_mm256_xor_si256(v, bias), ones));
                }
            }
            let a = _mm256_add_epi32(_mm256_add_epi32(a[0], a[1]), _mm256_add_epi32(a[2], a[3]));
            let wide = _mm256_add_epi64(
                _mm256_cvtepi32_epi64(_mm256_castsi256_si128(a)),
                _mm256_cvtepi32_epi64(_mm256_extracti128_si256::<1>(a)),
            );
            let half = _mm_add_epi64(
                _mm256_castsi256_si128(wide),
                _mm256_extracti128_si256::<1>(wide),
            );
            biased += _mm_cvtsi128_si64(_mm_add_epi64(half, _mm_unpackhi_epi64(half, half)));
        }
        let (summed_vectors, summed) = if sum_end && rem != 0 && vectors > 0 {
            (vectors + 1, len)
        } else {
            (vectors, vectors * VECTOR)
        };
        // Each vector took 0x8000 from each of its 16 words; the true sum is >= 0.
        let sum = (biased + (summed_vectors * VECTOR / 2) as i64 * 0x8000) as u64;
        (sum, summed)
    }

    /// A vector of zero bytes, then one of 0xff: the VECTOR bytes at offset `rem`
    /// are a mask keeping the last `rem` bytes of a vector.
    static TAIL_MASK: [u8; 2 * VECTOR] = {
        let mut m = [0u8; 2 * VECTOR];
        let mut i = VECTOR;
        while i < 2 * VECTOR {
            m[i] = 0xff;
            i += 1;
        }
        m
    };
}

#[cfg(target_arch = "x86_64")]
fn have_avx2() -> bool {
    // The macro caches the CPUID result; this is a load and a test.
    std::arch::is_x86_feature_detected!("avx2")
}

/// Native-endian unfolded sum of `data` (a multiple of [`LANE_BLOCK`] bytes).
#[inline]
fn bulk_sum(data: &[u8]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if have_avx2() {
        // SAFETY: the CPU supports AVX2 (checked just above), the only requirement of
        // calling a `#[target_feature(enable = "avx2")]` function.
        return unsafe { avx2::sum(data) };
    }
    lanes_sum(data)
}

/// Copies all of `src` into `dst` (equal lengths) and returns the native-endian
/// unfolded sum of its first bytes, and how many: at least the first `bulk`
/// ([`bulk_len`] of the length, at least one [`LANE_BLOCK`]), a multiple of 2. The
/// caller sums the rest.
#[inline]
fn bulk_copy_sum(dst: &mut [u8], src: &[u8], bulk: usize) -> (u64, usize) {
    #[cfg(target_arch = "x86_64")]
    if have_avx2() {
        // SAFETY: as in `bulk_sum`: AVX2 is present.
        return unsafe { avx2::copy_sum(dst, src) };
    }
    let s = lanes_copy_sum(&mut dst[..bulk], &src[..bulk]);
    dst[bulk..].copy_from_slice(&src[bulk..]);
    (s, bulk)
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
    acc + u64::from(proto) + u64::from(l4_len)
}

/// Unfolded sum of the IPv6 pseudo-header (RFC 8200 §8.1).
#[inline]
pub fn pseudo_header_v6(src: Ipv6Addr, dst: Ipv6Addr, next_header: u8, l4_len: u32) -> u64 {
    let mut acc = sum(&src.octets(), 0);
    acc = sum(&dst.octets(), acc);
    acc + u64::from(next_header) + u64::from(l4_len)
}

/// RFC 1624 eqn. 3: the new checksum field after a 16-bit word of the covered data
/// changed from `old` to `new`: HC' = ~(~HC + ~m + m').
#[inline]
pub fn update16(check: u16, old: u16, new: u16) -> u16 {
    let acc = u64::from(!check) + u64::from(!old) + u64::from(new);
    !fold(acc)
}

/// RFC 1624 over a run of bytes (even length, same alignment in the covered data),
/// e.g. an address that was rewritten.
#[inline]
pub fn update(check: u16, old: &[u8], new: &[u8]) -> u16 {
    debug_assert_eq!(old.len(), new.len());
    let mut acc = u64::from(!check);
    for (o, n) in old.chunks(2).zip(new.chunks(2)) {
        let o = u16::from_be_bytes([o[0], *o.get(1).unwrap_or(&0)]);
        let n = u16::from_be_bytes([n[0], *n.get(1).unwrap_or(&0)]);
        acc += u64::from(!o) + u64::from(n);
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
                u16::from(c[0]) << 8
            };
            acc += u32::from(w);
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

    /// Naive sum as an unfolded big-endian accumulator (for long inputs).
    fn reference_wide(data: &[u8]) -> u64 {
        data.chunks(2)
            .map(|c| u64::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
            .sum()
    }

    #[test]
    fn vectorized_and_baseline_loops_agree() {
        let data: Vec<u8> = (0..4096u32).map(|i| (i * 131 + 17) as u8).collect();
        let mut a = vec![0u8; data.len()];
        let mut b = vec![0u8; data.len()];
        // The loops may leave different unfolded sums; folded they must agree.
        assert_eq!(fold(bulk_sum(&data)), fold(lanes_sum(&data)));
        assert_eq!(
            fold(bulk_copy_sum(&mut a, &data, data.len()).0),
            fold(lanes_copy_sum(&mut b, &data))
        );
        assert_eq!(a, data);
        assert_eq!(b, data);
    }

    /// Several spill periods of the AVX2 kernel, with the data that moves its signed
    /// lanes furthest each way (all zero words: -0x10000 per vector; all 0xffff:
    /// +0xfffe), plus a ragged end.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn kernel_lanes_do_not_overflow_across_spills() {
        let len = 2 * avx2::SPILL_ITERS * 4 * avx2::VECTOR + 3 * avx2::VECTOR + 7;
        for byte in [0x00u8, 0xff, 0x80] {
            let data = vec![byte; len];
            let want = fold(reference_wide(&data));
            assert_eq!(fold(sum(&data, 0)), want, "sum of {byte:#x}");
            let mut dst = vec![0u8; len];
            assert_eq!(fold(copy_and_sum(&mut dst, &data, 0)), want);
            assert!(dst == data);
        }
    }

    proptest! {
        #[test]
        fn matches_reference(data in proptest::collection::vec(any::<u8>(), 0..3000)) {
            prop_assert_eq!(checksum(&data), reference(&data));
        }

        #[test]
        fn copy_and_sum_matches_reference(data in proptest::collection::vec(any::<u8>(), 0..3000),
                                          acc in 0u64..1 << 40) {
            let mut dst = vec![0u8; data.len()];
            let s = copy_and_sum(&mut dst, &data, acc);
            prop_assert_eq!(&dst, &data);
            prop_assert_eq!(fold(s), fold(sum(&data, acc)));
            prop_assert_eq!(!fold(sum(&data, 0)), reference(&data));
        }

        /// Every length up to 300 (short path, vector path, every tail length) at
        /// any alignment of source and destination, against the naive sum.
        #[test]
        fn every_length_and_alignment_matches_reference(
            data in proptest::collection::vec(any::<u8>(), 300 + 64),
            len in 0usize..=300,
            src_off in 0usize..64,
            dst_off in 0usize..64,
            acc in any::<u32>(),
        ) {
            let src = &data[src_off..src_off + len.min(data.len() - src_off)];
            let want = reference(src);
            prop_assert_eq!(!fold(sum(src, 0)), want);
            let mut buf = vec![0u8; 300 + 64];
            let s = copy_and_sum(&mut buf[dst_off..dst_off + src.len()], src, u64::from(acc));
            prop_assert_eq!(&buf[dst_off..dst_off + src.len()], src);
            prop_assert_eq!(fold(s), fold(sum(src, u64::from(acc))));
            prop_assert_eq!(fold(s), fold(reference_wide(src) + u64::from(acc)));
            // The portable loops (used without AVX2) agree with the kernel.
            let whole = &src[..src.len() & !(LANE_BLOCK - 1)];
            prop_assert_eq!(fold(lanes_sum(whole)), fold(bulk_sum(whole)));
            let mut copy = vec![0u8; whole.len()];
            prop_assert_eq!(fold(lanes_copy_sum(&mut copy, whole)), fold(bulk_sum(whole)));
            prop_assert_eq!(&copy[..], whole);
            // Nothing outside the destination range is written.
            prop_assert!(buf[..dst_off].iter().chain(&buf[dst_off + src.len()..]).all(|&b| b == 0));
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
