//! The soak: the standard rack (two sleds, four guests) under mixed traffic for a
//! long time, watched for slow failures a short test cannot see — memory that
//! creeps, tables that fill, counters that drift apart.
//!
//! Traffic, all of it at once for `--seconds`:
//! - bulk TCP: checked transfers (every byte compared, `e2e-xfer`) a1 -> b1 over
//!   IPv4 and b2 -> a1 over IPv6, one after the other;
//! - small UDP: 64-byte datagrams b2 -> a1 over IPv6 ([`UDP_PPS`] a second);
//! - ping: a2 -> b1 over IPv4, ten a second;
//! - churn: short TCP connections a2 -> b1 ([`DEFAULT_CHURN_RATE`] a second: 100,000
//!   in the default 600 s), each a request and an answer.
//!
//! Every [`SAMPLE_EVERY`] each daemon's resident memory and `stats` are sampled.
//! Checked at the end (see [`sample`]): resident memory grows less than 1% after
//! the warm-up, the tables hold no more than their timeouts allow, cumulative
//! counters never go back, the layers' counters agree with each other, and the
//! traffic itself was clean (every transfer intact, no churn connection failed,
//! under 1% of datagrams and pings lost).
//!
//! Run it with `scripts/soak.sh` (`soak --help`).

pub mod load;
pub mod sample;

use crate::bench::signals;
use crate::guest::Guest;
use crate::standard::{self, A1, A2, B1, B2};
use crate::xfer::transfer;
use crate::{Error, Rack, Result};
use load::Close;
use sample::Sample;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

pub const USAGE: &str = "\
usage: soak [--seconds N] [--churn-rate N] [--churn-close fin|rst] [--out FILE]

  --seconds N       how long the traffic runs (default 600)
  --churn-rate N    short TCP connections a second (default 167: 100,000 in 600 s)
  --churn-close C   how they end: fin (default; TIME_WAIT, 120 s in the firewall)
                    or rst (reset by the client; closed at once): a run shorter than
                    TIME_WAIT reaches steady tables only with rst
  --out FILE        where to write the results as JSON (default: none)

Needs root. Builds the standard two-sled rack in network namespaces with the
overlayd/xdeadm named by OVERLAYD_BIN/XDEADM_BIN (scripts/soak.sh sets them).";

pub const DEFAULT_SECONDS: u64 = 600;
pub const DEFAULT_CHURN_RATE: u64 = 167;
pub const SAMPLE_EVERY: Duration = Duration::from_secs(2);
pub const UDP_PPS: u64 = 2000;
/// Bytes of each bulk transfer: long enough to be bulk, short enough that the
/// last one does not overrun the end by much.
const BULK_BYTES: u64 = 256 << 20;
/// Most datagrams and pings that may be lost, as a fraction.
const MAX_LOSS: f64 = 0.01;
const CHURN_PORT: u16 = 7100;
const UDP_PORT: u16 = 7200;

/// What the command line asks for.
#[derive(Clone, Debug, PartialEq)]
pub enum Parsed {
    Run(Options),
    Help,
    /// A workload inside a guest (see [`load`]).
    Workload(Vec<String>),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    pub seconds: u64,
    pub churn_rate: u64,
    pub churn_close: Close,
    pub out: Option<PathBuf>,
}

impl Options {
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Parsed> {
        let args: Vec<String> = args.into_iter().collect();
        if args.first().is_some_and(|a| !a.starts_with('-')) {
            return Ok(Parsed::Workload(args));
        }
        let mut o = Options {
            seconds: DEFAULT_SECONDS,
            churn_rate: DEFAULT_CHURN_RATE,
            churn_close: Close::Fin,
            out: None,
        };
        let mut it = args.into_iter();
        while let Some(flag) = it.next() {
            let mut value = || {
                it.next()
                    .ok_or_else(|| Error::new(format!("{flag} needs a value")))
            };
            let number = |v: String| {
                v.parse::<u64>()
                    .map_err(|_| Error::new(format!("{flag} {v:?} is not a whole number")))
            };
            match flag.as_str() {
                "--seconds" => o.seconds = number(value()?)?,
                "--churn-rate" => o.churn_rate = number(value()?)?,
                "--churn-close" => o.churn_close = Close::parse(&value()?)?,
                "--out" => o.out = Some(PathBuf::from(value()?)),
                "-h" | "--help" => return Ok(Parsed::Help),
                _ => return Err(Error::new(format!("unknown option {flag:?}"))),
            }
        }
        if o.seconds < 50 {
            return Err(Error::new(format!(
                "--seconds {} is too short for the 35 s warm-up and samples after it (at least 50)",
                o.seconds
            )));
        }
        Ok(Parsed::Run(o))
    }

    /// The first quarter of the run, at least 35 s: the tables fill and the
    /// allocator settles. (In a run of 600 s, 150 s: past the longest idle
    /// timeout, 120 s, so the tables are at their steady size. In a short run, past
    /// the first refresh of the underlay next hops at 30 s, whose one-time buffers
    /// raise resident memory by a step of about 450 KiB, 1% of the daemon.)
    pub fn warmup(&self) -> Duration {
        Duration::from_secs((self.seconds / 4).max(35))
    }
}

/// The soak's results.
#[derive(Debug)]
pub struct Outcome {
    pub json: Value,
    pub failures: Vec<String>,
}

/// Runs the soak.
pub fn run(opts: &Options) -> Result<Outcome> {
    crate::require_root()?;
    signals::install()?;
    crate::bins::bins()?;
    let rack = standard::rack("sk", &[])?;
    let exe = std::env::current_exe()?;
    let xfer_bin = exe.with_file_name("e2e-xfer");
    let started = Instant::now();
    let deadline = started + Duration::from_secs(opts.seconds);
    // Set when the run fails early, so the bulk threads do not go on to the end.
    let stop = AtomicBool::new(false);
    let (samples, traffic) = std::thread::scope(|s| -> Result<_> {
        let bulk = [
            s.spawn(|| bulk(&xfer_bin, &rack, (A1, B1), false, deadline, &stop)),
            s.spawn(|| bulk(&xfer_bin, &rack, (B2, A1), true, deadline, &stop)),
        ];
        let run = || -> Result<_> {
            let workloads = Workloads::start(&rack, &exe, opts)?;
            let samples = sample_until(&rack, started, deadline)?;
            Ok((samples, workloads.finish()?))
        };
        let result = run();
        stop.store(result.is_err(), Ordering::Relaxed);
        let (samples, mut traffic) = result?;
        for b in bulk {
            traffic.push(
                b.join()
                    .map_err(|_| Error::new("a bulk transfer thread panicked"))?,
            );
        }
        Ok((samples, traffic))
    })?;
    // Whatever was in flight has arrived: the final samples are of a quiet rack.
    std::thread::sleep(SAMPLE_EVERY);
    let last = sample_now(&rack, started)?;
    let outcome = check(opts, samples, last, traffic);
    // The daemons' logs are there to find out why a run failed: a passing run ends
    // without them (dropped, the rack prints them, as it does when a step fails).
    if outcome.failures.is_empty() {
        rack.teardown_quietly();
    }
    Ok(outcome)
}

/// Samples every sled every [`SAMPLE_EVERY`] until `deadline`; one series per sled.
fn sample_until(rack: &Rack, started: Instant, deadline: Instant) -> Result<Vec<Vec<Sample>>> {
    let mut series = vec![Vec::new(); rack.sleds.len()];
    let mut next = started;
    while next <= deadline {
        signals::check()?;
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        for (i, s) in sample_now(rack, started)?.into_iter().enumerate() {
            series[i].push(s);
        }
        next += SAMPLE_EVERY;
    }
    Ok(series)
}

fn sample_now(rack: &Rack, started: Instant) -> Result<Vec<Sample>> {
    rack.sleds
        .iter()
        .map(|sled| {
            let pid = sled
                .daemon()?
                .pid()
                .ok_or_else(|| Error::new(format!("sled {}: overlayd is gone", sled.index)))?;
            Ok(Sample {
                at: started.elapsed(),
                rss_kib: sample::rss_kib(pid)?,
                counters: crate::counters::Snapshot::take(sled)?,
            })
        })
        .collect()
}

/// One workload's result: its name, what it counted, and what went wrong.
#[derive(Debug)]
pub struct Traffic {
    pub name: String,
    pub counts: Value,
    pub failure: Option<String>,
}

/// Checked transfers from `pair.0` to `pair.1` (over IPv6 when `v6`) one after
/// the other until `deadline` (or `stop`).
fn bulk(
    xfer_bin: &Path,
    rack: &Rack,
    pair: (&str, &str),
    v6: bool,
    deadline: Instant,
    stop: &AtomicBool,
) -> Traffic {
    let name = format!(
        "bulk {} -> {} {}",
        pair.0,
        pair.1,
        if v6 { "IPv6" } else { "IPv4" }
    );
    let mut done = 0u64;
    let result = (|| -> Result<()> {
        let (from, to) = (rack.guest(pair.0)?, rack.guest(pair.1)?);
        let ip = if v6 { to.ipv6()? } else { to.ipv4()? };
        let port = 5500 + u16::from(v6);
        while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
            signals::check()?;
            transfer(
                xfer_bin,
                from,
                to,
                ip,
                port,
                BULK_BYTES,
                Duration::from_secs(300),
            )?;
            done += 1;
        }
        Ok(())
    })();
    Traffic {
        name,
        counts: json!({ "transfers": done, "bytes": done * BULK_BYTES }),
        failure: result
            .err()
            .map(|e| format!("transfer {} failed: {e}", done + 1)),
    }
}

/// The workloads that run as processes inside the guests.
struct Workloads {
    procs: Vec<(String, String, Child)>,
}

impl Workloads {
    fn start(rack: &Rack, exe: &Path, opts: &Options) -> Result<Workloads> {
        let secs = opts.seconds.to_string();
        // Sinks outlast the sources by a few seconds, so nothing in flight is lost.
        let sink_secs = (opts.seconds + 5).to_string();
        let (a1, a2, b1, b2) = (
            rack.guest(A1)?,
            rack.guest(A2)?,
            rack.guest(B1)?,
            rack.guest(B2)?,
        );
        let churn_to = format!("{}:{CHURN_PORT}", b1.ipv4()?);
        let udp_to = format!("[{}]:{UDP_PORT}", a1.ipv6()?);
        let me = exe.display().to_string();
        let close = opts.churn_close.name();
        let mut w = Workloads { procs: Vec::new() };
        w.spawn(
            "churn server",
            b1,
            &me,
            &[
                "churn-server",
                &format!("0.0.0.0:{CHURN_PORT}"),
                &sink_secs,
                close,
            ],
        )?;
        w.spawn(
            "udp sink",
            a1,
            &me,
            &["udp-sink", &format!("[::]:{UDP_PORT}"), &sink_secs],
        )?;
        // Let the listeners bind before anything is sent to them.
        std::thread::sleep(Duration::from_millis(500));
        w.spawn(
            "churn",
            a2,
            &me,
            &[
                "churn-client",
                &churn_to,
                &opts.churn_rate.to_string(),
                &secs,
                close,
            ],
        )?;
        w.spawn(
            "udp",
            b2,
            &me,
            &["udp-source", &udp_to, &UDP_PPS.to_string(), &secs],
        )?;
        w.spawn(
            "ping",
            a2,
            "ping",
            &[
                "-q",
                "-n",
                "-i",
                "0.1",
                "-w",
                &secs,
                &b1.ipv4()?.to_string(),
            ],
        )?;
        Ok(w)
    }

    fn spawn(&mut self, name: &str, guest: &Guest, program: &str, args: &[&str]) -> Result<()> {
        let cmd = guest
            .cmd(program)
            .args(args.iter().copied())
            .die_with_parent();
        let child = cmd.spawn_with(Stdio::piped(), Stdio::piped())?;
        self.procs.push((name.to_string(), cmd.display(), child));
        Ok(())
    }

    /// Waits for every workload and reads what it counted.
    fn finish(self) -> Result<Vec<Traffic>> {
        let mut out = std::collections::BTreeMap::new();
        for (name, line, child) in self.procs {
            let o = child.wait_with_output()?;
            let stdout = String::from_utf8_lossy(&o.stdout).trim().to_string();
            if !o.status.success() {
                return Err(Error::new(format!(
                    "`{line}` failed ({}): {}",
                    o.status,
                    String::from_utf8_lossy(&o.stderr).trim()
                )));
            }
            out.insert(name, stdout);
        }
        let get = |name: &str| out.get(name).cloned().unwrap_or_default();
        Ok(vec![
            churn(&get("churn"), &get("churn server"))?,
            udp(&get("udp"), &get("udp sink"))?,
            ping(&get("ping"))?,
        ])
    }
}

fn churn(client: &str, server: &str) -> Result<Traffic> {
    let (opened, failed) = (
        load::field(client, "opened")?,
        load::field(client, "failed")?,
    );
    let served = load::field(server, "served")?;
    Ok(Traffic {
        name: "churn".into(),
        counts: json!({ "opened": opened, "failed": failed, "served": served }),
        failure: (failed > 0 || served != opened)
            .then(|| format!("churn: {opened} connections completed, {failed} failed, the server answered {served}")),
    })
}

fn udp(source: &str, sink: &str) -> Result<Traffic> {
    let (sent, received) = (load::field(source, "sent")?, load::field(sink, "received")?);
    Ok(lossy("udp", sent, received))
}

/// From `ping -q`: `N packets transmitted, M received, ...`.
fn ping(summary: &str) -> Result<Traffic> {
    let (sent, received) = crate::guest::ping_counts(summary)?;
    Ok(lossy("ping", sent, received))
}

/// A workload whose loss must stay under [`MAX_LOSS`].
fn lossy(name: &str, sent: u64, received: u64) -> Traffic {
    let loss = 1.0 - received as f64 / sent.max(1) as f64;
    Traffic {
        name: name.into(),
        counts: json!({ "sent": sent, "received": received, "loss": loss }),
        failure: (sent == 0 || loss > MAX_LOSS || received > sent).then(|| {
            format!(
                "{name}: {received} of {sent} arrived ({:.2}% lost, at most {:.0}% may be)",
                loss * 100.0,
                MAX_LOSS * 100.0
            )
        }),
    }
}

/// Every check over the samples and the traffic; the results as JSON.
fn check(
    opts: &Options,
    series: Vec<Vec<Sample>>,
    last: Vec<Sample>,
    traffic: Vec<Traffic>,
) -> Outcome {
    let mut failures: Vec<String> = traffic.iter().filter_map(|t| t.failure.clone()).collect();
    let mut sleds = Vec::new();
    for (i, (samples, end)) in series.into_iter().zip(last).enumerate() {
        let label = format!("sled {i}");
        let growth = sample::rss_growth(&samples, opts.warmup());
        match growth {
            Some(g) if g >= sample::MAX_RSS_GROWTH => failures.push(format!(
                "{label}: resident memory grew {:.2}% after the warm-up (at most {:.0}%)",
                g * 100.0,
                sample::MAX_RSS_GROWTH * 100.0
            )),
            None => failures.push(format!("{label}: too few samples to judge memory growth")),
            Some(_) => {}
        }
        failures.extend(sample::tables_bounded(&label, &samples));
        let mut all = samples;
        all.push(end.clone());
        failures.extend(sample::monotonic(&label, &all));
        failures.extend(sample::conservation(&label, &end.counters));
        sleds.push(sled_json(&all, growth, &end));
    }
    let json = json!({
        "seconds": opts.seconds,
        "churn_rate": opts.churn_rate,
        "churn_close": opts.churn_close.name(),
        "warmup_seconds": opts.warmup().as_secs(),
        "sample_every_seconds": SAMPLE_EVERY.as_secs(),
        "sleds": sleds,
        "traffic": traffic.iter().map(|t| json!({ "name": t.name, "counts": t.counts, "ok": t.failure.is_none() })).collect::<Vec<_>>(),
        "failures": failures,
    });
    Outcome { json, failures }
}

/// One sled's series in the results: memory over time, the largest tables, growth.
fn sled_json(samples: &[Sample], growth: Option<f64>, end: &Sample) -> Value {
    let largest = |table: &dyn Fn(&str) -> bool| -> u64 {
        samples
            .iter()
            .flat_map(|s| {
                s.counters
                    .counters
                    .iter()
                    .filter(|(p, _)| table(p))
                    .map(|(_, n)| *n)
            })
            .max()
            .unwrap_or(0)
    };
    json!({
        "rss_kib": samples.iter().map(|s| json!([s.at.as_secs(), s.rss_kib])).collect::<Vec<_>>(),
        "rss_growth_after_warmup": growth,
        "max_firewall_flows": largest(&|p| p.ends_with(".firewall.flows")),
        "max_uft_entries": largest(&|p| p.contains(".uft_") && p.ends_with(".entries")),
        "firewall_flows_created": end.counters.sum(&["flows_created"]),
        "drops": end.counters.drops(),
    })
}

/// The results in a few lines for a person.
pub fn summary(o: &Outcome) -> String {
    let mut lines = vec![format!(
        "soak: {} s, churn {} connections/s closed by {}, warm-up {} s",
        o.json["seconds"], o.json["churn_rate"], o.json["churn_close"], o.json["warmup_seconds"]
    )];
    for (i, s) in o.json["sleds"].as_array().into_iter().flatten().enumerate() {
        let rss = s["rss_kib"]
            .as_array()
            .and_then(|a| a.last())
            .map(|v| v[1].clone())
            .unwrap_or_default();
        lines.push(format!(
            "  sled {i}: RSS {rss} KiB at the end, growth after warm-up {:.3}%, max firewall flows {}, max flow-table entries {}",
            s["rss_growth_after_warmup"].as_f64().unwrap_or(f64::NAN) * 100.0,
            s["max_firewall_flows"],
            s["max_uft_entries"]
        ));
    }
    for t in o.json["traffic"].as_array().into_iter().flatten() {
        lines.push(format!(
            "  {}: {} {}",
            t["name"].as_str().unwrap_or("?"),
            t["counts"],
            if t["ok"] == true { "ok" } else { "FAILED" }
        ));
    }
    lines.extend(o.failures.iter().map(|f| format!("  FAIL {f}")));
    lines.push(format!(
        "soak: {}",
        if o.failures.is_empty() {
            "passed"
        } else {
            "FAILED"
        }
    ));
    lines.join("\n")
}

/// Runs the command line's workload (inside a guest) and prints its line.
pub fn workload(args: &[String]) -> Result<()> {
    println!("{}", load::run(args)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Parsed> {
        Options::parse(args.iter().map(std::string::ToString::to_string))
    }

    #[test]
    fn options_defaults_values_and_errors() {
        let Parsed::Run(o) = parse(&[]).unwrap() else {
            panic!()
        };
        assert_eq!(o.warmup(), Duration::from_secs(150));
        assert_eq!(
            (o.seconds, o.churn_rate, o.churn_close, o.out),
            (600, 167, Close::Fin, None)
        );
        let Parsed::Run(o) = parse(&["--seconds", "60", "--out", "x.json"]).unwrap() else {
            panic!()
        };
        assert_eq!(
            (o.seconds, o.warmup().as_secs(), o.out),
            (60, 35, Some(PathBuf::from("x.json")))
        );
        assert_eq!(parse(&["--help"]).unwrap(), Parsed::Help);
        assert!(matches!(
            parse(&["churn-client", "x"]).unwrap(),
            Parsed::Workload(_)
        ));
        assert!(parse(&["--seconds"])
            .unwrap_err()
            .0
            .contains("--seconds needs a value"));
        assert!(parse(&["--seconds", "ten"])
            .unwrap_err()
            .0
            .contains("\"ten\""));
        assert!(parse(&["--seconds", "5"])
            .unwrap_err()
            .0
            .contains("too short"));
        assert!(parse(&["--bogus"]).unwrap_err().0.contains("--bogus"));
        let Parsed::Run(o) = parse(&["--churn-close", "rst"]).unwrap() else {
            panic!()
        };
        assert_eq!(o.churn_close, Close::Rst);
        assert!(parse(&["--churn-close", "x"]).is_err());
    }

    #[test]
    fn ping_summaries_and_losses() {
        let t = ping("--- 10.0.0.13 ping statistics ---\n600 packets transmitted, 598 received, 0.333% packet loss, time 59s\n").unwrap();
        assert_eq!(t.counts["received"], 598);
        assert!(t.failure.is_none());
        assert!(ping("600 packets transmitted, 500 received")
            .unwrap()
            .failure
            .unwrap()
            .contains("500 of 600"));
        assert!(ping("nothing").is_err());
        assert!(lossy("udp", 0, 0).failure.is_some());
    }

    #[test]
    fn churn_fails_on_any_failed_or_unanswered_connection() {
        assert!(churn("opened=10 failed=0", "served=10")
            .unwrap()
            .failure
            .is_none());
        assert!(churn("opened=10 failed=1", "served=10")
            .unwrap()
            .failure
            .is_some());
        assert!(churn("opened=10 failed=0", "served=9")
            .unwrap()
            .failure
            .is_some());
    }
}
