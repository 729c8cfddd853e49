//! Waiting for a condition instead of sleeping a fixed time: on a noisy 2-core machine
//! a fixed sleep is either too short (flaky) or too long (slow).

use crate::{Error, Result};
use std::thread;
use std::time::{Duration, Instant};

/// Calls `probe` until it returns `Ok`, at most for `timeout`. On timeout the error
/// names `what` and carries the probe's last error, which says how far it got.
pub fn poll_until<T>(
    what: &str,
    timeout: Duration,
    mut probe: impl FnMut() -> Result<T>,
) -> Result<T> {
    let start = Instant::now();
    let mut pause = Duration::from_millis(10);
    loop {
        match probe() {
            Ok(v) => return Ok(v),
            Err(e) if start.elapsed() >= timeout => {
                return Err(Error::new(format!(
                    "timed out after {:.1?} waiting for {what}; last: {e}",
                    start.elapsed()
                )))
            }
            Err(_) => {
                thread::sleep(pause);
                // Back off to at most 200 ms so slow conditions don't busy the CPUs.
                pause = (pause * 2).min(Duration::from_millis(200));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_first_success() {
        let mut n = 0;
        let v = poll_until("n to reach 3", Duration::from_secs(5), || {
            n += 1;
            if n >= 3 {
                Ok(n)
            } else {
                Err(Error::new(format!("n is {n}")))
            }
        })
        .unwrap();
        assert_eq!(v, 3);
    }

    #[test]
    fn timeout_reports_last_error() {
        let err = poll_until::<()>("never", Duration::from_millis(50), || {
            Err(Error::new("still no"))
        })
        .unwrap_err();
        assert!(err.0.contains("waiting for never"), "{err}");
        assert!(err.0.contains("still no"), "{err}");
    }
}
