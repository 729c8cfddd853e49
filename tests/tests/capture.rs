//! `xdeadm capture`: a port's frames in both directions, with the direction and,
//! for a frame the datapath dropped, the reason, as pcapng that tshark and tcpdump
//! read; into a file the daemon writes, or through xdeadm's standard output. The
//! daemon answers other requests while a capture runs.

use e2e::cmd::Cmd;
use e2e::standard::{self, A1, B1};
use e2e::{Error, Result, Sled};
use std::io::Read;
use std::process::Stdio;
use std::thread;
use std::time::{Duration, Instant};

/// The first packets of a pair may wait for underlay neighbour resolution.
const FIRST_REPLY: Duration = Duration::from_secs(20);

/// How long the captures run: the traffic below takes a second or two.
const SECONDS: &str = "6";

/// Time for a capture started in the background to be running on its worker (it
/// takes milliseconds).
const SETTLE: Duration = Duration::from_secs(1);

/// In the VPC subnet, but in no V2P mapping: a guest's datagram to it is dropped
/// as `no_v2p`.
const NOWHERE: &str = "10.0.0.99";

/// `tshark -r FILE` with the fields the checks need, one line per frame:
/// direction (0 out, 1 in), comment, ICMP type, IPv4 source and destination, UDP
/// destination port.
fn tshark_fields(file: &str) -> Result<Vec<Vec<String>>> {
    let out = Cmd::new("tshark")
        .args(["-r", file, "-T", "fields", "-E", "separator=|"])
        .args([
            "-e",
            "frame.p2p_dir",
            "-e",
            "frame.comment",
            "-e",
            "icmp.type",
        ])
        .args(["-e", "ip.src", "-e", "ip.dst", "-e", "udp.dstport"])
        .run()?;
    Ok(out
        .lines()
        .map(|l| l.split('|').map(str::to_string).collect())
        .collect())
}

/// Echo requests out and replies in between a1 and b1, and the datagram to
/// [`NOWHERE`] out with its drop reason.
fn check_frames(rows: &[Vec<String>], a1: &str, b1: &str) -> Result<()> {
    let has = |dir: &str, comment: &str, icmp: &str, src: &str, dst: &str, udp: &str| {
        rows.iter().any(|r| {
            r.len() == 6
                && r[0] == dir
                && r[1] == comment
                && r[2] == icmp
                && r[3] == src
                && r[4] == dst
                && r[5] == udp
        })
    };
    let wanted = [
        ("0", "out", "8", a1, b1, "", "echo request from a1"),
        ("1", "in", "0", b1, a1, "", "echo reply to a1"),
        (
            "0",
            "out dropped: no_v2p",
            "",
            a1,
            NOWHERE,
            "9",
            "dropped datagram",
        ),
    ];
    for (dir, comment, icmp, src, dst, udp, what) in wanted {
        if !has(dir, comment, icmp, src, dst, udp) {
            return Err(Error::new(format!("no {what} in the capture: {rows:?}")));
        }
    }
    Ok(())
}

/// a1 pings b1 three times and sends one datagram to [`NOWHERE`].
fn traffic(rack: &e2e::Rack) -> Result<()> {
    let a1 = rack.guest(A1)?;
    let b1 = rack.guest(B1)?.ipv4()?.to_string();
    a1.run("ping", &["-4", "-c", "3", "-i", "0.2", "-W", "2", &b1])?;
    let send = format!(
        "import socket\n\
         s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
         s.sendto(b'capture me', ('{NOWHERE}', 9))\n"
    );
    a1.cmd("python3").arg("-").stdin(send).run()?;
    Ok(())
}

/// The `data` of `xdeadm --json ARGS...`.
fn json(sled: &Sled, args: &[&str]) -> Result<serde_json::Value> {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let out = sled.admin(&all)?;
    let v: serde_json::Value =
        serde_json::from_str(&out).map_err(|e| Error::new(format!("{args:?}: {e}: {out}")))?;
    Ok(v["data"].clone())
}

#[test]
fn capture_records_both_directions_and_drop_reasons() -> Result<()> {
    let rack = standard::rack("e2e", &[])?;
    let sled = rack.sled(0)?;
    let a1 = rack.guest(A1)?;
    let (a1_ip, b1_ip) = (a1.ipv4()?.to_string(), rack.guest(B1)?.ipv4()?.to_string());
    // The underlay neighbours resolved before the capture starts.
    a1.ping(rack.guest(B1)?.ipv4()?, 56, FIRST_REPLY)?;

    // Into a file the daemon writes.
    let file = rack.dir().join("a1.pcapng");
    let file = file
        .to_str()
        .ok_or_else(|| Error::new("temporary path is not UTF-8"))?
        .to_string();
    let cmd = sled.xdeadm(&["--json", "capture", A1, "-w", &file, "--seconds", SECONDS])?;
    let capture = thread::spawn(move || cmd.timeout(Duration::from_secs(30)).output());
    thread::sleep(SETTLE);
    // Other requests are answered while the capture runs.
    let asked = Instant::now();
    sled.admin(&["list-ports"])?;
    assert!(
        asked.elapsed() < Duration::from_secs(2),
        "list-ports took {:?} during a capture",
        asked.elapsed()
    );
    traffic(&rack)?;
    let done = capture
        .join()
        .map_err(|_| Error::new("capture thread panicked"))??;
    assert!(done.status.success(), "capture failed: {}", done.stderr);
    let reply: serde_json::Value = serde_json::from_str(&done.stdout)
        .map_err(|e| Error::new(format!("capture reply: {e}: {}", done.stdout)))?;
    let report = &reply["data"];
    assert_eq!(report["ended"], "time", "{reply}");
    assert_eq!(report["dropped"], 0, "{reply}");
    assert_eq!(report["file"], file.as_str(), "{reply}");
    let frames = report["frames"].as_u64().unwrap_or(0);
    assert!(frames >= 7, "3 requests, 3 replies, 1 datagram: {reply}");
    let rows = tshark_fields(&file)?;
    assert_eq!(rows.len() as u64, frames, "{rows:?}");
    check_frames(&rows, &a1_ip, &b1_ip)?;
    // tcpdump reads it too.
    let dump = Cmd::new("tcpdump").args(["-n", "-r", &file]).run()?;
    assert!(dump.contains("ICMP echo request"), "{dump}");
    assert!(dump.contains("ICMP echo reply"), "{dump}");

    // Through xdeadm's standard output, ended by the count.
    let cmd = sled.xdeadm(&["capture", A1, "-c", "2", "--seconds", "20"])?;
    let mut child = cmd.spawn_with(Stdio::piped(), Stdio::piped())?;
    let mut stdout = child
        .stdout
        .take()
        .ok_or_else(|| Error::new("capture has no stdout"))?;
    let reader = thread::spawn(move || {
        let mut buf = Vec::new();
        stdout.read_to_end(&mut buf).map(|_| buf)
    });
    thread::sleep(SETTLE);
    traffic(&rack)?;
    let status = child.wait()?;
    let pcap = reader
        .join()
        .map_err(|_| Error::new("reader thread panicked"))??;
    let mut summary = String::new();
    if let Some(mut e) = child.stderr.take() {
        e.read_to_string(&mut summary)?;
    }
    assert!(status.success(), "capture to stdout failed: {summary}");
    assert!(summary.contains("2 frames of a1"), "{summary}");
    let out = Cmd::new("tshark")
        .args(["-r", "-", "-T", "fields", "-e", "frame.comment"])
        .stdin(pcap)
        .run()?;
    assert_eq!(out.lines().count(), 2, "{out}");
    // xdeadm's own file is gone.
    let dir = sled.daemon_paths().api_socket;
    let dir = dir
        .parent()
        .ok_or_else(|| Error::new("socket without a directory"))?;
    for e in std::fs::read_dir(dir)? {
        let name = e?.file_name();
        assert!(
            !name.to_string_lossy().starts_with("xdeadm-capture-"),
            "left behind: {name:?}"
        );
    }

    // With the port's underlay frames: the Geneve frames its echo requests became,
    // those its replies came in, next to the guest's own, and an inbound datagram
    // the port's firewall refuses, which never reaches the tap.
    sled.admin(&[
        "add-fw-rule",
        "-p",
        A1,
        "--dir",
        "in",
        "--hosts",
        "any",
        "--protocol",
        "UDP",
        "--ports",
        "9",
        "--action",
        "deny",
        "--priority",
        "10",
    ])?;
    let ufile = rack.dir().join("a1-underlay.pcapng");
    let ufile = ufile
        .to_str()
        .ok_or_else(|| Error::new("temporary path is not UTF-8"))?
        .to_string();
    let cmd = sled.xdeadm(&[
        "capture",
        A1,
        "--underlay",
        "-w",
        &ufile,
        "--seconds",
        SECONDS,
    ])?;
    let capture = thread::spawn(move || cmd.timeout(Duration::from_secs(30)).output());
    thread::sleep(SETTLE);
    traffic(&rack)?;
    let send = format!(
        "import socket\n\
         s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
         s.sendto(b'refused', ('{a1_ip}', 9))\n"
    );
    rack.guest(B1)?.cmd("python3").arg("-").stdin(send).run()?;
    let done = capture
        .join()
        .map_err(|_| Error::new("capture thread panicked"))??;
    assert!(
        done.status.success(),
        "capture --underlay failed: {}",
        done.stderr
    );
    let out = Cmd::new("tshark")
        .args(["-r", &ufile, "-T", "fields", "-E", "separator=|"])
        .args([
            "-e",
            "frame.comment",
            "-e",
            "udp.dstport",
            "-e",
            "icmp.type",
        ])
        .run()?;
    for want in [
        "out||8",
        "in||0",
        "out underlay|6081|8",
        "in underlay|6081|0",
        "in underlay dropped: fw_deny_in|6081,9|",
    ] {
        assert!(out.lines().any(|l| l == want), "no {want:?} in: {out}");
    }

    // Refusals name what is wrong.
    let refused = |args: &[&str]| -> Result<String> {
        let o = sled.xdeadm(args)?.output()?;
        assert!(!o.status.success(), "{args:?} accepted: {}", o.stdout);
        Ok(o.stderr)
    };
    let e = refused(&["capture", "nosuch", "-w", "/tmp/never.pcapng"])?;
    assert!(e.contains("nosuch"), "{e}");
    let e = refused(&["capture", A1, "-w", &file, "-c", "1"])?;
    assert!(e.contains("not overwritten"), "{e}");
    let e = refused(&[
        "capture",
        A1,
        "--seconds",
        "3601",
        "-w",
        "/tmp/never.pcapng",
    ])?;
    assert!(e.contains("3601"), "{e}");
    assert!(!std::path::Path::new("/tmp/never.pcapng").exists());

    // The worker counter is reported.
    let stats = json(sled, &["stats"])?;
    assert_eq!(stats["worker"]["capture_dropped"], 0, "{stats}");
    Ok(())
}
