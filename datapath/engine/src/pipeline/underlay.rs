//! Underlay to guest: [`Engine::process_underlay`] (outer validation, our underlay
//! address, the port by (VNI, inner destination MAC), the outer ECN field combined
//! into the inner one, its inbound checks, coalescing),
//! frames other workers hand over ([`Engine::process_sibling`]), and the end of a
//! receive batch ([`Engine::end_of_batch`]).

use super::config::UnderlayRoutes;
use super::dispatch::Owner;
use super::external;
use super::inbound::{deliver_local, inbound_verdict, Delivery, Via};
use super::ports::slot_mut;
use super::Engine;
use crate::drop::DropReason;
use crate::frames::ecn::{self, Decap};
use crate::frames::input::RxFrame;
use crate::frames::output::{SiblingFrame, TxBatch, TxDest};
use crate::ids::Vni;
use crate::machinery::flow::FlowKey;
use crate::vpc::overlay::{InboundTrust, UnderlaySource};
use wire::meta::InnerMeta;
use wire::vnet::VnetHdr;

impl Engine {
    /// One frame from the underlay, as received (in pieces or not). Decapsulated
    /// frames refer to `frame`'s input (see [`crate::frames::output`]): keep it until the
    /// batch is drained.
    pub fn process_underlay(
        &mut self,
        frame: RxFrame<'_>,
        now: u64,
        routes: &dyn UnderlayRoutes,
        out: &mut TxBatch,
    ) {
        self.now = self.now.max(now);
        // The metadata is borrowed from the parsers' results rather than moved out
        // of them: together they are ~170 bytes, and moving them was a copy per
        // packet.
        let outer = wire::meta::parse_underlay_head(frame.head(), frame.len());
        let um = match &outer {
            Some(Ok(um)) => um,
            Some(Err(d)) => return self.underlay_drops.inc(DropReason::from(*d)),
            None => return self.process_underlay_linearized(frame, now, routes, out),
        };
        if um.outer_dst != self.cfg.underlay_addr {
            self.drops.inc(DropReason::NotOurUnderlayAddr);
            return;
        }
        // The parser bounds the inner frame by the frame's length.
        let inner = frame.sub(um.inner_off..um.inner_end);
        let parsed = wire::meta::parse_inner_head(inner.head(), inner.len());
        let meta = match &parsed {
            Some(Ok(m)) => m,
            Some(Err(_)) => return self.drops.inc(DropReason::InnerParse),
            None => return self.process_underlay_linearized(frame, now, routes, out),
        };
        if meta.dst_mac.is_multicast() {
            self.drops.inc(DropReason::InnerMulticast);
            return;
        }
        let port = match self.by_mac.get(um.vni, meta.dst_mac) {
            Some(Owner::Port(p)) => p,
            Some(Owner::Sibling(worker)) => {
                // The owner runs every check below, the sender's included.
                let dest = TxDest::Sibling {
                    worker,
                    frame: SiblingFrame::Underlay,
                };
                out.push_gather(dest, &[], &[frame.input_ref(0..frame.len())]);
                return;
            }
            // Only the frame goes out of line (the relay parses it again): the
            // parsers' results passed along would be kept in memory for every
            // frame (+30 to +60 instructions per frame, callgrind).
            None => return self.relay_departed(frame, routes, out),
        };
        let trust = InboundTrust {
            v2p: &self.v2p,
            boundary: self.v2b.endpoints(),
            this_sled: &self.cfg.underlay_addr,
        };
        let mut via = Via::Underlay {
            trust: &trust,
            from: UnderlaySource {
                sled: um.outer_src,
                external: um.external,
                mac: meta.src_mac,
                relayed: false,
            },
        };
        let Some(p) = slot_mut(&mut self.ports, port) else {
            self.drops.inc(DropReason::NoPort);
            return;
        };
        if let Some(a) = p.arrival {
            via.relayed_by(&a, now);
        }
        // Ethernet padding after the IP packet stays behind.
        let inner = inner.sub(0..meta.ip_end);
        // A congestion mark a switch set on the outer header goes into the inner
        // packet (RFC 6040), decided before the firewall sees the packet so a drop
        // leaves no state behind.
        let ecn = match ecn::decapsulate_packet(um.outer_tclass, inner.head(), meta) {
            Decap::Keep => None,
            Decap::Set(e) => {
                if e == ecn::CE {
                    p.c.ecn_ce_marked += 1;
                }
                Some(e)
            }
            Decap::Drop => return p.c.drops.inc(DropReason::EcnCeNotEct),
        };
        // From outside the VPC: only from boundary services (checked with the flow),
        // to an external address through NAT (`external.rs`), or untranslated to
        // an external attached subnet (`attach-subnet -e`), whose frames take the
        // inbound checks below as any other (one empty-list branch without one).
        if um.external && !p.cfg.cidrs.exempts_nat(meta.dst_ip) {
            let to = Delivery {
                port,
                vni: um.vni,
                mss: um.mss,
                ecn,
            };
            let coalescer = &mut self.coalescer;
            external::from_outside(p, coalescer, &via, to, &inner, meta, now, out);
            return;
        }
        let key = FlowKey::from_meta(um.vni, meta);
        if let Err(r) = inbound_verdict(p, &via, &key, meta, inner.head(), now) {
            p.c.drops.inc(r);
            return;
        }
        p.c.in_packets += 1;
        p.c.in_bytes += inner.len() as u64;
        self.coalescer
            .push(port, inner, meta, ecn, um.mss, p.cfg.gateway_mac, out);
    }

    /// [`Engine::process_underlay`] of a frame whose headers span its pieces: never
    /// seen from copy-mode AF_XDP, whose first piece holds 3840 bytes, but possible
    /// with other drivers. The frame is made contiguous; references still resolve
    /// to the input's own pieces, which hold the same bytes at the same offsets.
    #[cold]
    fn process_underlay_linearized(
        &mut self,
        frame: RxFrame<'_>,
        now: u64,
        routes: &dyn UnderlayRoutes,
        out: &mut TxBatch,
    ) {
        let mut linear = std::mem::take(&mut self.linear);
        linear.clear();
        frame.copy_to(0..frame.len(), &mut linear);
        let pieces = [&linear[..]];
        // Contiguous: the parsers decide from it, so this does not come back here.
        self.process_underlay(RxFrame::new(&pieces, frame.input()), now, routes, out);
        self.linear = linear;
    }

    /// A guest frame another worker of this sled handed over for a port of this
    /// engine in VPC `vni` (it left that worker's engine as [`SiblingFrame::Guest`]
    /// after the sending port's own checks). It gets the destination port's inbound
    /// checks, as same-sled delivery does. Delivered frames refer to `frame`'s input.
    pub fn process_sibling(
        &mut self,
        vni: Vni,
        vnet: VnetHdr,
        frame: RxFrame<'_>,
        now: u64,
        out: &mut TxBatch,
    ) {
        self.now = self.now.max(now);
        let parsed = wire::meta::parse_inner_head(frame.head(), frame.len());
        match &parsed {
            Some(Ok(m)) => self.sibling_parsed(vni, vnet, frame, m, now, out),
            Some(Err(_)) => self.drops.inc(DropReason::InnerParse),
            None => {
                // Headers across pieces (see `process_underlay_linearized`).
                let mut linear = std::mem::take(&mut self.linear);
                linear.clear();
                frame.copy_to(0..frame.len(), &mut linear);
                let pieces = [&linear[..]];
                self.process_sibling(vni, vnet, RxFrame::new(&pieces, frame.input()), now, out);
                self.linear = linear;
            }
        }
    }

    fn sibling_parsed(
        &mut self,
        vni: Vni,
        vnet: VnetHdr,
        frame: RxFrame<'_>,
        m: &InnerMeta,
        now: u64,
        out: &mut TxBatch,
    ) {
        let Some(Owner::Port(dst)) = self.by_mac.get(vni.get(), m.dst_mac) else {
            self.drops.inc(DropReason::NoPort);
            return;
        };
        let frame = frame.sub(0..m.ip_end);
        deliver_local(&mut self.ports, dst, vnet, frame, m, now, out);
    }

    /// Flushes frames held for coalescing; call after each receive batch.
    pub fn end_of_batch(&mut self, out: &mut TxBatch) {
        self.coalescer.flush(out);
    }
}
