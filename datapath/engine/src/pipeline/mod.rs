//! The [`Engine`]: ports, the tables they share, their management, and timers. The
//! two fast paths have a file each: `outbound` (guest to underlay) and `inbound`
//! (underlay to guest); `stats` holds what `stats` reports.
//!
//! Guest to underlay ([`Engine::process_guest`]): parse -> gateway (ARP/NDP/DHCP/echo
//! answered here) -> anti-spoofing -> unified flow table; on a miss the layers
//! (firewall -> router -> overlay) compile the flow's action and it is cached ->
//! path-MTU check (Packet Too Big or IPv4 fragmentation) -> delivery to another port of
//! this sled (of this engine, or handed to the worker that owns it), or encapsulation
//! with tunneled TSO into the [`TxBatch`].
//!
//! Underlay to guest ([`Engine::process_underlay`]): outer validation -> our underlay
//! address -> port by (VNI, inner destination MAC) (a port of another worker: the
//! frame is handed to it) -> anti-spoofing -> unified flow table / inbound firewall ->
//! coalescer (which rewrites the inner source MAC to the gateway's) -> [`TxBatch`].
//!
//! Every port has a flow epoch, which its cached flows are checked against (see
//! `uft`). A change to one port's own rules, routes or external addresses moves that
//! port's epoch only ([`Engine::bump_port`]); a port MTU change moves the epochs of
//! the ports of its VPC ([`Engine::bump_vni`]); a change to what every port may use
//! (ports coming and going, sibling ports, V2P, V2B, the underlay MTU, and
//! [`Engine::invalidate_next_hops`], which the daemon calls when an underlay
//! neighbour changes) moves the engine epoch and every port's ([`Engine::bump`]). Every drop is counted
//! under one [`DropReason`] (the counter name); docs/engine.md lists them all.

pub mod action;
pub mod budget;
mod external;
mod inbound;
mod layers;
mod outbound;
mod stats;

pub use layers::{LayerSummary, PortLayerDump, LAYERS};
pub use stats::{EngineStats, PortStats, UftPortDump};

use outbound::HeldFrame;
use stats::PortCounters;

use crate::drop::DropReason;
use crate::frames::output::TxBatch;
use crate::frames::tso::Coalescer;
use crate::ids::{PortId, Vni};
use crate::machinery::conntrack::{ConnDump, FlowLimits, TcpSegment};
use crate::machinery::counters::DropCounters;
use crate::machinery::flow::{quoted_flow, FlowKey, PROTO_ICMP, PROTO_ICMPV6};
use crate::machinery::hold::HoldQueue;
use crate::machinery::layer::RuleId;
use crate::machinery::ratelimit::{PortLimits, PortPolicer};
use crate::machinery::rule::{Direction, Finalized, MatchFields, Rule};
use crate::machinery::uft::{Uft, UftEntry};
use crate::pipeline::budget::{PortTableLimits, TableBudget};
use crate::vpc::firewall::{Firewall, FwAction};
use crate::vpc::gateway::{self, GatewayState, MtuBudget, RaInfo};
use crate::vpc::nat::{ExternalIps, SnatTable};
use crate::vpc::overlay::{V2p, V2pDump, V2pEntry};
use crate::vpc::port::{CidrDir, PortCidrs, PortConfig, PortState, MIN_PORT_MTU};
use crate::vpc::router::{RouteClass, RouteDump, RouteTarget, Router};
use crate::vpc::v2b::{V2b, V2bEntry};
use action::{InAction, OutAction};
use core::fmt;
use ipnet::IpNet;
use serde::Serialize;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use wire::meta::InnerMeta;
use wire::MacAddr;

/// How often `tick` sweeps idle flows out of the tables: a sweep walks every table,
/// so it runs at most this often however often the caller ticks.
const SWEEP_INTERVAL_NS: u64 = 1_000_000_000;

/// Flow-table slots `tick` inspects for expiry, across all tables, so that a tick
/// costs at most ~100 us whatever the tables hold (removing 2048 entries took
/// 0.2-0.4 ms on the 2-core test machine); each table's sweep resumes where it
/// stopped. Memory never waits for the sweep: full tables evict idle entries first.
const UFT_EXPIRE_PER_TICK: usize = 1024;

/// Sled-wide configuration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EngineConfig {
    /// This sled's underlay address: outer source of everything sent, and the only
    /// outer destination accepted.
    pub underlay_addr: Ipv6Addr,
    pub underlay_mtu: u16,
    /// Sled-wide external jumbo flag (external traffic uses the port MTU only when
    /// the port's flag is set too).
    pub external_jumbo: bool,
    /// The `--boundary-services` shorthand: one boundary endpoint for `0.0.0.0/0`
    /// and `::/0`, always part of the V2B table (see `v2b`). A port created while it
    /// is set gets default routes to the internet gateway.
    pub boundary_services: Option<Ipv6Addr>,
    /// The VNI of traffic to and from boundary services (the reference's 99 unless
    /// configured).
    pub boundary_vni: Vni,
    /// Compute the outer UDP checksum (off: zero is allowed for tunnels over IPv6).
    pub outer_udp_checksum: bool,
    /// The underlay transmit path takes UDP-tunnel GSO super-frames (a tunnel tap,
    /// Linux 6.17+; the daemon probes it): guest TSO buffers then leave as one
    /// super-frame each ([`crate::frames::tso::super_frames`], [`crate::TxDest::UnderlayGso`])
    /// for the kernel to cut, instead of being cut into segments here.
    pub underlay_tunnel_gso: bool,
    pub flow: FlowLimits,
    /// Memory for all ports' flow and connection tables, shared evenly by up to
    /// `tables.ports` ports: a port's tables get the `flow` limits scaled down to its
    /// share (see `budget`). The daemon gives each worker's engine its part
    /// ([`TableBudget::split`]).
    pub tables: TableBudget,
    /// Key of the flow and connection tables' hash (SipHash-1-3). Remote peers choose
    /// inbound flow keys, so with a known key they could pick colliding flows and
    /// slow a port's lookups down; the daemon must pass a random value per process
    /// (the engine makes no syscalls, so it cannot draw one). The outer UDP source
    /// port and flow label do not use it: they must survive restarts.
    /// Never serialized: it is a secret.
    #[serde(skip)]
    pub hash_seed: u64,
}

impl EngineConfig {
    /// A 9000-byte underlay, no boundary services, no external jumbo, zero outer UDP
    /// checksum, the reference's flow limits, and a fixed hash seed (deterministic
    /// for tests; a daemon sets [`EngineConfig::hash_seed`] to a random value).
    pub fn new(underlay_addr: Ipv6Addr) -> Self {
        EngineConfig {
            underlay_addr,
            underlay_mtu: 9000,
            external_jumbo: false,
            boundary_services: None,
            boundary_vni: Vni::DEFAULT_BOUNDARY,
            outer_udp_checksum: false,
            underlay_tunnel_gso: false,
            flow: FlowLimits::default(),
            tables: TableBudget::default(),
            hash_seed: 0x6f76_6572_6c61_7964,
        }
    }
}

/// The underlay neighbour to send to, supplied by the daemon's neighbour cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NextHop {
    pub ifindex: u32,
    pub src_mac: MacAddr,
    pub dst_mac: MacAddr,
}

/// Resolves an underlay destination to the interface and MACs to send it with.
/// Consulted when a flow is compiled, not per packet: the result is built into the
/// flow's cached outer header, so call [`Engine::invalidate_next_hops`] whenever a
/// neighbour's interface or MAC changes or it disappears.
pub trait UnderlayRoutes {
    fn next_hop(&self, dst: Ipv6Addr) -> Option<NextHop>;
}

/// Why a management request was refused; the message names the bad value. A refused
/// request changes nothing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum EngineError {
    /// No port has this name.
    NoSuchPort(String),
    /// The request collides with existing state (a name, MAC, address or route).
    Conflict(String),
    /// A value is out of range or inconsistent.
    Invalid(String),
    /// The thing to remove or show does not exist.
    NotFound(String),
}

impl fmt::Display for EngineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EngineError::NoSuchPort(n) => write!(f, "no port named {n:?}"),
            EngineError::Conflict(m) | EngineError::Invalid(m) | EngineError::NotFound(m) => {
                f.write_str(m)
            }
        }
    }
}

impl std::error::Error for EngineError {}

struct Port {
    id: PortId,
    cfg: PortConfig,
    gw: GatewayState,
    fw: Firewall,
    router: Router,
    uft_out: Uft<OutAction>,
    uft_in: Uft<InAction>,
    /// The epoch both flow tables' entries are checked against: moved by a change
    /// to this port's own configuration, and by every engine-wide change (which
    /// moves every port's), so a hit costs one compare whatever moved it.
    epoch: u64,
    /// SNAT ports held by the port's flows to the internet.
    snat: SnatTable,
    /// Table sizes from the port's share of the table budget.
    limits: PortTableLimits,
    /// The token buckets of `cfg.limits`.
    policer: PortPolicer,
    c: PortCounters,
    /// The MTU changed since the last `tick` (which tells the guest with an RA).
    mtu_changed: bool,
    /// Paused by the operator: every frame, both ways, is dropped (`port_paused`);
    /// everything else is kept.
    paused: bool,
}

/// Who holds a port of this sled: this engine, or another worker's engine. Every
/// worker runs its own engine over its own ports, and learns where the others' ports
/// are ([`Engine::set_sibling_port`]) so that traffic to them is handed over to that
/// worker instead of looping through the underlay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Owner {
    Port(PortId),
    Sibling(u16),
}

/// A guest address on this sled: where VPC-internal traffic to it is delivered
/// without encapsulation.
#[derive(Clone, Copy, Debug)]
struct LocalDest {
    owner: Owner,
    /// The guest's MAC (what a frame handed to a sibling worker is addressed to).
    mac: MacAddr,
    mtu: u16,
}

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
}

/// Inbound dispatch, (VNI, guest MAC) -> owner: a sorted array of packed keys, searched
/// by bisection. Only our own ports are keys (the network cannot add any), so no keyed
/// hash is needed, and a sled has tens of ports: a few compares, where std's SipHash
/// cost ~250 instructions per inbound packet.
#[derive(Debug, Default)]
struct MacIndex(Vec<(u128, Owner)>);

impl MacIndex {
    fn key(vni: u32, mac: MacAddr) -> u128 {
        let m = mac.0;
        let mac48 = u64::from_be_bytes([0, 0, m[0], m[1], m[2], m[3], m[4], m[5]]);
        u128::from(vni) << 48 | u128::from(mac48)
    }

    #[inline]
    fn get(&self, vni: u32, mac: MacAddr) -> Option<Owner> {
        let k = Self::key(vni, mac);
        let i = self.0.binary_search_by_key(&k, |e| e.0).ok()?;
        self.0.get(i).map(|e| e.1)
    }

    /// Adds or replaces the owner of (vni, mac).
    fn insert(&mut self, vni: u32, mac: MacAddr, owner: Owner) {
        let k = Self::key(vni, mac);
        match self.0.binary_search_by_key(&k, |e| e.0) {
            Ok(i) => self.0[i].1 = owner,
            Err(i) => self.0.insert(i, (k, owner)),
        }
    }

    fn remove(&mut self, vni: u32, mac: MacAddr) {
        let k = Self::key(vni, mac);
        if let Ok(i) = self.0.binary_search_by_key(&k, |e| e.0) {
            self.0.remove(i);
        }
    }
}

impl Port {
    /// Slots of both flow tables (what an expiry sweep walks).
    fn uft_slots(&self) -> usize {
        self.uft_out.slots() + self.uft_in.slots()
    }
}

fn slot_mut(ports: &mut [Option<Port>], id: PortId) -> Option<&mut Port> {
    ports.get_mut(id.0 as usize).and_then(Option::as_mut)
}

impl Engine {
    /// Refuses an underlay MTU too small to carry a minimum-MTU guest packet, and
    /// zero flow limits, naming the value.
    pub fn new(cfg: EngineConfig) -> Result<Engine, EngineError> {
        let min = MIN_PORT_MTU + gateway::ENCAP_BUDGET;
        if cfg.underlay_mtu < min {
            return Err(EngineError::Invalid(format!(
                "underlay MTU {} is below {min} (port minimum {MIN_PORT_MTU} + encapsulation {})",
                cfg.underlay_mtu,
                gateway::ENCAP_BUDGET
            )));
        }
        if cfg.underlay_addr.is_unspecified() || cfg.underlay_addr.is_multicast() {
            return Err(EngineError::Invalid(format!(
                "underlay address {} is not a unicast address",
                cfg.underlay_addr
            )));
        }
        cfg.flow.validate().map_err(EngineError::Invalid)?;
        cfg.tables.validate().map_err(EngineError::Invalid)?;
        let underlay_drops = DropCounters::with(
            wire::meta::UnderlayDrop::ALL
                .iter()
                .map(|&d| DropReason::from(d)),
        );
        let v2b = shorthand_v2b(cfg.boundary_services)?;
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
        })
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// The engine-wide epoch: how many changes so far invalidated every port's
    /// cached flows.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The epoch port `name`'s cached flows are checked against (see
    /// [`Engine::bump_port`]).
    pub fn port_epoch(&self, name: &str) -> Result<u64, EngineError> {
        self.port_by_name(name).map(|p| p.epoch)
    }

    /// Invalidates every port's cached flows: for changes to what any port's flows
    /// may have used (ports, sibling ports, V2P, V2B, the underlay). Walks the
    /// ports (tens), so that a hit still compares one epoch.
    fn bump(&mut self) {
        self.epoch += 1;
        for p in self.ports.iter_mut().flatten() {
            p.epoch += 1;
        }
    }

    /// Invalidates the cached flows of the ports of VPC `vni` only: for a change to
    /// a port that other ports' flows know of only through its VPC's local delivery
    /// (`by_ip`, keyed by VNI), such as its MTU.
    fn bump_vni(&mut self, vni: Vni) {
        for p in self.ports.iter_mut().flatten() {
            if p.cfg.vni == vni {
                p.epoch += 1;
            }
        }
    }

    /// Makes every cached flow recompile on its next packet, which asks
    /// [`UnderlayRoutes::next_hop`] again and rebuilds the outer header (interface,
    /// source and destination MAC). The daemon calls this when its neighbour cache
    /// changes or drops an entry: a busy flow never goes idle long enough to be
    /// recompiled otherwise. Connections are kept; only cached decisions go.
    pub fn invalidate_next_hops(&mut self) {
        // Engine-wide: every port's encapsulated flows hold an outer header.
        self.bump();
    }

    /// Follows a change of the underlay links' MTU: segment sizes and path MTUs are
    /// taken from it (every cached flow is recompiled). Refused below what a
    /// minimum-MTU port needs, naming the value. Returns the ports whose MTU the
    /// underlay no longer carries whole: their large packets now get Packet Too Big
    /// (or are fragmented, IPv4 without DF), and the operator should lower their MTU
    /// or restore the underlay's.
    pub fn set_underlay_mtu(&mut self, mtu: u16) -> Result<Vec<String>, EngineError> {
        let min = MIN_PORT_MTU + gateway::ENCAP_BUDGET;
        if mtu < min {
            return Err(EngineError::Invalid(format!(
                "underlay MTU {mtu} is below {min} (port minimum {MIN_PORT_MTU} + encapsulation {})",
                gateway::ENCAP_BUDGET
            )));
        }
        self.cfg.underlay_mtu = mtu;
        // Engine-wide: every port's path MTUs and segment sizes derive from it.
        self.bump();
        let max = self.max_inner_mtu();
        Ok(self
            .ports
            .iter()
            .flatten()
            .filter(|p| p.cfg.mtu > max)
            .map(|p| p.cfg.name.clone())
            .collect())
    }

    fn port_by_name(&self, name: &str) -> Result<&Port, EngineError> {
        self.by_name
            .get(name)
            .and_then(|id| self.ports.get(id.0 as usize))
            .and_then(Option::as_ref)
            .ok_or_else(|| EngineError::NoSuchPort(name.to_string()))
    }

    fn port_by_name_mut(&mut self, name: &str) -> Result<&mut Port, EngineError> {
        let id = *self
            .by_name
            .get(name)
            .ok_or_else(|| EngineError::NoSuchPort(name.to_string()))?;
        slot_mut(&mut self.ports, id).ok_or_else(|| EngineError::NoSuchPort(name.to_string()))
    }

    fn check_port_mtu(&self, mtu: u16) -> Result<(), EngineError> {
        let max = self.max_inner_mtu();
        if mtu < MIN_PORT_MTU || mtu > max {
            return Err(EngineError::Invalid(format!(
                "port MTU {mtu} is outside {MIN_PORT_MTU}..={max} (underlay MTU {} - encapsulation {})",
                self.cfg.underlay_mtu,
                gateway::ENCAP_BUDGET
            )));
        }
        Ok(())
    }

    /// Refuses a port beyond the number the table budget is shared by.
    fn check_port_room(&self, name: &str) -> Result<(), EngineError> {
        let ports = self.ports.iter().flatten().count();
        if ports >= self.cfg.tables.ports {
            return Err(EngineError::Invalid(format!(
                "port {name:?} refused: {ports} ports exist, as many as the table budget is shared by (tables.ports {})",
                self.cfg.tables.ports
            )));
        }
        Ok(())
    }

    /// Largest guest IP packet the underlay carries once encapsulated (`new` checked
    /// that the underlay MTU exceeds the encapsulation).
    fn max_inner_mtu(&self) -> u16 {
        self.cfg.underlay_mtu.saturating_sub(gateway::ENCAP_BUDGET)
    }

    // ---- Ports ----

    /// Creates a port with the default routes (its VPC subnets -> VPC, and the
    /// default routes -> internet gateway if boundary services are configured) and
    /// the default firewall (outbound allow, inbound deny unless established).
    pub fn add_port(&mut self, cfg: PortConfig) -> Result<PortId, EngineError> {
        cfg.validate().map_err(EngineError::Invalid)?;
        self.check_port_mtu(cfg.mtu)?;
        self.check_port_room(&cfg.name)?;
        if self.by_name.contains_key(&cfg.name) {
            return Err(EngineError::Conflict(format!(
                "port {:?} already exists",
                cfg.name
            )));
        }
        let vni = cfg.vni.get();
        if self.by_mac.get(vni, cfg.guest_mac).is_some() {
            return Err(EngineError::Conflict(format!(
                "guest MAC {} is already used in VNI {vni}",
                cfg.guest_mac
            )));
        }
        let ips: Vec<IpAddr> = cfg
            .ipv4
            .map(IpAddr::V4)
            .into_iter()
            .chain(cfg.ipv6.map(IpAddr::V6))
            .collect();
        for ip in &ips {
            if self.by_ip.contains_key(&(vni, *ip)) {
                return Err(EngineError::Conflict(format!(
                    "address {ip} is already used in VNI {vni}"
                )));
            }
        }
        let mut router = Router::default();
        let subnets = [
            cfg.vpc_subnet4.map(IpNet::V4),
            cfg.vpc_subnet6.map(IpNet::V6),
        ];
        for net in subnets.into_iter().flatten() {
            router
                .add(net, RouteTarget::VpcSubnet, None)
                .map_err(EngineError::Invalid)?;
        }
        if self.cfg.boundary_services.is_some() {
            for net in ["0.0.0.0/0", "::/0"] {
                let net: IpNet = net.parse().map_err(|_| EngineError::Invalid(net.into()))?;
                if router.dump_routes().iter().all(|r| r.dst != net) {
                    router
                        .add(net, RouteTarget::InternetGateway, None)
                        .map_err(EngineError::Invalid)?;
                }
            }
        }
        let id = PortId(
            self.ports
                .iter()
                .position(Option::is_none)
                .unwrap_or(self.ports.len()) as u32,
        );
        let limits = self.cfg.tables.port_limits(&self.cfg.flow);
        let lim = FlowLimits {
            fw_flow_limit: limits.conns,
            uft_limit: limits.uft,
            ..self.cfg.flow
        };
        let port = Port {
            id,
            gw: GatewayState::new(self.now),
            fw: Firewall::new(lim, self.cfg.hash_seed),
            router,
            uft_out: Uft::new(lim.uft_limit, lim.other_ns, self.cfg.hash_seed),
            uft_in: Uft::new(lim.uft_limit, lim.other_ns, self.cfg.hash_seed),
            snat: SnatTable::new(self.cfg.hash_seed),
            limits,
            policer: PortPolicer::new(&cfg.limits, self.now),
            c: PortCounters::default(),
            // Any start will do: the tables are new. The bump below moves it.
            epoch: 1,
            mtu_changed: false,
            paused: false,
            cfg,
        };
        for ip in ips {
            self.by_ip.insert(
                (vni, ip),
                LocalDest {
                    owner: Owner::Port(id),
                    mac: port.cfg.guest_mac,
                    mtu: port.cfg.mtu,
                },
            );
        }
        self.by_mac.insert(vni, port.cfg.guest_mac, Owner::Port(id));
        self.by_name.insert(port.cfg.name.clone(), id);
        match self.ports.get_mut(id.0 as usize) {
            Some(slot) => *slot = Some(port),
            None => self.ports.push(Some(port)),
        }
        // Engine-wide: other ports' flows to its addresses were encapsulated or dropped.
        self.bump();
        Ok(id)
    }

    /// Deletes a port and everything it owns; its id may be reused.
    pub fn remove_port(&mut self, name: &str) -> Result<PortId, EngineError> {
        let id = self.port_by_name(name)?.id;
        let Some(p) = self.ports.get_mut(id.0 as usize).and_then(Option::take) else {
            return Err(EngineError::NoSuchPort(name.to_string()));
        };
        let vni = p.cfg.vni.get();
        self.by_name.remove(name);
        self.by_mac.remove(vni, p.cfg.guest_mac);
        for ip in [p.cfg.ipv4.map(IpAddr::V4), p.cfg.ipv6.map(IpAddr::V6)]
            .into_iter()
            .flatten()
        {
            self.by_ip.remove(&(vni, ip));
        }
        // Its id may be reused: nothing it sent may leave as another port's.
        self.hold.purge(|h| h.port == id);
        // Engine-wide: other ports' flows were delivered to it (its id may be reused).
        self.bump();
        Ok(id)
    }

    /// Pauses or resumes a port. Pausing keeps the port's flows, connections, rules
    /// and held frames; its frames are dropped (`port_paused`) until it is resumed.
    /// Connections age meanwhile: one idle past its timeout when the port resumes
    /// is gone, as after any silence.
    pub fn set_port_paused(&mut self, name: &str, paused: bool) -> Result<(), EngineError> {
        self.port_by_name_mut(name)?.paused = paused;
        Ok(())
    }

    /// Whether the port is paused, or has carried a frame yet.
    pub fn port_state(&self, name: &str) -> Result<PortState, EngineError> {
        let p = self.port_by_name(name)?;
        Ok(if p.paused {
            PortState::Paused
        } else if p.c.in_packets == 0 && p.c.out_packets == 0 {
            PortState::Ready
        } else {
            PortState::Running
        })
    }

    pub fn port_id(&self, name: &str) -> Option<PortId> {
        self.by_name.get(name).copied()
    }

    pub fn port_config(&self, name: &str) -> Result<&PortConfig, EngineError> {
        self.port_by_name(name).map(|p| &p.cfg)
    }

    /// Every port, by id.
    pub fn list_ports(&self) -> Vec<(PortId, PortConfig)> {
        self.ports
            .iter()
            .flatten()
            .map(|p| (p.id, p.cfg.clone()))
            .collect()
    }

    /// Changes a port's MTU. The guest hears of it through an RA at the next `tick`.
    pub fn set_port_mtu(&mut self, name: &str, mtu: u16) -> Result<(), EngineError> {
        self.check_port_mtu(mtu)?;
        let p = self.port_by_name_mut(name)?;
        if p.cfg.mtu == mtu {
            return Ok(());
        }
        p.cfg.mtu = mtu;
        p.mtu_changed = true;
        let port_vni = p.cfg.vni;
        let vni = port_vni.get();
        for ip in [p.cfg.ipv4.map(IpAddr::V4), p.cfg.ipv6.map(IpAddr::V6)]
            .into_iter()
            .flatten()
        {
            if let Some(d) = self.by_ip.get_mut(&(vni, ip)) {
                d.mtu = mtu;
            }
        }
        // The port's own flows, and the flows of its VPC's other ports delivered to
        // it here (their path MTU is the smaller of the two ports'): no other port
        // can reach it without encapsulation.
        self.bump_vni(port_vni);
        Ok(())
    }

    /// Replaces port `name`'s external addresses (checked as `add_port` checks
    /// them). Every flow of the port is decided again (its epoch moves): a flow
    /// keeps no address the port no longer has. A changed SNAT range forgets the SNAT ports
    /// (they may lie outside it); the connections stay, and their next packets get
    /// new ports.
    pub fn set_external_ips(&mut self, name: &str, ext: ExternalIps) -> Result<(), EngineError> {
        let p = self.port_by_name_mut(name)?;
        ext.validate(p.cfg.ipv4, p.cfg.ipv6)
            .map_err(EngineError::Invalid)?;
        if p.cfg.external.snat != ext.snat {
            p.snat.clear();
        }
        p.cfg.external = ext;
        p.epoch += 1;
        Ok(())
    }

    /// How long the caller must wait before taking port `port`'s next frame from
    /// its guest (`None`: take it now): its egress limit's tokens are spent
    /// (ratelimit.rs). Counted (`egress_throttled`) when it must wait.
    #[inline]
    pub fn egress_wait(&mut self, port: PortId, now: u64) -> Option<u64> {
        let p = slot_mut(&mut self.ports, port)?;
        let wait = p.policer.egress_wait(now);
        if wait.is_some() {
            p.c.egress_throttled += 1;
        }
        wait
    }

    /// Takes the tokens for a frame of `len` bytes to deliver to port `port`'s
    /// guest, or says how long to wait before it may be delivered: its ingress
    /// limit's tokens are spent (the caller holds the frame meanwhile; see
    /// ratelimit.rs). Counted (`ingress_throttled`) when it must wait.
    #[inline]
    pub fn ingress_take(&mut self, port: PortId, len: usize, now: u64) -> Result<(), u64> {
        let Some(p) = slot_mut(&mut self.ports, port) else {
            return Ok(());
        };
        match p.policer.ingress_wait(now) {
            None => {
                p.policer.ingress(len, now);
                Ok(())
            }
            Some(ns) => {
                p.c.ingress_throttled += 1;
                Err(ns)
            }
        }
    }

    /// Counts a frame for port `port` dropped because the frames waiting for its
    /// ingress limit already fill their queue (`rate_limited`).
    pub fn ingress_overflow(&mut self, port: PortId) {
        if let Some(p) = slot_mut(&mut self.ports, port) {
            p.c.drops.inc(DropReason::RateLimited);
        }
    }

    /// Replaces port `name`'s rate limits (checked as `add_port` checks them). The
    /// buckets start full; flows are untouched.
    pub fn set_port_limits(&mut self, name: &str, limits: PortLimits) -> Result<(), EngineError> {
        limits.validate().map_err(EngineError::Invalid)?;
        let now = self.now;
        let p = self.port_by_name_mut(name)?;
        p.cfg.limits = limits;
        p.policer = PortPolicer::new(&limits, now);
        Ok(())
    }

    /// Replaces port `name`'s allowed prefixes (transit IPs and attached subnets,
    /// checked as `add_port` checks them). Checked per packet, ahead of the flow
    /// tables, so a removed prefix stops traffic at once; the port's epoch moves
    /// anyway (its flows only: the prefixes are the port's alone).
    pub fn set_port_cidrs(&mut self, name: &str, cidrs: PortCidrs) -> Result<(), EngineError> {
        self.bump_port(name, |p| {
            cidrs.validate(&p.cfg).map_err(EngineError::Invalid)?;
            p.cfg.cidrs = cidrs;
            Ok(())
        })
    }

    /// Allows `net` for `dir` on port `name` (`allow-cidr`, `attach-subnet`).
    pub fn allow_cidr(&mut self, name: &str, net: IpNet, dir: CidrDir) -> Result<(), EngineError> {
        self.bump_port(name, |p| {
            let mut c = p.cfg.cidrs.clone();
            c.allow(net, dir, &p.cfg).map_err(|e| {
                if e.contains("already allows") {
                    EngineError::Conflict(e)
                } else {
                    EngineError::Invalid(e)
                }
            })?;
            p.cfg.cidrs = c;
            Ok(())
        })
    }

    /// Removes `net` for `dir` from port `name` (`remove-cidr`, `detach-subnet`).
    pub fn remove_cidr(&mut self, name: &str, net: IpNet, dir: CidrDir) -> Result<(), EngineError> {
        self.bump_port(name, |p| {
            p.cfg
                .cidrs
                .remove(net, dir, name)
                .map_err(EngineError::NotFound)
        })
    }

    // ---- Ports of sibling workers ----

    /// Records that another worker of this sled (`worker`) owns the port with MAC
    /// `mac` and addresses `ips` in VPC `vni`, at MTU `mtu`: frames to it are handed
    /// to that worker ([`TxDest::Sibling`]) rather than encapsulated toward this sled.
    /// Refused when one of this engine's own ports has the MAC or an address.
    pub fn set_sibling_port(
        &mut self,
        vni: Vni,
        mac: MacAddr,
        ips: &[IpAddr],
        mtu: u16,
        worker: u16,
    ) -> Result<(), EngineError> {
        let v = vni.get();
        if let Some(Owner::Port(_)) = self.by_mac.get(v, mac) {
            return Err(EngineError::Conflict(format!(
                "guest MAC {mac} is already used in VNI {v} by a port of this worker"
            )));
        }
        if let Some(ip) = ips.iter().find(|ip| {
            matches!(
                self.by_ip.get(&(v, **ip)),
                Some(LocalDest {
                    owner: Owner::Port(_),
                    ..
                })
            )
        }) {
            return Err(EngineError::Conflict(format!(
                "address {ip} is already used in VNI {v} by a port of this worker"
            )));
        }
        let owner = Owner::Sibling(worker);
        self.by_mac.insert(v, mac, owner);
        for ip in ips {
            self.by_ip.insert((v, *ip), LocalDest { owner, mac, mtu });
        }
        // Engine-wide: other ports' flows to its addresses change delivery.
        self.bump();
        Ok(())
    }

    /// Forgets a port [`Engine::set_sibling_port`] recorded; this engine's own ports
    /// are left alone.
    pub fn clear_sibling_port(&mut self, vni: Vni, mac: MacAddr, ips: &[IpAddr]) {
        let v = vni.get();
        if let Some(Owner::Sibling(_)) = self.by_mac.get(v, mac) {
            self.by_mac.remove(v, mac);
        }
        for ip in ips {
            if let Some(LocalDest {
                owner: Owner::Sibling(_),
                ..
            }) = self.by_ip.get(&(v, *ip))
            {
                self.by_ip.remove(&(v, *ip));
            }
        }
        // Engine-wide, as `set_sibling_port`.
        self.bump();
    }

    // ---- V2P ----

    /// Maps a guest address of VPC `vni` to the sled hosting it and the guest's MAC.
    pub fn set_v2p(
        &mut self,
        vni: Vni,
        ip: IpAddr,
        underlay: Ipv6Addr,
        mac: MacAddr,
    ) -> Result<(), EngineError> {
        self.v2p
            .set(vni, ip, V2pEntry { underlay, mac })
            .map_err(EngineError::Invalid)?;
        // Engine-wide: outbound encapsulation and inbound sender checks use V2P.
        self.bump();
        Ok(())
    }

    pub fn clear_v2p(&mut self, vni: Vni, ip: IpAddr) -> Result<(), EngineError> {
        self.v2p.clear(vni, ip).map_err(EngineError::NotFound)?;
        // Engine-wide, as `set_v2p`.
        self.bump();
        Ok(())
    }

    pub fn dump_v2p(&self) -> Vec<V2pDump> {
        self.v2p.dump()
    }

    // ---- V2B ----

    /// Makes the V2B table `table` plus the `--boundary-services` shorthand: the
    /// daemon owns the table's semantics (`V2b::set`/`clear`) and hands it over
    /// whole, so every worker's engine holds the same one.
    pub fn set_v2b(&mut self, table: &V2b) -> Result<(), EngineError> {
        let mut v2b = shorthand_v2b(self.cfg.boundary_services)?;
        v2b.merge(table);
        self.v2b = v2b;
        // Engine-wide: every flow to the internet gateway chose its endpoint here.
        self.bump();
        Ok(())
    }

    /// The V2B table in force, the shorthand's entries included.
    pub fn dump_v2b(&self) -> Vec<V2bEntry> {
        self.v2b.dump()
    }

    // ---- Routes ----

    /// Adds a route to a port. A route MTU can only lower a flow's path MTU (the
    /// flow gets the smaller of it and the MTU its path has anyway), and may not
    /// exceed what the underlay carries after encapsulation.
    pub fn add_route(
        &mut self,
        port: &str,
        dst: IpNet,
        target: RouteTarget,
        mtu: Option<u16>,
    ) -> Result<(), EngineError> {
        self.add_route_in(port, RouteClass::System, dst, target, mtu)
    }

    /// [`Engine::add_route`] of a route of `class` (a `custom` route wins a tie
    /// with a `system` route of the same prefix).
    pub fn add_route_in(
        &mut self,
        port: &str,
        class: RouteClass,
        dst: IpNet,
        target: RouteTarget,
        mtu: Option<u16>,
    ) -> Result<(), EngineError> {
        let max = self.max_inner_mtu();
        if let Some(m) = mtu.filter(|m| *m > max) {
            return Err(EngineError::Invalid(format!(
                "route MTU {m} for {dst} exceeds {max} (underlay MTU {} - encapsulation {})",
                self.cfg.underlay_mtu,
                gateway::ENCAP_BUDGET
            )));
        }
        let p = self.port_by_name_mut(port)?;
        p.router.add_in(class, dst, target, mtu).map_err(|e| {
            if e.contains("already exists") {
                EngineError::Conflict(e)
            } else {
                EngineError::Invalid(e)
            }
        })?;
        p.epoch += 1;
        Ok(())
    }

    pub fn del_route(&mut self, port: &str, dst: IpNet) -> Result<(), EngineError> {
        self.del_route_in(port, RouteClass::System, dst)
    }

    /// Removes the route of `class` for exactly `dst` (that port's flows are
    /// recompiled).
    pub fn del_route_in(
        &mut self,
        port: &str,
        class: RouteClass,
        dst: IpNet,
    ) -> Result<(), EngineError> {
        self.bump_port(port, |p| {
            p.router.del_in(class, dst).map_err(EngineError::NotFound)
        })
    }

    pub fn dump_routes(&self, port: &str) -> Result<Vec<RouteDump>, EngineError> {
        Ok(self.port_by_name(port)?.router.dump_routes())
    }

    // ---- Firewall ----

    /// Applies `change` to port `name` and, if it succeeds, invalidates that port's
    /// cached flows only: for changes to what no other port's flows use (its rules,
    /// routes, external addresses). Another port's flow delivered to this one here
    /// is decided again by this port's inbound table, checked against this port's
    /// epoch, so it meets the change too.
    fn bump_port<T>(
        &mut self,
        name: &str,
        change: impl FnOnce(&mut Port) -> Result<T, EngineError>,
    ) -> Result<T, EngineError> {
        let p = self.port_by_name_mut(name)?;
        let r = change(p)?;
        p.epoch += 1;
        Ok(r)
    }

    pub fn add_fw_rule(
        &mut self,
        port: &str,
        dir: Direction,
        rule: Rule<Finalized, FwAction>,
    ) -> Result<RuleId, EngineError> {
        self.bump_port(port, |p| Ok(p.fw.layer_mut().add(dir, rule)))
    }

    pub fn rm_fw_rule(
        &mut self,
        port: &str,
        dir: Direction,
        id: RuleId,
    ) -> Result<(), EngineError> {
        self.bump_port(port, |p| match p.fw.layer_mut().remove(dir, id) {
            true => Ok(()),
            false => Err(EngineError::NotFound(format!(
                "port {port:?} has no {dir} firewall rule {id}"
            ))),
        })
    }

    /// Replaces every firewall rule of the port. Established connections stay (the
    /// firewall is stateful); new flows meet the new rules.
    pub fn set_fw_rules(
        &mut self,
        port: &str,
        rules: Vec<(Direction, Rule<Finalized, FwAction>)>,
    ) -> Result<Vec<RuleId>, EngineError> {
        self.bump_port(port, |p| {
            let layer = p.fw.layer_mut();
            layer.clear();
            Ok(rules.into_iter().map(|(d, r)| layer.add(d, r)).collect())
        })
    }

    // ---- Inspection ----

    /// Forgets the port's cached flows (they are recompiled on their next packet).
    pub fn clear_uft(&mut self, port: &str) -> Result<(), EngineError> {
        let p = self.port_by_name_mut(port)?;
        p.uft_in.clear();
        p.uft_out.clear();
        Ok(())
    }

    /// The port's tracked connections (`dump-tcp-flows`, UDP and ICMP included).
    pub fn dump_tcp_flows(&self, port: &str) -> Result<Vec<ConnDump>, EngineError> {
        Ok(self.port_by_name(port)?.fw.conns().dump_flows(self.now))
    }

    pub fn mtu_budget(&self, port: &str) -> Result<MtuBudget, EngineError> {
        let p = self.port_by_name(port)?;
        Ok(gateway::mtu_budget(
            &p.cfg,
            self.cfg.underlay_mtu,
            self.cfg.external_jumbo,
        ))
    }

    pub fn ra_info(&self, port: &str) -> Result<Option<RaInfo>, EngineError> {
        let p = self.port_by_name(port)?;
        Ok(gateway::ra_info(&p.cfg, &p.gw))
    }

    // ---- Fast path ----

    /// Timers: RAs (periodic, after an MTU change, and answering rate-limited
    /// solicitations), a bounded step of the flow tables' expiry, the timeout of
    /// frames waiting for a next hop, and at most once a second the sweep of idle
    /// connections (and their cached flows).
    pub fn tick(&mut self, now: u64, out: &mut TxBatch) {
        self.now = self.now.max(now);
        let sweep = now.saturating_sub(self.last_sweep) >= SWEEP_INTERVAL_NS;
        self.expire_held(now);
        // Each table's share of the step is its share of the slots, so every table
        // is swept in the same number of ticks.
        let slots: usize = self.ports.iter().flatten().map(Port::uft_slots).sum();
        let step = |t: usize| (UFT_EXPIRE_PER_TICK * t).div_ceil(slots.max(1));
        for p in self.ports.iter_mut().flatten() {
            p.uft_out.expire_step(p.epoch, now, step(p.uft_out.slots()));
            p.uft_in.expire_step(p.epoch, now, step(p.uft_in.slots()));
            if p.mtu_changed {
                gateway::on_mtu_change(&p.cfg, &mut p.gw, p.id, now, out);
                p.mtu_changed = false;
            }
            gateway::tick(&p.cfg, &mut p.gw, p.id, now, out);
            if sweep {
                let Port {
                    fw,
                    uft_out,
                    uft_in,
                    snat,
                    ..
                } = p;
                fw.conns_mut().expire(now, |k| {
                    uft_out.remove(k);
                    uft_in.remove(&k.reversed());
                    snat.forget(k);
                });
            }
        }
        if sweep {
            self.last_sweep = now;
        }
    }
}

/// Whether a cached flow still holds: stateless decisions always do; the others only
/// while their connection is live (tracked here, by handle) and takes the packet. A
/// TCP segment outside the window is not taken: the flow is decided again, and the
/// firewall names the drop (`tcp_out_of_window`), which is not cached.
#[inline]
fn confirm<A>(
    e: &UftEntry<A>,
    fw: &mut Firewall,
    dir: Direction,
    seg: Option<TcpSegment>,
    bytes: u32,
    now: u64,
) -> bool {
    if !e.needs_conn {
        return true;
    }
    e.conn
        .is_some_and(|h| fw.conns_mut().track_handle(h, dir, seg, bytes, now) == Ok(true))
}

/// A packet's IP bytes (inner L3 header onward), what flows and connections count.
#[inline]
fn ip_bytes(m: &InnerMeta) -> u32 {
    u32::try_from(m.ip_end.saturating_sub(m.l3_off)).unwrap_or(u32::MAX)
}

fn match_fields(key: &FlowKey, m: &InnerMeta) -> MatchFields {
    MatchFields {
        key: *key,
        icmp_type: (m.proto == PROTO_ICMP || m.proto == PROTO_ICMPV6).then_some(m.icmp_type),
        vpc_vni: None,
    }
}

/// For an ICMP error, the flow of the packet it quotes (see `flow::quoted_flow`).
fn quoted(key: &FlowKey, m: &InnerMeta, frame: &[u8]) -> Option<FlowKey> {
    if !key.is_icmp_error() {
        return None;
    }
    let body = frame.get(m.payload_off..m.ip_end)?;
    quoted_flow(key.vni, key.proto, body)
}

/// The V2B table `--boundary-services ADDR` stands for: both default prefixes to
/// that one endpoint.
fn shorthand_v2b(endpoint: Option<Ipv6Addr>) -> Result<V2b, EngineError> {
    let mut t = V2b::default();
    if let Some(e) = endpoint {
        for net in [IpNet::V4(Default::default()), IpNet::V6(Default::default())] {
            t.set(net, &[e]).map_err(EngineError::Invalid)?;
        }
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_index_finds_exactly_its_keys() {
        let mac = |b: u8| MacAddr([2, 0, 0, 0, 0, b]);
        let mut ix = MacIndex::default();
        // Inserted out of order, with one MAC in two VNIs.
        for (vni, b, id) in [
            (7, 9, 0),
            (7, 1, 1),
            (1 << 23, 1, 2),
            (7, 5, 3),
            (0, 0xff, 4),
        ] {
            ix.insert(vni, mac(b), Owner::Port(PortId(id)));
        }
        assert_eq!(ix.get(7, mac(1)), Some(Owner::Port(PortId(1))));
        assert_eq!(ix.get(1 << 23, mac(1)), Some(Owner::Port(PortId(2))));
        assert_eq!(ix.get(7, mac(5)), Some(Owner::Port(PortId(3))));
        assert_eq!(ix.get(0, mac(0xff)), Some(Owner::Port(PortId(4))));
        assert_eq!(ix.get(8, mac(1)), None);
        assert_eq!(ix.get(7, mac(2)), None);
        // The VNI and the MAC do not overlap in the packed key.
        assert_eq!(ix.get(7 << 8, MacAddr([0; 6])), None);
        ix.insert(7, mac(5), Owner::Sibling(9));
        assert_eq!(ix.get(7, mac(5)), Some(Owner::Sibling(9)));
        ix.remove(7, mac(1));
        ix.remove(7, mac(1));
        assert_eq!(ix.get(7, mac(1)), None);
        assert_eq!(ix.get(1 << 23, mac(1)), Some(Owner::Port(PortId(2))));
        assert_eq!(ix.0.len(), 4);
        assert!(ix.0.windows(2).all(|w| w[0].0 < w[1].0));
        // Many ports.
        for b in 10..60u8 {
            ix.insert(u32::from(b % 3), mac(b), Owner::Port(PortId(u32::from(b))));
        }
        assert_eq!(ix.0.len(), 54);
        for b in 10..60u8 {
            assert_eq!(
                ix.get(u32::from(b % 3), mac(b)),
                Some(Owner::Port(PortId(u32::from(b))))
            );
            assert_eq!(ix.get(u32::from(b % 3) + 3, mac(b)), None);
        }
        assert_eq!(ix.get(7, mac(5)), Some(Owner::Sibling(9)));
    }
}
