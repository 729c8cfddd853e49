//! Request handling: checks each API request, applies it to the dataplane, records it
//! in the persisted state, and answers; and the restore of the saved state at start.
//!
//! The rule every verb follows: a refused request changes nothing. Requests are first
//! checked against the current state (unknown port, duplicate entry), then applied to
//! the dataplane (which may refuse too: the engine checks e.g. the port MTU against
//! the underlay), and only then recorded and saved. When saving fails the dataplane
//! change is undone, so the running daemon never holds configuration that would be
//! lost on restart.
//!
//! Restore goes the other way: the saved state is the truth and is never shortened.
//! It goes into the dataplane without being rewritten item by item; what the
//! dataplane refuses at start (a guest namespace not there yet, an underlay whose
//! MTU is still 1500) stays in the state, is shown as not applied (`list-ports`,
//! `stats`) and is tried again ([`Controller::retry_due`]).
//!
//! Its rooms: [`dispatch`] carries out each request, [`inspect`] answers the
//! questions, [`checks`] refuses what cannot be, [`state`] is the persisted state,
//! [`unapplied`] what is saved but waits to be retried; the [`Dataplane`] it drives
//! is the workers' (or, in tests, a recorder's).

mod checks;
mod dataplane;
mod dispatch;
mod error;
pub mod fleet;
mod inspect;
mod migrate;
pub mod state;
mod tap_queue;
mod unapplied;

pub use dataplane::{Dataplane, DataplaneError, Inspect, PortTables};
pub use error::ControlError;
pub use fleet::FleetLayer;
pub use migrate::MoveError;

use crate::convert::ToEngine;
use crate::server::ApiCounters;
use api::{Outcome, PortInfo, Reply, Request, V2bEntry, V2pEntry, Vni};
use checks::check_port;
use engine::V2b;
use state::{State, StateError, StateStore};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;
use unapplied::Retry;

/// Says whether a network namespace of that name exists now.
type NetnsProbe = Box<dyn Fn(&str) -> bool + Send>;

/// `ip netns` keeps its namespaces as files under /run/netns.
fn netns_exists(name: &str) -> bool {
    dpio::netns::netns_path(name).is_ok_and(|p| p.exists())
}

/// The state of the control plane and the dataplane it drives.
pub struct Controller<D: Dataplane> {
    dp: D,
    state: State,
    /// Absent in tests that do not persist.
    store: Option<StateStore>,
    /// Saved ports the dataplane does not hold, by name.
    unapplied_ports: BTreeMap<String, Retry>,
    /// Saved V2P mappings the dataplane does not hold.
    unapplied_v2p: BTreeMap<(Vni, IpAddr), Retry>,
    /// Why the last save failed; cleared by the next one that works.
    save_error: Option<StateError>,
    netns_exists: NetnsProbe,
    /// Reads the taps in guests' namespaces for `stats`; started on first use (a
    /// controller whose ports have no namespace never needs it).
    netns_visitor: tap_queue::VisitorCell,
    /// The API server's counters, shown by `stats`.
    api: Option<Arc<ApiCounters>>,
    /// What the fleet's store says, when the daemon is a member of a fleet.
    fleet: fleet::Fleet,
}

/// A saved port's tables as saved: the whole routing table (no entry means an empty
/// table, the engine's default routes deleted) and the firewall rules.
fn saved_tables(state: &State, port: &str) -> PortTables {
    PortTables {
        routes: Some(state.routes.get(port).cloned().unwrap_or_default()),
        fw_rules: state.fw_rules.get(port).cloned().unwrap_or_default(),
        paused: state.paused.contains(port),
    }
}

/// A saved port's tables in force: the fleet's where it manages them
/// (docs/fleet.md), the saved ones otherwise.
fn tables_in_force(state: &State, fleet: &FleetLayer, port: &str) -> PortTables {
    let saved = saved_tables(state, port);
    PortTables {
        routes: fleet.routes(port).map(<[_]>::to_vec).or(saved.routes),
        fw_rules: fleet.firewall(port).unwrap_or(saved.fw_rules),
        paused: saved.paused,
    }
}

/// Records a port's table in `tables`, or forgets it when empty (the file keeps no
/// empty lists).
fn put_table<T>(tables: &mut BTreeMap<String, Vec<T>>, port: &str, table: Vec<T>) {
    if table.is_empty() {
        tables.remove(port);
    } else {
        tables.insert(port.to_string(), table);
    }
}

/// The engine's V2B table holding `entries`: opteadm's semantics of `set-v2b` and
/// `clear-v2b` are the engine's table's.
fn v2b_table(entries: &[V2bEntry]) -> Result<V2b, ControlError> {
    V2b::from_entries(&entries.to_engine()).map_err(ControlError::V2b)
}

fn v2p_key(e: &V2pEntry) -> (Vni, IpAddr) {
    (e.vni, e.vpc_ip)
}

impl<D: Dataplane> Controller<D> {
    pub fn new(dp: D, store: Option<StateStore>) -> Self {
        Controller {
            dp,
            state: State::default(),
            store,
            unapplied_ports: BTreeMap::new(),
            unapplied_v2p: BTreeMap::new(),
            save_error: None,
            netns_exists: Box::new(netns_exists),
            netns_visitor: std::sync::OnceLock::new(),
            api: None,
            fleet: fleet::Fleet::default(),
        }
    }

    /// Tests decide which namespaces exist.
    #[cfg(test)]
    fn with_netns_probe(mut self, probe: impl Fn(&str) -> bool + Send + 'static) -> Self {
        self.netns_exists = Box::new(probe);
        self
    }

    /// Shows the API server's counters in `stats`.
    pub fn set_api_counters(&mut self, counters: Arc<ApiCounters>) {
        self.api = Some(counters);
    }

    pub fn dataplane(&self) -> &D {
        &self.dp
    }

    pub fn dataplane_mut(&mut self) -> &mut D {
        &mut self.dp
    }

    pub fn state(&self) -> &State {
        &self.state
    }

    /// Puts a saved state into the dataplane and keeps all of it: each port with
    /// its saved routes and firewall rules in one step, then the V2P mappings in one
    /// batch. What the dataplane refuses stays in the state, marked not applied, and
    /// is retried by [`Controller::retry_due`]. Nothing is written on the way; the
    /// state is saved once at the end, and should that fail (a read-only state
    /// directory) the error is logged and shown by `stats` while the restored
    /// dataplane keeps running.
    pub fn restore(&mut self, saved: State, now: Instant) {
        self.state = saved;
        // Rules saved before rules had ids get them: their positions, the ids
        // rm-fw-rule took then.
        self.state.assign_missing_fw_rule_ids();
        let names: Vec<String> = self
            .state
            .ports
            .iter()
            .map(|p| p.config.name.clone())
            .collect();
        for name in &names {
            self.try_port(name, now);
        }
        self.try_v2p(now, |_| true);
        self.restore_fleet();
        // A fresh dataplane holds the shorthand alone: only a saved table is news.
        // Refused only for a hand-edited file: kept in the state and logged, never
        // half applied.
        if !self.state.v2b.is_empty() || self.fleet.layer.has_v2b() {
            let v2b = self
                .v2b_in_force(&self.state.v2b)
                .and_then(|t| Ok(self.dp.set_v2b(&t)?));
            if let Err(e) = v2b {
                tracing::error!(error = %e, "the saved V2B table is not applied");
            }
        }
        self.follow_hosted_vnis();
        tracing::info!(
            ports = self.state.ports.len(),
            ports_not_applied = self.unapplied_ports.len(),
            v2p = self.state.v2p.len(),
            v2p_not_applied = self.unapplied_v2p.len(),
            "state restored"
        );
        let state = self.state.clone();
        if let Err(e) = self.save(&state) {
            tracing::error!(
                error = %e,
                "the restored state cannot be saved: the dataplane runs as restored, \
                 and every change will be refused until the state directory is writable"
            );
        }
    }

    /// Tries again the saved items whose back-off has run out, and at once a port
    /// whose network namespace has appeared since its last attempt. Cheap when
    /// nothing waits: the daemon calls it every time round its main loop.
    pub fn retry_due(&mut self, now: Instant) {
        let ports: Vec<String> = self
            .unapplied_ports
            .iter()
            .filter(|(name, r)| r.is_due(now) || r.netns_appeared(self.netns_present(name)))
            .map(|(name, _)| name.clone())
            .collect();
        for name in &ports {
            self.try_port(name, now);
        }
        let due: BTreeSet<(Vni, IpAddr)> = self
            .unapplied_v2p
            .iter()
            .filter(|(_, r)| r.is_due(now))
            .map(|(k, _)| *k)
            .collect();
        if !due.is_empty() {
            self.try_v2p(now, |e| due.contains(&v2p_key(e)));
        }
    }

    /// Whether saved port `name` goes into a namespace that exists now.
    fn netns_present(&self, name: &str) -> bool {
        self.port(name)
            .ok()
            .and_then(|p| p.netns.as_deref())
            .is_some_and(|ns| (self.netns_exists)(ns))
    }

    /// Puts saved port `name` into the dataplane with its saved tables, and records
    /// whether that worked. Its name and MAC are checked against the ports saved
    /// before it only, so of two colliding entries in a hand-edited file the first
    /// one still comes up.
    fn try_port(&mut self, name: &str, now: Instant) {
        let Some(i) = self.state.ports.iter().position(|p| p.config.name == name) else {
            self.unapplied_ports.remove(name);
            return;
        };
        let port = &self.state.ports[i];
        let result = check_port(&self.state.ports[..i], port)
            .map_err(ControlError::from)
            .and_then(|()| {
                let tables = tables_in_force(&self.state, &self.fleet.layer, name);
                Ok(self.dp.add_port(port, &tables)?)
            });
        match result {
            Ok(()) => {
                if let Some(r) = self.unapplied_ports.remove(name) {
                    tracing::info!(port = name, after = r.reason(), "port applied on retry");
                }
            }
            Err(e) => {
                tracing::warn!(port = name, error = %e, "port not applied; it will be retried");
                let seen = self.netns_present(name);
                let previous = self.unapplied_ports.get(name);
                let retry = Retry::after(previous, &e, now, seen);
                self.unapplied_ports.insert(name.to_string(), retry);
            }
        }
    }

    /// Puts the saved V2P mappings that `select` picks into the dataplane in one
    /// batch, and records which are not applied.
    fn try_v2p(&mut self, now: Instant, select: impl Fn(&V2pEntry) -> bool) {
        let mut batch = Vec::new();
        for e in self.state.v2p.iter().filter(|e| select(e)) {
            match e.validate() {
                Ok(()) => batch.push(*e),
                Err(reason) => {
                    let key = v2p_key(e);
                    let retry = Retry::after(self.unapplied_v2p.get(&key), &reason, now, false);
                    self.unapplied_v2p.insert(key, retry);
                }
            }
        }
        if batch.is_empty() {
            return;
        }
        match self.dp.add_v2p_batch(&batch) {
            Ok(()) => {
                for e in &batch {
                    self.unapplied_v2p.remove(&v2p_key(e));
                }
            }
            Err(reason) => {
                tracing::warn!(mappings = batch.len(), error = %reason, "V2P mappings not applied; they will be retried");
                for e in &batch {
                    let key = v2p_key(e);
                    let retry = Retry::after(self.unapplied_v2p.get(&key), &reason, now, false);
                    self.unapplied_v2p.insert(key, retry);
                }
            }
        }
    }

    /// Handles one request.
    pub fn handle(&mut self, req: Request) -> Outcome {
        let changes = req.is_mutation();
        let outcome = match self.apply(req) {
            Ok(r) => Outcome::Ok(r),
            Err(e) => Outcome::Error(e.into()),
        };
        if changes {
            self.follow_hosted_vnis();
        }
        outcome
    }

    pub(super) fn port(&self, name: &str) -> Result<&PortInfo, ControlError> {
        self.state
            .ports
            .iter()
            .find(|p| p.config.name == name)
            .ok_or_else(|| ControlError::NoSuchPort(name.to_string()))
    }

    /// A port that is in the dataplane: the only kind whose tables can change or
    /// whose engine state can be inspected.
    fn applied_port(&self, name: &str) -> Result<&PortInfo, ControlError> {
        let p = self.port(name)?;
        match self.unapplied_ports.get(name) {
            None => Ok(p),
            Some(r) => Err(ControlError::NotApplied {
                port: name.to_string(),
                reason: r.reason().to_string(),
            }),
        }
    }

    /// Writes `state`, remembering the outcome for `stats`.
    fn save(&mut self, state: &State) -> Result<(), StateError> {
        let Some(store) = &self.store else {
            return Ok(());
        };
        let r = store.save(state);
        self.save_error = r.as_ref().err().cloned();
        r
    }

    /// Saves `next` as the state; on failure runs `undo` on the dataplane and reports.
    fn commit(&mut self, next: State, undo: impl FnOnce(&mut D)) -> Result<Reply, ControlError> {
        if let Err(e) = self.save(&next) {
            undo(&mut self.dp);
            return Err(ControlError::NotSaved(e));
        }
        self.state = next;
        Ok(Reply::Done)
    }
}

#[cfg(test)]
mod tests;
