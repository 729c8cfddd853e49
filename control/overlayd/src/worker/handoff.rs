//! Frames handed from one worker to another, and the doorbell that wakes a sleeping
//! worker.
//!
//! Why: every port lives on exactly one worker (see [`crate::workers`]), but an
//! underlay queue is served by whichever worker owns its socket, and a guest may
//! send to a port of another worker on the same sled. The engine says where such a
//! frame goes (`TxDest::Sibling`); the worker hands it to the owner here, without a
//! lock on the fast path and without allocating per packet.
//!
//! Shape: per ordered pair of workers, two bounded channels — frames one way, their
//! emptied buffers back. A buffer is filled once by the sender and then moved, not
//! copied: the receiver holds it while the frames it delivers from it still refer to
//! it, and gives it back once its batch is drained. A sender with no free buffer
//! refuses the frame (the caller counts the drop), so a slow owner never stalls the
//! worker that hands over. Buffers grow to the largest frame they carried (a 64 KiB
//! guest buffer at most) and keep that size.

use super::stats::WorkerStats;
use crate::util::Doorbell;
use engine::SiblingFrame;
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;

/// How many frames may wait in one worker-to-worker channel.
pub const HANDOFF_SLOTS: usize = 256;

/// A frame in transit, in a buffer that travels with it.
pub struct Handoff {
    pub kind: SiblingFrame,
    buf: Vec<u8>,
}

impl Handoff {
    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }
}

/// Why a frame was not handed over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PushError {
    /// Every buffer holds a frame the receiver has not given back yet.
    Full,
    /// The frame is longer than any frame may be.
    TooLong { len: usize, max: usize },
}

/// The sending end; one worker holds it.
pub struct HandoffTx {
    frames: SyncSender<Handoff>,
    free: Receiver<Vec<u8>>,
    max_len: usize,
}

/// The receiving end; the owning worker holds it.
pub struct HandoffRx {
    frames: Receiver<Handoff>,
    free: SyncSender<Vec<u8>>,
    /// A frame taken from the channel by [`HandoffRx::is_empty`], not yet popped.
    peeked: Option<Handoff>,
}

/// A channel of `capacity` buffers (each first sized `initial_len` bytes) for frames
/// of at most `max_len` bytes; every buffer is allocated here.
pub fn handoff_ring(capacity: usize, initial_len: usize, max_len: usize) -> (HandoffTx, HandoffRx) {
    let capacity = capacity.max(1);
    let (frames_tx, frames_rx) = mpsc::sync_channel(capacity);
    let (free_tx, free_rx) = mpsc::sync_channel(capacity);
    for _ in 0..capacity {
        // Cannot fail: the channel has room for every buffer.
        let _ = free_tx.try_send(Vec::with_capacity(initial_len));
    }
    (
        HandoffTx {
            frames: frames_tx,
            free: free_rx,
            max_len,
        },
        HandoffRx {
            frames: frames_rx,
            free: free_tx,
            peeked: None,
        },
    )
}

impl HandoffTx {
    /// Hands over a `len`-byte frame that `fill` writes into the buffer it is given
    /// (exactly `len` bytes).
    pub fn push(
        &mut self,
        kind: SiblingFrame,
        len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<(), PushError> {
        if len > self.max_len {
            return Err(PushError::TooLong {
                len,
                max: self.max_len,
            });
        }
        let Ok(mut buf) = self.free.try_recv() else {
            return Err(PushError::Full);
        };
        buf.resize(len, 0);
        fill(&mut buf);
        match self.frames.try_send(Handoff { kind, buf }) {
            Ok(()) => Ok(()),
            // The frame channel has room for every buffer, so it is never full;
            // a receiver that is gone takes no more frames.
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => Err(PushError::Full),
        }
    }
}

impl HandoffRx {
    /// The next frame, oldest first.
    pub fn pop(&mut self) -> Option<Handoff> {
        self.peeked.take().or_else(|| self.frames.try_recv().ok())
    }

    /// Whether no frame is waiting.
    pub fn is_empty(&mut self) -> bool {
        if self.peeked.is_none() {
            match self.frames.try_recv() {
                Ok(h) => self.peeked = Some(h),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => {}
            }
        }
        self.peeked.is_none()
    }

    /// Gives a frame's buffer back to the sender (once nothing refers to it).
    pub fn give_back(&mut self, h: Handoff) {
        // The free channel has room for every buffer; a sender that is gone
        // needs none.
        let _ = self.free.try_send(h.buf);
    }
}

/// The channels between one worker and each of the others.
pub struct Mesh {
    /// Indexed by worker; `None` for this worker itself.
    to: Vec<Option<HandoffTx>>,
    /// The other workers' doorbells, by worker (`None` for this one).
    wake: Vec<Option<Arc<Doorbell>>>,
    /// Which of `to` got frames since they were last woken.
    pushed: Vec<bool>,
    pub(super) from: Vec<HandoffRx>,
}

impl Mesh {
    /// Hands a `len`-byte frame that `fill` writes to worker `w`, counting the
    /// outcome.
    pub(super) fn push(
        &mut self,
        w: usize,
        kind: SiblingFrame,
        len: usize,
        fill: impl FnOnce(&mut [u8]),
        st: &mut WorkerStats,
    ) {
        let Some(Some(tx)) = self.to.get_mut(w) else {
            st.handoff_no_worker += 1;
            return;
        };
        match tx.push(kind, len, fill) {
            Ok(()) => {
                st.handoff_out += 1;
                if let Some(p) = self.pushed.get_mut(w) {
                    *p = true;
                }
            }
            Err(PushError::Full) => st.handoff_full += 1,
            Err(PushError::TooLong { .. }) => st.handoff_too_long += 1,
        }
    }

    /// Wakes the workers that were handed frames (if they sleep).
    pub(super) fn wake(&mut self) {
        for (w, p) in self.pushed.iter_mut().enumerate() {
            if std::mem::take(p) {
                if let Some(Some(d)) = self.wake.get(w) {
                    d.ring();
                }
            }
        }
    }

    pub(super) fn pending(&mut self) -> bool {
        self.from.iter_mut().any(|r| !r.is_empty())
    }
}

/// The channels between `doorbells.len()` workers, for frames of at most `max_len`
/// bytes (buffers first sized `initial_len`): one [`Mesh`] per worker, in worker
/// order.
pub fn mesh(doorbells: &[Arc<Doorbell>], initial_len: usize, max_len: usize) -> Vec<Mesh> {
    let n = doorbells.len();
    let mut meshes: Vec<Mesh> = (0..n)
        .map(|_| Mesh {
            to: (0..n).map(|_| None).collect(),
            wake: vec![None; n],
            pushed: vec![false; n],
            from: Vec::new(),
        })
        .collect();
    for src in 0..n {
        for dst in (0..n).filter(|&d| d != src) {
            let (tx, rx) = handoff_ring(HANDOFF_SLOTS, initial_len, max_len);
            meshes[src].to[dst] = Some(tx);
            meshes[src].wake[dst] = Some(doorbells[dst].clone());
            meshes[dst].from.push(rx);
        }
    }
    meshes
}

#[cfg(test)]
mod tests {
    use super::*;
    const KIND: SiblingFrame = SiblingFrame::Underlay;

    fn frame(i: usize, len: usize) -> Vec<u8> {
        (0..len).map(|b| (i * 31 + b) as u8).collect()
    }

    fn push(tx: &mut HandoffTx, f: &[u8]) -> Result<(), PushError> {
        tx.push(KIND, f.len(), |b| b.copy_from_slice(f))
    }

    /// Frames come out in order and intact, with lengths that vary (a short frame
    /// in a buffer that carried a long one must not show the long one's tail), and
    /// buffers come back for reuse.
    #[test]
    fn order_contents_and_reuse() {
        let (mut tx, mut rx) = handoff_ring(4, 16, 1000);
        let mut next_out = 0;
        for i in 0..100 {
            let len = 1 + (i * 37) % 900;
            push(&mut tx, &frame(i, len)).unwrap();
            if i % 3 == 2 {
                assert!(!rx.is_empty());
                while let Some(h) = rx.pop() {
                    let want = frame(next_out, 1 + (next_out * 37) % 900);
                    assert_eq!(h.bytes(), &want[..], "frame {next_out}");
                    assert_eq!(h.kind, KIND);
                    rx.give_back(h);
                    next_out += 1;
                }
                assert!(rx.is_empty());
            }
        }
    }

    /// A full channel refuses (nothing blocks) until a buffer comes back; a frame
    /// over the limit is refused whatever the room.
    #[test]
    fn full_and_too_long_are_refused() {
        let (mut tx, mut rx) = handoff_ring(2, 8, 64);
        push(&mut tx, &[1; 8]).unwrap();
        push(&mut tx, &[2; 8]).unwrap();
        assert_eq!(push(&mut tx, &[3; 8]), Err(PushError::Full));
        assert_eq!(
            push(&mut tx, &[0; 65]),
            Err(PushError::TooLong { len: 65, max: 64 })
        );
        // Held by the receiver (not given back): still full.
        let first = rx.pop().unwrap();
        assert_eq!(push(&mut tx, &[3; 8]), Err(PushError::Full));
        rx.give_back(first);
        push(&mut tx, &[3; 8]).unwrap();
        assert_eq!(rx.pop().unwrap().bytes(), &[2; 8]);
        assert_eq!(rx.pop().unwrap().bytes(), &[3; 8]);
        assert!(rx.pop().is_none());
    }

    /// Producer and consumer on two threads: every frame arrives once, in order.
    #[test]
    fn across_threads() {
        let (mut tx, mut rx) = handoff_ring(8, 64, 64);
        let n = 20_000usize;
        let producer = std::thread::spawn(move || {
            let mut i = 0;
            while i < n {
                let f = frame(i, 1 + i % 64);
                match push(&mut tx, &f) {
                    Ok(()) => i += 1,
                    Err(PushError::Full) => std::thread::yield_now(),
                    Err(e) => panic!("{e:?}"),
                }
            }
        });
        let mut got = 0;
        while got < n {
            match rx.pop() {
                Some(h) => {
                    assert_eq!(h.bytes(), &frame(got, 1 + got % 64)[..]);
                    rx.give_back(h);
                    got += 1;
                }
                None => std::thread::yield_now(),
            }
        }
        producer.join().unwrap();
    }
}
