//! The virtual gateway: what the datapath answers for the guest itself.
//!
//! A guest sees one router on its link: MAC `gateway_mac`, IPv4 `gateway_ipv4`, IPv6
//! fe80::EUI-64(gateway_mac). That router does not exist anywhere; every frame the
//! guest sends passes through [`handle_from_guest`] before the firewall, and the
//! frames a router would answer (ARP, NDP, Router Solicitation, DHCPv4/v6, echo to the
//! gateway) are answered here by building whole reply frames into the `TxBatch`.
//! The timers a router runs (unsolicited Router Advertisements) run from [`tick`], and
//! the ICMP errors a router on the path would send (Packet Too Big, Fragmentation
//! Needed) come from [`packet_too_big`]. Behaviour matches the reference (OPTE) as
//! described in docs/gateway.md; where we go further (unsolicited RAs, DHCP option 26)
//! the doc says so.
//!
//! Every frame the gateway consumes without answering is a `Deny` with a reason that
//! is also the name of its counter in [`GatewayCounters`]. Answers are rate limited
//! per port and kind (`limit`): a request beyond the limit is such a deny
//! (`arp_rate_limited`, `rs_rate_limited`, ...).

mod arp;
mod dhcp4;
mod dhcp6;
mod frag;
mod frame;
mod icmp;
mod limit;
mod mtu;
mod ndp;
mod ptb;
mod ra;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod vectors;

pub use frag::fragment_ipv4;
pub(crate) use mtu::ENCAP_BUDGET;
pub use mtu::{external_path_mtu, mtu_budget, MtuBudget};
pub use ptb::packet_too_big;
pub use ra::{on_mtu_change, ra_info, tick, RaInfo};

use crate::drop::DropReason;
use crate::frames::output::TxBatch;
use crate::ids::PortId;
use crate::vpc::port::PortConfig;
use std::net::IpAddr;
use wire::meta::{InnerMeta, L3};

/// The DNS search list both DHCP servers offer (DHCPv4 option 119, DHCPv6 option
/// 24): the port's list, or its domain alone when it has no list, since a resolver
/// without a list searches its own domain.
fn search_list(cfg: &PortConfig) -> Vec<&str> {
    match cfg.domain_search.as_slice() {
        [] => cfg.domain.as_deref().into_iter().collect(),
        names => names.iter().map(String::as_str).collect(),
    }
}

/// What the gateway did with a guest frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GatewayVerdict {
    /// Not addressed to the gateway: continue to the firewall and router.
    NotForGateway,
    /// Consumed; zero or more replies were appended to the batch.
    Replied,
    /// Consumed and dropped; the reason's name is that of the counter that was bumped.
    Deny(DropReason),
}

/// Per-port gateway counters. Field names are the names used in logs, the API and
/// docs/gateway.md; each `Deny` reason is one of them.
#[derive(serde::Serialize, Default, Clone, Debug, PartialEq, Eq)]
pub struct GatewayCounters {
    pub arp_replies: u64,
    pub na_sent: u64,
    pub ra_solicited: u64,
    pub ra_unsolicited: u64,
    /// RAs sent because the port MTU changed.
    pub ra_mtu_change: u64,
    pub echo_replies: u64,
    pub dhcp4_replies: u64,
    /// DHCPNAKs (a REQUEST for an address that is not the port's); also in
    /// `dhcp4_replies`.
    pub dhcp4_naks: u64,
    pub dhcp6_replies: u64,
    /// ICMPv6 Packet Too Big and ICMPv4 Fragmentation Needed sent.
    pub ptb_sent: u64,
    pub ptb_rate_limited: u64,
    /// Packets too big for which RFC 1122/4443 forbid an ICMP error (an ICMP error,
    /// a non-first fragment, a multicast or unspecified source, IPv4 without DF) or
    /// the port lacks the gateway address to send it from.
    pub ptb_suppressed: u64,

    // Denies: one counter per reason.
    /// A frame for the gateway whose source MAC is not the guest's.
    pub src_mac_not_guest: u64,
    /// ARP that does not parse as Ethernet/IPv4 ARP.
    pub arp_malformed: u64,
    /// Any ARP other than a request for the gateway's IPv4 from the guest's own
    /// addresses (gratuitous ARP, replies, probes, requests for other hosts).
    pub denied_arp: u64,
    /// Router Solicitation failing RFC 4861 §6.1.1 validation (hop limit 255, code 0,
    /// checksum, options, source fe80::/10 or ::, destination ff02::2 or the gateway).
    pub rs_invalid: u64,
    /// Neighbor Solicitation failing RFC 4861 §7.1.1 validation.
    pub ns_invalid: u64,
    /// A valid Neighbor Solicitation for an address other than the gateway's (e.g.
    /// the guest's duplicate address detection): nobody else is on the link.
    pub ns_not_gateway: u64,
    /// NDP types the gateway does not accept from a guest (RA, NA, Redirect).
    pub denied_ndp: u64,
    /// NDP from a port without IPv6.
    pub ndp_no_ipv6: u64,
    /// Echo request to the gateway with a bad checksum or length.
    pub echo_malformed: u64,
    /// Traffic to a gateway address other than echo/DHCP (including fragments).
    pub to_gateway_unhandled: u64,
    pub dhcp4_malformed: u64,
    /// DHCPv4 messages that need no answer (RELEASE, DECLINE, unknown types, other
    /// clients' hardware addresses).
    pub dhcp4_ignored: u64,
    pub dhcp4_no_ipv4: u64,
    pub dhcp6_malformed: u64,
    /// DHCPv6 messages that need no answer (or are for another server).
    pub dhcp6_ignored: u64,
    pub dhcp6_no_ipv6: u64,
    /// Valid requests left unanswered because the port's limit for their kind was
    /// reached (see `limit`): ARP requests, NSs, echo requests, DHCPv4 and DHCPv6
    /// messages (one limit for both) beyond 100/s (burst 20), and Router
    /// Solicitations within 3 s (MIN_DELAY_BETWEEN_RAS) of the last RA — the RA
    /// that answers those goes to all nodes when the 3 s are over.
    pub arp_rate_limited: u64,
    pub na_rate_limited: u64,
    pub echo_rate_limited: u64,
    pub dhcp_rate_limited: u64,
    pub rs_rate_limited: u64,
}

/// Deny reasons; each names (and bumps) a [`GatewayCounters`] field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Deny {
    SrcMacNotGuest,
    ArpMalformed,
    DeniedArp,
    RsInvalid,
    NsInvalid,
    NsNotGateway,
    DeniedNdp,
    NdpNoIpv6,
    EchoMalformed,
    ToGatewayUnhandled,
    Dhcp4Malformed,
    Dhcp4Ignored,
    Dhcp4NoIpv4,
    Dhcp6Malformed,
    Dhcp6Ignored,
    Dhcp6NoIpv6,
    ArpRateLimited,
    NaRateLimited,
    EchoRateLimited,
    DhcpRateLimited,
    RsRateLimited,
}

impl GatewayCounters {
    /// Bumps the counter of `d` and returns the drop reason of the same name.
    fn deny(&mut self, d: Deny) -> DropReason {
        let (c, reason) = match d {
            Deny::SrcMacNotGuest => (&mut self.src_mac_not_guest, DropReason::SrcMacNotGuest),
            Deny::ArpMalformed => (&mut self.arp_malformed, DropReason::ArpMalformed),
            Deny::DeniedArp => (&mut self.denied_arp, DropReason::DeniedArp),
            Deny::RsInvalid => (&mut self.rs_invalid, DropReason::RsInvalid),
            Deny::NsInvalid => (&mut self.ns_invalid, DropReason::NsInvalid),
            Deny::NsNotGateway => (&mut self.ns_not_gateway, DropReason::NsNotGateway),
            Deny::DeniedNdp => (&mut self.denied_ndp, DropReason::DeniedNdp),
            Deny::NdpNoIpv6 => (&mut self.ndp_no_ipv6, DropReason::NdpNoIpv6),
            Deny::EchoMalformed => (&mut self.echo_malformed, DropReason::EchoMalformed),
            Deny::ToGatewayUnhandled => (
                &mut self.to_gateway_unhandled,
                DropReason::ToGatewayUnhandled,
            ),
            Deny::Dhcp4Malformed => (&mut self.dhcp4_malformed, DropReason::Dhcp4Malformed),
            Deny::Dhcp4Ignored => (&mut self.dhcp4_ignored, DropReason::Dhcp4Ignored),
            Deny::Dhcp4NoIpv4 => (&mut self.dhcp4_no_ipv4, DropReason::Dhcp4NoIpv4),
            Deny::Dhcp6Malformed => (&mut self.dhcp6_malformed, DropReason::Dhcp6Malformed),
            Deny::Dhcp6Ignored => (&mut self.dhcp6_ignored, DropReason::Dhcp6Ignored),
            Deny::Dhcp6NoIpv6 => (&mut self.dhcp6_no_ipv6, DropReason::Dhcp6NoIpv6),
            Deny::ArpRateLimited => (&mut self.arp_rate_limited, DropReason::ArpRateLimited),
            Deny::NaRateLimited => (&mut self.na_rate_limited, DropReason::NaRateLimited),
            Deny::EchoRateLimited => (&mut self.echo_rate_limited, DropReason::EchoRateLimited),
            Deny::DhcpRateLimited => (&mut self.dhcp_rate_limited, DropReason::DhcpRateLimited),
            Deny::RsRateLimited => (&mut self.rs_rate_limited, DropReason::RsRateLimited),
        };
        *c += 1;
        reason
    }
}

/// Per-port gateway state: RA timers, rate limits, counters.
#[derive(Clone, Debug)]
pub struct GatewayState {
    counters: GatewayCounters,
    ra: ra::RaTimer,
    limits: limit::Buckets,
}

impl GatewayState {
    /// State for a port that comes up at `now` (monotonic ns): the first unsolicited
    /// RA is due immediately.
    pub fn new(now: u64) -> Self {
        GatewayState {
            counters: GatewayCounters::default(),
            ra: ra::RaTimer::new(now),
            limits: limit::Buckets::new(now),
        }
    }

    pub fn counters(&self) -> &GatewayCounters {
        &self.counters
    }

    fn deny(&mut self, d: Deny) -> GatewayVerdict {
        GatewayVerdict::Deny(self.counters.deny(d))
    }

    /// Whether reply `sent` may go out at `now`: its kind's bucket has a token, or,
    /// for a solicited RA, no RA went out within MIN_DELAY_BETWEEN_RAS. Otherwise the
    /// deny that counts the refusal.
    fn permit(&mut self, sent: Sent, now: u64) -> Result<(), Deny> {
        let l = &mut self.limits;
        let (ok, refused) = match sent {
            Sent::ArpReply => (l.arp.take(limit::REPLY, now), Deny::ArpRateLimited),
            Sent::Na => (l.na.take(limit::REPLY, now), Deny::NaRateLimited),
            Sent::EchoReply => (l.echo.take(limit::REPLY, now), Deny::EchoRateLimited),
            Sent::Dhcp4 { .. } | Sent::Dhcp6 => {
                (l.dhcp.take(limit::REPLY, now), Deny::DhcpRateLimited)
            }
            Sent::SolicitedRa => (self.ra.may_answer_rs(now), Deny::RsRateLimited),
        };
        if ok {
            Ok(())
        } else {
            Err(refused)
        }
    }
}

/// UDP ports of DHCP.
const DHCP4_CLIENT_PORT: u16 = 68;
const DHCP4_SERVER_PORT: u16 = 67;
const DHCP6_CLIENT_PORT: u16 = 546;
const DHCP6_SERVER_PORT: u16 = 547;

/// Called for every frame from the guest before firewall/routing. Answers ARP for the
/// gateway IPv4 (other ARP denied), ICMP echo to the gateway (IPv4 address, IPv6
/// link-local fe80::EUI-64(gateway MAC)), NDP NS for the gateway -> NA, RS -> RA,
/// DHCPv4 (UDP 68->67), DHCPv6 (UDP 546->547 to ff02::1:2); other NDP types 133-137
/// are denied. Replies are appended to `out` for the port.
pub fn handle_from_guest(
    cfg: &PortConfig,
    st: &mut GatewayState,
    port: PortId,
    meta: &InnerMeta,
    frame: &[u8],
    now: u64,
    out: &mut TxBatch,
) -> GatewayVerdict {
    let Some(kind) = classify(cfg, meta) else {
        return GatewayVerdict::NotForGateway;
    };
    // Everything below is for the gateway; the gateway answers only the guest itself
    // (replies go to the guest MAC, so a spoofed source could not receive them anyway,
    // but it must not trigger state changes or counters as if it were the guest).
    if meta.src_mac != cfg.guest_mac {
        return st.deny(Deny::SrcMacNotGuest);
    }
    let before = out.len();
    let r = match kind {
        ForGateway::Arp => arp::handle(cfg, port, meta, frame, out),
        ForGateway::Ndp => ndp::handle(cfg, port, meta, frame, out),
        ForGateway::Echo => icmp::echo(cfg, port, meta, frame, out),
        ForGateway::Dhcp4 => dhcp4::handle(cfg, port, meta, frame, out),
        ForGateway::Dhcp6 => dhcp6::handle(cfg, port, meta, frame, out),
        ForGateway::OtherToGateway => Err(Deny::ToGatewayUnhandled),
    };
    let r = r.and_then(|sent| {
        let permitted = st.permit(sent, now);
        if permitted.is_err() {
            // Built but refused: the reply is taken back out of the batch.
            while out.len() > before {
                out.pop();
            }
        }
        permitted.map(|()| sent)
    });
    match r {
        Ok(sent) => {
            let c = &mut st.counters;
            match sent {
                Sent::ArpReply => c.arp_replies += 1,
                Sent::Na => c.na_sent += 1,
                Sent::SolicitedRa => {
                    c.ra_solicited += 1;
                    st.ra.solicited_sent(now, cfg.mtu);
                }
                Sent::EchoReply => c.echo_replies += 1,
                Sent::Dhcp4 { nak } => {
                    c.dhcp4_replies += 1;
                    c.dhcp4_naks += u64::from(nak);
                }
                Sent::Dhcp6 => c.dhcp6_replies += 1,
            }
            GatewayVerdict::Replied
        }
        Err(d) => st.deny(d),
    }
}

/// What a handler sent, for the counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sent {
    ArpReply,
    Na,
    SolicitedRa,
    EchoReply,
    Dhcp4 { nak: bool },
    Dhcp6,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ForGateway {
    Arp,
    Ndp,
    Echo,
    Dhcp4,
    Dhcp6,
    OtherToGateway,
}

/// ICMPv6 types of NDP that a router handles (RS, RA, NS, NA, Redirect).
fn is_ndp_type(t: u8) -> bool {
    (wire::icmpv6::msg::ROUTER_SOLICIT..=wire::icmpv6::msg::REDIRECT).contains(&t)
}

/// Decides from the metadata alone whether a frame is the gateway's business.
fn classify(cfg: &PortConfig, meta: &InnerMeta) -> Option<ForGateway> {
    match (meta.l3, meta.dst_ip) {
        (L3::Arp, _) => Some(ForGateway::Arp),
        (L3::Ipv4, IpAddr::V4(dst)) => {
            let to_gw = Some(dst) == cfg.gateway_ipv4;
            if meta.proto == frame::PROTO_UDP
                && !meta.fragment
                && meta.src_port == DHCP4_CLIENT_PORT
                && meta.dst_port == DHCP4_SERVER_PORT
                && (to_gw || dst.is_broadcast())
            {
                Some(ForGateway::Dhcp4)
            } else if !to_gw {
                None
            } else if meta.proto == frame::PROTO_ICMP
                && !meta.fragment
                && meta.icmp_type == wire::icmpv4::msg::ECHO_REQUEST
            {
                Some(ForGateway::Echo)
            } else {
                Some(ForGateway::OtherToGateway)
            }
        }
        (L3::Ipv6, IpAddr::V6(dst)) => {
            // The gateway's address is fe80::/64 (derived from its MAC): data
            // packets fail the first byte and skip the derivation.
            let to_gw = dst.octets()[0] == 0xfe && dst == cfg.gateway_ipv6();
            if meta.proto == frame::PROTO_ICMPV6 && !meta.fragment && is_ndp_type(meta.icmp_type) {
                Some(ForGateway::Ndp)
            } else if meta.proto == frame::PROTO_UDP
                && !meta.fragment
                && meta.src_port == DHCP6_CLIENT_PORT
                && meta.dst_port == DHCP6_SERVER_PORT
                && dst == dhcp6::ALL_DHCP_AGENTS
            {
                Some(ForGateway::Dhcp6)
            } else if !to_gw {
                None
            } else if meta.proto == frame::PROTO_ICMPV6
                && !meta.fragment
                && meta.icmp_type == wire::icmpv6::msg::ECHO_REQUEST
            {
                Some(ForGateway::Echo)
            } else {
                Some(ForGateway::OtherToGateway)
            }
        }
        _ => None,
    }
}

/// The IP packet of a frame (L3 header to `ip_end`), bounds-checked: the metadata
/// comes from our parser, but a mismatch must be a deny, not a panic.
fn l4_bytes<'a>(meta: &InnerMeta, frame: &'a [u8]) -> Option<&'a [u8]> {
    frame.get(meta.l4_off..meta.ip_end)
}

#[cfg(test)]
pub(crate) mod test_util;
