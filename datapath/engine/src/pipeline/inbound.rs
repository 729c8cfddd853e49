//! Underlay to guest: [`Engine::process_underlay`] (decapsulation, the port's inbound
//! checks, coalescing), frames other workers hand over ([`Engine::process_sibling`]),
//! and delivery to a port of this engine.

use super::action::{InAction, InVerdict};
use super::UnderlayRoutes;
use super::{confirm, external, ip_bytes, match_fields, quoted, slot_mut, Engine, Owner, Port};
use crate::drop::DropReason;
use crate::frames::input::RxFrame;
use crate::frames::output::{SiblingFrame, TxBatch, TxDest};
use crate::frames::tso;
use crate::ids::{PortId, Vni};
use crate::machinery::conntrack::TcpSegment;
use crate::machinery::flow::FlowKey;
use crate::machinery::rule::Direction;
use crate::machinery::uft::UftEntry;
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
            None => {
                self.drops.inc(DropReason::NoPort);
                return;
            }
        };
        let trust = InboundTrust {
            v2p: &self.v2p,
            boundary: self.v2b.endpoints(),
            this_sled: &self.cfg.underlay_addr,
        };
        let via = Via::Underlay {
            trust: &trust,
            from: UnderlaySource {
                sled: um.outer_src,
                external: um.external,
                mac: meta.src_mac,
            },
        };
        let Some(p) = slot_mut(&mut self.ports, port) else {
            self.drops.inc(DropReason::NoPort);
            return;
        };
        // Ethernet padding after the IP packet stays behind.
        let inner = inner.sub(0..meta.ip_end);
        if um.external {
            // From outside the VPC: only from boundary services (checked with the
            // flow, `external.rs`), and only to an external address, through NAT.
            let to = Delivery {
                port,
                vni: um.vni,
                mss: um.mss,
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
            .push(port, inner, meta, um.mss, p.cfg.gateway_mac, out);
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

/// Which port a frame from the underlay is for, in which VPC (its VNI), and the
/// sender's MSS (the Geneve Mss option).
#[derive(Clone, Copy)]
pub(super) struct Delivery {
    pub port: PortId,
    pub vni: u32,
    pub mss: Option<u32>,
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
        if confirm(
            e,
            &mut p.fw,
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
    let seg = TcpSegment::read(m, head);
    let mut f = match_fields(key, m);
    // The frame's VPC: the VNI it came in (the port's, which found it), unless it
    // comes from outside the VPC.
    if !via.external() {
        f.vpc_vni = Some(key.vni);
    }
    let q = quoted(key, m, head);
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
