//! Results: medians per (test, setup) over the rounds, ratios to the baseline
//! (kernel VXLAN; for the VM tests the first VM setup, for testpmd's OVS with
//! DPDK, see [`baseline_name`]), Markdown tables, and the JSON file with every
//! run.
//!
//! Every figure's median is taken over the successful runs separately (so "per
//! busy core" is the median of each run's ratio, not a ratio of medians).

use super::cpu::Usage;
use super::iperf::{GuestKind, Measurement, Test};
use super::setup::{BASELINE, PMD_BASELINE};
use super::sockperf::Latency;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Threads whose median use is below this many cores are left out of the tables
/// (they are in the JSON's runs).
const THREAD_FLOOR: f64 = 0.01;

/// One run: which, and what it measured or why it failed.
#[derive(Clone, Debug)]
pub struct Run {
    pub round: usize,
    pub setup: String,
    pub test: Test,
    /// Cores the machine kept busy just before this run's topology was built, while
    /// nothing of the benchmark ran (see [`crate::bench::cpu::background_busy_cores`]).
    pub background_cores: Option<f64>,
    pub result: Result<Measurement, String>,
}

impl Run {
    /// One progress line for the terminal.
    pub fn line(&self) -> String {
        let head = format!("round {} {:>8} {:<13}", self.round, self.setup, self.test);
        match &self.result {
            Err(e) => format!("{head} FAILED: {}", e.lines().next().unwrap_or("")),
            Ok(m) => {
                let figure = match (m.figures.latency, m.figures.udp) {
                    (Some(l), _) => format!(
                        "round trip p50 {:.1} µs, p99 {:.1} µs, p99.9 {:.1} µs, {:.0} round trips/s",
                        l.p50_us, l.p99_us, l.p99_9_us, l.round_trips_per_s
                    ),
                    (None, Some(u)) if self.test.guest_kind() == GuestKind::Testpmd => format!(
                        "{:8.0} kpps delivered ({:.2} Gbit/s), loss {:5.1}%",
                        u.delivered_pps / 1e3,
                        m.figures.gbps,
                        u.loss_percent
                    ),
                    (None, Some(u)) => format!(
                        "{:8.0} kpps delivered, loss {:5.1}%",
                        u.delivered_pps / 1e3,
                        u.loss_percent
                    ),
                    (None, None) if self.test.from_vm => {
                        format!("{:6.0} Mbit/s", m.figures.gbps * 1e3)
                    }
                    (None, None) => format!("{:6.2} Gbit/s", m.figures.gbps),
                };
                let daemons = m
                    .cpu
                    .daemon_cores()
                    .map_or_else(String::new, |c| format!(", daemons {c:.2} cores"));
                let qemu = m
                    .cpu
                    .vm_cores()
                    .map_or_else(String::new, |c| format!(", QEMU {c:.2} cores"));
                format!(
                    "{head} {figure}, busy {:.2} cores{daemons}{qemu}",
                    m.cpu.busy_cores
                )
            }
        }
    }
}

/// Gbit/s per busy core of one run.
fn gbps_per_core(m: &Measurement) -> f64 {
    m.figures.gbps / m.cpu.busy_cores.max(1e-9)
}

/// Delivered thousands of packets per second per busy core of one UDP run.
fn kpps_per_core(m: &Measurement) -> Option<f64> {
    m.figures
        .udp
        .map(|u| u.delivered_pps / 1e3 / m.cpu.busy_cores.max(1e-9))
}

/// The medians of one (test, setup) over its successful runs.
#[derive(Clone, Debug, PartialEq)]
pub struct Medians {
    pub gbps: f64,
    pub busy_cores: f64,
    pub gbps_per_core: f64,
    /// Only for setups with daemons.
    pub daemon_cores: Option<f64>,
    /// The VM's QEMU process; only for the VM setups.
    pub vm_cores: Option<f64>,
    pub udp: Option<UdpMedians>,
    /// Each figure's median over the runs: the median of the runs' p99, say, is
    /// the typical run's p99, not the p99 of the rounds' round trips pooled.
    pub latency: Option<Latency>,
    /// (process label, thread name, allowed CPUs, cores), sorted by process and thread.
    pub threads: Vec<(String, String, String, f64)>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct UdpMedians {
    pub delivered_kpps: f64,
    pub loss_percent: f64,
    pub kpps_per_core: f64,
}

/// One row of the results.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    pub test: Test,
    pub setup: String,
    pub ok: usize,
    pub total: usize,
    /// `None` when every run failed.
    pub medians: Option<Medians>,
}

/// The median (mean of the middle two for an even count); `None` for no values.
pub fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len().is_multiple_of(2) {
        (v[mid - 1] + v[mid]) / 2.0
    } else {
        v[mid]
    })
}

/// Rows in test order, setups in run order within each test.
pub fn summarize(runs: &[Run], setups: &[String], tests: &[Test]) -> Vec<Summary> {
    let mut rows = Vec::new();
    for &test in tests {
        for setup in setups {
            let mine: Vec<&Run> = runs
                .iter()
                .filter(|r| r.test == test && &r.setup == setup)
                .collect();
            if mine.is_empty() {
                continue;
            }
            let ok: Vec<&Measurement> =
                mine.iter().filter_map(|r| r.result.as_ref().ok()).collect();
            rows.push(Summary {
                test,
                setup: setup.clone(),
                ok: ok.len(),
                total: mine.len(),
                medians: medians(&ok),
            });
        }
    }
    rows
}

fn medians(ok: &[&Measurement]) -> Option<Medians> {
    let of = |f: &dyn Fn(&Measurement) -> f64| median(ok.iter().map(|m| f(m)).collect());
    let udp = if ok.iter().all(|m| m.figures.udp.is_some()) {
        let u = |f: &dyn Fn(&Measurement) -> Option<f64>| {
            median(ok.iter().filter_map(|m| f(m)).collect())
        };
        Some(UdpMedians {
            delivered_kpps: u(&|m| m.figures.udp.map(|u| u.delivered_pps / 1e3))?,
            loss_percent: u(&|m| m.figures.udp.map(|u| u.loss_percent))?,
            kpps_per_core: u(&kpps_per_core)?,
        })
    } else {
        None
    };
    let latency = if ok.iter().all(|m| m.figures.latency.is_some()) {
        let l = |f: &dyn Fn(&Latency) -> f64| {
            median(
                ok.iter()
                    .filter_map(|m| m.figures.latency.as_ref().map(f))
                    .collect(),
            )
        };
        Some(Latency {
            p50_us: l(&|l| l.p50_us)?,
            p99_us: l(&|l| l.p99_us)?,
            p99_9_us: l(&|l| l.p99_9_us)?,
            round_trips_per_s: l(&|l| l.round_trips_per_s)?,
        })
    } else {
        None
    };
    let daemon_cores: Vec<f64> = ok.iter().filter_map(|m| m.cpu.daemon_cores()).collect();
    let vm_cores: Vec<f64> = ok.iter().filter_map(|m| m.cpu.vm_cores()).collect();
    Some(Medians {
        gbps: of(&|m| m.figures.gbps)?,
        busy_cores: of(&|m| m.cpu.busy_cores)?,
        gbps_per_core: of(&gbps_per_core)?,
        daemon_cores: median(daemon_cores),
        vm_cores: median(vm_cores),
        udp,
        latency,
        threads: thread_medians(ok.iter().map(|m| &m.cpu)),
    })
}

/// Per (process, thread name): the median over runs (a run without the thread
/// counts as 0), at least [`THREAD_FLOOR`].
fn thread_medians<'a>(
    usages: impl Iterator<Item = &'a Usage>,
) -> Vec<(String, String, String, f64)> {
    let usages: Vec<&Usage> = usages.collect();
    let mut cpus: BTreeMap<(String, String), String> = BTreeMap::new();
    for u in &usages {
        for p in &u.processes {
            for t in &p.threads {
                cpus.entry((p.label.clone(), t.name.clone()))
                    .or_insert_with(|| t.cpus.clone());
            }
        }
    }
    cpus.into_iter()
        .filter_map(|((process, thread), allowed)| {
            let values = usages
                .iter()
                .map(|u| {
                    u.processes
                        .iter()
                        .filter(|p| p.label == process)
                        .flat_map(|p| &p.threads)
                        .filter(|t| t.name == thread)
                        .map(|t| t.cores)
                        .sum()
                })
                .collect();
            let m = median(values)?;
            (m >= THREAD_FLOOR).then_some((process, thread, allowed, m))
        })
        .collect()
}

/// The setup `test`'s rows are compared with: kernel VXLAN; for a VM test the
/// first VM setup that has a row (the first attachment way run): a VM's figures
/// depend on how its CPU is run (emulated under TCG), so they are compared only
/// among VM setups of the same run; for a testpmd test OVS with DPDK, the
/// datapath built for such guests.
pub fn baseline_name<'a>(rows: &'a [Summary], test: &Test) -> Option<&'a str> {
    match test.guest_kind() {
        GuestKind::Vm => rows
            .iter()
            .find(|r| r.test.from_vm)
            .map(|r| r.setup.as_str()),
        GuestKind::Testpmd => Some(PMD_BASELINE),
        GuestKind::Netns => Some(BASELINE),
    }
}

/// `value / baseline` of the baseline setup's row for the same test.
fn ratio(rows: &[Summary], row: &Summary, value: impl Fn(&Medians) -> Option<f64>) -> Option<f64> {
    let name = baseline_name(rows, &row.test)?;
    let base = rows
        .iter()
        .find(|r| r.test == row.test && r.setup == name)?;
    let b = value(base.medians.as_ref()?)?;
    let v = value(row.medians.as_ref()?)?;
    (b > 0.0).then(|| v / b)
}

fn fmt_opt(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "-".to_string(), |v| format!("{v:.decimals$}"))
}

fn fmt_ratio(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_string(), |v| format!("{v:.2}x"))
}

/// The Markdown tables: TCP, small UDP, latency, testpmd, VM, and the daemons'
/// (and QEMU's) threads.
pub fn markdown(rows: &[Summary]) -> String {
    let mut out = String::new();
    let tcp: Vec<&Summary> = rows
        .iter()
        .filter(|r| {
            !r.test.is_udp() && !r.test.is_latency() && r.test.guest_kind() == GuestKind::Netns
        })
        .collect();
    if !tcp.is_empty() {
        out.push_str(&throughput_table(rows, &tcp, &TCP));
    }
    let udp: Vec<&Summary> = rows.iter().filter(|r| r.test.is_udp()).collect();
    if !udp.is_empty() {
        separate(&mut out);
        out.push_str(&packet_table(rows, &udp, BASELINE, false));
    }
    let latency: Vec<&Summary> = rows.iter().filter(|r| r.test.is_latency()).collect();
    if !latency.is_empty() {
        separate(&mut out);
        out.push_str(&latency_table(rows, &latency));
    }
    let pmd: Vec<&Summary> = rows
        .iter()
        .filter(|r| r.test.guest_kind() == GuestKind::Testpmd)
        .collect();
    if !pmd.is_empty() {
        separate(&mut out);
        out.push_str(&packet_table(rows, &pmd, PMD_BASELINE, true));
    }
    let vm: Vec<&Summary> = rows.iter().filter(|r| r.test.from_vm).collect();
    if let Some(first) = vm.first() {
        separate(&mut out);
        out.push_str(&throughput_table(rows, &vm, &vm_throughput(&first.setup)));
    }
    let threads = threads_table(rows);
    if !threads.is_empty() {
        separate(&mut out);
        out.push_str(&threads);
    }
    out
}

/// A blank line between tables (none before the first).
fn separate(out: &mut String) {
    if !out.is_empty() {
        out.push('\n');
    }
}

/// One line on the other users' load: busy figures include it.
pub fn background_line(runs: &[Run]) -> Option<String> {
    let v: Vec<f64> = runs.iter().filter_map(|r| r.background_cores).collect();
    let max = v.iter().copied().fold(f64::NAN, f64::max);
    let median = median(v)?;
    Some(format!(
        "Background load (machine busy cores just before each topology was built, while \
         nothing of the benchmark ran): median {median:.2}, max {max:.2}."
    ))
}

/// Packet rates: the small-UDP tests against `baseline`, or (`gbps`) testpmd's,
/// whose frames' bytes are shown as Gbit/s too.
fn packet_table(all: &[Summary], rows: &[&Summary], baseline: &str, gbps: bool) -> String {
    let (gbps_head, gbps_rule) = if gbps {
        (" Gbit/s |", "---:|")
    } else {
        ("", "")
    };
    let mut t = format!(
        "| test | setup | delivered kpps |{gbps_head} vs {baseline} | loss % | busy cores | vs {baseline} | kpps per busy core | vs {baseline} | daemon cores | runs |\n\
         |---|---|---:|{gbps_rule}---:|---:|---:|---:|---:|---:|---:|---:|\n"
    );
    for r in rows {
        let m = r.medians.as_ref();
        let u = m.and_then(|m| m.udp);
        let gbps_cell = if gbps {
            format!(" {} |", fmt_opt(m.map(|m| m.gbps), 2))
        } else {
            String::new()
        };
        let _ = writeln!(
            t,
            "| {} | {} | {} |{gbps_cell} {} | {} | {} | {} | {} | {} | {} | {}/{} |",
            r.test,
            r.setup,
            fmt_opt(u.map(|u| u.delivered_kpps), 0),
            fmt_ratio(ratio(all, r, |m| m.udp.map(|u| u.delivered_kpps))),
            fmt_opt(u.map(|u| u.loss_percent), 1),
            fmt_opt(m.map(|m| m.busy_cores), 2),
            fmt_ratio(ratio(all, r, |m| Some(m.busy_cores))),
            fmt_opt(u.map(|u| u.kpps_per_core), 0),
            fmt_ratio(ratio(all, r, |m| m.udp.map(|u| u.kpps_per_core))),
            fmt_opt(m.and_then(|m| m.daemon_cores), 2),
            r.ok,
            r.total
        );
    }
    t
}

/// Round trips of the latency tests against kernel VXLAN (a ratio below 1 is
/// faster), with the machine's and the daemons' cores while they ran.
fn latency_table(all: &[Summary], rows: &[&Summary]) -> String {
    let base = BASELINE;
    let mut t = format!(
        "| test | setup | round trip p50 µs | vs {base} | p99 µs | vs {base} | p99.9 µs | vs {base} | round trips/s | busy cores | vs {base} | daemon cores | runs |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    );
    for r in rows {
        let m = r.medians.as_ref();
        let l = m.and_then(|m| m.latency);
        let _ = writeln!(
            t,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {}/{} |",
            r.test,
            r.setup,
            fmt_opt(l.map(|l| l.p50_us), 1),
            fmt_ratio(ratio(all, r, |m| m.latency.map(|l| l.p50_us))),
            fmt_opt(l.map(|l| l.p99_us), 1),
            fmt_ratio(ratio(all, r, |m| m.latency.map(|l| l.p99_us))),
            fmt_opt(l.map(|l| l.p99_9_us), 1),
            fmt_ratio(ratio(all, r, |m| m.latency.map(|l| l.p99_9_us))),
            fmt_opt(l.map(|l| l.round_trips_per_s), 0),
            fmt_opt(m.map(|m| m.busy_cores), 2),
            fmt_ratio(ratio(all, r, |m| Some(m.busy_cores))),
            fmt_opt(m.and_then(|m| m.daemon_cores), 2),
            r.ok,
            r.total
        );
    }
    t
}

/// How a throughput table shows its rows.
struct Throughput<'a> {
    /// `Gbit/s` or `Mbit/s`.
    unit: &'a str,
    /// Per Gbit/s.
    scale: f64,
    decimals: usize,
    /// The setup the ratios divide by.
    baseline: &'a str,
    /// A column of QEMU's cores (the VM rows).
    qemu: bool,
}

/// The TCP tests, in Gbit/s against kernel VXLAN.
const TCP: Throughput<'static> = Throughput {
    unit: "Gbit/s",
    scale: 1.0,
    decimals: 2,
    baseline: BASELINE,
    qemu: false,
};

/// The VM tests against the first VM setup `first`, in Mbit/s (a VM's stream is
/// far from a Gbit/s under TCG), with QEMU's cores apart from the daemons'.
fn vm_throughput(first: &str) -> Throughput<'_> {
    Throughput {
        unit: "Mbit/s",
        scale: 1e3,
        decimals: 0,
        baseline: first,
        qemu: true,
    }
}

fn throughput_table(all: &[Summary], rows: &[&Summary], how: &Throughput) -> String {
    let Throughput {
        unit,
        scale,
        decimals,
        baseline: base,
        qemu,
    } = *how;
    let (qemu_head, qemu_rule) = if qemu {
        (" QEMU cores |", "---:|")
    } else {
        ("", "")
    };
    let mut t = format!(
        "| test | setup | {unit} | vs {base} | busy cores | vs {base} | {unit} per busy core | vs {base} |{qemu_head} daemon cores | runs |\n\
         |---|---|---:|---:|---:|---:|---:|---:|{qemu_rule}---:|---:|\n"
    );
    for r in rows {
        let m = r.medians.as_ref();
        let qemu_cell = if qemu {
            format!(" {} |", fmt_opt(m.and_then(|m| m.vm_cores), 2))
        } else {
            String::new()
        };
        let _ = writeln!(
            t,
            "| {} | {} | {} | {} | {} | {} | {} | {} |{qemu_cell} {} | {}/{} |",
            r.test,
            r.setup,
            fmt_opt(m.map(|m| m.gbps * scale), decimals),
            fmt_ratio(ratio(all, r, |m| Some(m.gbps))),
            fmt_opt(m.map(|m| m.busy_cores), 2),
            fmt_ratio(ratio(all, r, |m| Some(m.busy_cores))),
            fmt_opt(m.map(|m| m.gbps_per_core * scale), decimals),
            fmt_ratio(ratio(all, r, |m| Some(m.gbps_per_core))),
            fmt_opt(m.and_then(|m| m.daemon_cores), 2),
            r.ok,
            r.total
        );
    }
    t
}

/// Per row with daemons: each busy thread's cores, `@N` when pinned to core N.
fn threads_table(rows: &[Summary]) -> String {
    let mut t = String::new();
    for r in rows {
        let Some(m) = &r.medians else { continue };
        if m.threads.is_empty() {
            continue;
        }
        let mut by_process: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for (process, thread, cpus, cores) in &m.threads {
            let pinned = if cpus.parse::<u32>().is_ok() {
                format!("@{cpus}")
            } else {
                String::new()
            };
            by_process
                .entry(process)
                .or_default()
                .push(format!("{thread}{pinned} {cores:.2}"));
        }
        let cells: Vec<String> = by_process
            .into_iter()
            .map(|(p, threads)| format!("{p}: {}", threads.join(", ")))
            .collect();
        let _ = writeln!(t, "| {} | {} | {} |", r.test, r.setup, cells.join("; "));
    }
    if t.is_empty() {
        return t;
    }
    format!(
        "| test | setup | daemon (and QEMU) threads, cores (@N: pinned to core N) |\n|---|---|---|\n{t}"
    )
}

fn usage_json(u: &Usage) -> Value {
    json!({
        "seconds": u.seconds,
        "busy_cores": u.busy_cores,
        "daemon_cores": u.daemon_cores(),
        "vm_cores": u.vm_cores(),
        "daemons": u.processes.iter().map(|p| json!({
            "label": p.label,
            "cores": p.cores,
            "threads": p.threads.iter().map(|t| json!({
                "name": t.name, "cpus": t.cpus, "cores": t.cores,
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

fn latency_json(l: &Latency) -> Value {
    json!({
        "round_trip_p50_us": l.p50_us,
        "round_trip_p99_us": l.p99_us,
        "round_trip_p99_9_us": l.p99_9_us,
        "round_trips_per_s": l.round_trips_per_s,
    })
}

fn run_json(r: &Run) -> Value {
    let mut v = json!({
        "round": r.round,
        "setup": r.setup,
        "test": r.test.to_string(),
        "mtu": r.test.mtu,
        "background_busy_cores": r.background_cores,
        "ok": r.result.is_ok(),
    });
    match &r.result {
        Err(e) => v["error"] = json!(e),
        Ok(m) => {
            v["gbps"] = json!(m.figures.gbps);
            v["gbps_per_busy_core"] = json!(gbps_per_core(m));
            v["retransmits"] = json!(m.figures.retransmits);
            v["udp"] = match m.figures.udp {
                Some(u) => json!({
                    "sent_pps": u.sent_pps,
                    "delivered_pps": u.delivered_pps,
                    "loss_percent": u.loss_percent,
                    "delivered_kpps_per_busy_core": kpps_per_core(m),
                }),
                None => Value::Null,
            };
            v["latency"] = m.figures.latency.as_ref().map_or(Value::Null, latency_json);
            v["cpu"] = usage_json(&m.cpu);
        }
    }
    v
}

fn summary_json(all: &[Summary], r: &Summary) -> Value {
    let mut v = json!({
        "test": r.test.to_string(),
        "setup": r.setup,
        "ok_runs": r.ok,
        "runs": r.total,
    });
    let Some(m) = &r.medians else { return v };
    v["gbps"] = json!(m.gbps);
    v["busy_cores"] = json!(m.busy_cores);
    v["gbps_per_busy_core"] = json!(m.gbps_per_core);
    v["daemon_cores"] = json!(m.daemon_cores);
    v["vm_cores"] = json!(m.vm_cores);
    v["udp"] = match m.udp {
        Some(u) => json!({
            "delivered_kpps": u.delivered_kpps,
            "loss_percent": u.loss_percent,
            "delivered_kpps_per_busy_core": u.kpps_per_core,
        }),
        None => Value::Null,
    };
    v["latency"] = m.latency.as_ref().map_or(Value::Null, latency_json);
    v["threads"] = m
        .threads
        .iter()
        .map(|(p, t, cpus, cores)| json!({"process": p, "thread": t, "cpus": cpus, "cores": cores}))
        .collect();
    if let Some(baseline) = baseline_name(all, &r.test) {
        v[format!("vs_{baseline}")] = json!({
        "gbps": ratio(all, r, |m| Some(m.gbps)),
        "busy_cores": ratio(all, r, |m| Some(m.busy_cores)),
        "gbps_per_busy_core": ratio(all, r, |m| Some(m.gbps_per_core)),
        "delivered_kpps": ratio(all, r, |m| m.udp.map(|u| u.delivered_kpps)),
        "delivered_kpps_per_busy_core": ratio(all, r, |m| m.udp.map(|u| u.kpps_per_core)),
        "round_trip_p50_us": ratio(all, r, |m| m.latency.map(|l| l.p50_us)),
        "round_trip_p99_us": ratio(all, r, |m| m.latency.map(|l| l.p99_us)),
        "round_trip_p99_9_us": ratio(all, r, |m| m.latency.map(|l| l.p99_9_us)),
        });
    }
    v
}

/// The whole result file: `meta` as given, every run, every median row.
pub fn to_json(meta: Value, runs: &[Run], rows: &[Summary]) -> Value {
    json!({
        "meta": meta,
        "runs": runs.iter().map(run_json).collect::<Vec<_>>(),
        "medians": rows.iter().map(|r| summary_json(rows, r)).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::cpu::{ProcessUse, ThreadUse};
    use crate::bench::iperf::{Figures, UdpFigures};

    fn measurement(gbps: f64, busy: f64, worker: f64) -> Measurement {
        Measurement {
            figures: Figures {
                gbps,
                retransmits: Some(0),
                udp: None,
                latency: None,
            },
            cpu: Usage {
                seconds: 4.7,
                busy_cores: busy,
                processes: vec![ProcessUse {
                    label: "overlayd s0".into(),
                    cores: worker + 0.001,
                    threads: vec![
                        ThreadUse {
                            name: "worker0".into(),
                            cpus: "0".into(),
                            cores: worker,
                        },
                        ThreadUse {
                            name: "api-accept".into(),
                            cpus: "0-1".into(),
                            cores: 0.001,
                        },
                    ],
                }],
            },
        }
    }

    fn run(round: usize, setup: &str, test: &str, r: Result<Measurement, String>) -> Run {
        Run {
            round,
            setup: setup.into(),
            test: Test::parse(test).unwrap(),
            background_cores: Some(0.1 * round as f64),
            result: r,
        }
    }

    #[test]
    fn medians_of_odd_and_even_counts() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(vec![]), None);
    }

    #[test]
    fn rows_ratios_and_tables() {
        let vx = |gbps| {
            let mut m = measurement(gbps, 2.0, 0.0);
            m.cpu.processes.clear();
            Ok(m)
        };
        let runs = vec![
            run(1, "ours", "tcp1-v6-8500", Ok(measurement(6.0, 2.0, 0.9))),
            run(1, "vxlan", "tcp1-v6-8500", vx(12.0)),
            run(2, "ours", "tcp1-v6-8500", Ok(measurement(7.0, 2.0, 1.0))),
            run(2, "vxlan", "tcp1-v6-8500", vx(14.0)),
            run(3, "ours", "tcp1-v6-8500", Err("boom\nlog".into())),
            run(3, "vxlan", "tcp1-v6-8500", vx(13.0)),
        ];
        let setups = ["ours".to_string(), "vxlan".to_string()];
        let rows = summarize(&runs, &setups, &[Test::parse("tcp1-v6-8500").unwrap()]);
        assert_eq!(rows.len(), 2);
        let ours = rows[0].medians.as_ref().unwrap();
        assert_eq!((rows[0].ok, rows[0].total), (2, 3));
        assert_eq!(ours.gbps, 6.5);
        assert_eq!(ours.gbps_per_core, 3.25);
        assert_eq!(rows[1].medians.as_ref().unwrap().daemon_cores, None);
        assert_eq!(ratio(&rows, &rows[0], |m| Some(m.gbps)), Some(0.5));
        assert_eq!(
            ours.threads,
            vec![("overlayd s0".into(), "worker0".into(), "0".into(), 0.95)]
        );
        let md = markdown(&rows);
        assert!(
            md.contains(
                "| tcp1-v6-8500 | ours | 6.50 | 0.50x | 2.00 | 1.00x | 3.25 | 0.50x | 0.95 | 2/3 |"
            ),
            "{md}"
        );
        assert!(
            md.contains("| tcp1-v6-8500 | vxlan | 13.00 | 1.00x |"),
            "{md}"
        );
        assert!(md.contains("overlayd s0: worker0@0 0.95"), "{md}");
        assert!(
            runs[4].line().contains("FAILED: boom"),
            "{}",
            runs[4].line()
        );
        let bg = background_line(&runs).unwrap();
        assert!(bg.contains("median 0.20, max 0.30"), "{bg}");
        assert_eq!(background_line(&[]), None);
        let v = to_json(json!({"rounds": 3}), &runs, &rows);
        assert_eq!(v["runs"].as_array().unwrap().len(), 6);
        assert_eq!(v["runs"][4]["error"], "boom\nlog");
        assert_eq!(v["medians"][0]["vs_vxlan"]["gbps"], 0.5);
    }

    #[test]
    fn vm_rows_are_compared_with_the_first_vm_setup() {
        let vm = |mbps: f64, busy, qemu| {
            let mut m = measurement(mbps / 1e3, busy, 0.2);
            m.cpu.processes.push(ProcessUse {
                label: crate::bench::cpu::VM_LABEL.into(),
                cores: qemu,
                threads: vec![ThreadUse {
                    name: "CPU 0/TCG".into(),
                    cpus: "0-1".into(),
                    cores: qemu,
                }],
            });
            Ok(m)
        };
        let runs = vec![
            run(1, "ours", "tcp1-v4-8500", Ok(measurement(6.0, 2.0, 0.9))),
            run(1, "vm-a", "vm-tcp1-v4-8500", vm(400.0, 1.6, 1.0)),
            run(1, "vm-b", "vm-tcp1-v4-8500", vm(600.0, 1.2, 0.9)),
            run(2, "vm-a", "vm-tcp1-v4-8500", vm(500.0, 1.8, 1.0)),
        ];
        let setups = ["ours", "vxlan", "vm-a", "vm-b"].map(String::from);
        let tests = ["tcp1-v4-8500", "vm-tcp1-v4-8500"].map(|t| Test::parse(t).unwrap());
        let rows = summarize(&runs, &setups, &tests);
        assert_eq!(rows.len(), 3);
        assert_eq!(baseline_name(&rows, &tests[0]), Some(BASELINE));
        assert_eq!(baseline_name(&rows, &tests[1]), Some("vm-a"));
        let a = rows[1].medians.as_ref().unwrap();
        assert_eq!((a.vm_cores, a.daemon_cores), (Some(1.0), Some(0.201)));
        let md = markdown(&rows);
        assert!(
            md.contains("| test | setup | Mbit/s | vs vm-a | busy cores | vs vm-a |"),
            "{md}"
        );
        assert!(
            md.contains("| vm-tcp1-v4-8500 | vm-a | 450 | 1.00x | 1.70 | 1.00x | 264 | 1.00x | 1.00 | 0.20 | 2/2 |"),
            "{md}"
        );
        assert!(
            md.contains("| vm-tcp1-v4-8500 | vm-b | 600 | 1.33x | 1.20 | 0.71x | 500 | 1.89x | 0.90 | 0.20 | 1/1 |"),
            "{md}"
        );
        // The namespace test stays in the TCP table, compared with VXLAN (absent here).
        assert!(md.contains("| tcp1-v4-8500 | ours | 6.00 | - |"), "{md}");
        assert!(md.contains("qemu: CPU 0/TCG 0.90"), "{md}");
        let only_vm = markdown(&rows[1..]);
        assert!(
            only_vm.starts_with("| test | setup | Mbit/s |"),
            "{only_vm}"
        );
        assert!(runs[1].line().contains("400 Mbit/s"), "{}", runs[1].line());
        assert!(
            runs[1].line().contains("QEMU 1.00 cores"),
            "{}",
            runs[1].line()
        );
        let v = to_json(json!({}), &runs, &rows);
        assert_eq!(v["medians"][2]["vs_vm-a"]["gbps"], 600.0 / 450.0);
        assert_eq!(v["medians"][2]["vm_cores"], 0.9);
        assert!(v["medians"][0].get("vs_vm-a").is_none());
    }

    #[test]
    fn testpmd_rows_are_compared_with_ovs_dpdk_and_show_gbps() {
        let pmd = |kpps: f64| {
            let mut m = measurement(kpps * 1e3 * 1500.0 * 8.0 / 1e9, 2.0, 0.5);
            m.figures.udp = Some(UdpFigures {
                sent_pps: kpps * 2e3,
                delivered_pps: kpps * 1e3,
                loss_percent: 50.0,
            });
            Ok(m)
        };
        let runs = vec![
            run(1, "ours-vhost", "pmd1500-v4-1500", pmd(300.0)),
            run(1, PMD_BASELINE, "pmd1500-v4-1500", pmd(200.0)),
        ];
        let setups = ["ours-vhost", PMD_BASELINE].map(String::from);
        let test = Test::parse("pmd1500-v4-1500").unwrap();
        let rows = summarize(&runs, &setups, &[test]);
        assert_eq!(baseline_name(&rows, &test), Some(PMD_BASELINE));
        let md = markdown(&rows);
        assert!(
            md.contains("| test | setup | delivered kpps | Gbit/s | vs ovs-dpdk | loss % |"),
            "{md}"
        );
        assert!(
            md.contains("| pmd1500-v4-1500 | ours-vhost | 300 | 3.60 | 1.50x | 50.0 | 2.00 | 1.00x | 150 | 1.50x |"),
            "{md}"
        );
        assert!(!md.contains("| test | setup | Gbit/s |"), "{md}");
        assert!(
            runs[0].line().contains("300 kpps delivered (3.60 Gbit/s)"),
            "{}",
            runs[0].line()
        );
        let v = to_json(json!({}), &runs, &rows);
        assert_eq!(v["medians"][0]["vs_ovs-dpdk"]["delivered_kpps"], 1.5);
    }

    #[test]
    fn latency_rows_show_medians_of_each_percentile() {
        let lat = |p50: f64, p99: f64, p99_9: f64| {
            let mut m = measurement(0.01, 1.5, 0.3);
            m.figures.latency = Some(Latency {
                p50_us: p50,
                p99_us: p99,
                p99_9_us: p99_9,
                round_trips_per_s: 1e6 / p50,
            });
            Ok(m)
        };
        let runs = vec![
            run(1, "ours", "lat64-v4-8500", lat(40.0, 80.0, 300.0)),
            run(1, BASELINE, "lat64-v4-8500", lat(25.0, 50.0, 100.0)),
            run(2, "ours", "lat64-v4-8500", lat(50.0, 60.0, 200.0)),
            run(2, BASELINE, "lat64-v4-8500", lat(25.0, 40.0, 100.0)),
            run(3, "ours", "lat64-v4-8500", lat(30.0, 70.0, 100.0)),
        ];
        let setups = ["ours", BASELINE].map(String::from);
        let test = Test::parse("lat64-v4-8500").unwrap();
        let rows = summarize(&runs, &setups, &[test]);
        let l = rows[0].medians.as_ref().unwrap().latency.unwrap();
        assert_eq!((l.p50_us, l.p99_us, l.p99_9_us), (40.0, 70.0, 200.0));
        assert_eq!(l.round_trips_per_s, 25_000.0);
        let md = markdown(&rows);
        assert!(
            md.starts_with("| test | setup | round trip p50 µs | vs vxlan | p99 µs |"),
            "{md}"
        );
        assert!(
            md.contains("| lat64-v4-8500 | ours | 40.0 | 1.60x | 70.0 | 1.56x | 200.0 | 2.00x | 25000 | 1.50 | 1.00x | 0.30 | 3/3 |"),
            "{md}"
        );
        // Only the latency table: not a TCP row with a Gbit/s figure.
        assert!(!md.contains("Gbit/s"), "{md}");
        assert!(
            runs[0].line().contains(
                "round trip p50 40.0 µs, p99 80.0 µs, p99.9 300.0 µs, 25000 round trips/s"
            ),
            "{}",
            runs[0].line()
        );
        let v = to_json(json!({}), &runs, &rows);
        assert_eq!(v["runs"][0]["latency"]["round_trip_p99_us"], 80.0);
        assert_eq!(v["medians"][0]["latency"]["round_trip_p99_9_us"], 200.0);
        assert_eq!(v["medians"][0]["vs_vxlan"]["round_trip_p50_us"], 1.6);
        assert!(v["medians"][0]["udp"].is_null());
    }

    #[test]
    fn udp_rows_use_delivered_packets() {
        let mut m = measurement(0.1, 2.0, 1.0);
        m.figures.udp = Some(UdpFigures {
            sent_pps: 1e6,
            delivered_pps: 5e5,
            loss_percent: 50.0,
        });
        let runs = vec![run(1, "ours", "udp64-v4-8500", Ok(m))];
        let rows = summarize(
            &runs,
            &["ours".into()],
            &[Test::parse("udp64-v4-8500").unwrap()],
        );
        let u = rows[0].medians.as_ref().unwrap().udp.unwrap();
        assert_eq!((u.delivered_kpps, u.kpps_per_core), (500.0, 250.0));
        let md = markdown(&rows);
        assert!(
            md.contains("| udp64-v4-8500 | ours | 500 | - | 50.0 | 2.00 | - | 250 | - |"),
            "{md}"
        );
    }
}
