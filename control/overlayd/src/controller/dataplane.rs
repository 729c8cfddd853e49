//! What the controller needs from the running datapath: the [`Dataplane`] it
//! drives, the tables a new port starts with, and the inspections it may ask for.

use api::{
    ErrorCode, ExternalIps, FwRule, MacAddr, PortCidrs, PortInfo, PortLimits, PortState,
    RouteEntry, V2pEntry, Vni,
};
use engine::{EngineError, Imported, LiveState, V2b};
use std::net::{IpAddr, Ipv6Addr};
use std::path::PathBuf;

/// Why the dataplane refused a change or a question; it changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum DataplaneError {
    /// The engine refused: a value it checks against its own state (the underlay
    /// MTU, the other ports, its tables).
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The port's guest side (its tap, the interface it attaches to, its
    /// vhost-user socket) could not be opened.
    #[error("{device} {port:?}: {error}")]
    Guest {
        device: &'static str,
        port: String,
        error: std::io::Error,
    },
    #[error("tap {port:?}: network namespace {netns:?} ({}) does not exist", path.display())]
    NoNetns {
        port: String,
        netns: String,
        path: PathBuf,
    },
    #[error(
        "port {port:?}: interface {iface:?} is an underlay link of this daemon, not a hypervisor's"
    )]
    UnderlayLink { port: String, iface: String },
    #[error("port {0:?} advertises no RA (it has no IPv6 address)")]
    NoRa(String),
    #[error("no port named {0:?}")]
    NoSuchPort(String),
    #[error("firewall rule \"{rule}\": {why}")]
    FwRule { rule: FwRule, why: String },
    /// A worker of a dataplane spread over several refused (the others were put
    /// back).
    #[error("worker {worker}: {error}")]
    OnWorker {
        worker: usize,
        error: Box<DataplaneError>,
    },
    /// A worker's poll set refused a socket.
    #[error("worker {worker}: {error}")]
    Poll {
        worker: usize,
        error: std::io::Error,
    },
    /// A worker stopped: it takes no more requests.
    #[error("worker {0} has stopped")]
    Stopped(usize),
    #[error("this datapath has no {0}")]
    NoIo(&'static str),
    #[error("cannot encode {what}: {error}")]
    Encode {
        what: &'static str,
        error: serde_json::Error,
    },
}

impl DataplaneError {
    /// The API's code for this refusal.
    pub fn code(&self) -> ErrorCode {
        match self {
            DataplaneError::Engine(e) => match e.code() {
                "no-such-port" | "not-found" => ErrorCode::NotFound,
                "conflict" => ErrorCode::Conflict,
                _ => ErrorCode::Invalid,
            },
            DataplaneError::UnderlayLink { .. } | DataplaneError::FwRule { .. } => {
                ErrorCode::Invalid
            }
            DataplaneError::NoRa(_) | DataplaneError::NoSuchPort(_) => ErrorCode::NotFound,
            DataplaneError::OnWorker { error, .. } => error.code(),
            DataplaneError::NoIo(_) => ErrorCode::Unsupported,
            DataplaneError::Guest { .. }
            | DataplaneError::NoNetns { .. }
            | DataplaneError::Poll { .. }
            | DataplaneError::Stopped(_)
            | DataplaneError::Encode { .. } => ErrorCode::Dataplane,
        }
    }
}

/// Engine-produced inspection a request can ask for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Inspect {
    Layer {
        port: String,
        layer: String,
    },
    Uft {
        port: String,
        cursor: Option<u64>,
        limit: Option<usize>,
    },
    Stats {
        port: Option<String>,
    },
    Mtu {
        port: String,
    },
    Ra {
        port: String,
    },
    Layers {
        port: String,
    },
    TcpFlows {
        port: String,
    },
    /// The workers' view (`xdeadm workers`).
    Workers,
    /// The V2B table in force (`dump-v2b`): the API's table plus the
    /// `--boundary-services` shorthand, which only the dataplane knows.
    V2b,
}

impl Inspect {
    /// The port inspected, if the request names one.
    pub(super) fn port(&self) -> Option<&str> {
        match self {
            Inspect::Layer { port, .. }
            | Inspect::Uft { port, .. }
            | Inspect::Mtu { port }
            | Inspect::Ra { port }
            | Inspect::Layers { port }
            | Inspect::TcpFlows { port } => Some(port),
            Inspect::Stats { port } => port.as_deref(),
            Inspect::Workers | Inspect::V2b => None,
        }
    }
}

/// The tables a port is created with, in force before it carries its first frame:
/// a restored port must never run, even briefly, with rules looser than the ones
/// saved for it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortTables {
    /// The whole routing table; `None` keeps the routes the engine gives a new port.
    pub routes: Option<Vec<RouteEntry>>,
    pub fw_rules: Vec<FwRule>,
    /// Paused from the start (a port saved paused is restored paused).
    pub paused: bool,
}

/// What the controller needs from the running datapath (engine, and taps when I/O is
/// on). Tables are handed over whole (routes, firewall rules of one port), so the
/// controller alone decides list semantics and the dataplane replaces atomically.
/// The routing table of a port includes the routes the engine gives a new port, so
/// the persisted table records deletions of those too.
/// Every method either applies completely or refuses ([`DataplaneError`], naming
/// the bad value) and changes nothing.
pub trait Dataplane {
    /// Creates a port with `tables` applied before its tap is opened.
    fn add_port(&mut self, port: &PortInfo, tables: &PortTables) -> Result<(), DataplaneError>;
    fn remove_port(&mut self, name: &str) -> Result<(), DataplaneError>;
    fn set_v2p(&mut self, entry: &V2pEntry) -> Result<(), DataplaneError>;
    /// Adds mappings the dataplane does not hold yet (a restore). One call for the
    /// lot, so that a dataplane spread over workers can take 10,000 mappings in one
    /// round trip per worker instead of 10,000.
    fn add_v2p_batch(&mut self, entries: &[V2pEntry]) -> Result<(), DataplaneError> {
        for (i, e) in entries.iter().enumerate() {
            if let Err(err) = self.set_v2p(e) {
                for done in &entries[..i] {
                    let _ = self.clear_v2p(done.vpc_ip, done.vni);
                }
                return Err(err);
            }
        }
        Ok(())
    }
    fn clear_v2p(&mut self, vpc_ip: IpAddr, vni: Vni) -> Result<(), DataplaneError>;
    /// Makes the V2B table `table` (the dataplane adds the `--boundary-services`
    /// shorthand to it).
    fn set_v2b(&mut self, table: &V2b) -> Result<(), DataplaneError>;
    /// Makes the port's routing table exactly `routes`.
    fn set_routes(&mut self, port: &str, routes: &[RouteEntry]) -> Result<(), DataplaneError>;
    /// The port's routing table, including the routes a new port starts with.
    fn routes(&self, port: &str) -> Result<Vec<RouteEntry>, DataplaneError>;
    fn set_fw_rules(&mut self, port: &str, rules: &[FwRule]) -> Result<(), DataplaneError>;
    /// Pauses (every frame of the port dropped, its flows and rules kept) or
    /// resumes the port.
    fn set_port_paused(&mut self, port: &str, paused: bool) -> Result<(), DataplaneError>;
    /// Whether the port is ready, running or paused.
    fn port_state(&self, port: &str) -> Result<PortState, DataplaneError>;
    fn clear_uft(&mut self, port: &str) -> Result<(), DataplaneError>;
    /// Empties one layer's flow table; how many flows it held.
    fn clear_lft(&mut self, port: &str, layer: &str) -> Result<u64, DataplaneError>;
    /// The port's live state (connections, the NAT state they hold), to move it.
    fn export_live(&mut self, port: &str) -> Result<LiveState, DataplaneError>;
    /// Puts another sled's exported state into the port (just made, empty).
    fn import_live(&mut self, port: &str, flows: &LiveState) -> Result<Imported, DataplaneError>;
    /// Relays the frames for guest `mac` of VPC `vni`, whose port was just
    /// deleted, to sled `to` for a move's grace period; `None` stops relaying them.
    fn relay_departed(
        &mut self,
        vni: Vni,
        mac: MacAddr,
        to: Option<Ipv6Addr>,
    ) -> Result<(), DataplaneError>;
    /// Replaces the port's external addresses (its flows are decided again).
    fn set_external_ips(&mut self, port: &str, ext: &ExternalIps) -> Result<(), DataplaneError>;
    /// Replaces the port's rate limits.
    fn set_port_limits(&mut self, port: &str, limits: &PortLimits) -> Result<(), DataplaneError>;
    /// Replaces the port's transit IPs and attached subnets.
    fn set_port_cidrs(&mut self, port: &str, cidrs: &PortCidrs) -> Result<(), DataplaneError>;
    fn inspect(&mut self, what: &Inspect) -> Result<serde_json::Value, DataplaneError>;
}
