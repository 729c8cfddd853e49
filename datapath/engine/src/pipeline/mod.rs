//! The pipeline: the [`Engine`] of one sled, which drives every frame through the
//! VPC's layers (`vpc`) on the generic machinery (`machinery`) and the frame code
//! (`frames`), and the management of its ports and tables.
//!
//! What belongs here: the `Engine` and what only it needs — its configuration
//! (`config`), its refusals (`error`), a port's tables and counters (`ports`), where
//! frames for this sled's guests go (`dispatch`), what a cached flow does
//! (`action`), the table budget (`budget`); one file per path a frame takes, read
//! top to bottom; and the management calls, timers and reports. Nothing below
//! imports this folder.
//!
//! Guest to underlay ([`Engine::process_guest`], `outbound`): parse -> gateway
//! (ARP/NDP/DHCP/echo answered here) -> anti-spoofing -> unified flow table; on a
//! miss the layers (firewall -> router -> NAT -> overlay) compile the flow's action
//! and it is cached -> path-MTU check (Packet Too Big or IPv4 fragmentation) ->
//! delivery to another port of this sled (of this engine, `inbound`, or handed to
//! the worker that owns it), or encapsulation with tunneled TSO into the
//! [`TxBatch`].
//!
//! Underlay to guest ([`Engine::process_underlay`], `underlay`): outer validation ->
//! our underlay address -> port by (VNI, inner destination MAC) (a port of another
//! worker: the frame is handed to it; no port, but a guest that moved to another
//! sled moments ago: relayed there, `relay`) -> the port's inbound checks (`inbound`:
//! anti-spoofing, unified flow table / inbound firewall; from outside the VPC through
//! NAT, `external`) -> coalescer (which rewrites the inner source MAC to the
//! gateway's) -> [`TxBatch`].
//!
//! The rest: `manage` (ports, V2P/V2B, routes, rules, limits: every call that
//! changes what the paths decide), `policing` (the worker's per-frame rate-limit
//! calls), `timers` (`tick`), `layers` and `stats` (what the admin tool shows).
//!
//! Every port has a flow epoch, which its cached flows are checked against (see
//! `machinery::uft`). A change to one port's own rules, routes or external addresses
//! moves that port's epoch only (`Engine::bump_port`); a port MTU change moves the
//! epochs of the ports of its VPC (`Engine::bump_vni`); a change to what every port
//! may use (ports coming and going, sibling ports, V2P, V2B, the underlay MTU, and
//! [`Engine::invalidate_next_hops`], which the daemon calls when an underlay
//! neighbour changes) moves the engine epoch and every port's (`Engine::bump`).
//! Every drop is counted under one [`DropReason`] (the counter name);
//! docs/engine.md lists them all.

pub mod action;
pub mod budget;
pub mod config;
mod dispatch;
pub mod error;
mod external;
mod inbound;
pub mod layers;
mod manage;
pub mod migrate;
pub mod next_hops;
mod outbound;
mod policing;
mod ports;
pub mod relay;
pub mod stats;
mod timers;
mod underlay;

use crate::drop::DropReason;
use crate::frames::output::TxBatch;
use crate::frames::tso::Coalescer;
use crate::ids::PortId;
use crate::machinery::counters::DropCounters;
use crate::machinery::hold::HoldQueue;
use crate::vpc::gateway;
use crate::vpc::moved::Departures;
use crate::vpc::overlay::V2p;
use crate::vpc::port::MIN_PORT_MTU;
use crate::vpc::v2b::V2b;
use action::HeldFrame;
use config::EngineConfig;
use dispatch::{LocalDest, MacIndex};
use error::EngineError;
use ports::Port;
use relay::RelayStats;
use std::collections::HashMap;
use std::net::IpAddr;

/// The packet engine of one sled.
pub struct Engine {
    cfg: EngineConfig,
    /// Indexed by `PortId`; `None` is a free id.
    ports: Vec<Option<Port>>,
    by_name: HashMap<String, PortId>,
    /// Inbound dispatch: (VNI, guest MAC) -> port, here or on a sibling worker.
    by_mac: MacIndex,
    /// Local delivery: (VNI, guest IP) -> port, here or on a sibling worker.
    by_ip: HashMap<(u32, IpAddr), LocalDest>,
    v2p: V2p,
    /// The daemon's V2B table merged with the `--boundary-services` shorthand.
    v2b: V2b,
    /// Engine-wide invalidations so far (each one also moved every port's epoch).
    epoch: u64,
    /// Latest `now` seen; used by management calls, which get no clock.
    now: u64,
    last_sweep: u64,
    coalescer: Coalescer,
    /// Reused buffer for IPv4 fragments before they are encapsulated.
    scratch: TxBatch<'static>,
    /// Reused copy of a guest frame whose partial checksum is completed before it
    /// is fragmented.
    csum_buf: Vec<u8>,
    /// Reused contiguous copy of a received frame whose headers span its pieces.
    linear: Vec<u8>,
    /// Guest frames waiting for their underlay next hop.
    hold: HoldQueue<HeldFrame>,
    underlay_drops: DropCounters,
    drops: DropCounters,
    /// Guests that moved to another sled, whose frames are relayed there for a
    /// grace period (`relay.rs`).
    departures: Departures,
    relay: RelayStats,
}

impl Engine {
    /// Refuses an underlay MTU too small to carry a minimum-MTU guest packet, and
    /// zero flow limits, naming the value.
    pub fn new(cfg: EngineConfig) -> Result<Engine, EngineError> {
        if cfg.underlay_mtu < MIN_PORT_MTU + gateway::ENCAP_BUDGET {
            return Err(EngineError::UnderlayMtuTooSmall {
                mtu: cfg.underlay_mtu,
            });
        }
        if cfg.underlay_addr.is_unspecified() || cfg.underlay_addr.is_multicast() {
            return Err(EngineError::UnderlayAddrNotUnicast {
                addr: cfg.underlay_addr,
            });
        }
        cfg.flow.validate()?;
        cfg.tables.validate()?;
        let underlay_drops = DropCounters::with(
            wire::meta::UnderlayDrop::ALL
                .iter()
                .map(|&d| DropReason::from(d)),
        );
        let v2b = V2b::shorthand(cfg.boundary_services)?;
        Ok(Engine {
            cfg,
            ports: Vec::new(),
            by_name: HashMap::new(),
            by_mac: MacIndex::default(),
            by_ip: HashMap::new(),
            v2p: V2p::default(),
            v2b,
            epoch: 1,
            now: 0,
            last_sweep: 0,
            coalescer: Coalescer::new(),
            scratch: TxBatch::new(),
            csum_buf: Vec::new(),
            linear: Vec::new(),
            hold: HoldQueue::default(),
            underlay_drops,
            drops: DropCounters::default(),
            departures: Departures::default(),
            relay: RelayStats::default(),
        })
    }
}
