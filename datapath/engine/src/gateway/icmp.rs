//! Echo requests to the gateway's addresses: answered with an echo reply carrying the
//! same identifier, sequence number and data.

use super::frame;
use super::{l4_bytes, Deny, Sent};
use crate::output::TxBatch;
use crate::port::{PortConfig, PortId};
use std::net::IpAddr;
use wire::meta::InnerMeta;
use wire::{icmpv4, icmpv6};

pub(super) fn echo4(
    cfg: &PortConfig,
    port: PortId,
    meta: &InnerMeta,
    frame: &[u8],
    out: &mut TxBatch,
) -> Result<Sent, Deny> {
    let (IpAddr::V4(src), Some(gw)) = (meta.src_ip, cfg.gateway_ipv4) else {
        return Err(Deny::EchoMalformed);
    };
    let msg = l4_bytes(meta, frame).ok_or(Deny::EchoMalformed)?;
    let p = icmpv4::Packet::new_checked(msg).map_err(|_| Deny::EchoMalformed)?;
    let icmpv4::Repr::EchoRequest {
        ident,
        seq_no,
        data,
    } = icmpv4::Repr::parse(&p).map_err(|_| Deny::EchoMalformed)?
    else {
        return Err(Deny::EchoMalformed);
    };
    let reply = icmpv4::Repr::EchoReply {
        ident,
        seq_no,
        data,
    };
    let l4_len = reply.buffer_len();
    let buf = frame::push_to_guest(out, port, frame::ETH_LEN + frame::IPV4_LEN + l4_len);
    frame::eth(buf, meta.src_mac, cfg.gateway_mac, frame::ETHERTYPE_IPV4);
    frame::ipv4(
        &mut buf[frame::ETH_LEN..],
        gw,
        src,
        frame::PROTO_ICMP,
        l4_len,
        frame::REPLY_TTL,
    );
    let body = &mut buf[frame::ETH_LEN + frame::IPV4_LEN..];
    // Sized from the same repr: emit cannot fail.
    let _ = reply.emit(&mut icmpv4::Packet::new_unchecked(body));
    Ok(Sent::EchoReply)
}

pub(super) fn echo6(
    cfg: &PortConfig,
    port: PortId,
    meta: &InnerMeta,
    frame: &[u8],
    out: &mut TxBatch,
) -> Result<Sent, Deny> {
    let (IpAddr::V6(src), IpAddr::V6(dst)) = (meta.src_ip, meta.dst_ip) else {
        return Err(Deny::EchoMalformed);
    };
    let msg = l4_bytes(meta, frame).ok_or(Deny::EchoMalformed)?;
    let p = icmpv6::Packet::new_checked(msg).map_err(|_| Deny::EchoMalformed)?;
    let icmpv6::Repr::EchoRequest {
        ident,
        seq_no,
        data,
    } = icmpv6::Repr::parse(&p, src, dst).map_err(|_| Deny::EchoMalformed)?
    else {
        return Err(Deny::EchoMalformed);
    };
    let gw = cfg.gateway_ipv6();
    let reply = icmpv6::Repr::EchoReply {
        ident,
        seq_no,
        data,
    };
    let l4_len = reply.buffer_len();
    let buf = frame::push_to_guest(out, port, frame::ETH_LEN + frame::IPV6_LEN + l4_len);
    frame::eth(buf, meta.src_mac, cfg.gateway_mac, frame::ETHERTYPE_IPV6);
    frame::ipv6(
        &mut buf[frame::ETH_LEN..],
        gw,
        src,
        frame::PROTO_ICMPV6,
        l4_len,
        frame::REPLY_TTL,
    );
    let body = &mut buf[frame::ETH_LEN + frame::IPV6_LEN..];
    let _ = reply.emit(&mut icmpv6::Packet::new_unchecked(body), gw, src);
    Ok(Sent::EchoReply)
}
