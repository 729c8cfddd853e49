//! The counters in the OpenMetrics text format: [`render`] turns the daemon's `stats`
//! document into an exposition. `overlayd` serves it over HTTP for Prometheus
//! (`--metrics-listen ADDR:PORT`) and `xdeadm stats --format openmetrics` prints the
//! same text for node_exporter's textfile collector: one renderer, here, for both.
//!
//! Why from the `stats` document: a scrape reads exactly what `xdeadm stats` shows,
//! gathered the same way (one job per worker, answered between its rounds, so a
//! scrape never stalls a worker), and both the daemon and the admin tool render it
//! without the engine's types. Whether a figure is a counter or a gauge is decided
//! here, by name, following the daemon's typed stats. The text itself (escaping,
//! `_total`, `# EOF`) is the `prometheus-client` crate's.
//!
//! Names follow Prometheus conventions: an `overlayd_` prefix, counters ending in
//! `_total`, the varying part in labels (`overlayd_drops_total{port,reason}`, with
//! `port=""` for drops no port is charged with). docs/operating.md ("Metrics")
//! lists them.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::atomic::AtomicU64;

/// The content type of the exposition (OpenMetrics 1.0 text).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The help of `overlayd_drops_total`, which has samples from several places.
const DROPS: &str = "Frames dropped, by reason (port=\"\": not charged to a port).";

/// The exposition could not be written (the text encoder refused).
#[derive(Debug, thiserror::Error)]
#[error("cannot encode metrics: {0}")]
pub struct RenderError(std::fmt::Error);

type Labels = Vec<(String, String)>;

type Counters = Family<Labels, Counter>;

type Gauges = Family<Labels, Gauge<f64, AtomicU64>>;

/// The families of one exposition, registered on first use (so a family the
/// document has no figure for is left out).
#[derive(Default)]
struct Exposition {
    registry: Registry,
    counters: HashMap<&'static str, Counters>,
    gauges: HashMap<&'static str, Gauges>,
}

fn label_set(labels: &[(&str, &str)]) -> Labels {
    labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

impl Exposition {
    /// A counter sample from a JSON number (skipped when `v` is not one).
    fn counter(&mut self, name: &'static str, help: &str, labels: &[(&str, &str)], v: &Value) {
        let Some(n) = v.as_u64() else {
            return;
        };
        let registry = &mut self.registry;
        let family = self.counters.entry(name).or_insert_with(|| {
            let f = Counters::default();
            // The encoder ends the help with a period itself.
            registry.register(name, help.trim_end_matches('.'), f.clone());
            f
        });
        family.get_or_create(&label_set(labels)).inc_by(n);
    }

    /// A gauge sample from a JSON number (skipped when `v` is not one).
    fn gauge(&mut self, name: &'static str, help: &str, labels: &[(&str, &str)], v: &Value) {
        let Some(x) = v.as_f64().filter(|x| x.is_finite()) else {
            return;
        };
        let registry = &mut self.registry;
        let family = self.gauges.entry(name).or_insert_with(|| {
            let f = Gauges::default();
            registry.register(name, help.trim_end_matches('.'), f.clone());
            f
        });
        family.get_or_create(&label_set(labels)).set(x);
    }

    /// One counter sample per numeric member of `obj`, labelled `key=<member>`.
    fn counters_by(
        &mut self,
        name: &'static str,
        help: &str,
        labels: &[(&str, &str)],
        key: &str,
        obj: &Value,
    ) {
        for (k, v) in obj.as_object().into_iter().flatten() {
            let mut l = labels.to_vec();
            l.push((key, k));
            self.counter(name, help, &l, v);
        }
    }

    fn finish(self) -> Result<String, RenderError> {
        let mut out = String::new();
        encode(&mut out, &self.registry).map_err(RenderError)?;
        Ok(out)
    }
}

/// The exposition of a `stats` document (as `xdeadm --json stats` prints it).
/// Parts the document lacks (a daemon without I/O has no `xsk`) are left out.
pub fn render(stats: &Value) -> Result<String, RenderError> {
    let mut e = Exposition::default();
    let engine = &stats["engine"];
    for p in engine["ports"].as_array().into_iter().flatten() {
        let Some(port) = p["name"].as_str() else {
            continue;
        };
        port_metrics(&mut e, port, p);
    }
    e.counters_by(
        "overlayd_drops",
        DROPS,
        &[("port", "")],
        "reason",
        &engine["datapath_drops"],
    );
    e.counters_by(
        "overlayd_drops",
        DROPS,
        &[("port", "")],
        "reason",
        &engine["underlay_drops"],
    );
    e.gauge(
        "overlayd_v2p_entries",
        "V2P mappings (every worker holds them all).",
        &[],
        &engine["v2p_entries"],
    );
    let hold = &engine["hold"];
    for (name, key, help) in [
        (
            "overlayd_hold_frames",
            "frames",
            "Guest frames waiting for their underlay next hop.",
        ),
        (
            "overlayd_hold_bytes",
            "bytes",
            "Bytes of guest frames waiting for their next hop.",
        ),
        (
            "overlayd_hold_destinations",
            "destinations",
            "Underlay destinations frames wait for.",
        ),
    ] {
        e.gauge(name, help, &[], &hold[key]);
    }
    for event in ["held", "sent", "overflow", "timeout", "port_removed"] {
        let help = "Frames through the next-hop hold queue, by what became of them.";
        e.counter(
            "overlayd_hold_events",
            help,
            &[("event", event)],
            &hold[event],
        );
    }
    let help = "Receive coalescing: frames in, out, merged, handed over as GSO.";
    e.counters_by(
        "overlayd_coalescer_frames",
        help,
        &[],
        "event",
        &engine["coalescer"],
    );
    worker_metrics(&mut e, stats);
    underlay_metrics(&mut e, stats);
    control_metrics(&mut e, &stats["control"]);
    e.finish()
}

fn port_metrics(e: &mut Exposition, port: &str, p: &Value) {
    const PACKETS: &str =
        "Frames through a port: in = delivered to the guest, out = from the guest.";
    const BYTES: &str = "Bytes through a port: in = delivered to the guest, out = from the guest.";
    e.counter(
        "overlayd_port_packets",
        PACKETS,
        &[("port", port), ("direction", "in")],
        &p["in_packets"],
    );
    e.counter(
        "overlayd_port_packets",
        PACKETS,
        &[("port", port), ("direction", "out")],
        &p["out_packets"],
    );
    e.counter(
        "overlayd_port_bytes",
        BYTES,
        &[("port", port), ("direction", "in")],
        &p["in_bytes"],
    );
    e.counter(
        "overlayd_port_bytes",
        BYTES,
        &[("port", port), ("direction", "out")],
        &p["out_bytes"],
    );
    let l = [("port", port)];
    e.counter(
        "overlayd_port_tso_buffers",
        "Guest GSO buffers segmented for the underlay.",
        &l,
        &p["tso_buffers_in"],
    );
    e.counter(
        "overlayd_port_tso_segments",
        "Underlay frames cut from guest GSO buffers.",
        &l,
        &p["tso_segments_out"],
    );
    e.counter(
        "overlayd_port_tso_super_frames",
        "UDP-tunnel GSO super-frames made of guest GSO buffers for the kernel to cut.",
        &l,
        &p["tso_super_frames_out"],
    );
    e.counter(
        "overlayd_port_local_delivered",
        "Frames delivered to another port of this sled without encapsulation.",
        &l,
        &p["local_delivered"],
    );
    for (dir, key) in [("out", "egress_throttled"), ("in", "ingress_throttled")] {
        e.counter(
            "overlayd_port_rate_limit_waits",
            "Times the port's rate limit made a frame wait (out: the guest's tap was \
             not read; in: a frame for the guest was held).",
            &[("port", port), ("direction", dir)],
            &p[key],
        );
    }
    e.counters_by("overlayd_drops", DROPS, &l, "reason", &p["drops"]);
    for (dir, uft) in [("in", &p["uft_in"]), ("out", &p["uft_out"])] {
        let l = [("port", port), ("direction", dir)];
        e.gauge(
            "overlayd_uft_entries",
            "Unified flow table entries.",
            &l,
            &uft["entries"],
        );
        for result in ["hits", "misses", "stale", "expired", "evicted"] {
            let mut l = l.to_vec();
            l.push(("event", result));
            let help =
                "Unified flow table lookups (hits, misses, stale) and removals (expired, evicted).";
            e.counter("overlayd_uft_events", help, &l, &uft[result]);
        }
    }
    let fw = &p["firewall"];
    e.gauge(
        "overlayd_firewall_connections",
        "Tracked firewall connections.",
        &l,
        &fw["flows"],
    );
    for (event, key) in [
        ("created", "flows_created"),
        ("reopened", "flows_reopened"),
        ("expired", "flows_expired"),
        ("evicted", "flows_evicted"),
    ] {
        let help = "Firewall connections created, reopened in place, expired, evicted.";
        e.counter(
            "overlayd_firewall_flows",
            help,
            &[("port", port), ("event", event)],
            &fw[key],
        );
    }
    let limits = &p["table_limits"];
    for (table, key) in [("connections", "conns"), ("uft", "uft")] {
        let help = "The most entries a port's table holds (its share of the table budget).";
        e.gauge(
            "overlayd_table_limit",
            help,
            &[("port", port), ("table", table)],
            &limits[key],
        );
    }
    let help = "Gateway replies and denies (docs/gateway.md names each counter).";
    e.counters_by(
        "overlayd_gateway_events",
        help,
        &l,
        "counter",
        &p["gateway"],
    );
}

fn worker_metrics(e: &mut Exposition, stats: &Value) {
    for w in stats["workers"].as_array().into_iter().flatten() {
        let Some(n) = w["worker"].as_u64() else {
            continue;
        };
        let n = n.to_string();
        let l = [("worker", n.as_str())];
        e.counter(
            "overlayd_worker_rounds",
            "Worker polling rounds.",
            &l,
            &w["rounds"],
        );
        e.counter(
            "overlayd_worker_busy_rounds",
            "Worker rounds that moved at least one frame.",
            &l,
            &w["busy_rounds"],
        );
        e.gauge(
            "overlayd_worker_busy_ratio",
            "Busy rounds / all rounds since the worker started.",
            &l,
            &w["busy_ratio"],
        );
        e.counter(
            "overlayd_worker_idle_sleeps",
            "Times the worker slept for lack of work.",
            &l,
            &w["idle_sleeps"],
        );
        let help = "Frames handed between workers (in: taken from others, out: handed to others).";
        for (dir, key) in [("in", "handoff_in"), ("out", "handoff_out")] {
            e.counter(
                "overlayd_worker_handoffs",
                help,
                &[("worker", n.as_str()), ("direction", dir)],
                &w[key],
            );
        }
        let ports = w["ports"].as_array().map_or(0, Vec::len);
        e.gauge(
            "overlayd_worker_ports",
            "Ports the worker serves.",
            &l,
            &Value::from(ports),
        );
        if let Some(ms) = w["started_unix_ms"].as_u64() {
            let secs = Value::from(ms as f64 / 1000.0);
            e.gauge(
                "overlayd_worker_start_time_seconds",
                "When the worker started (Unix time).",
                &l,
                &secs,
            );
        }
    }
    let help = "Worker I/O edge counters, all workers summed (docs/operating.md names each).";
    let io = &stats["worker"];
    for (k, v) in io.as_object().into_iter().flatten() {
        if !matches!(
            k.as_str(),
            "rounds" | "busy_rounds" | "idle_sleeps" | "handoff_in" | "handoff_out"
        ) {
            e.counter("overlayd_worker_io_events", help, &[("counter", k)], v);
        }
    }
    let hops = &stats["next_hops"];
    e.gauge(
        "overlayd_next_hops",
        "Underlay next hops in the workers' snapshots.",
        &[],
        &hops["entries"],
    );
    for event in ["snapshots", "invalidations", "requests_deferred"] {
        let help = "Next-hop snapshots taken, those that invalidated flows, resolutions deferred.";
        e.counter(
            "overlayd_next_hop_events",
            help,
            &[("event", event)],
            &hops[event],
        );
    }
}

fn underlay_metrics(e: &mut Exposition, stats: &Value) {
    for s in stats["xsk"].as_array().into_iter().flatten() {
        let (ifindex, queue) = (s["ifindex"].to_string(), s["queue"].to_string());
        for (dir, frames, bytes) in [
            ("rx", "rx_frames", "rx_bytes"),
            ("tx", "tx_frames", "tx_bytes"),
        ] {
            let l = [
                ("ifindex", ifindex.as_str()),
                ("queue", queue.as_str()),
                ("direction", dir),
            ];
            e.counter(
                "overlayd_xsk_packets",
                "Frames through an AF_XDP socket.",
                &l,
                &s[frames],
            );
            e.counter(
                "overlayd_xsk_bytes",
                "Bytes through an AF_XDP socket.",
                &l,
                &s[bytes],
            );
        }
    }
    for link in stats["underlay"].as_array().into_iter().flatten() {
        let Some(name) = link["name"].as_str() else {
            continue;
        };
        let l = [("link", name)];
        e.gauge(
            "overlayd_underlay_mtu",
            "Underlay link MTU.",
            &l,
            &link["mtu"],
        );
        e.gauge(
            "overlayd_underlay_queues",
            "Underlay link rx queues.",
            &l,
            &link["queues"],
        );
        let help = "XDP program verdicts on an underlay link, by counter.";
        e.counters_by("overlayd_xdp_events", help, &l, "counter", &link["xdp"]);
    }
}

/// What is saved but not applied, whether the state can be saved, the API server.
fn control_metrics(e: &mut Exposition, control: &Value) {
    let na = &control["not_applied"];
    let help = "Saved items the dataplane refused, retried (docs/operating.md, Restore).";
    let ports = na["ports"].as_array().map(Vec::len);
    if let Some(n) = ports {
        e.gauge(
            "overlayd_not_applied",
            help,
            &[("kind", "port")],
            &Value::from(n),
        );
    }
    e.gauge(
        "overlayd_not_applied",
        help,
        &[("kind", "v2p")],
        &na["v2p_count"],
    );
    if let Some(state) = control["state"].as_object() {
        let failing = state.get("save_error").is_some_and(|e| !e.is_null());
        let help = "1 while the state file cannot be written (changes are refused).";
        e.gauge(
            "overlayd_state_save_failing",
            help,
            &[],
            &Value::from(u8::from(failing)),
        );
    }
    let api = &control["api"];
    e.gauge(
        "overlayd_api_clients",
        "API clients connected now.",
        &[],
        &api["clients"],
    );
    for (k, v) in api.as_object().into_iter().flatten() {
        if k != "clients" {
            let help = "API server events (connections, refusals, timeouts), by counter.";
            e.counter("overlayd_api_events", help, &[("counter", k)], v);
        }
    }
    fleet_metrics(e, &control["fleet"]);
}

/// The fleet watcher's figures (docs/fleet.md), when the daemon is a member of one.
fn fleet_metrics(e: &mut Exposition, fleet: &Value) {
    if fleet["enabled"] != Value::Bool(true) {
        return;
    }
    let flag = |v: &Value| Value::from(u8::from(v == &Value::Bool(true)));
    e.gauge(
        "overlayd_fleet_connected",
        "1 while the fleet watcher is connected to the store.",
        &[],
        &flag(&fleet["connected"]),
    );
    e.gauge(
        "overlayd_fleet_revision",
        "The store revision the sled's fleet tables are current at.",
        &[],
        &fleet["revision"],
    );
    // Absent until the sled has once been current: no sample rather than a lie.
    e.gauge(
        "overlayd_fleet_lag_seconds",
        "Seconds since the sled last knew its fleet tables current.",
        &[],
        &fleet["lag_seconds"],
    );
    e.counter(
        "overlayd_fleet_resyncs",
        "Full reads of the store (compaction, cluster change, revision gone back, fleet resync).",
        &[],
        &fleet["resyncs"],
    );
    e.counter(
        "overlayd_fleet_alarms",
        "Times an empty store of another cluster was not obeyed (see fleet adopt).",
        &[],
        &fleet["alarms"],
    );
    let help = "Keys of the store refused, by reason (the key's value is not applied).";
    for (reason, n) in fleet["refused"].as_object().into_iter().flatten() {
        e.counter("overlayd_fleet_refused", help, &[("reason", reason)], n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Value {
        serde_json::json!({
            "version": 2,
            "engine": {
                "ports": [{
                    "name": "a\"1", "in_packets": 3, "out_packets": 4, "in_bytes": 300,
                    "out_bytes": 400, "tso_buffers_in": 0, "tso_segments_out": 0,
                    "local_delivered": 0,
                    "uft_in": {"entries": 1, "hits": 2, "misses": 1, "stale": 0, "expired": 0, "evicted": 0},
                    "uft_out": {"entries": 1, "hits": 2, "misses": 1, "stale": 0, "expired": 0, "evicted": 0},
                    "firewall": {"flows": 1, "flows_created": 1, "flows_reopened": 0, "flows_expired": 0, "flows_evicted": 0},
                    "table_limits": {"conns": 10, "uft": 20, "share_bytes": 99},
                    "gateway": {"arp_replies": 1},
                    "drops": {"fw_deny_in": 5},
                }],
                "underlay_drops": {"not_udp": 0},
                "datapath_drops": {"no_port_for_vni_mac": 2},
                "coalescer": {"frames_in": 1, "frames_out": 1, "merged": 0, "gso_frames_out": 0},
                "v2p_entries": 7,
                "hold": {"frames": 0, "bytes": 0, "destinations": 0, "held": 0, "sent": 0,
                         "overflow": 0, "timeout": 0, "port_removed": 0},
            },
            "worker": {"rounds": 10, "tap_rx_frames": 4},
            "workers": [{"worker": 0, "core": 1, "ports": ["a\"1"], "rounds": 10, "busy_rounds": 5,
                         "busy_ratio": 0.5, "idle_sleeps": 1, "handoff_in": 0, "handoff_out": 0,
                         "started_unix_ms": 1500}],
            "next_hops": {"entries": 1, "snapshots": 2, "invalidations": 0, "requests_deferred": 0},
            "underlay": [{"name": "eth1", "mtu": 9000, "queues": 2, "xdp": {"redirected": 9}}],
            "control": {
                "not_applied": {"ports": [{"name": "x"}], "v2p_count": 3, "v2p": []},
                "state": {"file": "/s", "save_error": "read-only"},
                "api": {"clients": 1, "connections": 5, "clients_refused": 0},
            },
        })
    }

    /// Checks the exposition's grammar (the subset written): each family's HELP
    /// and TYPE before its samples, no family twice, counters' samples end in
    /// `_total`, label sets braced and quoted, `# EOF` last. Returns sample -> value.
    fn parse(text: &str) -> HashMap<String, f64> {
        assert!(text.ends_with("# EOF\n"), "{text}");
        let mut samples = HashMap::new();
        let mut kinds: HashMap<String, String> = HashMap::new();
        let mut current: Option<String> = None;
        for line in text.lines().filter(|l| *l != "# EOF") {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                assert!(matches!(kind, "counter" | "gauge"), "{line}");
                assert!(
                    kinds.insert(name.into(), kind.into()).is_none(),
                    "{name} twice"
                );
                assert_eq!(current.as_deref(), Some(name), "TYPE without HELP: {line}");
                continue;
            }
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').unwrap();
                assert!(help.ends_with('.') && !help.ends_with(".."), "{line}");
                current = Some(name.to_string());
                continue;
            }
            assert!(!line.starts_with('#'), "{line}");
            let name = current.clone().expect("sample before any family");
            let (metric, value) = line.rsplit_once(' ').unwrap();
            let value: f64 = value.parse().unwrap_or_else(|_| panic!("value in {line}"));
            let bare = metric.split('{').next().unwrap();
            let want = match kinds.get(&name).map(String::as_str) {
                Some("counter") => format!("{name}_total"),
                Some(_) => name.clone(),
                None => panic!("sample before TYPE: {line}"),
            };
            assert_eq!(bare, want, "{line}");
            assert!(
                bare.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'),
                "{line}"
            );
            let labels = &metric[bare.len()..];
            assert!(
                labels.is_empty() || (labels.starts_with('{') && labels.ends_with("\"}")),
                "{line}"
            );
            assert!(
                samples.insert(metric.to_string(), value).is_none(),
                "{line} twice"
            );
        }
        samples
    }

    #[test]
    fn exposition_parses_and_names_by_convention() {
        let s = parse(&render(&sample()).unwrap());
        assert_eq!(
            s[r#"overlayd_port_packets_total{port="a\"1",direction="out"}"#],
            4.0
        );
        assert_eq!(
            s[r#"overlayd_drops_total{port="a\"1",reason="fw_deny_in"}"#],
            5.0
        );
        assert_eq!(
            s[r#"overlayd_drops_total{port="",reason="no_port_for_vni_mac"}"#],
            2.0
        );
        assert_eq!(s[r#"overlayd_drops_total{port="",reason="not_udp"}"#], 0.0);
        assert_eq!(s[r#"overlayd_worker_busy_ratio{worker="0"}"#], 0.5);
        assert_eq!(s[r#"overlayd_worker_start_time_seconds{worker="0"}"#], 1.5);
        assert_eq!(s["overlayd_v2p_entries"], 7.0);
        assert_eq!(
            s[r#"overlayd_uft_entries{port="a\"1",direction="in"}"#],
            1.0
        );
        assert_eq!(
            s[r#"overlayd_worker_io_events_total{counter="tap_rx_frames"}"#],
            4.0
        );
        assert_eq!(
            s[r#"overlayd_xdp_events_total{link="eth1",counter="redirected"}"#],
            9.0
        );
        assert!(!s.contains_key(r#"overlayd_worker_io_events_total{counter="rounds"}"#));
        assert_eq!(s[r#"overlayd_not_applied{kind="port"}"#], 1.0);
        assert_eq!(s[r#"overlayd_not_applied{kind="v2p"}"#], 3.0);
        assert_eq!(s["overlayd_state_save_failing"], 1.0);
        assert_eq!(s["overlayd_api_clients"], 1.0);
        assert_eq!(
            s[r#"overlayd_api_events_total{counter="connections"}"#],
            5.0
        );
    }

    #[test]
    fn empty_stats_are_an_empty_exposition() {
        assert_eq!(render(&Value::Null).unwrap(), "# EOF\n");
    }

    #[test]
    fn the_fleet_watcher_is_exposed_when_enabled() {
        let fleet = |enabled: bool, lag: Value| {
            serde_json::json!({ "control": { "fleet": {
                "enabled": enabled, "connected": true, "revision": 42, "lag_seconds": lag,
                "resyncs": 1, "alarms": 0, "refused": { "underlay_address": 2, "shape": 1 },
            }}})
        };
        let s = parse(&render(&fleet(true, Value::from(0.25))).unwrap());
        assert_eq!(s["overlayd_fleet_connected"], 1.0);
        assert_eq!(s["overlayd_fleet_revision"], 42.0);
        assert_eq!(s["overlayd_fleet_lag_seconds"], 0.25);
        assert_eq!(s["overlayd_fleet_resyncs_total"], 1.0);
        assert_eq!(
            s[r#"overlayd_fleet_refused_total{reason="underlay_address"}"#],
            2.0
        );
        // Never current yet: no lag sample rather than a made-up one.
        let s = parse(&render(&fleet(true, Value::Null)).unwrap());
        assert!(!s.contains_key("overlayd_fleet_lag_seconds"));
        assert_eq!(render(&fleet(false, Value::Null)).unwrap(), "# EOF\n");
    }
}
