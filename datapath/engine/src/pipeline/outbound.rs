//! Guest to underlay: [`Engine::process_guest`], the compilation of outbound flows,
//! and the frames that wait for their underlay next hop ([`Engine::retry_held`]).
//!
//! A flow's path MTU comes from its route, so a packet too big for it gets Packet Too
//! Big (or is fragmented) whether or not the next hop is known. A frame that may go
//! but whose next hop is not known yet waits in the engine's hold queue (`hold`)
//! rather than being dropped.

use super::action::{EncapAction, EncapPlan, HeldFrame, InAction, OutAction};
use super::config::{EngineConfig, NextHop, UnderlayRoutes};
use super::dispatch::{LocalDest, Owner};
use super::inbound::deliver_local;
use super::next_hops::NextHopSet;
use super::ports::{count_drop, slot_mut, Port, PortCounters};
use super::Engine;
use crate::drop::DropReason;
use crate::frames::encap::OuterTemplate;
use crate::frames::input::RxFrame;
use crate::frames::output::{FrameBytes, SiblingFrame, TxBatch, TxDest};
use crate::frames::rewrite::{rewritten_meta, End};
use crate::frames::tso;
use crate::ids::{PortId, Vni};
use crate::machinery::conntrack::TcpSegment;
use crate::machinery::counters::DropCounters;
use crate::machinery::flow::{ip_bytes, FlowKey};
use crate::machinery::hold::Held;
use crate::machinery::rule::{Direction, MatchFields};
use crate::machinery::uft::{Uft, UftEntry};
use crate::vpc::firewall::Firewall;
use crate::vpc::gateway::{self, GatewayVerdict};
use crate::vpc::nat::{self, SnatTable};
use crate::vpc::overlay::V2p;
use crate::vpc::port::PortConfig;
use crate::vpc::router::{RouteTarget, Router};
use crate::vpc::v2b::V2b;
use std::collections::HashMap;
use std::net::IpAddr;
use wire::meta::{InnerMeta, L3};
use wire::vnet::VnetHdr;
use wire::MacAddr;

impl Engine {
    /// One frame from guest port `port` (with the tap's `virtio_net_hdr`).
    pub fn process_guest(
        &mut self,
        port: PortId,
        vnet: VnetHdr,
        frame: &[u8],
        now: u64,
        routes: &dyn UnderlayRoutes,
        out: &mut TxBatch,
    ) {
        self.now = self.now.max(now);
        let Engine {
            cfg: ecfg,
            ports,
            by_ip,
            v2p,
            v2b,
            scratch,
            csum_buf,
            hold,
            drops,
            ..
        } = self;
        let Some(p) = slot_mut(ports, port) else {
            drops.inc(DropReason::UnknownPort);
            return;
        };
        p.c.out_packets += 1;
        p.c.out_bytes += frame.len() as u64;
        // One predictable branch for a port that is not paused.
        if p.paused {
            p.c.drops.inc(DropReason::PortPaused);
            return;
        }
        // Borrowed from the result rather than moved out of it: the metadata is
        // ~100 bytes, and the move was a copy per packet.
        let parsed = wire::meta::parse_inner(frame);
        let Ok(meta) = &parsed else {
            p.c.drops.inc(DropReason::GuestParse);
            return;
        };
        match gateway::handle_from_guest(&p.cfg, &mut p.gw, port, meta, frame, now, out) {
            GatewayVerdict::NotForGateway => {}
            GatewayVerdict::Replied => return,
            GatewayVerdict::Deny(r) => {
                p.c.drops.inc(r);
                return;
            }
        }
        if let Err(r) = check_guest_source(&p.cfg, meta) {
            p.c.drops.inc(r);
            return;
        }
        // Charged whole, TSO buffers too; the caller waits before the next frame
        // of a port over its limit (`egress_wait`, ratelimit.rs).
        p.policer.egress(frame.len(), now);
        if vnet.is_gso() {
            p.c.tso_buffers_in += 1;
        }
        // The parser guarantees ip_end <= frame.len(); Ethernet padding stays behind.
        let frame = frame.get(..meta.ip_end).unwrap_or(frame);
        let key = FlowKey::from_meta(p.cfg.vni.get(), meta);
        // The port's epoch: moved by its own changes and by every engine-wide one.
        let epoch = p.epoch;
        let env = CompileEnv {
            ecfg,
            by_ip,
            v2p,
            v2b,
            routes,
            epoch,
            now,
        };
        let Port {
            cfg,
            gw,
            fw,
            router,
            uft_out,
            uft_in,
            snat,
            c,
            ..
        } = p;
        // A flow waiting for its next hop is compiled for every packet (and asks
        // again), never cached: `unresolved` holds its entry meanwhile.
        let mut unresolved = None;
        let bytes = ip_bytes(meta);
        let entry: &UftEntry<OutAction> = match uft_out.lookup(&key, epoch, now, bytes) {
            Some(e)
                if e.confirm(
                    fw.conns_mut(),
                    Direction::Out,
                    TcpSegment::read(meta, frame),
                    bytes,
                    now,
                ) =>
            {
                e
            }
            found => {
                let tables = FlowTables { fw, snat, uft_in };
                match compile_outbound(&env, cfg, port, tables, router, &key, meta, frame) {
                    Ok(n) if matches!(n.action, OutAction::Unresolved(_)) => unresolved.insert(n),
                    Ok(n) => match found {
                        Some(e) => {
                            *e = n;
                            e
                        }
                        None => uft_out.insert(key, n),
                    },
                    Err(r) => {
                        c.drops.inc(r);
                        return;
                    }
                }
            }
        };
        let path_mtu = entry.path_mtu;
        let next = match &entry.action {
            // A cached drop wins over the size check: a denied or unroutable flow gets
            // no Packet Too Big and is counted under its own reason.
            OutAction::Drop(r) => {
                c.drops.inc(*r);
                return;
            }
            OutAction::Local { port: dst } => Next::Here(Here::Port(*dst)),
            OutAction::Sibling { worker, mac } => Next::Here(Here::Sibling {
                worker: *worker,
                vni: cfg.vni,
                mac: *mac,
            }),
            OutAction::Encap(e) => Next::Encap(e),
            OutAction::Unresolved(plan) => Next::Hold(**plan),
        };
        let fragment = if too_big(meta, &vnet, path_mtu) {
            if meta.l3 == L3::Ipv4 && !meta.dont_fragment && !vnet.is_gso() {
                true
            } else {
                gateway::packet_too_big(cfg, gw, port, meta, frame, path_mtu, now, out);
                c.drops.inc(DropReason::PacketTooBig);
                return;
            }
        } else {
            false
        };
        match next {
            Next::Encap(e) => {
                let mtu = fragment.then_some(path_mtu);
                let bufs = FragmentBufs { scratch, csum_buf };
                encapsulate(ecfg, e, &vnet, frame, meta, mtu, bufs, c, out);
            }
            Next::Hold(plan) => {
                let held = HeldFrame {
                    port,
                    vnet,
                    plan,
                    path_mtu,
                };
                if let Some(dropped) = hold.hold(plan.underlay_dst, held, frame, now) {
                    count_drop(ports, drops, dropped.port, DropReason::UnderlayHoldOverflow);
                }
            }
            Next::Here(here) if !fragment => {
                deliver_here(ports, here, vnet, frame, meta, now, out);
            }
            Next::Here(here) => {
                let bufs = FragmentBufs { scratch, csum_buf };
                let r = fragments(meta, frame, &vnet, path_mtu, bufs, |frag, fm| {
                    deliver_here(ports, here, VnetHdr::default(), frag, fm, now, out);
                });
                if let Some(p) = slot_mut(ports, port) {
                    count_fragmenting(r, &mut p.c);
                }
            }
        }
    }

    /// Sends the frames waiting for a next hop that `routes` resolves now, in the
    /// order they were held, after dropping (counted) those that waited too long.
    /// The engine is not told when a next hop appears, so the daemon calls this
    /// every round: it costs one check when nothing waits, and one next-hop lookup
    /// per waiting destination (at most `hold::HOLD_DSTS`) while frames wait.
    pub fn retry_held(&mut self, now: u64, routes: &dyn UnderlayRoutes, out: &mut TxBatch) {
        if self.hold.is_empty() {
            return;
        }
        self.now = self.now.max(now);
        self.expire_held(now);
        let Engine {
            cfg,
            ports,
            scratch,
            csum_buf,
            hold,
            drops,
            ..
        } = self;
        hold.release(
            |dst| Some(routes.next_hops(dst)).filter(|s| !s.is_empty()),
            |hops, h| {
                let bufs = FragmentBufs {
                    scratch: &mut *scratch,
                    csum_buf: &mut *csum_buf,
                };
                send_held(cfg, ports, drops, bufs, hops, h, out);
            },
        );
    }
}

/// Where a guest frame goes once its flow is known.
enum Next<'e> {
    /// To a port of this sled.
    Here(Here),
    /// Encapsulated, with the flow's cached outer header.
    Encap(&'e EncapAction),
    /// Encapsulated once the next hop toward the plan's destination is known.
    Hold(EncapPlan),
}

/// Sends a frame that waited for a next hop, through the one of `hops` its flow
/// picks, as `process_guest` would have: fragmented if its path MTU requires
/// (frames that needed Packet Too Big were not held).
fn send_held(
    ecfg: &EngineConfig,
    ports: &mut [Option<Port>],
    drops: &mut DropCounters,
    bufs: FragmentBufs<'_>,
    hops: &NextHopSet,
    h: Held<HeldFrame>,
    out: &mut TxBatch,
) {
    let HeldFrame {
        port,
        vnet,
        plan,
        path_mtu,
    } = h.tag;
    let Some(p) = slot_mut(ports, port) else {
        // Removing a port drops its held frames; counted should that ever fail.
        drops.inc(DropReason::UnknownPort);
        return;
    };
    // Paused since the frame was held: it does not leave either.
    if p.paused {
        p.c.drops.inc(DropReason::PortPaused);
        return;
    }
    let Ok(meta) = wire::meta::parse_inner(&h.frame) else {
        p.c.drops.inc(DropReason::GuestParse);
        return;
    };
    // `release` hands over non-empty sets only.
    let Some(hop) = hops.pick(plan.flow_hash) else {
        return;
    };
    let mtu = too_big(&meta, &vnet, path_mtu).then_some(path_mtu);
    let e = encap_through(&plan, hop, ecfg);
    let (frame, c) = (&h.frame, &mut p.c);
    encapsulate(ecfg, &e, &vnet, frame, &meta, mtu, bufs, c, out);
}

/// The encapsulation of `plan` through next hop `hop`.
fn encap_through(plan: &EncapPlan, hop: NextHop, ecfg: &EngineConfig) -> EncapAction {
    let outer = OuterTemplate::new(
        hop.src_mac,
        hop.dst_mac,
        ecfg.underlay_addr,
        plan.underlay_dst,
        plan.udp_src_port,
        plan.flow_label,
        plan.vni,
        false,
        ecfg.outer_udp_checksum,
    )
    .with_dscp(ecfg.outer_dscp);
    EncapAction {
        outer,
        ifindex: hop.ifindex,
        inner_dst_mac: plan.inner_dst_mac,
        internal: plan.internal,
        underlay_dst: plan.underlay_dst,
        vni: plan.vni.get(),
        nat: plan.nat,
    }
}

/// The engine's reused buffers for fragmenting: the fragments, and a copy of the
/// frame when its checksum must be completed first.
struct FragmentBufs<'a> {
    scratch: &'a mut TxBatch<'static>,
    csum_buf: &'a mut Vec<u8>,
}

/// Encapsulates a guest frame into the batch with tunneled TSO (VPC-internal TCP in
/// underlay-sized segments, traffic to the internet in the guest's own MSS), or, when
/// `fragment_mtu` is given (IPv4 without DF above its path MTU), each of its
/// fragments. With [`EngineConfig::underlay_tunnel_gso`] a GSO buffer of more than
/// one segment leaves as super-frames the kernel cuts into the same segments.
#[allow(clippy::too_many_arguments)]
fn encapsulate(
    ecfg: &EngineConfig,
    e: &EncapAction,
    vnet: &VnetHdr,
    frame: &[u8],
    meta: &InnerMeta,
    fragment_mtu: Option<u16>,
    bufs: FragmentBufs<'_>,
    c: &mut PortCounters,
    out: &mut TxBatch,
) {
    let dest = TxDest::Underlay { ifindex: e.ifindex };
    let seg_payload = if e.internal {
        tso::internal_segment_size(ecfg.underlay_mtu, meta)
    } else {
        usize::from(vnet.gso_size)
    };
    // The NAT layer's source rewrite happens as each frame is built (`InnerEdit`).
    let edit = tso::InnerEdit {
        dst_mac: e.inner_dst_mac,
        nat: e.nat.as_ref(),
    };
    let Some(mtu) = fragment_mtu else {
        let mss = u32::from(vnet.gso_size);
        let outer = &e.outer;
        if ecfg.underlay_tunnel_gso {
            let ifindex = e.ifindex;
            match tso::super_frames(
                frame,
                vnet,
                meta,
                seg_payload,
                mss,
                outer,
                &edit,
                ifindex,
                out,
            ) {
                Ok(Some(sent)) => {
                    c.tso_segments_out += sent.segments as u64;
                    c.tso_super_frames_out += sent.frames as u64;
                    return;
                }
                // Not a GSO buffer, or one segment: as without tunnel GSO.
                Ok(None) => {}
                Err(d) => {
                    c.drops.inc(DropReason::from(d));
                    return;
                }
            }
        }
        match tso::segment_with(frame, vnet, meta, seg_payload, mss, outer, edit, dest, out) {
            Ok(n) if vnet.is_gso() => c.tso_segments_out += n as u64,
            Ok(_) => {}
            Err(d) => c.drops.inc(DropReason::from(d)),
        }
        return;
    };
    let drops = &mut c.drops;
    let r = fragments(meta, frame, vnet, mtu, bufs, |frag, fm| {
        let plain = VnetHdr::default();
        let outer = &e.outer;
        if let Err(d) = tso::segment_with(frag, &plain, fm, seg_payload, 0, outer, edit, dest, out)
        {
            drops.inc(DropReason::from(d));
        }
    });
    count_fragmenting(r, c);
}

/// Counts the outcome of [`fragments`]: fragments that did not parse, or why the
/// frame could not be fragmented.
fn count_fragmenting(r: Result<u64, DropReason>, c: &mut PortCounters) {
    match r {
        Ok(0) => {}
        Ok(unparsed) => c.drops.add(DropReason::GuestParse, unparsed),
        Err(r) => c.drops.inc(r),
    }
}

/// Cuts `frame` (IPv4 without DF, larger than `path_mtu`) into fragments, built in
/// the scratch batch, and calls `each` with every fragment and its metadata.
/// Fragments leave without the guest's checksum offload request, so a partial L4
/// checksum is completed first, on a copy. Returns how many fragments did not parse
/// (for the caller to count), or why the frame could not be fragmented.
fn fragments(
    meta: &InnerMeta,
    frame: &[u8],
    vnet: &VnetHdr,
    path_mtu: u16,
    bufs: FragmentBufs<'_>,
    mut each: impl FnMut(&[u8], &InnerMeta),
) -> Result<u64, DropReason> {
    let FragmentBufs { scratch, csum_buf } = bufs;
    let frame = if vnet.needs_csum() {
        csum_buf.clear();
        csum_buf.extend_from_slice(frame);
        tso::complete_checksum(csum_buf, vnet).map_err(DropReason::from)?;
        &csum_buf[..]
    } else {
        frame
    };
    scratch.clear();
    // Any destination will do: the fragments are only built here.
    let dest = TxDest::Underlay { ifindex: 0 };
    gateway::fragment_ipv4(meta, frame, path_mtu, dest, scratch)?;
    let mut unparsed = 0;
    for (_, frag) in scratch.iter() {
        let FrameBytes::Own(frag) = frag else {
            continue;
        };
        match wire::meta::parse_inner(frag) {
            Ok(fm) => each(frag, &fm),
            Err(_) => unparsed += 1,
        }
    }
    Ok(unparsed)
}

/// A destination on this sled: a port of this engine, or of another worker.
#[derive(Clone, Copy, Debug)]
enum Here {
    Port(PortId),
    Sibling { worker: u16, vni: Vni, mac: MacAddr },
}

/// Hands a guest frame (or one fragment of it) to its destination on this sled:
/// delivered to a port of this engine after its inbound checks, or passed to the
/// worker that owns the port, which runs them (`Engine::process_sibling`). The frame
/// is in the tap's read buffer, which the next read reuses, so it is copied.
#[allow(clippy::too_many_arguments)]
fn deliver_here(
    ports: &mut [Option<Port>],
    here: Here,
    vnet: VnetHdr,
    frame: &[u8],
    m: &InnerMeta,
    now: u64,
    out: &mut TxBatch,
) {
    match here {
        Here::Port(dst) => {
            let pieces = [frame];
            let frame = RxFrame::new(&pieces, RxFrame::TRANSIENT);
            deliver_local(ports, dst, vnet, frame, m, now, out);
        }
        Here::Sibling { worker, vni, mac } => {
            let dest = TxDest::Sibling {
                worker,
                frame: SiblingFrame::Guest { vni, vnet },
            };
            let buf = out.push_unzeroed(dest, frame.len());
            buf.copy_from_slice(frame);
            // The owner dispatches on the destination MAC; it rewrites both MACs.
            if let Some(dst) = buf.get_mut(..6) {
                dst.copy_from_slice(mac.as_bytes());
            }
        }
    }
}

/// Outbound anti-spoofing: the guest may only send from its own MAC and addresses,
/// and only to its gateway.
fn check_guest_source(cfg: &PortConfig, m: &InnerMeta) -> Result<(), DropReason> {
    if m.src_mac != cfg.guest_mac {
        return Err(DropReason::SpoofedSrcMac);
    }
    if is_link_scoped(m) {
        return Err(DropReason::LinkLocalOnly);
    }
    let own = match (m.l3, m.src_ip) {
        (L3::Ipv4, IpAddr::V4(a)) => cfg.ipv4 == Some(a),
        (L3::Ipv6, IpAddr::V6(a)) => cfg.ipv6 == Some(a),
        (L3::Ipv4 | L3::Ipv6, _) => false,
        _ => return Err(DropReason::NotIp),
    };
    // Transit IPs and attached subnets: looked at only for a source that is not
    // the guest's own (one branch for a port without any).
    if !own && !cfg.cidrs.admits_out(m.src_ip) {
        return Err(DropReason::SpoofedSrcIp);
    }
    if m.dst_mac != cfg.gateway_mac {
        return Err(DropReason::DstMacNotGateway);
    }
    Ok(())
}

/// Traffic that by its addresses never leaves the guest's link: IPv6 from a
/// link-local or unspecified source or to a link-local unicast or link-scoped multicast
/// destination (ff02::/16), and IPv4 to 224.0.0.0/24 or the broadcast address. Guests
/// send such packets as part of normal operation (DAD, MLD, IGMP), so they are not
/// counted as spoofing.
fn is_link_scoped(m: &InnerMeta) -> bool {
    match (m.src_ip, m.dst_ip) {
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            let ll = |a: &std::net::Ipv6Addr| a.segments()[0] & 0xffc0 == 0xfe80;
            s.is_unspecified() || ll(&s) || ll(&d) || d.segments()[0] & 0xff0f == 0xff02
        }
        (IpAddr::V4(_), IpAddr::V4(d)) => d.is_broadcast() || d.octets()[..3] == [224, 0, 0],
        _ => false,
    }
}

/// Whether the packet (each segment, for a GSO buffer) exceeds the path MTU.
fn too_big(m: &InnerMeta, vnet: &VnetHdr, path_mtu: u16) -> bool {
    let whole = m.ip_end.saturating_sub(m.l3_off);
    let largest = if vnet.is_gso() {
        let hdrs = m.payload_off.saturating_sub(m.l3_off);
        whole.min(usize::from(vnet.gso_size) + hdrs)
    } else {
        whole
    };
    largest > usize::from(path_mtu)
}

/// What compiling an outbound flow reads besides the port itself.
struct CompileEnv<'a> {
    ecfg: &'a EngineConfig,
    by_ip: &'a HashMap<(u32, IpAddr), LocalDest>,
    v2p: &'a V2p,
    v2b: &'a V2b,
    routes: &'a dyn UnderlayRoutes,
    epoch: u64,
    now: u64,
}

/// Runs the outbound layers for the first packet of a flow (or after its cached
/// entry went stale): firewall -> router -> NAT -> overlay. Policy outcomes (denies, no
/// route, no V2P mapping) are cached as drop entries, which the next epoch clears;
/// a TCP segment outside its connection's window is an uncached `Err`, so the flow
/// is decided again on its next packet. A flow whose underlay next hop is unknown
/// gets an `OutAction::Unresolved` entry, which the caller does not cache (the next
/// packet asks again); it carries the path MTU, a property of the route, so the
/// packet is sized before it waits for the neighbour.
#[allow(clippy::too_many_arguments)]
fn compile_outbound(
    env: &CompileEnv<'_>,
    cfg: &PortConfig,
    port: PortId,
    tables: FlowTables<'_>,
    router: &mut Router,
    key: &FlowKey,
    m: &InnerMeta,
    frame: &[u8],
) -> Result<UftEntry<OutAction>, DropReason> {
    let FlowTables { fw, snat, uft_in } = tables;
    let drop = |r| UftEntry {
        epoch: env.epoch,
        action: OutAction::Drop(r),
        path_mtu: cfg.mtu,
        needs_conn: false,
        conn: None,
        created: env.now,
        last_hit: env.now,
        hits: 0,
        bytes: 0,
    };
    let mut f = MatchFields::of(key, m);
    // A VPC filter needs to know whether the flow stays in the VPC (a route to the
    // subnet, encapsulated with the port's VNI): looked up ahead of the router,
    // only when the port's outbound rules ask.
    if fw.layer().uses_vni(Direction::Out) && router.peek_target(&f).is_some_and(|t| t.in_vpc()) {
        f.vpc_vni = Some(cfg.vni.get());
    }
    let seg = TcpSegment::read(m, frame);
    let quote = key.quoted(m, frame);
    let decision = match fw.decide(
        Direction::Out,
        &f,
        seg,
        ip_bytes(m),
        quote.as_ref(),
        env.now,
    ) {
        Ok(d) => d,
        // Decided by this packet, not the flow: the next one is decided afresh.
        Err(r) if r.per_packet() => return Err(r),
        Err(r) => return Ok(drop(r)),
    };
    let route = match router.lookup(&f) {
        Ok(r) => r,
        Err(r) => return Ok(drop(r)),
    };
    // NAT (router -> NAT -> overlay): decided before the connection opens, so a
    // flow refused here (no external address, SNAT exhausted) opens nothing. A
    // source in an external attached subnet leaves as it is (`attach-subnet -e`),
    // and so do its ICMP errors about packets that came in untranslated.
    let src_nat = match route.target {
        RouteTarget::InternetGateway(_) if cfg.cidrs.exempts_nat(key.src_ip) => None,
        RouteTarget::InternetGateway(gw) => match &quote {
            // An ICMP error about a packet that came in through NAT leaves as from
            // where that packet was sent, quoting it as sent; decided per packet,
            // as the firewall decides such errors.
            Some(q) => Some(nat::outbound_icmp_error(
                &cfg.external,
                gw,
                snat,
                fw.conns(),
                key,
                q,
                env.now,
            )?),
            None => match nat::outbound(&cfg.external, gw, snat, fw.conns(), key, env.now) {
                Ok(n) => Some(n),
                // Exhaustion passes as flows end: decided again on the next packet.
                Err(DropReason::SnatExhausted) => return Err(DropReason::SnatExhausted),
                Err(r) => return Ok(drop(r)),
            },
        },
        RouteTarget::VpcSubnet | RouteTarget::Ip(_) | RouteTarget::Drop => None,
    };
    // The connection is opened here, for a flow the router and the overlay accepted
    // (a flow they drop opens nothing: a guest cannot fill the table with flows that
    // go nowhere).
    let mut entry = |action, path_mtu| {
        let a = match fw.commit(decision, env.now) {
            Ok(a) => a,
            Err(r) => return drop(r),
        };
        if a.created {
            uft_in.remove(&key.reversed());
            // Through NAT, its replies arrive to the external address, and are
            // cached under that key (`external.rs`).
            if let Some(n) = src_nat {
                let r = n.rewrite;
                let sent = rewritten_meta(m, End::Src, r.ip, r.port);
                uft_in.remove(&FlowKey::from_meta(key.vni, &sent).reversed());
            }
        }
        UftEntry {
            epoch: env.epoch,
            action,
            path_mtu,
            // An ICMP error's quote translation is the quoted packet's: decided
            // for every error (`needs_conn` without a connection), never cached
            // for the next error of the same key, which may quote another flow.
            needs_conn: a.needs_conn || src_nat.is_some_and(|n| n.quote.is_some()),
            conn: a.conn,
            created: env.now,
            last_hit: env.now,
            hits: 0,
            bytes: 0,
        }
    };
    // A route's MTU can lower a flow's path MTU, never raise it above what the path
    // carries.
    let path = |computed: u16| route.mtu.map_or(computed, |r| r.min(computed));
    let vni = cfg.vni.get();
    let (plan, path_mtu) = match route.target {
        RouteTarget::VpcSubnet | RouteTarget::Ip(_) => {
            // A next-hop route goes to the guest at its target address (whose port
            // must admit the destination: `allow-cidr --dir in`); the packet itself
            // is not changed.
            let to = match route.target {
                RouteTarget::Ip(a) => a,
                _ => key.dst_ip,
            };
            if let Some(d) = env.by_ip.get(&(vni, to)) {
                let action = match d.owner {
                    Owner::Port(p) if p == port => return Ok(drop(DropReason::Hairpin)),
                    Owner::Port(p) => OutAction::Local { port: p },
                    Owner::Sibling(worker) => OutAction::Sibling { worker, mac: d.mac },
                };
                return Ok(entry(action, path(cfg.mtu.min(d.mtu))));
            }
            let Some(v) = env.v2p.get(cfg.vni, to) else {
                return Ok(drop(DropReason::NoV2p));
            };
            // What the underlay carries now bounds it too: an underlay whose MTU
            // was lowered under a port gets Packet Too Big, not silent drops.
            let carried = env.ecfg.underlay_mtu.saturating_sub(gateway::ENCAP_BUDGET);
            let plan = EncapPlan::new(key, v.underlay, cfg.vni, v.mac, true);
            (plan, path(cfg.mtu.min(carried)))
        }
        RouteTarget::InternetGateway(_) => {
            let Some(endpoint) = env.v2b.select(key.dst_ip, key) else {
                return Ok(drop(DropReason::NoBoundary));
            };
            let mtu = path(gateway::external_path_mtu(cfg, env.ecfg.external_jumbo));
            let plan = EncapPlan {
                nat: src_nat,
                ..EncapPlan::new(key, endpoint, env.ecfg.boundary_vni, m.dst_mac, false)
            };
            (plan, mtu)
        }
        // The router reports Drop targets as errors; kept for exhaustiveness.
        RouteTarget::Drop => return Ok(drop(DropReason::RouteDrop)),
    };
    // The connection opens either way: a frame that waits for the neighbour is
    // sent later, and its replies must find the connection.
    let action = match env.routes.next_hops(plan.underlay_dst).pick(plan.flow_hash) {
        Some(hop) => OutAction::Encap(Box::new(encap_through(&plan, hop, env.ecfg))),
        None => OutAction::Unresolved(Box::new(plan)),
    };
    let e = entry(action, path_mtu);
    if src_nat.is_some() {
        // The SNAT port (if any) lives as long as the connection.
        snat.bind(key, e.conn);
    }
    Ok(e)
}

/// The per-port tables compiling an outbound flow writes: the firewall's
/// connections, the SNAT ports, and the inbound flow table (a new connection
/// removes the cached entry of its reverse).
struct FlowTables<'a> {
    fw: &'a mut Firewall,
    snat: &'a mut SnatTable,
    uft_in: &'a mut Uft<InAction>,
}
