//! What `stats` reports: per-port counters and the engine-wide drop counters.

use super::{Engine, Port};
use crate::counters::DropCounters;
use crate::firewall::FirewallStats;
use crate::gateway::GatewayCounters;
use crate::port::PortId;
use crate::tso::CoalesceStats;
use crate::uft::UftStats;
use serde::Serialize;

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
    pub(super) local_delivered: u64,
    pub(super) drops: DropCounters,
}

/// A port's statistics as `stats` reports them.
#[derive(Clone, Debug, Serialize)]
pub struct PortStats {
    pub name: String,
    pub id: PortId,
    /// Frames and bytes delivered to the guest.
    pub in_packets: u64,
    pub in_bytes: u64,
    /// Frames and bytes received from the guest.
    pub out_packets: u64,
    pub out_bytes: u64,
    /// GSO buffers received from the guest and the underlay frames made of them.
    pub tso_buffers_in: u64,
    pub tso_segments_out: u64,
    /// Frames delivered to another port of this sled without encapsulation.
    pub local_delivered: u64,
    pub uft_in: UftStats,
    pub uft_out: UftStats,
    pub firewall: FirewallStats,
    pub gateway: GatewayCounters,
    /// Drops by reason.
    pub drops: DropCounters,
}

/// `stats` output.
#[derive(Clone, Debug, Serialize)]
pub struct EngineStats {
    pub epoch: u64,
    pub ports: Vec<PortStats>,
    /// Underlay frames refused by `parse_underlay`, by `UnderlayDrop` name.
    pub underlay_drops: DropCounters,
    /// Drops not attributable to a port.
    pub datapath_drops: DropCounters,
    /// Coalescing of received segments (all ports).
    pub coalescer: CoalesceStats,
    pub v2p_entries: usize,
}

impl Engine {
    /// Every counter of every port, and the engine-wide ones.
    pub fn stats(&self) -> EngineStats {
        EngineStats {
            epoch: self.epoch,
            ports: self.ports.iter().flatten().map(PortStats::of).collect(),
            underlay_drops: self.underlay_drops.clone(),
            datapath_drops: self.drops.clone(),
            coalescer: self.coalescer.stats(),
            v2p_entries: self.v2p.len(),
        }
    }
}

impl PortStats {
    fn of(p: &Port) -> PortStats {
        PortStats {
            name: p.cfg.name.clone(),
            id: p.id,
            in_packets: p.c.in_packets,
            in_bytes: p.c.in_bytes,
            out_packets: p.c.out_packets,
            out_bytes: p.c.out_bytes,
            tso_buffers_in: p.c.tso_buffers_in,
            tso_segments_out: p.c.tso_segments_out,
            local_delivered: p.c.local_delivered,
            uft_in: p.uft_in.stats(),
            uft_out: p.uft_out.stats(),
            firewall: p.fw.stats(),
            gateway: p.gw.counters().clone(),
            drops: p.c.drops.clone(),
        }
    }
}
