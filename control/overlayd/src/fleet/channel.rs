//! What passes between the fleet's watcher and the daemon's main loop: batches of
//! the store's changes one way ([`FleetBatch`], on the request channel the API uses,
//! so they are applied between requests like any other change), and what the
//! controller asks of the watcher the other way ([`FleetCommand`]); the watcher's
//! own view of its connection is shared for `fleet status` ([`WatcherView`]).

use api::Vni;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

/// One key as the store has it at a revision: its value, or `None` for a delete.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FleetChange {
    pub key: String,
    pub value: Option<Vec<u8>>,
    /// The revision the key was last changed at (for a delete, the delete's).
    pub mod_revision: i64,
}

/// Changes the store made, in revision order, up to `revision`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FleetBatch {
    /// The store revision the layer is current at once the batch is applied.
    pub revision: i64,
    pub cluster_id: u64,
    pub changes: Vec<FleetChange>,
    /// `Some(prefixes)`: the batch is the whole content of these prefixes at
    /// `revision` (a full read): what the layer holds under them and the batch
    /// lacks was deleted meanwhile. `None`: the batch is events.
    pub snapshot_of: Option<Vec<String>>,
}

/// What the controller asks of the watcher.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FleetCommand {
    /// The VPCs the sled hosts ports in changed: watch exactly these.
    Vnis(BTreeSet<Vni>),
    /// Read everything watched again, pinned at one revision (`fleet resync`, or
    /// `fleet adopt`).
    Resync,
}

/// The watcher's connection as `fleet status` shows it; the watcher writes it, the
/// main loop reads it.
#[derive(Clone, Debug, Default)]
pub struct WatcherView {
    pub connected: bool,
    pub endpoint: Option<String>,
    pub store_revision: i64,
    /// When the sled last knew its tables current: a batch delivered, or a
    /// progress notification, while connected.
    pub current_at: Option<Instant>,
    pub resyncs: u64,
    pub last_error: Option<String>,
}

/// [`WatcherView`] shared between the watcher thread and the main loop.
#[derive(Clone, Debug, Default)]
pub struct SharedView(Arc<Mutex<WatcherView>>);

impl SharedView {
    pub fn get(&self) -> WatcherView {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub fn update(&self, f: impl FnOnce(&mut WatcherView)) {
        f(&mut self.0.lock().unwrap_or_else(PoisonError::into_inner));
    }
}
