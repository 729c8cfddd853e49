//! DHCPv6 server for the one address of the port (RFC 8415): Solicit -> Advertise (or
//! Reply with rapid commit), Request/Renew/Rebind -> Reply with the private address
//! at infinite lifetimes, Confirm/Release/Decline -> Reply with status Success,
//! Information-request -> Reply; DNS servers and the domain list in every answer.
//! The server DUID is DUID-LL of the gateway MAC.

use super::frame;
use super::{Deny, Sent};
use crate::frames::output::TxBatch;
use crate::ids::PortId;
use crate::vpc::port::PortConfig;
use std::net::{IpAddr, Ipv6Addr};
use wire::dhcpv6::{self, IaAddr, IaNa, MessageType, INFINITY};
use wire::meta::InnerMeta;

/// ff02::1:2, All_DHCP_Relay_Agents_and_Servers.
pub(super) const ALL_DHCP_AGENTS: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 1, 2);
const SERVER_PORT: u16 = 547;
const CLIENT_PORT: u16 = 546;
const STATUS_SUCCESS: u16 = 0;
const MAX_DNS: usize = 8;

pub(super) fn handle(
    cfg: &PortConfig,
    port: PortId,
    meta: &InnerMeta,
    frame: &[u8],
    out: &mut TxBatch,
) -> Result<Sent, Deny> {
    let Some(guest_ip) = cfg.ipv6 else {
        return Err(Deny::Dhcp6NoIpv6);
    };
    let IpAddr::V6(client) = meta.src_ip else {
        return Err(Deny::Dhcp6Malformed);
    };
    let body = frame
        .get(meta.payload_off..meta.ip_end)
        .ok_or(Deny::Dhcp6Malformed)?;
    let p = dhcpv6::Packet::new_checked(body).map_err(|_| Deny::Dhcp6Malformed)?;
    let req = dhcpv6::Repr::parse(&p).map_err(|_| Deny::Dhcp6Malformed)?;
    let server_duid = dhcpv6::duid_ll(cfg.gateway_mac);
    // Messages naming a server must name us (RFC 8415 §16).
    if req.server_id.is_some_and(|s| s != server_duid) {
        return Err(Deny::Dhcp6Ignored);
    }
    // Every message but Information-request must identify the client.
    if req.client_id.is_none() && req.msg_type != MessageType::InformationRequest {
        return Err(Deny::Dhcp6Malformed);
    }
    let lease = req.ia_na.map(|ia| IaNa {
        iaid: ia.iaid,
        // The address never changes: no renewals needed.
        t1: INFINITY,
        t2: INFINITY,
        address: Some(IaAddr {
            addr: guest_ip,
            preferred_lifetime: INFINITY,
            valid_lifetime: INFINITY,
        }),
    });
    let (msg_type, ia_na, rapid_commit, status_code) = match req.msg_type {
        MessageType::Solicit if req.rapid_commit => (MessageType::Reply, lease, true, None),
        MessageType::Solicit => (MessageType::Advertise, lease, false, None),
        MessageType::Request | MessageType::Renew | MessageType::Rebind => {
            (MessageType::Reply, lease, false, None)
        }
        MessageType::Confirm | MessageType::Release | MessageType::Decline => {
            (MessageType::Reply, None, false, Some(STATUS_SUCCESS))
        }
        MessageType::InformationRequest => (MessageType::Reply, None, false, None),
        _ => return Err(Deny::Dhcp6Ignored),
    };
    let dns = &cfg.dns_servers6[..cfg.dns_servers6.len().min(MAX_DNS)];
    let search = super::search_list(cfg);
    let mut reply = dhcpv6::Repr {
        msg_type,
        transaction_id: req.transaction_id,
        client_id: req.client_id,
        server_id: Some(&server_duid),
        ia_na,
        rapid_commit,
        status_code,
        dns_servers: dns,
        domain_list: &search,
    };
    if reply.buffer_len().is_err() {
        // An unencodable domain is left out rather than failing the lease.
        reply.domain_list = &[];
    }
    let len = reply.buffer_len().map_err(|_| Deny::Dhcp6Malformed)?;
    let gw = cfg.gateway_ipv6();
    let udp_len = frame::UDP_LEN + len;
    let buf = frame::push_to_guest(out, port, frame::ETH_LEN + frame::IPV6_LEN + udp_len);
    frame::eth(buf, meta.src_mac, cfg.gateway_mac, frame::ETHERTYPE_IPV6);
    frame::ipv6(
        &mut buf[frame::ETH_LEN..],
        gw,
        client,
        frame::PROTO_UDP,
        udp_len,
        frame::REPLY_TTL,
    );
    let udp = &mut buf[frame::ETH_LEN + frame::IPV6_LEN..];
    if reply
        .emit(&mut dhcpv6::Packet::new_unchecked(
            &mut udp[frame::UDP_LEN..],
        ))
        .is_err()
    {
        out.pop();
        return Err(Deny::Dhcp6Malformed);
    }
    frame::udp_v6(udp, gw, client, SERVER_PORT, CLIENT_PORT, len);
    Ok(Sent::Dhcp6)
}
