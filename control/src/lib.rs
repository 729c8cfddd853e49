//! The control plane of the overlay datapath: the versioned API spoken over a Unix
//! socket ([`api`]), the daemon's configuration ([`config`]), its persisted state
//! ([`state`]), the request handling shared by the daemon and its tests
//! ([`controller`]), the socket server and client ([`server`], [`client`]), one
//! worker's engine and the translation of requests for it ([`datapath`]), the loop
//! that moves its frames ([`worker`]), the fan-out over several workers
//! ([`workers`]), and port captures as pcapng ([`capture`], [`pcapng`]). Every
//! syscall it needs without a safe wrapper lives in `dpio`.

#![forbid(unsafe_code)]

pub mod api;
pub mod capture;
pub mod cli;
pub mod client;
pub mod config;
pub mod controller;
pub mod daemon;
pub mod datapath;
pub mod doctor;
pub mod handoff;
pub mod metrics;
pub mod neighbours;
pub mod notify;
pub mod opteadm;
pub mod pathcheck;
pub mod pcapng;
pub mod ra_listen;
pub mod server;
pub mod shaper;
pub mod state;
pub mod stats;
pub mod tap_queue;
pub mod underlay;
pub mod worker;
pub mod workers;
