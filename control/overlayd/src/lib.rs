//! `overlayd`, the per-sled daemon, as a library for its binary and its tests.
//!
//! Its rooms, from the ground up:
//! - [`util`]: back-off and the doorbell that wakes a sleeping thread;
//! - [`config`]: the configuration file and flags;
//! - [`convert`]: the edge between the API's types and the engine's;
//! - [`fleet`]: the sled as a member of a fleet: the watcher thread that follows
//!   the fleet's etcd store, and what passes between it and the main loop;
//! - [`server`]: the API socket (requests in, answers out, clients bounded), and
//!   the channel that brings the controller its work (requests, fleet batches);
//! - [`controller`]: request handling, the persisted state and what is retried;
//!   it drives a [`controller::Dataplane`];
//! - [`underlay`]: the XDP program and AF_XDP sockets on the underlay links, the
//!   next hops, the path probe;
//! - [`worker`]: one poll-mode worker and its [`worker::Datapath`] (an engine, its
//!   guests, its underlay queues): the loop that moves the frames;
//! - [`workers`]: the fan-out of the controller's requests over every worker;
//! - [`ops`]: what operators look through: metrics, captures, `doctor`, systemd's
//!   readiness protocol;
//! - [`daemon`]: the daemon's life: start, run, stop.
//!
//! Every syscall it needs without a safe wrapper lives in `dpio`.

#![forbid(unsafe_code)]

pub mod config;
pub mod controller;
pub mod convert;
pub mod daemon;
pub mod fleet;
pub mod ops;
pub mod server;
pub mod underlay;
pub mod util;
pub mod worker;
pub mod workers;
