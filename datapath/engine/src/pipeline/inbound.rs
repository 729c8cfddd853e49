//! A port's inbound checks, for every frame bound to one of this engine's ports
//! (from the underlay, from outside through NAT, from another port of this sled):
//! the destination must be the guest's, then the cached flow and its sender, or on
//! a miss the overlay's trust and the inbound firewall ([`inbound_verdict`],
//! [`compile_inbound`]); and same-sled delivery ([`deliver_local`]).

use super::action::{InAction, InVerdict};
use super::ports::{slot_mut, Port};
use crate::drop::DropReason;
use crate::frames::input::RxFrame;
use crate::frames::output::{TxBatch, TxDest};
use crate::frames::tso;
use crate::ids::{PortId, Vni};
use crate::machinery::conntrack::{ConnTable, TcpSegment};
use crate::machinery::flow::{ip_bytes, FlowKey};
use crate::machinery::rule::{Direction, MatchFields};
use crate::machinery::uft::UftEntry;
use crate::vpc::moved::Arrival;
use crate::vpc::nat;
use crate::vpc::overlay::{InboundTrust, Sender, UnderlaySource};
use std::net::IpAddr;
use wire::meta::{InnerMeta, L3};
use wire::vnet::VnetHdr;

/// How a frame reached the port it is bound for.
#[derive(Clone, Copy, Debug)]
pub(super) enum Via<'a> {
    /// Over the underlay, from `from`; `trust` says whom the overlay admits.
    Underlay {
        trust: &'a InboundTrust<'a>,
        from: UnderlaySource,
    },
    /// From a port of this sled, whose own outbound checks it passed.
    Local,
}

impl Via<'_> {
    /// Whether a frame of a cached flow comes from the flow's sender. Same-sled
    /// delivery has no underlay and nothing to check.
    #[inline]
    pub(super) fn admits(&self, s: &Sender) -> bool {
        match self {
            Via::Underlay { trust, from } => trust.admits(s, from),
            Via::Local => true,
        }
    }

    /// Marks a frame from the underlay as relayed when it comes from the sled the
    /// port arrived from, within the grace period (`vpc::moved`).
    #[inline]
    pub(super) fn relayed_by(&mut self, arrival: &Arrival, now: u64) {
        if let Via::Underlay { from, .. } = self {
            from.relayed = arrival.relays(from.sled, now);
        }
    }

    /// Whether the frame is admitted as sent by `s` only because the sled the
    /// port came from relayed it.
    fn relay_only(&self, s: &Sender) -> bool {
        match self {
            Via::Underlay { trust, from } => trust.relay_only(s, from),
            Via::Local => false,
        }
    }

    /// Whether the frame comes from outside the VPC (the Geneve External option).
    fn external(&self) -> bool {
        match self {
            Via::Underlay { from, .. } => from.external,
            Via::Local => false,
        }
    }

    /// The sender to compile into a new flow's entry, if the tables trust this frame
    /// to be it.
    pub(super) fn sender(&self, vni: Vni, src_ip: IpAddr) -> Result<Sender, DropReason> {
        match self {
            Via::Underlay { trust, from } => trust.sender(vni, src_ip, from),
            Via::Local => Ok(Sender::Local),
        }
    }
}

/// Which port a frame from the underlay is for, in which VPC (its VNI), and the
/// sender's MSS (the Geneve Mss option).
#[derive(Clone, Copy)]
pub(super) struct Delivery {
    pub port: PortId,
    pub vni: u32,
    pub mss: Option<u32>,
    /// The inner ECN field to set (RFC 6040 decapsulation), if it changes.
    pub ecn: Option<u8>,
}

/// Inbound checks for a frame bound to port `p`, arrived `via` the underlay or from
/// another local port: the destination must be the guest; then the cached flow, whose
/// sender the frame must come from, or, for a new flow, the overlay's trust and the
/// inbound firewall decide. `head` is the start of the inner Ethernet frame `m`
/// describes, as far as it is contiguous (read for the TCP header and the packet an
/// ICMP error quotes).
///
/// A frame from the wrong sender, and a firewall refusal that depends on the packet
/// rather than the flow (`fw_midstream_in`, `tcp_out_of_window`), are dropped without
/// touching the flow table: a forged frame can neither replace nor pre-empt the
/// entry of a real flow.
pub(super) fn inbound_verdict(
    p: &mut Port,
    via: &Via<'_>,
    key: &FlowKey,
    m: &InnerMeta,
    head: &[u8],
    now: u64,
) -> Result<(), DropReason> {
    // One predictable branch for a port that is not paused.
    if p.paused {
        return Err(DropReason::PortPaused);
    }
    let own = match (m.l3, m.dst_ip) {
        (L3::Ipv4, IpAddr::V4(a)) => p.cfg.ipv4 == Some(a),
        (L3::Ipv6, IpAddr::V6(a)) => p.cfg.ipv6 == Some(a),
        (L3::Ipv4 | L3::Ipv6, _) => false,
        _ => return Err(DropReason::InboundNotIp),
    };
    // Transit IPs and attached subnets (`allow-cidr --dir in`): looked at only for
    // a destination that is not the guest's own.
    if !own && !p.cfg.cidrs.admits_in(m.dst_ip) {
        return Err(DropReason::InboundDstNotGuest);
    }
    let bytes = ip_bytes(m);
    // Entries with a NAT translation are for frames from outside only (keyed by
    // the external address they arrive to, `external.rs`).
    if let Some(e) = p
        .uft_in
        .lookup(key, p.epoch, now, bytes)
        .filter(|e| e.action.nat.is_none())
    {
        if !via.admits(&e.action.sender) {
            return Err(DropReason::UnderlaySrcMismatch);
        }
        if e.confirm(
            p.fw.conns_mut(),
            Direction::In,
            TcpSegment::read(m, head),
            bytes,
            now,
        ) {
            return verdict(e.action.verdict);
        }
    }
    compile_inbound(p, via, key, m, head, now, None)
}

/// The inbound flow-table miss (or an entry that no longer holds): the overlay's
/// trust, then the firewall, decide the flow, and the result is cached. Out of line,
/// so that the hit path above keeps its registers.
///
/// A flow from outside comes with `nat`: the key it arrived with (to the external
/// address), under which the outcome is cached with its translation, and that
/// translation; `key` and `m` are the translated flow, which the firewall decides.
/// A flow to a SNAT port is cached only while the connection holding the port
/// lives (the port may go to another flow after it); a 1:1 address's translation
/// holds until the epoch changes.
#[cold]
pub(super) fn compile_inbound(
    p: &mut Port,
    via: &Via<'_>,
    key: &FlowKey,
    m: &InnerMeta,
    head: &[u8],
    now: u64,
    nat: Option<(FlowKey, nat::InboundTarget)>,
) -> Result<(), DropReason> {
    let sender = via.sender(p.cfg.vni, m.src_ip)?;
    // A relay of the sled the port came from continues a connection the port
    // tracks (imported with it, or opened since); it never opens one.
    let conn = ConnTable::conn_key(Direction::In, key);
    if via.relay_only(&sender) && p.fw.conns().live_handle(&conn, now).is_none() {
        return Err(DropReason::UnderlaySrcMismatch);
    }
    let seg = TcpSegment::read(m, head);
    let mut f = MatchFields::of(key, m);
    // The frame's VPC: the VNI it came in (the port's, which found it), unless it
    // comes from outside the VPC.
    if !via.external() {
        f.vpc_vni = Some(key.vni);
    }
    let q = key.quoted(m, head);
    let (v, admitted) = match p
        .fw
        .admit(Direction::In, &f, seg, ip_bytes(m), q.as_ref(), now)
    {
        Ok(a) => (InVerdict::Deliver, Some(a)),
        // Decided by this segment, not by the flow: a later SYN, or a segment in the
        // window, of the same flow must be decided afresh, so nothing is cached.
        Err(r) if r.per_packet() => return Err(r),
        Err(r) => (InVerdict::Drop(r), None),
    };
    if admitted.is_some_and(|a| a.created) {
        p.uft_out.remove(&key.reversed());
    }
    let (cache_key, nat) = match nat {
        Some((arrived, t)) => (arrived, Some(t)),
        None => (*key, None),
    };
    let connected = admitted.is_some_and(|a| a.needs_conn && a.conn.is_some());
    if nat.is_some_and(|t| !t.one_to_one) && !connected {
        return verdict(v);
    }
    p.uft_in.insert(
        cache_key,
        UftEntry {
            epoch: p.epoch,
            action: InAction {
                sender,
                verdict: v,
                nat,
            },
            path_mtu: 0,
            needs_conn: admitted.is_some_and(|a| a.needs_conn),
            conn: admitted.and_then(|a| a.conn),
            created: now,
            last_hit: now,
            hits: 0,
            bytes: 0,
        },
    );
    verdict(v)
}

pub(super) fn verdict(v: InVerdict) -> Result<(), DropReason> {
    match v {
        InVerdict::Deliver => Ok(()),
        InVerdict::Drop(r) => Err(r),
    }
}

/// Same-sled delivery: the sender's `virtio_net_hdr` is checked against the frame as
/// segmentation would check it (a tap hands a lying header to the receiving guest's
/// kernel as it is), then the destination port's inbound checks; the frame goes to
/// its tap as it is (a partial checksum or GSO buffer is fine for a tap), with the
/// MACs a frame from the gateway has. A frame whose input the caller keeps until the
/// batch is drained is passed by reference; a [`RxFrame::TRANSIENT`] one is copied.
/// Drops count on the destination port.
#[allow(clippy::too_many_arguments)]
pub(super) fn deliver_local(
    ports: &mut [Option<Port>],
    dst: PortId,
    vnet: VnetHdr,
    frame: RxFrame<'_>,
    m: &InnerMeta,
    now: u64,
    out: &mut TxBatch,
) {
    let Some(p) = slot_mut(ports, dst) else {
        return;
    };
    if let Err(d) = tso::check_vnet(frame.len(), &vnet, m) {
        p.c.drops.inc(DropReason::from(d));
        return;
    }
    let key = FlowKey::from_meta(p.cfg.vni.get(), m);
    if let Err(r) = inbound_verdict(p, &Via::Local, &key, m, frame.head(), now) {
        p.c.drops.inc(r);
        return;
    }
    // The parser saw a whole Ethernet header, so the MACs are in the head.
    let macs = out.push_received(TxDest::Port { port: dst, vnet }, &frame, 12);
    macs[..6].copy_from_slice(p.cfg.guest_mac.as_bytes());
    macs[6..].copy_from_slice(p.cfg.gateway_mac.as_bytes());
    p.c.in_packets += 1;
    p.c.in_bytes += frame.len() as u64;
    p.c.local_delivered += 1;
}
