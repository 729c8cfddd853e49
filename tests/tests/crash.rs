//! Real faults: the daemon killed outright in the middle of a transfer, and a
//! corrupt state file.
//!
//! - SIGKILL of sled 0's overlayd while a1 sends 2 GiB to b1, then a new daemon on
//!   the same state (what systemd's `Restart=on-failure` does): the transfer
//!   completes with every byte intact, and the outage, from the kill to the first
//!   ping (a2 -> b1, every 5 ms) answered through the new daemon, is under a second.
//!   The figure is printed.
//! - A corrupt `state.json` (cut short, not JSON, the wrong shape, empty): the daemon
//!   refuses to start, its error names the file and what is wrong with it, and the
//!   file is left exactly as it was (bytes and modification time); the good file
//!   put back, the daemon starts and restores it.

use e2e::rack::RackSpec;
use e2e::standard::{self, A1, A2, B1};
use e2e::xfer::transfer;
use e2e::{Error, Rack, Result};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn xfer_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_e2e-xfer"))
}

/// The most the datapath of a sled may be gone when its daemon is killed and
/// restarted at once.
const MAX_OUTAGE: Duration = Duration::from_secs(1);
/// The probe: one echo request every 5 ms for 6 s, the kill 1 s in.
const PROBE_INTERVAL: &str = "0.005";
const PROBE_COUNT: &str = "1200";
const KILL_AFTER: Duration = Duration::from_secs(1);

#[test]
fn sigkilled_daemon_restarts_and_a_transfer_survives_an_outage_under_a_second() -> Result<()> {
    let mut rack = standard::rack("kl", &[])?;
    // The guests are taken out of the rack while its daemon is restarted (which
    // needs the rack itself), and put back afterwards.
    let guests = std::mem::take(&mut rack.guests);
    let guest = |name: &str| {
        guests
            .iter()
            .find(|g| g.spec.name == name)
            .ok_or_else(|| Error::new(format!("no guest {name}")))
    };
    let (a1, a2, b1) = (guest(A1)?, guest(A2)?, guest(B1)?);
    let b1_ip = b1.ipv4()?;
    // The probe path works before anything is killed (and its ARP is resolved).
    a2.ping(b1_ip, 56, Duration::from_secs(20))?;
    let outcome = std::thread::scope(|s| -> Result<_> {
        let xfer = s.spawn(|| {
            transfer(
                xfer_bin(),
                a1,
                b1,
                b1_ip,
                5401,
                2 << 30,
                Duration::from_secs(600),
            )
        });
        wait_for_bytes(&rack, 100 << 20)?;
        let probe = a2
            .cmd("ping")
            .args([
                "-D",
                "-n",
                "-i",
                PROBE_INTERVAL,
                "-c",
                PROBE_COUNT,
                &b1_ip.to_string(),
            ])
            .spawn_with(Stdio::piped(), Stdio::null())?;
        std::thread::sleep(KILL_AFTER);
        let (killed_at, restart) = kill_and_restart(&mut rack)?;
        let out = probe.wait_with_output()?;
        let outage = outage_after(&String::from_utf8_lossy(&out.stdout), b1_ip, killed_at)?;
        let report = xfer
            .join()
            .map_err(|_| Error::new("the transfer thread panicked"))??;
        Ok((report, outage, restart))
    });
    rack.guests = guests;
    let (report, outage, restart) = outcome?;
    eprintln!(
        "SIGKILL of overlayd during a transfer: outage {:.0} ms (kill to the first echo \
         answered through the new daemon), the new daemon answered its API {:.0} ms after \
         the kill; transfer intact: {report:?}",
        outage.as_secs_f64() * 1e3,
        restart.as_secs_f64() * 1e3
    );
    assert!(
        outage < MAX_OUTAGE,
        "outage {outage:?} is not under {MAX_OUTAGE:?}"
    );
    Ok(())
}

/// Waits until a1's port has sent `bytes`: the transfer is in full flow.
fn wait_for_bytes(rack: &Rack, bytes: u64) -> Result<()> {
    let sled = rack.sled(0)?;
    e2e::poll_until(
        "the transfer to be flowing",
        Duration::from_secs(30),
        || {
            let s = e2e::counters::Snapshot::take(sled)?;
            let sent = s.get(&format!("engine.ports.{A1}.out_bytes"));
            if sent >= bytes {
                Ok(())
            } else {
                Err(Error::new(format!("a1 sent {sent} bytes")))
            }
        },
    )
}

/// SIGKILLs sled 0's daemon and starts a new one on the same state at once.
/// Returns when the kill was sent and how long until the new daemon answered.
fn kill_and_restart(rack: &mut Rack) -> Result<(SystemTime, Duration)> {
    let killed_at = SystemTime::now();
    let started = Instant::now();
    rack.kill_daemon(0)?;
    rack.start_daemon(0, &[])?;
    Ok((killed_at, started.elapsed()))
}

/// From `ping -D` output: the time from `killed_at` to the first reply whose
/// request was sent after it (reply time minus its round trip), i.e. the first
/// packet that crossed the new daemon both ways.
fn outage_after(ping: &str, target: IpAddr, killed_at: SystemTime) -> Result<Duration> {
    let kill = killed_at
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    let from = format!("bytes from {target}:");
    ping.lines()
        .filter(|l| l.contains(&from))
        .filter_map(|l| {
            let at: f64 = l.strip_prefix('[')?.split(']').next()?.parse().ok()?;
            let rtt_ms: f64 = l
                .split("time=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()?;
            Some((at, at - rtt_ms / 1e3))
        })
        .find(|&(_, sent)| sent > kill)
        .map(|(at, _)| Duration::from_secs_f64((at - kill).max(0.0)))
        .ok_or_else(|| {
            Error::new(format!(
                "no echo sent after the kill was answered; ping printed:\n{}",
                ping.lines().rev().take(5).collect::<Vec<_>>().join("\n")
            ))
        })
}

/// Ways to damage the state file, each with words the daemon's error must contain
/// (the JSON parser's own; "cut short" is the first half of the good file).
const CORRUPTIONS: [(&str, &[u8], &str); 4] = [
    ("cut short", b"", "EOF while parsing"),
    ("not JSON", b"\x00\xffgarbage", "expected value"),
    ("wrong shape", b"[1, 2, 3]", "invalid type"),
    ("empty", b"", "EOF while parsing"),
];

#[test]
fn corrupt_state_file_stops_the_daemon_and_is_left_untouched() -> Result<()> {
    let mut rack = Rack::build(&RackSpec::new("cs", 1))?;
    rack.start_daemon(0, &[])?;
    let sled = rack.sled(0)?;
    sled.admin(&[
        "set-v2p",
        "10.0.0.99",
        "a8:40:25:f0:00:99",
        "fd00:99::7",
        "10",
    ])?;
    let path = sled.daemon_paths().state_dir.join("state.json");
    let good = std::fs::read(&path).map_err(|e| Error::new(format!("{}: {e}", path.display())))?;
    for (what, bytes, error) in CORRUPTIONS {
        let bad = if what == "cut short" {
            good[..good.len() / 2].to_vec()
        } else {
            bytes.to_vec()
        };
        refused_to_start(&mut rack, &path, &bad, what, error)?;
        // The good state back: the daemon starts and has it.
        std::fs::write(&path, &good)?;
        rack.start_daemon(0, &[])?;
        let v2p = rack.sled(0)?.admin(&["dump-v2p"])?;
        assert!(
            v2p.contains("10.0.0.99"),
            "state not restored after {what}:\n{v2p}"
        );
    }
    Ok(())
}

/// Writes `bad` over the state file of sled 0's running daemon and restarts it: the
/// restart must fail naming the file and `error`, and leave the file as written.
fn refused_to_start(
    rack: &mut Rack,
    path: &PathBuf,
    bad: &[u8],
    what: &str,
    error: &str,
) -> Result<()> {
    std::fs::write(path, bad)?;
    let written = std::fs::metadata(path)?.modified()?;
    let e = match rack.restart_daemon(0, &[]) {
        Ok(()) => {
            return Err(Error::new(format!(
                "the daemon started on a state file that is {what}"
            )))
        }
        Err(e) => e.0,
    };
    let shown = path.display().to_string();
    assert!(
        e.contains(&shown),
        "{what}: the error does not name {shown}:\n{e}"
    );
    assert!(
        e.contains(error),
        "{what}: the error does not say {error:?}:\n{e}"
    );
    assert_eq!(
        std::fs::read(path)?,
        bad,
        "{what}: the daemon changed the file"
    );
    assert_eq!(
        std::fs::metadata(path)?.modified()?,
        written,
        "{what}: the daemon wrote the file"
    );
    eprintln!(
        "state file {what}: refused with {:?}",
        e.lines().find(|l| l.contains(&shown)).unwrap_or("")
    );
    Ok(())
}
