//! What `stats` reports (per-port counters and the engine-wide ones), and the pages
//! of `dump-uft`.

use super::budget::{PortTableLimits, TableBudget};
use super::error::EngineError;
use super::ports::Port;
use super::relay::RelayStats;
use super::Engine;
use crate::frames::tso::CoalesceStats;
use crate::ids::PortId;
use crate::machinery::conntrack::ConnStats;
use crate::machinery::counters::DropCounters;
use crate::machinery::hold::HoldStats;
use crate::machinery::uft::{UftDump, UftStats};
use crate::vpc::gateway::GatewayCounters;
use serde::Serialize;

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
    /// UDP-tunnel GSO super-frames those segments left in, for the kernel to cut
    /// (`--underlay-gso`); 0 when the datapath cuts them itself.
    pub tso_super_frames_out: u64,
    /// Frames delivered to another port of this sled without encapsulation.
    pub local_delivered: u64,
    /// Frames from the underlay that arrived with a congestion mark (CE) on the
    /// outer header, carried into the ECN-capable inner packet (RFC 6040).
    pub ecn_ce_marked: u64,
    /// Times the guest had to wait before its next frame was taken: its egress
    /// limit's tokens were spent (`set-port-limits`).
    pub egress_throttled: u64,
    /// Times a frame for the guest was held because its ingress limit's tokens
    /// were spent.
    pub ingress_throttled: u64,
    /// The epoch the port's cached flows are checked against: moved by changes to
    /// the port's own rules, routes and external addresses, by an MTU change in its
    /// VPC, and by every engine-wide change. A lookup that finds an entry of an
    /// older epoch counts as `stale` in `uft_in`/`uft_out` and is recompiled.
    pub epoch: u64,
    pub uft_in: UftStats,
    pub uft_out: UftStats,
    pub firewall: ConnStats,
    /// The sizes of the port's tables, from its share of the table budget.
    pub table_limits: PortTableLimits,
    pub gateway: GatewayCounters,
    /// Drops by reason.
    pub drops: DropCounters,
}

/// `stats` output.
#[derive(Clone, Debug, Serialize)]
pub struct EngineStats {
    /// Engine-wide invalidations of the cached flows (V2P, V2B, ports, the
    /// underlay); each also moves every port's `epoch`.
    pub epoch: u64,
    pub ports: Vec<PortStats>,
    /// Underlay frames refused by `parse_underlay`, by `UnderlayDrop` name.
    pub underlay_drops: DropCounters,
    /// Drops not attributable to a port.
    pub datapath_drops: DropCounters,
    /// Coalescing of received segments (all ports).
    pub coalescer: CoalesceStats,
    pub v2p_entries: usize,
    /// Guest frames waiting for their underlay next hop.
    pub hold: HoldStats,
    /// The memory budget of the flow and connection tables.
    pub tables: TableBudget,
    /// Frames for guests that moved away, relayed to their new sleds.
    pub relay: RelayStats,
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
            hold: self.hold.stats(),
            tables: self.cfg.tables,
            relay: RelayStats {
                departures: self.departures.len(),
                ..self.relay
            },
        }
    }
}

impl EngineStats {
    /// Adds the stats of another worker's engine, by type: the ports (each lives on
    /// one worker) side by side; drop counters, the coalescer and the hold queue
    /// (each worker's own) summed; what every engine holds alike (the V2P table, the
    /// table budget) and the per-engine epoch not added up.
    pub fn merge(&mut self, o: EngineStats) {
        let EngineStats {
            epoch,
            ports,
            underlay_drops,
            datapath_drops,
            coalescer,
            v2p_entries,
            hold,
            tables: _,
            relay,
        } = o;
        self.epoch = self.epoch.max(epoch);
        self.ports.extend(ports);
        self.underlay_drops.merge(&underlay_drops);
        self.datapath_drops.merge(&datapath_drops);
        self.coalescer.merge(&coalescer);
        self.v2p_entries = self.v2p_entries.max(v2p_entries);
        self.hold.merge(&hold);
        self.relay.merge(&relay);
    }
}

impl Engine {
    /// Port `id`'s drop counters, without copying the rest of its statistics: what
    /// a packet capture compares before and after one frame to say why the
    /// datapath dropped it.
    pub fn port_drops(&self, id: PortId) -> Option<&DropCounters> {
        Some(&self.ports.get(id.0 as usize)?.as_ref()?.c.drops)
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
            tso_super_frames_out: p.c.tso_super_frames_out,
            local_delivered: p.c.local_delivered,
            ecn_ce_marked: p.c.ecn_ce_marked,
            egress_throttled: p.c.egress_throttled,
            ingress_throttled: p.c.ingress_throttled,
            epoch: p.epoch,
            uft_in: p.uft_in.stats(),
            uft_out: p.uft_out.stats(),
            firewall: p.fw.conns().stats(),
            table_limits: p.limits,
            gateway: p.gw.counters().clone(),
            drops: p.c.drops.clone(),
        }
    }
}

/// `dump-uft` output: one page of a port's cached flows, inbound table first.
#[derive(Clone, Debug, Serialize)]
pub struct UftPortDump {
    /// The port's epoch (an entry of an older one is `stale`).
    pub epoch: u64,
    pub inbound: Vec<UftDump>,
    pub outbound: Vec<UftDump>,
    /// The cursor of the next page; absent on the last one (so a table that fits one
    /// page dumps as it always has).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<u64>,
}

/// Most entries one `dump_uft` page holds: about 260 bytes of JSON each, so a page
/// stays near 1 MB (the API's replies may be 16 MiB) and takes its worker a few
/// milliseconds (3 ms measured, JSON included), whatever the size of the table.
pub const UFT_PAGE_MAX: usize = 4096;

/// Cursors at or above this are positions in the outbound table (offset by it);
/// below, in the inbound table.
const OUTBOUND_CURSOR: u64 = 1 << 32;

impl Engine {
    /// Up to `limit` (at most [`UFT_PAGE_MAX`]) of the port's cached flows, from
    /// `cursor`: 0 for the first page, then the `next` of the previous one. Reading
    /// pages in turn returns every flow that stays cached meanwhile exactly once
    /// (flows cached meanwhile may or may not appear). A cursor no page returned is
    /// refused, naming it.
    pub fn dump_uft(
        &self,
        port: &str,
        cursor: u64,
        limit: usize,
    ) -> Result<UftPortDump, EngineError> {
        let p = self.port_by_name(port)?;
        if cursor >= 2 * OUTBOUND_CURSOR {
            return Err(EngineError::BadCursor { cursor });
        }
        let (epoch, now) = (p.epoch, self.now);
        let limit = limit.clamp(1, UFT_PAGE_MAX);
        let mut d = UftPortDump {
            epoch,
            inbound: Vec::new(),
            outbound: Vec::new(),
            next: None,
        };
        let mut out_from = cursor.saturating_sub(OUTBOUND_CURSOR);
        if cursor < OUTBOUND_CURSOR {
            let (page, next) = p.uft_in.dump_page(cursor as usize, limit, epoch, now);
            d.inbound = page;
            if let Some(n) = next {
                d.next = Some(n as u64);
                return Ok(d);
            }
            out_from = 0;
        }
        let left = limit - d.inbound.len();
        if left == 0 {
            d.next = (!p.uft_out.is_empty()).then_some(OUTBOUND_CURSOR);
            return Ok(d);
        }
        let (page, next) = p.uft_out.dump_page(out_from as usize, left, epoch, now);
        d.outbound = page;
        d.next = next.map(|n| OUTBOUND_CURSOR + n as u64);
        Ok(d)
    }
}
