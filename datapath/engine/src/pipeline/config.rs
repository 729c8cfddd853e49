//! What the caller gives the engine: the sled-wide configuration
//! ([`EngineConfig`]), and the underlay next hops ([`UnderlayRoutes`]) it consults
//! when a flow is compiled.

use crate::frames::ecn::OuterDscp;
use crate::ids::Vni;
use crate::machinery::conntrack::FlowLimits;
use crate::pipeline::budget::TableBudget;
use crate::pipeline::next_hops::NextHopSet;
use serde::Serialize;
use std::net::Ipv6Addr;
use wire::MacAddr;

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
    /// The outer DSCP of encapsulated frames: the inner packet's, or one class for
    /// all (the outer ECN field is always the inner one's: `frames::ecn`).
    pub outer_dscp: OuterDscp,
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
    /// checksum, the inner DSCP copied to the outer header, the reference's flow limits, and a fixed hash seed (deterministic
    /// for tests; a daemon sets [`EngineConfig::hash_seed`] to a random value).
    pub fn new(underlay_addr: Ipv6Addr) -> Self {
        EngineConfig {
            underlay_addr,
            underlay_mtu: 9000,
            external_jumbo: false,
            boundary_services: None,
            boundary_vni: Vni::DEFAULT_BOUNDARY,
            outer_udp_checksum: false,
            outer_dscp: OuterDscp::Copy,
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

/// Resolves an underlay destination to the interfaces and MACs to send it with:
/// every usable next hop (several for a multipath route), of which each flow
/// picks one by its hash. Consulted when a flow is compiled, not per packet: the
/// pick is built into the flow's cached outer header, so call
/// `Engine::invalidate_next_hops` whenever a next hop's interface or MAC changes,
/// it disappears, or one joins the set.
pub trait UnderlayRoutes {
    /// Empty when no next hop toward `dst` is known (yet).
    fn next_hops(&self, dst: Ipv6Addr) -> NextHopSet;
}
