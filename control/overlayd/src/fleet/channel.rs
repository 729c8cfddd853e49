//! What passes between the fleet's watcher and the daemon's main loop: batches of
//! the store's changes one way ([`FleetBatch`], on the request channel the API uses,
//! so they are applied between requests like any other change), and what the
//! controller asks of the watcher the other way ([`FleetCommand`]); the watcher's
//! own view of its connection is shared for `fleet status`, and the controller's
//! counts for the sled's status key ([`WatcherView`]).

use api::fleet::FleetCounts;
use api::Vni;
use fleet::{Change, Positions};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// How the controller reaches the watcher: sending never blocks the main loop.
pub type CommandTx = UnboundedSender<FleetCommand>;

/// Changes the store made, each prefix's in its revision order, and where they
/// leave the prefixes' positions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FleetBatch {
    pub cluster_id: u64,
    /// Each key as the store has it at a revision: its value, or `None` for a
    /// delete.
    pub changes: Vec<Change>,
    /// The prefixes whose position the batch moves, and where to: everything
    /// under each up to its revision is in the batch or was applied before.
    pub positions: Positions,
    /// The batch is the whole content of the prefixes of `positions` at their
    /// revision (a full read): what the layer holds under them and the batch
    /// lacks was deleted meanwhile. Otherwise the batch is events.
    pub full_read: bool,
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
    /// What the controller holds of the fleet's (for the status key).
    pub applied: FleetCounts,
    pub refused: usize,
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
