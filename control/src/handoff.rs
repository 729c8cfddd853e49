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

use dpio::poll::EventFd;
use engine::SiblingFrame;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError, TrySendError};

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

/// Wakes a worker sleeping in epoll: frames handed to it, or a job from the
/// controller, would otherwise wait for its idle timeout. An eventfd in the
/// worker's epoll set, written only while the worker says it sleeps, so a busy
/// worker costs its peers no syscall.
pub struct Doorbell {
    event: EventFd,
    sleeping: AtomicBool,
}

impl Doorbell {
    pub fn new() -> Result<Doorbell, String> {
        Ok(Doorbell {
            event: EventFd::new().map_err(|e| format!("cannot create a worker eventfd: {e}"))?,
            sleeping: AtomicBool::new(false),
        })
    }

    /// The worker is about to sleep. It must look for work once more after this
    /// (a producer that published before seeing the flag did not ring).
    pub fn going_to_sleep(&self) {
        self.sleeping.store(true, Ordering::SeqCst);
        // The flag must be visible before the worker's last look at its rings and
        // jobs (store-load order: Dekker with the fence in `ring`).
        fence(Ordering::SeqCst);
    }

    /// The worker is awake again: clears the flag and the counter.
    pub fn woke(&self) {
        self.sleeping.store(false, Ordering::SeqCst);
        self.event.clear();
    }

    /// Wakes the worker if it sleeps; call after publishing work for it.
    pub fn ring(&self) {
        // The published work must be visible before the flag is read.
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::SeqCst) {
            self.event.notify();
        }
    }

    /// For the worker's epoll set.
    pub fn fd(&self) -> RawFd {
        self.event.as_raw_fd()
    }
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

    #[test]
    fn doorbell_rings_only_a_sleeping_worker() {
        let d = Doorbell::new().unwrap();
        let mut ep = dpio::poll::Epoll::new().unwrap();
        ep.add(d.fd(), 1).unwrap();
        d.ring();
        assert_eq!(ep.wait(std::time::Duration::ZERO).unwrap().count(), 0);
        d.going_to_sleep();
        d.ring();
        assert_eq!(ep.wait(std::time::Duration::ZERO).unwrap().count(), 1);
        d.woke();
        assert_eq!(ep.wait(std::time::Duration::ZERO).unwrap().count(), 0);
    }
}
