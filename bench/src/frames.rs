//! Guest frames as a guest's kernel would send them, built with `wire`'s emitters:
//! Ethernet to the gateway MAC, IPv4 (DF, no options) or IPv6 (no extension
//! headers), TCP (ACK with the timestamp option, as Linux sends bulk data) or UDP,
//! complete checksums (the tap hands them over without offload metadata).
//! Also the two gateway requests the gateway bench answers: a Router Solicitation and
//! a DHCPv4 DISCOVER.

use engine::link_local_eui64;
use engine::PortConfig;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use wire::ethernet::{self, ethertype};
use wire::ipv4::protocol;
use wire::{dhcpv4, ipv4, ipv6, ndp, tcp, udp, MacAddr};

/// TCP ACK flag (the only flag on a bulk data segment).
pub const TCP_ACK: u8 = 0x10;

/// The fields that make one flow's frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowSpec {
    pub src_mac: MacAddr,
    pub dst_mac: MacAddr,
    pub src_ip: IpAddr,
    pub dst_ip: IpAddr,
    /// `protocol::TCP` or `protocol::UDP`.
    pub proto: u8,
    pub src_port: u16,
    pub dst_port: u16,
}

impl FlowSpec {
    /// Guest `from` to guest `to` (via `from`'s gateway), over IPv4 or IPv6.
    /// `None` when either port lacks an address of that family.
    pub fn between(
        from: &PortConfig,
        to: &PortConfig,
        v6: bool,
        proto: u8,
        src_port: u16,
        dst_port: u16,
    ) -> Option<FlowSpec> {
        let (src_ip, dst_ip) = if v6 {
            (IpAddr::V6(from.ipv6?), IpAddr::V6(to.ipv6?))
        } else {
            (IpAddr::V4(from.ipv4?), IpAddr::V4(to.ipv4?))
        };
        Some(FlowSpec {
            src_mac: from.guest_mac,
            dst_mac: from.gateway_mac,
            src_ip,
            dst_ip,
            proto,
            src_port,
            dst_port,
        })
    }

    /// The same flow seen from the other end (addresses and ports swapped), sent by
    /// the guest `from` to its own gateway.
    pub fn reply_from(&self, from: &PortConfig) -> FlowSpec {
        FlowSpec {
            src_mac: from.guest_mac,
            dst_mac: from.gateway_mac,
            src_ip: self.dst_ip,
            dst_ip: self.src_ip,
            proto: self.proto,
            src_port: self.dst_port,
            dst_port: self.src_port,
        }
    }
}

/// Bytes of the TCP header the frames carry: 20 + timestamps (10) padded to 12.
pub const TCP_HEADER_LEN: usize = 32;

/// Offset of the L4 header in a frame of `spec`.
pub fn l4_offset(spec: &FlowSpec) -> usize {
    ethernet::HEADER_LEN
        + match spec.src_ip {
            IpAddr::V4(_) => ipv4::HEADER_LEN,
            IpAddr::V6(_) => ipv6::HEADER_LEN,
        }
}

/// A data frame of `spec` with `payload` bytes of payload (a fixed pattern).
/// Errors name the inconsistency (mixed address families, unknown protocol).
pub fn data_frame(spec: &FlowSpec, payload: usize) -> Result<Vec<u8>, String> {
    let l4_hdr = match spec.proto {
        protocol::TCP => TCP_HEADER_LEN,
        protocol::UDP => udp::HEADER_LEN,
        p => return Err(format!("protocol {p} is neither TCP nor UDP")),
    };
    let l4_off = l4_offset(spec);
    let l4_len = l4_hdr + payload;
    let mut f = vec![0u8; l4_off + l4_len];
    let et = match spec.src_ip {
        IpAddr::V4(_) => ethertype::IPV4,
        IpAddr::V6(_) => ethertype::IPV6,
    };
    ethernet::Repr {
        src_addr: spec.src_mac,
        dst_addr: spec.dst_mac,
        ethertype: et,
    }
    .emit(&mut ethernet::Frame::new_unchecked(&mut f[..]));
    let ip = &mut f[ethernet::HEADER_LEN..];
    match (spec.src_ip, spec.dst_ip) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => ipv4::Repr {
            src_addr: src,
            dst_addr: dst,
            protocol: spec.proto,
            payload_len: l4_len,
            ttl: 64,
            dscp_ecn: 0,
            ident: 0x1234,
            dont_frag: true,
            more_frags: false,
            frag_offset: 0,
        }
        .emit(&mut ipv4::Packet::new_unchecked(ip)),
        (IpAddr::V6(src), IpAddr::V6(dst)) => ipv6::Repr {
            src_addr: src,
            dst_addr: dst,
            next_header: spec.proto,
            payload_len: l4_len,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0x1_2345,
        }
        .emit(&mut ipv6::Packet::new_unchecked(ip)),
        (s, d) => return Err(format!("source {s} and destination {d} differ in family")),
    }
    .map_err(|e| format!("IP header: {e}"))?;
    let l4 = &mut f[l4_off..];
    for (i, b) in l4[l4_hdr..].iter_mut().enumerate() {
        *b = (i * 7 + 3) as u8;
    }
    if spec.proto == protocol::TCP {
        tcp::Repr {
            src_port: spec.src_port,
            dst_port: spec.dst_port,
            // The same number both ways, so that each side acknowledges exactly what
            // the other sent (connection tracking checks both against the window).
            seq_number: 0x1000_0000,
            ack_number: 0x1000_0000,
            flags: TCP_ACK,
            window_len: 502,
            urgent_at: 0,
            mss: None,
            window_scale: None,
            sack_permitted: false,
            timestamps: Some((0x0102_0304, 0x0506_0708)),
        }
        .emit(&mut tcp::Packet::new_unchecked(&mut *l4))
        .map_err(|e| format!("TCP header: {e}"))?;
    } else {
        udp::Repr {
            src_port: spec.src_port,
            dst_port: spec.dst_port,
            payload_len: payload,
        }
        .emit(&mut udp::Packet::new_unchecked(&mut *l4))
        .map_err(|e| format!("UDP header: {e}"))?;
    }
    fill_l4_checksum(spec, &mut f)?;
    Ok(f)
}

/// (Re)computes the TCP/UDP checksum of a frame built by [`data_frame`].
fn fill_l4_checksum(spec: &FlowSpec, f: &mut [u8]) -> Result<(), String> {
    let len = f.len();
    let l4 = f
        .get_mut(l4_offset(spec)..)
        .ok_or_else(|| format!("frame of {len} bytes has no L4 header"))?;
    match (spec.proto, spec.src_ip, spec.dst_ip) {
        (protocol::TCP, IpAddr::V4(s), IpAddr::V4(d)) => {
            tcp::Packet::new_unchecked(l4).fill_checksum_v4(s, d);
        }
        (protocol::TCP, IpAddr::V6(s), IpAddr::V6(d)) => {
            tcp::Packet::new_unchecked(l4).fill_checksum_v6(s, d);
        }
        (protocol::UDP, IpAddr::V4(s), IpAddr::V4(d)) => {
            udp::Packet::new_unchecked(l4).fill_checksum_v4(s, d);
        }
        (protocol::UDP, IpAddr::V6(s), IpAddr::V6(d)) => {
            udp::Packet::new_unchecked(l4).fill_checksum_v6(s, d);
        }
        (p, s, d) => return Err(format!("cannot checksum protocol {p} from {s} to {d}")),
    }
    Ok(())
}

/// Offset of the L4 checksum field in a frame of `spec`.
fn l4_checksum_offset(spec: &FlowSpec) -> usize {
    l4_offset(spec) + if spec.proto == protocol::TCP { 16 } else { 6 }
}

/// Rewrites the source port of a frame built by [`data_frame`] in place, with an
/// RFC 1624 incremental checksum update (what makes each slow-path packet a new flow
/// at the cost of a few instructions). Returns false, changing nothing, if the frame
/// is too short for `spec`.
pub fn set_src_port(spec: &FlowSpec, f: &mut [u8], port: u16) -> bool {
    let (p, c) = (l4_offset(spec), l4_checksum_offset(spec));
    let (Some(old_port), Some(old_sum)) = (f.get(p..p + 2), f.get(c..c + 2)) else {
        return false;
    };
    let old_port = u16::from_be_bytes([old_port[0], old_port[1]]);
    let old_sum = u16::from_be_bytes([old_sum[0], old_sum[1]]);
    let new_sum = wire::checksum::update16(old_sum, old_port, port);
    // A UDP checksum that computes to zero is sent as all ones (RFC 768).
    let new_sum = if spec.proto == protocol::UDP && new_sum == 0 {
        0xffff
    } else {
        new_sum
    };
    f[p..p + 2].copy_from_slice(&port.to_be_bytes());
    f[c..c + 2].copy_from_slice(&new_sum.to_be_bytes());
    true
}

/// The Router Solicitation a Linux guest sends at link-up: from its link-local
/// address to ff02::2, hop limit 255, with its link-layer address option.
pub fn router_solicitation(port: &PortConfig) -> Result<Vec<u8>, String> {
    let src = link_local_eui64(port.guest_mac);
    let dst = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 2);
    let rs = ndp::Repr::RouterSolicit {
        lladdr: Some(port.guest_mac),
    };
    let icmp_len = rs.buffer_len();
    let l4 = ethernet::HEADER_LEN + ipv6::HEADER_LEN;
    let mut f = vec![0u8; l4 + icmp_len];
    ethernet::Repr {
        src_addr: port.guest_mac,
        dst_addr: MacAddr::from_ipv6_multicast(&dst),
        ethertype: ethertype::IPV6,
    }
    .emit(&mut ethernet::Frame::new_unchecked(&mut f[..]));
    ipv6::Repr {
        src_addr: src,
        dst_addr: dst,
        next_header: protocol::ICMPV6,
        payload_len: icmp_len,
        hop_limit: 255,
        traffic_class: 0,
        flow_label: 0,
    }
    .emit(&mut ipv6::Packet::new_unchecked(
        &mut f[ethernet::HEADER_LEN..],
    ))
    .map_err(|e| format!("RS IPv6 header: {e}"))?;
    rs.emit(&mut ndp::Packet::new_unchecked(&mut f[l4..]), src, dst)
        .map_err(|e| format!("RS body: {e}"))?;
    Ok(f)
}

/// A DHCPv4 DISCOVER as dhclient sends it: broadcast, from 0.0.0.0:68 to
/// 255.255.255.255:67, asking for the usual parameters (MTU and classless routes
/// included).
pub fn dhcp_discover(port: &PortConfig) -> Result<Vec<u8>, String> {
    const PARAMS: &[u8] = &[1, 3, 6, 12, 15, 26, 28, 119, 121];
    let msg = dhcpv4::Repr {
        op: dhcpv4::OP_REQUEST,
        message_type: dhcpv4::MessageType::Discover,
        xid: 0x3903_f326,
        secs: 0,
        broadcast: false,
        client_ip: Ipv4Addr::UNSPECIFIED,
        your_ip: Ipv4Addr::UNSPECIFIED,
        server_ip: Ipv4Addr::UNSPECIFIED,
        relay_ip: Ipv4Addr::UNSPECIFIED,
        client_hw_addr: port.guest_mac,
        requested_ip: None,
        server_identifier: None,
        lease_time: None,
        subnet_mask: None,
        router: None,
        classless_routes: &[],
        interface_mtu: None,
        dns_servers: &[],
        hostname: None,
        domain_name: None,
        domain_search: &[],
        parameter_request_list: Some(PARAMS),
    };
    let body_len = msg
        .buffer_len()
        .map_err(|e| format!("DHCP DISCOVER: {e}"))?;
    let spec = FlowSpec {
        src_mac: port.guest_mac,
        dst_mac: MacAddr::BROADCAST,
        src_ip: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        dst_ip: IpAddr::V4(Ipv4Addr::BROADCAST),
        proto: protocol::UDP,
        src_port: 68,
        dst_port: 67,
    };
    let mut f = data_frame(&spec, body_len)?;
    let body = l4_offset(&spec) + udp::HEADER_LEN;
    msg.emit(&mut dhcpv4::Packet::new_unchecked(&mut f[body..]))
        .map_err(|e| format!("DHCP DISCOVER: {e}"))?;
    fill_l4_checksum(&spec, &mut f)?;
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sleds::TwoSleds;
    use wire::meta::{parse_inner, L3};

    /// Every data frame parses back (through the engine's own parser) to the flow it
    /// was built from, with valid L4 checksums.
    #[test]
    fn data_frames_parse_back() {
        let s = TwoSleds::new().unwrap();
        for v6 in [false, true] {
            for proto in [protocol::TCP, protocol::UDP] {
                for payload in [0, 1400] {
                    let spec =
                        FlowSpec::between(&s.a.cfg, &s.b.cfg, v6, proto, 40000, 5201).unwrap();
                    let f = data_frame(&spec, payload).unwrap();
                    let m = parse_inner(&f).unwrap();
                    assert_eq!(m.l3, if v6 { L3::Ipv6 } else { L3::Ipv4 });
                    assert_eq!((m.src_ip, m.dst_ip), (spec.src_ip, spec.dst_ip));
                    assert_eq!((m.src_port, m.dst_port, m.proto), (40000, 5201, proto));
                    assert_eq!(m.ip_end, f.len());
                    assert_eq!(f.len() - m.payload_off, payload);
                    assert!(checksum_ok(&spec, &f), "{spec:?} {payload}");
                }
            }
        }
    }

    fn checksum_ok(spec: &FlowSpec, f: &[u8]) -> bool {
        let l4 = &f[l4_offset(spec)..];
        match (spec.proto, spec.src_ip, spec.dst_ip) {
            (protocol::TCP, IpAddr::V4(s), IpAddr::V4(d)) => tcp::Packet::new_checked(l4)
                .unwrap()
                .verify_checksum_v4(s, d),
            (protocol::TCP, IpAddr::V6(s), IpAddr::V6(d)) => tcp::Packet::new_checked(l4)
                .unwrap()
                .verify_checksum_v6(s, d),
            (protocol::UDP, IpAddr::V4(s), IpAddr::V4(d)) => udp::Packet::new_checked(l4)
                .unwrap()
                .verify_checksum_v4(s, d),
            (protocol::UDP, IpAddr::V6(s), IpAddr::V6(d)) => udp::Packet::new_checked(l4)
                .unwrap()
                .verify_checksum_v6(s, d),
            _ => false,
        }
    }

    /// The incremental source-port rewrite gives the same bytes as building the frame
    /// with that port.
    #[test]
    fn set_src_port_matches_rebuild() {
        let s = TwoSleds::new().unwrap();
        for v6 in [false, true] {
            for proto in [protocol::TCP, protocol::UDP] {
                let spec = FlowSpec::between(&s.a.cfg, &s.b.cfg, v6, proto, 1024, 80).unwrap();
                let mut f = data_frame(&spec, 17).unwrap();
                for port in [1025, 40000, 65535, 0] {
                    assert!(set_src_port(&spec, &mut f, port));
                    let want = data_frame(
                        &FlowSpec {
                            src_port: port,
                            ..spec
                        },
                        17,
                    )
                    .unwrap();
                    assert!(checksum_ok(&spec, &f));
                    assert_eq!(f, want, "{spec:?} port {port}");
                }
                assert!(!set_src_port(&spec, &mut f[..20], 1));
            }
        }
    }
}
