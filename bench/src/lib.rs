//! Shared fixtures for the engine benchmarks (`benches/`) and the allocation test
//! (`tests/alloc.rs`).
//!
//! Why a library: the criterion benches and the allocation test must measure exactly
//! the same packets through exactly the same setup, otherwise "zero allocations" and
//! "N ns per packet" would describe two different things. Everything here is built
//! through the engine's public API only: two sleds ([`sleds::TwoSleds`]), each an
//! [`engine::Engine`] with one guest port and V2P mappings for the other sled's guest;
//! guest frames built with `wire`'s emitters ([`frames`]); underlay frames obtained by
//! running the sending sled's engine, so they are exactly what the wire would carry.
//!
//! [`alloc::CountingAlloc`] wraps the system allocator to count heap allocations; a
//! `#[global_allocator]` may only be declared in a final binary, so the bench and the
//! test each declare their own static of it.

pub mod alloc;
pub mod frames;
pub mod nat;
pub mod scenario;
pub mod sleds;
pub mod tso;

pub use scenario::{Dir, FastPath, IpVersion, Scenario, SlowPath, Transport};
pub use sleds::{PeerRoute, Sled, TwoSleds, NOW};
