//! Underlay next hops for the datapath worker, resolved on a thread of their own.
//!
//! Resolving a destination takes three netlink round trips (route, link,
//! neighbour), and every cached destination is re-read each [`MAX_AGE`]. With many
//! sleds that is far too slow for the worker, which must never block between
//! batches. So a resolver thread owns the [`NeighbourCache`] and its netlink socket
//! and publishes an immutable snapshot of the resolved next hops; the worker holds
//! an `Arc` to the current snapshot, looks destinations up in it with a plain
//! HashMap probe, checks once per batch (one atomic load) whether a newer snapshot
//! exists, and hands the destinations it missed to the resolver over a bounded
//! channel.
//!
//! A snapshot also says whether a next hop that was published before changed or
//! disappeared. The engine bakes the next hop into each compiled flow, so the
//! worker must then make the engine recompile its flows: [`NextHops::sync`] reports
//! it, and the worker invalidates the engine's flows.

use dpio::netlink::{NeighbourCache, NextHop, Refresh};
use serde::Serialize;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::net::Ipv6Addr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// How long a resolved next hop is trusted before it is re-read from the kernel
/// (MAC and route changes show up within this time).
pub const MAX_AGE: Duration = Duration::from_secs(5);

/// Shortest time between two retries of the unresolved destinations.
const RETRY_INTERVAL: Duration = Duration::from_millis(20);

/// Retries an unresolved destination gets (at least [`RETRY_INTERVAL`] apart, so
/// about as long as the kernel's own NDP attempts); a later miss asks again.
const UNRESOLVED_RETRIES: u32 = 150;

/// How long the worker waits before asking again about a destination it already
/// asked about; shorter than the resolver's retry span, so a destination the
/// resolver gave up on is picked up again while traffic for it continues.
const ASK_AGAIN: Duration = Duration::from_secs(1);

/// Resolution requests that may wait for the resolver; beyond it the worker keeps
/// the miss and asks again after a later batch.
const REQUEST_QUEUE: usize = 1024;

/// One published state of the resolver's cache.
#[derive(Clone, Default)]
struct Snapshot {
    /// Increases with every publication.
    version: u64,
    next_hops: Arc<HashMap<Ipv6Addr, NextHop>>,
    /// How many publications so far changed or removed a next hop that had been
    /// published before.
    invalidations: u64,
}

/// What the resolver publishes and the worker reads.
#[derive(Default)]
struct Shared {
    /// `current.version`, readable without the lock: the worker's per-batch check.
    version: AtomicU64,
    current: Mutex<Snapshot>,
}

impl Shared {
    fn publish(&self, next_hops: &HashMap<Ipv6Addr, NextHop>, invalidate: bool) {
        let mut cur = self.current.lock().unwrap_or_else(|p| p.into_inner());
        cur.version += 1;
        cur.next_hops = Arc::new(next_hops.clone());
        cur.invalidations += u64::from(invalidate);
        self.version.store(cur.version, Ordering::Release);
    }

    fn snapshot(&self) -> Snapshot {
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// Counters of the next-hop machinery, for `stats`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct NeighbourStats {
    /// Next hops in the snapshot the worker uses.
    pub entries: usize,
    /// Snapshots the worker picked up.
    pub snapshots: u64,
    /// Snapshots that changed or removed a next hop, each making the engine
    /// recompile its flows.
    pub invalidations: u64,
    /// Resolution requests put off because the resolver's queue was full.
    pub requests_deferred: u64,
}

/// The worker's side: the current snapshot, this batch's misses, and the resolver
/// thread (stopped and joined on drop).
pub struct NextHops {
    shared: Arc<Shared>,
    current: Snapshot,
    /// Destinations looked up without an entry during the current batch. A
    /// `RefCell` because the engine looks next hops up through `&self`.
    misses: RefCell<Vec<Ipv6Addr>>,
    /// Destinations already handed to the resolver, and since when this set is
    /// collecting (cleared every [`ASK_AGAIN`]).
    asked: HashSet<Ipv6Addr>,
    asked_since: Instant,
    /// `None` once dropped, which ends the resolver's loop.
    requests: Option<SyncSender<Ipv6Addr>>,
    resolver: Option<thread::JoinHandle<()>>,
    stats: NeighbourStats,
}

impl NextHops {
    /// Opens the resolver's netlink socket (here, so the error is the caller's and
    /// the socket is in the caller's network namespace) and starts the resolver.
    pub fn start() -> Result<NextHops, String> {
        let cache = NeighbourCache::new(MAX_AGE).map_err(|e| format!("neighbour cache: {e}"))?;
        let shared = Arc::new(Shared::default());
        let (tx, rx) = mpsc::sync_channel(REQUEST_QUEUE);
        let shared2 = shared.clone();
        let resolver = thread::Builder::new()
            .name("neighbours".into())
            .spawn(move || resolve_loop(cache, &rx, &shared2))
            .map_err(|e| format!("cannot start the neighbour resolver: {e}"))?;
        Ok(NextHops {
            shared,
            current: Snapshot::default(),
            misses: RefCell::new(Vec::new()),
            asked: HashSet::new(),
            asked_since: Instant::now(),
            requests: Some(tx),
            resolver: Some(resolver),
            stats: NeighbourStats::default(),
        })
    }

    /// The next hop toward `dst` in the current snapshot; a miss is remembered
    /// and handed to the resolver by the next [`Self::sync`].
    pub fn lookup(&self, dst: Ipv6Addr) -> Option<NextHop> {
        let hit = self.current.next_hops.get(&dst).copied();
        if hit.is_none() && !self.asked.contains(&dst) {
            let mut misses = self.misses.borrow_mut();
            if !misses.contains(&dst) {
                misses.push(dst);
            }
        }
        hit
    }

    /// Between batches: sends this batch's misses to the resolver and picks up a
    /// newer snapshot if there is one. Returns true when a next hop that flows may
    /// have been compiled with changed or disappeared since the last call: the
    /// caller must then have the engine recompile its flows. No syscall, no
    /// blocking: one atomic load, and the lock only when a snapshot is new.
    pub fn sync(&mut self, now: Instant) -> bool {
        if now.duration_since(self.asked_since) >= ASK_AGAIN {
            self.asked.clear();
            self.asked_since = now;
        }
        if let Some(tx) = &self.requests {
            for dst in self.misses.get_mut().drain(..) {
                match tx.try_send(dst) {
                    Ok(()) => {
                        self.asked.insert(dst);
                    }
                    // Not marked as asked: the next miss asks again.
                    Err(TrySendError::Full(_)) => self.stats.requests_deferred += 1,
                    Err(TrySendError::Disconnected(_)) => {
                        tracing::error!("neighbour resolver has stopped");
                    }
                }
            }
        }
        if self.shared.version.load(Ordering::Acquire) == self.current.version {
            return false;
        }
        let new = self.shared.snapshot();
        let invalidate = new.invalidations != self.current.invalidations;
        self.stats.snapshots += 1;
        self.stats.invalidations += u64::from(invalidate);
        self.current = new;
        invalidate
    }

    pub fn stats(&self) -> NeighbourStats {
        NeighbourStats {
            entries: self.current.next_hops.len(),
            ..self.stats.clone()
        }
    }
}

impl engine::UnderlayRoutes for NextHops {
    fn next_hop(&self, dst: Ipv6Addr) -> Option<engine::NextHop> {
        let nh = self.lookup(dst)?;
        Some(engine::NextHop {
            ifindex: nh.ifindex,
            src_mac: nh.src_mac,
            dst_mac: nh.dst_mac,
        })
    }
}

impl Drop for NextHops {
    fn drop(&mut self) {
        // Closing the channel wakes the resolver, which then returns.
        self.requests.take();
        if let Some(t) = self.resolver.take() {
            let _ = t.join();
        }
    }
}

/// Unresolved destinations and how many passes have tried each.
#[derive(Default)]
struct Pending {
    dsts: Vec<(Ipv6Addr, u32)>,
    last_retry: Option<Instant>,
}

impl Pending {
    fn add(&mut self, dst: Ipv6Addr, tries: u32) {
        if !self.dsts.iter().any(|(d, _)| *d == dst) {
            self.dsts.push((dst, tries));
        }
    }

    /// The destinations to try now: new ones at once, the others once every
    /// [`RETRY_INTERVAL`].
    fn due(&mut self, now: Instant) -> Vec<Ipv6Addr> {
        let retry = self
            .last_retry
            .is_none_or(|t| now.duration_since(t) >= RETRY_INTERVAL);
        if retry {
            self.last_retry = Some(now);
        }
        self.dsts
            .iter()
            .filter(|(_, tries)| retry || *tries == 0)
            .map(|(d, _)| *d)
            .collect()
    }

    /// Records a pass over `tried`: resolved ones leave, the others count a try
    /// and leave after [`UNRESOLVED_RETRIES`].
    fn tried(&mut self, tried: &[Ipv6Addr], unresolved: &[Ipv6Addr]) {
        self.dsts.retain_mut(|(d, tries)| {
            if !tried.contains(d) {
                return true;
            }
            *tries += 1;
            unresolved.contains(d) && *tries < UNRESOLVED_RETRIES
        });
    }

    /// How long the resolver may sleep before the next retry is due.
    fn wait(&self, now: Instant) -> Option<Duration> {
        if self.dsts.is_empty() {
            return None;
        }
        Some(self.last_retry.map_or(Duration::ZERO, |t| {
            RETRY_INTERVAL.saturating_sub(now.duration_since(t))
        }))
    }
}

/// The resolver thread: waits for misses or for the next refresh, resolves, and
/// publishes a snapshot whenever the cache changed. Returns when the worker's side
/// is dropped.
fn resolve_loop(mut cache: NeighbourCache, requests: &mpsc::Receiver<Ipv6Addr>, shared: &Shared) {
    let mut pending = Pending::default();
    loop {
        let now = Instant::now();
        let mut wait = cache.refresh_due_in(now);
        if let Some(w) = pending.wait(now) {
            wait = wait.min(w);
        }
        match requests.recv_timeout(wait) {
            Ok(dst) => pending.add(dst, 0),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        while let Ok(dst) = requests.try_recv() {
            pending.add(dst, 0);
        }
        let now = Instant::now();
        let mut changes = Refresh::default();
        let todo = pending.due(now);
        if !todo.is_empty() {
            let r = cache.update(&todo);
            pending.tried(&todo, &r.unresolved);
            merge(&mut changes, r);
        }
        if cache.refresh_due_in(now).is_zero() {
            let r = cache.refresh(now);
            for &dst in &r.unresolved {
                tracing::debug!(%dst, "underlay next hop lost; resolving");
                pending.add(dst, 1);
            }
            merge(&mut changes, r);
        }
        if changes.next_hops_changed || changes.next_hops_added {
            shared.publish(cache.entries(), changes.next_hops_changed);
        }
    }
}

fn merge(into: &mut Refresh, r: Refresh) {
    into.next_hops_changed |= r.next_hops_changed;
    into.next_hops_added |= r.next_hops_added;
}

#[cfg(test)]
mod tests {
    use super::*;
    use wire::MacAddr;

    fn hop(last: u8) -> NextHop {
        NextHop {
            ifindex: 2,
            src_mac: MacAddr([2, 0, 0, 0, 0, 1]),
            dst_mac: MacAddr([2, 0, 0, 0, 0, last]),
        }
    }

    /// A worker side fed by a test instead of a resolver thread.
    fn worker(shared: Arc<Shared>) -> NextHops {
        NextHops {
            shared,
            current: Snapshot::default(),
            misses: RefCell::new(Vec::new()),
            asked: HashSet::new(),
            asked_since: Instant::now(),
            requests: None,
            resolver: None,
            stats: NeighbourStats::default(),
        }
    }

    /// The worker sees a snapshot only after `sync`, and `sync` asks for an
    /// invalidation exactly when a publication changed or removed a next hop.
    #[test]
    fn sync_reports_invalidations_only_for_changed_next_hops() {
        let shared = Arc::new(Shared::default());
        let mut w = worker(shared.clone());
        let dst: Ipv6Addr = "fd00::7".parse().unwrap();
        let now = Instant::now();
        assert_eq!(w.lookup(dst), None);
        assert!(!w.sync(now), "nothing published");

        shared.publish(&HashMap::from([(dst, hop(2))]), false);
        assert_eq!(w.lookup(dst), None, "not before sync");
        assert!(!w.sync(now), "an added next hop needs no invalidation");
        assert_eq!(w.lookup(dst), Some(hop(2)));
        assert!(!w.sync(now), "no new snapshot");

        shared.publish(&HashMap::from([(dst, hop(3))]), true);
        assert!(w.sync(now), "a changed next hop invalidates");
        assert_eq!(w.lookup(dst), Some(hop(3)));

        // Two publications between batches, one of them invalidating: still seen.
        shared.publish(&HashMap::new(), true);
        shared.publish(&HashMap::from([(dst, hop(4))]), false);
        assert!(w.sync(now));
        assert_eq!(w.lookup(dst), Some(hop(4)));
        let st = w.stats();
        assert_eq!((st.entries, st.snapshots, st.invalidations), (1, 3, 2));
    }

    /// Misses are sent to the resolver once per batch and not again until
    /// [`ASK_AGAIN`] has passed; a full queue defers, and the miss is asked again.
    #[test]
    fn misses_are_requested_once_until_ask_again() {
        let mut w = worker(Arc::new(Shared::default()));
        let (tx, rx) = mpsc::sync_channel(1);
        w.requests = Some(tx);
        let a: Ipv6Addr = "fd00::a".parse().unwrap();
        let b: Ipv6Addr = "fd00::b".parse().unwrap();
        let t0 = w.asked_since;
        for _ in 0..3 {
            assert_eq!(w.lookup(a), None);
        }
        assert_eq!(w.lookup(b), None);
        w.sync(t0);
        assert_eq!(rx.try_recv(), Ok(a));
        assert_eq!(w.stats().requests_deferred, 1, "b did not fit");
        assert_eq!(w.lookup(a), None);
        assert_eq!(w.lookup(b), None);
        w.sync(t0);
        assert_eq!(rx.try_recv(), Ok(b), "b asked again, a not");
        assert!(rx.try_recv().is_err());
        w.lookup(a);
        w.sync(t0);
        assert!(rx.try_recv().is_err(), "a was asked already");
        // The first batch after ASK_AGAIN forgets what was asked; its misses go out.
        w.sync(t0 + ASK_AGAIN);
        w.lookup(a);
        w.sync(t0 + ASK_AGAIN);
        assert_eq!(rx.try_recv(), Ok(a), "asked again after ASK_AGAIN");
    }

    /// New destinations are tried at once, known ones every RETRY_INTERVAL, and a
    /// destination leaves when resolved or after UNRESOLVED_RETRIES tries.
    #[test]
    fn pending_retries_are_paced_and_bounded() {
        let mut p = Pending::default();
        let a: Ipv6Addr = "fd00::a".parse().unwrap();
        let b: Ipv6Addr = "fd00::b".parse().unwrap();
        let t0 = Instant::now();
        assert_eq!(p.wait(t0), None);
        p.add(a, 0);
        p.add(a, 0);
        assert_eq!(p.due(t0), vec![a]);
        p.tried(&[a], &[a]);
        p.add(b, 0);
        assert_eq!(p.due(t0), vec![b], "a waits for the retry interval");
        p.tried(&[b], &[]);
        assert_eq!(p.dsts, vec![(a, 1)], "b resolved and left");
        assert_eq!(p.wait(t0), Some(RETRY_INTERVAL));
        let mut t = t0;
        for _ in 1..UNRESOLVED_RETRIES {
            t += RETRY_INTERVAL;
            assert_eq!(p.due(t), vec![a]);
            p.tried(&[a], &[a]);
        }
        assert!(
            p.dsts.is_empty(),
            "given up after {UNRESOLVED_RETRIES} tries"
        );
    }
}
