//! The underlay paths the path watch (`underlay::pathwatch`) took out of use:
//! (destination, link) pairs whose probes are lost although the link is up.
//!
//! Why shared: each worker's resolver publishes its own next-hop snapshot, and
//! every one of them must leave the same paths out. The set changes a few times
//! a day at most, so a mutex is enough; the resolvers read it only when they
//! publish, and are woken (their eventfds) to publish again when it changes.

use dpio::netlink::NextHop;
use dpio::poll::EventFd;
use std::collections::HashSet;
use std::net::Ipv6Addr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// The paths out of use, and the resolvers to wake when they change.
#[derive(Default)]
pub struct PathsDown {
    inner: Mutex<Inner>,
    /// Increases with every change: what a resolver compares with the last one
    /// it published with.
    generation: AtomicU64,
}

#[derive(Default)]
struct Inner {
    down: HashSet<(Ipv6Addr, u32)>,
    resolvers: Vec<Arc<EventFd>>,
}

impl PathsDown {
    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Has `wake` rung whenever the set changes.
    pub fn subscribe(&self, wake: Arc<EventFd>) {
        self.inner().resolvers.push(wake);
    }

    /// Replaces the set with `down` ((destination, link index) pairs); wakes the
    /// resolvers when that changed it.
    pub fn set(&self, down: HashSet<(Ipv6Addr, u32)>) {
        let mut inner = self.inner();
        if inner.down == down {
            return;
        }
        inner.down = down;
        self.generation.fetch_add(1, Ordering::AcqRel);
        for r in &inner.resolvers {
            r.notify();
        }
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// `hops` toward `dst` without the paths out of use; all of them when every
    /// one is (as for links down: the frames are lost either way, and a path
    /// declared down by lost replies may still carry the requests).
    pub fn filter(&self, dst: Ipv6Addr, hops: &[NextHop]) -> Vec<NextHop> {
        let inner = self.inner();
        let up: Vec<NextHop> = hops
            .iter()
            .filter(|h| !inner.down.contains(&(dst, h.ifindex)))
            .copied()
            .collect();
        if up.is_empty() {
            hops.to_vec()
        } else {
            up
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wire::MacAddr;

    fn hop(ifindex: u32) -> NextHop {
        NextHop {
            ifindex,
            src_mac: MacAddr([2, 0, 0, 0, 0, 1]),
            dst_mac: MacAddr([2, 0, 0, 0, 0, 2]),
        }
    }

    #[test]
    fn paths_down_leave_the_set_but_never_empty_it() {
        let paths = PathsDown::default();
        let (a, b): (Ipv6Addr, Ipv6Addr) =
            ("fd00:99::2".parse().unwrap(), "fd00:99::3".parse().unwrap());
        let hops = [hop(4), hop(5)];
        assert_eq!(paths.filter(a, &hops), hops);
        let wake = Arc::new(EventFd::new().unwrap());
        paths.subscribe(wake.clone());
        paths.set([(a, 5)].into());
        assert_eq!(paths.generation(), 1);
        assert_eq!(paths.filter(a, &hops), [hop(4)]);
        assert_eq!(
            paths.filter(b, &hops),
            hops,
            "another destination keeps both"
        );
        paths.set([(a, 5)].into());
        assert_eq!(paths.generation(), 1, "no change, no wake-up");
        paths.set([(a, 4), (a, 5)].into());
        assert_eq!(paths.filter(a, &hops), hops, "all down: all kept");
    }
}
