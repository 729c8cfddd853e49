//! Why a management request was refused ([`EngineError`]): each variant carries the
//! bad value and names it in its message, and [`EngineError::code`] gives the
//! stable code an API sends with the refusal. A refused request changes nothing.
//!
//! The engine refuses what depends on its own state or bounds its own work (a
//! name, MAC or address taken, an MTU the underlay cannot carry, the table
//! budget, the prefixes it scans per frame, lookups that find nothing); whether a
//! port's configuration makes sense on its own is the API's check
//! (`api::PortConfig::validate`), made before a request reaches the engine.

use super::budget::BudgetError;
use super::migrate::LiveImportError;
use crate::ids::Vni;
use crate::machinery::conntrack::{ConnImportError, FlowLimitError};
use crate::machinery::layer::RuleId;
use crate::machinery::rule::Direction;
use crate::vpc::gateway::ENCAP_BUDGET;
use crate::vpc::overlay::V2pError;
use crate::vpc::port::{MAX_PORT_CIDRS, MIN_PORT_MTU};
use crate::vpc::router::RouteError;
use crate::vpc::v2b::V2bError;
use ipnet::IpNet;
use std::net::{IpAddr, Ipv6Addr};
use wire::MacAddr;

/// Why a management request was refused; the message names the bad value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// No port has this name.
    #[error("no port named {name:?}")]
    NoSuchPort { name: String },
    /// A port of this name exists already.
    #[error("port {name:?} already exists")]
    PortExists { name: String },
    /// Another port of this engine has the guest MAC in the VPC.
    #[error("guest MAC {mac} is already used in VNI {vni}")]
    MacInUse { mac: MacAddr, vni: Vni },
    /// Another port of this engine has the address in the VPC.
    #[error("address {ip} is already used in VNI {vni}")]
    AddressInUse { ip: IpAddr, vni: Vni },
    /// A port of this worker has the MAC another worker claims for its port.
    #[error("guest MAC {mac} is already used in VNI {vni} by a port of this worker")]
    SiblingMacInUse { mac: MacAddr, vni: Vni },
    /// A port of this worker has the address another worker claims for its port.
    #[error("address {ip} is already used in VNI {vni} by a port of this worker")]
    SiblingAddressInUse { ip: IpAddr, vni: Vni },
    /// The port has no firewall rule of this id that way.
    #[error("port {port:?} has no {dir} firewall rule {id}")]
    NoSuchRule {
        port: String,
        dir: Direction,
        id: RuleId,
    },
    /// `layer` is none of `layers`, the port's layers.
    #[error("no layer {layer:?} (layers: {})", .layers.join(", "))]
    NoSuchLayer {
        layer: String,
        layers: &'static [&'static str],
    },
    /// An underlay too small to carry a minimum-MTU guest packet once encapsulated.
    #[error(
        "underlay MTU {mtu} is below {} (port minimum {MIN_PORT_MTU} + encapsulation {ENCAP_BUDGET})",
        MIN_PORT_MTU + ENCAP_BUDGET
    )]
    UnderlayMtuTooSmall { mtu: u16 },
    #[error("underlay address {addr} is not a unicast address")]
    UnderlayAddrNotUnicast { addr: Ipv6Addr },
    /// A port MTU below the minimum or above what the underlay carries (`max`).
    #[error(
        "port MTU {mtu} is outside {MIN_PORT_MTU}..={max} (underlay MTU {underlay_mtu} - encapsulation {ENCAP_BUDGET})"
    )]
    PortMtuOutOfRange {
        mtu: u16,
        max: u16,
        underlay_mtu: u16,
    },
    /// A route MTU above what the underlay carries (`max`).
    #[error(
        "route MTU {mtu} for {dst} exceeds {max} (underlay MTU {underlay_mtu} - encapsulation {ENCAP_BUDGET})"
    )]
    RouteMtuTooBig {
        mtu: u16,
        dst: IpNet,
        max: u16,
        underlay_mtu: u16,
    },
    /// One port more than the table budget is shared by (`limit`).
    #[error(
        "port {name:?} refused: {ports} ports exist, as many as the table budget is shared by (tables.ports {limit})"
    )]
    TooManyPorts {
        name: String,
        ports: usize,
        limit: usize,
    },
    /// More allowed prefixes in one list than the per-frame checks scan; `dir`
    /// names the list: `in`, `out`, or `exempt from NAT` (external subnets).
    #[error(
        "port {port:?}: {count} prefixes allowed {dir} exceed the {MAX_PORT_CIDRS} the datapath checks per frame"
    )]
    TooManyPrefixes {
        port: String,
        dir: &'static str,
        count: usize,
    },
    /// Another sled's export of a port could not go into it (`import-port`).
    #[error("port {port:?}: its exported flows cannot be imported: {error}")]
    Import {
        port: String,
        error: LiveImportError,
    },
    /// A guest's frames relayed to this sled itself (`delete-xde --forward-to`).
    #[error("{addr} is this sled's own underlay address: a guest that moved away is not here")]
    MoveToThisSled { addr: Ipv6Addr },
    #[error("dump-uft cursor {cursor} is not one a page returned")]
    BadCursor { cursor: u64 },
    #[error(transparent)]
    Route(#[from] RouteError),
    #[error(transparent)]
    V2p(#[from] V2pError),
    #[error(transparent)]
    V2b(#[from] V2bError),
    #[error(transparent)]
    FlowLimits(#[from] FlowLimitError),
    #[error(transparent)]
    Budget(#[from] BudgetError),
}

impl EngineError {
    /// The stable code of the refusal, for an API to send with it: `no-such-port`,
    /// `conflict` (with existing state: a name, MAC, address or route taken),
    /// `not-found` (the thing to remove or show does not exist) or `invalid` (a
    /// value out of range or inconsistent).
    pub fn code(&self) -> &'static str {
        use EngineError as E;
        match self {
            E::NoSuchPort { .. } => "no-such-port",
            E::PortExists { .. }
            | E::MacInUse { .. }
            | E::AddressInUse { .. }
            | E::SiblingMacInUse { .. }
            | E::SiblingAddressInUse { .. }
            | E::Route(RouteError::Exists { .. })
            | E::Import {
                error: LiveImportError::Connections(ConnImportError::NotEmpty { .. }),
                ..
            } => "conflict",
            E::NoSuchRule { .. }
            | E::NoSuchLayer { .. }
            | E::Route(RouteError::NotFound { .. })
            | E::V2p(V2pError::NotFound { .. })
            | E::V2b(V2bError::NoEntry { .. } | V2bError::NoSuchEndpoint { .. }) => "not-found",
            E::UnderlayMtuTooSmall { .. }
            | E::UnderlayAddrNotUnicast { .. }
            | E::MoveToThisSled { .. }
            | E::PortMtuOutOfRange { .. }
            | E::RouteMtuTooBig { .. }
            | E::TooManyPorts { .. }
            | E::TooManyPrefixes { .. }
            | E::BadCursor { .. }
            | E::Import { .. }
            | E::Route(_)
            | E::V2p(_)
            | E::V2b(_)
            | E::FlowLimits(_)
            | E::Budget(_) => "invalid",
        }
    }
}
