//! ICMP errors for packets larger than their path MTU: ICMPv6 Packet Too Big
//! (RFC 4443 §3.2) and ICMPv4 Destination Unreachable / Fragmentation Needed with the
//! next-hop MTU (RFC 1191), sent back to the guest from the gateway.
//!
//! Rate limited per port by a token bucket (`limit::PTB`; RFC 4443 §2.4(f) requires a
//! limit).

use super::frame;
use super::limit;
use super::GatewayState;
use crate::frames::output::TxBatch;
use crate::ids::PortId;
use crate::vpc::port::PortConfig;
use std::net::IpAddr;
use wire::meta::{InnerMeta, L3};
use wire::{icmpv4, icmpv6};

/// RFC 1812 §4.3.2.3: an ICMPv4 error should quote as much as fits in 576 bytes.
const ICMPV4_MAX_ERROR_LEN: usize = 576;

/// A guest packet exceeded its path MTU: emits ICMPv6 Packet Too Big (IPv6) or ICMPv4
/// Fragmentation Needed with the next-hop MTU (IPv4 with DF) back to the guest, from
/// the gateway, quoting as much of the offending packet as fits (the ICMPv6 packet
/// stays within 1280 bytes, the ICMPv4 one within 576). No error is sent about an
/// ICMP error, a non-first IPv4 fragment, an IPv4 packet without DF (it is fragmented
/// instead), or a packet from a multicast or unspecified source (`ptb_suppressed`);
/// beyond the rate limit the packet is only counted (`ptb_rate_limited`). Returns
/// true when an error was sent.
#[allow(clippy::too_many_arguments)]
pub fn packet_too_big(
    cfg: &PortConfig,
    st: &mut GatewayState,
    port: PortId,
    meta: &InnerMeta,
    frame: &[u8],
    path_mtu: u16,
    now: u64,
    out: &mut TxBatch,
) -> bool {
    let Some(ip) = frame.get(meta.l3_off..meta.ip_end) else {
        st.counters.ptb_suppressed += 1;
        return false;
    };
    // Never an ICMP error about an ICMP error (RFC 1122 §3.2.2, RFC 4443 §2.4(e)).
    let about_error = match meta.l3 {
        L3::Ipv6 => meta.proto == frame::PROTO_ICMPV6 && icmpv6::msg::is_error(meta.icmp_type),
        _ => meta.proto == frame::PROTO_ICMP && icmpv4::msg::is_error(meta.icmp_type),
    };
    let allowed = !about_error
        && match (meta.l3, meta.src_ip) {
            (L3::Ipv6, IpAddr::V6(src)) => !src.is_unspecified() && !src.is_multicast(),
            (L3::Ipv4, IpAddr::V4(src)) => {
                // Fragment offset from the header itself: the metadata only says
                // "fragment", and the first fragment may get an error.
                let first = ip
                    .get(6..8)
                    .is_some_and(|b| u16::from_be_bytes([b[0], b[1]]) & 0x1fff == 0);
                cfg.gateway_ipv4.is_some()
                    && meta.dont_fragment
                    && first
                    && !src.is_unspecified()
                    && !src.is_broadcast()
                    && !src.is_multicast()
            }
            _ => false,
        };
    if !allowed {
        st.counters.ptb_suppressed += 1;
        return false;
    }
    if !st.limits.ptb.take(limit::PTB, now) {
        st.counters.ptb_rate_limited += 1;
        return false;
    }
    match meta.src_ip {
        IpAddr::V6(dst) => {
            let quote_len = ip
                .len()
                .min(icmpv6::MIN_MTU - frame::IPV6_LEN - icmpv6::HEADER_LEN);
            let repr = icmpv6::Repr::PacketTooBig {
                mtu: u32::from(path_mtu),
                data: &ip[..quote_len],
            };
            let l4_len = repr.buffer_len();
            let src = cfg.gateway_ipv6();
            let buf = frame::push_to_guest(out, port, frame::ETH_LEN + frame::IPV6_LEN + l4_len);
            frame::eth(buf, cfg.guest_mac, cfg.gateway_mac, frame::ETHERTYPE_IPV6);
            frame::ipv6(
                &mut buf[frame::ETH_LEN..],
                src,
                dst,
                frame::PROTO_ICMPV6,
                l4_len,
                frame::REPLY_TTL,
            );
            let body = &mut buf[frame::ETH_LEN + frame::IPV6_LEN..];
            // Sized from the same repr: emit cannot fail.
            let _ = repr.emit(&mut icmpv6::Packet::new_unchecked(body), src, dst);
        }
        IpAddr::V4(dst) => {
            let Some(src) = cfg.gateway_ipv4 else {
                return false;
            };
            let quote_len = ip
                .len()
                .min(ICMPV4_MAX_ERROR_LEN - frame::IPV4_LEN - icmpv4::HEADER_LEN);
            let repr = icmpv4::Repr::FragNeeded {
                next_hop_mtu: path_mtu,
                data: &ip[..quote_len],
            };
            let l4_len = repr.buffer_len();
            let buf = frame::push_to_guest(out, port, frame::ETH_LEN + frame::IPV4_LEN + l4_len);
            frame::eth(buf, cfg.guest_mac, cfg.gateway_mac, frame::ETHERTYPE_IPV4);
            frame::ipv4(
                &mut buf[frame::ETH_LEN..],
                src,
                dst,
                frame::PROTO_ICMP,
                l4_len,
                frame::REPLY_TTL,
            );
            let body = &mut buf[frame::ETH_LEN + frame::IPV4_LEN..];
            let _ = repr.emit(&mut icmpv4::Packet::new_unchecked(body));
        }
    }
    st.counters.ptb_sent += 1;
    true
}
