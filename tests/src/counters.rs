//! Snapshots of a daemon's counters (`xdeadm --json stats`) and the differences
//! between two, keyed by readable paths: ports by name instead of by position, so
//! `engine.ports.a1.drops.fw_deny_in` means the same in every snapshot.

use crate::rack::Sled;
use crate::stats::flatten;
use crate::{Error, Result};
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::SystemTime;

/// Every numeric counter of one `stats` answer, by path, and when it was read: at
/// some moment between `asked` and `answered` (a few milliseconds apart). A frame
/// seen before `asked` is in the counters, one seen after `answered` is not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub counters: BTreeMap<String, u64>,
    pub asked: SystemTime,
    pub answered: SystemTime,
}

/// Drops of what guests' kernels send in normal operation (MLD and DAD; NDP from
/// an IPv4-only guest; a Router Solicitation repeated too soon): counted, but not a
/// sign of anything hostile, so accounting leaves them out.
pub const NORMAL_GUEST_DROPS: &[&str] = &["link_local_only", "ndp_no_ipv6", "rs_rate_limited"];

/// Receive losses of the AF_XDP sockets (ring overflow, oversize chains, invalid
/// descriptors): a frame lost there never reaches the engine's counters.
pub const XSK_LOSSES: &[&str] = &[
    "kernel_rx_dropped",
    "kernel_rx_ring_full",
    "rx_oversize",
    "rx_invalid_desc",
];

impl Snapshot {
    /// Reads the counters of `sled`'s daemon.
    pub fn take(sled: &Sled) -> Result<Snapshot> {
        let asked = SystemTime::now();
        let out = sled.admin(&["--json", "stats"])?;
        let answered = SystemTime::now();
        let s = Snapshot::parse(&out)
            .map_err(|e| e.context(format!("stats of sled {}", sled.index)))?;
        Ok(Snapshot {
            asked,
            answered,
            ..s
        })
    }

    /// Parses `xdeadm --json stats` output (read now).
    pub fn parse(json: &str) -> Result<Snapshot> {
        let mut v: Value = serde_json::from_str(json)
            .map_err(|e| Error::new(format!("stats are not JSON ({e}): {json}")))?;
        let data = v
            .get_mut("data")
            .ok_or_else(|| Error::new(format!("stats without \"data\": {json}")))?;
        if let Some(ports) = data.pointer_mut("/engine/ports") {
            *ports = by_name(ports.take());
        }
        let now = SystemTime::now();
        Ok(Snapshot {
            counters: flatten(data).into_iter().collect(),
            asked: now,
            answered: now,
        })
    }

    /// The counter at `path` (0 when absent: counters appear when first used).
    pub fn get(&self, path: &str) -> u64 {
        self.counters.get(path).copied().unwrap_or(0)
    }

    /// Engine drop counters (underlay, datapath and every port's), by path, except
    /// [`NORMAL_GUEST_DROPS`].
    pub fn drops(&self) -> BTreeMap<&str, u64> {
        self.counters
            .iter()
            .filter(|(p, _)| is_drop(p) && !NORMAL_GUEST_DROPS.contains(&leaf(p)))
            .map(|(p, n)| (p.as_str(), *n))
            .collect()
    }

    /// The drop counters of port `port` alone (every reason), by reason.
    pub fn port_drops(&self, port: &str) -> BTreeMap<&str, u64> {
        let prefix = format!("engine.ports.{port}.drops.");
        self.counters
            .iter()
            .filter_map(|(p, n)| p.strip_prefix(&prefix).map(|r| (r, *n)))
            .collect()
    }

    /// The sum of every counter whose last path element is one of `names`.
    pub fn sum(&self, names: &[&str]) -> u64 {
        self.counters
            .iter()
            .filter(|(p, _)| names.contains(&leaf(p)))
            .map(|(_, n)| n)
            .sum()
    }
}

/// Whether `path` is an engine drop counter.
fn is_drop(path: &str) -> bool {
    path.starts_with("engine.underlay_drops.")
        || path.starts_with("engine.datapath_drops.")
        || (path.starts_with("engine.ports.") && path.contains(".drops."))
}

/// The last element of a dotted path.
pub fn leaf(path: &str) -> &str {
    path.rsplit('.').next().unwrap_or(path)
}

/// `[{"name": "a1", ...}, ...]` as `{"a1": {...}, ...}`.
fn by_name(ports: Value) -> Value {
    match ports {
        Value::Array(a) => Value::Object(
            a.into_iter()
                .enumerate()
                .map(|(i, p)| {
                    let name = p["name"]
                        .as_str()
                        .map_or_else(|| format!("#{i}"), str::to_string);
                    (name, p)
                })
                .collect(),
        ),
        other => other,
    }
}

/// What grew from `before` to `after`, by path (counters that did not change are
/// left out; one that shrank, which a counter never may, is an error naming it).
pub fn delta<'a>(
    before: &BTreeMap<&'a str, u64>,
    after: &BTreeMap<&'a str, u64>,
) -> Result<BTreeMap<&'a str, u64>> {
    let mut d = BTreeMap::new();
    for (path, &now) in after {
        let was = before.get(path).copied().unwrap_or(0);
        if now < was {
            return Err(Error::new(format!(
                "counter {path} went back from {was} to {now}"
            )));
        }
        if now > was {
            d.insert(*path, now - was);
        }
    }
    Ok(d)
}

/// Sums counts by the last element of their paths (e.g. the same reason on two
/// ports).
pub fn by_leaf<'a>(counts: &BTreeMap<&'a str, u64>) -> BTreeMap<&'a str, u64> {
    let mut out = BTreeMap::new();
    for (p, n) in counts {
        *out.entry(leaf(p)).or_insert(0) += n;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATS: &str = r#"{"version":1,"data":{"engine":{
        "ports":[{"name":"a1","in_packets":5,"drops":{"fw_deny_in":2,"link_local_only":9},
                  "gateway":{"denied_arp":1}},
                 {"name":"b1","drops":{"denied_arp":1}}],
        "underlay_drops":{"truncated":3},"datapath_drops":{"no_port_for_vni_mac":4}},
        "xsk":[{"kernel_rx_dropped":1,"rx_oversize":2}],
        "underlay":[{"xdp":{"passed_not_udp":6}}]}}"#;

    #[test]
    fn ports_by_name_and_drops_without_normal_guest_noise() {
        let s = Snapshot::parse(STATS).unwrap();
        assert_eq!(s.get("engine.ports.a1.in_packets"), 5);
        assert_eq!(s.get("underlay[0].xdp.passed_not_udp"), 6);
        let drops = s.drops();
        assert_eq!(
            drops.keys().copied().collect::<Vec<_>>(),
            [
                "engine.datapath_drops.no_port_for_vni_mac",
                "engine.ports.a1.drops.fw_deny_in",
                "engine.ports.b1.drops.denied_arp",
                "engine.underlay_drops.truncated"
            ]
        );
        assert_eq!(s.port_drops("a1").get("link_local_only"), Some(&9));
        assert_eq!(s.sum(XSK_LOSSES), 3);
        assert!(Snapshot::parse("{}").is_err());
    }

    #[test]
    fn deltas_keep_growth_and_refuse_shrinking() {
        let before = BTreeMap::from([("a.x", 1), ("b.x", 5)]);
        let after = BTreeMap::from([("a.x", 4), ("b.x", 5), ("c.y", 2)]);
        let d = delta(&before, &after).unwrap();
        assert_eq!(d, BTreeMap::from([("a.x", 3), ("c.y", 2)]));
        assert_eq!(
            by_leaf(&BTreeMap::from([("p.a.x", 1), ("p.b.x", 2)])),
            BTreeMap::from([("x", 3)])
        );
        let e = delta(&after, &before).unwrap_err();
        assert!(e.0.contains("c.y") || e.0.contains("a.x"), "{e}");
    }
}
