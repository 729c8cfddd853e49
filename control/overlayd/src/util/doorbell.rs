//! The doorbell that wakes a sleeping thread: an eventfd rung only when the thread
//! said it is about to sleep, so a busy worker is never interrupted.

use dpio::poll::EventFd;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{fence, AtomicBool, Ordering};

/// Wakes a worker sleeping in epoll: frames handed to it, or a job from the
/// controller, would otherwise wait for its idle timeout. An eventfd in the
/// worker's epoll set, written only while the worker says it sleeps, so a busy
/// worker costs its peers no syscall.
pub struct Doorbell {
    event: EventFd,
    sleeping: AtomicBool,
}

impl Doorbell {
    pub fn new() -> std::io::Result<Doorbell> {
        Ok(Doorbell {
            event: EventFd::new()?,
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
