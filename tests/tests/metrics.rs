//! A real Prometheus scrapes `overlayd --metrics-listen`: after a ping, PromQL
//! through Prometheus's HTTP API (`/api/v1/query`) finds the port's packets, its
//! workers' busy ratio and the drop counters by reason. Also `xdeadm stats --format
//! openmetrics|prometheus` (the classic one is what a textfile collector takes) and
//! the endpoint asked for the classic format by curl, checked with promtool,
//! against the same daemon.
//!
//! The daemon runs in sled 0's network namespace; Prometheus runs there too (a
//! fresh namespace: any port on its 127.0.0.1 is free), as a child killed at the
//! end whatever the outcome.

use api::testing::exposition::assert_promtool_passes;
use e2e::cmd::terminate;
use e2e::standard::{self, A1, A2};
use e2e::{poll_until, Error, Result, Sled};
use serde_json::Value;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::Duration;

const METRICS: &str = "127.0.0.1:9464";
const PROMETHEUS: &str = "127.0.0.1:9090";
const FIRST_REPLY: Duration = Duration::from_secs(20);
/// Prometheus starts, scrapes every second and answers within this.
const DEADLINE: Duration = Duration::from_secs(60);

/// Prometheus as a child process with its own config and storage; killed and its
/// directory removed on drop.
struct Prometheus {
    child: Child,
    dir: PathBuf,
}

impl Prometheus {
    fn start(sled: &Sled, dir: PathBuf) -> Result<Prometheus> {
        std::fs::create_dir_all(&dir)?;
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n\
                 scrape_configs:\n  - job_name: overlayd\n    static_configs:\n      \
                 - targets: ['{METRICS}']\n"
            ),
        )?;
        let log = std::fs::File::create(dir.join("prometheus.log"))?;
        let child = sled
            .ns
            .cmd("prometheus")
            .args([
                format!("--config.file={}", config.display()),
                format!("--storage.tsdb.path={}", dir.join("tsdb").display()),
                format!("--web.listen-address={PROMETHEUS}"),
            ])
            .die_with_parent()
            .spawn_with(Stdio::null(), Stdio::from(log))?;
        Ok(Prometheus { child, dir })
    }

    /// The result vector of an instant PromQL query, asked over the HTTP API.
    fn query(&self, sled: &Sled, expr: &str) -> Result<Vec<Value>> {
        let url = format!("http://{PROMETHEUS}/api/v1/query");
        let query = format!("query={expr}");
        let out = sled.ns.run(
            "curl",
            &["-sS", "--max-time", "5", &url, "--data-urlencode", &query],
        )?;
        let v: Value = serde_json::from_str(&out)
            .map_err(|e| Error::new(format!("query {expr}: not JSON ({e}): {out}")))?;
        if v["status"] != "success" {
            return Err(Error::new(format!("query {expr}: {out}")));
        }
        Ok(v["data"]["result"].as_array().cloned().unwrap_or_default())
    }

    /// Waits until `expr` returns at least one series; returns them.
    fn wait_for(&self, sled: &Sled, expr: &str) -> Result<Vec<Value>> {
        poll_until(&format!("Prometheus to answer {expr}"), DEADLINE, || {
            let r = self.query(sled, expr)?;
            if r.is_empty() {
                Err(Error::new("no series yet"))
            } else {
                Ok(r)
            }
        })
        .map_err(|e| e.context(self.log()))
    }

    fn log(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(20).collect();
        format!(
            "prometheus log (last lines, newest first):\n{}",
            tail.join("\n")
        )
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        if let Err(e) = terminate(&mut self.child, "prometheus") {
            eprintln!("stopping prometheus: {e}");
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn prometheus_scrapes_port_worker_and_drop_metrics() -> Result<()> {
    let rack = standard::rack("om", &["--cores", "0,1", "--metrics-listen", METRICS])?;
    let (a1, a2) = (rack.guest(A1)?, rack.guest(A2)?);
    let sled0 = rack.sled(0)?;
    a1.ping(a2.ipv4()?, 56, FIRST_REPLY)?;

    // The textfile-collector form: the same exposition, ending in # EOF.
    let text = sled0.admin(&["stats", "--format", "openmetrics"])?;
    assert!(text.ends_with("# EOF\n"), "{text}");
    assert!(
        text.contains("# TYPE overlayd_port_packets counter"),
        "{text}"
    );
    assert!(
        text.contains(r#"overlayd_port_packets_total{port="a1",direction="out"} "#),
        "{text}"
    );

    // The textfile collector's form, and the endpoint asked for the classic format:
    // `promtool check metrics` finds nothing wrong with either.
    let classic = sled0.admin(&["stats", "--format", "prometheus"])?;
    assert!(
        classic.contains("# TYPE overlayd_port_packets_total counter"),
        "{classic}"
    );
    assert_promtool_passes(&classic);
    let url = format!("http://{METRICS}/metrics");
    let accept = "Accept: text/plain;version=0.0.4";
    let served = sled0
        .ns
        .run("curl", &["-sS", "--max-time", "5", "-H", accept, &url])?;
    assert!(
        served.contains(r#"overlayd_port_packets_total{port="a1",direction="out"} "#),
        "{served}"
    );
    assert_promtool_passes(&served);

    let prom = Prometheus::start(
        sled0,
        std::env::temp_dir().join(format!("{}-prom", rack.id)),
    )?;
    let up = prom.wait_for(sled0, r#"up{job="overlayd"} == 1"#)?;
    assert_eq!(up.len(), 1, "{up:?}");
    let sent = prom.wait_for(
        sled0,
        r#"overlayd_port_packets_total{port="a1",direction="out"} > 0"#,
    )?;
    assert_eq!(sent.len(), 1, "{sent:?}");
    // a2 is on worker 1, a1 on worker 0: both workers report a ratio in [0, 1].
    let busy = prom.wait_for(sled0, "overlayd_worker_busy_ratio >= 0 <= 1")?;
    let mut workers: Vec<&str> = busy
        .iter()
        .filter_map(|s| s["metric"]["worker"].as_str())
        .collect();
    workers.sort_unstable();
    assert_eq!(workers, ["0", "1"], "{busy:?}");
    // Drop counters by reason, sled-wide ones with port="": the underlay reasons
    // are always listed.
    let drops = prom.wait_for(sled0, r#"overlayd_drops_total{port="",reason="not_udp"}"#)?;
    assert_eq!(drops.len(), 1, "{drops:?}");
    let entries = prom.wait_for(sled0, "overlayd_v2p_entries")?;
    assert!(
        entries[0]["value"][1].as_str().is_some_and(|v| v != "0"),
        "{entries:?}"
    );
    Ok(())
}
