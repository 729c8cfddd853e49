//! Underlay next hops for the datapath worker, resolved on a thread of their own.
//!
//! Resolving a destination takes three netlink round trips (route, link,
//! neighbour). With many sleds that is far too slow for the worker, which must
//! never block between batches. So a resolver thread owns the [`NeighbourCache`]
//! and its netlink socket and publishes an immutable snapshot of the resolved next
//! hops; the worker holds an `Arc` to the current snapshot, looks destinations up
//! in it with a plain HashMap probe, checks once per batch (one atomic load)
//! whether a newer snapshot exists, and hands the destinations it missed to the
//! resolver over a bounded channel (ringing the resolver's eventfd).
//!
//! The resolver sleeps until something happens: a request, a kernel notification
//! (neighbour, IPv6 route and link changes, [`Events`]) or a retry falling due. A
//! neighbour that becomes usable resolves the destinations waiting for it at once;
//! a neighbour or link that changes or goes makes the next hops through it be
//! resolved again at once; a route change re-resolves everything. Unresolved
//! destinations are also retried on a back-off of their own ([`Pending`]), while
//! the worker still asks for them, in case the kernel gave up on a neighbour.
//!
//! A destination reached by a multipath route has one next hop per usable path
//! (an [`engine::NextHopSet`]); the engine picks one per flow by its hash. A link
//! that goes down or loses carrier makes every destination be resolved again at
//! once, so the paths through it leave the sets (and come back with it). A path
//! whose link is up but whose probes are lost ([`PathsDown`], from the path
//! watch) is left out of the published sets the same way; a change of those
//! wakes every resolver to publish again.
//!
//! A snapshot also says whether a next hop that was published before changed or
//! disappeared, or a set grew. The engine bakes the next hop into each compiled
//! flow, so the worker must then make the engine recompile its flows:
//! [`NextHops::sync`] reports it, and the worker invalidates the engine's flows.

use super::paths_down::PathsDown;
use crate::util::Backoff;
use crate::util::Doorbell;
use dpio::netlink::{Affected, Event, Events, Group, NeighbourCache, NextHop, Refresh};
use dpio::poll::{Epoll, EventFd};
use engine::NextHopSet;
use serde::Serialize;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::net::Ipv6Addr;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// Why the resolver did not start.
#[derive(Debug, thiserror::Error)]
pub enum NeighbourError {
    #[error("resolver doorbell: {0}")]
    Doorbell(std::io::Error),
    /// One of the resolver's sockets (`what`: the neighbour cache, the
    /// notifications, its epoll set) could not be opened.
    #[error("neighbour resolver: {what}: {error}")]
    Socket {
        what: &'static str,
        error: std::io::Error,
    },
    #[error("cannot start the neighbour resolver: {0}")]
    Thread(std::io::Error),
}

/// How often every cached next hop is re-read from the kernel even when no
/// notification said it changed: a safety net, since changes are announced.
pub const MAX_AGE: Duration = Duration::from_secs(30);

/// First retry of a destination that did not resolve; each further retry waits
/// twice as long, up to [`MAX_BACKOFF`]. A neighbour that becomes usable is
/// announced and retried at once: these retries cover a kernel that gave up on
/// the neighbour (it is asked again) and routes that appear later.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// How long the worker waits before asking again about a destination it already
/// asked about (while it still has traffic for it and no next hop).
const ASK_AGAIN: Duration = Duration::from_secs(1);

/// An unresolved destination nobody asked about for this long is dropped: the
/// traffic to it has stopped.
const FORGET_AFTER: Duration = Duration::from_secs(3);

/// Resolution requests that may wait for the resolver; beyond it the worker keeps
/// the miss and asks again after a later batch.
const REQUEST_QUEUE: usize = 1024;

/// One published state of the resolver's cache.
#[derive(Clone, Default)]
struct Snapshot {
    /// Increases with every publication.
    version: u64,
    next_hops: Arc<HashMap<Ipv6Addr, NextHopSet>>,
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
    /// Publishes `next_hops` without the paths in `down`.
    fn publish(
        &self,
        next_hops: &HashMap<Ipv6Addr, Vec<NextHop>>,
        down: &PathsDown,
        invalidate: bool,
    ) {
        let sets = next_hops
            .iter()
            .map(|(dst, hops)| {
                let hops = down.filter(*dst, hops);
                (*dst, hops.into_iter().map(engine_hop).collect())
            })
            .collect();
        let mut cur = self
            .current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        cur.version += 1;
        cur.next_hops = Arc::new(sets);
        cur.invalidations += u64::from(invalidate);
        self.version.store(cur.version, Ordering::Release);
    }

    fn snapshot(&self) -> Snapshot {
        self.current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// The engine's copy of a next hop (the engine knows no netlink).
fn engine_hop(h: NextHop) -> engine::NextHop {
    engine::NextHop {
        ifindex: h.ifindex,
        src_mac: h.src_mac,
        dst_mac: h.dst_mac,
    }
}

/// Counters of the next-hop machinery, for `stats`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct NeighbourStats {
    /// Destinations with next hops in the snapshot the worker uses.
    pub entries: usize,
    /// Their next hops: more than `entries` when multipath routes spread
    /// destinations over several links.
    pub paths: usize,
    /// Snapshots the worker picked up.
    pub snapshots: u64,
    /// Snapshots that changed or removed a next hop, each making the engine
    /// recompile its flows.
    pub invalidations: u64,
    /// Resolution requests put off because the resolver's queue was full.
    pub requests_deferred: u64,
}

// Each worker has its own snapshot: its entries add up too.
engine::summed_across_workers!(NeighbourStats {
    entries,
    paths,
    snapshots,
    invalidations,
    requests_deferred,
});

/// The worker's side: the current snapshot, this batch's misses, and the resolver
/// thread (stopped and joined on drop).
pub struct NextHops {
    shared: Arc<Shared>,
    current: Snapshot,
    /// Destinations looked up without an entry during the current batch. A
    /// `RefCell` because the engine looks next hops up through `&self`.
    misses: RefCell<HashSet<Ipv6Addr>>,
    /// Destinations already handed to the resolver, and since when this set is
    /// collecting (cleared every [`ASK_AGAIN`]).
    asked: HashSet<Ipv6Addr>,
    asked_since: Instant,
    /// `None` once dropped, which ends the resolver's loop.
    requests: Option<SyncSender<Ipv6Addr>>,
    /// Rung after sending requests (and on drop): the resolver sleeps in epoll.
    wake: Arc<EventFd>,
    resolver: Option<thread::JoinHandle<()>>,
    stats: NeighbourStats,
}

impl NextHops {
    /// Opens the resolver's netlink sockets (here, so the error is the caller's and
    /// the sockets are in the caller's network namespace) and starts the resolver,
    /// which rings `worker` whenever it publishes a snapshot: a sleeping worker then
    /// sends the frames held for a next hop at once, not at its next timer. The
    /// snapshots leave out the paths in `down`.
    pub fn start(
        worker: Option<Arc<Doorbell>>,
        down: Arc<PathsDown>,
    ) -> Result<NextHops, NeighbourError> {
        let (tx, rx) = mpsc::sync_channel(REQUEST_QUEUE);
        let shared = Arc::new(Shared::default());
        let wake = Arc::new(EventFd::new().map_err(NeighbourError::Doorbell)?);
        down.subscribe(wake.clone());
        let resolver = Resolver::open(rx, shared.clone(), wake.clone(), worker, down)?;
        let resolver = thread::Builder::new()
            .name("neighbours".into())
            .spawn(move || resolver.run())
            .map_err(NeighbourError::Thread)?;
        let mut hops = NextHops::idle(shared, wake);
        hops.requests = Some(tx);
        hops.resolver = Some(resolver);
        Ok(hops)
    }

    /// The worker's side without a resolver: what [`NextHops::start`] completes,
    /// and what tests feed by hand.
    fn idle(shared: Arc<Shared>, wake: Arc<EventFd>) -> NextHops {
        NextHops {
            shared,
            current: Snapshot::default(),
            misses: RefCell::new(HashSet::new()),
            asked: HashSet::new(),
            asked_since: Instant::now(),
            requests: None,
            wake,
            resolver: None,
            stats: NeighbourStats::default(),
        }
    }

    /// The next hops toward `dst` in the current snapshot (empty: none); a miss
    /// is remembered and handed to the resolver by the next [`Self::sync`].
    pub fn lookup(&self, dst: Ipv6Addr) -> NextHopSet {
        let hit = self.current.next_hops.get(&dst).copied();
        if hit.is_none() && !self.asked.contains(&dst) {
            self.misses.borrow_mut().insert(dst);
        }
        hit.unwrap_or_default()
    }

    /// Between batches: sends this batch's misses to the resolver and picks up a
    /// newer snapshot if there is one. Returns true when a next hop that flows may
    /// have been compiled with changed or disappeared since the last call: the
    /// caller must then have the engine recompile its flows. No blocking: one
    /// atomic load, the lock only when a snapshot is new, and one eventfd write
    /// when misses were sent.
    pub fn sync(&mut self, now: Instant) -> bool {
        if now.duration_since(self.asked_since) >= ASK_AGAIN {
            self.asked.clear();
            self.asked_since = now;
        }
        if self.send_misses() {
            self.wake.notify();
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

    /// Hands this batch's misses to the resolver; true when any went.
    fn send_misses(&mut self) -> bool {
        let Some(tx) = &self.requests else {
            return false;
        };
        let mut sent = false;
        for dst in self.misses.get_mut().drain() {
            match tx.try_send(dst) {
                Ok(()) => {
                    self.asked.insert(dst);
                    sent = true;
                }
                // Not marked as asked: the next miss asks again.
                Err(TrySendError::Full(_)) => self.stats.requests_deferred += 1,
                Err(TrySendError::Disconnected(_)) => {
                    tracing::error!("neighbour resolver has stopped");
                }
            }
        }
        sent
    }

    pub fn stats(&self) -> NeighbourStats {
        NeighbourStats {
            entries: self.current.next_hops.len(),
            paths: self.current.next_hops.values().map(NextHopSet::len).sum(),
            ..self.stats.clone()
        }
    }
}

impl engine::UnderlayRoutes for NextHops {
    fn next_hops(&self, dst: Ipv6Addr) -> NextHopSet {
        self.lookup(dst)
    }
}

impl Drop for NextHops {
    fn drop(&mut self) {
        // A closed channel ends the resolver's loop once it wakes.
        self.requests.take();
        self.wake.notify();
        if let Some(t) = self.resolver.take() {
            let _ = t.join();
        }
    }
}

/// When an unresolved destination is tried next, and until when it is wanted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Retry {
    due: Instant,
    /// Gives the wait after each failed try.
    backoff: Backoff,
    /// When the worker last asked for it.
    asked: Instant,
}

/// Unresolved destinations, each retried on its own back-off while the worker
/// asks for it.
#[derive(Default)]
struct Pending {
    dsts: HashMap<Ipv6Addr, Retry>,
}

impl Pending {
    /// The worker asked about `dst`: a new destination is due at once; a known one
    /// keeps its back-off (asking again does not hurry it) and stays wanted.
    fn ask(&mut self, dst: Ipv6Addr, now: Instant) {
        let r = self.dsts.entry(dst).or_insert(Retry {
            due: now,
            backoff: Backoff::new(FIRST_BACKOFF, MAX_BACKOFF),
            asked: now,
        });
        r.asked = now;
    }

    /// `dst` lost its next hop (it was just tried): retried after the first
    /// back-off, while the worker asks for it.
    fn lost(&mut self, dst: Ipv6Addr, now: Instant) {
        self.ask(dst, now);
        self.failed(dst, now);
    }

    /// Makes `dst` due now if it is pending (a notification says it may resolve).
    fn hurry(&mut self, dst: Ipv6Addr, now: Instant) {
        if let Some(r) = self.dsts.get_mut(&dst) {
            r.due = now;
        }
    }

    fn hurry_all(&mut self, now: Instant) {
        for r in self.dsts.values_mut() {
            r.due = now;
        }
    }

    /// Takes the destinations nobody asked about within [`FORGET_AFTER`] out
    /// (returned in `forgotten`) and returns those due now.
    fn due(&mut self, now: Instant, forgotten: &mut Vec<Ipv6Addr>) -> Vec<Ipv6Addr> {
        self.dsts.retain(|d, r| {
            let wanted = now.duration_since(r.asked) < FORGET_AFTER;
            if !wanted {
                forgotten.push(*d);
            }
            wanted
        });
        self.dsts
            .iter()
            .filter(|(_, r)| r.due <= now)
            .map(|(d, _)| *d)
            .collect()
    }

    /// Records a pass over `tried`: resolved ones leave, the others back off.
    fn tried(&mut self, tried: &[Ipv6Addr], unresolved: &[Ipv6Addr], now: Instant) {
        let unresolved: HashSet<&Ipv6Addr> = unresolved.iter().collect();
        for d in tried {
            if unresolved.contains(d) {
                self.failed(*d, now);
            } else {
                self.dsts.remove(d);
            }
        }
    }

    fn failed(&mut self, dst: Ipv6Addr, now: Instant) {
        if let Some(r) = self.dsts.get_mut(&dst) {
            r.due = now + r.backoff.next_wait();
        }
    }

    /// When the earliest retry falls due.
    fn next_due(&self) -> Option<Instant> {
        self.dsts.values().map(|r| r.due).min()
    }
}

/// epoll tokens of the resolver.
const TOKEN_EVENTS: u64 = 0;
const TOKEN_WAKE: u64 = 1;

/// The resolver thread's state.
struct Resolver {
    cache: NeighbourCache,
    pending: Pending,
    events: Events,
    epoll: Epoll,
    wake: Arc<EventFd>,
    /// The worker this resolver serves, woken after each publication.
    worker: Option<Arc<Doorbell>>,
    requests: Receiver<Ipv6Addr>,
    shared: Arc<Shared>,
    /// The paths left out of the snapshots, and the generation of that set the
    /// last snapshot was made with.
    down: Arc<PathsDown>,
    down_seen: u64,
    /// Reused buffer for notifications.
    got: Vec<Event>,
}

impl Resolver {
    /// Opens the cache's socket and the notification socket in the caller's
    /// network namespace.
    fn open(
        requests: Receiver<Ipv6Addr>,
        shared: Arc<Shared>,
        wake: Arc<EventFd>,
        worker: Option<Arc<Doorbell>>,
        down: Arc<PathsDown>,
    ) -> Result<Resolver, NeighbourError> {
        let err = |what| move |error| NeighbourError::Socket { what, error };
        let cache = NeighbourCache::new(MAX_AGE).map_err(err("neighbour cache"))?;
        let events = Events::subscribe(&[Group::Neighbour, Group::Ipv6Route, Group::Link])
            .map_err(err("notifications"))?;
        let epoll = Epoll::new().map_err(err("epoll"))?;
        epoll
            .add(events.as_raw_fd(), TOKEN_EVENTS)
            .and_then(|()| epoll.add(wake.as_raw_fd(), TOKEN_WAKE))
            .map_err(err("epoll"))?;
        Ok(Resolver {
            cache,
            pending: Pending::default(),
            events,
            epoll,
            wake,
            worker,
            requests,
            shared,
            down_seen: down.generation(),
            down,
            got: Vec::new(),
        })
    }

    /// Serves until the worker's side is dropped.
    fn run(mut self) {
        while self.round() {}
    }

    /// Sleeps until something happens, then resolves what is due and publishes a
    /// snapshot if the cache changed. False once the worker's side is gone.
    fn round(&mut self) -> bool {
        self.sleep();
        let now = Instant::now();
        if !self.take_requests(now) {
            return false;
        }
        let mut changes = Refresh::default();
        self.on_events(now, &mut changes);
        self.retry_due(now, &mut changes);
        if self.cache.refresh_due_in(now).is_zero() {
            let r = self.cache.refresh(now);
            self.absorb(r, now, &mut changes);
        }
        // Paths taken out of use or back change the sets as a new next hop would.
        let down_now = self.down.generation();
        let down_changed = down_now != self.down_seen;
        self.down_seen = down_now;
        if changes.next_hops_changed || changes.next_hops_added || down_changed {
            let invalidate = changes.next_hops_changed || down_changed;
            self.shared
                .publish(self.cache.entries(), &self.down, invalidate);
            if let Some(w) = &self.worker {
                w.ring();
            }
        }
        true
    }

    /// Waits for a request, a notification, the next retry or the next refresh.
    fn sleep(&mut self) {
        let now = Instant::now();
        let mut timeout = self.cache.refresh_due_in(now);
        if let Some(due) = self.pending.next_due() {
            timeout = timeout.min(due.saturating_duration_since(now));
        }
        if let Err(e) = self.epoll.wait(timeout).map(|r| r.for_each(drop)) {
            tracing::warn!(error = %e, "neighbour resolver: epoll_wait failed");
            thread::sleep(FIRST_BACKOFF);
        }
        self.wake.clear();
    }

    /// Takes the worker's requests; false once the worker's side is gone.
    fn take_requests(&mut self, now: Instant) -> bool {
        loop {
            match self.requests.try_recv() {
                Ok(dst) => self.pending.ask(dst, now),
                Err(TryRecvError::Empty) => return true,
                Err(TryRecvError::Disconnected) => return false,
            }
        }
    }

    /// Acts on the kernel's notifications: destinations waiting for a neighbour
    /// that became usable are tried now, next hops through a neighbour or link
    /// that changed are resolved again now, and a route change (or lost
    /// notifications) re-resolves everything.
    fn on_events(&mut self, now: Instant, changes: &mut Refresh) {
        self.got.clear();
        if let Err(e) = self.events.drain(&mut self.got) {
            tracing::warn!(error = %e, "neighbour resolver: reading notifications");
            self.got.push(Event::Lost);
        }
        let mut affected = Affected::default();
        for ev in &self.got {
            self.cache.affected_by(ev, &mut affected);
        }
        if affected.all {
            self.pending.hurry_all(now);
            let r = self.cache.refresh(now);
            self.absorb(r, now, changes);
            return;
        }
        for dst in affected.resolvable {
            self.pending.hurry(dst, now);
        }
        if !affected.stale.is_empty() {
            let r = self.cache.update(&affected.stale);
            self.absorb(r, now, changes);
        }
    }

    /// Tries the pending destinations that are due; forgets the unwanted ones.
    fn retry_due(&mut self, now: Instant, changes: &mut Refresh) {
        let mut forgotten = Vec::new();
        let due = self.pending.due(now, &mut forgotten);
        for dst in forgotten {
            self.cache.forget(dst);
        }
        if !due.is_empty() {
            let r = self.cache.update(&due);
            // An incomplete one is asked for again at each try: its missing
            // paths are retried on the back-off until a wait exceeds
            // FORGET_AFTER (about 3 s of tries), then at the next notification
            // or refresh.
            for &dst in &r.incomplete {
                self.pending.ask(dst, now);
            }
            let failed: Vec<Ipv6Addr> = r.unresolved.iter().chain(&r.incomplete).copied().collect();
            self.pending.tried(&due, &failed, now);
            merge(changes, r);
        }
    }

    /// Merges a pass over cached destinations; the ones that lost their next hop
    /// become pending, and so do those short of a path (retried for a few
    /// seconds: a neighbour that fails to answer at first is announced no more).
    fn absorb(&mut self, r: Refresh, now: Instant, changes: &mut Refresh) {
        for &dst in &r.unresolved {
            tracing::debug!(%dst, "underlay next hop lost; resolving");
            self.pending.lost(dst, now);
        }
        for &dst in &r.incomplete {
            self.pending.lost(dst, now);
        }
        merge(changes, r);
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

    /// A next hop through another link.
    fn hop2(last: u8) -> NextHop {
        NextHop {
            ifindex: 3,
            ..hop(last)
        }
    }

    fn set(h: NextHop) -> NextHopSet {
        NextHopSet::from(engine_hop(h))
    }

    /// A worker side fed by a test instead of a resolver thread.
    fn worker(shared: Arc<Shared>) -> NextHops {
        NextHops::idle(shared, Arc::new(EventFd::new().unwrap()))
    }

    /// The worker sees a snapshot only after `sync`, and `sync` asks for an
    /// invalidation exactly when a publication changed or removed a next hop.
    #[test]
    fn sync_reports_invalidations_only_for_changed_next_hops() {
        let shared = Arc::new(Shared::default());
        let mut w = worker(shared.clone());
        let dst: Ipv6Addr = "fd00::7".parse().unwrap();
        let now = Instant::now();
        assert!(w.lookup(dst).is_empty());
        assert!(!w.sync(now), "nothing published");

        shared.publish(
            &HashMap::from([(dst, vec![hop(2)])]),
            &PathsDown::default(),
            false,
        );
        assert!(w.lookup(dst).is_empty(), "not before sync");
        assert!(!w.sync(now), "an added next hop needs no invalidation");
        assert_eq!(w.lookup(dst), set(hop(2)));
        assert!(!w.sync(now), "no new snapshot");

        shared.publish(
            &HashMap::from([(dst, vec![hop(3)])]),
            &PathsDown::default(),
            true,
        );
        assert!(w.sync(now), "a changed next hop invalidates");
        assert_eq!(w.lookup(dst), set(hop(3)));

        // Two publications between batches, one of them invalidating: still seen.
        shared.publish(&HashMap::new(), &PathsDown::default(), true);
        shared.publish(
            &HashMap::from([(dst, vec![hop(4)])]),
            &PathsDown::default(),
            false,
        );
        assert!(w.sync(now));
        assert_eq!(w.lookup(dst), set(hop(4)));
        let st = w.stats();
        assert_eq!((st.entries, st.snapshots, st.invalidations), (1, 3, 2));
        // A destination over two links: one entry, two paths.
        shared.publish(
            &HashMap::from([(dst, vec![hop(4), hop2(5)])]),
            &PathsDown::default(),
            true,
        );
        assert!(w.sync(now));
        assert_eq!(w.lookup(dst).len(), 2);
        assert_eq!((w.stats().entries, w.stats().paths), (1, 2));
        // A path the path watch took out of use leaves the set.
        let down = PathsDown::default();
        down.set([(dst, 3)].into());
        shared.publish(&HashMap::from([(dst, vec![hop(4), hop2(5)])]), &down, true);
        assert!(w.sync(now));
        assert_eq!(w.lookup(dst), set(hop(4)));
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
            assert!(w.lookup(a).is_empty());
        }
        assert!(w.lookup(b).is_empty());
        // The misses are a set: which of the two goes first is up to its order.
        w.sync(t0);
        let first = rx.try_recv().unwrap();
        let second = if first == a { b } else { a };
        assert_eq!(w.stats().requests_deferred, 1, "one did not fit");
        assert!(w.lookup(a).is_empty());
        assert!(w.lookup(b).is_empty());
        w.sync(t0);
        assert_eq!(rx.try_recv(), Ok(second), "the deferred one asked again");
        assert!(rx.try_recv().is_err());
        w.lookup(first);
        w.sync(t0);
        assert!(rx.try_recv().is_err(), "{first} was asked already");
        // The first batch after ASK_AGAIN forgets what was asked; its misses go out.
        w.sync(t0 + ASK_AGAIN);
        w.lookup(a);
        w.sync(t0 + ASK_AGAIN);
        assert_eq!(rx.try_recv(), Ok(a), "asked again after ASK_AGAIN");
    }

    /// A new destination is due at once; each failed try doubles its wait up to
    /// MAX_BACKOFF; asking again neither duplicates nor hurries it, a
    /// notification does; resolved ones leave, and one nobody asks about for
    /// FORGET_AFTER is forgotten.
    #[test]
    fn pending_destinations_back_off_each_on_their_own() {
        let mut p = Pending::default();
        let mut forgotten = Vec::new();
        let a: Ipv6Addr = "fd00::a".parse().unwrap();
        let b: Ipv6Addr = "fd00::b".parse().unwrap();
        let t0 = Instant::now();
        assert_eq!(p.next_due(), None);
        p.ask(a, t0);
        p.ask(a, t0);
        assert_eq!(p.dsts.len(), 1, "a set, not a list");
        assert_eq!(p.due(t0, &mut forgotten), vec![a]);
        p.tried(&[a], &[a], t0);
        assert_eq!(p.next_due(), Some(t0 + FIRST_BACKOFF));
        p.ask(b, t0);
        assert_eq!(
            p.due(t0, &mut forgotten),
            vec![b],
            "a waits for its back-off"
        );
        p.tried(&[b], &[], t0);
        assert!(!p.dsts.contains_key(&b), "b resolved and left");
        // a backs off 100 ms, 200, 400, ... up to MAX_BACKOFF, asked all along.
        let (mut t, mut wait) = (t0 + FIRST_BACKOFF, FIRST_BACKOFF);
        while wait < MAX_BACKOFF {
            p.ask(a, t);
            assert!(p
                .due(
                    t.checked_sub(Duration::from_millis(1)).unwrap(),
                    &mut forgotten
                )
                .is_empty());
            assert_eq!(p.due(t, &mut forgotten), vec![a]);
            p.tried(&[a], &[a], t);
            wait = (wait * 2).min(MAX_BACKOFF);
            assert_eq!(p.next_due(), Some(t + wait));
            t += wait;
        }
        p.ask(a, t);
        p.hurry(a, t.checked_sub(MAX_BACKOFF).unwrap());
        assert_eq!(
            p.due(t.checked_sub(MAX_BACKOFF).unwrap(), &mut forgotten),
            vec![a],
            "hurried"
        );
        assert!(forgotten.is_empty());
        assert!(p.due(t + FORGET_AFTER, &mut forgotten).is_empty());
        assert_eq!(forgotten, vec![a], "nobody asked: forgotten");
        assert!(p.dsts.is_empty());
        // A next hop lost after resolving is retried after the first back-off.
        p.lost(b, t);
        assert_eq!(p.next_due(), Some(t + FIRST_BACKOFF));
    }

    /// A veth pair `devs` between `a` and `b`, up, addressed `{prefix}::a/64` in
    /// `a` and `{prefix}::b/64` in `b`.
    fn veth_between(
        a: &crate::worker::reattach::tests::Netns,
        b: &crate::worker::reattach::tests::Netns,
        (va, vb): (&str, &str),
        prefix: &str,
    ) {
        use crate::worker::reattach::tests::ip;
        ip(&[
            "-n", &a.0, "link", "add", va, "type", "veth", "peer", "name", vb, "netns", &b.0,
        ]);
        for (ns, dev, host) in [(a, va, "a"), (b, vb, "b")] {
            let addr = format!("{prefix}::{host}/64");
            ip(&["-n", &ns.0, "-6", "addr", "add", &addr, "dev", dev, "nodad"]);
            ip(&["-n", &ns.0, "link", "set", dev, "up"]);
        }
    }

    /// Syncs `hops` until `done` holds (told whether any sync so far asked for an
    /// invalidation), for at most `within`; the time it took, and whether one did.
    fn sync_until(
        hops: &mut NextHops,
        what: &str,
        within: Duration,
        done: &dyn Fn(&NextHops, bool) -> bool,
    ) -> (Duration, bool) {
        let t = Instant::now();
        let mut invalidated = false;
        loop {
            invalidated |= hops.sync(Instant::now());
            if done(hops, invalidated) {
                return (t.elapsed(), invalidated);
            }
            assert!(t.elapsed() < within, "{what} within {within:?}");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Against a real kernel (veth `va` fd00::a <-> `vb` fd00::b, fd00:99::/64
    /// routed via fd00::b): a missed destination resolves as soon as its neighbour
    /// does, and a neighbour whose MAC changes makes the worker recompile its flows
    /// at once, long before [`MAX_AGE`]: the resolver follows what the kernel
    /// announces instead of polling.
    #[test]
    fn resolver_follows_what_the_kernel_announces() {
        use crate::worker::reattach::tests::{ip, Netns};
        let (a, b) = (Netns::new("nh-a"), Netns::new("nh-b"));
        veth_between(&a, &b, ("va", "vb"), "fd00");
        ip(&[
            "-n",
            &a.0,
            "-6",
            "route",
            "add",
            "fd00:99::/64",
            "via",
            "fd00::b",
        ]);
        let a_name = a.0.clone();
        dpio::netns::run_in_netns(&a.0, move || {
            let mut hops = NextHops::start(None, Arc::default()).unwrap();
            let far: Ipv6Addr = "fd00:99::7".parse().unwrap();
            let until =
                |hops: &mut NextHops, what: &str, done: &dyn Fn(&NextHops, bool) -> bool| {
                    sync_until(hops, what, Duration::from_secs(3), done).0
                };
            let took = until(&mut hops, "first next hop", &|h, _| {
                !h.lookup(far).is_empty()
            });
            eprintln!("resolved in {took:?}");
            let new_mac = "02:00:00:00:00:42";
            ip(&[
                "-n", &a_name, "-6", "neigh", "replace", "fd00::b", "lladdr", new_mac, "dev", "va",
            ]);
            let took = until(&mut hops, "invalidation", &|_, invalidate| invalidate);
            eprintln!("MAC change picked up in {took:?}");
            assert_eq!(
                hops.lookup(far)
                    .iter()
                    .map(|h| h.dst_mac)
                    .collect::<Vec<_>>(),
                [MacAddr([2, 0, 0, 0, 0, 0x42])]
            );
        })
        .unwrap();
    }

    /// Against a real kernel: two veth pairs (`va1`/`vb1`, `va2`/`vb2`) and
    /// fd00:99::/64 routed over both (a multipath route). The destination
    /// resolves to two next hops; when `va2` loses carrier (its peer goes down)
    /// the set shrinks to the other link with an invalidation at once, and grows
    /// back when the carrier returns.
    #[test]
    fn resolver_spreads_over_a_multipath_route_and_follows_carrier() {
        use crate::worker::reattach::tests::{ip, Netns};
        let (a, b) = (Netns::new("mp-a"), Netns::new("mp-b"));
        for n in ["1", "2"] {
            let (va, vb) = (format!("va{n}"), format!("vb{n}"));
            veth_between(&a, &b, (&va, &vb), &format!("fd00:{n}"));
        }
        ip(&[
            "-n",
            &a.0,
            "-6",
            "route",
            "add",
            "fd00:99::/64",
            "nexthop",
            "via",
            "fd00:1::b",
            "dev",
            "va1",
            "nexthop",
            "via",
            "fd00:2::b",
            "dev",
            "va2",
        ]);
        let b_name = b.0.clone();
        dpio::netns::run_in_netns(&a.0, move || {
            let mut hops = NextHops::start(None, Arc::default()).unwrap();
            let far: Ipv6Addr = "fd00:99::7".parse().unwrap();
            let until = |hops: &mut NextHops, what: &str, paths: usize| {
                sync_until(hops, what, Duration::from_secs(5), &|h, _| {
                    h.lookup(far).len() == paths
                })
            };
            let (took, _) = until(&mut hops, "two next hops", 2);
            eprintln!("both paths resolved in {took:?}");
            let links: Vec<u32> = hops.lookup(far).iter().map(|h| h.ifindex).collect();
            assert_ne!(links[0], links[1], "one next hop per link");
            ip(&["-n", &b_name, "link", "set", "vb2", "down"]);
            let (took, invalidated) = until(&mut hops, "failover", 1);
            eprintln!("carrier loss followed in {took:?}");
            assert!(
                invalidated,
                "the flows through the lost path are recompiled"
            );
            ip(&["-n", &b_name, "link", "set", "vb2", "up"]);
            // Linux dropped the address of the downed link: the peer's
            // configuration puts it back.
            let back = [
                "-n",
                &b_name,
                "-6",
                "addr",
                "add",
                "fd00:2::b/64",
                "dev",
                "vb2",
                "nodad",
            ];
            ip(&back);
            let (took, invalidated) = until(&mut hops, "the path back", 2);
            eprintln!("carrier back followed in {took:?}");
            assert!(invalidated, "flows spread again");
        })
        .unwrap();
    }
}
