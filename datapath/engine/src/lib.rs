//! The overlay packet engine: pure Rust, no syscalls, no clock.
//!
//! Everything a packet meets between a guest port and the underlay lives here:
//! the port's layers (gateway, firewall, router, overlay), the unified flow table that
//! caches their compiled result, Geneve encapsulation, tunneled TSO and coalescing,
//! and the virtual gateway. I/O and time are the caller's: it hands frames in, and
//! takes frames out of a [`TxBatch`].

pub mod encap;
pub mod gateway;
pub mod output;
pub mod port;
pub mod tso;

pub use output::{TxBatch, TxDest, TxFrame};
pub use port::{PortConfig, PortId, Vni};
pub use wire::vnet::VnetHdr;
pub use wire::MacAddr;
