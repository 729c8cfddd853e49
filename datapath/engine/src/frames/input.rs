//! The engine's input: a received frame in the pieces it arrived in.
//!
//! AF_XDP hands a 9014-byte underlay frame over as a chain of buffers (three in copy
//! mode: 3840 + 3840 + 1334 bytes), and the datapath does not copy them into one. The
//! engine reads headers from the first piece ([`RxFrame::head`]; they always sit there
//! in practice, and a frame whose headers do not is made contiguous first), checksums
//! payload across pieces ([`RxFrame::sum`]), and passes payload on by reference
//! ([`RxFrame::input_ref`]) instead of copying it.

use core::ops::Range;
use wire::checksum;

/// `len` bytes at logical offset `start` of received frame `input`: the input's pieces
/// taken as one buffer (see [`RxFrame`]). The caller numbered its inputs and resolves
/// the reference when it drains the batch (`frames::output`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InputRef {
    pub input: u32,
    pub start: u32,
    pub len: u32,
}

/// A received frame, or a part of one (the inner frame of an underlay frame): `len`
/// bytes starting `start` bytes into the concatenation of `pieces`. `input` is the
/// number the caller gave this received frame, under which it resolves the
/// [`InputRef`]s the engine emits.
#[derive(Clone, Copy, Debug)]
pub struct RxFrame<'a> {
    pieces: &'a [&'a [u8]],
    input: u32,
    start: usize,
    len: usize,
    /// The frame's first bytes that are contiguous in memory: where headers are
    /// read, kept so that reading them does not walk the pieces again.
    head: &'a [u8],
}

impl<'a> RxFrame<'a> {
    /// The input number of a frame the caller does not keep until the batch is
    /// drained (a tap's read buffer, reused by the next read): the engine copies
    /// what it passes on from such a frame instead of referring to it.
    pub const TRANSIENT: u32 = u32::MAX;

    /// The whole frame made of `pieces`, in order.
    #[inline]
    pub fn new(pieces: &'a [&'a [u8]], input: u32) -> RxFrame<'a> {
        if let [one] = pieces {
            return RxFrame {
                pieces,
                input,
                start: 0,
                len: one.len(),
                head: one,
            };
        }
        let len = pieces.iter().map(|p| p.len()).sum();
        RxFrame {
            pieces,
            input,
            start: 0,
            len,
            head: head_at(pieces, 0, len),
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The number of the received frame this is (a part of).
    pub fn input(&self) -> u32 {
        self.input
    }

    /// The first bytes of the frame that are contiguous in memory: the rest of the
    /// piece it starts in (at most `len` bytes).
    pub fn head(&self) -> &'a [u8] {
        self.head
    }

    /// Whether the whole frame is in [`RxFrame::head`].
    pub fn is_contiguous(&self) -> bool {
        self.head.len() == self.len
    }

    /// Bytes `range` of the frame as a part of its own (clamped to the frame).
    #[inline]
    pub fn sub(&self, range: Range<usize>) -> RxFrame<'a> {
        // The common case, a part of the head (an inner frame in one piece), needs
        // no walk over the pieces.
        if let Some(head) = self.head.get(range.clone()) {
            if !head.is_empty() {
                return RxFrame {
                    start: self.start + range.start,
                    len: head.len(),
                    head,
                    ..*self
                };
            }
        }
        self.sub_slow(range)
    }

    fn sub_slow(&self, range: Range<usize>) -> RxFrame<'a> {
        let start = range.start.min(self.len);
        let end = range.end.clamp(start, self.len);
        let len = end - start;
        let head = match self.head.get(start..) {
            Some(rest) if !rest.is_empty() || len == 0 => &rest[..len.min(rest.len())],
            _ => head_at(self.pieces, self.start + start, len),
        };
        RxFrame {
            start: self.start + start,
            len,
            head,
            ..*self
        }
    }

    /// A reference to bytes `range` of this frame, for the batch to gather from.
    /// `range` must lie within the frame (the caller checked it against `len`).
    pub fn input_ref(&self, range: Range<usize>) -> InputRef {
        // Frames are at most 64 KiB plus headers: offsets fit 32 bits.
        InputRef {
            input: self.input,
            start: (self.start + range.start) as u32,
            len: range.len() as u32,
        }
    }

    /// Calls `f` with each piece of memory holding bytes `range` of the frame, in
    /// order, and the offset of that piece within `range`.
    fn for_each_part(&self, range: Range<usize>, mut f: impl FnMut(usize, &'a [u8])) {
        let end = range.end.min(self.len);
        if range.start >= end {
            return;
        }
        // Absolute offsets into the concatenated pieces.
        let (mut at, stop) = (self.start + range.start, self.start + end);
        let mut base = 0;
        for p in self.pieces {
            let p_end = base + p.len();
            if at < p_end {
                let part = &p[at - base..p_end.min(stop) - base];
                f(at - (self.start + range.start), part);
                at += part.len();
                if at >= stop {
                    return;
                }
            }
            base = p_end;
        }
    }

    /// The Internet checksum sum of bytes `range` (as [`checksum::sum`] of those
    /// bytes in one buffer would give), added to `acc`. A piece that starts at an odd
    /// offset of the range has its bytes in the other halves of the 16-bit words, so
    /// its folded sum is byte-swapped (RFC 1071 §2(B)).
    #[inline]
    pub fn sum(&self, range: Range<usize>, acc: u64) -> u64 {
        // The common case: one piece (every frame of up to 3840 bytes).
        if let Some(bytes) = self.head.get(range.clone()) {
            return checksum::sum(bytes, acc);
        }
        let mut acc = acc;
        self.for_each_part(range, |off, part| {
            let s = checksum::sum(part, 0);
            acc += if off % 2 == 0 {
                s
            } else {
                u64::from(checksum::fold(s).swap_bytes())
            };
        });
        acc
    }

    /// Copies the frame into `dst` (as much as fits).
    #[inline]
    pub fn copy_into(&self, dst: &mut [u8]) {
        let n = dst.len().min(self.len);
        if let (Some(d), Some(h)) = (dst.get_mut(..n), self.head.get(..n)) {
            d.copy_from_slice(h);
            return;
        }
        self.for_each_part(0..n, |off, part| {
            dst[off..off + part.len()].copy_from_slice(part);
        });
    }

    /// Appends bytes `range` of the frame to `out`.
    pub fn copy_to(&self, range: Range<usize>, out: &mut Vec<u8>) {
        self.for_each_part(range, |_, part| out.extend_from_slice(part));
    }
}

/// The contiguous bytes at absolute offset `start` of `pieces`, at most `len`.
fn head_at<'a>(pieces: &'a [&'a [u8]], start: usize, len: usize) -> &'a [u8] {
    let mut skip = start;
    for p in pieces {
        if skip < p.len() {
            let end = p.len().min(skip + len);
            return &p[skip..end];
        }
        skip -= p.len();
    }
    &[]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn head_sub_and_refs_follow_the_pieces() {
        let pieces: [&[u8]; 3] = [b"abcd", b"efg", b"hij"];
        let f = RxFrame::new(&pieces, 7);
        assert_eq!(
            (f.len(), f.head(), f.is_contiguous()),
            (10, &b"abcd"[..], false)
        );
        let s = f.sub(2..8);
        assert_eq!((s.len(), s.head()), (6, &b"cd"[..]));
        let t = s.sub(2..5);
        assert_eq!((t.head(), t.is_contiguous()), (&b"efg"[..], true));
        let mut all = Vec::new();
        s.copy_to(0..6, &mut all);
        assert_eq!(all, b"cdefgh");
        assert_eq!(
            s.input_ref(1..4),
            InputRef {
                input: 7,
                start: 3,
                len: 3
            }
        );
        // Clamped to the frame.
        assert_eq!(s.sub(4..100).len(), 2);
        assert_eq!(s.sub(9..12).len(), 0);
        assert!(s.sub(9..12).head().is_empty());
        let mut none = Vec::new();
        let (from, to) = (5, 2);
        s.copy_to(from..to, &mut none);
        assert!(none.is_empty());
        let mut exact = [0u8; 4];
        s.copy_into(&mut exact);
        assert_eq!(&exact, b"cdef");
        let mut longer = [b'.'; 8];
        t.copy_into(&mut longer);
        assert_eq!(&longer, b"efg.....");
    }

    proptest! {
        /// Summing across any split into pieces, from any start, equals summing the
        /// same bytes in one buffer.
        #[test]
        fn sum_across_pieces_equals_contiguous_sum(
            data in proptest::collection::vec(any::<u8>(), 0..600),
            cuts in proptest::collection::vec(0usize..600, 0..6),
            from in 0usize..600,
            to in 0usize..600,
            acc in 0u64..(1 << 40),
        ) {
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(data.len())).collect();
            cuts.sort_unstable();
            let mut pieces = Vec::new();
            let mut at = 0;
            for c in cuts.into_iter().chain([data.len()]) {
                pieces.push(&data[at..c]);
                at = c;
            }
            let f = RxFrame::new(&pieces, 0);
            let (a, b) = (from.min(data.len()), to.min(data.len()));
            let (a, b) = (a.min(b), a.max(b));
            prop_assert_eq!(
                checksum::fold(f.sum(a..b, acc)),
                checksum::fold(checksum::sum(&data[a..b], acc))
            );
            let mut copy = Vec::new();
            f.copy_to(a..b, &mut copy);
            prop_assert_eq!(&copy[..], &data[a..b]);
            // The same through a part of the frame: its head, sums and copies.
            let part = f.sub(a..b);
            prop_assert_eq!(part.len(), b - a);
            prop_assert!(data[a..b].starts_with(part.head()));
            prop_assert!(!part.head().is_empty() || a == b);
            let mid = (b - a) / 2;
            prop_assert_eq!(
                checksum::fold(part.sum(mid..b - a, acc)),
                checksum::fold(checksum::sum(&data[a + mid..b], acc))
            );
            let mut whole = vec![0; b - a];
            part.copy_into(&mut whole);
            prop_assert_eq!(&whole[..], &data[a..b]);
        }
    }
}
