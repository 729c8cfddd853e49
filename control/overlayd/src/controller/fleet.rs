//! The fleet layer of the controller's tables (docs/fleet.md): what the fleet's
//! store says, beside what this sled configured itself, and how the two make what
//! the dataplane holds.
//!
//! - V2P: the union; a local mapping of the same (VNI, address) wins (it was set
//!   with `--override-fleet`, or before the fleet had one), and the fleet's comes
//!   back when it is cleared.
//! - V2B: the union of each prefix's endpoints.
//! - A port's routes and firewall rules: the fleet's when its keys exist for the
//!   port (the port is fleet-managed), else the local ones.
//!
//! Every value is checked with the API's own checks ([`FleetEntry::decode`]) before
//! it is applied; a refused key is recorded with its revision and reason, counted,
//! and not tried again until the key changes. Nothing but an explicit delete from
//! the store (an event, or a full read that lacks the key) removes an entry: a
//! disconnect or an error never does. The layer is saved beside the state
//! (`fleet.json`) with each watched prefix's position, so a restart forwards on it
//! at once and resumes watching from there. Saving the whole layer after every
//! batch would rewrite megabytes many times a second under churn, so it is saved
//! at most once a second while entries change (spaced further for a layer whose
//! save takes long), and once a minute while only positions move (a crash then
//! replays a little from the store, which is harmless: a replayed change puts the
//! value the key had).

use super::state::{State, StateError, StateStore};
use super::{ControlError, Controller, Dataplane};
use crate::fleet::channel::{CommandTx, FleetBatch, FleetCommand, SharedView};
use api::fleet::{EntryError, FleetCounts, FleetEntry, FleetKey, FleetStatus, RefusedKey, SledId};
use api::{FwRule, RouteEntry, Source, V2bEntry, V2pEntry, V2pRecord, Vni};
use fleet::{Change, Positions};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// The file of the fleet layer in the state directory.
const FLEET_FILE: &str = "fleet.json";

/// Its format; a daemon refuses (and keeps) a file of another.
const FLEET_FORMAT: u32 = 1;

/// How long changed entries may go unsaved, at least.
const SAVE_ENTRIES_EVERY: Duration = Duration::from_secs(1);

/// Saves are spaced by this many times what the last one took, so that a large
/// layer under churn costs the main loop a tenth of its time at most (100,000
/// mappings take 0.16-0.3 s to save here: one save every 2-3 s).
const SAVE_SPACING: u32 = 10;

/// How long moved positions may go unsaved when no entry changed: a restart then
/// resumes a little further back, still well ahead of any sane compaction.
const SAVE_POSITIONS_EVERY: Duration = Duration::from_secs(60);

/// What the store says, as this sled holds it.
#[derive(Debug, Default)]
pub struct FleetLayer {
    /// Each watched prefix, and the store revision up to which the layer has
    /// everything under it.
    positions: Positions,
    cluster_id: u64,
    /// Every key held, by key.
    entries: BTreeMap<String, Held>,
    refused: BTreeMap<String, Refused>,
    /// Why batches are not obeyed now (an empty store of another cluster), until
    /// an operator adopts the store.
    held: Option<String>,
    /// The operator adopted the store: the next full read is taken as it is.
    adopt: bool,
    alarms: u64,
    /// Refusals by reason since the daemon started (`overlayd_fleet_refused_total`).
    refusals: BTreeMap<String, u64>,
    /// How many entries of each kind are held.
    counts: FleetCounts,
    /// What changed since the layer was last saved.
    unsaved: Unsaved,
    saved_at: Option<Instant>,
    /// How long the last save took.
    save_took: Duration,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
enum Unsaved {
    #[default]
    Nothing,
    Positions,
    Entries,
}

#[derive(Debug)]
struct Held {
    entry: FleetEntry,
    mod_revision: i64,
}

#[derive(Debug)]
struct Refused {
    mod_revision: i64,
    reason: String,
    message: String,
}

/// `fleet.json`.
#[derive(Serialize, Deserialize)]
struct FleetFile {
    format: u32,
    positions: Positions,
    cluster_id: u64,
    entries: Vec<SavedEntry>,
    #[serde(default)]
    refused: Vec<RefusedKey>,
}

#[derive(Serialize, Deserialize)]
struct SavedEntry {
    key: String,
    mod_revision: i64,
    value: serde_json::Value,
}

/// The fleet's side of the controller: the layer, where it is saved, and the
/// watcher it talks to.
#[derive(Debug, Default)]
pub struct Fleet {
    pub(super) layer: FleetLayer,
    sled: Option<SledId>,
    watcher: Option<CommandTx>,
    view: Option<SharedView>,
    /// The VPCs last told to the watcher; `None` until first told (the watcher
    /// waits for it before it connects).
    watched: Option<BTreeSet<Vni>>,
}

impl FleetLayer {
    /// Where the layer is current at, prefix by prefix, and its cluster: where a
    /// watcher resumes.
    pub fn position(&self) -> (Positions, u64) {
        (self.positions.clone(), self.cluster_id)
    }

    /// The store revision up to which the layer has everything it watches (0:
    /// never read): the lowest position.
    pub fn revision(&self) -> i64 {
        self.positions.values().copied().min().unwrap_or(0)
    }

    fn v2p(&self) -> impl Iterator<Item = &V2pEntry> {
        self.entries.values().filter_map(|h| match &h.entry {
            FleetEntry::V2p(e) => Some(e),
            _ => None,
        })
    }

    fn v2p_of(&self, vni: Vni, ip: IpAddr) -> Option<&V2pEntry> {
        let key = api::fleet::v2p_key(vni, ip);
        match self.entries.get(&key).map(|h| &h.entry) {
            Some(FleetEntry::V2p(e)) => Some(e),
            _ => None,
        }
    }

    fn v2b(&self) -> impl Iterator<Item = &V2bEntry> {
        self.entries.values().filter_map(|h| match &h.entry {
            FleetEntry::V2b(e) => Some(e),
            _ => None,
        })
    }

    pub(super) fn has_v2b(&self) -> bool {
        self.v2b().next().is_some()
    }

    /// The fleet's routing table of port `port`, if the port is fleet-managed.
    pub(super) fn routes(&self, port: &str) -> Option<&[RouteEntry]> {
        self.entries.values().find_map(|h| match &h.entry {
            FleetEntry::Routes { port: p, routes } if p == port => Some(routes.as_slice()),
            _ => None,
        })
    }

    /// The fleet's firewall rules of port `port`, each with its position as its id.
    pub(super) fn firewall(&self, port: &str) -> Option<Vec<FwRule>> {
        self.entries.values().find_map(|h| match &h.entry {
            FleetEntry::Firewall { port: p, rules } if p == port => Some(numbered(rules)),
            _ => None,
        })
    }

    /// Holds `held` under `key`, keeping the counts (a batch must not cost a
    /// walk over a hundred thousand entries to count them).
    fn hold(&mut self, key: String, held: Held) {
        *tally(&mut self.counts, &held.entry) += 1;
        if let Some(old) = self.entries.insert(key, held) {
            *tally(&mut self.counts, &old.entry) -= 1;
        }
    }

    fn release(&mut self, key: &str) -> Option<Held> {
        let old = self.entries.remove(key)?;
        *tally(&mut self.counts, &old.entry) -= 1;
        Some(old)
    }

    fn refuse(&mut self, key: &str, mod_revision: i64, reason: &str, message: String) {
        tracing::warn!(key, mod_revision, reason, %message, "fleet entry refused");
        *self.refusals.entry(reason.to_string()).or_default() += 1;
        self.refused.insert(
            key.to_string(),
            Refused {
                mod_revision,
                reason: reason.to_string(),
                message,
            },
        );
    }

    fn to_file(&self) -> FleetFile {
        FleetFile {
            format: FLEET_FORMAT,
            positions: self.positions.clone(),
            cluster_id: self.cluster_id,
            entries: self
                .entries
                .iter()
                .map(|(key, h)| SavedEntry {
                    key: key.clone(),
                    mod_revision: h.mod_revision,
                    value: h.entry.value(),
                })
                .collect(),
            refused: self.refused_keys(),
        }
    }

    fn refused_keys(&self) -> Vec<RefusedKey> {
        self.refused
            .iter()
            .map(|(key, r)| RefusedKey {
                key: key.clone(),
                mod_revision: r.mod_revision,
                reason: r.reason.clone(),
                message: r.message.clone(),
            })
            .collect()
    }

    /// The layer a saved file holds; its entries are checked again (a file edited
    /// by hand gets no pass), and those that fail are dropped with a warning.
    fn from_file(file: FleetFile) -> FleetLayer {
        let mut layer = FleetLayer {
            positions: file.positions,
            cluster_id: file.cluster_id,
            ..FleetLayer::default()
        };
        for r in file.refused {
            layer.refused.insert(
                r.key,
                Refused {
                    mod_revision: r.mod_revision,
                    reason: r.reason,
                    message: r.message,
                },
            );
        }
        for e in file.entries {
            let decoded = FleetKey::parse(&e.key)
                .map_err(EntryError::from)
                .and_then(|k| {
                    let bytes = serde_json::to_vec(&e.value).unwrap_or_default();
                    FleetEntry::decode(&k, &bytes)
                });
            match decoded {
                Ok(entry) => layer.hold(
                    e.key,
                    Held {
                        entry,
                        mod_revision: e.mod_revision,
                    },
                ),
                Err(error) => {
                    tracing::warn!(key = %e.key, %error, "saved fleet entry dropped");
                }
            }
        }
        layer
    }
}

/// The count of `entry`'s kind.
fn tally<'a>(counts: &'a mut FleetCounts, entry: &FleetEntry) -> &'a mut usize {
    match entry {
        FleetEntry::V2p(_) => &mut counts.v2p,
        FleetEntry::V2b(_) => &mut counts.v2b,
        FleetEntry::Routes { .. } => &mut counts.routes,
        FleetEntry::Firewall { .. } => &mut counts.firewall,
    }
}

/// Fleet rules numbered by their position: the ids `dump-layer` shows.
fn numbered(rules: &[FwRule]) -> Vec<FwRule> {
    (1..)
        .zip(rules)
        .map(|(id, r)| FwRule { id, ..r.clone() })
        .collect()
}

impl StateStore {
    /// The saved fleet layer; an empty one when there is none yet.
    pub fn load_fleet(&self) -> Result<FleetLayer, StateError> {
        let file: Option<FleetFile> = self.read(FLEET_FILE)?;
        match file {
            None => Ok(FleetLayer::default()),
            Some(f) if f.format != FLEET_FORMAT => Err(StateError::Format {
                path: self.dir().join(FLEET_FILE),
                format: f.format,
            }),
            Some(f) => Ok(FleetLayer::from_file(f)),
        }
    }

    fn save_fleet(&self, layer: &FleetLayer) -> Result<(), StateError> {
        self.write(FLEET_FILE, &layer.to_file())
    }
}

/// The VPCs the ports of `state` are in: the prefixes a sled watches.
fn hosted_vnis(state: &State) -> BTreeSet<Vni> {
    state.ports.iter().map(|p| p.config.vni).collect()
}

impl<D: Dataplane> Controller<D> {
    /// Makes this controller a member of a fleet: sled `sled`, its layer restored
    /// from `layer` (applied by [`Controller::restore`]), its watcher reached with
    /// `watcher`, its connection shown from `view`. Returns the VPCs to watch.
    pub fn join_fleet(
        &mut self,
        sled: SledId,
        layer: FleetLayer,
        watcher: CommandTx,
        view: SharedView,
    ) {
        self.fleet = Fleet {
            layer,
            sled: Some(sled),
            watcher: Some(watcher),
            view: Some(view),
            watched: None,
        };
    }

    /// Puts the restored fleet layer's V2P mappings into the dataplane (those no
    /// local mapping overrides), in one batch; the V2B table and the ports'
    /// tables take the layer into account by themselves.
    pub(super) fn restore_fleet(&mut self) {
        let batch: Vec<V2pEntry> = self
            .fleet
            .layer
            .v2p()
            .filter(|e| !self.local_v2p(e.vni, e.vpc_ip))
            .copied()
            .collect();
        if batch.is_empty() {
            return;
        }
        if let Err(e) = self.dp.add_v2p_batch(&batch) {
            tracing::error!(error = %e, mappings = batch.len(), "the saved fleet mappings are not applied");
        }
        tracing::info!(
            mappings = batch.len(),
            revision = self.fleet.layer.revision(),
            "fleet layer restored"
        );
    }

    fn local_v2p(&self, vni: Vni, ip: IpAddr) -> bool {
        self.state
            .v2p
            .iter()
            .any(|e| e.vni == vni && e.vpc_ip == ip)
    }

    /// Applies a batch of the store's changes (docs/fleet.md, "Sync").
    pub fn apply_fleet(&mut self, batch: FleetBatch) {
        let layer = &mut self.fleet.layer;
        let other_cluster = layer.cluster_id != 0 && batch.cluster_id != layer.cluster_id;
        if batch.full_read {
            if other_cluster
                && batch.changes.is_empty()
                && !layer.entries.is_empty()
                && !layer.adopt
            {
                let why = format!(
                    "the store of cluster {:x} is empty, and this sled holds {} entries of cluster {:x}: \
                     kept until an operator runs `xdeadm fleet adopt`",
                    batch.cluster_id,
                    layer.entries.len(),
                    layer.cluster_id
                );
                if layer.held.is_none() {
                    layer.alarms += 1;
                    tracing::error!(%why, "fleet store not obeyed");
                }
                layer.held = Some(why);
                return;
            }
            layer.held = None;
            layer.adopt = false;
        } else if layer.held.is_some() {
            // Events of a store not adopted yet: the layer stays as it was.
            return;
        }
        let mut changes = batch.changes;
        if batch.full_read {
            let read_at = batch.positions.values().copied().max().unwrap_or(0);
            let present: BTreeSet<&str> = changes.iter().map(|c| c.key.as_str()).collect();
            let under = |k: &String| batch.positions.keys().any(|p| k.starts_with(p.as_str()));
            let gone: Vec<String> = layer
                .entries
                .keys()
                .filter(|k| under(k) && !present.contains(k.as_str()))
                .cloned()
                .collect();
            layer
                .refused
                .retain(|k, _| !under(k) || present.contains(k.as_str()));
            changes.extend(gone.into_iter().map(|key| Change {
                key,
                value: None,
                mod_revision: read_at,
            }));
        }
        let mut v2b_changed = false;
        let mut ports_changed = BTreeSet::new();
        let n_changes = changes.len();
        let unsaved = if changes.is_empty() {
            Unsaved::Positions
        } else {
            Unsaved::Entries
        };
        for c in changes {
            self.apply_fleet_change(c, &mut v2b_changed, &mut ports_changed);
        }
        if v2b_changed {
            self.push_v2b();
        }
        for port in ports_changed {
            self.push_port_tables(&port);
        }
        let layer = &mut self.fleet.layer;
        tracing::debug!(
            changes = n_changes,
            full_read = batch.full_read,
            revision = batch.positions.values().copied().max().unwrap_or(0),
            "fleet batch applied"
        );
        for (prefix, revision) in batch.positions {
            let at = layer.positions.entry(prefix).or_default();
            *at = (*at).max(revision);
        }
        layer.cluster_id = batch.cluster_id;
        layer.unsaved = layer.unsaved.max(unsaved);
        if let Some(view) = &self.fleet.view {
            let (applied, refused) = (layer.counts, layer.refused.len());
            view.update(|v| {
                v.applied = applied;
                v.refused = refused;
            });
        }
        self.save_fleet_due(Instant::now());
    }

    fn apply_fleet_change(
        &mut self,
        c: Change,
        v2b_changed: &mut bool,
        ports_changed: &mut BTreeSet<String>,
    ) {
        let layer = &mut self.fleet.layer;
        let Some(bytes) = c.value else {
            layer.refused.remove(&c.key);
            if let Some(old) = layer.release(&c.key) {
                self.unapply(&old.entry, v2b_changed, ports_changed);
            }
            return;
        };
        if layer
            .refused
            .get(&c.key)
            .is_some_and(|r| r.mod_revision == c.mod_revision)
        {
            return;
        }
        let decoded = FleetKey::parse(&c.key)
            .map_err(EntryError::from)
            .and_then(|k| match k {
                // A sled's status is its own, not configuration.
                FleetKey::Status { .. } => Ok(None),
                k => FleetEntry::decode(&k, &bytes).map(Some),
            });
        let entry = match decoded {
            Ok(Some(entry)) => entry,
            Ok(None) => return,
            Err(e) => {
                layer.refuse(&c.key, c.mod_revision, e.reason(), e.to_string());
                return;
            }
        };
        if let FleetEntry::V2p(e) = &entry {
            if !self.local_v2p(e.vni, e.vpc_ip) {
                if let Err(err) = self.dp.set_v2p(e) {
                    let layer = &mut self.fleet.layer;
                    layer.refuse(&c.key, c.mod_revision, "dataplane", err.to_string());
                    return;
                }
            }
        }
        match &entry {
            FleetEntry::V2p(_) => {}
            FleetEntry::V2b(_) => *v2b_changed = true,
            FleetEntry::Routes { port, .. } | FleetEntry::Firewall { port, .. } => {
                ports_changed.insert(port.clone());
            }
        }
        let layer = &mut self.fleet.layer;
        layer.refused.remove(&c.key);
        layer.hold(
            c.key,
            Held {
                entry,
                mod_revision: c.mod_revision,
            },
        );
    }

    /// Takes an entry the fleet no longer has out of the dataplane (a V2P mapping a
    /// local one does not override), or marks what must be recomputed.
    fn unapply(
        &mut self,
        old: &FleetEntry,
        v2b_changed: &mut bool,
        ports_changed: &mut BTreeSet<String>,
    ) {
        match old {
            FleetEntry::V2p(e) if !self.local_v2p(e.vni, e.vpc_ip) => {
                if let Err(err) = self.dp.clear_v2p(e.vpc_ip, e.vni) {
                    tracing::warn!(vpc_ip = %e.vpc_ip, vni = %e.vni, error = %err, "fleet mapping not cleared");
                }
            }
            FleetEntry::V2p(_) => {}
            FleetEntry::V2b(_) => *v2b_changed = true,
            FleetEntry::Routes { port, .. } | FleetEntry::Firewall { port, .. } => {
                ports_changed.insert(port.clone());
            }
        }
    }

    /// The V2B table in force: the local table with the fleet's endpoints added.
    pub(super) fn v2b_in_force(&self, local: &[V2bEntry]) -> Result<engine::V2b, ControlError> {
        let mut table = super::v2b_table(local)?;
        for e in self.fleet.layer.v2b() {
            table.set(e.prefix, &e.endpoints)?;
        }
        Ok(table)
    }

    fn push_v2b(&mut self) {
        let result = self
            .v2b_in_force(&self.state.v2b)
            .and_then(|t| Ok(self.dp.set_v2b(&t)?));
        if let Err(e) = result {
            tracing::error!(error = %e, "the fleet's V2B table is not applied");
        }
    }

    /// Gives an applied port the tables in force now (the fleet's, or its own).
    pub(super) fn push_port_tables(&mut self, port: &str) {
        if self.port(port).is_err() || self.unapplied_ports.contains_key(port) {
            return;
        }
        let tables = super::tables_in_force(&self.state, &self.fleet.layer, port);
        let routes = tables.routes.unwrap_or_default();
        let result = self
            .dp
            .set_routes(port, &routes)
            .and_then(|()| self.dp.set_fw_rules(port, &tables.fw_rules));
        if let Err(e) = result {
            tracing::error!(port, error = %e, "the fleet's tables of the port are not applied");
        }
    }

    /// Writes the fleet layer beside the state if what changed has waited long
    /// enough (see the module's doc); the main loop calls it on every round.
    pub fn save_fleet_due(&mut self, now: Instant) {
        let layer = &self.fleet.layer;
        let wait = match layer.unsaved {
            Unsaved::Nothing => return,
            Unsaved::Positions => SAVE_POSITIONS_EVERY,
            Unsaved::Entries => SAVE_ENTRIES_EVERY.max(layer.save_took * SAVE_SPACING),
        };
        if layer
            .saved_at
            .is_none_or(|t| now.saturating_duration_since(t) >= wait)
        {
            self.save_fleet(now);
        }
    }

    /// Writes the fleet layer now if anything changed (a clean stop).
    pub fn flush_fleet(&mut self) {
        if self.fleet.layer.unsaved != Unsaved::Nothing {
            self.save_fleet(Instant::now());
        }
    }

    /// Writes the fleet layer beside the state; a failure is logged and shown by
    /// `stats` (the layer in force is kept; the next round tries again).
    fn save_fleet(&mut self, now: Instant) {
        let Some(store) = &self.store else {
            return;
        };
        let began = Instant::now();
        match store.save_fleet(&self.fleet.layer) {
            Ok(()) => {
                let layer = &mut self.fleet.layer;
                layer.unsaved = Unsaved::Nothing;
                layer.saved_at = Some(now);
                layer.save_took = began.elapsed();
            }
            Err(e) => {
                tracing::error!(error = %e, "the fleet layer cannot be saved");
                self.save_error = Some(e);
            }
        }
    }

    /// Tells the watcher the VPCs to watch when they changed, and forgets the
    /// mappings of VPCs this sled no longer hosts (nothing here sends to them).
    pub fn follow_hosted_vnis(&mut self) {
        let Some(watcher) = &self.fleet.watcher else {
            return;
        };
        let vnis = hosted_vnis(&self.state);
        if self.fleet.watched.as_ref() == Some(&vnis) {
            return;
        }
        if watcher.send(FleetCommand::Vnis(vnis.clone())).is_err() {
            tracing::error!("the fleet watcher has stopped");
        }
        let gone: Vec<(String, V2pEntry)> = self
            .fleet
            .layer
            .entries
            .iter()
            .filter_map(|(k, h)| match &h.entry {
                FleetEntry::V2p(e) if !vnis.contains(&e.vni) => Some((k.clone(), *e)),
                _ => None,
            })
            .collect();
        for (key, e) in gone {
            self.fleet.layer.release(&key);
            if !self.local_v2p(e.vni, e.vpc_ip) {
                let _ = self.dp.clear_v2p(e.vpc_ip, e.vni);
            }
        }
        let wanted: BTreeSet<String> = vnis.iter().map(|&v| api::fleet::vpc_prefix(v)).collect();
        let layer = &mut self.fleet.layer;
        layer
            .positions
            .retain(|p, _| !p.starts_with(api::fleet::VPC_ROOT) || wanted.contains(p));
        layer.unsaved = Unsaved::Entries;
        self.fleet.watched = Some(vnis);
    }

    /// `fleet resync` and `fleet adopt`.
    pub(super) fn fleet_command(&mut self, adopt: bool) -> Result<(), ControlError> {
        let Some(watcher) = &self.fleet.watcher else {
            return Err(ControlError::NoFleet);
        };
        watcher
            .send(FleetCommand::Resync)
            .map_err(|_| ControlError::FleetStopped)?;
        if adopt {
            self.fleet.layer.adopt = true;
        }
        Ok(())
    }

    /// `fleet status`.
    pub(super) fn fleet_status(&self, now: Instant) -> FleetStatus {
        let layer = &self.fleet.layer;
        let view = self
            .fleet
            .view
            .as_ref()
            .map(SharedView::get)
            .unwrap_or_default();
        FleetStatus {
            enabled: self.fleet.watcher.is_some(),
            sled: self.fleet.sled.clone(),
            connected: view.connected,
            endpoint: view.endpoint,
            revision: layer.revision(),
            store_revision: view.store_revision,
            cluster_id: layer.cluster_id,
            lag_seconds: view
                .current_at
                .map(|t| now.saturating_duration_since(t).as_secs_f64()),
            resyncs: view.resyncs,
            alarms: layer.alarms,
            held: layer.held.clone(),
            vnis: self.fleet.watched.iter().flatten().copied().collect(),
            entries: layer.counts,
            refused: layer.refused_keys(),
            last_error: view.last_error,
        }
    }

    /// The fleet's figures for `stats` (and so the metrics).
    pub(super) fn fleet_stats(&self, now: Instant) -> serde_json::Value {
        let status = self.fleet_status(now);
        serde_json::json!({
            "enabled": status.enabled,
            "connected": status.connected,
            "revision": status.revision,
            "lag_seconds": status.lag_seconds,
            "resyncs": status.resyncs,
            "alarms": status.alarms,
            "refused": self.fleet.layer.refusals,
            "entries": status.entries,
        })
    }

    /// Every V2P mapping in force, local and fleet, for `dump-v2p`.
    pub(super) fn v2p_records(&self) -> Vec<V2pRecord> {
        let local = self.state.v2p.iter().map(|&entry| V2pRecord {
            entry,
            source: Source::Local,
            overridden: false,
        });
        let fleet = self.fleet.layer.v2p().map(|&entry| V2pRecord {
            entry,
            source: Source::Fleet,
            overridden: self.local_v2p(entry.vni, entry.vpc_ip),
        });
        local.chain(fleet).collect()
    }

    /// Refuses a local change of V2P mapping (`vni`, `ip`) that the fleet has,
    /// unless the operator overrides it.
    pub(super) fn check_fleet_v2p(
        &self,
        vni: Vni,
        ip: IpAddr,
        override_fleet: bool,
    ) -> Result<(), ControlError> {
        match self.fleet.layer.v2p_of(vni, ip) {
            Some(_) if !override_fleet => Err(ControlError::FleetOwned {
                what: format!("the V2P mapping of {ip} in VNI {vni}"),
                key: api::fleet::v2p_key(vni, ip),
            }),
            _ => Ok(()),
        }
    }

    /// The fleet's mapping of (`vni`, `ip`), which a cleared local one uncovers.
    pub(super) fn fleet_v2p(&self, vni: Vni, ip: IpAddr) -> Option<V2pEntry> {
        self.fleet.layer.v2p_of(vni, ip).copied()
    }

    /// Refuses a local change of a table of port `port` that the fleet manages.
    pub(super) fn check_fleet_table(
        &self,
        port: &str,
        table: api::fleet::PortTable,
    ) -> Result<(), ControlError> {
        let managed = match table {
            api::fleet::PortTable::Routes => self.fleet.layer.routes(port).is_some(),
            api::fleet::PortTable::Firewall => self.fleet.layer.firewall(port).is_some(),
        };
        match (managed, &self.fleet.sled) {
            (true, Some(sled)) => Err(ControlError::FleetOwned {
                what: format!("the {table} of port {port:?}"),
                key: api::fleet::port_key(sled, port, table),
            }),
            _ => Ok(()),
        }
    }
}
