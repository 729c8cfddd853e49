//! Waits between reconnects: exponential, capped, with full jitter.

use std::time::Duration;

/// The wait before the next attempt at reaching the store. The ceiling doubles with
/// every failure up to a cap, and the wait is drawn uniformly between zero and the
/// ceiling ("full jitter"): when a partition heals, 1,000 sleds that lost the store
/// together reconnect spread over the whole window instead of in synchronised
/// waves, and a member that just came back is not flattened by them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    first: Duration,
    cap: Duration,
    ceiling: Duration,
}

impl Backoff {
    /// Starts with ceiling `first`, doubling up to `cap` (a `first` above `cap`
    /// starts at `cap`).
    pub fn new(first: Duration, cap: Duration) -> Backoff {
        let first = first.min(cap);
        Backoff {
            first,
            cap,
            ceiling: first,
        }
    }

    /// The wait before the next attempt, in `[0, ceiling]`; the ceiling after it is
    /// twice as high, at most the cap.
    pub fn next_wait(&mut self) -> Duration {
        let wait = full_jitter(self.ceiling, random_u64());
        self.ceiling = self.ceiling.saturating_mul(2).min(self.cap);
        wait
    }

    /// The bound of the next wait: for logs ("retrying within 8s").
    pub fn ceiling(&self) -> Duration {
        self.ceiling
    }

    /// Back to the first ceiling, after an attempt that worked.
    pub fn reset(&mut self) {
        self.ceiling = self.first;
    }
}

/// `ceiling * random / 2^64`: uniform in `[0, ceiling]` at nanosecond resolution.
fn full_jitter(ceiling: Duration, random: u64) -> Duration {
    let nanos = ceiling.as_nanos().min(u128::from(u64::MAX));
    let scaled = (nanos * u128::from(random)) >> 64;
    // `scaled` < `nanos` <= u64::MAX, so the conversion cannot fail.
    Duration::from_nanos(u64::try_from(scaled).unwrap_or(u64::MAX))
}

/// 64 bits from the kernel's CSPRNG (also picks the first endpoint to try). getrandom(2) does not fail once the pool is
/// initialised (early boot is long past when a daemon reconnects); if it ever did,
/// the middle of the window is still a valid wait, only not a spread one.
pub(crate) fn random_u64() -> u64 {
    getrandom::u64().unwrap_or(u64::MAX / 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_spans_zero_to_the_ceiling() {
        let ceiling = Duration::from_secs(8);
        assert_eq!(full_jitter(ceiling, 0), Duration::ZERO);
        assert_eq!(full_jitter(ceiling, u64::MAX / 2 + 1), ceiling / 2);
        let top = full_jitter(ceiling, u64::MAX);
        assert!(top <= ceiling && ceiling.checked_sub(top).unwrap() < Duration::from_nanos(2));
        assert_eq!(full_jitter(Duration::ZERO, u64::MAX), Duration::ZERO);
    }

    #[test]
    fn ceiling_doubles_up_to_the_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let mut ceilings = Vec::new();
        for _ in 0..6 {
            ceilings.push(b.ceiling().as_millis());
            let ceiling = b.ceiling();
            assert!(b.next_wait() <= ceiling);
        }
        assert_eq!(ceilings, [100, 200, 400, 800, 1000, 1000]);
        b.reset();
        assert_eq!(b.ceiling(), Duration::from_millis(100));
        assert_eq!(
            Backoff::new(Duration::from_secs(5), Duration::from_secs(1)).ceiling(),
            Duration::from_secs(1)
        );
    }

    #[test]
    fn waits_are_spread_over_the_window() {
        // 1,000 draws at one ceiling: all within bounds, and they reach both ends of
        // the window (each end missed with probability 0.9^1000, about 1e-46).
        let ceiling = Duration::from_secs(10);
        let mut b = Backoff::new(ceiling, ceiling);
        let waits: Vec<Duration> = (0..1000).map(|_| b.next_wait()).collect();
        assert!(waits.iter().all(|w| *w <= ceiling));
        assert!(waits.iter().any(|w| *w < ceiling / 10));
        assert!(waits.iter().any(|w| *w > ceiling * 9 / 10));
        let mean = waits.iter().sum::<Duration>() / 1000;
        assert!(
            mean > ceiling * 4 / 10 && mean < ceiling * 6 / 10,
            "{mean:?}"
        );
    }
}
