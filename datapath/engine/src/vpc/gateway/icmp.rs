//! Echo requests to the gateway's addresses: answered with an echo reply carrying the
//! same identifier, sequence number and data.

use super::frame;
use super::{l4_bytes, Deny, Sent};
use crate::frames::output::TxBatch;
use crate::ids::PortId;
use crate::vpc::port::PortConfig;
use std::net::IpAddr;
use wire::meta::InnerMeta;
use wire::{icmpv4, icmpv6};

/// Answers an ICMP or ICMPv6 echo request to the gateway (`classify` checked the
/// type). The families differ in how the message is parsed and emitted and in the
/// IP header; the reply frame is laid out by [`reply_frame`].
pub(super) fn echo(
    cfg: &PortConfig,
    port: PortId,
    meta: &InnerMeta,
    frame: &[u8],
    out: &mut TxBatch,
) -> Result<Sent, Deny> {
    let msg = l4_bytes(meta, frame).ok_or(Deny::EchoMalformed)?;
    match (meta.src_ip, meta.dst_ip) {
        (IpAddr::V4(src), IpAddr::V4(_)) => {
            let gw = cfg.gateway_ipv4.ok_or(Deny::EchoMalformed)?;
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
            let (ip, body) = reply_frame(
                cfg,
                port,
                meta,
                frame::ETHERTYPE_IPV4,
                frame::IPV4_LEN,
                l4_len,
                out,
            );
            frame::ipv4(ip, gw, src, frame::PROTO_ICMP, l4_len, frame::REPLY_TTL);
            // Sized from the same repr: emit cannot fail.
            let _ = reply.emit(&mut icmpv4::Packet::new_unchecked(body));
        }
        (IpAddr::V6(src), IpAddr::V6(dst)) => {
            let gw = cfg.gateway_ipv6();
            let p = icmpv6::Packet::new_checked(msg).map_err(|_| Deny::EchoMalformed)?;
            let icmpv6::Repr::EchoRequest {
                ident,
                seq_no,
                data,
            } = icmpv6::Repr::parse(&p, src, dst).map_err(|_| Deny::EchoMalformed)?
            else {
                return Err(Deny::EchoMalformed);
            };
            let reply = icmpv6::Repr::EchoReply {
                ident,
                seq_no,
                data,
            };
            let l4_len = reply.buffer_len();
            let (ip, body) = reply_frame(
                cfg,
                port,
                meta,
                frame::ETHERTYPE_IPV6,
                frame::IPV6_LEN,
                l4_len,
                out,
            );
            frame::ipv6(ip, gw, src, frame::PROTO_ICMPV6, l4_len, frame::REPLY_TTL);
            let _ = reply.emit(&mut icmpv6::Packet::new_unchecked(body), gw, src);
        }
        _ => return Err(Deny::EchoMalformed),
    }
    Ok(Sent::EchoReply)
}

/// Reserves the reply frame to the guest, writes its Ethernet header and returns the
/// `ip_len` bytes for its IP header and the `l4_len` bytes for the ICMP message.
fn reply_frame<'a>(
    cfg: &PortConfig,
    port: PortId,
    meta: &InnerMeta,
    ethertype: u16,
    ip_len: usize,
    l4_len: usize,
    out: &'a mut TxBatch,
) -> (&'a mut [u8], &'a mut [u8]) {
    let buf = frame::push_to_guest(out, port, frame::ETH_LEN + ip_len + l4_len);
    frame::eth(buf, meta.src_mac, cfg.gateway_mac, ethertype);
    buf[frame::ETH_LEN..].split_at_mut(ip_len)
}
