//! The fleet's watcher against a real etcd (Debian's, one member of each test's
//! own), without a controller: what batches reach the main loop's channel, with
//! which positions, when a full read is due and when it is not, and the sled's
//! status key.

use api::fleet::{sled_ports_prefix, status_key, vpc_prefix, SledId, SledStatus, V2B_PREFIX};
use api::Vni;
use fleet::testing::Etcd;
use fleet::{Op, Positions, Store};
use overlayd::fleet::channel::{CommandTx, FleetBatch, FleetCommand, SharedView};
use overlayd::fleet::watcher::{self, WatcherStart};
use overlayd::server::{work_channel, Work, WorkRx};
use std::collections::BTreeSet;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const V2P_A: &str = r#"{"mac":"a8:40:25:ff:00:01","underlay":"fd00:99::1"}"#;
const V2P_B: &str = r#"{"mac":"a8:40:25:ff:00:02","underlay":"fd00:99::2"}"#;

fn vni(n: u32) -> Vni {
    Vni::new(n).unwrap()
}

fn sled() -> SledId {
    "sled1".parse().unwrap()
}

fn v2p_key(vni: u32, ip: &str) -> String {
    api::fleet::v2p_key(self::vni(vni), ip.parse().unwrap())
}

/// A watcher of sled1 and what it hands the main loop.
struct Running {
    commands: Option<CommandTx>,
    work: WorkRx,
    view: SharedView,
    thread: Option<JoinHandle<()>>,
    /// Every position the watcher sent, as the main loop would hold them.
    positions: Positions,
}

impl Running {
    fn start(etcd: &Etcd, positions: Positions, cluster_id: u64, vnis: &[u32]) -> Running {
        let (tx, work) = work_channel();
        let view = SharedView::default();
        let start = WatcherStart {
            store: etcd.config(),
            sled: sled(),
            positions,
            cluster_id,
        };
        let (commands, thread) = watcher::spawn(start, tx, view.clone()).unwrap();
        let running = Running {
            commands: Some(commands),
            work,
            view,
            thread: Some(thread),
            positions: Positions::new(),
        };
        running.vnis(vnis);
        running
    }

    fn vnis(&self, vnis: &[u32]) {
        let set: BTreeSet<Vni> = vnis.iter().map(|&n| vni(n)).collect();
        self.command(FleetCommand::Vnis(set));
    }

    fn command(&self, c: FleetCommand) {
        self.commands.as_ref().unwrap().send(c).unwrap();
    }

    /// The next batch within `wait`, its positions recorded.
    fn recv(&mut self, wait: Duration) -> Option<FleetBatch> {
        match self.work.recv_timeout(wait) {
            Ok(Work::Fleet(b)) => {
                self.positions.extend(b.positions.clone());
                Some(b)
            }
            Ok(Work::Request(_)) => panic!("the watcher sent a request"),
            Err(_) => None,
        }
    }

    /// The next batch with changes, or a full read (progress alone is skipped).
    fn next(&mut self) -> FleetBatch {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.recv(left) {
                Some(b) if b.full_read || !b.changes.is_empty() => return b,
                Some(_) => continue,
                None => panic!("no batch within 10 s; view {:?}", self.view.get()),
            }
        }
    }

    /// Nothing but progress for `wait`.
    fn quiet(&mut self, wait: Duration) {
        let deadline = Instant::now() + wait;
        while let Some(b) = self.recv(deadline.saturating_duration_since(Instant::now())) {
            assert!(!b.full_read && b.changes.is_empty(), "unexpected {b:?}");
        }
    }

    /// Stops the watcher as the daemon does (the controller's end goes), and
    /// returns where it got to: every position it sent.
    fn stop(mut self) -> Positions {
        drop(self.commands.take());
        let thread = self.thread.take().unwrap();
        while !thread.is_finished() {
            self.recv(Duration::from_millis(50));
        }
        while self.recv(Duration::ZERO).is_some() {}
        thread.join().unwrap();
        self.positions
    }
}

fn put(key: &str, value: &str) -> Op {
    Op::Put {
        key: key.to_string(),
        value: value.as_bytes().to_vec(),
    }
}

fn delete(key: &str) -> Op {
    Op::Delete {
        key: key.to_string(),
        if_mod_revision: None,
    }
}

struct Writer {
    runtime: tokio::runtime::Runtime,
    store: Store,
}

impl Writer {
    fn new(etcd: &Etcd) -> Writer {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let store = runtime.block_on(etcd.store());
        Writer { runtime, store }
    }

    fn apply(&mut self, ops: Vec<Op>) -> i64 {
        self.runtime
            .block_on(self.store.apply(ops))
            .unwrap()
            .revision
    }

    fn get(&mut self, key: &str) -> Option<Vec<u8>> {
        let snap = self
            .runtime
            .block_on(self.store.snapshot(&[key.to_string()]))
            .unwrap();
        snap.kvs
            .into_iter()
            .find(|kv| kv.key == key)
            .map(|kv| kv.value)
    }
}

fn keys(b: &FleetBatch) -> Vec<&str> {
    b.changes.iter().map(|c| c.key.as_str()).collect()
}

/// A first start reads every prefix (no resync: there was nothing to resync),
/// events follow, a VPC the sled does not host is not seen, a new one is read
/// when a port lands there, and the status key lives while the watcher does.
#[test]
fn reads_then_follows_its_prefixes() {
    let etcd = Etcd::start();
    let mut w = Writer::new(&etcd);
    let before = w.apply(vec![
        put(&v2p_key(1701, "10.0.0.1"), V2P_A),
        put(
            "/overlay/v1/v2b/0.0.0.0/0",
            r#"{"endpoints":["fd00:99::b1"]}"#,
        ),
        put(&v2p_key(1702, "10.0.0.9"), V2P_A),
    ]);
    let mut r = Running::start(&etcd, Positions::new(), 0, &[1701]);
    let read = r.next();
    assert!(read.full_read);
    assert_eq!(
        keys(&read),
        [
            "/overlay/v1/v2b/0.0.0.0/0",
            v2p_key(1701, "10.0.0.1").as_str()
        ]
    );
    let wanted: BTreeSet<String> = [
        vpc_prefix(vni(1701)),
        V2B_PREFIX.into(),
        sled_ports_prefix(&sled()),
    ]
    .into();
    assert_eq!(
        read.positions.keys().cloned().collect::<BTreeSet<_>>(),
        wanted
    );
    assert!(read.positions.values().all(|&p| p >= before));

    let changed = w.apply(vec![
        put(&v2p_key(1701, "10.0.0.2"), V2P_B),
        put(&v2p_key(1702, "10.0.0.10"), V2P_B),
    ]);
    let events = r.next();
    assert!(!events.full_read);
    assert_eq!(keys(&events), [v2p_key(1701, "10.0.0.2").as_str()]);
    assert_eq!(events.positions[&vpc_prefix(vni(1701))], changed);

    r.vnis(&[1701, 1702]);
    let added = r.next();
    assert!(added.full_read);
    assert_eq!(
        keys(&added),
        [
            v2p_key(1702, "10.0.0.10").as_str(),
            v2p_key(1702, "10.0.0.9").as_str()
        ]
    );
    assert_eq!(
        added.positions.keys().collect::<Vec<_>>(),
        [&vpc_prefix(vni(1702))]
    );
    let deleted = w.apply(vec![delete(&v2p_key(1702, "10.0.0.9"))]);
    let events = r.next();
    assert_eq!(events.changes[0].value, None);
    assert_eq!(events.positions[&vpc_prefix(vni(1702))], deleted);

    // The status key: this sled's, on a lease, naming the cluster.
    let status: SledStatus = serde_json::from_slice(&w.get(&status_key(&sled())).unwrap()).unwrap();
    assert_eq!(status.cluster_id, w.store.cluster_id());
    let view = r.view.get();
    assert!(view.connected, "{view:?}");
    assert_eq!(view.resyncs, 0);
    r.stop();
    assert_eq!(w.get(&status_key(&sled())), None, "revoked at a clean stop");
}

/// A restart resumes every prefix from its position: what changed meanwhile
/// (deletes included) comes as events, with no full read. When the store has
/// compacted past a position meanwhile, exactly one full read follows.
#[test]
fn resumes_from_its_positions_and_resyncs_once_after_compaction() {
    let etcd = Etcd::start();
    let mut w = Writer::new(&etcd);
    w.apply(vec![
        put(&v2p_key(1701, "10.0.0.1"), V2P_A),
        put(&v2p_key(1701, "10.0.0.2"), V2P_A),
    ]);
    let mut r = Running::start(&etcd, Positions::new(), 0, &[1701]);
    assert!(r.next().full_read);
    let cluster = w.store.cluster_id();
    let positions = r.stop();

    // Down: a change and a delete.
    let changed = w.apply(vec![
        put(&v2p_key(1701, "10.0.0.1"), V2P_B),
        delete(&v2p_key(1701, "10.0.0.2")),
    ]);
    let mut r = Running::start(&etcd, positions.clone(), cluster, &[1701]);
    let events = r.next();
    assert!(!events.full_read, "{events:?}");
    assert_eq!(events.changes.len(), 2);
    assert_eq!(events.positions[&vpc_prefix(vni(1701))], changed);
    r.quiet(Duration::from_millis(1500));
    assert_eq!(r.view.get().resyncs, 0);
    let mut positions = positions;
    positions.extend(r.stop());

    // Down again; the store changes and compacts past every position.
    w.apply(vec![delete(&v2p_key(1701, "10.0.0.1"))]);
    let last = w.apply(vec![put(&v2p_key(1701, "10.0.0.3"), V2P_A)]);
    w.runtime
        .block_on(async { etcd.raw().await.compact(last, None).await })
        .unwrap();
    let mut r = Running::start(&etcd, positions, cluster, &[1701]);
    let read = r.next();
    assert!(read.full_read, "{read:?}");
    assert_eq!(keys(&read), [v2p_key(1701, "10.0.0.3").as_str()]);
    r.quiet(Duration::from_millis(1500));
    assert_eq!(r.view.get().resyncs, 1);
    r.stop();
}

/// A store of another cluster (a replaced etcd) is read in full, whatever the
/// positions say; so is one asked for by an operator.
#[test]
fn another_cluster_or_an_operator_means_a_full_read() {
    let old = Etcd::start();
    let mut w = Writer::new(&old);
    w.apply(vec![put(&v2p_key(1701, "10.0.0.1"), V2P_A)]);
    let mut r = Running::start(&old, Positions::new(), 0, &[1701]);
    let first = r.next();
    let cluster = first.cluster_id;
    let positions = r.stop();
    drop(old);

    let new = Etcd::start();
    let mut w = Writer::new(&new);
    w.apply(vec![put(&v2p_key(1701, "10.0.0.7"), V2P_B)]);
    let mut r = Running::start(&new, positions, cluster, &[1701]);
    let read = r.next();
    assert!(read.full_read);
    assert_ne!(read.cluster_id, cluster);
    assert_eq!(keys(&read), [v2p_key(1701, "10.0.0.7").as_str()]);
    r.command(FleetCommand::Resync);
    let again = r.next();
    assert!(again.full_read);
    assert_eq!(r.view.get().resyncs, 2);
    r.stop();
}

/// With the store gone the watcher keeps trying, spaced out, and says why; when
/// the store is back it carries on where it was.
#[test]
fn an_unreachable_store_is_retried_and_reported() {
    let etcd = Etcd::start();
    let mut w = Writer::new(&etcd);
    w.apply(vec![put(&v2p_key(1701, "10.0.0.1"), V2P_A)]);
    let mut r = Running::start(&etcd, Positions::new(), 0, &[1701]);
    assert!(r.next().full_read);
    drop(w);
    drop(etcd);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let view = r.view.get();
        if !view.connected && view.last_error.is_some() {
            break;
        }
        assert!(Instant::now() < deadline, "still connected: {view:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    r.stop();
}
