//! The NAT layer (docs/nat.md): traffic to the internet gateway leaves from the
//! port's external address, replies and ICMP errors about it come back translated,
//! and every checksum is right. Frames are built and checked with etherparse, an
//! implementation independent of ours.

mod common;

use common::internet::*;
use common::*;
use engine::{Direction, Engine, FwAction, Predicate, Rule, TxBatch, VnetHdr, Vni};
use engine::{ExternalIps, IgwId, RouteTarget, SnatRange};
use etherparse::{NetHeaders, PacketBuilder, PacketHeaders, TransportHeader};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use wire::vnet::F_NEEDS_CSUM;

#[test]
fn the_source_is_the_floating_ip_else_the_ephemeral_else_snat() {
    let g = guest(1);
    let (f4, f6) = floating(&g);
    let all = ExternalIps {
        snat: Some(SnatRange {
            ip: IpAddr::V4(snat4()),
            start: 4096,
            end: 8191,
        }),
        ephemeral: Some(IpAddr::V4(eph4())),
        floating: vec![IpAddr::V4(f4), IpAddr::V6(f6)],
        gateways: Default::default(),
    };
    let remote4 = ip("8.8.8.8");
    let remote6 = ip("2001:4860::8888");
    let (mut e, p) = internet_sled(all.clone());
    let got = send(&mut e, p, &udp_to(remote4, 5353), 1);
    assert_eq!(checked(&got[0]), ((IpAddr::V4(f4), remote4), (5353, 53)));
    let got = send(&mut e, p, &udp_to(remote6, 5353), 1);
    assert_eq!(checked(&got[0]), ((IpAddr::V6(f6), remote6), (5353, 53)));
    let tcp = tcp_v4(&g, Ipv4Addr::new(8, 8, 8, 8), 40000, 443, true, b"");
    let got = send(&mut e, p, &tcp, 1);
    assert_eq!(checked(&got[0]), ((IpAddr::V4(f4), remote4), (40000, 443)));

    // Without floating IPs: the ephemeral IP, port kept.
    let (mut e, p) = internet_sled(ExternalIps {
        floating: vec![],
        ..all.clone()
    });
    let got = send(&mut e, p, &udp_to(remote4, 5353), 1);
    assert_eq!(
        checked(&got[0]),
        ((IpAddr::V4(eph4()), remote4), (5353, 53))
    );

    // SNAT only: the SNAT IP and a port of the range.
    let (mut e, p) = internet_sled(snat(IpAddr::V4(snat4()), 4096, 8191));
    let got = send(&mut e, p, &udp_to(remote4, 5353), 1);
    let ((src, dst), (sport, dport)) = checked(&got[0]);
    assert_eq!((src, dst, dport), (IpAddr::V4(snat4()), remote4, 53));
    assert!((4096..=8191).contains(&sport), "{sport}");
    let got = send(&mut e, p, &tcp, 1);
    let ((src, _), (sport, _)) = checked(&got[0]);
    assert_eq!(src, IpAddr::V4(snat4()));
    assert!((4096..=8191).contains(&sport), "{sport}");
    // VPC-internal traffic is not NATed.
    let g2 = guest(2);
    let vni = Vni::new(VNI).unwrap();
    e.set_v2p(vni, IpAddr::V4(g2.v4), SLED_B.parse().unwrap(), g2.mac)
        .unwrap();
    let mut out = TxBatch::new();
    let f = frame(&g, Some(g2.v4), None, L4::Udp { sport: 7, dport: 8 }, b"x");
    e.process_guest(p, VnetHdr::default(), &f, 1, &Fabric, &mut out);
    let inner = decode_underlay(out.frame(0).unwrap().1).inner;
    assert_eq!(checked(&inner).0, (IpAddr::V4(g.v4), IpAddr::V4(g2.v4)));
}

#[test]
fn a_port_without_an_external_address_of_the_family_is_refused() {
    let (mut e, p) = internet_sled(ExternalIps::default());
    assert!(send(&mut e, p, &udp_to(ip("8.8.8.8"), 1), 1).is_empty());
    assert_eq!(drops(&e, "no_external_ip"), 1);
    // An IPv6 SNAT address serves no IPv4 flow.
    let (mut e, p) = internet_sled(snat(IpAddr::V6(snat6()), 1024, 2047));
    assert!(send(&mut e, p, &udp_to(ip("8.8.8.8"), 1), 1).is_empty());
    assert_eq!(drops(&e, "no_external_ip"), 1);
    assert_eq!(
        e.stats().ports[0].firewall.flows_created,
        0,
        "no connection"
    );
    assert_eq!(send(&mut e, p, &udp_to(ip("2001:db8::53"), 1), 1).len(), 1);
}

#[test]
fn snat_ports_are_held_per_flow_until_its_connection_ends() {
    let (mut e, p) = internet_sled(snat(IpAddr::V4(snat4()), 5000, 5001));
    let remote = ip("8.8.8.8");
    let port_of = |got: Vec<Vec<u8>>| checked(&got[0]).1 .0;
    let a = port_of(send(&mut e, p, &udp_to(remote, 1111), 1));
    let b = port_of(send(&mut e, p, &udp_to(remote, 2222), 1));
    assert_ne!(a, b);
    assert!([a, b].iter().all(|p| (5000..=5001).contains(p)));
    // The same flow keeps its port, also when it is compiled again.
    assert_eq!(port_of(send(&mut e, p, &udp_to(remote, 1111), 2)), a);
    e.clear_uft("ga").unwrap();
    assert_eq!(port_of(send(&mut e, p, &udp_to(remote, 1111), 3)), a);
    // A third flow finds the range taken: counted, not cached, nothing opened.
    let created = e.stats().ports[0].firewall.flows_created;
    assert!(send(&mut e, p, &udp_to(remote, 3333), 4).is_empty());
    assert!(send(&mut e, p, &udp_to(remote, 3333), 4).is_empty());
    assert_eq!(drops(&e, "snat_exhausted"), 2);
    assert_eq!(e.stats().ports[0].firewall.flows_created, created);
    // Once the connections have gone idle past their timeout, their ports are free.
    let later = 3600 * S;
    let c = port_of(send(&mut e, p, &udp_to(remote, 3333), later));
    assert!((5000..=5001).contains(&c));
    // The expired flow gets a port again when it comes back.
    assert_eq!(send(&mut e, p, &udp_to(remote, 1111), later).len(), 1);
}

#[test]
fn replies_are_translated_back_and_nothing_else_gets_in() {
    let g = guest(1);
    let (mut e, p) = internet_sled(snat(IpAddr::V4(snat4()), 5000, 5099));
    let remote = ip("8.8.8.8");
    let got = send(&mut e, p, &udp_to(remote, 1111), 1);
    let sport = checked(&got[0]).1 .0;
    let s4 = IpAddr::V4(snat4());
    let back = from_internet(&mut e, &udp_reply(remote, s4, sport), 2);
    assert_eq!(back.len(), 1);
    assert_eq!(checked(&back[0]), ((remote, IpAddr::V4(g.v4)), (53, 1111)));
    assert_eq!(&back[0][..6], &g.mac.0);
    assert_eq!(&back[0][6..12], &g.gw_mac.0);
    // Another peer to that port; the peer to another port of the range; an address
    // that is not the port's; the private address itself: none maps.
    let strangers = [
        udp_reply(ip("9.9.9.9"), s4, sport),
        udp_reply(remote, s4, sport + 1),
        udp_reply(remote, ip("198.51.100.2"), sport),
        udp_reply(remote, IpAddr::V4(g.v4), 1111),
    ];
    for (i, f) in strangers.iter().enumerate() {
        assert!(from_internet(&mut e, f, 3).is_empty(), "{i}");
    }
    assert_eq!(drops(&e, "nat_no_mapping"), 4);
}

#[test]
fn the_internet_connects_in_to_a_floating_ip_the_firewall_permitting() {
    let g = guest(1);
    let (f4, f6) = floating(&g);
    let (mut e, _) = internet_sled(ExternalIps {
        floating: vec![IpAddr::V4(f4), IpAddr::V6(f6)],
        ..Default::default()
    });
    let syn = |dport| {
        let mut buf = Vec::new();
        PacketBuilder::ethernet2(SWITCH_MAC, g.mac.0)
            .ipv6(ip6("2001:db8:99::1").octets(), f6.octets(), 60)
            .tcp(50000, dport, 1, 65535)
            .syn()
            .write(&mut buf, b"")
            .unwrap();
        buf
    };
    assert!(from_internet(&mut e, &syn(22), 1).is_empty());
    assert_eq!(drops(&e, "fw_deny_in"), 1);
    let rule = Rule::new(10, FwAction::Allow)
        .matching(Predicate::Proto(6))
        .finalize()
        .unwrap();
    e.add_fw_rule("ga", Direction::In, rule).unwrap();
    let back = from_internet(&mut e, &syn(22), 2);
    assert_eq!(back.len(), 1);
    assert_eq!(
        checked(&back[0]),
        ((ip("2001:db8:99::1"), IpAddr::V6(g.v6)), (50000, 22))
    );
}

fn ip6(s: &str) -> Ipv6Addr {
    s.parse().unwrap()
}

#[test]
fn echo_through_snat_allocates_the_identifier() {
    let g = guest(1);
    for (ext, remote) in [
        (IpAddr::V4(snat4()), ip("8.8.8.8")),
        (IpAddr::V6(snat6()), ip("2001:4860::8888")),
    ] {
        let (mut e, p) = internet_sled(snat(ext, 7000, 7010));
        let ping = match remote {
            IpAddr::V4(r) => frame(&g, Some(r), None, L4::Icmp { id: 77, seq: 1 }, b"ping"),
            IpAddr::V6(r) => frame(&g, None, Some(r), L4::Icmp { id: 77, seq: 1 }, b"ping"),
        };
        let got = send(&mut e, p, &ping, 1);
        let ((src, dst), (id, _)) = checked(&got[0]);
        assert_eq!((src, dst), (ext, remote));
        assert!((7000..=7010).contains(&id), "{id}");
        let mut reply = Vec::new();
        let eth = PacketBuilder::ethernet2(SWITCH_MAC, g.mac.0);
        match (remote, ext) {
            (IpAddr::V4(r), IpAddr::V4(x)) => eth
                .ipv4(r.octets(), x.octets(), 60)
                .icmpv4_echo_reply(id, 1)
                .write(&mut reply, b"ping")
                .unwrap(),
            (IpAddr::V6(r), IpAddr::V6(x)) => eth
                .ipv6(r.octets(), x.octets(), 60)
                .icmpv6_echo_reply(id, 1)
                .write(&mut reply, b"ping")
                .unwrap(),
            _ => unreachable!(),
        }
        let back = from_internet(&mut e, &reply, 2);
        assert_eq!(back.len(), 1, "{ext}");
        let private = if ext.is_ipv4() {
            IpAddr::V4(g.v4)
        } else {
            IpAddr::V6(g.v6)
        };
        assert_eq!(checked(&back[0]), ((remote, private), (77, 77)));
    }
}

/// The ICMPv6 Packet Too Big a router at `router` sends about `packet` (an IPv6
/// packet in Ethernet, as it left the sled), quoting as much of it as fits 1280
/// bytes, to the packet's source.
fn packet_too_big(router: Ipv6Addr, packet: &[u8], mtu: u32) -> Vec<u8> {
    let quoted = &packet[14..packet.len().min(14 + 1280 - 48)];
    let to: [u8; 16] = packet[14 + 8..14 + 24].try_into().unwrap();
    let mut buf = Vec::new();
    PacketBuilder::ethernet2(SWITCH_MAC, guest(1).mac.0)
        .ipv6(router.octets(), to, 60)
        .icmpv6(etherparse::Icmpv6Type::PacketTooBig { mtu })
        .write(&mut buf, quoted)
        .unwrap();
    buf
}

#[test]
fn packet_too_big_about_a_snat_flow_reaches_the_guest_translated() {
    let g = guest(1);
    let (mut e, p) = internet_sled(snat(IpAddr::V6(snat6()), 1024, 1100));
    let remote = ip6("2001:db8:99::80");
    let payload = vec![0x5a; 1400];
    let f = frame(
        &g,
        None,
        Some(remote),
        L4::Udp {
            sport: 33000,
            dport: 9,
        },
        &payload,
    );
    let left = send(&mut e, p, &f, 1);
    let ((_, _), (sport, _)) = checked(&left[0]);
    let ptb = packet_too_big(ip6("2001:db8:ffff::1"), &left[0], 1400);
    let back = from_internet(&mut e, &ptb, 2);
    assert_eq!(back.len(), 1, "{:?}", e.stats().ports[0].drops);
    let ptb_back = &back[0];
    // The error itself: to the private address, its checksum right.
    let h = PacketHeaders::from_ethernet_slice(ptb_back).unwrap();
    let Some(NetHeaders::Ipv6(ip6h, _)) = &h.net else {
        panic!("IPv6")
    };
    assert_eq!(Ipv6Addr::from(ip6h.destination), g.v6);
    let Some(TransportHeader::Icmpv6(icmp)) = &h.transport else {
        panic!("ICMPv6")
    };
    assert_eq!(
        icmp.icmp_type,
        etherparse::Icmpv6Type::PacketTooBig { mtu: 1400 }
    );
    let mut fixed = icmp.clone();
    fixed
        .update_checksum(ip6h.source, ip6h.destination, h.payload.slice())
        .unwrap();
    assert_eq!(&fixed, icmp, "ICMPv6 checksum");
    // The quote: the guest's own packet again (source address and port), its UDP
    // checksum right as far as the quote is whole.
    let quote = h.payload.slice();
    assert_eq!(&quote[8..24], &g.v6.octets());
    assert_eq!(&quote[24..40], &remote.octets());
    assert_eq!(u16::from_be_bytes([quote[40], quote[41]]), 33000);
    let mut whole = f.clone();
    whole.truncate(14 + quote.len());
    assert_eq!(&whole[14..], quote, "exactly what the guest sent");
    assert_ne!(sport, 33000, "the port was translated, not kept");

    // A Packet Too Big quoting a port no flow holds: no mapping.
    let mut stray = left[0].clone();
    stray[14 + 40..14 + 42].copy_from_slice(&(sport + 1).to_be_bytes());
    let ptb = packet_too_big(ip6("2001:db8:ffff::1"), &stray, 1400);
    assert!(from_internet(&mut e, &ptb, 3).is_empty());
    assert_eq!(drops(&e, "nat_no_mapping"), 1);
}

#[test]
fn fragmentation_needed_about_a_floating_tcp_flow_is_translated() {
    let g = guest(1);
    let (f4, _) = floating(&g);
    let (mut e, p) = internet_sled(ExternalIps {
        floating: vec![IpAddr::V4(f4)],
        ..Default::default()
    });
    let syn = tcp_v4(&g, Ipv4Addr::new(8, 8, 8, 8), 40000, 443, true, b"");
    let left = send(&mut e, p, &syn, 1);
    // RFC 792: the IP header and the first 8 bytes of TCP.
    let mut err = Vec::new();
    PacketBuilder::ethernet2(SWITCH_MAC, g.mac.0)
        .ipv4([203, 0, 113, 1], f4.octets(), 60)
        .icmpv4(etherparse::Icmpv4Type::DestinationUnreachable(
            etherparse::icmpv4::DestUnreachableHeader::FragmentationNeeded { next_hop_mtu: 1400 },
        ))
        .write(&mut err, &left[0][14..14 + 28])
        .unwrap();
    let back = from_internet(&mut e, &err, 2);
    assert_eq!(back.len(), 1);
    let mut expected = Vec::new();
    PacketBuilder::ethernet2(SWITCH_MAC, g.mac.0)
        .ipv4([203, 0, 113, 1], g.v4.octets(), 60)
        .icmpv4(etherparse::Icmpv4Type::DestinationUnreachable(
            etherparse::icmpv4::DestUnreachableHeader::FragmentationNeeded { next_hop_mtu: 1400 },
        ))
        .write(&mut expected, &syn[14..14 + 28])
        .unwrap();
    assert_eq!(&back[0][14..], &expected[14..]);
}

#[test]
fn partial_checksums_and_tso_buffers_leave_with_right_checksums() {
    let g = guest(1);
    let (mut e, p) = internet_sled(snat(IpAddr::V4(snat4()), 2000, 2999));
    let remote = Ipv4Addr::new(8, 8, 8, 8);
    // UDP with NEEDS_CSUM: the field holds the pseudo-header sum.
    let mut f = udp_to(IpAddr::V4(remote), 4444);
    let udp_len = (f.len() - 34) as u32;
    let pseudo = wire::checksum::pseudo_header_v4(g.v4, remote, 17, udp_len);
    f[40..42].copy_from_slice(&wire::checksum::fold(pseudo).to_be_bytes());
    let vnet = VnetHdr {
        flags: F_NEEDS_CSUM,
        csum_start: 34,
        csum_offset: 6,
        ..VnetHdr::default()
    };
    let got = send_with(&mut e, p, vnet, &f, 1);
    let ((src, _), (sport, _)) = checked(&got[0]);
    assert_eq!(src, IpAddr::V4(snat4()));
    assert!((2000..=2999).contains(&sport));
    // A TSO buffer to the internet: cut into the guest's MSS, every segment NATed.
    let syn = tcp_v4(&g, remote, 40000, 443, true, b"");
    assert_eq!(send(&mut e, p, &syn, 1).len(), 1);
    let mut big = tcp_v4(&g, remote, 40000, 443, false, &[3u8; 3000]);
    let tcp_len = (big.len() - 34) as u32;
    let pseudo = wire::checksum::pseudo_header_v4(g.v4, remote, 6, tcp_len);
    big[50..52].copy_from_slice(&wire::checksum::fold(pseudo).to_be_bytes());
    let gso = VnetHdr {
        flags: F_NEEDS_CSUM,
        gso_type: wire::vnet::GSO_TCPV4,
        hdr_len: 54,
        gso_size: 1400,
        csum_start: 34,
        csum_offset: 16,
    };
    let segs = send_with(&mut e, p, gso, &big, 2);
    assert_eq!(segs.len(), 3);
    let first = checked(&segs[0]);
    assert_eq!(first.0 .0, IpAddr::V4(snat4()));
    for s in &segs {
        assert_eq!(checked(s), first);
    }
}

#[test]
fn new_external_addresses_apply_to_established_flows() {
    let (mut e, p) = internet_sled(ExternalIps {
        ephemeral: Some(IpAddr::V4(eph4())),
        ..Default::default()
    });
    let remote = ip("8.8.8.8");
    let got = send(&mut e, p, &udp_to(remote, 1), 1);
    assert_eq!(checked(&got[0]).0 .0, IpAddr::V4(eph4()));
    let other = Ipv4Addr::new(198, 51, 100, 78);
    e.set_external_ips(
        "ga",
        ExternalIps {
            ephemeral: Some(IpAddr::V4(other)),
            ..Default::default()
        },
    )
    .unwrap();
    let got = send(&mut e, p, &udp_to(remote, 1), 2);
    assert_eq!(checked(&got[0]).0 .0, IpAddr::V4(other));
    // Replies to the old address find no mapping.
    let reply = udp_reply(remote, IpAddr::V4(eph4()), 1);
    assert!(from_internet(&mut e, &reply, 3).is_empty());
    assert_eq!(drops(&e, "nat_no_mapping"), 1);
    // Removed altogether: refused.
    e.set_external_ips("ga", ExternalIps::default()).unwrap();
    assert!(send(&mut e, p, &udp_to(remote, 1), 4).is_empty());
    assert_eq!(drops(&e, "no_external_ip"), 1);
}

/// External addresses are the API's to check (`api::ExternalIps::validate`); the
/// engine takes what it is given, and what makes no sense translates nothing: a
/// reversed SNAT range holds no port (`snat_exhausted`), an address of a family
/// the port has no private address of is never a flow's source, and one given
/// twice is one address.
#[test]
fn unchecked_external_addresses_translate_nothing_they_cannot() {
    let v4 = IpAddr::V4(snat4());
    let (mut e, p) = internet_sled(snat(v4, 3000, 2000));
    let remote = ip("8.8.8.8");
    assert!(send(&mut e, p, &udp_to(remote, 1), 1).is_empty());
    assert_eq!(drops(&e, "snat_exhausted"), 1);
    // The whole port space, the well-known ports included, is a range like any.
    e.set_external_ips("ga", snat(v4, 0, 65535)).unwrap();
    let got = send(&mut e, p, &udp_to(remote, 2), 2);
    assert_eq!(checked(&got[0]).0 .0, v4);
    // IPv6 only, for a port without IPv6; and twice.
    let six = ExternalIps {
        ephemeral: Some(IpAddr::V6(snat6())),
        floating: vec![IpAddr::V6(snat6()); 2],
        ..Default::default()
    };
    let mut pc = port_config(&guest(2));
    pc.ipv6 = None;
    pc.vpc_subnet6 = None;
    pc.external = six.clone();
    e.add_port(pc).unwrap();
    e.set_external_ips("ga", six).unwrap();
    assert!(send(&mut e, p, &udp_to(remote, 3), 3).is_empty());
    assert_eq!(drops(&e, "no_external_ip"), 1);
    let e = e
        .set_external_ips("nope", ExternalIps::default())
        .unwrap_err();
    assert_eq!(e.code(), "no-such-port");
}

/// IPv4 fragments the guest sent itself: the first carries the UDP header and gets
/// the SNAT port; the others only the address; reassembled, the datagram's UDP
/// checksum is right for the new source.
#[test]
fn guest_fragments_through_snat_reassemble_with_a_right_checksum() {
    let g = guest(1);
    let (mut e, p) = internet_sled(snat(IpAddr::V4(snat4()), 3000, 3999));
    let remote = Ipv4Addr::new(8, 8, 8, 8);
    let payload: Vec<u8> = (0..2000u32).map(|i| (i % 251) as u8).collect();
    let whole = frame(
        &g,
        Some(remote),
        None,
        L4::Udp {
            sport: 6000,
            dport: 53,
        },
        &payload,
    );
    // The IP payload (UDP header + data), cut at 1480 bytes.
    let ip_payload = &whole[34..];
    let fragment = |offset: usize, data: &[u8], more: bool| {
        let mut h = etherparse::Ipv4Header::new(
            data.len() as u16,
            64,
            etherparse::IpNumber::UDP,
            g.v4.octets(),
            remote.octets(),
        )
        .unwrap();
        h.identification = 77;
        h.more_fragments = more;
        h.fragment_offset = etherparse::IpFragOffset::try_new((offset / 8) as u16).unwrap();
        h.header_checksum = h.calc_header_checksum();
        let mut f = whole[..14].to_vec();
        h.write(&mut f).unwrap();
        f.extend_from_slice(data);
        f
    };
    let first = fragment(0, &ip_payload[..1480], true);
    let second = fragment(1480, &ip_payload[1480..], false);
    let out1 = send(&mut e, p, &first, 1);
    let out2 = send(&mut e, p, &second, 1);
    let (f1, f2) = (&out1[0], &out2[0]);
    for f in [f1, f2] {
        let h = etherparse::Ipv4HeaderSlice::from_slice(&f[14..])
            .unwrap()
            .to_header();
        assert_eq!(h.header_checksum, h.calc_header_checksum());
        assert_eq!(h.source, snat4().octets());
    }
    let sport = u16::from_be_bytes([f1[34], f1[35]]);
    assert!((3000..=3999).contains(&sport), "{sport}");
    assert_eq!(
        &f2[34..],
        &ip_payload[1480..],
        "the second fragment's data as sent"
    );
    // Reassembled: UDP checksum over the pseudo-header of the new source.
    let mut datagram = f1[34..].to_vec();
    datagram.extend_from_slice(&f2[34..]);
    let udp = etherparse::UdpHeaderSlice::from_slice(&datagram)
        .unwrap()
        .to_header();
    let want = udp
        .calc_checksum_ipv4_raw(snat4().octets(), remote.octets(), &datagram[8..])
        .unwrap();
    assert_eq!(udp.checksum, want);
}

/// A port with two floating IPs: its own flows leave from the first; a connection
/// from the internet to the second is answered from the second.
#[test]
fn replies_leave_from_the_floating_ip_the_connection_came_in_to() {
    let g = guest(1);
    let (first, second) = (Ipv4Addr::new(192, 0, 2, 10), Ipv4Addr::new(192, 0, 2, 11));
    let (mut e, p) = internet_sled(ExternalIps {
        floating: vec![IpAddr::V4(first), IpAddr::V4(second)],
        ..Default::default()
    });
    let rule = Rule::new(10, FwAction::Allow)
        .matching(Predicate::Proto(6))
        .finalize()
        .unwrap();
    e.add_fw_rule("ga", Direction::In, rule).unwrap();
    let client = Ipv4Addr::new(203, 0, 113, 50);
    let mut syn = Vec::new();
    PacketBuilder::ethernet2(SWITCH_MAC, g.mac.0)
        .ipv4(client.octets(), second.octets(), 60)
        .tcp(50000, 22, 1, 65535)
        .syn()
        .write(&mut syn, b"")
        .unwrap();
    assert_eq!(from_internet(&mut e, &syn, 1).len(), 1);
    let synack = {
        let mut f = Vec::new();
        PacketBuilder::ethernet2(g.mac.0, g.gw_mac.0)
            .ipv4(g.v4.octets(), client.octets(), 64)
            .tcp(22, 50000, 1000, 65535)
            .syn()
            .ack(2)
            .write(&mut f, b"")
            .unwrap();
        f
    };
    let got = send(&mut e, p, &synack, 2);
    assert_eq!(checked(&got[0]).0, (IpAddr::V4(second), IpAddr::V4(client)));
    // The port's own new flows still leave from the first.
    let got = send(&mut e, p, &udp_to(IpAddr::V4(client), 9), 3);
    assert_eq!(checked(&got[0]).0 .0, IpAddr::V4(first));
    // Once the connection has expired, the memory of it goes too.
    let got = send(&mut e, p, &synack, 10 * 24 * 3600 * S);
    assert_eq!(checked(&got[0]).0 .0, IpAddr::V4(first));
}

/// A frame that waited for boundary services' next hop leaves through NAT too,
/// fragmented by the engine (IPv4 without DF above the 1500-byte path) included.
#[test]
fn held_and_fragmented_frames_leave_from_the_external_address() {
    let g = guest(1);
    let (mut e, p) = internet_sled(snat(IpAddr::V4(snat4()), 4000, 4999));
    let remote = Ipv4Addr::new(8, 8, 8, 8);
    let payload = vec![0x42u8; 3000];
    let mut f = Vec::new();
    PacketBuilder::ethernet2(g.mac.0, g.gw_mac.0)
        .ipv4(g.v4.octets(), remote.octets(), 64)
        .udp(7777, 53)
        .write(&mut f, &payload)
        .unwrap();
    // Clear DF (and fix the header checksum) so the engine fragments it.
    f[14 + 6] &= !0x40;
    let h = etherparse::Ipv4HeaderSlice::from_slice(&f[14..])
        .unwrap()
        .to_header();
    f[24..26].copy_from_slice(&h.calc_header_checksum().to_be_bytes());
    let mut out = TxBatch::new();
    e.process_guest(p, VnetHdr::default(), &f, 1, &NoFabric, &mut out);
    assert!(out.is_empty(), "waits for the next hop");
    e.retry_held(2, &Fabric, &mut out);
    let frags: Vec<Vec<u8>> = frames_of(&out, &[])
        .into_iter()
        .map(|(_, f)| decode_underlay(&f).inner)
        .collect();
    assert!(frags.len() >= 3, "{}", frags.len());
    let mut datagram = Vec::new();
    for fr in &frags {
        let h = etherparse::Ipv4HeaderSlice::from_slice(&fr[14..])
            .unwrap()
            .to_header();
        assert_eq!(h.header_checksum, h.calc_header_checksum());
        assert_eq!(h.source, snat4().octets());
        datagram.extend_from_slice(&fr[14 + h.header_len()..]);
    }
    let udp = etherparse::UdpHeaderSlice::from_slice(&datagram)
        .unwrap()
        .to_header();
    assert!((4000..=4999).contains(&udp.source_port));
    let want = udp
        .calc_checksum_ipv4_raw(snat4().octets(), remote.octets(), &datagram[8..])
        .unwrap();
    assert_eq!(udp.checksum, want, "the reassembled datagram's checksum");
}

/// Traffic from and to outside the VPC (the External option; the internet gateway)
/// has no VPC: no `Vni` rule matches it, whatever the VNI of its Geneve header.
#[test]
fn vni_rules_never_match_traffic_outside_the_vpc() {
    let g = guest(1);
    let (_, f6) = floating(&g);
    let (mut e, p) = internet_sled(ExternalIps {
        floating: vec![IpAddr::V6(f6)],
        ..Default::default()
    });
    let syn = |sport| {
        let mut buf = Vec::new();
        PacketBuilder::ethernet2(SWITCH_MAC, g.mac.0)
            .ipv6(ip6("2001:db8:99::1").octets(), f6.octets(), 60)
            .tcp(sport, 22, 1, 65535)
            .syn()
            .write(&mut buf, b"")
            .unwrap();
        buf
    };
    // The frame comes in with the port's VNI, yet is not of the VPC.
    let vni = Rule::new(10, FwAction::Allow)
        .matching(Predicate::Vni(VNI))
        .finalize()
        .unwrap();
    e.add_fw_rule("ga", Direction::In, vni).unwrap();
    assert!(from_internet(&mut e, &syn(50000), 1).is_empty());
    assert_eq!(drops(&e, "fw_deny_in"), 1);
    // Outbound to the internet: a deny of the VPC does not stop it.
    let deny = Rule::new(10, FwAction::Deny)
        .matching(Predicate::Vni(VNI))
        .finalize()
        .unwrap();
    e.add_fw_rule("ga", Direction::Out, deny).unwrap();
    let remote = IpAddr::V6(ip6("2001:db8:99::53"));
    assert_eq!(send(&mut e, p, &udp_to(remote, 40000), 2).len(), 1);
    assert_eq!(drops(&e, "fw_deny_out"), 0);
}

/// TCP from the internet through SNAT is coalesced like VPC traffic: segments of one
/// batch reach the guest as one GSO frame with the private destination and a
/// partial checksum over the private addresses, their payloads referred to where
/// they arrived; a segment with a bad checksum is translated but handed over with
/// no offload claims, for the guest to drop.
#[test]
fn tcp_from_the_internet_through_snat_is_coalesced() {
    let g = guest(1);
    let (mut e, p) = internet_sled(snat(IpAddr::V4(snat4()), 5000, 5099));
    let remote = Ipv4Addr::new(8, 8, 8, 8);
    let got = send(&mut e, p, &tcp_v4(&g, remote, 40000, 80, true, b""), 1);
    let sport = checked(&got[0]).1 .0;
    let from_remote = |seq: u32, syn: bool, payload: &[u8]| {
        let mut f = Vec::new();
        let b = PacketBuilder::ethernet2(SWITCH_MAC, g.mac.0)
            .ipv4(remote.octets(), snat4().octets(), 60)
            .tcp(80, sport, seq, 65535);
        let b = if syn { b.syn().ack(1001) } else { b.ack(1001) };
        b.write(&mut f, payload).unwrap();
        f
    };
    assert_eq!(
        from_internet(&mut e, &from_remote(5000, true, b""), 2).len(),
        1
    );
    let mut ack = Vec::new();
    PacketBuilder::ethernet2(g.mac.0, g.gw_mac.0)
        .ipv4(g.v4.octets(), remote.octets(), 64)
        .tcp(40000, 80, 1001, 65535)
        .ack(5001)
        .write(&mut ack, b"")
        .unwrap();
    assert_eq!(send(&mut e, p, &ack, 3).len(), 1);

    let payloads: Vec<Vec<u8>> = (0..3u8).map(|i| vec![i + 1; 1000]).collect();
    let segs: Vec<Vec<u8>> = payloads
        .iter()
        .enumerate()
        .map(|(i, pl)| from_remote(5001 + 1000 * i as u32, false, pl))
        .collect();
    let before = e.stats().coalescer;
    let got = from_internet_batch(&mut e, &segs, 4);
    assert_eq!(got.len(), 1, "three segments, one frame");
    assert_eq!(e.stats().coalescer.merged - before.merged, 2);
    let (vnet, mut f) = got.into_iter().next().unwrap();
    assert_eq!(vnet.gso_type, wire::vnet::GSO_TCPV4);
    assert_eq!(vnet.gso_size, 1000);
    assert_eq!(vnet.flags, F_NEEDS_CSUM);
    // Complete the checksum as the guest's NIC model would, then check it all.
    let (start, field) = (
        usize::from(vnet.csum_start),
        usize::from(vnet.csum_start + vnet.csum_offset),
    );
    let c = !wire::checksum::fold(wire::checksum::sum(&f[start..], 0));
    f[field..field + 2].copy_from_slice(&c.to_be_bytes());
    assert_eq!(
        checked(&f),
        ((IpAddr::V4(remote), IpAddr::V4(g.v4)), (80, 40000))
    );
    assert_eq!(&f[..6], &g.mac.0);
    assert_eq!(&f[6..12], &g.gw_mac.0);
    assert_eq!(&f[f.len() - 3000..], &payloads.concat()[..]);

    // A bad checksum: translated, passed on without offload claims, still bad.
    let mut bad = from_remote(8001, false, &[9; 100]);
    let n = bad.len();
    bad[n - 1] ^= 0xff;
    let got = from_internet_batch(&mut e, &[bad], 5);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0, VnetHdr::default());
    let h = PacketHeaders::from_ethernet_slice(&got[0].1).unwrap();
    let Some(NetHeaders::Ipv4(ip, _)) = &h.net else {
        panic!("IPv4")
    };
    assert_eq!(ip.destination, g.v4.octets());
    assert_eq!(ip.header_checksum, ip.calc_header_checksum());
    let Some(TransportHeader::Tcp(t)) = &h.transport else {
        panic!("TCP")
    };
    assert_eq!(t.destination_port, 40000);
    let want = t.calc_checksum_ipv4(ip, h.payload.slice()).unwrap();
    assert_ne!(t.checksum, want, "the guest's stack must see the damage");
}

/// A flow from outside is cached under the key it arrives with (to the external
/// address), its translation in the entry: its later packets hit that entry.
#[test]
fn replies_from_outside_are_cached_under_the_external_address() {
    let g = guest(1);
    let (mut e, p) = internet_sled(snat(IpAddr::V4(snat4()), 5000, 5099));
    let remote = ip("8.8.8.8");
    let got = send(&mut e, p, &udp_to(remote, 1111), 1);
    let sport = checked(&got[0]).1 .0;
    let reply = udp_reply(remote, IpAddr::V4(snat4()), sport);
    for now in 2..5 {
        assert_eq!(from_internet(&mut e, &reply, now).len(), 1);
    }
    let d = e.dump_uft("ga", 0, 100).unwrap();
    let cached: Vec<_> = d
        .inbound
        .iter()
        .filter(|f| f.key.dst_ip == IpAddr::V4(snat4()))
        .collect();
    assert_eq!(cached.len(), 1, "{:?}", d.inbound);
    assert_eq!(cached[0].key.dst_port, sport);
    assert_eq!(cached[0].hits, 2, "compiled once, then hit");
    assert!(
        cached[0].action.contains("nat to private port 1111"),
        "{}",
        cached[0].action
    );
    assert!(d.inbound.iter().all(|f| f.key.dst_ip != IpAddr::V4(g.v4)));
}

/// A SNAT port's translation lives only as long as the connection holding it:
/// once that has expired, nothing gets in to the port, and when the port goes to
/// another flow to the same peer, its replies reach that flow, not the old one.
#[test]
fn a_snat_port_reused_by_another_flow_delivers_to_that_flow() {
    let g = guest(1);
    let (mut e, p) = internet_sled(snat(IpAddr::V4(snat4()), 5000, 5000));
    let remote = ip("8.8.8.8");
    let s4 = IpAddr::V4(snat4());
    let got = send(&mut e, p, &udp_to(remote, 1111), 1);
    assert_eq!(checked(&got[0]).1 .0, 5000);
    let reply = udp_reply(remote, s4, 5000);
    let back = from_internet(&mut e, &reply, 2);
    assert_eq!(checked(&back[0]), ((remote, IpAddr::V4(g.v4)), (53, 1111)));
    let later = 3600 * S;
    assert!(from_internet(&mut e, &reply, later).is_empty());
    assert_eq!(drops(&e, "fw_deny_in"), 1, "no connection any more");
    let got = send(&mut e, p, &udp_to(remote, 2222), later + 1);
    assert_eq!(checked(&got[0]).1 .0, 5000, "the one port, again");
    let back = from_internet(&mut e, &reply, later + 2);
    assert_eq!(back.len(), 1);
    assert_eq!(checked(&back[0]), ((remote, IpAddr::V4(g.v4)), (53, 2222)));
}

/// A refusal cached for a packet from outside to a floating IP is forgotten when
/// the guest opens the connection it would belong to: the replies get in.
#[test]
fn a_connection_the_guest_opens_clears_a_refusal_cached_from_outside() {
    let g = guest(1);
    let (f4, _) = floating(&g);
    let (mut e, p) = internet_sled(ExternalIps {
        floating: vec![IpAddr::V4(f4)],
        ..Default::default()
    });
    let remote = ip("8.8.8.8");
    let reply = udp_reply(remote, IpAddr::V4(f4), 1111);
    assert!(from_internet(&mut e, &reply, 1).is_empty());
    assert!(from_internet(&mut e, &reply, 2).is_empty());
    assert_eq!(drops(&e, "fw_deny_in"), 2);
    let d = e.dump_uft("ga", 0, 100).unwrap();
    assert!(d.inbound.iter().any(|f| f.action.starts_with("drop")));
    assert_eq!(send(&mut e, p, &udp_to(remote, 1111), 3).len(), 1);
    let back = from_internet(&mut e, &reply, 4);
    assert_eq!(back.len(), 1);
    assert_eq!(checked(&back[0]), ((remote, IpAddr::V4(g.v4)), (53, 1111)));
}

/// The guest's ICMP error about `delivered` (an IP frame it got from outside):
/// port unreachable, quoting as much as fits, to the packet's source.
fn port_unreachable(delivered: &[u8]) -> Vec<u8> {
    let g = guest(1);
    let h = PacketHeaders::from_ethernet_slice(delivered).unwrap();
    let quote = &delivered[14..];
    let eth = PacketBuilder::ethernet2(g.mac.0, g.gw_mac.0);
    let mut buf = Vec::new();
    match h.net.unwrap() {
        NetHeaders::Ipv4(ip, _) => eth
            .ipv4(ip.destination, ip.source, 64)
            .icmpv4(etherparse::Icmpv4Type::DestinationUnreachable(
                etherparse::icmpv4::DestUnreachableHeader::Port,
            ))
            .write(&mut buf, &quote[..28])
            .unwrap(),
        NetHeaders::Ipv6(ip, _) => eth
            .ipv6(ip.destination, ip.source, 64)
            .icmpv6(etherparse::Icmpv6Type::DestinationUnreachable(
                etherparse::icmpv6::DestUnreachableCode::Port,
            ))
            .write(&mut buf, quote)
            .unwrap(),
        NetHeaders::Arp(_) => panic!("not IP"),
    }
    buf
}

/// The quoted packet of ICMP error `f` (its checksums checked): (source,
/// destination) address and (source, destination) port, and whether its IPv4
/// header checksum is right.
fn quote_of(f: &[u8]) -> ((IpAddr, IpAddr), (u16, u16), bool) {
    checked(f);
    let h = PacketHeaders::from_ethernet_slice(f).unwrap();
    let body = h.payload.slice();
    let (ips, l4, ok) = match h.net.unwrap() {
        NetHeaders::Ipv4(..) => {
            let q = etherparse::Ipv4HeaderSlice::from_slice(body)
                .unwrap()
                .to_header();
            let ok = q.header_checksum == q.calc_header_checksum();
            ((q.source.into(), q.destination.into()), 20, ok)
        }
        _ => {
            let q = etherparse::Ipv6HeaderSlice::from_slice(body).unwrap();
            (
                (q.source_addr().into(), q.destination_addr().into()),
                40,
                true,
            )
        }
    };
    let ports = (
        u16::from_be_bytes([body[l4], body[l4 + 1]]),
        u16::from_be_bytes([body[l4 + 2], body[l4 + 3]]),
    );
    (ips, ports, ok)
}

/// The guest's ICMP errors about packets that came in through NAT leave as from
/// where those packets were sent (the floating IP; the SNAT address), quoting
/// them as sent (destination the external address and port), every checksum
/// right, so the sender can match them to its socket.
#[test]
fn guest_icmp_errors_quote_what_the_sender_sent() {
    let g = guest(1);
    let (f4, _) = floating(&g);
    let (mut e, p) = internet_sled(ExternalIps {
        floating: vec![IpAddr::V4(f4)],
        ..Default::default()
    });
    let rule = Rule::new(10, FwAction::Allow)
        .matching(Predicate::Proto(17))
        .finalize()
        .unwrap();
    e.add_fw_rule("ga", Direction::In, rule).unwrap();
    let remote = ip("203.0.113.50");
    let got = from_internet(&mut e, &udp_reply(remote, IpAddr::V4(f4), 9999), 1);
    assert_eq!(got.len(), 1);
    let out = send(&mut e, p, &port_unreachable(&got[0]), 2);
    assert_eq!(out.len(), 1);
    assert_eq!(checked(&out[0]).0, (IpAddr::V4(f4), remote));
    assert_eq!(
        quote_of(&out[0]),
        ((remote, IpAddr::V4(f4)), (53, 9999), true)
    );

    // SNAT, IPv6: the reply to the guest's query, quoted with its SNAT port.
    let (mut e, p) = internet_sled(snat(IpAddr::V6(snat6()), 5000, 5099));
    let remote = ip("2001:db8:99::53");
    let got = send(&mut e, p, &udp_to(remote, 1111), 1);
    let sport = checked(&got[0]).1 .0;
    let back = from_internet(&mut e, &udp_reply(remote, IpAddr::V6(snat6()), sport), 2);
    assert_eq!(back.len(), 1);
    let out = send(&mut e, p, &port_unreachable(&back[0]), 3);
    assert_eq!(out.len(), 1);
    assert_eq!(checked(&out[0]).0, (IpAddr::V6(snat6()), remote));
    assert_eq!(
        quote_of(&out[0]),
        ((remote, IpAddr::V6(snat6())), (53, sport), true)
    );
    // An error about a packet no NAT state explains is refused.
    let stranger = udp_reply(ip("2001:db8:99::54"), IpAddr::V6(g.v6), 7777);
    assert!(send(&mut e, p, &port_unreachable(&stranger), 4).is_empty());
    assert_eq!(drops(&e, "nat_no_mapping"), 1);
}

/// Guest 1's external attached subnet in the tests below (`attach-subnet -e`).
const EXEMPT: &str = "203.0.113.0/24";

/// Port "ga"'s allowed prefixes: `net` attached both ways, and exempt from NAT
/// when `external`.
fn attach(e: &mut Engine, net: &str, external: bool) {
    let net: ipnet::IpNet = net.parse().unwrap();
    let cidrs = engine::PortCidrs {
        inbound: vec![net],
        outbound: vec![net],
        external: if external { vec![net] } else { vec![] },
    };
    e.set_port_cidrs("ga", cidrs).unwrap();
}

/// A UDP datagram guest 1 sends from `src`:`sport` (not its own address) to
/// `dst`:53.
fn udp_from(src: Ipv4Addr, sport: u16, dst: Ipv4Addr) -> Vec<u8> {
    let g = guest(1);
    let mut buf = Vec::new();
    PacketBuilder::ethernet2(g.mac.0, g.gw_mac.0)
        .ipv4(src.octets(), dst.octets(), 64)
        .udp(sport, 53)
        .write(&mut buf, b"query")
        .unwrap();
    buf
}

/// An external attached subnet is exempt from NAT both ways: the guest's flows
/// from it leave with their own source (and port), replies and connections from
/// outside to it arrive untranslated (the firewall deciding as for any flow), and
/// the guest's ICMP errors about those leave as they are; the guest's own address
/// is translated as before.
#[test]
fn an_external_attached_subnet_is_exempt_from_nat() {
    let g = guest(1);
    let (mut e, p) = internet_sled(snat(IpAddr::V4(snat4()), 5000, 5099));
    attach(&mut e, EXEMPT, true);
    let (inside, remote) = (Ipv4Addr::new(203, 0, 113, 9), Ipv4Addr::new(8, 8, 8, 8));
    let (inside_ip, remote_ip) = (IpAddr::V4(inside), IpAddr::V4(remote));
    let got = send(&mut e, p, &udp_from(inside, 5353, remote), 1);
    assert_eq!(got.len(), 1);
    assert_eq!(checked(&got[0]), ((inside_ip, remote_ip), (5353, 53)));
    let d = e.dump_uft("ga", 0, 100).unwrap();
    assert!(
        d.outbound.iter().all(|f| !f.action.contains("nat")),
        "{d:?}"
    );
    // The reply comes back to the subnet's address, untranslated.
    let back = from_internet(&mut e, &udp_reply(remote_ip, inside_ip, 5353), 2);
    assert_eq!(back.len(), 1);
    assert_eq!(checked(&back[0]), ((remote_ip, inside_ip), (53, 5353)));
    assert_eq!(&back[0][6..12], &g.gw_mac.0);
    // The guest's own address is still translated.
    let got = send(&mut e, p, &udp_to(remote_ip, 1111), 3);
    assert_eq!(checked(&got[0]).0 .0, IpAddr::V4(snat4()));

    // A connection from outside to another address of the subnet: as the
    // firewall decides, and untranslated.
    let other = IpAddr::V4(Ipv4Addr::new(203, 0, 113, 10));
    let peer = ip("198.18.0.7");
    let query = udp_reply(peer, other, 9999);
    assert!(from_internet(&mut e, &query, 4).is_empty());
    assert_eq!(drops(&e, "fw_deny_in"), 1);
    let rule = Rule::new(10, FwAction::Allow)
        .matching(Predicate::Proto(17))
        .finalize()
        .unwrap();
    e.add_fw_rule("ga", Direction::In, rule).unwrap();
    let got = from_internet(&mut e, &query, 5);
    assert_eq!(got.len(), 1);
    assert_eq!(checked(&got[0]), ((peer, other), (53, 9999)));
    // The guest's port unreachable about it leaves as it is, quote and all.
    let out = send(&mut e, p, &port_unreachable(&got[0]), 6);
    assert_eq!(out.len(), 1);
    assert_eq!(checked(&out[0]).0, (other, peer));
    assert_eq!(quote_of(&out[0]), ((peer, other), (53, 9999), true));
    assert_eq!(drops(&e, "nat_no_mapping"), 0);
}

/// Only an external attached subnet is exempt: attached without `-e`, its flows
/// are translated and frames from outside to it find no mapping; an address
/// outside the subnet is not admitted; and when the subnet is no longer
/// external, its flows are translated again at once.
#[test]
fn only_an_external_attached_subnet_is_exempt() {
    let (mut e, p) = internet_sled(snat(IpAddr::V4(snat4()), 5000, 5099));
    attach(&mut e, EXEMPT, false);
    let (inside, remote) = (Ipv4Addr::new(203, 0, 113, 9), Ipv4Addr::new(8, 8, 8, 8));
    let (inside_ip, remote_ip) = (IpAddr::V4(inside), IpAddr::V4(remote));
    let got = send(&mut e, p, &udp_from(inside, 5353, remote), 1);
    assert_eq!(checked(&got[0]).0 .0, IpAddr::V4(snat4()));
    assert!(from_internet(&mut e, &udp_reply(remote_ip, inside_ip, 5353), 2).is_empty());
    assert_eq!(drops(&e, "nat_no_mapping"), 1);

    attach(&mut e, EXEMPT, true);
    let got = send(&mut e, p, &udp_from(inside, 5353, remote), 3);
    assert_eq!(checked(&got[0]).0 .0, inside_ip);
    // Outside the subnet: neither admitted from the guest nor to it.
    let beyond = Ipv4Addr::new(203, 0, 114, 9);
    assert!(send(&mut e, p, &udp_from(beyond, 5353, remote), 4).is_empty());
    assert_eq!(drops(&e, "spoofed_src_ip"), 1);
    let to_beyond = udp_reply(remote_ip, IpAddr::V4(beyond), 5353);
    assert!(from_internet(&mut e, &to_beyond, 4).is_empty());
    assert_eq!(drops(&e, "nat_no_mapping"), 2);

    attach(&mut e, EXEMPT, false);
    let got = send(&mut e, p, &udp_from(inside, 5353, remote), 5);
    assert_eq!(checked(&got[0]).0 .0, IpAddr::V4(snat4()));
    // Too many to scan per frame: refused by name.
    let many: Vec<ipnet::IpNet> = (0..65u8)
        .map(|i| format!("10.{i}.0.0/16").parse().unwrap())
        .collect();
    let err = e
        .set_port_cidrs(
            "ga",
            engine::PortCidrs {
                external: many,
                ..Default::default()
            },
        )
        .unwrap_err()
        .to_string();
    assert!(err.contains("65 prefixes allowed exempt from NAT"), "{err}");
}

/// Several internet gateways (OPTE's `ig=UUID` routes and internet gateway map):
/// a flow leaves from an address that serves its route's gateway, a route without
/// a gateway id may use any address, a gateway no address serves is refused
/// (`no_external_ip`), and a reply to a connection from the internet leaves from
/// the address it came in to, whichever gateway its route names.
#[test]
fn each_internet_gateway_leaves_from_its_own_addresses() {
    let g = guest(1);
    let (f4, _) = floating(&g);
    let (gw_a, gw_b, gw_c) = (IgwId(0xa), IgwId(0xb), IgwId(0xc));
    let (mut e, p) = internet_sled(ExternalIps {
        snat: Some(SnatRange {
            ip: IpAddr::V4(snat4()),
            start: 4096,
            end: 8191,
        }),
        ephemeral: Some(IpAddr::V4(eph4())),
        floating: vec![IpAddr::V4(f4)],
        gateways: [
            (IpAddr::V4(f4), [gw_a].into()),
            (IpAddr::V4(eph4()), [gw_b].into()),
            (IpAddr::V4(snat4()), [gw_b].into()),
        ]
        .into(),
    });
    for (net, gw) in [
        ("203.0.113.0/24", gw_a),
        ("198.18.0.0/15", gw_b),
        ("192.0.2.128/25", gw_c),
    ] {
        let target = RouteTarget::InternetGateway(Some(gw));
        e.add_route(g.name, net.parse().unwrap(), target, None)
            .unwrap();
    }
    let (to_a, to_b, to_c, anywhere) = (
        ip("203.0.113.9"),
        ip("198.18.0.9"),
        ip("192.0.2.200"),
        ip("8.8.8.8"),
    );
    let got = send(&mut e, p, &udp_to(to_a, 5353), 1);
    assert_eq!(
        checked(&got[0]).0,
        (IpAddr::V4(f4), to_a),
        "ig=A: A's address"
    );
    let got = send(&mut e, p, &udp_to(to_b, 5353), 1);
    assert_eq!(checked(&got[0]).0, (IpAddr::V4(eph4()), to_b), "ig=B: B's");
    let got = send(&mut e, p, &udp_to(anywhere, 5353), 1);
    assert_eq!(checked(&got[0]).0, (IpAddr::V4(f4), anywhere), "ig: any");
    assert!(send(&mut e, p, &udp_to(to_c, 5353), 1).is_empty());
    assert_eq!(drops(&e, "no_external_ip"), 1, "ig=C: no address serves it");

    // A connection from a host behind gateway B to A's floating IP: its replies
    // leave from that address, not from B's.
    let rule = Rule::new(10, FwAction::Allow)
        .matching(Predicate::Proto(17))
        .finalize()
        .unwrap();
    e.add_fw_rule(g.name, Direction::In, rule).unwrap();
    let query = udp_reply(to_b, IpAddr::V4(f4), 7000);
    assert_eq!(from_internet(&mut e, &query, 2).len(), 1);
    let l4 = L4::Udp {
        sport: 7000,
        dport: 53,
    };
    let IpAddr::V4(b4) = to_b else { unreachable!() };
    let answer = frame(&g, Some(b4), None, l4, b"answer");
    let got = send(&mut e, p, &answer, 3);
    assert_eq!(checked(&got[0]).0, (IpAddr::V4(f4), to_b));
}
