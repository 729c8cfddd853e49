//! The etcd side of the fleet (docs/fleet.md): the store every `overlayd` watches
//! and `xdeadm fleet ...` writes. It knows etcd, not the daemon: no key schema (the
//! `api` crate parses keys and values), no tables; keys and values pass through as
//! they are.
//!
//! Its rooms:
//! - [`config`]: where the store is and the certificate to show it;
//! - [`store`]: one connection to one member ([`Store`]): status, a paged
//!   [`Snapshot`] pinned at one revision, bounded transactions ([`Store::apply`]);
//! - [`watch`]: a [`Watch`] over several prefixes, each followed from a revision
//!   of its own and resumed from its own [`Positions`];
//! - [`lease`]: a key that lives as long as its writer ([`LeasedKey`], the sled's
//!   status key);
//! - `call`: one request with its deadline and its cluster check, as every
//!   room above makes it;
//! - [`backoff`]: waits between reconnects, with full jitter;
//! - [`error`]: what failed, where, and whether another try may help;
//! - `testing` (feature `testing`): an etcd of a test's own and a test PKI.
//!
//! Async inside (etcd-client runs on tokio): the daemon's watcher drives it from a
//! thread of its own with a current-thread runtime.

#![forbid(unsafe_code)]

pub mod backoff;
mod call;
pub mod config;
pub mod error;
pub mod lease;
pub mod store;
#[cfg(feature = "testing")]
pub mod testing;
pub mod watch;

pub use backoff::Backoff;
pub use config::{StoreConfig, TlsFiles, TlsPem};
pub use error::{Operation, StoreError};
pub use lease::LeasedKey;
pub use store::{Applied, Kv, Op, SkippedDelete, Snapshot, Store, StoreStatus, MAX_TXN_OPS};
pub use watch::{Change, Positions, Watch, WatchEvent};
