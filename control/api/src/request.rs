//! What a client may ask the daemon: one [`Request`] per line.

use crate::{
    CidrDir, Direction, ExternalIps, FwFilters, FwRule, PortImport, PortInfo, PortLimits,
    RouteClass, RouteEntry, SledExpect, V2pEntry, V2pTarget, Vni,
};
use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use std::net::{IpAddr, Ipv6Addr};

/// Every verb of the admin tool (bar `ra listen`, which runs inside a guest).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Request {
    CreatePort(Box<PortInfo>),
    /// Refused unless the sled is as expected (opteadm's `create-xde` names the
    /// sled's underlay address and boundary services; `xdeadm` asks this first).
    CheckSled(SledExpect),
    DeletePort {
        name: String,
        /// The underlay address of the sled the port's guest moved to: frames
        /// still sent here for it are relayed there for a grace period
        /// (docs/operating.md "Moving a port").
        #[serde(default, skip_serializing_if = "Option::is_none")]
        forward_to: Option<Ipv6Addr>,
    },
    ListPorts,
    SetV2p {
        #[serde(flatten)]
        entry: V2pEntry,
        /// Set it although the fleet maps the same address (docs/fleet.md): the
        /// local mapping then wins until it is cleared.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        override_fleet: bool,
    },
    ClearV2p {
        vpc_ip: IpAddr,
        vni: Vni,
        /// opteadm's form names the whole mapping: when given, the mapping must be
        /// exactly this (a stale command does not remove a newer mapping).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        expect: Option<V2pTarget>,
    },
    DumpV2p,
    /// opteadm's `set-v2b PREFIX ENDPOINT...`: traffic to `prefix` routed to the
    /// internet gateway may leave by these boundary-services endpoints (added to
    /// those the prefix has).
    SetV2b {
        prefix: IpNet,
        endpoints: Vec<Ipv6Addr>,
    },
    /// `clear-v2b PREFIX ENDPOINT...`: removes these endpoints from the prefix (the
    /// prefix goes with its last one).
    ClearV2b {
        prefix: IpNet,
        endpoints: Vec<Ipv6Addr>,
    },
    /// The V2B table in force, `--boundary-services` shorthand included.
    DumpV2b,
    AddRouterEntry {
        port: String,
        #[serde(flatten)]
        entry: RouteEntry,
    },
    DelRouterEntry {
        port: String,
        dest: IpNet,
        /// The class of the route to delete; `system` when absent.
        #[serde(default, skip_serializing_if = "RouteClass::is_system")]
        class: RouteClass,
    },
    DumpRoutes {
        port: String,
    },
    AddFwRule {
        port: String,
        rule: FwRule,
    },
    RmFwRule {
        port: String,
        direction: Direction,
        priority: u16,
        filters: FwFilters,
    },
    /// Removes the rule with this id (as `list-fw-rules` and `dump-layer PORT
    /// firewall` show it); with `direction`, only if the rule looks that way
    /// (opteadm's `rm-fw-rule --dir DIR ID`). `remove-fw-rule PORT ID` gives none.
    RmFwRuleId {
        port: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        direction: Option<Direction>,
        id: u64,
    },
    /// The port's firewall rules as configured, with their ids.
    ListFwRules {
        port: String,
    },
    /// `allow-cidr PORT PREFIX --dir in|out` (and `attach-subnet`, `dir` both):
    /// the guest may receive frames to (`in`) and send frames from (`out`)
    /// addresses of `prefix` besides its own (OPTE's transit IPs and attached
    /// subnets); saved with the port, shown by `list-ports --json` as
    /// `config.cidrs`. `external` (`attach-subnet -e`, `dir` both): the prefix
    /// is exempt from NAT, too (`config.cidrs.external`).
    AllowCidr {
        port: String,
        prefix: IpNet,
        dir: CidrDir,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        external: bool,
    },
    /// `remove-cidr PORT PREFIX --dir in|out` (and `detach-subnet`, `dir` both).
    RemoveCidr {
        port: String,
        prefix: IpNet,
        dir: CidrDir,
    },
    /// `pause-port`: the port drops every frame, both ways (counted
    /// `port_paused`), keeping its flows, connections and rules; saved.
    PausePort {
        port: String,
    },
    /// `resume-port`: a paused port carries traffic again, its connections where
    /// they were.
    ResumePort {
        port: String,
    },
    /// `export-port`: pauses the port (saved) and answers its configuration and
    /// live state ([`crate::PortExport`]). `xdeadm export-port --delete` deletes
    /// the port once the export is written down, not before.
    ExportPort {
        port: String,
    },
    /// `import-port`: makes another sled's exported port here, paused, with its
    /// state; `resume-port` starts it. Refused whole, naming the conflict.
    ImportPort(Box<PortImport>),
    SetFwRules {
        port: String,
        rules: Vec<FwRule>,
    },
    DumpLayer {
        port: String,
        layer: String,
    },
    ListLayers {
        port: String,
    },
    /// The port's tracked connections (TCP, and UDP/ICMP too).
    DumpTcpFlows {
        port: String,
    },
    /// Replaces the port's external addresses (`set-external-ips`); its flows are
    /// decided again.
    SetExternalIps {
        port: String,
        #[serde(flatten)]
        external: ExternalIps,
    },
    /// Replaces the port's rate limits (`set-port-limits`; none: unlimited).
    SetPortLimits {
        port: String,
        #[serde(flatten)]
        limits: PortLimits,
    },
    /// One page of the port's unified flow table.
    DumpUft {
        port: String,
        /// Where the page starts: the `next` of the previous page (the first page
        /// without it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cursor: Option<u64>,
        /// Most entries in the page; the daemon's largest page (4096) without it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limit: Option<usize>,
    },
    ClearUft {
        port: String,
    },
    /// `clear-lft`: empties one layer's flow table (`list-layers` names the
    /// layers; the firewall's connections are the only flows a layer keeps, so the
    /// others have none to clear). The port's flows are decided again.
    ClearLft {
        port: String,
        layer: String,
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
    /// `doctor`: the daemon checks the host and its own setup.
    Doctor,
    /// `path-check`: probe the underlay path to `peer`, or to every sled V2P names.
    PathCheck {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        peer: Option<Ipv6Addr>,
    },
    /// Per worker: its core, ports, queues, rounds and busy ratio
    /// (`xdeadm workers`).
    Workers,
    /// `capture`: copies of a port's frames into a pcapng file the daemon writes.
    Capture(CaptureSpec),
    /// `fleet status`: the sled's view of the fleet's store (docs/fleet.md).
    FleetStatus,
    /// `fleet resync`: read everything the sled watches again, now.
    FleetResync,
    /// `fleet adopt`: take a store whose cluster changed as it is (deletes
    /// included), which the sled otherwise refuses to obey when it comes empty.
    FleetAdopt,
}

impl Request {
    /// `set-v2p` as most callers ask it: a local mapping that does not override the
    /// fleet's.
    pub fn set_v2p(entry: V2pEntry) -> Request {
        Request::SetV2p {
            entry,
            override_fleet: false,
        }
    }

    /// Whether the request changes configuration (and so the persisted state).
    pub fn is_mutation(&self) -> bool {
        matches!(
            self,
            Request::CreatePort(_)
                | Request::DeletePort { .. }
                | Request::SetV2p { .. }
                | Request::ClearV2p { .. }
                | Request::SetV2b { .. }
                | Request::ClearV2b { .. }
                | Request::AddRouterEntry { .. }
                | Request::DelRouterEntry { .. }
                | Request::AddFwRule { .. }
                | Request::RmFwRule { .. }
                | Request::RmFwRuleId { .. }
                | Request::SetFwRules { .. }
                | Request::SetExternalIps { .. }
                | Request::SetPortLimits { .. }
                | Request::AllowCidr { .. }
                | Request::RemoveCidr { .. }
                | Request::PausePort { .. }
                | Request::ResumePort { .. }
                | Request::ExportPort { .. }
                | Request::ImportPort(_)
        )
    }
}

/// What `capture` copies, for how long, and where to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureSpec {
    pub port: String,
    /// Also the underlay frames of the port's traffic (docs/operating.md, "Capture").
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub underlay: bool,
    /// Stop after this many frames (default: only the time limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// Stop after this many seconds (default 10, at most 3600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds: Option<u32>,
    /// The pcapng file the daemon writes: an absolute path, new or empty.
    pub file: std::path::PathBuf,
}

impl CaptureSpec {
    /// How long a capture runs without `seconds`, and at most.
    pub const DEFAULT_SECONDS: u32 = 10;
    pub const MAX_SECONDS: u32 = 3600;

    /// How long the capture runs (the daemon refuses it out of range).
    pub fn duration(&self) -> std::time::Duration {
        let s = self.seconds.unwrap_or(Self::DEFAULT_SECONDS);
        std::time::Duration::from_secs(u64::from(s.min(Self::MAX_SECONDS)))
    }
}
