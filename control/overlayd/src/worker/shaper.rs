//! Frames for ports over their ingress limit (`set-port-limits --ingress-mbps`,
//! engine `ratelimit.rs`), held until the port's tokens are back.
//!
//! A frame from the underlay cannot be held back at its source, and dropping
//! what finds no token (policing) cut a TCP connection to 12% of a 100 Mbit/s
//! limit in the end-to-end test: its losses came in runs, which cost timeouts.
//! Held here, the frames arrive late rather than not at all, TCP sees a longer
//! round trip, and the connection settles at the limit. The queue is bounded
//! ([`QUEUE_BYTES`] per port); a frame that finds it full is dropped and counted
//! (`rate_limited`). Held frames are copies: the buffers they arrived in go back
//! to the underlay at the end of the round.

use engine::{Engine, PortId, VnetHdr};
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// The most bytes held for one port: 4 MiB, 320 ms at 100 Mbit/s and 32 ms at
/// 1 Gbit/s, so a TCP connection's window fits while it adapts to the limit.
pub const QUEUE_BYTES: usize = 4 << 20;

/// One port's held frames, oldest first.
#[derive(Default)]
struct PortQueue {
    frames: VecDeque<(VnetHdr, Vec<u8>)>,
    bytes: usize,
    /// When the port's tokens are back (set while frames wait).
    due: Option<Instant>,
}

/// The held frames of one worker's ports.
#[derive(Default)]
pub struct IngressShaper {
    queues: HashMap<PortId, PortQueue>,
}

/// What became of a frame offered for delivery.
#[derive(Debug, PartialEq, Eq)]
pub enum Offer {
    /// Deliver it now (its tokens are taken).
    Now,
    /// Held (copied); delivered by [`IngressShaper::release`].
    Held,
    /// Dropped: the port's queue is full (counted by the engine).
    Full,
}

impl IngressShaper {
    /// A frame of `len` bytes for `port`: delivered now if nothing of the port's
    /// waits and its tokens allow, else held in order (`fill` copies it) or
    /// dropped when the queue is full. While nothing is held anywhere (always,
    /// on a worker without limited ports) that costs a length check and the
    /// engine's one branch for an unlimited port. `clock`: now, as an instant and
    /// as the engine's nanoseconds.
    pub fn offer(
        &mut self,
        engine: &mut Engine,
        port: PortId,
        vnet: VnetHdr,
        len: usize,
        fill: impl FnOnce(&mut Vec<u8>),
        clock: (Instant, u64),
    ) -> Offer {
        let (now, nanos) = clock;
        let waiting =
            !self.queues.is_empty() && self.queues.get(&port).is_some_and(|q| !q.frames.is_empty());
        let wait = if waiting {
            None
        } else {
            match engine.ingress_take(port, len, nanos) {
                Ok(()) => return Offer::Now,
                Err(ns) => Some(ns),
            }
        };
        let q = self.queues.entry(port).or_default();
        if q.bytes + len > QUEUE_BYTES {
            engine.ingress_overflow(port);
            return Offer::Full;
        }
        let mut copy = Vec::with_capacity(len);
        fill(&mut copy);
        q.bytes += copy.len();
        q.frames.push_back((vnet, copy));
        if let Some(ns) = wait {
            q.due = Some(now + Duration::from_nanos(ns));
        }
        Offer::Held
    }

    /// Delivers the held frames whose tokens are back, through `write(port,
    /// header, frame)`, which is `None` for a port without a tap (deleted or
    /// down: it loses its held frames). Returns how many were written and how
    /// many writes failed.
    pub fn release(
        &mut self,
        engine: &mut Engine,
        mut write: impl FnMut(PortId, &VnetHdr, &[u8]) -> Option<std::io::Result<()>>,
        clock: (Instant, u64),
    ) -> (u64, u64) {
        let (now, nanos) = clock;
        let (mut written, mut failed) = (0, 0);
        self.queues.retain(|&port, q| {
            if q.due.is_some_and(|d| d > now) {
                return true;
            }
            while let Some((vnet, frame)) = q.frames.front() {
                match engine.ingress_take(port, frame.len(), nanos) {
                    Ok(()) => {
                        match write(port, vnet, frame) {
                            None => return false,
                            Some(Ok(())) => written += 1,
                            Some(Err(e)) => {
                                failed += 1;
                                tracing::debug!(port = port.0, error = %e, "tap write failed");
                            }
                        }
                        q.bytes -= frame.len();
                        q.frames.pop_front();
                    }
                    Err(ns) => {
                        q.due = Some(now + Duration::from_nanos(ns));
                        return true;
                    }
                }
            }
            false
        });
        (written, failed)
    }

    /// When the first held frame may be delivered.
    pub fn next_due(&self) -> Option<Instant> {
        self.queues.values().filter_map(|q| q.due).min()
    }
}
