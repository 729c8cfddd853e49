//! The overlay packet engine: pure Rust, no syscalls, no clock.
//!
//! Everything a packet meets between a guest port and the underlay lives here:
//! the port's layers (gateway, firewall, router, overlay), the unified flow table that
//! caches their compiled result, Geneve encapsulation, tunneled TSO and coalescing,
//! and the virtual gateway. I/O and time are the caller's: it hands frames in (an
//! [`RxFrame`], in the pieces they arrived in), lends the memory underlay frames are
//! written to ([`FrameSpace`]), and takes frames out of a [`TxBatch`].

#![forbid(unsafe_code)]

pub mod budget;
pub mod counters;
pub mod drop;
pub mod encap;
pub mod engine;
pub mod firewall;
pub mod flow;
pub mod gateway;
pub mod hold;
pub mod input;
pub mod layer;
pub mod nat;
pub mod output;
pub mod overlay;
pub mod port;
pub mod ratelimit;
pub mod router;
pub mod rule;
pub mod slab;
pub mod tso;
pub mod uft;
pub mod v2b;

pub use budget::TableBudget;
pub use drop::DropReason;
pub use engine::{Engine, EngineConfig, EngineError, EngineStats, NextHop, UnderlayRoutes};
pub use firewall::{FlowLimits, FwAction};
pub use flow::FlowKey;
pub use input::RxFrame;
pub use output::{
    FrameBytes, FrameSpace, InputRef, LentFrame, SiblingFrame, TunnelGso, TxBatch, TxDest,
};
pub use port::{CidrDir, PortCidrs, PortConfig, PortId, PortState, Vni};
pub use ratelimit::PortLimits;
pub use router::{RouteClass, RouteTarget};
pub use rule::{Direction, PortRange, Predicate, Rule};
pub use wire::vnet::VnetHdr;
pub use wire::MacAddr;
