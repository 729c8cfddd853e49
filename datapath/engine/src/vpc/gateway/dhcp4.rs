//! DHCPv4 server for the one address of the port: a /32 lease with the gateway as
//! router and server identifier, lease 86400 s, classless static routes (gateway/32
//! on-link and 0/0 via the gateway; RFC 3442 clients then ignore option 3), DNS,
//! hostname, domain name and search, and — beyond the reference — option 26 with the
//! port MTU, which is how IPv4-only guests learn an MTU of 8500.

use super::frame;
use super::{Deny, Sent};
use crate::frames::output::TxBatch;
use crate::ids::PortId;
use crate::vpc::port::PortConfig;
use std::net::Ipv4Addr;
use wire::dhcpv4::{self, ClasslessRoute, MessageType};
use wire::meta::InnerMeta;
use wire::MacAddr;

/// Lease time the reference hands out.
pub(super) const LEASE_TIME_S: u32 = 86400;
const SERVER_PORT: u16 = 67;
const CLIENT_PORT: u16 = 68;
/// DNS servers carried at most (the option holds 63; more is a config error we clip
/// rather than refuse the lease over).
const MAX_DNS: usize = 8;

pub(super) fn handle(
    cfg: &PortConfig,
    port: PortId,
    meta: &InnerMeta,
    frame: &[u8],
    out: &mut TxBatch,
) -> Result<Sent, Deny> {
    let (Some(guest_ip), Some(gw_ip)) = (cfg.ipv4, cfg.gateway_ipv4) else {
        return Err(Deny::Dhcp4NoIpv4);
    };
    let body = frame
        .get(meta.payload_off..meta.ip_end)
        .ok_or(Deny::Dhcp4Malformed)?;
    let p = dhcpv4::Packet::new_checked(body).map_err(|_| Deny::Dhcp4Malformed)?;
    let req = dhcpv4::Repr::parse(&p).map_err(|_| Deny::Dhcp4Malformed)?;
    if req.op != dhcpv4::OP_REQUEST || req.client_hw_addr != cfg.guest_mac {
        return Err(Deny::Dhcp4Ignored);
    }
    let reply_type = match req.message_type {
        MessageType::Discover => MessageType::Offer,
        MessageType::Request => {
            // A REQUEST naming another server is that server's business (RFC 2131
            // §4.3.2); one for another address gets a NAK so the client restarts.
            if req.server_identifier.is_some_and(|s| s != gw_ip) {
                return Err(Deny::Dhcp4Ignored);
            }
            let asked = req.requested_ip.unwrap_or(req.client_ip);
            if asked == guest_ip {
                MessageType::Ack
            } else {
                MessageType::Nak
            }
        }
        MessageType::Inform => MessageType::Ack,
        _ => return Err(Deny::Dhcp4Ignored),
    };
    let nak = reply_type == MessageType::Nak;
    let inform = req.message_type == MessageType::Inform;
    let routes = [
        ClasslessRoute {
            destination: gw_ip,
            prefix_len: 32,
            router: Ipv4Addr::UNSPECIFIED,
        },
        ClasslessRoute {
            destination: Ipv4Addr::UNSPECIFIED,
            prefix_len: 0,
            router: gw_ip,
        },
    ];
    let dns = &cfg.dns_servers4[..cfg.dns_servers4.len().min(MAX_DNS)];
    // Names that cannot be encoded (too long, bad labels) are left out rather than
    // failing the lease.
    let hostname = cfg
        .hostname
        .as_deref()
        .filter(|h| !h.is_empty() && h.len() <= 255);
    let domain = cfg
        .domain
        .as_deref()
        .filter(|d| !d.is_empty() && d.len() <= 255);
    let mut reply = dhcpv4::Repr {
        op: dhcpv4::OP_REPLY,
        message_type: reply_type,
        xid: req.xid,
        secs: 0,
        broadcast: req.broadcast,
        client_ip: if reply_type == MessageType::Ack {
            req.client_ip
        } else {
            Ipv4Addr::UNSPECIFIED
        },
        // RFC 2131 table 3: no yiaddr in a NAK or in the ACK to an INFORM.
        your_ip: if nak || inform {
            Ipv4Addr::UNSPECIFIED
        } else {
            guest_ip
        },
        server_ip: Ipv4Addr::UNSPECIFIED,
        relay_ip: req.relay_ip,
        client_hw_addr: req.client_hw_addr,
        requested_ip: None,
        server_identifier: Some(gw_ip),
        lease_time: None,
        subnet_mask: None,
        router: None,
        classless_routes: &[],
        interface_mtu: None,
        dns_servers: &[],
        hostname: None,
        domain_name: None,
        domain_search: &[],
        parameter_request_list: None,
    };
    let search = super::search_list(cfg);
    if !nak {
        reply.lease_time = (!inform).then_some(LEASE_TIME_S);
        reply.subnet_mask = Some(Ipv4Addr::BROADCAST);
        reply.router = Some(gw_ip);
        reply.classless_routes = &routes;
        reply.interface_mtu = Some(cfg.mtu);
        reply.dns_servers = dns;
        reply.hostname = hostname;
        reply.domain_name = domain;
        reply.domain_search = &search;
        if reply.buffer_len().is_err() {
            reply.domain_search = &[];
        }
    }
    let dhcp_len = reply.buffer_len().map_err(|_| Deny::Dhcp4Malformed)?;
    // RFC 2131 §4.1: NAKs are broadcast; a client with an address gets unicast to
    // it; one asking for broadcast gets broadcast; otherwise unicast to yiaddr.
    let (dst_mac, dst_ip) = if nak || (req.broadcast && req.client_ip.is_unspecified()) {
        (MacAddr::BROADCAST, Ipv4Addr::BROADCAST)
    } else if !req.client_ip.is_unspecified() {
        (cfg.guest_mac, req.client_ip)
    } else {
        (cfg.guest_mac, guest_ip)
    };
    let udp_len = frame::UDP_LEN + dhcp_len;
    let buf = frame::push_to_guest(out, port, frame::ETH_LEN + frame::IPV4_LEN + udp_len);
    frame::eth(buf, dst_mac, cfg.gateway_mac, frame::ETHERTYPE_IPV4);
    frame::ipv4(
        &mut buf[frame::ETH_LEN..],
        gw_ip,
        dst_ip,
        frame::PROTO_UDP,
        udp_len,
        frame::REPLY_TTL,
    );
    let udp = &mut buf[frame::ETH_LEN + frame::IPV4_LEN..];
    if reply
        .emit(&mut dhcpv4::Packet::new_unchecked(
            &mut udp[frame::UDP_LEN..],
        ))
        .is_err()
    {
        out.pop();
        return Err(Deny::Dhcp4Malformed);
    }
    frame::udp_v4(udp, gw_ip, dst_ip, SERVER_PORT, CLIENT_PORT, dhcp_len);
    Ok(Sent::Dhcp4 { nak })
}
