//! Two poll-mode workers on one sled (`--cores 0,1`): the standard rack puts a1 on
//! worker 0 and a2 on worker 1 of sled 0. Traffic between them is same-sled but
//! cross-worker: the sender's worker hands the guest frame to the owner, which
//! delivers it without encapsulation; traffic from the other sled to a2 arrives on
//! worker 0's queue and is handed to worker 1. Both must carry pings at full size and
//! TCP with every byte checked, and an idle two-worker daemon must sleep: a few
//! wake-ups a second, under 1% of a core on a quiet host.

use e2e::standard::{self, A1, A2, B1};
use e2e::stats;
use e2e::xfer::transfer;
use e2e::{Result, Sled};
use serde_json::Value;
use std::path::Path;
use std::time::Duration;

const FIRST_REPLY: Duration = Duration::from_secs(20);

fn xfer_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_e2e-xfer"))
}

/// Per thread of the overlayd whose command line names `api_socket`: its time on
/// a CPU so far (seconds) and how many times it was run (about one per wake-up).
/// `/proc/PID/task/TID/schedstat` counts both as the scheduler runs each thread;
/// `stat`'s utime and stime are samples taken at timer ticks, which charge a thread
/// that wakes briefly a whole tick whenever a tick lands in one of its wake-ups.
fn cpu_by_thread(api_socket: &str) -> Vec<(String, f64, u64)> {
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if !cmd.contains("overlayd") || !cmd.contains(api_socket) {
            continue;
        }
        let mut threads = Vec::new();
        for t in std::fs::read_dir(e.path().join("task")).unwrap().flatten() {
            let (Ok(name), Ok(sched)) = (
                std::fs::read_to_string(t.path().join("comm")),
                std::fs::read_to_string(t.path().join("schedstat")),
            ) else {
                continue; // the thread ended between the listing and the read
            };
            let f: Vec<&str> = sched.split_whitespace().collect();
            let (ns, runs): (f64, u64) = (f[0].parse().unwrap(), f[2].parse().unwrap());
            let id = t.file_name().to_string_lossy().into_owned();
            threads.push((format!("{}/{id}", name.trim()), ns / 1e9, runs));
        }
        return threads;
    }
    panic!("no overlayd process with {api_socket} in its command line");
}

/// `xdeadm workers`: each worker's core, ports and queues, and its rounds, busy
/// ratio and handoffs after the traffic above (worker 1 took frames from worker 0
/// both ways: a1 -> a2 and b1 -> a2 arriving on worker 0's queue).
fn check_workers_view(sled: &Sled) -> Result<()> {
    let v: Value = serde_json::from_str(&sled.admin(&["--json", "workers"])?).unwrap();
    let w = v["data"].as_array().expect("a list of workers");
    assert_eq!(w.len(), 2, "{v}");
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    for (i, (worker, port)) in w.iter().zip([A1, A2]).enumerate() {
        assert_eq!(worker["worker"], i, "{v}");
        assert_eq!(worker["core"], i, "{v}");
        assert_eq!(worker["ports"], serde_json::json!([port]), "{v}");
        let queues = worker["queues"].as_array().expect("queues");
        assert!(
            !queues.is_empty(),
            "worker {i} serves no underlay queue: {v}"
        );
        assert!(
            queues
                .iter()
                .all(|q| q["ifindex"].as_u64().is_some_and(|x| x > 0)),
            "{v}"
        );
        let (rounds, busy) = (
            worker["rounds"].as_u64().unwrap(),
            worker["busy_rounds"].as_u64().unwrap(),
        );
        assert!(rounds > 0 && busy > 0 && busy <= rounds, "{v}");
        let ratio = worker["busy_ratio"].as_f64().unwrap();
        assert!((ratio - busy as f64 / rounds as f64).abs() < 1e-9, "{v}");
        assert!(worker["idle_sleeps"].as_u64().is_some(), "{v}");
        let started = worker["started_unix_ms"].as_u64().unwrap();
        assert!(started <= now_ms && now_ms - started < 3_600_000, "{v}");
    }
    // The queues are split, not shared.
    let mut all: Vec<String> = w
        .iter()
        .flat_map(|x| {
            x["queues"]
                .as_array()
                .unwrap()
                .iter()
                .map(std::string::ToString::to_string)
        })
        .collect();
    let n = all.len();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), n, "a queue on two workers: {v}");
    assert!(w[1]["handoff_in"].as_u64().unwrap() > 0, "{v}");
    assert!(w[0]["handoff_out"].as_u64().unwrap() > 0, "{v}");
    // The table names both workers.
    let table = sled.admin(&["workers"])?;
    assert!(
        table.starts_with("WORKER") && table.lines().count() == 3,
        "{table}"
    );
    Ok(())
}

#[test]
fn two_workers_carry_same_sled_and_cross_sled_traffic() -> Result<()> {
    let rack = standard::rack("wk", &["--cores", "0,1"])?;
    let (a1, a2, b1) = (rack.guest(A1)?, rack.guest(A2)?, rack.guest(B1)?);
    let sled0 = rack.sled(0)?;

    let placed: Value = serde_json::from_str(&sled0.admin(&["--json", "stats"])?).unwrap();
    let workers = placed["data"]["workers"].clone();
    assert_eq!(workers[0]["ports"], serde_json::json!([A1]), "{placed}");
    assert_eq!(workers[1]["ports"], serde_json::json!([A2]), "{placed}");

    // Same sled, different workers, both ways; then across sleds to and from the
    // port of worker 1.
    a1.ping(a2.ipv4()?, 56, FIRST_REPLY)?;
    a2.ping(a1.ipv4()?, 8472, FIRST_REPLY)?;
    a2.ping(b1.ipv4()?, 8472, FIRST_REPLY)?;
    b1.ping(a2.ipv4()?, 56, FIRST_REPLY)?;
    a1.ping(b1.ipv6()?, 56, FIRST_REPLY)?;
    let timeout = Duration::from_secs(120);
    transfer(xfer_bin(), a2, a1, a1.ipv4()?, 5301, 20 << 20, timeout)?;
    transfer(xfer_bin(), b1, a2, a2.ipv4()?, 5302, 20 << 20, timeout)?;

    let c = stats::parse(&sled0.admin(&["--json", "stats"])?)?;
    for k in ["handoff_out", "handoff_in", "local_delivered"] {
        assert!(stats::sum(&c, k) > 0, "{k} stayed 0");
    }
    for k in ["handoff_full", "handoff_no_worker", "handoff_too_long"] {
        assert_eq!(stats::sum(&c, k), 0, "{k}");
    }
    check_workers_view(sled0)?;

    // Idle: both workers sleep in epoll.
    let socket = sled0.daemon_paths().api_socket.display().to_string();
    // A worker ticks every 100 ms for its first second without work (the
    // requests above were work), every second after.
    std::thread::sleep(Duration::from_secs(2));
    let before = cpu_by_thread(&socket);
    std::thread::sleep(Duration::from_secs(5));
    let per_thread: Vec<(String, f64, u64)> = cpu_by_thread(&socket)
        .into_iter()
        .map(|(t, s, r)| match before.iter().find(|b| b.0 == t) {
            Some(b) => (t, s - b.1, r - b.2),
            None => (t, s, r),
        })
        .collect();
    let used: f64 = per_thread.iter().map(|t| t.1).sum();
    let wakes: u64 = per_thread.iter().map(|t| t.2).sum();
    let report = format!(
        "an idle two-worker daemon used {used:.3} CPU s and woke {wakes} times in 5 s; \
         by thread (CPU s, runs): {per_thread:?}"
    );
    eprintln!("{report}");
    // What an idle daemon costs is its wake-ups: in the VMs this runs in, each costs
    // 0.3-1.4 ms of a core whatever the thread does (a C loop of 250 ms sleeps is
    // charged ~0.4 ms per wake-up), so the CPU figure moves with the host while
    // the count does not. The timers make 6 a second (main loop 4, each worker 1);
    // a guest's neighbour probes bring a worker back to 10 ticks a second for a
    // second (about 50 in all was seen here). 100 fails any thread that wakes on a
    // fixed 10-20 ms to 100 ms timer (as the API thread and the workers did: 350
    // in 5 s). The CPU bound (5% of a core) fails a worker that spins instead of
    // sleeping (it would use the whole 5 s) whatever the host.
    assert!(wakes <= 100, "{report}");
    assert!(used < 0.25, "{report}");
    Ok(())
}
