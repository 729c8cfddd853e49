//! The path watch (`--path-probe-ms`): a path that silently drops (its link up,
//! the switch behind it not forwarding) is found by probes and taken out of use.
//!
//! Why: a link going down is announced by the kernel and its next hops leave at
//! once (`underlay::neighbours`), but a switch that stops forwarding says
//! nothing: the link stays up and the kernel's neighbour entry for a gateway
//! seen recently stays usable, so every flow hashed onto that path is lost for
//! as long as the fault lasts. So a thread probes each path of every peer's
//! multipath route, one ICMPv6 echo through each link every interval
//! ([`PathProbes`]); [`LOST_LIMIT`] lost in a row take the path out of use
//! ([`PathsDown`], which the resolvers leave out of the workers' next hops), the
//! first answer puts it back. Each change is logged once and counted per link.
//!
//! A probe and its reply are lost alike, and the reply takes whatever path the
//! far kernel picks: a path dropping one way can make the far sled take its
//! paths back to this one out of use too. That costs nothing while another path
//! works, and when every path to a peer is lost all are kept (as for links
//! down). Peers reached by one link only are not probed: there is nothing to
//! move their flows to.

use super::paths_down::PathsDown;
use dpio::netlink::Netlink;
use dpio::probe::PathProbes;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::net::Ipv6Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

/// Probes lost in a row before a path is taken out of use: one lost probe on a
/// busy underlay must not move flows, three at 500 ms find a dead path in about
/// 1.5-2 s.
pub const LOST_LIMIT: u32 = 3;

/// Why the path watch did not start.
#[derive(Debug, thiserror::Error)]
pub enum PathWatchError {
    #[error("path watch: cannot open a netlink socket: {0}")]
    Netlink(io::Error),
    #[error("cannot start the path-watch thread: {0}")]
    Thread(io::Error),
}

/// One link's paths, for `stats` (`underlay[]`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LinkPaths {
    /// Peers whose path through this link is out of use now.
    pub paths_down: u64,
    /// Times a path through this link was taken out of use.
    pub path_down_events: u64,
}

/// What the probes found so far about one path: lost probes in a row, and
/// whether it is out of use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct PathState {
    lost: u32,
    down: bool,
}

/// A path's state changed: what to log and count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Change {
    Down,
    Up,
}

impl PathState {
    /// Records one probe; says when that changed whether the path is in use.
    fn probed(&mut self, answered: bool) -> Option<Change> {
        if answered {
            self.lost = 0;
            return std::mem::take(&mut self.down).then_some(Change::Up);
        }
        self.lost = self.lost.saturating_add(1);
        if !self.down && self.lost >= LOST_LIMIT {
            self.down = true;
            return Some(Change::Down);
        }
        None
    }
}

/// The main loop's side: hands the thread the peers, reads its counters; the
/// thread stops when this is dropped.
pub struct PathWatch {
    interval: Duration,
    next_peers: Instant,
    peers: Arc<Mutex<Vec<Ipv6Addr>>>,
    links: Arc<Mutex<BTreeMap<String, LinkPaths>>>,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl PathWatch {
    /// Opens the netlink socket (its error is the caller's, in its namespace)
    /// and starts probing from `src` every `interval`, publishing the paths out
    /// of use to `down`. The probe sockets are opened by the thread, and again
    /// each round until they open: the underlay address may be configured after
    /// the daemon starts (it only warns when it is missing).
    pub fn start(
        src: Ipv6Addr,
        interval: Duration,
        down: Arc<PathsDown>,
    ) -> Result<PathWatch, PathWatchError> {
        let nl = Netlink::open().map_err(PathWatchError::Netlink)?;
        let prober = Prober {
            src,
            probes: None,
            open_failed: false,
            nl,
            interval,
            states: HashMap::new(),
            down,
            peers: Arc::default(),
            links: Arc::default(),
            stop: Arc::default(),
        };
        let (peers, links, stop) = (
            prober.peers.clone(),
            prober.links.clone(),
            prober.stop.clone(),
        );
        let thread = thread::Builder::new()
            .name("path-watch".into())
            .spawn(move || prober.run())
            .map_err(PathWatchError::Thread)?;
        Ok(PathWatch {
            interval,
            next_peers: Instant::now(),
            peers,
            links,
            stop,
            thread: Some(thread),
        })
    }

    /// From the main loop: once an interval, takes the peers to probe (`peers`
    /// is called only then).
    pub fn poll(&mut self, now: Instant, peers: impl FnOnce() -> Vec<Ipv6Addr>) {
        if now < self.next_peers {
            return;
        }
        self.next_peers = now + self.interval;
        *self.peers.lock().unwrap_or_else(PoisonError::into_inner) = peers();
    }

    /// Each link's paths by link name, shared with `stats`.
    pub fn links(&self) -> Arc<Mutex<BTreeMap<String, LinkPaths>>> {
        self.links.clone()
    }
}

impl Drop for PathWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The thread's state.
struct Prober {
    src: Ipv6Addr,
    /// `None` until the probe sockets open.
    probes: Option<PathProbes>,
    /// Opening them failed (and was logged).
    open_failed: bool,
    nl: Netlink,
    interval: Duration,
    /// Every (peer, link index) probed last round.
    states: HashMap<(Ipv6Addr, u32), PathState>,
    down: Arc<PathsDown>,
    peers: Arc<Mutex<Vec<Ipv6Addr>>>,
    links: Arc<Mutex<BTreeMap<String, LinkPaths>>>,
    stop: Arc<AtomicBool>,
}

impl Prober {
    fn run(mut self) {
        while !self.stop.load(Ordering::Relaxed) {
            let start = Instant::now();
            self.round(start);
            thread::sleep((start + self.interval).saturating_duration_since(Instant::now()));
        }
    }

    /// The probe sockets, opened if they are not yet; a failure is logged
    /// once, when it first happens.
    fn probes(&mut self) -> Option<&mut PathProbes> {
        if self.probes.is_none() {
            match PathProbes::open(self.src) {
                Ok(p) => {
                    if self.open_failed {
                        tracing::info!(src = %self.src, "path watch: probing");
                    }
                    self.probes = Some(p);
                }
                Err(e) if !self.open_failed => {
                    self.open_failed = true;
                    tracing::warn!(
                        src = %self.src, error = %e,
                        "path watch: cannot open the probe sockets (is the underlay \
                         address configured?); tried again every interval"
                    );
                }
                Err(_) => {}
            }
        }
        self.probes.as_mut()
    }

    /// One round: a probe through every path, the replies until half the
    /// interval has passed, then the states and the paths out of use.
    fn round(&mut self, start: Instant) {
        if self.probes().is_none() {
            return;
        }
        let peers = self
            .peers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let paths = self.paths(&peers);
        let Some(probes) = self.probes.as_mut() else {
            return;
        };
        let mut sent = HashMap::new();
        for &(peer, ifindex) in &paths {
            match probes.send(peer, ifindex) {
                Ok(seq) => {
                    sent.insert(seq, (peer, ifindex));
                }
                // Counted as lost: a path the kernel cannot send on is no use.
                Err(e) => tracing::debug!(%peer, ifindex, error = %e, "path probe not sent"),
            }
        }
        let mut answered = HashSet::new();
        let until = start + self.interval / 2;
        let got = probes.replies(until, |from, seq| {
            if let Some(&(peer, ifindex)) = sent.get(&seq) {
                if peer == from {
                    answered.insert((peer, ifindex));
                }
            }
        });
        if let Err(e) = got {
            // Nothing is known this round: no path is judged on it.
            tracing::warn!(error = %e, "path watch: reading probe replies");
            return;
        }
        let links: Vec<u32> = paths.iter().map(|&(_, l)| l).collect();
        probes.retain_links(&links);
        self.record(&paths, &answered);
    }

    /// The (peer, link index) pairs to probe: each usable path of a peer's route
    /// that goes over more than one link.
    fn paths(&mut self, peers: &[Ipv6Addr]) -> Vec<(Ipv6Addr, u32)> {
        let mut out = Vec::new();
        for &peer in peers {
            let mut links: Vec<u32> = match self.nl.route_paths(peer) {
                Ok(paths) => paths.iter().filter(|p| p.usable).map(|p| p.oif).collect(),
                Err(e) => {
                    tracing::debug!(%peer, error = %e, "path watch: no route");
                    continue;
                }
            };
            links.sort_unstable();
            links.dedup();
            if links.len() > 1 {
                out.extend(links.into_iter().map(|l| (peer, l)));
            }
        }
        out
    }

    /// Applies one round's answers: logs and counts each change, forgets paths
    /// no longer probed (a link down, a peer gone), publishes the paths out of
    /// use and each link's count of them.
    fn record(&mut self, paths: &[(Ipv6Addr, u32)], answered: &HashSet<(Ipv6Addr, u32)>) {
        let probed: HashSet<_> = paths.iter().copied().collect();
        self.states.retain(|p, _| probed.contains(p));
        let mut names = HashMap::new();
        let mut links = self.links.lock().unwrap_or_else(PoisonError::into_inner);
        for &(peer, ifindex) in paths {
            let state = self.states.entry((peer, ifindex)).or_default();
            let Some(change) = state.probed(answered.contains(&(peer, ifindex))) else {
                continue;
            };
            let link = link_name(&mut self.nl, &mut names, ifindex);
            match change {
                Change::Down => {
                    links.entry(link.clone()).or_default().path_down_events += 1;
                    tracing::warn!(
                        %peer, iface = %link, lost = LOST_LIMIT,
                        "underlay path lost its probes (link up, not forwarding): \
                         out of use, its flows move to the other links"
                    );
                }
                Change::Up => tracing::info!(
                    %peer, iface = %link,
                    "underlay path answers probes again: back in use"
                ),
            }
        }
        let down: HashSet<(Ipv6Addr, u32)> = self
            .states
            .iter()
            .filter(|(_, s)| s.down)
            .map(|(&p, _)| p)
            .collect();
        for l in links.values_mut() {
            l.paths_down = 0;
        }
        for &(_, ifindex) in &down {
            let link = link_name(&mut self.nl, &mut names, ifindex);
            links.entry(link).or_default().paths_down += 1;
        }
        drop(links);
        self.down.set(down);
    }
}

/// The name of link `ifindex` (its index when it cannot be read), looked up
/// once per round.
fn link_name(nl: &mut Netlink, names: &mut HashMap<u32, String>, ifindex: u32) -> String {
    names
        .entry(ifindex)
        .or_insert_with(|| {
            nl.link_by_index(ifindex)
                .map(|l| l.name)
                .unwrap_or_else(|_| ifindex.to_string())
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Down after LOST_LIMIT lost in a row (once), up on the first answer.
    #[test]
    fn a_path_goes_down_after_three_lost_and_up_on_one_answer() {
        let mut s = PathState::default();
        assert_eq!(s.probed(false), None);
        assert_eq!(s.probed(true), None, "a lost probe alone changes nothing");
        assert_eq!(s.probed(false), None);
        assert_eq!(s.probed(false), None);
        assert_eq!(s.probed(false), Some(Change::Down));
        assert_eq!(s.probed(false), None, "logged once");
        assert_eq!(s.probed(true), Some(Change::Up));
        assert_eq!(s.probed(true), None);
    }
}
