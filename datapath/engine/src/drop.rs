//! The one vocabulary of drop reasons: every frame the engine drops is counted
//! under exactly one [`DropReason`], and its [`name`](DropReason::name) is the
//! counter name in `stats`, the OpenMetrics `reason` label, logs and
//! docs/engine.md. The names are stable: operators' dashboards and alerts use them.
//!
//! Reasons decided elsewhere keep their own error types where they arise
//! (`wire::meta::UnderlayDrop`, which cannot depend on the engine, and
//! `frames::tso::TsoDrop`) and convert into a `DropReason` with `From`, taking
//! their names from there, so each string is written once. Conversions live with
//! their sources, so this file, the vocabulary everything else names, imports
//! nothing above it: `From<TsoDrop>` is in `frames::tso`, and only the wire's, from
//! the crate below, is here. A reason is a `u8`, so a counter set is an array
//! indexed by it (`machinery::counters::DropCounters`): one add on the fast path,
//! no lookup.

use wire::meta::UnderlayDrop;

/// Declares [`DropReason`] with its names and [`DropReason::ALL`] from one list,
/// so a reason cannot be added without a name or be missing from `ALL`.
macro_rules! drop_reasons {
    ($($(#[$doc:meta])* $v:ident = $name:expr,)*) => {
        /// Why a frame was dropped (see the module documentation).
        #[repr(u8)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum DropReason {
            $($(#[$doc])* $v,)*
        }

        impl DropReason {
            /// Every reason, in declaration order (= its `u8` value).
            pub const ALL: &'static [DropReason] = &[$(DropReason::$v,)*];

            /// The counter name (snake_case, stable).
            pub const fn name(self) -> &'static str {
                match self {
                    $(DropReason::$v => $name,)*
                }
            }
        }
    };
}

drop_reasons! {
    // The engine's own (guest side).
    /// `process_guest` for a port id that does not exist, or a held frame whose
    /// port is gone (datapath-wide counter).
    UnknownPort = "unknown_port",
    /// A guest frame `wire::meta::parse_inner` refused.
    GuestParse = "guest_parse_error",
    /// Neither IPv4 nor IPv6, and not consumed by the gateway.
    NotIp = "not_ip",
    /// Source MAC is not the guest's.
    SpoofedSrcMac = "spoofed_src_mac",
    /// Source IP is not the guest's.
    SpoofedSrcIp = "spoofed_src_ip",
    /// Destination MAC is not the gateway's (the guest's only neighbour).
    DstMacNotGateway = "dst_mac_not_gateway",
    /// Link-scoped traffic the gateway does not answer (MLD reports, DAD probes,
    /// IGMP, link-local multicast): it has nowhere to go beyond the guest's link.
    LinkLocalOnly = "link_local_only",
    /// The flow is addressed to the sending guest itself.
    Hairpin = "hairpin",
    /// The port is paused (`pause-port`): frames from and to its guest are dropped
    /// until it is resumed.
    PortPaused = "port_paused",
    /// A frame waiting for its underlay next hop was dropped because the hold queue
    /// was full (see `hold`): the oldest frame of a destination that already had
    /// `HOLD_PER_DST` waiting, or a new one when no more destinations or bytes fit.
    UnderlayHoldOverflow = "underlay_hold_overflow",
    /// A frame waited `HOLD_TIMEOUT_NS` for its underlay next hop and was dropped.
    UnderlayHoldTimeout = "underlay_hold_timeout",
    /// Larger than the path MTU and not fragmentable (IPv6, IPv4 with DF, a GSO
    /// buffer); a Packet Too Big / Fragmentation Needed went to the guest unless
    /// rate-limited or suppressed (see the gateway counters).
    PacketTooBig = "packet_too_big",

    // The engine's own (underlay side).
    /// Outer frame not for this sled's underlay address (datapath-wide).
    NotOurUnderlayAddr = "not_our_underlay_addr",
    /// Inner frame refused by `parse_inner` (datapath-wide).
    InnerParse = "inner_parse_error",
    /// Inner destination MAC is broadcast/multicast: no replication is done
    /// (datapath-wide).
    InnerMulticast = "inner_multicast",
    /// No port has this (VNI, inner destination MAC) (datapath-wide), and no guest
    /// of that MAC left this sled within the grace period of a move (`vpc::moved`).
    NoPort = "no_port_for_vni_mac",
    /// A frame for a guest that moved to another sled, within the grace period,
    /// could not be relayed there: no next hop toward that sled is known (datapath-wide).
    MovedNotRelayed = "moved_not_relayed",
    /// Inner destination IP is not the port's.
    InboundDstNotGuest = "inbound_dst_not_guest",
    /// Inbound inner frame that is neither IPv4 nor IPv6.
    InboundNotIp = "inbound_not_ip",
    /// A congestion mark (CE) on the outer header over an inner packet that is not
    /// ECN-capable: RFC 6040 §4.2 drops it, as the switch would have.
    EcnCeNotEct = "ecn_ce_not_ect",

    // Overlay layer.
    /// A VPC-internal destination with no V2P mapping (and no local port).
    NoV2p = "no_v2p",
    /// An internet-gateway route on a sled without boundary services.
    NoBoundary = "no_boundary_services",

    // NAT layer (nat.rs).
    /// Traffic to the internet gateway from a port with no external address of the
    /// flow's family: a private address must not reach the internet.
    NoExternalIp = "no_external_ip",
    /// Every source port of the port's SNAT range is held by a live flow.
    SnatExhausted = "snat_exhausted",
    /// An External frame to an address that is not one of the port's external
    /// addresses, or to a SNAT port no flow of that peer holds.
    NatNoMapping = "nat_no_mapping",

    // Rate limits (ratelimit.rs).
    /// The port's egress or ingress limit (bits or packets per second) had no
    /// tokens left for the frame.
    RateLimited = "rate_limited",
    /// An underlay frame from a sender the overlay does not trust for it: the outer
    /// source is not the sled V2P maps the inner source address to in the frame's
    /// VNI (or there is no mapping: e.g. an address of another VPC), the inner source
    /// MAC is not the mapped guest's, the outer source is this sled itself, or an
    /// External frame's outer source is not a boundary-services endpoint.
    UnderlaySrcMismatch = "underlay_src_mismatch",

    // Router layer.
    /// No route covers the destination.
    NoRoute = "no_route",
    /// The covering route's target is `Drop`.
    RouteDrop = "route_drop",

    // Firewall layer.
    /// An outbound rule denied the flow.
    FwDenyOut = "fw_deny_out",
    /// No connection and no inbound rule allowed the flow.
    FwDenyIn = "fw_deny_in",
    /// The connection table is full of live connections.
    FwTableFull = "fw_table_full",
    /// Inbound TCP without SYN and without a connection: even with an allowing rule,
    /// a remote peer opens a connection only with a SYN (mid-stream flows are picked
    /// up from the guest's side only).
    FwMidstreamIn = "fw_midstream_in",
    /// A TCP segment of a tracked connection outside what its receiver accepts: an
    /// RST outside the receiver's window, data entirely outside it, or an ACK of
    /// data never sent (see `machinery::conntrack::tcp`). Either direction.
    TcpOutOfWindow = "tcp_out_of_window",

    // IPv4 fragmentation of guest packets larger than their path MTU
    // (`gateway::frag`).
    /// The packet to fragment is not IPv4.
    NotIpv4 = "not_ipv4",
    /// IPv4 with DF set (a Fragmentation Needed went to the guest instead).
    DontFragment = "dont_fragment",
    /// A path MTU below IPv4's minimum of 68.
    MtuBelow68 = "mtu_below_68",
    /// The IPv4 header does not parse.
    MalformedIpv4 = "malformed_ipv4",
    /// The IPv4 options do not parse.
    MalformedIpv4Options = "malformed_ipv4_options",

    // Tunneled TSO (`tso::TsoDrop`, which documents each).
    TsoBadGsoType = "tso_bad_gso_type",
    TsoGsoIpMismatch = "tso_gso_ip_mismatch",
    TsoGsoNotTcp = "tso_gso_not_tcp",
    TsoGsoFragment = "tso_gso_fragment",
    TsoHdrLenMismatch = "tso_hdr_len_mismatch",
    TsoCsumStartMismatch = "tso_csum_start_mismatch",
    TsoCsumOffsetOutOfRange = "tso_csum_offset_out_of_range",
    TsoGsoSizeZero = "tso_gso_size_zero",
    TsoTooManySegments = "tso_too_many_segments",
    TsoTruncated = "tso_truncated",
    TsoTooBig = "tso_too_big",
    TsoSegmentSizeZero = "tso_segment_size_zero",

    // The gateway's denies (each also a `gateway::GatewayCounters` field, which
    // documents it).
    SrcMacNotGuest = "src_mac_not_guest",
    ArpMalformed = "arp_malformed",
    DeniedArp = "denied_arp",
    RsInvalid = "rs_invalid",
    NsInvalid = "ns_invalid",
    NsNotGateway = "ns_not_gateway",
    DeniedNdp = "denied_ndp",
    NdpNoIpv6 = "ndp_no_ipv6",
    EchoMalformed = "echo_malformed",
    ToGatewayUnhandled = "to_gateway_unhandled",
    Dhcp4Malformed = "dhcp4_malformed",
    Dhcp4Ignored = "dhcp4_ignored",
    Dhcp4NoIpv4 = "dhcp4_no_ipv4",
    Dhcp6Malformed = "dhcp6_malformed",
    Dhcp6Ignored = "dhcp6_ignored",
    Dhcp6NoIpv6 = "dhcp6_no_ipv6",
    ArpRateLimited = "arp_rate_limited",
    NaRateLimited = "na_rate_limited",
    EchoRateLimited = "echo_rate_limited",
    DhcpRateLimited = "dhcp_rate_limited",
    RsRateLimited = "rs_rate_limited",

    // Underlay frames `wire::meta::parse_underlay` refused (`UnderlayDrop`, which
    // documents each and owns the names).
    UlTruncated = UnderlayDrop::Truncated.name(),
    UlNotIpv6 = UnderlayDrop::NotIpv6.name(),
    UlBadIpv6Version = UnderlayDrop::BadIpv6Version.name(),
    UlBadIpv6Length = UnderlayDrop::BadIpv6Length.name(),
    UlIpv6ExtensionHeader = UnderlayDrop::Ipv6ExtensionHeader.name(),
    UlNotUdp = UnderlayDrop::NotUdp.name(),
    UlNotGenevePort = UnderlayDrop::NotGenevePort.name(),
    UlBadUdpLength = UnderlayDrop::BadUdpLength.name(),
    UlBadGeneveVersion = UnderlayDrop::BadGeneveVersion.name(),
    UlGeneveOam = UnderlayDrop::GeneveOam.name(),
    UlNotEthernetPayload = UnderlayDrop::NotEthernetPayload.name(),
    UlBadOptionLength = UnderlayDrop::BadOptionLength.name(),
    UlUnknownCriticalOption = UnderlayDrop::UnknownCriticalOption.name(),
    UlBadMulticastReplication = UnderlayDrop::BadMulticastReplication.name(),
    UlBadMssValue = UnderlayDrop::BadMssValue.name(),
    UlInnerTruncated = UnderlayDrop::InnerTruncated.name(),
}

impl DropReason {
    /// How many reasons there are: the length of a counter array.
    pub const COUNT: usize = Self::ALL.len();

    /// The reason named `name`, if there is one.
    pub fn from_name(name: &str) -> Option<DropReason> {
        Self::ALL.iter().copied().find(|r| r.name() == name)
    }

    /// Whether a refusal depends on the packet rather than on its flow: such drops
    /// are never cached, so the flow's next packet (a SYN, a segment in the window)
    /// is decided afresh.
    pub fn per_packet(self) -> bool {
        matches!(self, DropReason::FwMidstreamIn | DropReason::TcpOutOfWindow)
    }
}

impl core::fmt::Display for DropReason {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

impl From<UnderlayDrop> for DropReason {
    fn from(d: UnderlayDrop) -> Self {
        match d {
            UnderlayDrop::Truncated => DropReason::UlTruncated,
            UnderlayDrop::NotIpv6 => DropReason::UlNotIpv6,
            UnderlayDrop::BadIpv6Version => DropReason::UlBadIpv6Version,
            UnderlayDrop::BadIpv6Length => DropReason::UlBadIpv6Length,
            UnderlayDrop::Ipv6ExtensionHeader => DropReason::UlIpv6ExtensionHeader,
            UnderlayDrop::NotUdp => DropReason::UlNotUdp,
            UnderlayDrop::NotGenevePort => DropReason::UlNotGenevePort,
            UnderlayDrop::BadUdpLength => DropReason::UlBadUdpLength,
            UnderlayDrop::BadGeneveVersion => DropReason::UlBadGeneveVersion,
            UnderlayDrop::GeneveOam => DropReason::UlGeneveOam,
            UnderlayDrop::NotEthernetPayload => DropReason::UlNotEthernetPayload,
            UnderlayDrop::BadOptionLength => DropReason::UlBadOptionLength,
            UnderlayDrop::UnknownCriticalOption => DropReason::UlUnknownCriticalOption,
            UnderlayDrop::BadMulticastReplication => DropReason::UlBadMulticastReplication,
            UnderlayDrop::BadMssValue => DropReason::UlBadMssValue,
            UnderlayDrop::InnerTruncated => DropReason::UlInnerTruncated,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// Names are unique, `ALL` is in `u8` order, and every name reads back.
    #[test]
    fn names_are_unique_and_indexed() {
        let mut seen = HashSet::new();
        for (i, r) in DropReason::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i, "{r:?}");
            assert!(seen.insert(r.name()), "duplicate name {}", r.name());
            assert_eq!(DropReason::from_name(r.name()), Some(*r));
            assert!(r
                .name()
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'));
        }
        assert!(DropReason::COUNT <= usize::from(u8::MAX));
        assert_eq!(DropReason::from_name("nonsense"), None);
    }

    /// The wire's reasons keep their own names.
    #[test]
    fn converted_reasons_keep_their_names() {
        for d in UnderlayDrop::ALL {
            assert_eq!(DropReason::from(*d).name(), d.name());
        }
    }
}
