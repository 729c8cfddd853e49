//! The worker's per-frame calls about a port's rate limits (`machinery::ratelimit`):
//! how long to wait before taking a guest's next frame, whether a frame for a guest
//! may be delivered now, and the count of those that found the worker's queue full.

use super::ports::slot_mut;
use super::Engine;
use crate::drop::DropReason;
use crate::ids::PortId;

impl Engine {
    /// How long the caller must wait before taking port `port`'s next frame from
    /// its guest (`None`: take it now): its egress limit's tokens are spent
    /// (ratelimit.rs). Counted (`egress_throttled`) when it must wait.
    #[inline]
    pub fn egress_wait(&mut self, port: PortId, now: u64) -> Option<u64> {
        let p = slot_mut(&mut self.ports, port)?;
        let wait = p.policer.egress_wait(now);
        if wait.is_some() {
            p.c.egress_throttled += 1;
        }
        wait
    }

    /// Takes the tokens for a frame of `len` bytes to deliver to port `port`'s
    /// guest, or says how long to wait before it may be delivered: its ingress
    /// limit's tokens are spent (the caller holds the frame meanwhile; see
    /// ratelimit.rs). Counted (`ingress_throttled`) when it must wait.
    #[inline]
    pub fn ingress_take(&mut self, port: PortId, len: usize, now: u64) -> Result<(), u64> {
        let Some(p) = slot_mut(&mut self.ports, port) else {
            return Ok(());
        };
        match p.policer.ingress_wait(now) {
            None => {
                p.policer.ingress(len, now);
                Ok(())
            }
            Some(ns) => {
                p.c.ingress_throttled += 1;
                Err(ns)
            }
        }
    }

    /// Counts a frame for port `port` dropped because the frames waiting for its
    /// ingress limit already fill their queue (`rate_limited`).
    pub fn ingress_overflow(&mut self, port: PortId) {
        if let Some(p) = slot_mut(&mut self.ports, port) {
            p.c.drops.inc(DropReason::RateLimited);
        }
    }
}
