//! Operating the daemon: `xdeadm doctor` on a healthy sled and on one whose
//! underlay MTU no longer fits its port, `xdeadm path-check` (and the periodic
//! check) finding a switch port left at 1500, and the systemd readiness protocol
//! with the JSON log.

use e2e::rack::{Rack, RackSpec, Sled, UNDERLAY_IF};
use e2e::standard::A1;
use e2e::{poll_until, Error, GuestSpec, Result};
use serde_json::Value;
use std::os::unix::net::UnixDatagram;
use std::time::Duration;

/// How long the daemon may take to notice a change and act on it.
const NOTICE: Duration = Duration::from_secs(15);

fn json(what: &str, out: &str) -> Result<Value> {
    serde_json::from_str(out).map_err(|e| Error::new(format!("{what} is not JSON ({e}): {out}")))
}

/// `xdeadm --json doctor`: its exit code and the checks by name.
fn doctor(sled: &Sled) -> Result<(Option<i32>, Value)> {
    let o = sled.xdeadm(&["--json", "doctor"])?.output()?;
    let v = json("doctor", &o.stdout)?;
    let checks = v["data"].as_array().cloned().unwrap_or_default();
    let by_name = checks
        .into_iter()
        .filter_map(|c| Some((c["name"].as_str()?.to_string(), c)))
        .collect::<serde_json::Map<_, _>>();
    Ok((o.status.code(), Value::Object(by_name)))
}

/// A healthy sled passes the MTU check and serves its port; with its underlay
/// lowered below the port MTU + 78 the check fails with the fix, and doctor
/// exits 1.
#[test]
fn doctor_passes_a_healthy_mtu_and_flags_a_lowered_one() -> Result<()> {
    let mut rack = Rack::build(&RackSpec::new("doc", 1))?;
    // A pinned worker: the core checks read this host's /proc.
    rack.start_daemon(0, &["--cores", "1"])?;
    rack.add_guest(GuestSpec::dual(A1, 0, 1))?;
    let sled = rack.sled(0)?;
    let (_, checks) = doctor(sled)?;
    assert_eq!(checks["underlay-mtu"]["status"], "pass", "{checks:#}");
    assert_eq!(
        checks[&format!("port-tap:{A1}")]["status"],
        "pass",
        "{checks:#}"
    );
    assert_eq!(
        checks[&format!("port-mtu:{A1}")]["status"],
        "pass",
        "{checks:#}"
    );
    assert_eq!(checks["xdp-mode"]["status"], "pass", "{checks:#}");
    // This kernel (6.18) takes UDP-tunnel GSO on taps: the default `auto` uses it.
    let tx_path = &checks["underlay-tx-path:ul0"];
    assert_eq!(tx_path["status"], "pass", "{checks:#}");
    assert!(
        tx_path["detail"]
            .as_str()
            .is_some_and(|d| d.contains("tunnel GSO") && d.contains("gso-ul0")),
        "{checks:#}"
    );
    for host_check in ["offloads:ul0", "worker-core:1", "af-xdp-mode"] {
        assert!(
            checks[host_check]["status"].is_string(),
            "{host_check}: {checks:#}"
        );
    }

    sled.ns.ip(&["link", "set", UNDERLAY_IF, "mtu", "8000"])?;
    let (code, checks) = poll_until("doctor to see underlay MTU 8000", NOTICE, || {
        let (code, checks) = doctor(sled)?;
        if checks["underlay-mtu"]["status"] == "fail" {
            Ok((code, checks))
        } else {
            Err(Error::new(format!("{checks:#}")))
        }
    })?;
    let mtu = &checks["underlay-mtu"];
    assert!(
        mtu["detail"]
            .as_str()
            .unwrap_or("")
            .contains("a1 (MTU 8500 needs 8578)"),
        "{mtu:#}"
    );
    assert!(
        mtu["fix"].as_str().unwrap_or("").contains("mtu 9000"),
        "{mtu:#}"
    );
    assert_eq!(code, Some(1), "a failed check makes doctor exit 1");
    let text = sled.xdeadm(&["doctor"])?.output()?.stdout;
    assert!(
        text.lines().any(|l| l.starts_with("FAIL  underlay-mtu")),
        "{text}"
    );
    rack.teardown_quietly();
    Ok(())
}

/// Peers (underlay addresses) with the largest size that made the round trip.
type Largest = Vec<(String, Value)>;

/// `xdeadm --json path-check [ADDR]`: exit code and the largest size per peer.
fn path_check(sled: &Sled, peer: Option<&str>) -> Result<(Option<i32>, Largest)> {
    let mut args = vec!["--json", "path-check"];
    args.extend(peer);
    let o = sled.xdeadm(&args)?.output()?;
    let v = json("path-check", &o.stdout)?;
    let peers = v["data"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|p| {
            (
                p["peer"].as_str().unwrap_or("?").to_string(),
                p["largest"].clone(),
            )
        })
        .collect();
    Ok((o.status.code(), peers))
}

/// A 1500-byte port carries 1500-byte IPv6 packets, and on veth up to 4 bytes
/// more (the kernel leaves room for a VLAN tag when it forwards to a device).
fn about_1500(largest: &Value) -> bool {
    largest.as_u64().is_some_and(|l| (1500..=1504).contains(&l))
}

/// Three sleds; the switch port toward sled 2 is lowered to 1500 (a jumbo
/// rollout that missed one port). From sled 0, path-check finds 9000 to sled 1
/// and 1500 to sled 2, for every V2P peer or one named; the periodic check
/// counts the failure and logs it once.
#[test]
fn path_check_finds_a_1500_byte_switch_port() -> Result<()> {
    let mut rack = Rack::build(&RackSpec::new("pmtu", 3))?;
    let bad = rack.sled(2)?;
    rack.switch
        .ip(&["link", "set", &bad.bridge_port, "mtu", "1500"])?;
    let (good_addr, bad_addr) = (rack.sled(1)?.addr.to_string(), bad.addr.to_string());
    rack.start_daemon(0, &["--path-check-interval", "1"])?;
    let sled = rack.sled(0)?;
    for (i, peer) in [&good_addr, &bad_addr].into_iter().enumerate() {
        sled.admin(&[
            "set-v2p",
            &format!("10.0.0.{}", 20 + i),
            &format!("a8:40:25:ff:00:{:02x}", 20 + i),
            peer,
            "10",
        ])?;
    }

    let (code, peers) = path_check(sled, None)?;
    let (good, bad) = (&peers[0], &peers[1]);
    assert_eq!(good, &(good_addr.clone(), Value::from(9000)), "{peers:?}");
    assert_eq!(bad.0, bad_addr, "{peers:?}");
    assert!(about_1500(&bad.1), "{peers:?}");
    assert_eq!(
        code,
        Some(1),
        "a path short of the MTU makes path-check exit 1"
    );
    let (code, peers) = path_check(sled, Some(&good_addr))?;
    assert_eq!(peers, [(good_addr.clone(), Value::from(9000))]);
    assert_eq!(code, Some(0));
    let o = sled.xdeadm(&["path-check", &bad_addr])?.output()?;
    assert_eq!(o.status.code(), Some(1));
    assert!(
        o.stdout.contains(" 150") && o.stdout.contains("FAIL"),
        "{}",
        o.stdout
    );

    // doctor probes the V2P peers too.
    let (code, checks) = doctor(sled)?;
    let paths = &checks["underlay-paths"];
    assert_eq!(paths["status"], "fail", "{checks:#}");
    assert!(
        paths["detail"].as_str().unwrap_or("").contains(&bad_addr)
            && !paths["detail"].as_str().unwrap_or("").contains(&good_addr),
        "{paths:#}"
    );
    assert_eq!(code, Some(1));

    // The periodic check: counted in stats, logged once however many runs.
    let failures = poll_until(
        "the periodic path check to count sled 2",
        2 * NOTICE,
        || {
            let v = json("stats", &sled.admin(&["--json", "stats"])?)?;
            let pc = &v["data"]["control"]["path_check"];
            match pc["path_check_failures"].as_u64() {
                Some(n) if n >= 2 => Ok(pc.clone()),
                _ => Err(Error::new(format!("path_check: {pc}"))),
            }
        },
    )?;
    assert!(
        about_1500(&failures["peers"][&bad_addr]["largest"]),
        "{failures:#}"
    );
    let log = sled.daemon()?.log();
    let warnings = log
        .lines()
        .filter(|l| l.contains("does not carry full-size frames"))
        .count();
    assert_eq!(warnings, 1, "logged once per change:\n{log}");
    rack.teardown_quietly();
    Ok(())
}

/// With `NOTIFY_SOCKET` pointing at a datagram socket the test binds (as systemd
/// does for `Type=notify`), the daemon says `READY=1` by the time its API
/// answers, `WATCHDOG=1` while it runs and `STOPPING=1` on SIGTERM; `--log-format json` makes every log line
/// a JSON object.
#[test]
fn systemd_hears_ready_and_stopping() -> Result<()> {
    let mut rack = Rack::build(&RackSpec::new("sdn", 1))?;
    let path = rack.dir().join("notify.sock");
    let notify = UnixDatagram::bind(&path)?;
    notify.set_read_timeout(Some(NOTICE))?;
    let path = path.display().to_string();
    // A 200 ms watchdog: pinged every 100 ms.
    let env = [
        ("NOTIFY_SOCKET", path.as_str()),
        ("WATCHDOG_USEC", "200000"),
    ];
    rack.start_daemon_with_env(0, &["--log-format", "json"], &env)?;
    let mut buf = [0u8; 256];
    let n = notify.recv(&mut buf)?;
    assert_eq!(
        &buf[..n],
        b"READY=1",
        "READY=1 first, by the time the API answers"
    );
    std::thread::sleep(Duration::from_millis(500));
    let log = rack.sled(0)?.daemon()?.log();
    rack.stop_daemon(0)?;
    let mut pings = 0;
    let last = loop {
        let n = notify.recv(&mut buf)?;
        match &buf[..n] {
            b"WATCHDOG=1" => pings += 1,
            other => break String::from_utf8_lossy(other).into_owned(),
        }
    };
    assert_eq!(last, "STOPPING=1");
    assert!(pings >= 2, "{pings} watchdog pings in 500 ms");
    assert!(!log.is_empty());
    for line in log.lines() {
        let v = json("log line", line)?;
        assert!(v["level"].is_string() && v["fields"].is_object(), "{line}");
    }
    rack.teardown_quietly();
    Ok(())
}
