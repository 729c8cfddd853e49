//! Frames handed from one worker to another: a bounded single-producer,
//! single-consumer ring of preallocated frame buffers, one ring per ordered pair
//! of workers.
//!
//! Why it exists: every port lives on exactly one worker (see [`crate::workers`]),
//! but an underlay queue is served by whichever worker owns its socket, and a
//! guest's frame to a port of another worker on the same sled leaves its worker's
//! engine encapsulated toward our own underlay address. Both must reach the port's
//! owner, without a lock on the fast path and without allocating per packet.
//!
//! Shape: the producer copies a frame into the slot at `tail` and publishes it by
//! advancing `tail` (release); the consumer reads the slots between `head` and
//! `tail` (acquire) and frees each by advancing `head`. A full ring refuses the
//! frame (the caller counts the drop), so a slow owner never stalls the worker that
//! hands over. Each slot sits behind a `Mutex` that is never contended (the
//! indices already give each slot to one side at a time): it keeps this module
//! free of `unsafe` for the price of an uncontended lock per frame.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// One preallocated frame buffer.
struct Slot {
    len: usize,
    buf: Box<[u8]>,
}

/// An index on a cache line of its own, so producer and consumer do not
/// invalidate each other's line on every frame.
#[repr(align(64))]
struct Padded(AtomicUsize);

struct Ring {
    slots: Box<[Mutex<Slot>]>,
    /// `slots.len() - 1`; the length is a power of two.
    mask: usize,
    /// Next slot to fill; written only by the producer. Counts up forever
    /// (wrapping), the slot is `tail & mask`.
    tail: Padded,
    /// Next slot to read; written only by the consumer.
    head: Padded,
}

/// Why a frame was not handed over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PushError {
    /// Every slot holds a frame the consumer has not taken yet.
    Full,
    /// The frame is longer than a slot.
    TooLong { len: usize, max: usize },
}

/// The producing end; one worker holds it.
pub struct HandoffTx {
    ring: Arc<Ring>,
    slot_size: usize,
}

/// The consuming end; the receiving worker holds it.
pub struct HandoffRx {
    ring: Arc<Ring>,
}

/// A ring of `capacity` slots (rounded up to a power of two) of `slot_size`
/// bytes each, all allocated here and reused for the ring's life.
pub fn handoff_ring(capacity: usize, slot_size: usize) -> (HandoffTx, HandoffRx) {
    let capacity = capacity.max(1).next_power_of_two();
    let slots = (0..capacity)
        .map(|_| {
            Mutex::new(Slot {
                len: 0,
                buf: vec![0u8; slot_size].into_boxed_slice(),
            })
        })
        .collect();
    let ring = Arc::new(Ring {
        slots,
        mask: capacity - 1,
        tail: Padded(AtomicUsize::new(0)),
        head: Padded(AtomicUsize::new(0)),
    });
    (
        HandoffTx {
            ring: ring.clone(),
            slot_size,
        },
        HandoffRx { ring },
    )
}

impl Ring {
    fn slot(&self, index: usize) -> std::sync::MutexGuard<'_, Slot> {
        // The index is masked, so always in range; a poisoned slot (a panic in
        // the consumer's callback) still holds a whole frame or none.
        self.slots[index & self.mask]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }
}

impl HandoffTx {
    /// Copies `frame` into the next free slot and publishes it.
    pub fn push(&mut self, frame: &[u8]) -> Result<(), PushError> {
        if frame.len() > self.slot_size {
            return Err(PushError::TooLong {
                len: frame.len(),
                max: self.slot_size,
            });
        }
        let r = &*self.ring;
        let tail = r.tail.0.load(Ordering::Relaxed);
        let head = r.head.0.load(Ordering::Acquire);
        if tail.wrapping_sub(head) > r.mask {
            return Err(PushError::Full);
        }
        {
            let mut s = r.slot(tail);
            if let Some(dst) = s.buf.get_mut(..frame.len()) {
                dst.copy_from_slice(frame);
            }
            s.len = frame.len();
        }
        r.tail.0.store(tail.wrapping_add(1), Ordering::Release);
        Ok(())
    }
}

impl HandoffRx {
    /// Calls `f` with up to `max` frames, oldest first, freeing each slot after
    /// its call. Returns how many frames were delivered.
    pub fn pop_batch(&mut self, max: usize, mut f: impl FnMut(&[u8])) -> usize {
        let r = &*self.ring;
        let mut head = r.head.0.load(Ordering::Relaxed);
        let tail = r.tail.0.load(Ordering::Acquire);
        let n = tail.wrapping_sub(head).min(max);
        for _ in 0..n {
            {
                let s = r.slot(head);
                f(s.buf.get(..s.len).unwrap_or(&[]));
            }
            head = head.wrapping_add(1);
            r.head.0.store(head, Ordering::Release);
        }
        n
    }

    /// Frames waiting.
    pub fn len(&self) -> usize {
        let r = &*self.ring;
        r.tail
            .0
            .load(Ordering::Acquire)
            .wrapping_sub(r.head.0.load(Ordering::Relaxed))
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Wakes a worker sleeping in poll(2): frames handed to it, or a job from the
/// controller, would otherwise wait for its idle timeout. An eventfd in the
/// worker's poll set, written only while the worker says it sleeps, so a busy
/// worker costs its peers no syscall.
pub struct Doorbell {
    fd: OwnedFd,
    sleeping: AtomicBool,
}

impl Doorbell {
    pub fn new() -> Result<Doorbell, String> {
        // SAFETY: plain eventfd(2); the result is checked before use.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(format!(
                "cannot create a worker eventfd: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(Doorbell {
            // SAFETY: `fd` was just returned by eventfd(2) and is owned by nothing else.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
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
        let mut v = 0u64;
        // SAFETY: reads 8 bytes into `v`; a non-blocking eventfd read with
        // nothing pending fails with EAGAIN, which is fine.
        unsafe { libc::read(self.fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    }

    /// Wakes the worker if it sleeps; call after publishing work for it.
    pub fn ring(&self) {
        // The published work must be visible before the flag is read.
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::SeqCst) {
            let one = 1u64;
            // SAFETY: writes 8 bytes from `one`; a full counter (EAGAIN) already
            // means a wake-up is pending.
            unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
        }
    }

    /// For the worker's poll set.
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(i: usize, len: usize) -> Vec<u8> {
        (0..len).map(|b| (i * 31 + b) as u8).collect()
    }

    fn pop_all(rx: &mut HandoffRx) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        rx.pop_batch(usize::MAX, |f| out.push(f.to_vec()));
        out
    }

    /// Frames come out in order and intact across many wraps of the indices,
    /// with lengths that vary (a short frame after a long one in the same slot
    /// must not show the long one's tail).
    #[test]
    fn order_and_contents_survive_wraparound() {
        let (mut tx, mut rx) = handoff_ring(8, 64);
        let mut next_in = 0;
        let mut next_out = 0;
        for round in 0..100 {
            let burst = 1 + round % 4;
            for _ in 0..burst {
                tx.push(&frame(next_in, 64 - next_in % 50)).unwrap();
                next_in += 1;
            }
            // Take fewer than were pushed sometimes, so head and tail drift.
            let take = if round % 3 == 0 { burst - 1 } else { burst + 4 };
            let mut got = Vec::new();
            rx.pop_batch(take, |f| got.push(f.to_vec()));
            for g in got {
                assert_eq!(g, frame(next_out, 64 - next_out % 50), "frame {next_out}");
                next_out += 1;
            }
            // Keep the ring from filling: drain what is left every few rounds.
            if rx.len() >= 3 {
                for g in pop_all(&mut rx) {
                    assert_eq!(g, frame(next_out, 64 - next_out % 50));
                    next_out += 1;
                }
            }
        }
        for g in pop_all(&mut rx) {
            assert_eq!(g, frame(next_out, 64 - next_out % 50));
            next_out += 1;
        }
        assert_eq!(next_in, next_out);
        assert!(next_in > 8 * 25, "the indices wrapped many times");
    }

    /// A full ring refuses (and does not overwrite) until the consumer frees a
    /// slot; an over-long frame is refused with both lengths.
    #[test]
    fn full_ring_refuses_until_a_slot_is_freed() {
        let (mut tx, mut rx) = handoff_ring(3, 16); // rounded up to 4 slots
        for i in 0..4 {
            tx.push(&[i as u8; 8]).unwrap();
        }
        assert_eq!(tx.push(&[9; 8]), Err(PushError::Full));
        assert_eq!(rx.len(), 4);
        assert_eq!(rx.pop_batch(1, |f| assert_eq!(f, [0; 8])), 1);
        tx.push(&[4; 8]).unwrap();
        assert_eq!(tx.push(&[9; 8]), Err(PushError::Full));
        let got = pop_all(&mut rx);
        assert_eq!(got, (1..=4).map(|i| vec![i as u8; 8]).collect::<Vec<_>>());
        assert!(rx.is_empty());
        assert_eq!(
            tx.push(&[0; 17]),
            Err(PushError::TooLong { len: 17, max: 16 })
        );
        assert_eq!(rx.pop_batch(8, |_| panic!("nothing was queued")), 0);
    }

    /// Frames are delivered from the buffers allocated at creation: over many
    /// laps, every frame the consumer sees lies in one of the `capacity` original
    /// buffers (no per-frame allocation, no buffer replaced).
    #[test]
    fn frames_live_in_the_preallocated_buffers() {
        let (mut tx, mut rx) = handoff_ring(8, 256);
        let mut seen = std::collections::BTreeSet::new();
        for i in 0..1000 {
            tx.push(&frame(i, 1 + i % 256)).unwrap();
            rx.pop_batch(1, |f| {
                seen.insert(f.as_ptr() as usize);
            });
        }
        assert_eq!(seen.len(), 8, "one address per slot, reused: {seen:?}");
    }

    /// Producer and consumer on two threads: every frame arrives once, in order.
    #[test]
    fn two_threads_in_order() {
        let (mut tx, mut rx) = handoff_ring(16, 8);
        const N: u64 = 100_000;
        let producer = std::thread::spawn(move || {
            let mut full = 0u64;
            let mut i = 0u64;
            while i < N {
                match tx.push(&i.to_le_bytes()) {
                    Ok(()) => i += 1,
                    Err(PushError::Full) => {
                        full += 1;
                        std::thread::yield_now();
                    }
                    Err(e) => panic!("{e:?}"),
                }
            }
            full
        });
        let mut expect = 0u64;
        while expect < N {
            rx.pop_batch(32, |f| {
                let v = u64::from_le_bytes(f.try_into().unwrap());
                assert_eq!(v, expect);
                expect += 1;
            });
        }
        producer.join().unwrap();
        assert!(rx.is_empty());
    }

    fn readable(fd: RawFd) -> bool {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, zero timeout.
        unsafe { libc::poll(&mut p, 1, 0) == 1 }
    }

    /// The doorbell rings only for a sleeping worker, and waking clears it.
    #[test]
    fn doorbell_rings_only_while_sleeping() {
        let d = Doorbell::new().unwrap();
        d.ring();
        assert!(!readable(d.fd()), "an awake worker is not woken");
        d.going_to_sleep();
        d.ring();
        assert!(readable(d.fd()));
        d.woke();
        assert!(!readable(d.fd()));
        d.ring();
        assert!(!readable(d.fd()));
    }
}
