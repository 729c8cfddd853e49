//! Guest to underlay: [`Engine::process_guest`] and the compilation of outbound flows.

use super::inbound::deliver_local;
use super::{
    confirm, match_fields, quoted, reason, slot_mut, Engine, LocalDest, Owner, Port, UnderlayRoutes,
};
use crate::encap::OuterTemplate;
use crate::firewall::{Decision, Firewall};
use crate::flow::FlowKey;
use crate::gateway::{self, GatewayVerdict};
use crate::input::RxFrame;
use crate::output::{FrameBytes, SiblingFrame, TxBatch, TxDest};
use crate::overlay::{BoundaryServices, V2p};
use crate::port::{PortConfig, PortId, Vni};
use crate::router::{RouteTarget, Router};
use crate::rule::Direction;
use crate::tso;
use crate::uft::{EncapAction, InAction, OutAction, Uft, UftEntry};
use crate::EngineConfig;
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
        let epoch = self.epoch;
        let boundary = self.boundary();
        let Engine {
            cfg: ecfg,
            ports,
            by_ip,
            v2p,
            scratch,
            csum_buf,
            drops,
            ..
        } = self;
        let Some(p) = slot_mut(ports, port) else {
            drops.inc(reason::UNKNOWN_PORT);
            return;
        };
        p.c.out_packets += 1;
        p.c.out_bytes += frame.len() as u64;
        // Borrowed from the result rather than moved out of it: the metadata is
        // ~100 bytes, and the move was a copy per packet.
        let parsed = wire::meta::parse_inner(frame);
        let Ok(meta) = &parsed else {
            p.c.drops.inc(reason::GUEST_PARSE);
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
        if vnet.is_gso() {
            p.c.tso_buffers_in += 1;
        }
        // The parser guarantees ip_end <= frame.len(); Ethernet padding stays behind.
        let frame = frame.get(..meta.ip_end).unwrap_or(frame);
        let key = FlowKey::from_meta(p.cfg.vni.get(), meta);
        let env = CompileEnv {
            ecfg,
            by_ip,
            v2p,
            boundary,
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
            c,
            ..
        } = p;
        let entry = match uft_out.lookup(&key, epoch, now) {
            Some(e) if confirm(e, fw, Direction::Out, meta.tcp_flags, now) => e,
            Some(e) => {
                match compile_outbound(&env, cfg, port, fw, router, uft_in, &key, meta, frame) {
                    Ok(n) => {
                        *e = n;
                        e
                    }
                    Err(r) => {
                        c.drops.inc(r);
                        return;
                    }
                }
            }
            None => {
                match compile_outbound(&env, cfg, port, fw, router, uft_in, &key, meta, frame) {
                    Ok(n) => uft_out.insert(key, n),
                    Err(r) => {
                        c.drops.inc(r);
                        return;
                    }
                }
            }
        };
        // A cached drop wins over the size check: a denied or unroutable flow gets no
        // Packet Too Big and is counted under its own reason.
        if let OutAction::Drop(r) = &entry.action {
            c.drops.inc(r);
            return;
        }
        let path_mtu = entry.path_mtu;
        let fragment = if too_big(meta, &vnet, path_mtu) {
            if meta.l3 == L3::Ipv4 && !meta.dont_fragment && !vnet.is_gso() {
                true
            } else {
                gateway::packet_too_big(cfg, gw, port, meta, frame, path_mtu, now, out);
                c.drops.inc(reason::PACKET_TOO_BIG);
                return;
            }
        } else {
            false
        };
        // Fragments leave without the guest's checksum offload request, so a partial
        // checksum is completed on a copy of the frame before it is cut up.
        let frame: &[u8] = if fragment && vnet.needs_csum() {
            csum_buf.clear();
            csum_buf.extend_from_slice(frame);
            if let Err(d) = tso::complete_checksum(csum_buf, &vnet) {
                c.drops.inc(d.name());
                return;
            }
            csum_buf
        } else {
            frame
        };
        let here = match &entry.action {
            // Handled above.
            OutAction::Drop(_) => return,
            OutAction::Local { port: dst } => Here::Port(*dst),
            OutAction::Sibling { worker, mac } => Here::Sibling {
                worker: *worker,
                vni: cfg.vni,
                mac: *mac,
            },
            OutAction::Encap(e) => {
                let dest = TxDest::Underlay { ifindex: e.ifindex };
                let seg_payload = if e.internal {
                    tso::internal_segment_size(ecfg.underlay_mtu, meta)
                } else {
                    usize::from(vnet.gso_size)
                };
                if fragment {
                    let each = |frag: &[u8], fm: &InnerMeta| {
                        let r = tso::segment(
                            frag,
                            &VnetHdr::default(),
                            fm,
                            seg_payload,
                            0,
                            &e.outer,
                            e.inner_dst_mac,
                            dest,
                            out,
                        );
                        if let Err(d) = r {
                            c.drops.inc(d.name());
                        }
                    };
                    match fragments(meta, frame, path_mtu, scratch, each) {
                        Ok(0) => {}
                        Ok(unparsed) => c.drops.add(reason::GUEST_PARSE, unparsed),
                        Err(r) => c.drops.inc(r),
                    }
                    return;
                }
                let guest_mss = u32::from(vnet.gso_size);
                match tso::segment(
                    frame,
                    &vnet,
                    meta,
                    seg_payload,
                    guest_mss,
                    &e.outer,
                    e.inner_dst_mac,
                    dest,
                    out,
                ) {
                    Ok(n) => {
                        if vnet.is_gso() {
                            c.tso_segments_out += n as u64;
                        }
                    }
                    Err(d) => c.drops.inc(d.name()),
                }
                return;
            }
        };
        if !fragment {
            deliver_here(ports, epoch, here, vnet, frame, meta, now, out);
            return;
        }
        let each = |frag: &[u8], fm: &InnerMeta| {
            deliver_here(ports, epoch, here, VnetHdr::default(), frag, fm, now, out)
        };
        let r = fragments(meta, frame, path_mtu, scratch, each);
        if let Some(p) = slot_mut(ports, port) {
            match r {
                Ok(0) => {}
                Ok(unparsed) => p.c.drops.add(reason::GUEST_PARSE, unparsed),
                Err(r) => p.c.drops.inc(r),
            }
        }
    }
}

/// Cuts `frame` (IPv4 without DF, larger than `path_mtu`) into fragments, built in
/// `scratch`, and calls `each` with every fragment and its metadata. Returns how many
/// fragments did not parse (for the caller to count), or why the frame could not be
/// fragmented.
fn fragments(
    meta: &InnerMeta,
    frame: &[u8],
    path_mtu: u16,
    scratch: &mut TxBatch<'static>,
    mut each: impl FnMut(&[u8], &InnerMeta),
) -> Result<u64, &'static str> {
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
    epoch: u64,
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
            deliver_local(ports, epoch, dst, vnet, frame, m, now, out);
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
fn check_guest_source(cfg: &PortConfig, m: &InnerMeta) -> Result<(), &'static str> {
    if m.src_mac != cfg.guest_mac {
        return Err(reason::SPOOFED_SRC_MAC);
    }
    if is_link_scoped(m) {
        return Err(reason::LINK_LOCAL_ONLY);
    }
    let own = match (m.l3, m.src_ip) {
        (L3::Ipv4, IpAddr::V4(a)) => cfg.ipv4 == Some(a),
        (L3::Ipv6, IpAddr::V6(a)) => cfg.ipv6 == Some(a),
        (L3::Ipv4 | L3::Ipv6, _) => false,
        _ => return Err(reason::NOT_IP),
    };
    if !own {
        return Err(reason::SPOOFED_SRC_IP);
    }
    if m.dst_mac != cfg.gateway_mac {
        return Err(reason::DST_MAC_NOT_GATEWAY);
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
    boundary: Option<BoundaryServices>,
    routes: &'a dyn UnderlayRoutes,
    epoch: u64,
    now: u64,
}

/// Runs the outbound layers for the first packet of a flow (or after its cached
/// entry went stale): firewall -> router -> overlay. Policy outcomes (denies, no
/// route, no V2P mapping) are cached as drop entries, which the next epoch clears;
/// an unresolved underlay neighbour is an uncached `Err`, so the flow is retried on
/// its next packet.
#[allow(clippy::too_many_arguments)]
fn compile_outbound(
    env: &CompileEnv<'_>,
    cfg: &PortConfig,
    port: PortId,
    fw: &mut Firewall,
    router: &mut Router,
    uft_in: &mut Uft<InAction>,
    key: &FlowKey,
    m: &InnerMeta,
    frame: &[u8],
) -> Result<UftEntry<OutAction>, &'static str> {
    let drop = |r| UftEntry {
        epoch: env.epoch,
        action: OutAction::Drop(r),
        path_mtu: cfg.mtu,
        needs_conn: false,
        conn: None,
        created: env.now,
        last_hit: env.now,
        hits: 0,
    };
    let f = match_fields(key, m);
    let (decision, conn) = match fw.decide_conn(
        Direction::Out,
        &f,
        m.tcp_flags,
        quoted(key, m, frame).as_ref(),
        env.now,
    ) {
        Ok(d) => d,
        Err(r) => return Ok(drop(r)),
    };
    if decision == Decision::Created {
        uft_in.remove(&key.reversed());
    }
    let entry = |action, path_mtu| UftEntry {
        epoch: env.epoch,
        action,
        path_mtu,
        needs_conn: decision.needs_conn(),
        conn,
        created: env.now,
        last_hit: env.now,
        hits: 0,
    };
    let route = match router.lookup(&f) {
        Ok(r) => r,
        Err(r) => return Ok(drop(r)),
    };
    // A route's MTU can lower a flow's path MTU, never raise it above what the path
    // carries.
    let path = |computed: u16| route.mtu.map_or(computed, |r| r.min(computed));
    let vni = cfg.vni.get();
    let (underlay_dst, outer_vni, inner_dst_mac, internal, path_mtu) = match route.target {
        RouteTarget::VpcSubnet => {
            if let Some(d) = env.by_ip.get(&(vni, key.dst_ip)) {
                let action = match d.owner {
                    Owner::Port(p) if p == port => return Ok(drop(reason::HAIRPIN)),
                    Owner::Port(p) => OutAction::Local { port: p },
                    Owner::Sibling(worker) => OutAction::Sibling { worker, mac: d.mac },
                };
                return Ok(entry(action, path(cfg.mtu.min(d.mtu))));
            }
            let Some(v) = env.v2p.get(cfg.vni, key.dst_ip) else {
                return Ok(drop(crate::overlay::reason::NO_V2P));
            };
            // What the underlay carries now bounds it too: an underlay whose MTU
            // was lowered under a port gets Packet Too Big, not silent drops.
            let carried = env.ecfg.underlay_mtu.saturating_sub(gateway::ENCAP_BUDGET);
            (v.underlay, cfg.vni, v.mac, true, path(cfg.mtu.min(carried)))
        }
        RouteTarget::InternetGateway => {
            let Some(b) = env.boundary else {
                return Ok(drop(crate::overlay::reason::NO_BOUNDARY));
            };
            let mtu = path(gateway::external_path_mtu(cfg, env.ecfg.external_jumbo));
            (b.underlay, b.vni, m.dst_mac, false, mtu)
        }
        // The router reports Drop targets as errors; kept for exhaustiveness.
        RouteTarget::Drop => return Ok(drop(crate::router::reason::ROUTE_DROP)),
    };
    let Some(hop) = env.routes.next_hop(underlay_dst) else {
        return Err(reason::UNDERLAY_UNRESOLVED);
    };
    let outer = OuterTemplate::new(
        hop.src_mac,
        hop.dst_mac,
        env.ecfg.underlay_addr,
        underlay_dst,
        key.udp_src_port(),
        key.flow_label(),
        outer_vni,
        false,
        env.ecfg.outer_udp_checksum,
    );
    Ok(entry(
        OutAction::Encap(Box::new(EncapAction {
            outer,
            ifindex: hop.ifindex,
            inner_dst_mac,
            internal,
            underlay_dst,
            vni: outer_vni.get(),
        })),
        path_mtu,
    ))
}
