//! Saved configuration the dataplane does not hold: why, how often it was tried, and
//! when it is tried again.
//!
//! A refusal at start is usually temporary (a guest's namespace is created after the
//! daemon, the underlay's MTU is raised a moment later), so refused items are retried
//! on an exponential back-off, from one second up to a minute: quick enough that a
//! late namespace is picked up in seconds, slow enough that an item refused for good
//! costs nothing. A port whose namespace was missing is also retried as soon as the
//! namespace exists, without waiting for its back-off.

use api::NotApplied;
use std::time::{Duration, Instant};

/// Wait after the first refusal; doubled after each further one.
const FIRST_RETRY: Duration = Duration::from_secs(1);
/// The longest wait between two attempts.
const MAX_RETRY: Duration = Duration::from_secs(60);

/// One saved item the dataplane refused.
#[derive(Clone, Debug)]
pub(super) struct Retry {
    reason: String,
    attempts: u32,
    next: Instant,
    /// For a port moved into a namespace: whether the namespace existed at the last
    /// attempt (a port refused while it did not is retried as soon as it does).
    netns_seen: bool,
}

/// The wait after `attempts` refusals.
fn backoff(attempts: u32) -> Duration {
    let doublings = attempts.saturating_sub(1).min(16);
    FIRST_RETRY.saturating_mul(1 << doublings).min(MAX_RETRY)
}

impl Retry {
    /// The record after a refusal at `now`, following `previous` ones.
    pub(super) fn after(
        previous: Option<&Retry>,
        reason: &dyn std::fmt::Display,
        now: Instant,
        netns_seen: bool,
    ) -> Retry {
        let attempts = previous.map_or(1, |p| p.attempts.saturating_add(1));
        Retry {
            reason: reason.to_string(),
            attempts,
            next: now + backoff(attempts),
            netns_seen,
        }
    }

    pub(super) fn reason(&self) -> &str {
        &self.reason
    }

    /// Whether its back-off has run out at `now`.
    pub(super) fn is_due(&self, now: Instant) -> bool {
        now >= self.next
    }

    /// Whether a namespace that `exists_now` was missing at the last attempt.
    pub(super) fn netns_appeared(&self, exists_now: bool) -> bool {
        exists_now && !self.netns_seen
    }

    /// What `list-ports` and `stats` show.
    pub(super) fn view(&self, now: Instant) -> NotApplied {
        let wait = self.next.saturating_duration_since(now);
        NotApplied {
            reason: self.reason.clone(),
            attempts: self.attempts,
            retry_in_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_a_minute() {
        let waits: Vec<u64> = (1..=8).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(backoff(u32::MAX), MAX_RETRY);
    }

    #[test]
    fn attempts_count_and_due_time_follow_the_backoff() {
        let t0 = Instant::now();
        let first = Retry::after(None, &"no netns", t0, false);
        assert!(!first.is_due(t0));
        assert!(first.is_due(t0 + Duration::from_secs(1)));
        let t1 = t0 + Duration::from_secs(1);
        let second = Retry::after(Some(&first), &"still none", t1, false);
        assert!(!second.is_due(t1 + Duration::from_millis(1999)));
        assert!(second.is_due(t1 + Duration::from_secs(2)));
        let v = second.view(t1 + Duration::from_millis(500));
        assert_eq!(
            v,
            NotApplied {
                reason: "still none".into(),
                attempts: 2,
                retry_in_ms: 1500,
            }
        );
        assert_eq!(second.view(t1 + Duration::from_secs(9)).retry_in_ms, 0);
    }

    #[test]
    fn only_a_namespace_missing_before_counts_as_appeared() {
        let t0 = Instant::now();
        assert!(Retry::after(None, &"x", t0, false).netns_appeared(true));
        assert!(!Retry::after(None, &"x", t0, false).netns_appeared(false));
        assert!(!Retry::after(None, &"x", t0, true).netns_appeared(true));
    }
}
