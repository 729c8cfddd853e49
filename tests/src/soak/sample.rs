//! What the soak samples of each daemon (resident memory and every counter) and
//! the checks it makes of the samples: memory flat after warm-up, tables bounded
//! by what their timeouts allow, counters that only grow and that agree with each
//! other.

use crate::counters::{leaf, Snapshot, XSK_LOSSES};
use crate::{Error, Result};
use std::time::Duration;

/// One daemon at one moment.
#[derive(Clone, Debug)]
pub struct Sample {
    /// Since the traffic started.
    pub at: Duration,
    pub rss_kib: u64,
    pub counters: Snapshot,
}

/// The daemon's resident set size (`VmRSS` of `/proc/PID/status`), in KiB.
pub fn rss_kib(pid: u32) -> Result<u64> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).map_err(|e| Error::new(format!("{path}: {e}")))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| Error::new(format!("{path} has no VmRSS line")))
}

/// The most resident memory may grow after warm-up, as a fraction.
pub const MAX_RSS_GROWTH: f64 = 0.01;

/// Growth of resident memory after the warm-up, as a fraction: the level at the end
/// against the level when the warm-up ended, each the median of (up to) three
/// samples, less the largest one-time step. A leak raises the end level; a
/// transient peak (a large reply being rendered, the allocator holding a freed
/// block a moment) does not. Neither does one step, which is what the allocator
/// makes once: glibc raising its mmap threshold after the first free of a large
/// buffer, a new arena, a hash table doubling when its connections first cross its
/// capacity (about 450 KiB each, at a moment set by the traffic: 1% of the daemon,
/// which on a 60 s run is as much as is allowed). A leak grows with the traffic, in
/// every interval, and still shows. `None` without samples on both sides.
pub fn rss_growth(samples: &[Sample], warmup: Duration) -> Option<f64> {
    let (before, after): (Vec<&Sample>, Vec<&Sample>) =
        samples.iter().partition(|s| s.at <= warmup);
    let base = level(&before)?;
    let end = level(&after)?;
    let window: Vec<u64> = before
        .last()
        .into_iter()
        .chain(&after)
        .map(|s| s.rss_kib)
        .collect();
    let grown = end
        .saturating_sub(base)
        .saturating_sub(largest_step(&window));
    let shrunk = base.saturating_sub(end);
    Some((grown as f64 - shrunk as f64) / base.max(1) as f64)
}

/// The largest rise in `rss` that every later value keeps: a one-time step, where a
/// transient peak, which falls back, counts only by what stays.
fn largest_step(rss: &[u64]) -> u64 {
    (1..rss.len())
        .map(|i| {
            let kept = rss[i..].iter().min().copied().unwrap_or(0);
            kept.saturating_sub(rss[i - 1])
        })
        .max()
        .unwrap_or(0)
}

/// The median resident memory of the last three of `samples`.
pub fn level(samples: &[&Sample]) -> Option<u64> {
    let mut last: Vec<u64> = samples.iter().rev().take(3).map(|s| s.rss_kib).collect();
    last.sort_unstable();
    last.get(last.len() / 2).copied()
}

/// Per port and direction (docs/engine.md: `uft_limit`).
pub const UFT_LIMIT: u64 = 65_536;
/// Connections per port (docs/engine.md: `fw_flow_limit`).
pub const FW_FLOW_LIMIT: u64 = 524_288;
/// The longest idle timeout of a closed connection (time_wait, 120 s), plus the
/// sweep's own period and the sampling interval: a connection older than this must
/// have left the tables.
pub const HOLD_WINDOW: Duration = Duration::from_secs(130);
/// Connections that may outlive the window: the long-lived flows of the soak and
/// the guests' own (DHCP, NDP, echo).
pub const LONG_LIVED: u64 = 64;

/// Every table of every port stays within its limit, and holds no more entries
/// than connections were created in the last [`HOLD_WINDOW`] plus [`LONG_LIVED`]:
/// expiry keeps up with the churn.
pub fn tables_bounded(label: &str, samples: &[Sample]) -> Vec<String> {
    let mut failures = Vec::new();
    for (i, s) in samples.iter().enumerate() {
        let window_start = s.at.saturating_sub(HOLD_WINDOW);
        let old = samples[..i].iter().rev().find(|o| o.at <= window_start);
        for port in ports(&s.counters) {
            // A connection reopened in place (a client reusing its port after
            // TIME-WAIT) is a new connection too.
            let created = |x: &Snapshot| {
                x.get(&format!("engine.ports.{port}.firewall.flows_created"))
                    + x.get(&format!("engine.ports.{port}.firewall.flows_reopened"))
            };
            let recent = created(&s.counters) - old.map_or(0, |o| created(&o.counters));
            for (table, limit) in [
                ("firewall.flows", FW_FLOW_LIMIT),
                ("uft_in.entries", UFT_LIMIT),
                ("uft_out.entries", UFT_LIMIT),
            ] {
                let n = s.counters.get(&format!("engine.ports.{port}.{table}"));
                let bound = limit.min(recent + LONG_LIVED);
                if n > bound {
                    failures.push(format!(
                        "{label} at {:.0} s: port {port} {table} = {n}, above {bound} (limit {limit}, {recent} connections created in the last {} s)",
                        s.at.as_secs_f64(),
                        HOLD_WINDOW.as_secs()
                    ));
                }
            }
        }
    }
    failures
}

/// The names of the ports in a snapshot.
fn ports(s: &Snapshot) -> Vec<String> {
    let mut names: Vec<String> = s
        .counters
        .keys()
        .filter_map(|p| {
            p.strip_prefix("engine.ports.")?
                .split('.')
                .next()
                .map(str::to_string)
        })
        .collect();
    names.dedup();
    names
}

/// Whether a counter at `path` only ever grows (packets, frames, bytes, drops,
/// XDP verdicts), as opposed to a gauge (entries, flows, buffers held).
fn is_cumulative(path: &str) -> bool {
    let name = leaf(path);
    ["_packets", "_frames", "_bytes"]
        .iter()
        .any(|s| name.ends_with(s))
        || path.contains(".xdp.")
        || path.contains("drops.")
}

/// Counters that went back between two samples (a reset, a wrap, a lost update).
pub fn monotonic(label: &str, samples: &[Sample]) -> Vec<String> {
    let mut failures = Vec::new();
    for pair in samples.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        for (path, &before) in a.counters.counters.iter().filter(|(p, _)| is_cumulative(p)) {
            let after = b.counters.get(path);
            if after < before {
                failures.push(format!(
                    "{label}: {path} went back from {before} to {after} between {:.0} s and {:.0} s",
                    a.at.as_secs_f64(),
                    b.at.as_secs_f64()
                ));
            }
        }
    }
    failures
}

/// With the traffic stopped, counters kept at different layers agree:
/// - every frame the XDP program redirected reached an AF_XDP socket or was dropped
///   by the kernel there (counted);
/// - every frame the sockets took was handed to the worker;
/// - every frame the worker read from a tap reached a port's counters.
pub fn conservation(label: &str, s: &Snapshot) -> Vec<String> {
    let sum = |names: &[&str]| s.sum(names);
    let port_sum = |field: &str| -> u64 {
        s.counters
            .iter()
            .filter(|(p, _)| {
                p.starts_with("engine.ports.")
                    && p.ends_with(&format!(".{field}"))
                    && p.matches('.').count() == 3
            })
            .map(|(_, n)| n)
            .sum()
    };
    let mut failures = Vec::new();
    let mut agree = |what: &str, a: (&str, u64), b: (&str, u64)| {
        if a.1 != b.1 {
            failures.push(format!(
                "{label}: {what}: {} = {} but {} = {}",
                a.0, a.1, b.0, b.1
            ));
        }
    };
    let xsk_rx = s
        .counters
        .iter()
        .filter(|(p, _)| p.starts_with("xsk[") && p.ends_with(".rx_frames"))
        .map(|(_, n)| n)
        .sum::<u64>();
    agree(
        "redirected frames reach AF_XDP",
        ("xdp redirected", sum(&["redirected"])),
        ("xsk rx_frames + kernel losses", xsk_rx + sum(XSK_LOSSES)),
    );
    agree(
        "AF_XDP frames reach the worker",
        ("xsk rx_frames", xsk_rx),
        (
            "worker underlay_rx_frames",
            s.get("worker.underlay_rx_frames"),
        ),
    );
    agree(
        "tap frames reach the ports",
        ("worker tap_rx_frames", s.get("worker.tap_rx_frames")),
        (
            "ports out_packets + unknown_port",
            port_sum("out_packets") + s.get("engine.datapath_drops.unknown_port"),
        ),
    );
    failures
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn sample(at: u64, rss: u64, counters: &[(&str, u64)]) -> Sample {
        Sample {
            at: Duration::from_secs(at),
            rss_kib: rss,
            counters: Snapshot {
                counters: counters
                    .iter()
                    .map(|(k, v)| (k.to_string(), *v))
                    .collect::<BTreeMap<_, _>>(),
                asked: std::time::SystemTime::UNIX_EPOCH,
                answered: std::time::SystemTime::UNIX_EPOCH,
            },
        }
    }

    #[test]
    fn rss_growth_compares_the_level_at_the_end_with_the_warmups() {
        let s = [
            sample(0, 50, &[]),
            sample(10, 100, &[]),
            sample(20, 130, &[]),
            sample(30, 100, &[]),
            sample(40, 100, &[]),
        ];
        // The transient 130 is not growth.
        assert_eq!(rss_growth(&s, Duration::from_secs(10)), Some(0.0));
        // Nor is one step the level keeps (the allocator's once-only growth) ...
        let step = [
            sample(0, 100, &[]),
            sample(10, 100, &[]),
            sample(20, 100, &[]),
            sample(30, 110, &[]),
            sample(40, 110, &[]),
            sample(50, 110, &[]),
        ];
        assert_eq!(rss_growth(&step, Duration::from_secs(10)), Some(0.0));
        // ... but a second one is.
        let steps = [
            sample(0, 100, &[]),
            sample(10, 100, &[]),
            sample(20, 110, &[]),
            sample(30, 110, &[]),
            sample(40, 113, &[]),
            sample(50, 113, &[]),
        ];
        let g = rss_growth(&steps, Duration::from_secs(10)).unwrap();
        assert!((g - 0.03).abs() < 1e-9, "{g}");
        // A steady rise, in every interval, is growth but for its largest step.
        let leak = [
            sample(0, 100, &[]),
            sample(10, 100, &[]),
            sample(20, 102, &[]),
            sample(30, 104, &[]),
            sample(40, 106, &[]),
            sample(50, 108, &[]),
            sample(60, 110, &[]),
        ];
        let g = rss_growth(&leak, Duration::from_secs(10)).unwrap();
        assert!((g - 0.06).abs() < 1e-9, "{g}");
        // Shrinking is negative growth.
        let shrink = [
            sample(0, 100, &[]),
            sample(10, 100, &[]),
            sample(20, 90, &[]),
        ];
        let g = rss_growth(&shrink, Duration::from_secs(10)).unwrap();
        assert!((g + 0.1).abs() < 1e-9, "{g}");
        assert_eq!(rss_growth(&s, Duration::from_secs(40)), None);
        assert_eq!(rss_growth(&[], Duration::ZERO), None);
    }

    #[test]
    fn tables_may_hold_only_recent_connections() {
        let p = |created: u64, flows: u64| {
            vec![
                ("engine.ports.a1.firewall.flows_created", created),
                ("engine.ports.a1.firewall.flows", flows),
            ]
        };
        let ok = [
            sample(0, 1, &p(0, 0)),
            sample(200, 1, &p(1000, 900)),
            sample(400, 1, &p(2000, 1000 + LONG_LIVED)),
        ];
        assert!(
            tables_bounded("s", &ok).is_empty(),
            "{:?}",
            tables_bounded("s", &ok)
        );
        let leak = [
            sample(0, 1, &p(0, 0)),
            sample(200, 1, &p(1000, 900)),
            sample(400, 1, &p(1500, 1400)),
        ];
        let f = tables_bounded("s", &leak);
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(f[0].contains("a1 firewall.flows = 1400"), "{f:?}");
        // Connections reopened in place count as new ones.
        let reopened = |r: u64, flows: u64| {
            let mut v = p(100, flows);
            v.push(("engine.ports.a1.firewall.flows_reopened", r));
            v
        };
        let reuse = [
            sample(0, 1, &reopened(0, 0)),
            sample(200, 1, &reopened(900, 950)),
        ];
        assert!(tables_bounded("s", &reuse).is_empty());
    }

    #[test]
    fn cumulative_counters_may_not_go_back_but_gauges_may() {
        let a = sample(
            0,
            1,
            &[
                ("worker.tap_rx_frames", 5),
                ("engine.ports.a1.uft_in.entries", 9),
            ],
        );
        let b = sample(
            2,
            1,
            &[
                ("worker.tap_rx_frames", 4),
                ("engine.ports.a1.uft_in.entries", 1),
            ],
        );
        let f = monotonic("s", &[a, b]);
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(
            f[0].contains("tap_rx_frames went back from 5 to 4"),
            "{f:?}"
        );
    }

    #[test]
    fn conservation_names_the_counters_that_disagree() {
        let good = sample(
            0,
            1,
            &[
                ("underlay[0].xdp.redirected", 10),
                ("xsk[0].rx_frames", 9),
                ("xsk[0].kernel_rx_dropped", 1),
                ("worker.underlay_rx_frames", 9),
                ("worker.tap_rx_frames", 7),
                ("engine.ports.a1.out_packets", 3),
                ("engine.ports.a2.out_packets", 4),
                ("engine.ports.a2.drops.out_packets", 99),
            ],
        );
        assert!(
            conservation("s", &good.counters).is_empty(),
            "{:?}",
            conservation("s", &good.counters)
        );
        let mut bad = good.counters.clone();
        bad.counters.insert("worker.tap_rx_frames".into(), 8);
        let f = conservation("s", &bad);
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(f[0].contains("worker tap_rx_frames = 8"), "{f:?}");
    }
}
