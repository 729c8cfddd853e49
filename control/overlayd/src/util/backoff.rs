//! Back-off between attempts at something that may work later.

use std::time::Duration;

/// Waits between attempts at something that failed and may work later (a tap
/// coming back, a next hop resolving, an underlay link re-attaching): short at
/// first, doubling up to a ceiling, so a fault that lasts costs almost nothing and
/// one that clears is noticed soon.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    wait: Duration,
    max: Duration,
}

impl Backoff {
    pub const fn new(first: Duration, max: Duration) -> Backoff {
        Backoff { wait: first, max }
    }

    /// The wait before the next attempt; the one after is twice as long, at most
    /// the ceiling.
    pub fn next_wait(&mut self) -> Duration {
        let w = self.wait;
        self.wait = (w * 2).min(self.max);
        w
    }
}
