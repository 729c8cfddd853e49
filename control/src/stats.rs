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

use crate::neighbours::NeighbourStats;
use crate::underlay::XskCounters;
use crate::worker::WorkerStats;
use engine::EngineStats;
use serde::Serialize;
use serde_json::Value;
use std::time::{SystemTime, UNIX_EPOCH};

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
}

impl WorkerReport {
    pub fn new(
        engine: EngineStats,
        worker: WorkerStats,
        xsk: Option<Vec<XskCounters>>,
        next_hops: Option<NeighbourStats>,
    ) -> WorkerReport {
        WorkerReport {
            version: STATS_VERSION,
            engine,
            worker,
            xsk,
            next_hops,
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
        } = o;
        self.engine.merge(engine);
        self.worker.merge(&worker);
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

/// The rows of `xdeadm workers`' table, from the `workers` reply (a list of
/// [`WorkerView`]s as JSON); `now` for how long each worker has run.
pub fn worker_rows(views: &Value, now: SystemTime) -> Vec<Vec<String>> {
    let now_ms = now
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let num = |v: &Value| {
        v.as_u64()
            .map_or_else(|| "-".to_string(), |n| n.to_string())
    };
    let list = |v: &Value| match v.as_array() {
        Some(a) if !a.is_empty() => a
            .iter()
            .map(|x| match (x.as_str(), x.get("ifindex"), x.get("queue")) {
                (Some(s), _, _) => s.to_string(),
                (None, Some(i), Some(q)) => format!("{}/{}", num(i), num(q)),
                _ => x.to_string(),
            })
            .collect::<Vec<_>>()
            .join(","),
        _ => "-".to_string(),
    };
    views
        .as_array()
        .into_iter()
        .flatten()
        .map(|w| {
            let busy = w["busy_ratio"].as_f64().unwrap_or(0.0) * 100.0;
            let up_s = w["started_unix_ms"]
                .as_u64()
                .map_or(0, |t| now_ms.saturating_sub(t) / 1000);
            vec![
                num(&w["worker"]),
                num(&w["core"]),
                list(&w["ports"]),
                list(&w["queues"]),
                num(&w["rounds"]),
                format!("{busy:.1}%"),
                num(&w["idle_sleeps"]),
                num(&w["handoff_in"]),
                num(&w["handoff_out"]),
                format!("{up_s} s"),
            ]
        })
        .collect()
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
        WorkerReport::new(engine, worker, None, Some(hops))
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

    /// The table shows queues as IFINDEX/QUEUE, the ratio in percent, the age.
    #[test]
    fn worker_rows_for_the_table() {
        let st = WorkerStats {
            rounds: 8,
            busy_rounds: 2,
            ..WorkerStats::default()
        };
        let info = WorkerInfo {
            core: Some(3),
            queues: vec![QueueRef {
                ifindex: 4,
                queue: 1,
            }],
            started_unix_ms: 1_000,
        };
        let v = WorkerView::new(1, vec!["a".into(), "b".into()], info, &st);
        let json = serde_json::to_value([v]).unwrap();
        let now = UNIX_EPOCH + std::time::Duration::from_secs(61);
        let rows = worker_rows(&json, now);
        assert_eq!(
            rows,
            vec![vec![
                "1", "3", "a,b", "4/1", "8", "25.0%", "0", "0", "0", "60 s"
            ]]
        );
    }
}
