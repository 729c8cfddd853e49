//! The typed statistics of one worker, how several workers' are merged, and the
//! per-worker view `xdeadm workers` shows.
//!
//! Why typed: the merge decides per field whether values add up. Counters do, and
//! so do gauges of what each worker holds alone (its hold queue, its next-hop
//! snapshot); gauges of what every worker holds alike (the V2P table, the table
//! budget) do not, nor do per-engine numbers like the epoch. Summing untyped JSON
//! got that wrong as soon as such a gauge was added. The merge rules live next to
//! each type (`EngineStats::merge`, `summed_across_workers!`).
//!
//! `stats` JSON carries [`STATS_VERSION`]; its shape changes only with that number
//! (docs/operating.md, "Counters").

use crate::underlay::neighbours::NeighbourStats;
use crate::underlay::queues::XskCounters;
use engine::EngineStats;
use serde::Serialize;

/// Worker counters: what happened at the I/O edge that the engine cannot see.
#[derive(Clone, Debug, Default, Serialize)]
pub struct WorkerStats {
    /// Rounds run, and those that moved at least one frame.
    pub rounds: u64,
    pub busy_rounds: u64,
    /// Times an adaptive worker went to sleep for lack of work.
    pub idle_sleeps: u64,
    pub tap_rx_frames: u64,
    /// Tap reads refused for one frame (the tap itself is fine).
    pub tap_rx_errors: u64,
    /// Ports whose tap went away (an error or hang-up from epoll, or a read or
    /// write failing as [`GuestFault::Gone`]): taken down until the tap is back.
    pub tap_gone: u64,
    /// Down ports whose tap was opened again: up and served again.
    pub tap_reattached: u64,
    pub tap_tx_frames: u64,
    /// Frames for a guest whose link is down (EIO from the tap): dropped.
    pub tap_tx_link_down: u64,
    /// Frames the kernel refused to write to a tap (one frame, the tap is fine).
    pub tap_tx_errors: u64,
    /// Frames for a port whose tap is gone (the port is down): dropped.
    pub tap_tx_port_down: u64,
    /// Frames for a port that does not exist (deleted meanwhile): dropped.
    pub tap_tx_no_port: u64,
    /// Frames of more pieces than one `writev` takes, copied into one buffer first.
    pub tap_tx_linearized: u64,
    /// Frames from the VM of an attached port (`--attach`) that the kernel dropped
    /// because the port's packet socket was full (the worker read too slowly);
    /// read every tick. A tap's queue counts the same loss on the device instead
    /// (`stats`' `tap_queues`).
    pub attached_rx_dropped: u64,
    /// vhost-user front ends whose features were refused at `SET_FEATURES`: each
    /// connection closed, never served; read every tick.
    pub vhost_refused: u64,
    /// Frames a vhost-user guest sent with offloads it did not negotiate (a GSO
    /// frame without HOST_TSO4/6, a partial checksum without CSUM): dropped.
    pub vhost_rx_not_negotiated: u64,
    /// GSO frames for a guest without GUEST_TSO4/6 (or GUEST_ECN for an ECN
    /// one), cut into `vhost_tx_segments` segments of at most its MTU.
    pub vhost_tx_segmented: u64,
    pub vhost_tx_segments: u64,
    /// Partial checksums completed for a guest without GUEST_CSUM.
    pub vhost_tx_csum_completed: u64,
    /// Frames that could not be made into frames their guest takes (their
    /// header does not match them): dropped. One the ingress shaper held
    /// (`set-port-limits --ingress-mbps`) counts in `tap_tx_errors` too.
    pub vhost_tx_unfit: u64,
    pub underlay_rx_frames: u64,
    pub underlay_tx_frames: u64,
    /// Underlay frames built outside the sockets' lent slots (none was free) and
    /// copied into one to be sent.
    pub underlay_tx_copied: u64,
    /// No transmit slot or ring space, even after a kick: dropped.
    pub underlay_tx_full: u64,
    /// Frame longer than a transmit slot, or not a frame the socket lent: dropped.
    pub underlay_tx_invalid: u64,
    /// The engine named an interface that is not an underlay link: dropped.
    pub underlay_tx_no_link: u64,
    /// UDP-tunnel GSO super-frames written to the underlay's tunnel taps
    /// (`--underlay-gso`), each cut into wire frames by the kernel.
    pub underlay_gso_tx_frames: u64,
    /// Super-frames a tunnel tap refused (EAGAIN, ENOBUFS, ...): dropped.
    pub underlay_gso_tx_errors: u64,
    /// Frames handed to other workers (for their ports), and taken from them.
    pub handoff_out: u64,
    pub handoff_in: u64,
    /// The channel to the owning worker was full: dropped.
    pub handoff_full: u64,
    /// A frame longer than any frame may be: dropped.
    pub handoff_too_long: u64,
    /// The engine named a worker that does not exist: dropped.
    pub handoff_no_worker: u64,
    /// Frames a capture (`xdeadm capture`) had no room for: not captured.
    pub capture_dropped: u64,
}

engine::summed_across_workers!(WorkerStats {
    rounds,
    busy_rounds,
    idle_sleeps,
    tap_rx_frames,
    tap_rx_errors,
    tap_gone,
    tap_reattached,
    tap_tx_frames,
    tap_tx_link_down,
    tap_tx_errors,
    tap_tx_port_down,
    tap_tx_no_port,
    tap_tx_linearized,
    attached_rx_dropped,
    vhost_refused,
    vhost_rx_not_negotiated,
    vhost_tx_segmented,
    vhost_tx_segments,
    vhost_tx_csum_completed,
    vhost_tx_unfit,
    underlay_rx_frames,
    underlay_tx_frames,
    underlay_tx_copied,
    underlay_tx_full,
    underlay_tx_invalid,
    underlay_tx_no_link,
    underlay_gso_tx_frames,
    underlay_gso_tx_errors,
    handoff_out,
    handoff_in,
    handoff_full,
    handoff_too_long,
    handoff_no_worker,
    capture_dropped,
});

/// Frames sent through one underlay link: how flows spread over the links
/// (per-flow ECMP). `stats` shows them with the link's other facts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LinkTx {
    pub ifindex: u32,
    /// Frames AF_XDP sent.
    pub tx_frames: u64,
    /// UDP-tunnel GSO super-frames written to the link's tunnel tap (each cut
    /// into several wire frames by the kernel).
    pub tx_super_frames: u64,
}

/// A worker's [`LinkTx`] of every link it sent through: a handful of links,
/// looked up linearly.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UnderlayTx(Vec<LinkTx>);

impl UnderlayTx {
    /// The counters of link `ifindex`, made on its first frame.
    pub fn link(&mut self, ifindex: u32) -> &mut LinkTx {
        let i = match self.0.iter().position(|l| l.ifindex == ifindex) {
            Some(i) => i,
            None => {
                self.0.push(LinkTx {
                    ifindex,
                    ..LinkTx::default()
                });
                self.0.len() - 1
            }
        };
        &mut self.0[i]
    }

    /// Adds another worker's counters, link by link.
    pub fn merge(&mut self, o: &UnderlayTx) {
        for l in &o.0 {
            let mine = self.link(l.ifindex);
            mine.tx_frames = mine.tx_frames.saturating_add(l.tx_frames);
            mine.tx_super_frames = mine.tx_super_frames.saturating_add(l.tx_super_frames);
        }
    }

    pub fn get(&self, ifindex: u32) -> Option<&LinkTx> {
        self.0.iter().find(|l| l.ifindex == ifindex)
    }
}

/// The version of the `stats` JSON shape. 2: typed merge, `version` and the
/// per-worker entries of `workers` (core, queues, rounds, busy ratio, ...).
pub const STATS_VERSION: u32 = 2;

/// One worker's statistics (the `stats` of a daemon with one worker), or several
/// workers' merged.
#[derive(Debug, Serialize)]
pub struct WorkerReport {
    pub version: u32,
    pub engine: EngineStats,
    /// I/O edge counters (summed over workers once merged).
    pub worker: WorkerStats,
    /// Per AF_XDP socket (each belongs to one worker); absent without I/O.
    pub xsk: Option<Vec<XskCounters>>,
    /// The underlay next hops the worker uses; absent without I/O.
    pub next_hops: Option<NeighbourStats>,
    /// Frames per underlay link; shown in `stats` with each link's facts
    /// (`underlay`), not on their own.
    #[serde(skip)]
    pub underlay_tx: UnderlayTx,
}

impl WorkerReport {
    pub fn new(
        engine: EngineStats,
        worker: WorkerStats,
        xsk: Option<Vec<XskCounters>>,
        next_hops: Option<NeighbourStats>,
        underlay_tx: UnderlayTx,
    ) -> WorkerReport {
        WorkerReport {
            version: STATS_VERSION,
            engine,
            worker,
            xsk,
            next_hops,
            underlay_tx,
        }
    }

    /// Adds another worker's report (see the module documentation).
    pub fn merge(&mut self, o: WorkerReport) {
        let WorkerReport {
            version: _,
            engine,
            worker,
            xsk,
            next_hops,
            underlay_tx,
        } = o;
        self.engine.merge(engine);
        self.worker.merge(&worker);
        self.underlay_tx.merge(&underlay_tx);
        match (&mut self.xsk, xsk) {
            (Some(a), Some(b)) => a.extend(b),
            (a @ None, b) => *a = b,
            (Some(_), None) => {}
        }
        match (&mut self.next_hops, next_hops) {
            (Some(a), Some(b)) => a.merge(&b),
            (a @ None, b) => *a = b,
            (Some(_), None) => {}
        }
    }
}

/// What a worker is, beyond its counters: where it runs and what it serves.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct WorkerInfo {
    /// The core it is pinned to (`None`: not pinned).
    pub core: Option<usize>,
    /// The underlay rx queues whose AF_XDP sockets it owns.
    pub queues: Vec<QueueRef>,
    /// When it started, in milliseconds since the Unix epoch.
    pub started_unix_ms: u64,
}

/// One underlay rx queue: the link's name and index, and the queue number.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct QueueRef {
    pub ifindex: u32,
    pub queue: u32,
}

/// One line of `xdeadm workers` (and an entry of `workers` in `stats`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WorkerView {
    pub worker: usize,
    pub core: Option<usize>,
    /// The ports it owns, by name.
    pub ports: Vec<String>,
    pub queues: Vec<QueueRef>,
    pub rounds: u64,
    pub busy_rounds: u64,
    /// `busy_rounds / rounds` since it started (0 before its first round): how
    /// much of its core it spends moving frames (in busy polling, the rest is
    /// spinning idle).
    pub busy_ratio: f64,
    pub idle_sleeps: u64,
    pub handoff_in: u64,
    pub handoff_out: u64,
    pub started_unix_ms: u64,
}

impl WorkerView {
    pub fn new(worker: usize, ports: Vec<String>, info: WorkerInfo, st: &WorkerStats) -> Self {
        let busy_ratio = if st.rounds == 0 {
            0.0
        } else {
            st.busy_rounds as f64 / st.rounds as f64
        };
        WorkerView {
            worker,
            core: info.core,
            ports,
            queues: info.queues,
            rounds: st.rounds,
            busy_rounds: st.busy_rounds,
            busy_ratio,
            idle_sleeps: st.idle_sleeps,
            handoff_in: st.handoff_in,
            handoff_out: st.handoff_out,
            started_unix_ms: info.started_unix_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine::{Engine, EngineConfig};

    fn report(rounds: u64) -> WorkerReport {
        let engine = Engine::new(EngineConfig::new("fd00::1".parse().unwrap()))
            .unwrap()
            .stats();
        let worker = WorkerStats {
            rounds,
            busy_rounds: rounds / 2,
            ..WorkerStats::default()
        };
        let hops = NeighbourStats {
            entries: 2,
            ..NeighbourStats::default()
        };
        let mut tx = UnderlayTx::default();
        tx.link(2).tx_frames = rounds;
        WorkerReport::new(engine, worker, None, Some(hops), tx)
    }

    /// Counters add up; the V2P count, the budget and the version do not.
    #[test]
    fn merge_sums_counters_not_shared_gauges() {
        let (mut a, mut b) = (report(10), report(30));
        a.engine.v2p_entries = 5;
        b.engine.v2p_entries = 5;
        let budget = a.engine.tables;
        a.merge(b);
        assert_eq!(a.worker.rounds, 40);
        assert_eq!(a.worker.busy_rounds, 20);
        assert_eq!(a.engine.v2p_entries, 5);
        assert_eq!(a.engine.tables, budget);
        assert_eq!(a.next_hops.as_ref().map(|n| n.entries), Some(4));
        assert_eq!(a.underlay_tx.get(2).map(|l| l.tx_frames), Some(40));
        assert_eq!(a.version, STATS_VERSION);
        let v = serde_json::to_value(&a).unwrap();
        assert_eq!(v["version"], STATS_VERSION);
        assert_eq!(v["engine"]["v2p_entries"], 5);
    }

    #[test]
    fn busy_ratio_is_busy_over_all_rounds() {
        let st = WorkerStats {
            rounds: 8,
            busy_rounds: 2,
            ..WorkerStats::default()
        };
        let v = WorkerView::new(1, vec!["a".into()], WorkerInfo::default(), &st);
        assert_eq!(v.busy_ratio, 0.25);
        let idle = WorkerView::new(0, vec![], WorkerInfo::default(), &WorkerStats::default());
        assert_eq!(idle.busy_ratio, 0.0);
    }
}
