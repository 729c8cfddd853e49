//! The engine's output: a reusable arena of frames bound for the underlay or a port.
//!
//! The engine never owns a socket; it appends frames here and the worker drains them
//! to AF_XDP or tap. Capacity is kept across `clear`, so once warm the fast path does
//! not allocate.

use crate::port::PortId;
use core::ops::Range;
use wire::vnet::VnetHdr;

/// Where a frame goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxDest {
    /// Out of the underlay interface with this index (outer headers are in the frame).
    Underlay { ifindex: u32 },
    /// To a guest port, with the offload metadata to hand the guest.
    Port { port: PortId, vnet: VnetHdr },
}

/// One frame in the batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxFrame {
    pub dest: TxDest,
    range: Range<usize>,
}

/// Frames produced by one or more `process_*` calls.
///
/// `buf` only grows: `clear` resets `used`, so the bytes of earlier batches stay
/// initialized and [`TxBatch::push_unzeroed`] can hand them out without a memset (the
/// TSO path writes every byte of its frames, and zeroing 64 KiB first would be a third
/// pass over the data).
#[derive(Default, Debug)]
pub struct TxBatch {
    buf: Vec<u8>,
    used: usize,
    frames: Vec<TxFrame>,
}

impl TxBatch {
    pub fn new() -> Self {
        Self::default()
    }

    /// Drops all frames, keeping the capacity.
    pub fn clear(&mut self) {
        self.used = 0;
        self.frames.clear();
    }

    pub fn len(&self) -> usize {
        self.frames.len()
    }

    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// Appends a zeroed frame of `len` bytes and returns it for the caller to fill.
    pub fn push(&mut self, dest: TxDest, len: usize) -> &mut [u8] {
        let frame = self.push_unzeroed(dest, len);
        frame.fill(0);
        frame
    }

    /// Appends a frame of `len` bytes whose contents are left over from earlier
    /// frames: for emitters that write every byte (a frame they leave partly written
    /// would carry stale bytes of another frame).
    #[inline]
    pub fn push_unzeroed(&mut self, dest: TxDest, len: usize) -> &mut [u8] {
        let start = self.used;
        let end = start + len;
        if self.buf.len() < end {
            self.buf.resize(end, 0);
        }
        self.used = end;
        self.frames.push(TxFrame {
            dest,
            range: start..end,
        });
        &mut self.buf[start..end]
    }

    /// Grows the most recently pushed frame by `extra` bytes and returns the whole
    /// frame; its existing bytes stay, the new ones are unspecified (as with
    /// [`TxBatch::push_unzeroed`]). For the coalescer, which appends segments to a
    /// frame it builds in place. `None` when the batch is empty.
    pub fn extend_last(&mut self, extra: usize) -> Option<&mut [u8]> {
        let f = self.frames.last_mut()?;
        let end = f.range.end + extra;
        if self.buf.len() < end {
            self.buf.resize(end, 0);
        }
        f.range.end = end;
        self.used = end;
        Some(&mut self.buf[f.range.clone()])
    }

    /// Shrinks the most recently pushed frame to `len` bytes (for emitters that reserve
    /// the maximum and learn the real size as they write).
    pub fn truncate_last(&mut self, len: usize) {
        if let Some(f) = self.frames.last_mut() {
            let new_end = f.range.start + len.min(f.range.len());
            f.range.end = new_end;
            self.used = new_end;
        }
    }

    /// Removes the most recently pushed frame (an emitter that found it cannot finish).
    pub fn pop(&mut self) {
        if let Some(f) = self.frames.pop() {
            self.used = f.range.start;
        }
    }

    /// Replaces the destination of the most recently pushed frame (e.g. to fill in
    /// the offload metadata once the frame is complete).
    pub fn set_last_dest(&mut self, dest: TxDest) {
        if let Some(f) = self.frames.last_mut() {
            f.dest = dest;
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (TxDest, &[u8])> {
        self.frames
            .iter()
            .map(|f| (f.dest, &self.buf[f.range.clone()]))
    }

    /// The bytes of frame `i`, for tests and inspection.
    pub fn frame(&self, i: usize) -> Option<(TxDest, &[u8])> {
        self.frames
            .get(i)
            .map(|f| (f.dest, &self.buf[f.range.clone()]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_truncate_pop() {
        let mut b = TxBatch::new();
        let d = TxDest::Underlay { ifindex: 3 };
        b.push(d, 10).copy_from_slice(&[7; 10]);
        b.push(d, 100)[..4].copy_from_slice(&[1, 2, 3, 4]);
        b.truncate_last(4);
        assert_eq!(b.frame(1).unwrap().1, &[1, 2, 3, 4]);
        b.pop();
        assert_eq!(b.len(), 1);
        assert_eq!(b.iter().next().unwrap().1, &[7; 10]);
        b.clear();
        assert!(b.is_empty());
    }

    #[test]
    fn extend_last_keeps_the_frame_and_grows_it() {
        let mut b = TxBatch::new();
        let d = TxDest::Underlay { ifindex: 1 };
        assert!(b.extend_last(4).is_none());
        b.push(d, 2).copy_from_slice(&[1, 2]);
        b.push(d, 3).copy_from_slice(&[3, 4, 5]);
        let f = b.extend_last(2).unwrap();
        assert_eq!(&f[..3], &[3, 4, 5]);
        f[3..].copy_from_slice(&[6, 7]);
        assert_eq!(b.frame(0).unwrap().1, &[1, 2]);
        assert_eq!(b.frame(1).unwrap().1, &[3, 4, 5, 6, 7]);
        b.truncate_last(3);
        assert_eq!(b.push(d, 1), &[0]);
        assert_eq!(b.frame(1).unwrap().1, &[3, 4, 5]);
    }

    #[test]
    fn reuse_after_clear_zeroes_only_when_asked() {
        let mut b = TxBatch::new();
        let d = TxDest::Underlay { ifindex: 1 };
        b.push(d, 8).copy_from_slice(&[9; 8]);
        b.clear();
        assert_eq!(b.push_unzeroed(d, 4), &[9; 4]);
        assert_eq!(b.push(d, 4), &[0; 4]);
        assert_eq!(b.push(d, 16), &[0; 16]);
        assert_eq!(b.len(), 3);
    }
}
