//! ARP: the gateway answers requests for its own IPv4 address; everything else a
//! guest says in ARP is denied (nobody else is on its link).

use super::frame;
use super::{Deny, Sent};
use crate::frames::output::TxBatch;
use crate::ids::PortId;
use crate::vpc::port::PortConfig;
use wire::arp::{self, Operation};
use wire::meta::InnerMeta;

const REPLY_FRAME_LEN: usize = frame::ETH_LEN + arp::PACKET_LEN;

pub(super) fn handle(
    cfg: &PortConfig,
    port: PortId,
    meta: &InnerMeta,
    frame: &[u8],
    out: &mut TxBatch,
) -> Result<Sent, Deny> {
    let body = frame.get(meta.l3_off..).ok_or(Deny::ArpMalformed)?;
    let p = arp::Packet::new_checked(body).map_err(|_| Deny::ArpMalformed)?;
    let req = arp::Repr::parse(&p).map_err(|_| Deny::ArpMalformed)?;
    let (Some(gw_ip), Some(guest_ip)) = (cfg.gateway_ipv4, cfg.ipv4) else {
        return Err(Deny::DeniedArp);
    };
    // A request for the gateway, broadcast or (when Linux refreshes its neighbour
    // entry) unicast to the gateway MAC, from the guest's own addresses: its IPv4
    // address or one the port allows it to send from (`allow-cidr --dir out`; Linux
    // asks from the address of the packet waiting for the answer).
    let spa = req.source_protocol_addr;
    let is_for_gateway = req.operation == Operation::Request
        && req.target_protocol_addr == gw_ip
        && req.source_hardware_addr == cfg.guest_mac
        && (spa == guest_ip || cfg.cidrs.admits_out(std::net::IpAddr::V4(spa)))
        && (meta.dst_mac.is_broadcast() || meta.dst_mac == cfg.gateway_mac);
    if !is_for_gateway {
        return Err(Deny::DeniedArp);
    }
    let reply = arp::Repr {
        operation: Operation::Reply,
        source_hardware_addr: cfg.gateway_mac,
        source_protocol_addr: gw_ip,
        target_hardware_addr: req.source_hardware_addr,
        target_protocol_addr: req.source_protocol_addr,
    };
    let buf = frame::push_to_guest(out, port, REPLY_FRAME_LEN);
    frame::eth(buf, cfg.guest_mac, cfg.gateway_mac, frame::ETHERTYPE_ARP);
    reply.emit(&mut arp::Packet::new_unchecked(&mut buf[frame::ETH_LEN..]));
    Ok(Sent::ArpReply)
}
