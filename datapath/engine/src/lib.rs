//! The overlay packet engine: pure Rust, no syscalls, no clock.
//!
//! Everything a packet meets between a guest port and the underlay lives here:
//! the port's layers (gateway, firewall, router, overlay), the unified flow table that
//! caches their compiled result, Geneve encapsulation, tunneled TSO and coalescing,
//! and the virtual gateway. I/O and time are the caller's: it hands frames in (an
//! [`RxFrame`], in the pieces they arrived in), lends the memory underlay frames are
//! written to ([`FrameSpace`]), and takes frames out of a [`TxBatch`].
//!
//! The modules stand on floors, each importing only from those below it: `ids` and
//! `drop` (the identifiers and the drop reasons) at the bottom; `machinery` (generic:
//! flows, rules, layers, flow and connection tables) and `frames` (frames in and
//! out, rewrites, encapsulation, TSO); `vpc` (the VPC policy); and `pipeline` (the
//! [`Engine`] that drives them). Other crates use the names re-exported here.
//!
//! Configuration comes checked: whether a port's configuration makes sense on its
//! own is the API's check (`api::PortConfig::validate`), and the engine refuses only
//! what depends on its own state or bounds its own work ([`EngineError`]). Whatever
//! it is given, it neither panics nor spins (docs/engine.md, "Who checks what").

#![forbid(unsafe_code)]

pub mod drop;
pub mod frames;
pub mod ids;
pub mod machinery;
pub mod pipeline;
pub mod vpc;

pub use drop::DropReason;
pub use frames::ecn::OuterDscp;
pub use frames::encap::OuterTemplate;
pub use frames::input::{InputRef, RxFrame};
pub use frames::output::{
    FrameBytes, FrameSpace, LentFrame, SiblingFrame, TunnelGso, TxBatch, TxDest,
};
pub use ids::{IgwId, PortId, Vni, VniError};
pub use machinery::conntrack::{ConnRecord, FlowLimits};
pub use machinery::counters::DropCounters;
pub use machinery::flow::FlowKey;
pub use machinery::ratelimit::PortLimits;
pub use machinery::rule::{Direction, Finalized, PortRange, Predicate, Rule};
pub use machinery::uft::UftStats;
pub use pipeline::budget::TableBudget;
pub use pipeline::config::{EngineConfig, NextHop, UnderlayRoutes};
pub use pipeline::error::EngineError;
pub use pipeline::migrate::{Imported, LiveImportError, LiveState};
pub use pipeline::next_hops::{NextHopSet, MAX_NEXT_HOPS};
pub use pipeline::relay::RelayStats;
pub use pipeline::stats::EngineStats;
pub use pipeline::Engine;
pub use vpc::firewall::FwAction;
pub use vpc::moved::MOVE_GRACE_NS;
pub use vpc::nat::{ExternalIps, SnatRange};
pub use vpc::port::{
    link_local_eui64, PortCidrs, PortConfig, PortState, MAX_PORT_CIDRS, MIN_PORT_MTU,
};
pub use vpc::router::{RouteClass, RouteTarget};
pub use vpc::v2b::{V2b, V2bEntry};
pub use wire::vnet::VnetHdr;
pub use wire::MacAddr;
