//! `xdeadm path-check` and `overlayd --path-check-interval`: does the underlay
//! carry full-size frames to every peer sled?
//!
//! Why: the jumbo-frame underlay fails silently when one switch port is left at
//! 1500 — small packets (NDP, pings, TCP handshakes) pass, full-size Geneve frames
//! vanish, and no Packet Too Big comes back because a switch is not a router. Each
//! peer is probed with unfragmented ICMPv6 echoes (`dpio::probe`): the underlay MTU
//! first, and when that is lost, a bisection down to 1280 finds the largest size
//! that makes the round trip.

use api::{ErrorCode, PeerPath, Refusal, V2pEntry};
use dpio::probe::{largest_fitting, EchoProbe};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::net::Ipv6Addr;
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

/// How long a probe's reply may take. Sleds share a switch: a reply takes well
/// under a millisecond, so a probe not back by then was dropped (a too-small port
/// drops, it does not refuse), and short timeouts keep a bisection over a
/// black-holed path to a few seconds.
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(200);

/// Probes per size before the size is taken as not fitting: one lost packet on a
/// busy underlay must not look like a smaller MTU.
const TRIES: u32 = 2;

/// Peers probed at once (each with its own socket and thread).
const PARALLEL: usize = 16;

/// Why a path could not be probed (kept in the peer's [`PeerPath`] for display),
/// `path-check` has nothing to probe, or the periodic check did not start.
#[derive(Debug, thiserror::Error)]
pub enum PathCheckError {
    #[error("no peer to probe: V2P names no other sled (give its UNDERLAY_ADDR)")]
    NoPeer,
    #[error("cannot open a probe socket from {src}: {error}")]
    Socket { src: Ipv6Addr, error: io::Error },
    #[error("probing {peer}: {error}")]
    Probe { peer: Ipv6Addr, error: io::Error },
    #[error("the probe thread panicked")]
    Panicked,
    #[error("cannot start the path-check thread: {0}")]
    Thread(io::Error),
}

impl PathCheckError {
    /// The API's code for a refused `path-check`.
    pub fn code(&self) -> ErrorCode {
        match self {
            PathCheckError::NoPeer => ErrorCode::NotFound,
            PathCheckError::Socket { .. }
            | PathCheckError::Probe { .. }
            | PathCheckError::Panicked
            | PathCheckError::Thread(_) => ErrorCode::Dataplane,
        }
    }
}

impl From<PathCheckError> for Refusal {
    fn from(e: PathCheckError) -> Refusal {
        Refusal::new(e.code(), e.to_string())
    }
}

/// The sleds V2P names, each once, without this one.
pub fn v2p_peers(v2p: &[V2pEntry], own: Ipv6Addr) -> Vec<Ipv6Addr> {
    let peers: BTreeSet<Ipv6Addr> = v2p
        .iter()
        .map(|e| e.underlay_ip)
        .filter(|&ip| ip != own)
        .collect();
    peers.into_iter().collect()
}

/// Probes the path from `src` to `peer` for packets up to `wanted` bytes.
pub fn probe_peer(src: Ipv6Addr, peer: Ipv6Addr, wanted: u16) -> PeerPath {
    let mut result = PeerPath {
        peer,
        wanted,
        largest: None,
        probes: 0,
        error: None,
    };
    let mut socket = match EchoProbe::open(src) {
        Ok(s) => s,
        Err(error) => {
            result.error = Some(PathCheckError::Socket { src, error }.to_string());
            return result;
        }
    };
    let mut sent = 0;
    let found = largest_fitting(wanted, |size| {
        for _ in 0..TRIES {
            sent += 1;
            if socket.probe(peer, size, PROBE_TIMEOUT)? {
                return Ok(true);
            }
        }
        Ok(false)
    });
    result.probes = sent;
    match found {
        Ok((largest, _)) => result.largest = largest,
        Err(error) => result.error = Some(PathCheckError::Probe { peer, error }.to_string()),
    }
    result
}

/// Probes every peer, [`PARALLEL`] at a time; results in the order of `peers`.
pub fn check(src: Ipv6Addr, peers: &[Ipv6Addr], wanted: u16) -> Vec<PeerPath> {
    let mut out = Vec::with_capacity(peers.len());
    for chunk in peers.chunks(PARALLEL) {
        thread::scope(|s| {
            let running: Vec<_> = chunk
                .iter()
                .map(|&peer| (peer, s.spawn(move || probe_peer(src, peer, wanted))))
                .collect();
            for (peer, t) in running {
                out.push(t.join().unwrap_or_else(|_| PeerPath {
                    peer,
                    wanted,
                    largest: None,
                    probes: 0,
                    error: Some(PathCheckError::Panicked.to_string()),
                }));
            }
        });
    }
    out
}

/// The MTU to probe for: the underlay MTU the engines plan with, as an IPv6
/// packet size.
pub fn wanted_size(underlay_mtu: u32) -> u16 {
    u16::try_from(underlay_mtu).unwrap_or(u16::MAX)
}

/// What the periodic checks found, for `xdeadm stats` (`control.path_check`).
#[derive(Clone, Debug, Default, Serialize)]
pub struct PathRecord {
    pub runs: u64,
    /// Peers found not carrying the underlay MTU, summed over runs.
    pub path_check_failures: u64,
    /// The last result per peer.
    pub peers: BTreeMap<Ipv6Addr, PeerPath>,
}

impl PathRecord {
    /// Records one run; returns the results that differ from the peer's last one
    /// (a new peer, a path that broke, shrank or healed), with the last one: what
    /// to log, so a path that stays broken is logged once, not every run.
    fn record(&mut self, results: Vec<PeerPath>) -> Vec<(PeerPath, Option<PeerPath>)> {
        self.runs += 1;
        let mut changed = Vec::new();
        let seen: BTreeSet<Ipv6Addr> = results.iter().map(|r| r.peer).collect();
        self.peers.retain(|peer, _| seen.contains(peer));
        for r in results {
            if !r.ok() {
                self.path_check_failures += 1;
            }
            let before = self.peers.insert(r.peer, r.clone());
            let same = before
                .as_ref()
                .is_some_and(|b| b.ok() == r.ok() && b.largest == r.largest);
            // Nothing to say: as before, or a new peer whose path is fine.
            let quiet = same || (before.is_none() && r.ok());
            if !quiet {
                changed.push((r, before));
            }
        }
        changed
    }
}

/// The periodic check (`--path-check-interval`): a thread that probes the peers
/// the main loop hands it when a run is due, counts the failures and logs each
/// change of a path.
pub struct PathMonitor {
    src: Ipv6Addr,
    interval: Duration,
    next: Instant,
    jobs: mpsc::SyncSender<(Vec<Ipv6Addr>, u16)>,
    record: Arc<Mutex<PathRecord>>,
}

impl PathMonitor {
    /// Starts the thread; the first run is one interval from now (the peers'
    /// next hops are resolved by then).
    pub fn start(src: Ipv6Addr, interval: Duration) -> Result<PathMonitor, PathCheckError> {
        // One run waiting at most: a run still going when the next is due makes
        // the main loop skip that one.
        let (jobs, rx) = mpsc::sync_channel::<(Vec<Ipv6Addr>, u16)>(1);
        let record = Arc::new(Mutex::new(PathRecord::default()));
        let rec = record.clone();
        thread::Builder::new()
            .name("path-check".into())
            .spawn(move || {
                while let Ok((peers, wanted)) = rx.recv() {
                    let results = check(src, &peers, wanted);
                    let changed = rec
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .record(results);
                    for (now, before) in changed {
                        log_change(&now, before.as_ref());
                    }
                }
            })
            .map_err(PathCheckError::Thread)?;
        Ok(PathMonitor {
            src,
            interval,
            next: Instant::now() + interval,
            jobs,
            record,
        })
    }

    /// From the main loop: when a run is due, hands the thread the peers
    /// (`peers` is called only then) and the size to probe for.
    pub fn poll(&mut self, now: Instant, peers: impl FnOnce() -> Vec<Ipv6Addr>, wanted: u16) {
        if now < self.next {
            return;
        }
        self.next = now + self.interval;
        let peers: Vec<Ipv6Addr> = peers().into_iter().filter(|&p| p != self.src).collect();
        if let Err(mpsc::TrySendError::Full(_)) = self.jobs.try_send((peers, wanted)) {
            tracing::warn!(interval = ?self.interval, "path check still running from the last interval; this one skipped");
        }
    }

    /// What the runs found, for `stats`.
    pub fn stats(&self) -> serde_json::Value {
        let rec = self.record.lock().unwrap_or_else(PoisonError::into_inner);
        serde_json::to_value(&*rec).unwrap_or_default()
    }
}

/// Logs a path whose result changed: broken paths as warnings with the fix.
fn log_change(now: &PeerPath, before: Option<&PeerPath>) {
    let was = before.map(|b| b.largest);
    match (&now.error, now.largest) {
        (Some(e), _) => tracing::warn!(peer = %now.peer, error = %e, "path check could not probe"),
        (None, Some(l)) if l == now.wanted => {
            tracing::info!(peer = %now.peer, mtu = l, "underlay path carries full-size frames again");
        }
        (None, Some(l)) => tracing::warn!(
            peer = %now.peer, largest = l, wanted = now.wanted, was = ?was,
            "underlay path does not carry full-size frames: a switch port or link on the \
             way has a smaller MTU (set every underlay link and switch port to {})",
            now.wanted
        ),
        (None, None) => tracing::warn!(
            peer = %now.peer, was = ?was,
            "underlay peer answers no probe, not even 1280 bytes (down, unreachable, or \
             dropping ICMPv6 echo)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::Vni;

    fn path(peer: u16, largest: Option<u16>) -> PeerPath {
        PeerPath {
            peer: Ipv6Addr::new(0xfd00, 0x99, 0, 0, 0, 0, 0, peer),
            wanted: 9000,
            largest,
            probes: 1,
            error: None,
        }
    }

    #[test]
    fn peers_are_the_other_sleds_once_each() {
        let e = |last: u8, sled: &str| V2pEntry {
            vpc_ip: format!("10.0.0.{last}").parse().unwrap(),
            vpc_mac: "a8:40:25:ff:00:01".parse().unwrap(),
            underlay_ip: sled.parse().unwrap(),
            vni: Vni::new(10).unwrap(),
        };
        let v2p = [
            e(1, "fd00:99::3"),
            e(2, "fd00:99::2"),
            e(3, "fd00:99::3"),
            e(4, "fd00:99::1"),
        ];
        let own = "fd00:99::1".parse().unwrap();
        assert_eq!(
            v2p_peers(&v2p, own),
            [
                "fd00:99::2".parse::<Ipv6Addr>().unwrap(),
                "fd00:99::3".parse().unwrap()
            ]
        );
    }

    /// A healthy path is not logged; a broken one once, until it changes.
    #[test]
    fn changes_are_reported_once() {
        let mut rec = PathRecord::default();
        let c = rec.record(vec![path(2, Some(9000)), path(3, Some(1500))]);
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!(c[0].0.largest, Some(1500));
        assert_eq!(rec.path_check_failures, 1);
        let c = rec.record(vec![path(2, Some(9000)), path(3, Some(1500))]);
        assert!(c.is_empty(), "{c:?}");
        assert_eq!(rec.path_check_failures, 2);
        let c = rec.record(vec![path(2, None), path(3, Some(9000))]);
        assert_eq!(c.len(), 2, "{c:?}");
        assert_eq!(c[1].1.as_ref().and_then(|b| b.largest), Some(1500));
        assert_eq!(rec.path_check_failures, 3);
        assert_eq!(rec.runs, 3);
        rec.record(vec![path(3, Some(9000))]);
        assert_eq!(rec.peers.len(), 1, "a peer gone from V2P is forgotten");
    }

    #[test]
    fn wanted_size_is_the_mtu() {
        assert_eq!(wanted_size(9000), 9000);
        assert_eq!(wanted_size(70000), u16::MAX);
    }
}
