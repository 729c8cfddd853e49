//! bench-e2e: this datapath side by side with kernel VXLAN over IPv6, OVS's
//! userspace datapath with Geneve over IPv6 and a plain veth pair, on the same
//! two-sled topology, measured with iperf3 and sockperf in alternation; and with
//! OVS with DPDK, DPDK's testpmd as the guests on both (see `e2e::bench`).
//!
//! Run through `scripts/bench-e2e.sh`, which installs the tools and builds in
//! release mode; `bench-e2e --help` lists the options. Prints a progress line per
//! run, then Markdown tables of the medians with ratios to VXLAN (the VM rows of
//! `--vm`: to the first VM setup; testpmd's: to OVS with DPDK), and writes every
//! run and the medians as JSON.
//!
//! Exit status: 0 when every run succeeded, 1 when any failed (the others are still
//! reported), 2 for a bad command line, 130 when interrupted.

use e2e::bench::cpu::user_hz;
use e2e::bench::options::{Options, Parsed, USAGE};
use e2e::bench::process::TempDir;
use e2e::bench::report::{background_line, markdown, summarize, to_json, Run};
use e2e::bench::runner::{preflight, Outcome, Runner};
use e2e::bench::setup::{Kind, Setup};
use e2e::bench::signals;
use e2e::netns::{sweep_stale, unique_id};
use e2e::vm::{Accel, GuestImage};
use e2e::{Cmd, Context, Result};
use serde_json::{json, Value};
use std::process::ExitCode;
use std::time::Instant;

/// Namespace names start with this unless `BENCH_E2E_PREFIX` says otherwise.
const DEFAULT_PREFIX: &str = "bx";

fn main() -> ExitCode {
    let opts = match Options::parse(std::env::args().skip(1)) {
        Ok(Parsed::Run(o)) => o,
        Ok(Parsed::Help) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("bench-e2e: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&opts) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("bench-e2e: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(opts: &Options) -> Result<ExitCode> {
    e2e::require_root()?;
    signals::install()?;
    preflight(opts)?;
    let prefix = std::env::var("BENCH_E2E_PREFIX").unwrap_or_else(|_| DEFAULT_PREFIX.into());
    // Namespaces of earlier runs that were killed before their guards ran.
    sweep_stale(&prefix)?;
    if opts.setups.iter().any(Setup::runs_overlayd) {
        e2e::bins::bins().context("locating overlayd and xdeadm")?;
    }
    let work = TempDir::create(&unique_id(&prefix))?;
    let mut meta = meta(opts)?;
    let started = Instant::now();
    let runner = Runner {
        opts,
        prefix: &prefix,
        dir: work.path(),
        hz: user_hz()?,
    };
    if let Some(caveat) = opts.caveat() {
        println!("{caveat}");
    }
    let outcome = runner.run_rounds(|r: &Run| println!("  {}", r.line()));
    meta["finished"] = json!(utc_now()?);
    meta["elapsed_seconds"] = json!(started.elapsed().as_secs_f64().round());
    meta["loadavg_end"] = json!(loadavg());
    finish(opts, meta, &outcome, started)
}

/// Prints the tables and the failures, writes the JSON, picks the exit status.
fn finish(opts: &Options, meta: Value, outcome: &Outcome, started: Instant) -> Result<ExitCode> {
    let setups: Vec<String> = opts.setups.iter().map(|s| s.name.clone()).collect();
    let rows = summarize(&outcome.runs, &setups, &opts.tests);
    println!(
        "\nMedians over {} round(s) of {} s runs ({:.0} s in all):\n",
        opts.rounds,
        opts.timing.seconds,
        started.elapsed().as_secs_f64()
    );
    print!("{}", markdown(&rows));
    if let Some(caveat) = opts.caveat() {
        println!("\n{caveat}");
    }
    if let Some(line) = background_line(&outcome.runs) {
        println!("\n{line}");
    }
    let failed: Vec<&Run> = outcome.runs.iter().filter(|r| r.result.is_err()).collect();
    for r in &failed {
        if let Err(e) = &r.result {
            eprintln!("\nFAILED: round {} {} {}:\n{e}", r.round, r.setup, r.test);
        }
    }
    let doc = to_json(meta, &outcome.runs, &rows);
    if let Some(dir) = opts.json.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let text = serde_json::to_string_pretty(&doc)
        .map_err(|e| e2e::Error::new(format!("encoding the results: {e}")))?;
    std::fs::write(&opts.json, text + "\n")
        .with_context(|| format!("writing {}", opts.json.display()))?;
    println!("\nevery run and the medians: {}", opts.json.display());
    Ok(if outcome.interrupted {
        eprintln!("bench-e2e: interrupted; the results above are partial");
        ExitCode::from(130)
    } else if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        eprintln!(
            "bench-e2e: {} of {} runs failed",
            failed.len(),
            outcome.runs.len()
        );
        ExitCode::FAILURE
    })
}

/// What the results were measured with and on.
fn meta(opts: &Options) -> Result<Value> {
    let setups: Vec<Value> = opts
        .setups
        .iter()
        .map(|s| match &s.kind {
            Kind::Ours { flags } => {
                json!({"name": s.name, "kind": "ours", "overlayd_flags": flags})
            }
            Kind::Vm { .. } => json!({"name": s.name, "kind": "vm"}),
            _ => json!({"name": s.name, "kind": s.name}),
        })
        .collect();
    // How the VMs ran: under TCG their figures mean little outside their run.
    let vm = if opts.setups.iter().any(Setup::is_vm) {
        let image = GuestImage::get()?;
        Some(json!({
            "accel": format!("{:?}", Accel::for_this_machine(image)?),
            "guest_image": image.versions(),
        }))
    } else {
        None
    };
    let overlayd = if opts.setups.iter().any(Setup::runs_overlayd) {
        Some(e2e::bins::bins()?.overlayd.display().to_string())
    } else {
        None
    };
    Ok(json!({
        "started": utc_now()?,
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "rounds": opts.rounds,
        "seconds": opts.timing.seconds,
        "omit_seconds": opts.timing.omit,
        "setups": setups,
        "tests": opts.tests.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "cpus": std::thread::available_parallelism().map(usize::from).ok(),
        "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").ok().map(|k| k.trim().to_string()),
        "overlayd": overlayd,
        "vm": vm,
        "loadavg_start": loadavg(),
    }))
}

fn utc_now() -> Result<String> {
    Ok(Cmd::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M:%S UTC"])
        .run()?
        .trim()
        .to_string())
}

/// The 1, 5 and 15 minute load averages (other users of a shared machine show here).
fn loadavg() -> Option<String> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    Some(
        text.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
    )
}
