//! Neighbor Discovery from the guest: NS for the gateway -> NA, RS -> RA; every other
//! NDP message (RA, NA, Redirect, NS for other addresses) is denied.

use super::frame::{self, ALL_NODES, ALL_ROUTERS};
use super::ra::{self, NDP_HOP_LIMIT};
use super::{l4_bytes, Deny, Sent};
use crate::frames::output::TxBatch;
use crate::ids::PortId;
use crate::vpc::port::PortConfig;
use std::net::{IpAddr, Ipv6Addr};
use wire::icmpv6::msg;
use wire::meta::InnerMeta;
use wire::ndp;
use wire::MacAddr;

/// NA frame: Ethernet + IPv6 + NA (24) + target link-layer address option (8).
const NA_FRAME_LEN: usize = frame::ETH_LEN + frame::IPV6_LEN + 32;

/// Answers the guest's NDP message (NS for the gateway, RS), or says why not.
/// Out of line: `handle_from_guest` classifies every guest frame, and this rare
/// branch inlined into it made that classification save registers for every frame.
#[inline(never)]
pub(super) fn handle(
    cfg: &PortConfig,
    port: PortId,
    meta: &InnerMeta,
    frame: &[u8],
    out: &mut TxBatch,
) -> Result<Sent, Deny> {
    if cfg.ipv6.is_none() {
        return Err(Deny::NdpNoIpv6);
    }
    let (IpAddr::V6(src), IpAddr::V6(dst)) = (meta.src_ip, meta.dst_ip) else {
        return Err(Deny::DeniedNdp);
    };
    match meta.icmp_type {
        msg::ROUTER_SOLICIT => {
            let rs_src = validate_rs(cfg, meta, frame, src, dst).ok_or(Deny::RsInvalid)?;
            Ok(ra::answer_rs(cfg, port, meta.src_mac, rs_src, out))
        }
        msg::NEIGHBOR_SOLICIT => {
            let target = validate_ns(meta, frame, src, dst).ok_or(Deny::NsInvalid)?;
            let gw = cfg.gateway_ipv6();
            if target != gw {
                return Err(Deny::NsNotGateway);
            }
            // A unicast NS (neighbour unreachability detection) must be addressed to
            // the target itself, a multicast one to its solicited-node group.
            if dst != gw && dst != frame::solicited_node(gw) {
                return Err(Deny::NsInvalid);
            }
            emit_na(cfg, port, meta.src_mac, src, out);
            Ok(Sent::Na)
        }
        _ => Err(Deny::DeniedNdp),
    }
}

/// RFC 4861 §6.1.1 as the reference applies it: hop limit 255, code 0, valid checksum
/// and options, from fe80::/10 (or :: without a source link-layer option), to ff02::2
/// or the gateway. Returns the RS source address.
fn validate_rs(
    cfg: &PortConfig,
    meta: &InnerMeta,
    frame: &[u8],
    src: Ipv6Addr,
    dst: Ipv6Addr,
) -> Option<Ipv6Addr> {
    if meta.hop_limit != NDP_HOP_LIMIT {
        return None;
    }
    if !(frame::is_link_local(src) || src.is_unspecified()) {
        return None;
    }
    if dst != ALL_ROUTERS && dst != cfg.gateway_ipv6() {
        return None;
    }
    let p = ndp::Packet::new_checked(l4_bytes(meta, frame)?).ok()?;
    match ndp::Repr::parse(&p, src, dst).ok()? {
        ndp::Repr::RouterSolicit { lladdr } if !(src.is_unspecified() && lladdr.is_some()) => {
            Some(src)
        }
        _ => None,
    }
}

/// RFC 4861 §7.1.1: hop limit 255, code 0, valid checksum and options, target not
/// multicast, and from :: only to a solicited-node group without a source link-layer
/// option. Returns the target address.
fn validate_ns(meta: &InnerMeta, frame: &[u8], src: Ipv6Addr, dst: Ipv6Addr) -> Option<Ipv6Addr> {
    if meta.hop_limit != NDP_HOP_LIMIT {
        return None;
    }
    let p = ndp::Packet::new_checked(l4_bytes(meta, frame)?).ok()?;
    let ndp::Repr::NeighborSolicit {
        target_addr,
        lladdr,
    } = ndp::Repr::parse(&p, src, dst).ok()?
    else {
        return None;
    };
    if target_addr.is_multicast() {
        return None;
    }
    if src.is_unspecified() && (lladdr.is_some() || dst.segments()[..6] != [0xff02, 0, 0, 0, 0, 1])
    {
        return None;
    }
    Some(target_addr)
}

/// NA for the gateway's link-local: Router=1, Override=1, Solicited unless the NS came
/// from :: (duplicate address detection), in which case it goes to all nodes
/// (RFC 4861 §7.2.4); target link-layer address = gateway MAC.
fn emit_na(
    cfg: &PortConfig,
    port: PortId,
    ns_src_mac: MacAddr,
    ns_src: Ipv6Addr,
    out: &mut TxBatch,
) {
    let gw = cfg.gateway_ipv6();
    let dad = ns_src.is_unspecified();
    let (dst_mac, dst) = if dad {
        (MacAddr::from_ipv6_multicast(&ALL_NODES), ALL_NODES)
    } else {
        (ns_src_mac, ns_src)
    };
    let repr = ndp::Repr::NeighborAdvert {
        router: true,
        solicited: !dad,
        override_: true,
        target_addr: gw,
        lladdr: Some(cfg.gateway_mac),
    };
    let buf = frame::push_to_guest(out, port, NA_FRAME_LEN);
    frame::eth(buf, dst_mac, cfg.gateway_mac, frame::ETHERTYPE_IPV6);
    frame::ipv6(
        &mut buf[frame::ETH_LEN..],
        gw,
        dst,
        frame::PROTO_ICMPV6,
        repr.buffer_len(),
        NDP_HOP_LIMIT,
    );
    // Sized from the same repr: emit cannot fail.
    let _ = repr.emit(
        &mut ndp::Packet::new_unchecked(&mut buf[frame::ETH_LEN + frame::IPV6_LEN..]),
        gw,
        dst,
    );
}
