//! Frames from outside the VPC (the Geneve External option; only boundary services
//! may send them) to one of a port's external addresses
//! (docs/nat.md): admitted by the inbound flow table under the key they arrive with,
//! whose entry also holds their translation to the port's private address, then
//! translated and delivered, TCP through the coalescer like traffic inside the VPC.

use super::inbound::{compile_inbound, inbound_verdict, verdict, Delivery, Via};
use super::ports::Port;
use crate::drop::DropReason;
use crate::frames::ecn;
use crate::frames::input::RxFrame;
use crate::frames::output::{TxBatch, TxDest};
use crate::frames::rewrite::{rewritten_meta, End, Rewrite};
use crate::frames::tso::Coalescer;
use crate::machinery::conntrack::TcpSegment;
use crate::machinery::flow::{ip_bytes, FlowKey};
use crate::machinery::rule::Direction;
use crate::vpc::nat::{self, InboundTarget};
use wire::meta::InnerMeta;
use wire::vnet::VnetHdr;

/// Delivers `frame` (`meta` parsed from it, cut at the end of its IP packet) from
/// outside to port `p`'s guest, translated, or counts why not. The received buffer
/// is never written to: the translation is made in what the guest gets.
#[allow(clippy::too_many_arguments)]
pub(super) fn from_outside(
    p: &mut Port,
    coalescer: &mut Coalescer,
    via: &Via<'_>,
    to: Delivery,
    frame: &RxFrame<'_>,
    meta: &InnerMeta,
    now: u64,
    out: &mut TxBatch,
) {
    if nat::is_icmp_error(meta) {
        return icmp_error(p, coalescer, via, to, frame, meta, now, out);
    }
    let arrived = FlowKey::from_meta(to.vni, meta);
    let Some(t) = nat_verdict(p, via, &arrived, meta, frame.head(), now) else {
        return;
    };
    let Some(private) = nat::private_of(meta.dst_ip, p.cfg.ipv4, p.cfg.ipv6) else {
        // No translation is made for a family the port has no address of.
        p.c.drops.inc(DropReason::NatNoMapping);
        return;
    };
    let r = t.rewrite(private);
    if t.one_to_one {
        note_one_to_one(p, to.vni, meta, &r, now);
    }
    p.c.in_packets += 1;
    p.c.in_bytes += frame.len() as u64;
    let gateway_mac = p.cfg.gateway_mac;
    // Only the headers change: the payload is still referred to where it arrived,
    // and a coalesced frame is translated once.
    let n = meta.payload_off;
    if (wire::ethernet::HEADER_LEN..=frame.head().len()).contains(&n) {
        let (ecn, mss) = (to.ecn, to.mss);
        coalescer.push_translated(to.port, frame, meta, &r, ecn, mss, gateway_mac, out);
        return;
    }
    // Headers across the frame's pieces: the whole frame is translated in a copy.
    let buf = whole_copy(coalescer, to, frame, meta, out);
    r.apply(buf, meta, End::Dst);
    // The parser saw a whole Ethernet header: the MACs are there.
    buf[6..12].copy_from_slice(gateway_mac.as_bytes());
    coalescer.count_passed();
}

/// The inbound flow table's verdict on a packet from outside, `arrived` its key
/// (to the external address), and the packet's translation, or `None` with the
/// drop counted. A hit serves both; a miss is [`nat_miss`]. `head` is the start of
/// the frame as received (read for the TCP header).
///
/// An `Option` rather than a `Result`: it has the translation's own layout (its
/// flag's spare values mark `None`), where the `Result` with the drop reason was
/// packed at odd offsets and taken apart again on every packet.
#[inline]
fn nat_verdict(
    p: &mut Port,
    via: &Via<'_>,
    arrived: &FlowKey,
    meta: &InnerMeta,
    head: &[u8],
    now: u64,
) -> Option<InboundTarget> {
    // One predictable branch for a port that is not paused.
    if p.paused {
        return dropped(p, DropReason::PortPaused);
    }
    let bytes = ip_bytes(meta);
    // Entries under a key to an external address are made with a translation.
    let Some((e, t)) = p
        .uft_in
        .lookup(arrived, p.epoch, now, bytes)
        .and_then(|e| e.action.nat.map(|t| (e, t)))
    else {
        return nat_miss(p, via, arrived, meta, head, now);
    };
    if !via.admits(&e.action.sender) {
        return dropped(p, DropReason::UnderlaySrcMismatch);
    }
    let seg = TcpSegment::read(meta, head);
    if !e.confirm(p.fw.conns_mut(), Direction::In, seg, bytes, now) {
        return nat_miss(p, via, arrived, meta, head, now);
    }
    match verdict(e.action.verdict) {
        Ok(()) => Some(t),
        Err(r) => dropped(p, r),
    }
}

/// Counts a drop of port `p`'s frame, for [`nat_verdict`].
fn dropped(p: &mut Port, r: DropReason) -> Option<InboundTarget> {
    p.c.drops.inc(r);
    None
}

/// The miss of [`nat_verdict`] (or an entry that no longer holds): the translation
/// from the NAT tables, then the firewall decides the translated flow
/// (`compile_inbound`, which caches the outcome under `arrived`). Out of line, so
/// that the hit path keeps its registers.
#[cold]
#[inline(never)]
fn nat_miss(
    p: &mut Port,
    via: &Via<'_>,
    arrived: &FlowKey,
    meta: &InnerMeta,
    head: &[u8],
    now: u64,
) -> Option<InboundTarget> {
    // Only boundary services send from outside: checked before the NAT tables
    // are (and again, for the entry, by `compile_inbound`).
    let cfg = &p.cfg;
    let found = via.sender(cfg.vni, meta.src_ip).and_then(|_| {
        let t = nat::inbound_target(&cfg.external, cfg.ipv4, cfg.ipv6, &p.snat, meta);
        t.zip(nat::private_of(meta.dst_ip, cfg.ipv4, cfg.ipv6))
            .ok_or(DropReason::NatNoMapping)
    });
    let (t, private) = match found {
        Ok(found) => found,
        Err(r) => return dropped(p, r),
    };
    let m = rewritten_meta(meta, End::Dst, private, t.port);
    let key = FlowKey::from_meta(arrived.vni, &m);
    match compile_inbound(p, via, &key, &m, head, now, Some((*arrived, t))) {
        Ok(()) => Some(t),
        Err(r) => dropped(p, r),
    }
}

/// A connection from outside to a 1:1 address, translated by `r`: remembered so
/// that its replies leave from that address (`nat::note_inbound`). Out of line:
/// SNAT flows never get here.
#[inline(never)]
fn note_one_to_one(p: &mut Port, vni: u32, meta: &InnerMeta, r: &Rewrite, now: u64) {
    let m = rewritten_meta(meta, End::Dst, r.ip, r.port);
    let key = FlowKey::from_meta(vni, &m);
    nat::note_inbound(
        &p.cfg.external,
        &mut p.snat,
        p.fw.conns(),
        &key,
        meta.dst_ip,
        now,
    );
}

/// An ICMP error from outside: translated (quote included) in a copy of the whole
/// frame, then decided as the flow it is about, on every packet (the inbound
/// firewall admits it through the connection it quotes). Out of line, as the
/// flow-table miss is.
#[allow(clippy::too_many_arguments)]
#[inline(never)]
fn icmp_error(
    p: &mut Port,
    coalescer: &mut Coalescer,
    via: &Via<'_>,
    to: Delivery,
    frame: &RxFrame<'_>,
    meta: &InnerMeta,
    now: u64,
    out: &mut TxBatch,
) {
    // Only boundary services send from outside; the translation is made in a copy,
    // and a frame that is then refused is taken back.
    if let Err(r) = via.sender(p.cfg.vni, meta.src_ip) {
        p.c.drops.inc(r);
        return;
    }
    let buf = whole_copy(coalescer, to, frame, meta, out);
    let (cfg, snat) = (&p.cfg, &p.snat);
    let verdict = match nat::inbound_icmp_error(&cfg.external, cfg.ipv4, cfg.ipv6, snat, meta, buf)
    {
        None => Err(DropReason::NatNoMapping),
        Some(m) => {
            let key = FlowKey::from_meta(to.vni, &m);
            inbound_verdict(p, via, &key, &m, buf, now)
        }
    };
    match verdict {
        Ok(()) => {
            // The parser saw a whole Ethernet header: the MACs are there.
            buf[6..12].copy_from_slice(p.cfg.gateway_mac.as_bytes());
            p.c.in_packets += 1;
            p.c.in_bytes += frame.len() as u64;
            coalescer.count_passed();
        }
        Err(r) => {
            out.pop();
            p.c.drops.inc(r);
        }
    }
}

/// A copy of all of `frame` (`meta` parsed from it) pushed for port `to.port`, with
/// no offload claims and its ECN field as decapsulation sets it, to be translated
/// in place: after the port's held segments, to keep their order. Cold: only ICMP
/// errors and frames whose headers span their pieces take it.
#[cold]
fn whole_copy<'b>(
    coalescer: &mut Coalescer,
    to: Delivery,
    frame: &RxFrame<'_>,
    meta: &InnerMeta,
    out: &'b mut TxBatch,
) -> &'b mut [u8] {
    coalescer.flush_for(to.port, out);
    let dest = TxDest::Port {
        port: to.port,
        vnet: VnetHdr::default(),
    };
    let buf = out.push_unzeroed(dest, frame.len());
    frame.copy_into(buf);
    if let Some(e) = to.ecn {
        ecn::set_inner_ecn(buf, meta, e);
    }
    buf
}
