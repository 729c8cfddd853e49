//! Frames from outside the VPC (the Geneve External option, from boundary
//! services, sender already checked) to one of a port's external addresses
//! (docs/nat.md): admitted by the inbound flow table under the key they arrive with,
//! whose entry also holds their translation to the port's private address, then
//! translated and delivered, TCP through the coalescer like traffic inside the VPC.

use super::inbound::{compile_inbound, inbound_verdict, verdict, Delivery, Via};
use super::{confirm, ip_bytes, Port};
use crate::drop::DropReason;
use crate::firewall::TcpSegment;
use crate::flow::FlowKey;
use crate::input::RxFrame;
use crate::nat::{self, End, InboundTarget};
use crate::output::{TxBatch, TxDest};
use crate::rule::Direction;
use crate::tso::{Coalescer, Translation};
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
    frame: RxFrame<'_>,
    meta: &InnerMeta,
    now: u64,
    out: &mut TxBatch,
) {
    if nat::is_icmp_error(meta) {
        return icmp_error(p, coalescer, via, to, frame, meta, now, out);
    }
    let arrived = FlowKey::from_meta(to.vni, meta);
    let t = match nat_verdict(p, via, &arrived, meta, frame.head(), now) {
        Ok(t) => t,
        Err(r) => {
            p.c.drops.inc(r);
            return;
        }
    };
    let Some(private) = nat::private_of(meta.dst_ip, p.cfg.ipv4, p.cfg.ipv6) else {
        // No translation is made for a family the port has no address of.
        p.c.drops.inc(DropReason::NatNoMapping);
        return;
    };
    let r = t.rewrite(private);
    if t.one_to_one {
        let m = nat::rewritten_meta(meta, End::Dst, r.ip, r.port);
        let key = FlowKey::from_meta(to.vni, &m);
        nat::note_inbound(&p.cfg.external, &mut p.snat, &p.fw, &key, meta.dst_ip, now);
    }
    p.c.in_packets += 1;
    p.c.in_bytes += frame.len() as u64;
    let gateway_mac = p.cfg.gateway_mac;
    // Only the headers change: the payload is still referred to where it arrived,
    // and a coalesced frame is translated once.
    let n = meta.payload_off;
    if (wire::ethernet::HEADER_LEN..=frame.head().len()).contains(&n) {
        let t = Translation {
            rewrite: r,
            end: End::Dst,
        };
        coalescer.push_translated(to.port, frame, meta, &t, to.mss, gateway_mac, out);
        return;
    }
    // Headers across the frame's pieces: the whole frame is translated in a copy.
    let buf = whole_copy(coalescer, to, &frame, out);
    r.apply(buf, meta, End::Dst);
    // The parser saw a whole Ethernet header: the MACs are there.
    buf[6..12].copy_from_slice(gateway_mac.as_bytes());
    coalescer.count_passed();
}

/// The inbound flow table's verdict on a packet from outside, `arrived` its key
/// (to the external address), and the packet's translation. A hit serves both;
/// a miss finds the translation in the NAT tables and has the firewall decide the
/// translated flow (`compile_inbound`, which caches the outcome under `arrived`).
/// `head` is the start of the frame as received (read for the TCP header).
fn nat_verdict(
    p: &mut Port,
    via: &Via<'_>,
    arrived: &FlowKey,
    meta: &InnerMeta,
    head: &[u8],
    now: u64,
) -> Result<InboundTarget, DropReason> {
    // One predictable branch for a port that is not paused.
    if p.paused {
        return Err(DropReason::PortPaused);
    }
    let bytes = ip_bytes(meta);
    if let Some(e) = p.uft_in.lookup(arrived, p.epoch, now, bytes) {
        // Entries under a key to an external address are made with a translation.
        if let Some(t) = e.action.nat {
            if !via.admits(&e.action.sender) {
                return Err(DropReason::UnderlaySrcMismatch);
            }
            let seg = TcpSegment::read(meta, head);
            if confirm(e, &mut p.fw, Direction::In, seg, bytes, now) {
                return verdict(e.action.verdict).map(|()| t);
            }
        }
    }
    let cfg = &p.cfg;
    let t = nat::inbound_target(&cfg.external, cfg.ipv4, cfg.ipv6, &p.snat, meta)
        .ok_or(DropReason::NatNoMapping)?;
    let private =
        nat::private_of(meta.dst_ip, cfg.ipv4, cfg.ipv6).ok_or(DropReason::NatNoMapping)?;
    let m = nat::rewritten_meta(meta, End::Dst, private, t.port);
    let key = FlowKey::from_meta(arrived.vni, &m);
    compile_inbound(p, via, &key, &m, head, now, Some((*arrived, t)))?;
    Ok(t)
}

/// An ICMP error from outside: translated (quote included) in a copy of the whole
/// frame, then decided as the flow it is about, on every packet (the inbound
/// firewall admits it through the connection it quotes).
#[allow(clippy::too_many_arguments)]
fn icmp_error(
    p: &mut Port,
    coalescer: &mut Coalescer,
    via: &Via<'_>,
    to: Delivery,
    frame: RxFrame<'_>,
    meta: &InnerMeta,
    now: u64,
    out: &mut TxBatch,
) {
    // Translated in the copy; a frame that is then refused is taken back.
    let buf = whole_copy(coalescer, to, &frame, out);
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

/// A copy of all of `frame` pushed for port `to.port`, with no offload claims, to
/// be translated in place: after the port's held segments, to keep their order.
fn whole_copy<'b>(
    coalescer: &mut Coalescer,
    to: Delivery,
    frame: &RxFrame<'_>,
    out: &'b mut TxBatch,
) -> &'b mut [u8] {
    coalescer.flush_for(to.port, out);
    let dest = TxDest::Port {
        port: to.port,
        vnet: VnetHdr::default(),
    };
    let buf = out.push_unzeroed(dest, frame.len());
    frame.copy_into(buf);
    buf
}
