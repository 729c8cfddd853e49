//! The flow key and its hash.
//!
//! One hash serves three purposes, so that the same flow always gets the same values:
//! the unified flow table's bucket, the outer UDP source port (ECMP spreading on the
//! underlay) and the outer IPv6 flow label.
//!
//! The hash is written here rather than taken from `std`: `std`'s SipHash is keyed
//! randomly per process, so a restarted daemon would move every flow to a new UDP
//! source port (a new ECMP path, with reordering), and it is several times slower
//! than needed for a 37-byte key. This one is an FxHash-style multiply-rotate over
//! five 64-bit words followed by the MurmurHash3 64-bit finalizer, so that the low
//! bits used for `% 16384` and the bits used for the flow label are well mixed. It is
//! not keyed: a guest can pick colliding 5-tuples, but the tables it indexes are per
//! port, so a guest can only slow down its own port.

use core::hash::{BuildHasher, Hash, Hasher};
use serde::Serialize;
use std::net::IpAddr;
use wire::meta::InnerMeta;

/// IANA protocol numbers the engine looks at.
pub const PROTO_ICMP: u8 = 1;
pub const PROTO_TCP: u8 = 6;
pub const PROTO_UDP: u8 = 17;
pub const PROTO_ICMPV6: u8 = 58;

/// First port of the range outer UDP source ports are taken from (RFC 6335 dynamic
/// ports, as the reference and RFC 8086 suggest).
pub const UDP_SRC_PORT_BASE: u16 = 49152;
/// Number of ports in that range.
pub const UDP_SRC_PORT_SPAN: u16 = 16384;

/// A flow as the guest sees it: VPC, protocol, addresses and ports.
///
/// For ICMP and ICMPv6 the echo identifier is put in *both* ports, so that a request
/// and its reply are each other's [`FlowKey::reversed`] key (the stateful firewall
/// relies on that).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct FlowKey {
    pub vni: u32,
    pub proto: u8,
    pub src_ip: IpAddr,
    pub dst_ip: IpAddr,
    pub src_port: u16,
    pub dst_port: u16,
}

impl FlowKey {
    /// The key of a parsed guest frame in VPC `vni`.
    pub fn from_meta(vni: u32, m: &InnerMeta) -> FlowKey {
        let (src_port, dst_port) = match m.proto {
            PROTO_ICMP | PROTO_ICMPV6 => (m.src_port, m.src_port),
            _ => (m.src_port, m.dst_port),
        };
        FlowKey {
            vni,
            proto: m.proto,
            src_ip: m.src_ip,
            dst_ip: m.dst_ip,
            src_port,
            dst_port,
        }
    }

    /// The same flow seen from the other end.
    pub fn reversed(&self) -> FlowKey {
        FlowKey {
            vni: self.vni,
            proto: self.proto,
            src_ip: self.dst_ip,
            dst_ip: self.src_ip,
            src_port: self.dst_port,
            dst_port: self.src_port,
        }
    }

    /// The flow's 64-bit hash; stable across processes and machines.
    pub fn hash64(&self) -> u64 {
        const K: u64 = 0x517c_c1b7_2722_0a95;
        let (s_hi, s_lo) = ip_words(self.src_ip);
        let (d_hi, d_lo) = ip_words(self.dst_ip);
        let tail = (u64::from(self.src_port) << 48)
            | (u64::from(self.dst_port) << 32)
            | (u64::from(self.proto) << 24)
            | u64::from(self.vni & 0x00ff_ffff);
        let mut h: u64 = 0;
        for w in [s_hi, s_lo, d_hi, d_lo, tail] {
            h = (h.rotate_left(5) ^ w).wrapping_mul(K);
        }
        fmix64(h)
    }

    /// Outer UDP source port: 49152 + hash % 16384.
    pub fn udp_src_port(&self) -> u16 {
        UDP_SRC_PORT_BASE + (self.hash64() % u64::from(UDP_SRC_PORT_SPAN)) as u16
    }

    /// Outer IPv6 flow label: 20 bits of the hash, taken from the high half so they
    /// are independent of the bits that choose the UDP port.
    pub fn flow_label(&self) -> u32 {
        ((self.hash64() >> 40) & 0x000f_ffff) as u32
    }
}

/// An address as two 64-bit words; IPv4 in its IPv4-mapped IPv6 form, so the two
/// families never share a value.
fn ip_words(ip: IpAddr) -> (u64, u64) {
    let o = match ip {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    };
    let mut hi = [0u8; 8];
    let mut lo = [0u8; 8];
    hi.copy_from_slice(&o[..8]);
    lo.copy_from_slice(&o[8..]);
    (u64::from_be_bytes(hi), u64::from_be_bytes(lo))
}

/// MurmurHash3's 64-bit finalizer: every input bit affects every output bit.
fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    h
}

impl Hash for FlowKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash64());
    }
}

/// `BuildHasher` for tables keyed by [`FlowKey`]: the key already hashes itself, so
/// the hasher only passes the value through.
#[derive(Clone, Copy, Default, Debug)]
pub struct FlowHashBuilder;

/// The pass-through hasher built by [`FlowHashBuilder`].
#[derive(Default)]
pub struct FlowHasher(u64);

impl Hasher for FlowHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only reached if a key other than FlowKey is used; fold the bytes in so the
        // hasher stays correct, if slow.
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(0x517c_c1b7_2722_0a95);
        }
    }

    fn write_u64(&mut self, v: u64) {
        self.0 ^= v;
    }
}

impl BuildHasher for FlowHashBuilder {
    type Hasher = FlowHasher;
    fn build_hasher(&self) -> FlowHasher {
        FlowHasher(0)
    }
}

/// A `HashMap` keyed by flows.
pub type FlowMap<V> = std::collections::HashMap<FlowKey, V, FlowHashBuilder>;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(sp: u16, dp: u16) -> FlowKey {
        FlowKey {
            vni: 1701,
            proto: PROTO_TCP,
            src_ip: "172.30.0.5".parse().unwrap(),
            dst_ip: "172.30.0.6".parse().unwrap(),
            src_port: sp,
            dst_port: dp,
        }
    }

    /// hash64 of `key(40000, 80)`, recorded once.
    const PINNED: u64 = 0x61cd_7c78_7393_215f;

    #[test]
    fn hash_is_a_fixed_function_of_the_key() {
        // Pinned values: the hash must not change between builds or machines, or
        // flows move to new ECMP paths after an upgrade.
        let k = key(40000, 80);
        let pinned = k.hash64();
        assert_eq!(pinned, PINNED, "the flow hash changed: {pinned:#x}");
        assert_eq!(k.udp_src_port(), 49152 + (pinned % 16384) as u16);
        assert_eq!(k.flow_label(), ((pinned >> 40) & 0xfffff) as u32);
        assert_ne!(k.hash64(), k.reversed().hash64());
    }

    #[test]
    fn families_do_not_collide() {
        let mut a = key(1, 2);
        let mut b = a;
        a.src_ip = "0.0.0.1".parse().unwrap();
        b.src_ip = "::1".parse().unwrap();
        assert_ne!(a.hash64(), b.hash64());
    }

    #[test]
    fn udp_ports_spread_over_the_range() {
        // 4096 flows differing only in source port should land on many distinct
        // outer ports (a weak hash would collapse them).
        let mut seen = std::collections::HashSet::new();
        for sp in 0..4096u16 {
            seen.insert(key(sp, 443).udp_src_port());
        }
        assert!(seen.len() > 3000, "only {} distinct ports", seen.len());
    }

    proptest! {
        #[test]
        fn outer_fields_stay_in_range(sp: u16, dp: u16, vni in 0u32..(1 << 24)) {
            let mut k = key(sp, dp);
            k.vni = vni;
            let p = k.udp_src_port();
            prop_assert!(p >= 49152);
            prop_assert!(k.flow_label() < (1 << 20));
            prop_assert_eq!(k.reversed().reversed(), k);
        }
    }
}
