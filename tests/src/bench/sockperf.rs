//! The latency tests' tool: sockperf (Debian's 3.7) in UDP ping-pong between the
//! guest namespaces, `sockperf server` in the server guest and `sockperf
//! ping-pong` in the client guest, which sends one message, waits for its echo,
//! sends the next, and reports percentiles of the round trips it timed.
//!
//! sockperf reports half the round trip ("latency", RTT/2) unless asked for
//! `--full-rtt`; the client always asks, so every figure here is a full round trip,
//! and [`parse_summary`] refuses a report that is not one. sockperf 3.7 parses
//! IPv4 addresses only (IPv6 came in 3.8), so the latency tests are IPv4 tests.

use crate::{Error, Result};
use std::time::Duration;

/// sockperf's default port; one run at a time, so one port.
pub const PORT: &str = "11111";

/// The client's pause after opening its socket: a fixed `sleep(2)` before it
/// prints "Starting test..." and starts its `-t` timer, sending nothing.
const PAUSE: Duration = Duration::from_secs(2);
/// What it leaves out of its figures after starting its timer
/// (`TEST_START_WARMUP_MSEC`): where the first exchange's neighbour and flow
/// set-up fall.
const START_LEFT_OUT: Duration = Duration::from_millis(400);
/// What it leaves out at the end (`TEST_END_COOLDOWN_MSEC`).
const END_LEFT_OUT: Duration = Duration::from_millis(50);

/// How long after the client starts its figures start.
pub const WARM_UP: Duration = PAUSE.saturating_add(START_LEFT_OUT);

/// The time a run of `-t seconds` measures: 3.7's timer runs `-t` whole seconds
/// (it drops a fraction), less what it leaves out at either end.
pub fn measured(seconds: u32) -> Duration {
    Duration::from_secs(u64::from(seconds)).saturating_sub(START_LEFT_OUT + END_LEFT_OUT)
}

/// The client's arguments for `seconds` of ping-pong with `payload`-byte UDP
/// messages to `addr` (the server's).
pub fn client_args(addr: &str, payload: u32, seconds: u32) -> Vec<String> {
    [
        "ping-pong",
        "-i",
        addr,
        "-p",
        PORT,
        "--msg-size",
        &payload.to_string(),
        "-t",
        &seconds.to_string(),
        "--full-rtt",
    ]
    .map(String::from)
    .to_vec()
}

/// The server's arguments: it echoes every message to its sender until stopped.
pub fn server_args(addr: &str) -> Vec<String> {
    ["server", "-i", addr, "-p", PORT]
        .map(String::from)
        .to_vec()
}

/// The round trips of one run: percentiles in microseconds, and their rate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Latency {
    pub p50_us: f64,
    pub p99_us: f64,
    pub p99_9_us: f64,
    /// Round trips completed per second of the measured window (one message is
    /// in flight at a time, so this is about 1 / the mean round trip).
    pub round_trips_per_s: f64,
}

/// The figures of a client's report (its stdout):
///
/// ```text
/// sockperf: [Valid Duration] RunTime=1.550 sec; SentMessages=28682; ReceivedMessages=28682
/// sockperf: Summary: Round trip is 54.005 usec
/// sockperf: ---> percentile 99.900 =  163.902
/// sockperf: ---> percentile 99.000 =   87.589
/// sockperf: ---> percentile 50.000 =   50.044
/// ```
///
/// sockperf colours some lines with escape sequences, so lines are matched by
/// what they contain, not where they start.
pub fn parse_summary(out: &str) -> Result<Latency> {
    if out.contains("No valid observations found") {
        return Err(Error::new(
            "sockperf: no valid observations (no echo came back)",
        ));
    }
    let summary = out
        .lines()
        .find_map(|l| l.split_once("Summary: ").map(|(_, s)| s))
        .ok_or_else(|| Error::new("sockperf printed no summary"))?;
    if !summary.starts_with("Round trip is") {
        return Err(Error::new(format!(
            "sockperf's summary is not a round trip (--full-rtt missing?): {summary:?}"
        )));
    }
    let percentile = |want: f64| {
        out.lines()
            .filter_map(|l| l.split_once("---> percentile ").map(|(_, s)| s))
            .filter_map(|s| s.split_once('='))
            .find(|(p, _)| {
                p.trim()
                    .parse::<f64>()
                    .is_ok_and(|p| (p - want).abs() < 1e-6)
            })
            .and_then(|(_, v)| v.trim().parse::<f64>().ok())
            .ok_or_else(|| Error::new(format!("sockperf printed no percentile {want:.3}")))
    };
    let valid = out
        .lines()
        .find_map(|l| l.split_once("[Valid Duration] ").map(|(_, s)| s))
        .ok_or_else(|| Error::new("sockperf printed no [Valid Duration] line"))?;
    let field = |key: &str| {
        valid
            .split(';')
            .filter_map(|kv| kv.trim().split_once('='))
            .find(|(k, _)| *k == key)
            .and_then(|(_, v)| v.trim_end_matches(" sec").parse::<f64>().ok())
            .ok_or_else(|| Error::new(format!("sockperf's [Valid Duration] has no {key}")))
    };
    let seconds = field("RunTime")?;
    let received = field("ReceivedMessages")?;
    Ok(Latency {
        p50_us: percentile(50.0)?,
        p99_us: percentile(99.0)?,
        p99_9_us: percentile(99.9)?,
        round_trips_per_s: received / seconds.max(1e-9),
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A client's stdout, `sockperf ping-pong -i 127.0.0.1 -p 11998 --msg-size 64
    /// -t 2 --full-rtt` (sockperf 3.7, Debian 12), escape sequences and all.
    pub(crate) const SAMPLE: &str = "\
sockperf: \x1b[2;35m== version #3.7-no.git == \x1b[0m
sockperf[CLIENT] send on:sockperf: using recvfrom() to block on socket(s)

[ 0] IP = 127.0.0.1       PORT = 11998 # UDP
sockperf: Warmup stage (sending a few dummy messages)...
sockperf: Starting test...
sockperf: Test end (interrupted by timer)
sockperf: Test ended
sockperf: [Total Run] RunTime=2.001 sec; Warm up time=400 msec; SentMessages=40451; ReceivedMessages=40450
sockperf: ========= Printing statistics for Server No: 0
sockperf: [Valid Duration] RunTime=1.550 sec; SentMessages=28682; ReceivedMessages=28682
sockperf: \x1b[2;35m====> avg-rtt=54.005 (std-dev=31.317)\x1b[0m
sockperf: # dropped messages = 0; # duplicated messages = 0; # out-of-order messages = 0
sockperf: Summary: Round trip is 54.005 usec
sockperf: \x1b[2;35mTotal 28682 observations\x1b[0m; each percentile contains 286.82 observations
sockperf: ---> <MAX> observation = 3200.822
sockperf: ---> percentile 99.999 = 3200.822
sockperf: ---> percentile 99.990 = 1309.029
sockperf: ---> percentile 99.900 =  163.902
sockperf: ---> percentile 99.000 =   87.589
sockperf: ---> percentile 90.000 =   63.554
sockperf: ---> percentile 75.000 =   57.375
sockperf: ---> percentile 50.000 =   50.044
sockperf: ---> percentile 25.000 =   47.610
sockperf: ---> <MIN> observation =   17.706
";

    #[test]
    fn summary_gives_round_trip_percentiles_and_rate() {
        let l = parse_summary(SAMPLE).unwrap();
        assert_eq!(
            l,
            Latency {
                p50_us: 50.044,
                p99_us: 87.589,
                p99_9_us: 163.902,
                round_trips_per_s: 28682.0 / 1.550,
            }
        );
    }

    #[test]
    fn half_round_trips_and_empty_runs_are_refused() {
        let one_way = SAMPLE.replace("Round trip is", "Latency is");
        let e = parse_summary(&one_way).unwrap_err();
        assert!(e.0.contains("not a round trip"), "{e}");
        let e = parse_summary(
            "sockperf: No valid observations found. Try tune parameters: --time/--mps/--reply-every",
        )
        .unwrap_err();
        assert!(e.0.contains("no valid observations"), "{e}");
        let cut: String = SAMPLE
            .lines()
            .filter(|l| !l.contains("percentile 99.900"))
            .collect::<Vec<_>>()
            .join("\n");
        let e = parse_summary(&cut).unwrap_err();
        assert!(e.0.contains("no percentile 99.900"), "{e}");
        let e = parse_summary(&SAMPLE.replace("[Valid Duration]", "[Valid]")).unwrap_err();
        assert!(e.0.contains("[Valid Duration]"), "{e}");
    }

    #[test]
    fn a_run_measures_its_seconds_less_warm_up_and_cool_down() {
        // The sample's `-t 2`: "[Valid Duration] RunTime=1.550 sec".
        assert_eq!(measured(2), Duration::from_millis(1550));
        assert_eq!(measured(5), Duration::from_millis(4550));
    }

    #[test]
    fn client_asks_for_full_round_trips() {
        let args = client_args("10.0.0.12", 64, 5);
        assert_eq!(
            args.join(" "),
            "ping-pong -i 10.0.0.12 -p 11111 --msg-size 64 -t 5 --full-rtt"
        );
        assert_eq!(
            server_args("10.0.0.12").join(" "),
            "server -i 10.0.0.12 -p 11111"
        );
    }
}
