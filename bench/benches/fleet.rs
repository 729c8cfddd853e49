//! What a sled pays for its share of a fleet (docs/fleet.md, "A rack of 1,000
//! sleds"): the time to apply a full read of N V2P mappings, a steady stream of
//! single changes, and the memory each mapping holds, through the daemon's own
//! controller and an engine without I/O (one worker's worth; a daemon with W
//! workers holds W engines' tables). Run with `cargo bench -p bench --bench
//! fleet`; figures are printed, medians of a few runs.

use api::fleet::{v2p_key, vpc_prefix};
use api::Vni;
use engine::{Engine, EngineConfig};
use fleet::{Change, Positions};
use overlayd::controller::fleet::FleetLayer;
use overlayd::controller::state::StateStore;
use overlayd::controller::Controller;
use overlayd::fleet::channel::{FleetBatch, SharedView};
use overlayd::worker::Datapath;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Instant;

const VNI: u32 = 1701;
const RUNS: usize = 3;

fn controller(store: Option<StateStore>) -> Controller<Datapath> {
    let engine = Engine::new(EngineConfig::new("fd00:99::1".parse().unwrap())).unwrap();
    let mut c = Controller::new(Datapath::without_io(engine), store);
    // The watcher's end is dropped: the controller's commands go nowhere, as in a
    // sled whose watcher is between sessions.
    let (tx, _) = tokio::sync::mpsc::unbounded_channel();
    c.join_fleet(
        "bench".parse().unwrap(),
        FleetLayer::default(),
        tx,
        SharedView::default(),
    );
    c
}

/// Guest `i`'s address, and the value the control plane writes for it.
fn mapping(i: u32, sled: u32) -> (String, Vec<u8>) {
    let ip = IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i));
    let key = v2p_key(Vni::new(VNI).unwrap(), ip);
    let value = format!(
        r#"{{"mac":"a8:40:25:{:02x}:{:02x}:{:02x}","underlay":"fd00:99::{:x}"}}"#,
        (i >> 16) & 0xff,
        (i >> 8) & 0xff,
        i & 0xff,
        sled + 1
    );
    (key, value.into_bytes())
}

fn batch(changes: Vec<Change>, revision: i64, full_read: bool) -> FleetBatch {
    FleetBatch {
        cluster_id: 1,
        changes,
        positions: Positions::from([(vpc_prefix(Vni::new(VNI).unwrap()), revision)]),
        full_read,
    }
}

#[global_allocator]
static ALLOC: bench::alloc::CountingAlloc = bench::alloc::CountingAlloc;

/// Heap bytes this thread holds (everything here runs on one thread).
fn held() -> i64 {
    bench::alloc::thread_live_bytes()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A full read of `n` mappings into a fresh controller: seconds, and the heap
/// bytes it keeps per mapping (the read's own, freed once applied, not counted).
fn full_read(n: u32) -> (f64, f64) {
    let mut c = controller(None);
    let before = held();
    let changes: Vec<Change> = (0..n)
        .map(|i| {
            let (key, value) = mapping(i, i % 1000);
            Change {
                key,
                value: Some(value),
                mod_revision: 2,
            }
        })
        .collect();
    let t = Instant::now();
    c.apply_fleet(batch(changes, 2, true));
    let took = t.elapsed().as_secs_f64();
    let grown = held() - before;
    assert_eq!(c.dataplane().engine().stats().v2p_entries, n as usize);
    (took, grown as f64 / f64::from(n))
}

/// Heap bytes per mapping of an engine alone: what each further worker of a
/// daemon holds.
fn engine_bytes(n: u32) -> f64 {
    let mut engine = Engine::new(EngineConfig::new("fd00:99::1".parse().unwrap())).unwrap();
    let vni = Vni::new(VNI).unwrap();
    let before = held();
    for i in 0..n {
        let ip = IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i));
        let mac = wire::MacAddr([0xa8, 0x40, 0x25, 0, (i >> 8) as u8, i as u8]);
        engine
            .set_v2p(vni, ip, "fd00:99::2".parse().unwrap(), mac)
            .unwrap();
    }
    (held() - before) as f64 / f64::from(n)
}

/// `m` single changes (guests moving to another sled), one batch each, on a
/// controller holding `n`: microseconds per change.
fn churn(n: u32, m: u32) -> f64 {
    let mut c = holding(n, None);
    let t = Instant::now();
    for j in 0..m {
        let (key, value) = mapping(j * 7 % n, 1 + j % 999);
        let revision = 3 + i64::from(j);
        c.apply_fleet(batch(
            vec![Change {
                key,
                value: Some(value),
                mod_revision: revision,
            }],
            revision,
            false,
        ));
    }
    t.elapsed().as_secs_f64() * 1e6 / f64::from(m)
}

/// A controller holding `n` mappings.
fn holding(n: u32, store: Option<StateStore>) -> Controller<Datapath> {
    let mut c = controller(store);
    let all: Vec<Change> = (0..n)
        .map(|i| {
            let (key, value) = mapping(i, 0);
            Change {
                key,
                value: Some(value),
                mod_revision: 2,
            }
        })
        .collect();
    c.apply_fleet(batch(all, 2, true));
    c
}

/// Saving the layer of `n` mappings (`fleet.json`, at most once a second under
/// churn): seconds, and the file's size.
fn save(n: u32) -> (f64, u64) {
    let dir = tempfile::tempdir().unwrap();
    let store = StateStore::open(dir.path()).unwrap();
    let mut c = holding(n, Some(store));
    let (key, value) = mapping(0, 7);
    c.apply_fleet(batch(
        vec![Change {
            key,
            value: Some(value),
            mod_revision: 3,
        }],
        3,
        false,
    ));
    let t = Instant::now();
    c.flush_fleet();
    let took = t.elapsed().as_secs_f64();
    let size = std::fs::metadata(dir.path().join("fleet.json")).map_or(0, |m| m.len());
    (took, size)
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` runs it as a quick check.
    let quick = !std::env::args().any(|a| a == "--bench");
    let sizes: &[u32] = if quick { &[1_000] } else { &[10_000, 100_000] };
    for &n in sizes {
        let runs: Vec<(f64, f64)> = (0..RUNS).map(|_| full_read(n)).collect();
        let secs = median(runs.iter().map(|r| r.0).collect());
        let bytes = median(runs.iter().map(|r| r.1).collect());
        println!(
            "fleet/full_read/{n}: {:.3} s, {:.2} us per mapping, {:.0} heap bytes kept per mapping",
            secs,
            secs * 1e6 / f64::from(n),
            bytes
        );
        let us = median(
            (0..RUNS)
                .map(|_| churn(n, if quick { 100 } else { 2_000 }))
                .collect(),
        );
        println!("fleet/churn/{n}: {us:.1} us per single-change batch");
        let bytes = median((0..RUNS).map(|_| engine_bytes(n)).collect());
        println!("fleet/engine/{n}: {bytes:.0} heap bytes per mapping in one engine");
        let saves: Vec<(f64, u64)> = (0..RUNS).map(|_| save(n)).collect();
        let secs = median(saves.iter().map(|r| r.0).collect());
        println!(
            "fleet/save/{n}: {:.1} ms, fleet.json {} KiB",
            secs * 1e3,
            saves[0].1 / 1024
        );
    }
}
