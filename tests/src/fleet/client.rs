//! The control plane as a long-lived client of the store: the `fleet` crate's
//! [`Store`] (what `xdeadm fleet` and the daemons use) with the writer's
//! certificate, on a thread of its own inside the cluster's control-plane
//! namespace. One transaction per [`StoreClient::apply`], without a process and a
//! TLS handshake per change, so that a test can write tens of changes a second and
//! knows when each one was sent and answered (for latency measurements against the
//! sleds' logs, on the same clock).
//!
//! A member that goes away under it (killed, or without a leader) fails the
//! request with a transient error: the client connects again (to another member)
//! and sends the same transaction again, for up to [`RETRY_FOR`]. A put or an
//! unguarded delete sent twice leaves the same contents, so a test that compares
//! contents is not fooled by a transaction that went through before its answer
//! was lost.

use crate::etcd::{Cluster, WRITER};
use crate::{Error, Result};
use api::fleet::{encode_v2p, v2p_key, vpc_prefix, FleetEntry, FleetKey};
use api::{V2pEntry, Vni};
use fleet::{Op, Store, StoreConfig, StoreError};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

/// How long one request keeps trying through lost members and elections (a
/// leader killed on the loaded 2-core machine: 3-8 s to a new one).
pub const RETRY_FOR: Duration = Duration::from_secs(60);

/// The client's timeout for connecting and for each request (the daemons' own).
const TIMEOUT: Duration = Duration::from_secs(5);

/// The pause before trying again after a transient failure.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// A transaction that went through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Commit {
    /// The store's revision after it.
    pub revision: i64,
    /// When the attempt that went through was sent, and when its answer came: the
    /// commit happened in between.
    pub sent: SystemTime,
    pub answered: SystemTime,
    /// Attempts it took (more than one when a member went away under it).
    pub attempts: u32,
}

enum Request {
    Apply(Vec<Op>, mpsc::Sender<Result<Commit>>),
    Read(Vec<String>, mpsc::Sender<Result<fleet::Snapshot>>),
}

/// See the module's documentation. Dropping it ends its thread.
#[derive(Debug)]
pub struct StoreClient {
    requests: Option<UnboundedSender<Request>>,
    thread: Option<JoinHandle<Result<()>>>,
}

impl StoreClient {
    /// Connects as the writer from `etcd`'s control-plane namespace.
    pub fn connect(etcd: &Cluster) -> Result<StoreClient> {
        let tls = etcd.credentials(WRITER)?;
        let config = StoreConfig {
            endpoints: etcd.endpoints().split(',').map(String::from).collect(),
            tls: Some(fleet::TlsFiles {
                cert: tls.cert,
                key: tls.key,
                ca: tls.ca,
            }),
            timeout: TIMEOUT,
        };
        let (requests, rx) = unbounded_channel();
        let (ready_tx, ready) = mpsc::channel();
        let thread = etcd
            .control_ns()?
            .spawn("fleet-writer", move || serve(&config, rx, &ready_tx))?;
        let client = StoreClient {
            requests: Some(requests),
            thread: Some(thread),
        };
        ready
            .recv()
            .map_err(|_| Error::new("the store client's thread ended before connecting"))??;
        Ok(client)
    }

    fn ask<T>(&self, request: impl FnOnce(mpsc::Sender<Result<T>>) -> Request) -> Result<T> {
        let (tx, rx) = mpsc::channel();
        self.requests
            .as_ref()
            .and_then(|r| r.send(request(tx)).ok())
            .ok_or_else(|| Error::new("the store client's thread is gone"))?;
        rx.recv()
            .map_err(|_| Error::new("the store client's thread ended without an answer"))?
    }

    /// Writes `ops` in one transaction (at most [`fleet::MAX_TXN_OPS`]).
    pub fn apply(&self, ops: Vec<Op>) -> Result<Commit> {
        if ops.len() > fleet::MAX_TXN_OPS {
            return Err(Error::new(format!(
                "{} ops are more than one transaction",
                ops.len()
            )));
        }
        self.ask(|tx| Request::Apply(ops, tx))
    }

    /// Every key under `prefixes` at one revision.
    pub fn read(&self, prefixes: &[String]) -> Result<fleet::Snapshot> {
        self.ask(|tx| Request::Read(prefixes.to_vec(), tx))
    }

    /// VPC `vni`'s V2P mappings in the store, decoded as the sleds decode them,
    /// sorted as [`super::FleetRack::fleet_v2p`] sorts them; and the revision read.
    pub fn v2p(&self, vni: u32) -> Result<(Vec<V2pEntry>, i64)> {
        let snapshot = self.read(&[vpc_prefix(vni_of(vni)?)])?;
        let mut v = Vec::with_capacity(snapshot.kvs.len());
        for kv in &snapshot.kvs {
            let key = FleetKey::parse(&kv.key).map_err(|e| Error::new(e.to_string()))?;
            match FleetEntry::decode(&key, &kv.value) {
                Ok(FleetEntry::V2p(e)) => v.push(e),
                other => {
                    return Err(Error::new(format!(
                        "{} in the store is no V2P mapping: {other:?}",
                        kv.key
                    )))
                }
            }
        }
        v.sort_by_key(|e| (e.vni, e.vpc_ip));
        Ok((v, snapshot.revision))
    }

    /// Sends `changes` one transaction each, `rate` a second: each is sent one
    /// interval after the previous one was due, or at once when that is past (a
    /// transaction slowed by an election delays the rest; none is sent in a burst
    /// to catch up). Counts them in `done` as they commit; returns every commit
    /// in order.
    pub fn churn(
        &self,
        changes: Vec<Vec<Op>>,
        rate: f64,
        done: &AtomicUsize,
    ) -> Result<Vec<Commit>> {
        let interval = Duration::from_secs_f64(1.0 / rate);
        let mut due = Instant::now();
        let mut commits = Vec::with_capacity(changes.len());
        for (i, ops) in changes.into_iter().enumerate() {
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            due = due.max(now) + interval;
            commits.push(
                self.apply(ops)
                    .map_err(|e| e.context(format!("change {i}")))?,
            );
            done.fetch_add(1, Ordering::SeqCst);
        }
        Ok(commits)
    }
}

impl Drop for StoreClient {
    fn drop(&mut self) {
        // Closing the channel ends the thread's loop.
        self.requests.take();
        if let Some(thread) = self.thread.take() {
            match thread.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => eprintln!("e2e: the store client: {e}"),
                Err(_) => eprintln!("e2e: the store client's thread panicked"),
            }
        }
    }
}

fn vni_of(vni: u32) -> Result<Vni> {
    Vni::new(vni).map_err(|e| Error::new(format!("VNI {vni}: {e:?}")))
}

/// The put of mapping `e` (checked as the sleds check it).
pub fn put_v2p(e: &V2pEntry) -> Result<Op> {
    let encoded = encode_v2p(e).map_err(|err| Error::new(format!("{e:?}: {err}")))?;
    Ok(Op::Put {
        key: encoded.key,
        value: encoded.value,
    })
}

/// The (unguarded) delete of the mapping of `e`'s address.
pub fn delete_v2p(e: &V2pEntry) -> Op {
    Op::Delete {
        key: v2p_key(e.vni, e.vpc_ip),
        if_mod_revision: None,
    }
}

/// The client's thread: connects, tells `ready`, then serves requests until the
/// channel closes.
fn serve(
    config: &StoreConfig,
    mut requests: UnboundedReceiver<Request>,
    ready: &mpsc::Sender<Result<()>>,
) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::new(format!("the store client's runtime: {e}")))?;
    runtime.block_on(async {
        let began = Instant::now();
        let mut store = match connect(config, began).await {
            Ok(s) => {
                let _ = ready.send(Ok(()));
                Some(s)
            }
            Err(e) => {
                let _ = ready.send(Err(e.clone()));
                return Err(e);
            }
        };
        while let Some(request) = requests.recv().await {
            match request {
                Request::Apply(ops, answer) => {
                    let _ = answer.send(apply(config, &mut store, ops).await);
                }
                Request::Read(prefixes, answer) => {
                    let _ = answer.send(read(config, &mut store, &prefixes).await);
                }
            }
        }
        Ok(())
    })
}

/// Connects, trying again (any error: a killed member refuses the connection)
/// until [`RETRY_FOR`] after `began`.
async fn connect(config: &StoreConfig, began: Instant) -> Result<Store> {
    loop {
        match Store::connect(config).await {
            Ok(s) => return Ok(s),
            Err(_) if began.elapsed() < RETRY_FOR => tokio::time::sleep(RETRY_PAUSE).await,
            Err(e) => {
                return Err(Error::new(format!(
                    "the writer connecting for {:.1?}: {e}",
                    began.elapsed()
                )))
            }
        }
    }
}

/// Runs `op` on a connected store; on a transient error connects again and
/// retries until [`RETRY_FOR`]. Returns the result, the attempts and when the last
/// one was sent.
async fn retrying<T>(
    config: &StoreConfig,
    store: &mut Option<Store>,
    what: &str,
    mut op: impl AsyncFnMut(&mut Store) -> Result<T, StoreError>,
) -> Result<(T, u32, SystemTime)> {
    let began = Instant::now();
    let mut attempts = 0;
    loop {
        let s = match store {
            Some(s) => s,
            None => store.insert(connect(config, began).await?),
        };
        attempts += 1;
        let sent = SystemTime::now();
        match op(s).await {
            Ok(v) => return Ok((v, attempts, sent)),
            Err(e) if e.is_transient() && began.elapsed() < RETRY_FOR => {
                *store = None;
                tokio::time::sleep(RETRY_PAUSE).await;
            }
            Err(e) => {
                return Err(Error::new(format!(
                    "{what} (attempt {attempts}, {:.1?}): {e}",
                    began.elapsed()
                )))
            }
        }
    }
}

async fn apply(config: &StoreConfig, store: &mut Option<Store>, ops: Vec<Op>) -> Result<Commit> {
    let what = format!(
        "writing {} ops from {:?}",
        ops.len(),
        ops.first().map(Op::key)
    );
    let (applied, attempts, sent) =
        retrying(config, store, &what, async |s| s.apply(ops.clone()).await).await?;
    let answered = SystemTime::now();
    if !applied.skipped.is_empty() {
        return Err(Error::new(format!("{what}: skipped {:?}", applied.skipped)));
    }
    Ok(Commit {
        revision: applied.revision,
        sent,
        answered,
        attempts,
    })
}

async fn read(
    config: &StoreConfig,
    store: &mut Option<Store>,
    prefixes: &[String],
) -> Result<fleet::Snapshot> {
    let what = format!("reading {prefixes:?}");
    retrying(config, store, &what, async |s| s.snapshot(prefixes).await)
        .await
        .map(|(snapshot, _, _)| snapshot)
}
