//! Why the controller refuses a request: each [`ControlError`] names the bad value,
//! and maps to the API's stable [`ErrorCode`], which clients match on.

use super::checks::PortCheckError;
use super::dataplane::DataplaneError;
use super::state::StateError;
use api::firewall::FwSyntaxError;
use api::port::{CidrError, ExternalIpsError, HostBitsError, LimitsError, MIN_PORT_MTU};
use api::v2p::V2pError;
use api::{Direction, ErrorCode, FwRule, MacAddr, Refusal, RouteClass, Vni};
use engine::vpc::v2b::V2bError;
use ipnet::IpNet;
use std::net::{IpAddr, Ipv6Addr};

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("no port named {0:?}")]
    NoSuchPort(String),
    #[error("port {port:?} is not applied ({reason}); it is retried, and delete-xde removes it")]
    NotApplied { port: String, reason: String },
    #[error(transparent)]
    Port(#[from] PortCheckError),
    #[error(transparent)]
    External(#[from] ExternalIpsError),
    #[error(transparent)]
    Limits(#[from] LimitsError),
    #[error(transparent)]
    Cidr(#[from] CidrError),
    #[error(transparent)]
    Prefix(#[from] HostBitsError),
    #[error(transparent)]
    V2p(#[from] V2pError),
    #[error(transparent)]
    V2b(#[from] V2bError),
    #[error("no V2P mapping for {vpc_ip} in VNI {vni}")]
    NoV2p { vpc_ip: IpAddr, vni: Vni },
    #[error("the V2P mapping for {vpc_ip} in VNI {vni} is {mac} on {underlay}, not {want_mac} on {want_underlay}: left as it is")]
    V2pDiffers {
        vpc_ip: IpAddr,
        vni: Vni,
        mac: MacAddr,
        underlay: Ipv6Addr,
        want_mac: MacAddr,
        want_underlay: Ipv6Addr,
    },
    #[error("route MTU {0} is below {MIN_PORT_MTU}")]
    RouteMtu(u16),
    #[error("port {port:?} already has a {class} route to {dest}; delete it first")]
    RouteExists {
        port: String,
        class: RouteClass,
        dest: IpNet,
    },
    #[error("port {port:?} has no {class} route to {dest}")]
    NoRoute {
        port: String,
        class: RouteClass,
        dest: IpNet,
    },
    #[error(transparent)]
    Filters(#[from] FwSyntaxError),
    #[error("port {port:?} already has the rule \"{rule}\"")]
    RuleExists { port: String, rule: FwRule },
    #[error("port {port:?} has no {direction} rule at priority {priority} with host={host} proto={proto}")]
    NoSuchRule {
        port: String,
        direction: Direction,
        priority: u16,
        host: String,
        proto: String,
    },
    #[error("port {port:?} has no firewall rule {id} (its rules: {ids}; list-fw-rules {port})")]
    NoRuleId { port: String, id: u64, ids: String },
    #[error("firewall rule {id} of port {port:?} is \"{rule}\", not a {direction} rule")]
    RuleDirection {
        port: String,
        id: u64,
        rule: FwRule,
        direction: Direction,
    },
    #[error("rule {index} (\"{rule}\"): {error}")]
    BadRule {
        index: usize,
        rule: Box<FwRule>,
        error: FwSyntaxError,
    },
    #[error("rule {index} (\"{rule}\") appears twice")]
    RuleTwice { index: usize, rule: FwRule },
    #[error(transparent)]
    Dataplane(#[from] DataplaneError),
    #[error("the dataplane's V2B table is unreadable: {0}")]
    V2bUnreadable(serde_json::Error),
    #[error("change undone: {0}")]
    NotSaved(StateError),
    #[error("doctor, path-check, capture and check-sled need overlayd with an underlay (this daemon runs without I/O)")]
    NeedsIo,
    #[error("{what} comes from the fleet (key {key}): change it in the store, or give --override-fleet where the verb takes it")]
    FleetOwned { what: String, key: String },
    #[error("this daemon is not a member of a fleet (see --fleet-endpoints)")]
    NoFleet,
    #[error("the fleet watcher has stopped")]
    FleetStopped,
    #[error(transparent)]
    Move(#[from] super::MoveError),
}

impl ControlError {
    /// The API's code for this refusal.
    pub fn code(&self) -> ErrorCode {
        match self {
            ControlError::NoSuchPort(_)
            | ControlError::NoV2p { .. }
            | ControlError::NoRoute { .. }
            | ControlError::NoSuchRule { .. }
            | ControlError::NoRuleId { .. } => ErrorCode::NotFound,
            ControlError::NotApplied { .. } => ErrorCode::NotApplied,
            ControlError::Port(e) => e.code(),
            ControlError::Cidr(e) => match e {
                CidrError::AlreadyAllowed { .. } => ErrorCode::Conflict,
                CidrError::NotAllowed { .. } => ErrorCode::NotFound,
                _ => ErrorCode::Invalid,
            },
            ControlError::V2pDiffers { .. }
            | ControlError::RouteExists { .. }
            | ControlError::RuleExists { .. }
            | ControlError::RuleDirection { .. } => ErrorCode::Conflict,
            ControlError::External(_)
            | ControlError::Limits(_)
            | ControlError::Prefix(_)
            | ControlError::V2p(_)
            | ControlError::V2b(
                V2bError::NoEndpoint { .. } | V2bError::EndpointNotUnicast { .. },
            )
            | ControlError::RouteMtu(_)
            | ControlError::Filters(_)
            | ControlError::BadRule { .. }
            | ControlError::RuleTwice { .. } => ErrorCode::Invalid,
            ControlError::V2b(V2bError::NoEntry { .. } | V2bError::NoSuchEndpoint { .. }) => {
                ErrorCode::NotFound
            }
            ControlError::Dataplane(e) => e.code(),
            ControlError::V2bUnreadable(_) => ErrorCode::Dataplane,
            ControlError::NotSaved(_) => ErrorCode::NotSaved,
            ControlError::NeedsIo | ControlError::NoFleet => ErrorCode::Unsupported,
            ControlError::FleetOwned { .. } => ErrorCode::Conflict,
            ControlError::FleetStopped => ErrorCode::Dataplane,
            ControlError::Move(super::MoveError::Encode(_)) => ErrorCode::Dataplane,
            ControlError::Move(_) => ErrorCode::Invalid,
        }
    }
}

impl From<ControlError> for Refusal {
    fn from(e: ControlError) -> Refusal {
        Refusal::new(e.code(), e.to_string())
    }
}
