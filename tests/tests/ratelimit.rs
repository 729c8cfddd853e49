//! Per-port rate limits end to end (`set-port-limits`): TCP through a port limited
//! to 100 Mbit/s and to 1 Gbit/s settles within 10% of the limit, in either
//! direction: egress of the sender's port (shaped: the guest waits, counted
//! `egress_throttled`, nothing dropped), ingress of the receiver's (policed: the
//! excess is dropped and counted `rate_limited`). An unlimited neighbour on the
//! same sled and worker keeps its speed while the limited port is saturated.
//!
//! Throughput is iperf3's (TCP, 1 stream, 1 s of warm-up left out, then 4 s), as
//! the receiver counts it.

use e2e::standard::{self, A1, A2, B1};
use e2e::stats;
use e2e::{Guest, Result, Sled};
use serde_json::Value;
use std::net::IpAddr;
use std::process::Stdio;
use std::thread;
use std::time::Duration;

const TOLERANCE: f64 = 0.10;

/// Mbit/s iperf3 measured from `client` to `server` at `ip` on `port` (TCP, 1
/// stream, 1 s omitted, 4 s measured), as received.
fn iperf(client: &Guest, server: &Guest, ip: IpAddr, port: u16) -> Result<f64> {
    iperf_with(client, server, ip, port, &[])
}

/// The same with UDP sent at `mbps`: what the server received.
fn iperf_udp(client: &Guest, server: &Guest, ip: IpAddr, port: u16, mbps: u32) -> Result<f64> {
    let rate = format!("{mbps}M");
    iperf_with(client, server, ip, port, &["-u", "-b", &rate, "-l", "1400"])
}

fn iperf_with(
    client: &Guest,
    server: &Guest,
    ip: IpAddr,
    port: u16,
    extra: &[&str],
) -> Result<f64> {
    let (ip, port) = (ip.to_string(), port.to_string());
    let mut srv = server
        .cmd("iperf3")
        .args(["-s", "-1", "-B", &ip, "-p", &port])
        .spawn_with(Stdio::null(), Stdio::null())?;
    // The server needs a moment to listen: the client is retried until it
    // connects (iperf3 --json reports a refused connection in its output).
    let out = e2e::poll::poll_until("iperf3 to connect", Duration::from_secs(15), || {
        let out = client
            .cmd("iperf3")
            .args(["-c", &ip, "-p", &port, "-t", "4", "-O", "1", "--json"])
            .args(extra.iter().copied())
            .timeout(Duration::from_secs(60))
            .run()?;
        let v: Value = serde_json::from_str(&out)
            .map_err(|e| e2e::Error::new(format!("iperf3 --json: {e}: {out}")))?;
        match v["error"].as_str() {
            Some(e) => Err(e2e::Error::new(format!("iperf3: {e}"))),
            None => Ok(v),
        }
    });
    let _ = srv.kill();
    let _ = srv.wait();
    let v = out?;
    // What the server received (TCP and UDP alike).
    let bps = v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .ok_or_else(|| e2e::Error::new(format!("no received rate in {v}")))?;
    Ok(bps / 1e6)
}

/// Counter `name` of port `port`.
fn counter(sled: &Sled, port: &str, name: &str) -> Result<u64> {
    let c = stats::parse(&sled.admin(&["--json", "stats", port])?)?;
    Ok(stats::sum(&c, name))
}

fn assert_near(what: &str, mbps: f64, limit: f64) {
    let (lo, hi) = (limit * (1.0 - TOLERANCE), limit * (1.0 + TOLERANCE));
    assert!(
        (lo..=hi).contains(&mbps),
        "{what}: {mbps:.1} Mbit/s, outside {lo:.0}-{hi:.0} (limit {limit})"
    );
}

#[test]
fn tcp_settles_at_the_limit_and_the_neighbour_keeps_its_speed() -> Result<()> {
    let rack = standard::rack("rl", &[])?;
    let (a1, a2, b1) = (rack.guest(A1)?, rack.guest(A2)?, rack.guest(B1)?);
    let (sled0, sled1) = (rack.sled(0)?, rack.sled(1)?);
    let to_b1 = b1.ipv4()?;
    // The path works before any limit (and the first flows are set up).
    a1.ping(to_b1, 56, Duration::from_secs(20))?;
    a2.ping(to_b1, 56, Duration::from_secs(20))?;

    // Egress of a1 at 100 Mbit/s, then at 1 Gbit/s.
    for limit in [100u32, 1000] {
        sled0.admin(&["set-port-limits", A1, "--egress-mbps", &limit.to_string()])?;
        let before = counter(sled0, A1, "egress_throttled")?;
        let mbps = iperf(a1, b1, to_b1, 5401)?;
        eprintln!("a1 egress limited to {limit} Mbit/s: {mbps:.1} Mbit/s");
        assert_near("a1 -> b1, a1's egress limited", mbps, f64::from(limit));
        // Shaped: the guest waited, nothing was dropped.
        assert!(
            counter(sled0, A1, "egress_throttled")? > before,
            "a1 never waited"
        );
        assert_eq!(
            counter(sled0, A1, "rate_limited")?,
            0,
            "egress drops nothing"
        );
    }
    let ports: Value = serde_json::from_str(&sled0.admin(&["--json", "list-ports"])?).unwrap();
    let a1_limits = ports["data"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["config"]["name"] == A1))
        .map(|p| p["config"]["limits"].clone());
    assert_eq!(
        a1_limits,
        Some(serde_json::json!({ "egress_mbps": 1000 })),
        "{ports}"
    );

    // Ingress of b1 at 100 Mbit/s, a1's limit lifted.
    sled0.admin(&["set-port-limits", A1])?;
    sled1.admin(&["set-port-limits", B1, "--ingress-mbps", "100"])?;
    let before = counter(sled1, B1, "ingress_throttled")?;
    let mbps = iperf(a1, b1, to_b1, 5402)?;
    eprintln!("b1 ingress limited to 100 Mbit/s: {mbps:.1} Mbit/s");
    assert_near("a1 -> b1, b1's ingress limited", mbps, 100.0);
    // Shaped too: frames waited (held by b1's worker); TCP's fit in the queue.
    assert!(
        counter(sled1, B1, "ingress_throttled")? > before,
        "nothing waited"
    );
    assert_eq!(
        counter(sled1, B1, "rate_limited")?,
        0,
        "a TCP connection lost nothing"
    );
    // A UDP flood at 5 times the limit fills the queue: the excess is dropped and
    // counted, and b1 receives the limit.
    let udp = iperf_udp(a1, b1, to_b1, 5406, 500)?;
    eprintln!("UDP at 500 Mbit/s to b1 limited to 100: {udp:.1} Mbit/s received");
    assert!(
        counter(sled1, B1, "rate_limited")? > 0,
        "no rate_limited drop counted"
    );
    assert_near("UDP at 500 Mbit/s to b1, b1's ingress limited", udp, 100.0);
    sled1.admin(&["set-port-limits", B1])?;

    // a2 (same sled and worker as a1, no limit) alone, then while a1, limited to
    // 100 Mbit/s, sends as fast as it can to b1.
    let alone = iperf(a2, b1, to_b1, 5403)?;
    sled0.admin(&["set-port-limits", A1, "--egress-mbps", "100"])?;
    let (busy, a1_rate) = thread::scope(|s| {
        let a1_run = s.spawn(|| iperf(a1, b1, to_b1, 5404));
        // Starts while a1's run is under way (its 1 s warm-up).
        thread::sleep(Duration::from_millis(1500));
        let a2_run = iperf(a2, b1, to_b1, 5405);
        (a2_run, a1_run.join().expect("a1's iperf3 thread"))
    });
    let (busy, a1_rate) = (busy?, a1_rate?);
    eprintln!(
        "a2 unlimited: {alone:.0} Mbit/s alone, {busy:.0} Mbit/s beside a1 limited ({a1_rate:.1})"
    );
    assert_eq!(
        counter(sled0, A2, "egress_throttled")?,
        0,
        "a2 has no limit"
    );
    // The machine has 2 cores, which the two iperf3 pairs share: a2 keeps most of
    // its speed, and far more than a1's limit.
    assert!(
        busy >= alone * 0.5 && busy >= 5.0 * 100.0,
        "a2 unlimited: {busy:.0} Mbit/s beside a1 limited, {alone:.0} alone"
    );
    Ok(())
}
