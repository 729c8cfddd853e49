//! The API between `overlayd` and its clients (`xdeadm`, an orchestrator, the
//! tests): what may be asked ([`Request`]), what is answered ([`Reply`], or a
//! [`Refusal`] with a stable [`ErrorCode`]), the line protocol that carries them
//! ([`protocol`]), and a [`Client`].
//!
//! The types here are the API's own, with a stable serde form: the daemon converts
//! them to the engine's at its edge, so a change inside the engine is not a change
//! of the protocol, and a client links neither the engine nor the I/O layer. Each
//! type carries the checks that make a value valid on its own and its text form
//! (the words of `xdeadm`'s and opteadm's command lines), so a client refuses a bad
//! value before sending it, with the message the daemon would give.
//! Inspection results (stats, MTU budget, RA, layer and flow dumps) travel as the
//! daemon renders them, as JSON documents ([`Reply::Inspect`]); the `stats`
//! document's rendering for Prometheus is here too ([`openmetrics`], OpenMetrics
//! and the classic text format), shared by the daemon's metrics endpoint and
//! `xdeadm stats --format openmetrics|prometheus`.

#![forbid(unsafe_code)]

pub mod client;
pub mod firewall;
pub mod fleet;
pub mod migrate;
pub mod openmetrics;
pub mod port;
pub mod protocol;
pub mod reply;
pub mod request;
pub mod route;
pub mod sled;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod v2p;
pub mod vni;

pub use client::{Client, ClientError};
pub use firewall::{
    Direction, FwAction, FwFilters, FwHost, FwPorts, FwProto, FwProtoSpec, FwRule, FwSyntaxError,
    IcmpMatch,
};
pub use migrate::{ExportError, PortExport, PortImport, PORT_EXPORT_FORMAT, PORT_EXPORT_KIND};
pub use port::{
    CidrDir, ExternalIps, PortCidrs, PortConfig, PortInfo, PortLimits, PortState, SnatRange,
    VhostUser, VhostUserMode,
};
pub use protocol::{ErrorCode, Outcome, Refusal};
pub use reply::{
    CaptureEnd, CaptureReport, Check, CheckStatus, NotApplied, PeerPath, PortLink, PortStatus,
    Reply, VhostNegotiation,
};
pub use request::{CaptureSpec, Request};
pub use route::{RouteClass, RouteEntry, RouteTarget};
pub use sled::{SledExpect, SledFacts, SledMismatch};
/// Internet gateway ids (`ig=UUID`, `ExternalIps::gateways`).
pub use uuid::Uuid;
pub use v2p::{Source, V2bEntry, V2pEntry, V2pRecord, V2pTarget};
pub use vni::Vni;
pub use wire::MacAddr;
