//! A port as the engine holds it ([`Port`]): its configuration, the state of its
//! layers (gateway, firewall, router, NAT), its two unified flow tables, its
//! counters and its rate limits; and how a path finds it by id ([`slot_mut`]).

use super::action::{InAction, OutAction};
use super::budget::PortTableLimits;
use crate::drop::DropReason;
use crate::ids::PortId;
use crate::machinery::counters::DropCounters;
use crate::machinery::ratelimit::PortPolicer;
use crate::machinery::uft::Uft;
use crate::vpc::firewall::Firewall;
use crate::vpc::gateway::GatewayState;
use crate::vpc::moved::Arrival;
use crate::vpc::nat::SnatTable;
use crate::vpc::port::PortConfig;
use crate::vpc::router::Router;

/// The engine's state of one port: its configuration, the layers' state, both
/// flow tables, its counters and its rate limits.
pub(super) struct Port {
    pub(super) id: PortId,
    pub(super) cfg: PortConfig,
    pub(super) gw: GatewayState,
    pub(super) fw: Firewall,
    pub(super) router: Router,
    pub(super) uft_out: Uft<OutAction>,
    pub(super) uft_in: Uft<InAction>,
    /// The epoch both flow tables' entries are checked against: moved by a change
    /// to this port's own configuration, and by every engine-wide change (which
    /// moves every port's), so a hit costs one compare whatever moved it.
    pub(super) epoch: u64,
    /// SNAT ports held by the port's flows to the internet.
    pub(super) snat: SnatTable,
    /// Table sizes from the port's share of the table budget.
    pub(super) limits: PortTableLimits,
    /// The token buckets of `cfg.limits`.
    pub(super) policer: PortPolicer,
    pub(super) c: PortCounters,
    /// The MTU changed since the last `tick` (which tells the guest with an RA).
    pub(super) mtu_changed: bool,
    /// Paused by the operator: every frame, both ways, is dropped (`port_paused`);
    /// everything else is kept.
    pub(super) paused: bool,
    /// Imported from another sled moments ago: that sled's relayed frames are
    /// admitted for the grace period (`vpc::moved`).
    pub(super) arrival: Option<Arrival>,
}

impl Port {
    /// Slots of both flow tables (what an expiry sweep walks).
    pub(super) fn uft_slots(&self) -> usize {
        self.uft_out.slots() + self.uft_in.slots()
    }
}

/// Per-port packet counters.
#[derive(Clone, Debug, Default)]
pub(super) struct PortCounters {
    /// Toward the guest (delivered).
    pub(super) in_packets: u64,
    pub(super) in_bytes: u64,
    /// From the guest (received, before any drop).
    pub(super) out_packets: u64,
    pub(super) out_bytes: u64,
    pub(super) tso_buffers_in: u64,
    pub(super) tso_segments_out: u64,
    pub(super) tso_super_frames_out: u64,
    pub(super) local_delivered: u64,
    /// Frames from the underlay whose outer CE mark was carried into the inner
    /// packet (RFC 6040).
    pub(super) ecn_ce_marked: u64,
    /// Times the guest had to wait for its egress limit's tokens.
    pub(super) egress_throttled: u64,
    /// Times a frame for the guest had to wait for its ingress limit's tokens.
    pub(super) ingress_throttled: u64,
    pub(super) drops: DropCounters,
}

/// Port `id` of the engine's ports (indexed by id; `None` is a free id), if it
/// exists: how every path finds its port.
#[inline]
pub(super) fn slot_mut(ports: &mut [Option<Port>], id: PortId) -> Option<&mut Port> {
    ports.get_mut(id.0 as usize).and_then(Option::as_mut)
}

/// Counts a drop at port `port`, or engine-wide as `unknown_port` if it is gone.
pub(super) fn count_drop(
    ports: &mut [Option<Port>],
    drops: &mut DropCounters,
    port: PortId,
    r: DropReason,
) {
    match slot_mut(ports, port) {
        Some(p) => p.c.drops.inc(r),
        None => drops.inc(DropReason::UnknownPort),
    }
}
