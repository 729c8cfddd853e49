//! The fleet's watcher (docs/fleet.md, "Sync"): a thread of its own that follows
//! the store and hands what it reads to the main loop as [`FleetBatch`]es, over
//! the channel API requests take. It never touches the controller or the engine.
//!
//! A session is one connection: connect (to a member with a leader), decide
//! whether a full read is due (the cluster changed, the store's revision went
//! behind ours, the watch fell behind compaction, an operator asked), read what
//! must be read, watch every prefix from its own position, and keep the sled's
//! status key on a lease. Any error ends the session; the next one starts after
//! a back-off with full jitter, and in between the sled forwards on what it has.
//! What was sent is where the next session resumes: the main loop applies batches
//! in the order they were sent.

use super::channel::{CommandTx, FleetBatch, FleetCommand, SharedView};
use crate::server::{Work, WorkTx};
use api::fleet::{sled_ports_prefix, status_key, vpc_prefix, SledId, SledStatus, V2B_PREFIX};
use api::Vni;
use fleet::{
    Backoff, Change, Positions, Snapshot, Store, StoreConfig, StoreError, Watch, WatchEvent,
};
use std::collections::BTreeSet;
use std::io;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

/// The first wait before reconnecting, and the longest: 1,000 sleds that lost
/// the store together come back spread over up to half a minute.
const RECONNECT_FIRST: Duration = Duration::from_millis(250);
const RECONNECT_CAP: Duration = Duration::from_secs(30);

/// A session that lasted this long was a working connection: the next failure
/// starts the back-off from the beginning.
const STABLE_SESSION: Duration = Duration::from_secs(60);

/// The status key's lease, and how often its value is refreshed.
const STATUS_TTL: Duration = Duration::from_secs(30);
const STATUS_EVERY: Duration = Duration::from_secs(10);

/// The most changes in one batch: events ready at once go together (one save,
/// one V2B or port-table push), up to this many.
const MAX_BATCH: usize = 4096;

/// Where the watcher starts: the store, this sled, and where the saved fleet
/// layer is current at.
pub struct WatcherStart {
    pub store: StoreConfig,
    pub sled: SledId,
    pub positions: Positions,
    pub cluster_id: u64,
}

/// Starts the watcher's thread. It runs until the command channel closes (the
/// controller is gone: it revokes the status lease and ends) or the work channel
/// does (the main loop is gone). Returns the controller's end of the command
/// channel and the thread.
pub fn spawn(
    start: WatcherStart,
    work: WorkTx,
    view: SharedView,
) -> io::Result<(CommandTx, thread::JoinHandle<()>)> {
    let (commands_tx, commands) = unbounded_channel();
    let handle = thread::Builder::new().name("fleet".into()).spawn(move || {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "the fleet watcher cannot start its runtime");
                view.update(|v| v.last_error = Some(format!("no runtime: {e}")));
                return;
            }
        };
        let watcher = Watcher {
            cfg: start.store,
            sled: start.sled,
            positions: start.positions,
            cluster_id: start.cluster_id,
            vnis: BTreeSet::new(),
            resync: None,
            commands,
            work,
            view,
        };
        runtime.block_on(watcher.run());
    })?;
    Ok((commands_tx, handle))
}

/// How a session ended, other than by an error of the store.
#[derive(Debug)]
enum Ended {
    /// The daemon is stopping: the watcher ends.
    Stopped,
    Store(StoreError),
}

impl From<StoreError> for Ended {
    fn from(e: StoreError) -> Ended {
        Ended::Store(e)
    }
}

/// Why the next read must be a full one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Resync {
    ClusterChanged,
    RevisionBehind,
    Compacted,
    Asked,
}

impl Resync {
    fn as_str(self) -> &'static str {
        match self {
            Resync::ClusterChanged => "the store's cluster id changed",
            Resync::RevisionBehind => "the store's revision is behind the sled's",
            Resync::Compacted => "the store compacted revisions the sled had not read",
            Resync::Asked => "an operator asked",
        }
    }
}

struct Watcher {
    cfg: StoreConfig,
    sled: SledId,
    /// Every watched prefix's position, as sent to the main loop.
    positions: Positions,
    /// The cluster the positions belong to (0: none yet).
    cluster_id: u64,
    /// The VPCs the sled hosts ports in, as the controller last said.
    vnis: BTreeSet<Vni>,
    resync: Option<Resync>,
    commands: UnboundedReceiver<FleetCommand>,
    work: WorkTx,
    view: SharedView,
}

impl Watcher {
    async fn run(mut self) {
        // The controller says which VPCs to watch when it restores its state,
        // before anything else: the first session knows its prefixes.
        loop {
            match self.commands.recv().await {
                Some(FleetCommand::Vnis(v)) => {
                    self.vnis = v;
                    break;
                }
                Some(FleetCommand::Resync) => self.resync = Some(Resync::Asked),
                None => return,
            }
        }
        let mut backoff = Backoff::new(RECONNECT_FIRST, RECONNECT_CAP);
        loop {
            let began = Instant::now();
            let error = match self.session().await {
                Ok(()) | Err(Ended::Stopped) => return,
                Err(Ended::Store(e)) => e,
            };
            tracing::warn!(error = %error, "fleet store session ended; forwarding on the tables held");
            self.view.update(|v| {
                v.connected = false;
                v.last_error = Some(error.to_string());
            });
            if began.elapsed() >= STABLE_SESSION {
                backoff.reset();
            }
            if !self.wait(backoff.next_wait()).await {
                return;
            }
        }
    }

    /// Waits `wait` while taking the controller's commands; false when the
    /// controller is gone.
    async fn wait(&mut self, wait: Duration) -> bool {
        let until = tokio::time::Instant::now() + wait;
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(until) => return true,
                command = self.commands.recv() => match command {
                    Some(FleetCommand::Vnis(v)) => self.vnis = v,
                    Some(FleetCommand::Resync) => self.resync = Some(Resync::Asked),
                    None => return false,
                },
            }
        }
    }

    async fn session(&mut self) -> Result<(), Ended> {
        let mut store = Store::connect(&self.cfg).await?;
        let status = store.status().await?;
        self.view.update(|v| {
            v.endpoint = Some(store.endpoint().to_string());
            v.store_revision = status.revision;
        });
        let newest = self.positions.values().copied().max().unwrap_or(0);
        if self.cluster_id != 0 && status.cluster_id != self.cluster_id {
            self.resync = Some(Resync::ClusterChanged);
        } else if status.revision < newest {
            self.resync = Some(Resync::RevisionBehind);
        }
        let mut watch = self.start_watch(&mut store).await?;
        let mut lease = store
            .lease_key(status_key(&self.sled), self.status_value(), STATUS_TTL)
            .await?;
        self.view.update(|v| {
            v.connected = true;
            v.last_error = None;
            v.current_at = Some(Instant::now());
        });
        tracing::info!(
            endpoint = store.endpoint(),
            revision = status.revision,
            "fleet store connected"
        );
        let mut status_tick = tokio::time::interval(STATUS_EVERY);
        loop {
            tokio::select! {
                event = watch.next() => {
                    if !self.take(event?, &mut watch).await? {
                        self.resync = Some(Resync::Compacted);
                        watch = self.start_watch(&mut store).await?;
                    }
                }
                command = self.commands.recv() => match command {
                    Some(FleetCommand::Vnis(v)) => {
                        self.vnis = v;
                        self.follow(&mut store, &mut watch).await?;
                    }
                    Some(FleetCommand::Resync) => {
                        self.resync = Some(Resync::Asked);
                        watch = self.start_watch(&mut store).await?;
                    }
                    None => {
                        if let Err(e) = lease.revoke().await {
                            tracing::warn!(error = %e, "the fleet status key stays until its lease runs out");
                        }
                        return Ok(());
                    }
                },
                _ = status_tick.tick() => {
                    // A failed refresh is not worth a reconnect: the keeper
                    // puts the value again, and the watch says if the store went.
                    if let Err(e) = lease.update(self.status_value()).await {
                        tracing::warn!(error = %e, "the fleet status key is not refreshed");
                    }
                }
            }
        }
    }

    /// The prefixes the sled reads: its VPCs', V2B, its own.
    fn wanted(&self) -> Vec<String> {
        let mut p: Vec<String> = self.vnis.iter().map(|&v| vpc_prefix(v)).collect();
        p.push(V2B_PREFIX.to_string());
        p.push(sled_ports_prefix(&self.sled));
        p.sort();
        p
    }

    /// Reads what must be read (everything when a full resync is due, else the
    /// prefixes without a position) and watches every prefix from its position.
    async fn start_watch(&mut self, store: &mut Store) -> Result<Watch, Ended> {
        let wanted = self.wanted();
        self.positions.retain(|p, _| wanted.contains(p));
        if let Some(why) = self.resync {
            tracing::warn!(reason = why.as_str(), "fleet full resync");
            let snapshot = store.snapshot(&wanted).await?;
            // Counted before the batch goes, so whoever sees it sees the count.
            self.view.update(|v| v.resyncs += 1);
            self.resync = None;
            self.send_read(&wanted, snapshot)?;
        } else {
            let unread: Vec<String> = wanted
                .iter()
                .filter(|p| !self.positions.contains_key(*p))
                .cloned()
                .collect();
            if !unread.is_empty() {
                let snapshot = store.snapshot(&unread).await?;
                self.send_read(&unread, snapshot)?;
            }
        }
        Ok(store.watch(&self.positions).await?)
    }

    /// Follows the controller's VPCs on the live watch: a VPC left is no longer
    /// watched, a new one is read, then watched from after the read.
    async fn follow(&mut self, store: &mut Store, watch: &mut Watch) -> Result<(), Ended> {
        let wanted = self.wanted();
        let watched: Vec<String> = watch.positions().into_keys().collect();
        for gone in watched.iter().filter(|p| !wanted.contains(p)) {
            watch.remove_prefix(gone).await?;
            self.positions.remove(gone);
        }
        let new: Vec<String> = wanted
            .into_iter()
            .filter(|p| !watched.contains(p))
            .collect();
        if new.is_empty() {
            return Ok(());
        }
        let snapshot = store.snapshot(&new).await?;
        let revision = snapshot.revision;
        self.send_read(&new, snapshot)?;
        for p in &new {
            watch.add_prefix(p, revision).await?;
        }
        Ok(())
    }

    /// Sends a read of `prefixes` as a full-read batch.
    fn send_read(&mut self, prefixes: &[String], snapshot: Snapshot) -> Result<(), Ended> {
        let changes = snapshot
            .kvs
            .into_iter()
            .map(|kv| Change {
                key: kv.key,
                value: Some(kv.value),
                mod_revision: kv.mod_revision,
            })
            .collect();
        let positions = prefixes
            .iter()
            .map(|p| (p.clone(), snapshot.revision))
            .collect();
        self.send(FleetBatch {
            cluster_id: snapshot.cluster_id,
            changes,
            positions,
            full_read: true,
        })
    }

    /// Takes `first` and every event ready after it into one batch and sends it.
    /// False when the watch fell behind compaction (what came before it is sent).
    async fn take(&mut self, first: WatchEvent, watch: &mut Watch) -> Result<bool, Ended> {
        let mut batch = FleetBatch {
            cluster_id: watch.cluster_id(),
            changes: Vec::new(),
            positions: Positions::new(),
            full_read: false,
        };
        let mut event = first;
        let compacted = loop {
            match event {
                WatchEvent::Changes {
                    prefix,
                    revision,
                    changes,
                } => {
                    batch.changes.extend(changes);
                    batch.positions.insert(prefix, revision);
                }
                WatchEvent::Progress { prefix, revision } => {
                    batch.positions.insert(prefix, revision);
                }
                WatchEvent::Compacted {
                    prefix,
                    compact_revision,
                } => {
                    tracing::warn!(
                        prefix,
                        compact_revision,
                        "the fleet watch fell behind compaction"
                    );
                    break true;
                }
            }
            if batch.changes.len() >= MAX_BATCH {
                break false;
            }
            // Cancel-safe: a watch with nothing ready now loses nothing.
            match tokio::time::timeout(Duration::ZERO, watch.next()).await {
                Ok(next) => event = next?,
                Err(_) => break false,
            }
        };
        if !batch.positions.is_empty() {
            self.send(batch)?;
        }
        Ok(!compacted)
    }

    /// Hands a batch to the main loop and records where it leaves the prefixes.
    fn send(&mut self, batch: FleetBatch) -> Result<(), Ended> {
        let newest = batch.positions.values().copied().max().unwrap_or(0);
        let positions = batch.positions.clone();
        let cluster_id = batch.cluster_id;
        self.work
            .send(Work::Fleet(batch))
            .map_err(|_| Ended::Stopped)?;
        self.positions.extend(positions);
        self.cluster_id = cluster_id;
        self.view.update(|v| {
            v.store_revision = v.store_revision.max(newest);
            v.current_at = Some(Instant::now());
        });
        Ok(())
    }

    /// The sled's status key's value.
    fn status_value(&self) -> Vec<u8> {
        let view = self.view.get();
        let status = SledStatus {
            revision: self.positions.values().copied().min().unwrap_or(0),
            cluster_id: self.cluster_id,
            v2p: view.applied.v2p,
            v2b: view.applied.v2b,
            refused: view.refused,
            updated_unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        };
        serde_json::to_vec(&status).unwrap_or_default()
    }
}
