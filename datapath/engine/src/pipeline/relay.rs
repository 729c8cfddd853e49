//! The old sled's half of a move's grace period (`vpc::moved`): a frame from the
//! underlay for a guest that left this sled goes on to the sled it went to,
//! re-encapsulated from this sled's address, once this sled's own tables have
//! vouched for its sender. The new sled admits it into the moved port only.

use super::config::UnderlayRoutes;
use super::Engine;
use crate::drop::DropReason;
use crate::frames::ecn::{self, Decap};
use crate::frames::encap::OuterTemplate;
use crate::frames::input::RxFrame;
use crate::frames::output::{TxBatch, TxDest};
use crate::ids::Vni;
use crate::vpc::overlay::{InboundTrust, UnderlaySource};
use serde::Serialize;

/// Frames relayed to the sleds guests moved to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RelayStats {
    pub relayed_frames: u64,
    pub relayed_bytes: u64,
    /// Guests whose frames are relayed now (their grace period not over).
    pub departures: usize,
}

impl RelayStats {
    /// Adds another worker's counts; every worker holds the same departures.
    pub fn merge(&mut self, o: &RelayStats) {
        self.relayed_frames += o.relayed_frames;
        self.relayed_bytes += o.relayed_bytes;
        self.departures = self.departures.max(o.departures);
    }
}

impl Engine {
    /// A frame from the underlay that no port here takes, its headers parsed
    /// and contiguous: relayed if its guest left for another sled within the
    /// grace period and its sender is one this sled trusts, dropped (counted)
    /// otherwise.
    #[cold]
    #[inline(never)]
    pub(super) fn relay_departed(
        &mut self,
        frame: RxFrame<'_>,
        routes: &dyn UnderlayRoutes,
        out: &mut TxBatch,
    ) {
        // Most frames for no port meet no departure: not parsed again.
        if self.departures.is_empty() {
            return self.drops.inc(DropReason::NoPort);
        }
        // Parsed again as `process_underlay` parsed it (so neither fails).
        let Some(Ok(um)) = wire::meta::parse_underlay_head(frame.head(), frame.len()) else {
            return self.drops.inc(DropReason::NoPort);
        };
        let inner = frame.sub(um.inner_off..um.inner_end);
        let Some(Ok(meta)) = wire::meta::parse_inner_head(inner.head(), inner.len()) else {
            return self.drops.inc(DropReason::NoPort);
        };
        let meta = &meta;
        let now = self.now;
        // Frames from outside the VPC go where boundary services' own tables
        // say; the new sled would not admit them as relays.
        if um.external {
            return self.drops.inc(DropReason::NoPort);
        }
        let (Some(to), Ok(vni)) = (
            self.departures.relay_to(um.vni, meta.dst_mac, now),
            Vni::new(um.vni),
        ) else {
            return self.drops.inc(DropReason::NoPort);
        };
        let trust = InboundTrust {
            v2p: &self.v2p,
            boundary: self.v2b.endpoints(),
            this_sled: &self.cfg.underlay_addr,
        };
        let from = UnderlaySource {
            sled: um.outer_src,
            external: um.external,
            mac: meta.src_mac,
            relayed: false,
        };
        if let Err(r) = trust.sender(vni, meta.src_ip, &from) {
            return self.drops.inc(r);
        }
        // The sender picked the outer source port from its flow's hash: the flow
        // keeps one next hop here too.
        let Some(hop) = routes.next_hops(to).pick(u64::from(um.udp_src_port)) else {
            return self.drops.inc(DropReason::MovedNotRelayed);
        };
        let outer = OuterTemplate::new(
            hop.src_mac,
            hop.dst_mac,
            self.cfg.underlay_addr,
            to,
            um.udp_src_port,
            u32::from(um.udp_src_port),
            vni,
            false,
            self.cfg.outer_udp_checksum,
        )
        .with_dscp(self.cfg.outer_dscp);
        // The header is no longer than the one the frame came with (the same
        // options at most): it fits the underlay as it did.
        let inner = inner.sub(0..meta.ip_end);
        let (len, with_mss) = (inner.len(), um.mss.is_some());
        if len > outer.max_inner_len(with_mss) {
            return self.drops.inc(DropReason::MovedNotRelayed);
        }
        // This sled ends one tunnel and starts another: a congestion mark of the
        // first goes into the inner packet (RFC 6040), whose field the new outer
        // header copies.
        let ecn = match ecn::decapsulate_packet(um.outer_tclass, inner.head(), meta) {
            Decap::Keep => None,
            Decap::Set(e) => Some(e),
            Decap::Drop => return self.drops.inc(DropReason::EcnCeNotEct),
        };
        let hlen = outer.header_len(with_mss);
        let dest = TxDest::Underlay {
            ifindex: hop.ifindex,
        };
        let buf = out.push_unzeroed(dest, hlen + len);
        inner.copy_into(&mut buf[hlen..]);
        if let Some(e) = ecn {
            ecn::set_inner_ecn(&mut buf[hlen..], meta, e);
        }
        outer.write_header(buf, len, um.mss);
        self.relay.relayed_frames += 1;
        self.relay.relayed_bytes += len as u64;
    }
}
