//! Frames waiting for an underlay next hop.
//!
//! The first packets toward a sled whose neighbour the daemon has not resolved yet
//! (a new sled, boundary services after a restart, a neighbour entry the kernel just
//! lost) would otherwise be dropped, and a TCP handshake would then wait a whole
//! retransmission timeout (1 s) for nothing. Like the kernel's neighbour queue
//! (`unres_qlen`), the engine keeps a few frames per destination and sends them, in
//! order, once the destination resolves; frames that cannot be kept, or wait too
//! long, are dropped and counted (`underlay_hold_overflow`, `underlay_hold_timeout`).
//!
//! The engine is pure and is not called back: the daemon has it look again
//! (`Engine::retry_held`) every round, which costs nothing while no frame waits; a
//! frame therefore leaves in the first round after its next hop is published, and
//! `Engine::tick` drops those that waited too long. Held frames are copies (the tap
//! buffer they came in is reused by the next read). Memory is bounded three ways:
//! [`HOLD_PER_DST`] frames per destination, [`HOLD_DSTS`] destinations and
//! [`HOLD_BYTES`] bytes in all.

use crate::machinery::counters::summed_across_workers;
use serde::Serialize;
use std::collections::VecDeque;
use std::net::Ipv6Addr;

/// Frames kept per destination (the kernel's `unres_qlen` default): enough for a
/// TCP SYN and its retransmission, or a DNS query and its retry.
pub const HOLD_PER_DST: usize = 3;

/// Destinations with frames waiting at once. Each waits at most [`HOLD_TIMEOUT_NS`],
/// so this bounds how many sleds a guest can start talking to in one second
/// without losing first packets.
pub const HOLD_DSTS: usize = 64;

/// Bytes of all held frames together: three 64 KiB TSO buffers for each of five
/// destinations, or three 9000-byte frames for each of the [`HOLD_DSTS`].
pub const HOLD_BYTES: usize = 1 << 20;

/// How long a frame may wait: a next hop that takes longer is not coming soon (the
/// resolver keeps trying), and the guest's own retransmission will follow.
pub const HOLD_TIMEOUT_NS: u64 = 1_000_000_000;

/// A frame waiting for its destination, with what the caller needs to send it.
#[derive(Debug)]
pub struct Held<T> {
    pub tag: T,
    pub frame: Vec<u8>,
    since: u64,
}

/// The frames waiting for one destination, oldest first.
#[derive(Debug)]
struct Waiting<T> {
    dst: Ipv6Addr,
    frames: VecDeque<Held<T>>,
}

/// Counters of the hold queue (`stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct HoldStats {
    /// Frames and bytes waiting now, and for how many destinations.
    pub frames: u64,
    pub bytes: u64,
    pub destinations: u64,
    /// Frames held so far, and those sent once their next hop resolved.
    pub held: u64,
    pub sent: u64,
    /// Frames dropped because the queue was full (also counted per port as
    /// `underlay_hold_overflow`).
    pub overflow: u64,
    /// Frames dropped after waiting [`HOLD_TIMEOUT_NS`] (per port:
    /// `underlay_hold_timeout`).
    pub timeout: u64,
    /// Frames dropped because the port that sent them was removed.
    pub port_removed: u64,
}

// Each worker holds its own frames: the gauges (frames, bytes, destinations)
// add up too.
summed_across_workers!(HoldStats {
    frames,
    bytes,
    destinations,
    held,
    sent,
    overflow,
    timeout,
    port_removed
});

/// The frames waiting for next hops, per destination; `T` is what the caller keeps
/// with each frame to send it later.
#[derive(Debug)]
pub struct HoldQueue<T> {
    /// At most [`HOLD_DSTS`]: a linear search costs less than hashing here.
    waiting: Vec<Waiting<T>>,
    bytes: usize,
    stats: HoldStats,
}

impl<T> Default for HoldQueue<T> {
    fn default() -> Self {
        HoldQueue {
            waiting: Vec::new(),
            bytes: 0,
            stats: HoldStats::default(),
        }
    }
}

impl<T> HoldQueue<T> {
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Keeps a copy of `frame` for `dst`. Returns the tag of the frame that was
    /// dropped for it, if any: the oldest frame for `dst` when [`HOLD_PER_DST`] are
    /// waiting already (as the kernel's neighbour queue does, so the newest — a
    /// retransmission, say — is the one kept), or this frame itself when no more
    /// destinations or bytes may be held. A dropped frame counts as `overflow`.
    pub fn hold(&mut self, dst: Ipv6Addr, tag: T, frame: &[u8], now: u64) -> Option<T> {
        let at = self.waiting.iter().position(|w| w.dst == dst);
        let oldest = at.and_then(|i| {
            let frames = &self.waiting[i].frames;
            frames
                .front()
                .filter(|_| frames.len() >= HOLD_PER_DST)
                .map(|h| h.frame.len())
        });
        let room = at.is_some() || self.waiting.len() < HOLD_DSTS;
        let bytes = self.bytes - oldest.unwrap_or(0) + frame.len();
        if !room || bytes > HOLD_BYTES {
            self.stats.overflow += 1;
            return Some(tag);
        }
        let (i, dropped) = match at {
            Some(i) => (i, oldest.and_then(|_| self.pop_oldest(i)).map(|h| h.tag)),
            None => {
                self.waiting.push(Waiting {
                    dst,
                    frames: VecDeque::with_capacity(HOLD_PER_DST),
                });
                (self.waiting.len() - 1, None)
            }
        };
        self.bytes += frame.len();
        self.stats.held += 1;
        self.stats.overflow += u64::from(dropped.is_some());
        self.waiting[i].frames.push_back(Held {
            tag,
            frame: frame.to_vec(),
            since: now,
        });
        dropped
    }

    /// Removes the oldest frame waiting for destination number `i`.
    fn pop_oldest(&mut self, i: usize) -> Option<Held<T>> {
        let h = self.waiting.get_mut(i)?.frames.pop_front()?;
        self.bytes -= h.frame.len();
        Some(h)
    }

    /// Drops frames that have waited [`HOLD_TIMEOUT_NS`], calling `timed_out` with
    /// each one's tag.
    pub fn expire(&mut self, now: u64, mut timed_out: impl FnMut(T)) {
        let mut bytes = 0;
        let mut n = 0;
        for w in &mut self.waiting {
            while w
                .frames
                .front()
                .is_some_and(|h| now.saturating_sub(h.since) >= HOLD_TIMEOUT_NS)
            {
                if let Some(h) = w.frames.pop_front() {
                    bytes += h.frame.len();
                    n += 1;
                    timed_out(h.tag);
                }
            }
        }
        self.bytes -= bytes;
        self.stats.timeout += n;
        self.waiting.retain(|w| !w.frames.is_empty());
    }

    /// Hands every frame whose destination `resolve` now resolves to `send`, with
    /// the resolution, destination by destination and in the order they were held.
    pub fn release<R>(
        &mut self,
        mut resolve: impl FnMut(Ipv6Addr) -> Option<R>,
        mut send: impl FnMut(&R, Held<T>),
    ) {
        let mut i = 0;
        while i < self.waiting.len() {
            let Some(r) = resolve(self.waiting[i].dst) else {
                i += 1;
                continue;
            };
            let w = self.waiting.swap_remove(i);
            for h in w.frames {
                self.bytes -= h.frame.len();
                self.stats.sent += 1;
                send(&r, h);
            }
        }
    }

    /// Drops (and counts as `port_removed`) the frames whose tag `gone` matches.
    pub fn purge(&mut self, mut gone: impl FnMut(&T) -> bool) {
        let mut bytes = 0;
        let mut n = 0;
        for w in &mut self.waiting {
            w.frames.retain(|h| {
                let keep = !gone(&h.tag);
                if !keep {
                    bytes += h.frame.len();
                    n += 1;
                }
                keep
            });
        }
        self.bytes -= bytes;
        self.stats.port_removed += n;
        self.waiting.retain(|w| !w.frames.is_empty());
    }

    pub fn stats(&self) -> HoldStats {
        HoldStats {
            frames: self.waiting.iter().map(|w| w.frames.len() as u64).sum(),
            bytes: self.bytes as u64,
            destinations: self.waiting.len() as u64,
            ..self.stats
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dst(n: u16) -> Ipv6Addr {
        Ipv6Addr::new(0xfd00, 0x99, 0, 0, 0, 0, 0, n)
    }

    /// Releases everything that resolves per `up`, as (destination, tag) in order.
    fn release(q: &mut HoldQueue<u32>, up: &[Ipv6Addr]) -> Vec<(Ipv6Addr, u32)> {
        let mut sent = Vec::new();
        q.release(
            |d| up.contains(&d).then_some(d),
            |d, h| {
                assert_eq!(h.frame, h.tag.to_be_bytes());
                sent.push((*d, h.tag));
            },
        );
        sent
    }

    #[test]
    fn frames_leave_in_order_when_their_destination_resolves() {
        let mut q = HoldQueue::default();
        for (t, d) in [(1u32, 1), (2, 2), (3, 1), (4, 1)] {
            assert_eq!(q.hold(dst(d), t, &t.to_be_bytes(), 0), None);
        }
        assert_eq!(q.stats().frames, 4);
        assert_eq!(release(&mut q, &[]), vec![]);
        assert_eq!(
            release(&mut q, &[dst(1)]),
            vec![(dst(1), 1), (dst(1), 3), (dst(1), 4)]
        );
        assert_eq!(release(&mut q, &[dst(1), dst(2)]), vec![(dst(2), 2)]);
        assert!(q.is_empty());
        let s = q.stats();
        assert_eq!((s.held, s.sent, s.frames, s.bytes), (4, 4, 0, 0));
    }

    #[test]
    fn a_full_destination_drops_its_oldest_frame() {
        let mut q = HoldQueue::default();
        for t in 0..HOLD_PER_DST as u32 {
            assert_eq!(q.hold(dst(1), t, &t.to_be_bytes(), 0), None);
        }
        assert_eq!(q.hold(dst(1), 9, &9u32.to_be_bytes(), 0), Some(0));
        assert_eq!(q.stats().overflow, 1);
        assert_eq!(
            release(&mut q, &[dst(1)]),
            vec![(dst(1), 1), (dst(1), 2), (dst(1), 9)]
        );
    }

    #[test]
    fn destinations_and_bytes_are_bounded() {
        let mut q = HoldQueue::default();
        for d in 0..HOLD_DSTS as u16 {
            assert_eq!(q.hold(dst(d), 0, &[0; 4], 0), None);
        }
        assert_eq!(
            q.hold(dst(999), 7, &[0; 4], 0),
            Some(7),
            "no 65th destination"
        );
        // A known destination still takes frames.
        assert_eq!(q.hold(dst(0), 8, &[0; 4], 0), None);
        let mut q = HoldQueue::default();
        let big = vec![0u8; HOLD_BYTES / 2];
        assert_eq!(q.hold(dst(1), 1, &big, 0), None);
        assert_eq!(q.hold(dst(2), 2, &big, 0), None);
        assert_eq!(q.hold(dst(3), 3, &[0], 0), Some(3), "over the byte bound");
        assert_eq!(q.hold(dst(1), 4, &[0], 0), Some(4), "over the byte bound");
        assert_eq!(
            q.stats().destinations,
            2,
            "the refused destination left no entry"
        );
        assert_eq!(q.stats().bytes, HOLD_BYTES as u64);
        assert_eq!(q.stats().overflow, 2);
    }

    #[test]
    fn frames_time_out_oldest_first() {
        let mut q = HoldQueue::default();
        q.hold(dst(1), 1, &[1], 0);
        q.hold(dst(2), 2, &[2], 500_000_000);
        q.hold(dst(1), 3, &[3], 600_000_000);
        let mut gone = Vec::new();
        q.expire(HOLD_TIMEOUT_NS - 1, |t| gone.push(t));
        assert!(gone.is_empty());
        q.expire(HOLD_TIMEOUT_NS + 550_000_000, |t| gone.push(t));
        assert_eq!(gone, vec![1, 2]);
        let s = q.stats();
        assert_eq!((s.timeout, s.frames, s.bytes, s.destinations), (2, 1, 1, 1));
        q.purge(|t| *t == 3);
        assert!(q.is_empty());
        assert_eq!((q.stats().port_removed, q.stats().bytes), (1, 0));
    }
}
