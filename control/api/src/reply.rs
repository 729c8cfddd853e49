//! What the daemon answers: a [`Reply`] for a request it carried out.

use crate::fleet::FleetStatus;
use crate::v2p::V2pRecord;
use crate::{FwRule, PortInfo, PortState, RouteEntry, V2bEntry};
use core::fmt;
use serde::{Deserialize, Serialize};
use std::net::Ipv6Addr;

/// A port as `list-ports` shows it: what was configured and, when the dataplane does
/// not hold it (refused when the daemon restored it), why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortStatus {
    #[serde(flatten)]
    pub port: PortInfo,
    /// Absent for a port that is in the dataplane.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_applied: Option<NotApplied>,
    /// Whether the port's tap is served (absent from a daemon without taps, and
    /// for a port not applied).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<PortLink>,
    /// `ready` (no frame yet since created or restored), `running` or `paused`;
    /// absent for a port not applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<PortState>,
    /// What a vhost-user port's front end negotiated (absent for other ports, and
    /// for a port not applied).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vhost_negotiated: Option<VhostNegotiation>,
}

/// A vhost-user port's negotiation with its front end.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VhostNegotiation {
    /// The virtio features the connected front end acked, by their names in the
    /// virtio specification (`VERSION_1`, `GUEST_CSUM`, `MRG_RXBUF`, ...); empty
    /// while no front end has acked any.
    pub features: Vec<String>,
    /// Front ends refused for their features (and disconnected) since the port
    /// was made.
    pub refused: u64,
}

/// Whether a port's tap is served.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum PortLink {
    Up,
    /// The tap went away (its guest's namespace or the device was deleted); the
    /// daemon re-opens it, on a back-off, once it can (the guest is back).
    Down {
        /// When it went, in milliseconds since the Unix epoch.
        since_unix_ms: u64,
        reason: String,
    },
}

/// Why a saved item (a port, a V2P mapping) is kept in the state but not in the
/// dataplane, and when the daemon tries it again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NotApplied {
    /// The dataplane's refusal at the last attempt.
    pub reason: String,
    pub attempts: u32,
    /// Until the next attempt (sooner for a port whose namespace appears).
    pub retry_in_ms: u64,
}

/// A successful answer; the variant says what it carries.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "data", rename_all = "kebab-case")]
pub enum Reply {
    /// A change was applied (and persisted).
    Done,
    /// `clear-lft`: how many flows the layer's table held.
    Cleared {
        flows: u64,
    },
    Ports(Vec<PortStatus>),
    /// Every mapping in force, local and fleet (docs/fleet.md).
    V2p(Vec<V2pRecord>),
    V2b(Vec<V2bEntry>),
    Routes(Vec<RouteEntry>),
    FwRules(Vec<FwRule>),
    /// Engine-produced inspection results (stats, MTU budget, RA, layer and flow
    /// dumps), exactly as the engine serialises them.
    Inspect(serde_json::Value),
    /// `doctor`'s checks, in order.
    Doctor(Vec<Check>),
    /// `path-check`: one result per peer.
    PathCheck(Vec<PeerPath>),
    Capture(CaptureReport),
    Fleet(Box<FleetStatus>),
    /// `export-port`: the port's configuration and state.
    PortExport(Box<crate::PortExport>),
    /// `import-port`: what went into the port besides its configuration.
    Imported {
        connections: u64,
        snat_ports: u64,
    },
}

/// How a `doctor` check came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckStatus {
    Pass,
    /// Works, but not as well as it could (or could not be verified).
    Warn,
    /// Breaks traffic, or will under load.
    Fail,
}

impl fmt::Display for CheckStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CheckStatus::Pass => "pass",
            CheckStatus::Warn => "warn",
            CheckStatus::Fail => "FAIL",
        })
    }
}

/// One `doctor` check: what was looked at, what was found and, unless it passed,
/// how to fix it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    /// Stable name, e.g. `underlay-mtu` or `port-tap:opte0`.
    pub name: String,
    pub status: CheckStatus,
    pub detail: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

/// The underlay path to one peer sled, as `path-check` measured it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerPath {
    pub peer: Ipv6Addr,
    /// The size the path should carry: this sled's underlay MTU.
    pub wanted: u16,
    /// The largest IPv6 packet (unfragmented ICMPv6 echo) that made the round
    /// trip; `None`: not even the 1280-byte minimum did.
    pub largest: Option<u16>,
    pub probes: u32,
    /// Why the peer could not be probed (the probe socket refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl PeerPath {
    /// Whether the path carries full-size frames.
    pub fn ok(&self) -> bool {
        self.error.is_none() && self.largest == Some(self.wanted)
    }
}

/// How a capture ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CaptureEnd {
    /// `count` frames were written.
    Count,
    /// `seconds` passed.
    Time,
    /// The port was deleted (or its worker stopped) meanwhile.
    PortGone,
}

/// `capture`'s answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureReport {
    pub port: String,
    pub file: std::path::PathBuf,
    /// Frames written to the file.
    pub frames: u64,
    /// Frames not captured because the file was not written fast enough (the
    /// capture's bounded queue was full).
    pub dropped: u64,
    pub ended: CaptureEnd,
}
