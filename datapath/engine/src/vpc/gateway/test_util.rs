//! Test helpers: the sample port, a small frame-to-metadata parser (so gateway tests
//! do not depend on the fast-path parser), hex.

use crate::ids::PortId;
pub(crate) use crate::vpc::port::tests::sample;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use wire::meta::{InnerMeta, L3};
use wire::MacAddr;

pub(crate) const PORT: PortId = PortId(3);

pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().fold(String::new(), |mut s, x| {
        let _ = write!(s, "{x:02x}");
        s
    })
}

pub(crate) fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn mac(b: &[u8]) -> MacAddr {
    MacAddr(b[..6].try_into().unwrap())
}

/// Metadata of an untagged test frame (IPv4 with options, IPv6 without extension
/// headers, ARP), computed independently of `wire::meta`.
pub(crate) fn meta_of(f: &[u8]) -> InnerMeta {
    let et = u16::from_be_bytes([f[12], f[13]]);
    let mut m = InnerMeta {
        dst_mac: mac(&f[0..6]),
        src_mac: mac(&f[6..12]),
        l3: L3::Other(et),
        l3_off: 14,
        l4_off: 14,
        payload_off: 14,
        ip_end: f.len(),
        src_ip: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        dst_ip: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        proto: 0,
        src_port: 0,
        dst_port: 0,
        tcp_flags: 0,
        icmp_type: 0,
        icmp_code: 0,
        fragment: false,
        dont_fragment: false,
        hop_limit: 0,
    };
    let ip = &f[14..];
    match et {
        0x0806 => m.l3 = L3::Arp,
        0x0800 => {
            m.l3 = L3::Ipv4;
            let ihl = usize::from(ip[0] & 0xf) * 4;
            m.l4_off = 14 + ihl;
            m.ip_end = 14 + usize::from(u16::from_be_bytes([ip[2], ip[3]]));
            m.src_ip = IpAddr::V4(Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]));
            m.dst_ip = IpAddr::V4(Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]));
            m.proto = ip[9];
            m.hop_limit = ip[8];
            let fo = u16::from_be_bytes([ip[6], ip[7]]);
            m.dont_fragment = fo & 0x4000 != 0;
            m.fragment = fo & 0x3fff != 0;
        }
        0x86dd => {
            m.l3 = L3::Ipv6;
            m.l4_off = 54;
            m.ip_end = 54 + usize::from(u16::from_be_bytes([ip[4], ip[5]]));
            m.src_ip = IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&ip[8..24]).unwrap()));
            m.dst_ip = IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&ip[24..40]).unwrap()));
            m.proto = ip[6];
            m.hop_limit = ip[7];
        }
        _ => {}
    }
    m.payload_off = m.l4_off;
    let l4 = &f[m.l4_off..];
    if !m.fragment && matches!(m.l3, L3::Ipv4 | L3::Ipv6) {
        match m.proto {
            1 | 58 => {
                m.icmp_type = l4[0];
                m.icmp_code = l4[1];
                m.payload_off = m.l4_off + 8;
            }
            17 => {
                m.src_port = u16::from_be_bytes([l4[0], l4[1]]);
                m.dst_port = u16::from_be_bytes([l4[2], l4[3]]);
                m.payload_off = m.l4_off + 8;
            }
            6 => {
                m.src_port = u16::from_be_bytes([l4[0], l4[1]]);
                m.dst_port = u16::from_be_bytes([l4[2], l4[3]]);
                m.tcp_flags = l4[13];
                m.payload_off = m.l4_off + usize::from(l4[12] >> 4) * 4;
            }
            _ => {}
        }
    }
    m
}
