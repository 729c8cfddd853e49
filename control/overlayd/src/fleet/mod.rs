//! The daemon as a member of a fleet (docs/fleet.md): a watcher thread follows the
//! fleet's etcd store and hands the main loop batches of its changes
//! ([`watcher`], [`channel`]); the controller applies them to its fleet layer
//! (`crate::controller` `fleet.rs`) with the API's own checks, between requests.

pub mod channel;
pub mod watcher;
