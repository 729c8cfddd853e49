//! The flow key and its two hashes.
//!
//! [`FlowKey::hash64`] is a fixed, unkeyed function of the key. It chooses the outer
//! UDP source port (ECMP spreading on the underlay) and the outer IPv6 flow label, so
//! it must give the same values in every process and after every restart: a changed
//! value moves the flow to a new ECMP path, with reordering. It is an FxHash-style
//! multiply-rotate over five 64-bit words followed by the MurmurHash3 64-bit
//! finalizer, so the bits used for `% 16384` and those used for the flow label are
//! well mixed.
//!
//! The flow and connection tables are hashed differently: with foldhash keyed by a
//! per-process seed ([`FlowHashBuilder::new`], from `EngineConfig::hash_seed`).
//! Inbound keys are chosen by remote peers, so an unkeyed table hash would let anyone
//! on the internet pick colliding 5-tuples and turn a port's table lookups into
//! linear scans. The engine makes no syscalls, so the caller supplies the seed.
//! foldhash's `fast` hasher is a folded 64x64->128-bit multiply of the key words
//! XORed with secret values; the seed keys *all* of them (foldhash's shared seed
//! too, not only its per-hasher seed), so no input word can be chosen to cancel a
//! multiplier without knowing the seed. It costs two (IPv4) or three (IPv6)
//! multiplies per key, against ~250 instructions for SipHash-1-3 over six words:
//! the table hash runs once per fast-path packet.

use core::hash::{BuildHasher, Hash, Hasher};
use foldhash::fast::FoldHasher;
use foldhash::SharedSeed;
use serde::{Deserialize, Serialize};
use std::net::IpAddr;
use wire::icmpv4::msg::{ECHO_REPLY as ICMP_ECHO_REPLY, ECHO_REQUEST as ICMP_ECHO_REQUEST};
use wire::icmpv6::msg::{ECHO_REPLY as ICMPV6_ECHO_REPLY, ECHO_REQUEST as ICMPV6_ECHO_REQUEST};
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

/// A flow as the guest sees it: VPC, protocol, addresses, ports and, for ICMP, the
/// message type.
///
/// ICMP and ICMPv6 carry their type in the key, so a rule on the type decides each
/// type separately and a connection opened by one type admits no other. An echo
/// request and its reply are each other's [`FlowKey::reversed`] key: the echo
/// identifier is put in *both* ports and `reversed` swaps the request and reply types
/// (the stateful firewall relies on that). Other ICMP messages have ports 0 and carry
/// their code too, so that a rule's decision for one (type, code) is not cached for
/// another.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlowKey {
    pub vni: u32,
    pub proto: u8,
    pub src_ip: IpAddr,
    pub dst_ip: IpAddr,
    pub src_port: u16,
    pub dst_port: u16,
    /// ICMP/ICMPv6 type; 0 for other protocols.
    pub icmp_type: u8,
    /// ICMP/ICMPv6 code of messages other than echo; 0 otherwise.
    pub icmp_code: u8,
}

/// Whether `t` is an echo request or reply of ICMP protocol `proto`.
pub(crate) fn is_echo(proto: u8, t: u8) -> bool {
    match proto {
        PROTO_ICMP => matches!(t, ICMP_ECHO_REQUEST | ICMP_ECHO_REPLY),
        PROTO_ICMPV6 => matches!(t, ICMPV6_ECHO_REQUEST | ICMPV6_ECHO_REPLY),
        _ => false,
    }
}

/// The echo type answering `t` (request <-> reply); other types map to themselves.
fn echo_peer(proto: u8, t: u8) -> u8 {
    match (proto, t) {
        (PROTO_ICMP, ICMP_ECHO_REQUEST) => ICMP_ECHO_REPLY,
        (PROTO_ICMP, ICMP_ECHO_REPLY) => ICMP_ECHO_REQUEST,
        (PROTO_ICMPV6, ICMPV6_ECHO_REQUEST) => ICMPV6_ECHO_REPLY,
        (PROTO_ICMPV6, ICMPV6_ECHO_REPLY) => ICMPV6_ECHO_REQUEST,
        _ => t,
    }
}

impl FlowKey {
    /// The key of a parsed guest frame in VPC `vni`.
    pub fn from_meta(vni: u32, m: &InnerMeta) -> FlowKey {
        let mut k = FlowKey {
            vni,
            proto: m.proto,
            src_ip: m.src_ip,
            dst_ip: m.dst_ip,
            src_port: m.src_port,
            dst_port: m.dst_port,
            icmp_type: 0,
            icmp_code: 0,
        };
        if k.is_icmp() {
            k.icmp_type = m.icmp_type;
            if is_echo(m.proto, m.icmp_type) {
                // The parser puts the echo identifier in src_port.
                k.dst_port = m.src_port;
            } else {
                k.src_port = 0;
                k.dst_port = 0;
                k.icmp_code = m.icmp_code;
            }
        }
        k
    }

    /// The same flow seen from the other end (for echo, the reply's key).
    pub fn reversed(&self) -> FlowKey {
        FlowKey {
            vni: self.vni,
            proto: self.proto,
            src_ip: self.dst_ip,
            dst_ip: self.src_ip,
            src_port: self.dst_port,
            dst_port: self.src_port,
            icmp_type: echo_peer(self.proto, self.icmp_type),
            icmp_code: self.icmp_code,
        }
    }

    /// ICMP or ICMPv6.
    pub fn is_icmp(&self) -> bool {
        self.proto == PROTO_ICMP || self.proto == PROTO_ICMPV6
    }

    /// An ICMP error message (destination unreachable, packet too big, time exceeded,
    /// parameter problem, and ICMPv4's source quench and redirect): it quotes a packet
    /// of another flow and is never the start of a connection.
    pub fn is_icmp_error(&self) -> bool {
        match self.proto {
            PROTO_ICMP => wire::icmpv4::msg::is_error(self.icmp_type),
            PROTO_ICMPV6 => wire::icmpv6::msg::is_error(self.icmp_type),
            _ => false,
        }
    }

    /// Whether the first packet of this flow may open a tracked connection: every
    /// protocol but ICMP, and of ICMP only echo requests (the only ICMP exchange the
    /// firewall follows; a reply or any other message is decided by the rules alone).
    pub fn opens_connection(&self) -> bool {
        match self.proto {
            PROTO_ICMP => self.icmp_type == ICMP_ECHO_REQUEST,
            PROTO_ICMPV6 => self.icmp_type == ICMPV6_ECHO_REQUEST,
            _ => true,
        }
    }

    /// The flow's fixed 64-bit hash (ECMP port and flow label); stable across
    /// processes and machines. Not used for tables (see the module doc).
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
        // ICMP type and code are mixed in only when set, so that the values of
        // every other flow stay what they were before ICMP types joined the key.
        let icmp = self.icmp_word();
        if icmp != 0 {
            h = (h.rotate_left(5) ^ icmp).wrapping_mul(K);
        }
        fmix64(h)
    }

    fn icmp_word(&self) -> u64 {
        (u64::from(self.icmp_type) << 8) | u64::from(self.icmp_code)
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

impl FlowKey {
    /// For an ICMP error (this flow's key; `m` its packet, in `frame`), the flow of
    /// the packet it quotes (see [`quoted_flow`]); `None` for other packets.
    pub fn quoted(&self, m: &InnerMeta, frame: &[u8]) -> Option<FlowKey> {
        if !self.is_icmp_error() {
            return None;
        }
        let body = frame.get(m.payload_off..m.ip_end)?;
        quoted_flow(self.vni, self.proto, body)
    }
}

/// A packet's IP bytes (inner L3 header onward), what flows and connections count.
#[inline]
pub fn ip_bytes(m: &InnerMeta) -> u32 {
    u32::try_from(m.ip_end.saturating_sub(m.l3_off)).unwrap_or(u32::MAX)
}

/// The flow an ICMP error quotes: `body` is the error's payload after its 8-byte
/// header, which starts with the offending packet's IP header and at least 8 bytes
/// of its L4 header (RFC 792, RFC 4443). `icmp_proto` is the error's own protocol:
/// ICMP quotes IPv4, ICMPv6 quotes IPv6. The key is the quoted packet's own
/// orientation (its source first). `None` if the quote is too short or not the
/// expected IP version, or (IPv6) its extension headers do not reach the L4 header
/// within the quote.
pub fn quoted_flow(vni: u32, icmp_proto: u8, body: &[u8]) -> Option<FlowKey> {
    quoted_packet(vni, icmp_proto, body).map(|(k, _)| k)
}

/// [`quoted_flow`], and where the quoted packet's L4 header starts in `body` (what
/// the NAT layer rewrites).
pub(crate) fn quoted_packet(vni: u32, icmp_proto: u8, body: &[u8]) -> Option<(FlowKey, usize)> {
    let (src_ip, dst_ip, proto, l4_off) = match icmp_proto {
        PROTO_ICMP => {
            let h = body.get(..20)?;
            if h[0] >> 4 != 4 {
                return None;
            }
            let ihl = usize::from(h[0] & 0x0f) * 4;
            let src: [u8; 4] = h[12..16].try_into().ok()?;
            let dst: [u8; 4] = h[16..20].try_into().ok()?;
            // A non-first fragment has no L4 header.
            let frag_off = u16::from_be_bytes([h[6], h[7]]) & 0x1fff;
            if ihl < 20 || frag_off != 0 {
                return None;
            }
            (IpAddr::from(src), IpAddr::from(dst), h[9], ihl)
        }
        PROTO_ICMPV6 => {
            let h = body.get(..40)?;
            if h[0] >> 4 != 6 {
                return None;
            }
            let src: [u8; 16] = h[8..24].try_into().ok()?;
            let dst: [u8; 16] = h[24..40].try_into().ok()?;
            let (mut nh, mut off) = (h[6], 40usize);
            // Hop-by-hop, routing, destination options and fragment headers; bounded
            // by the quote's length, as each header is at least 8 bytes.
            loop {
                match nh {
                    0 | 43 | 60 => {
                        let e = body.get(off..off + 2)?;
                        nh = e[0];
                        off += (usize::from(e[1]) + 1) * 8;
                    }
                    44 => {
                        let e = body.get(off..off + 8)?;
                        if u16::from_be_bytes([e[2], e[3]]) & 0xfff8 != 0 {
                            return None;
                        }
                        nh = e[0];
                        off += 8;
                    }
                    _ => break,
                }
            }
            (IpAddr::from(src), IpAddr::from(dst), nh, off)
        }
        _ => return None,
    };
    let l4 = body.get(l4_off..)?;
    let mut k = FlowKey {
        vni,
        proto,
        src_ip,
        dst_ip,
        src_port: 0,
        dst_port: 0,
        icmp_type: 0,
        icmp_code: 0,
    };
    match proto {
        PROTO_TCP | PROTO_UDP => {
            let p = l4.get(..4)?;
            k.src_port = u16::from_be_bytes([p[0], p[1]]);
            k.dst_port = u16::from_be_bytes([p[2], p[3]]);
        }
        p if p == icmp_proto => {
            let h = l4.get(..8)?;
            k.icmp_type = h[0];
            if is_echo(p, h[0]) {
                let id = u16::from_be_bytes([h[4], h[5]]);
                (k.src_port, k.dst_port) = (id, id);
            } else {
                k.icmp_code = h[1];
            }
        }
        _ => {}
    }
    Some((k, l4_off))
}

/// An address as two 64-bit words; IPv4 in its IPv4-mapped IPv6 form. An IPv4
/// address and its mapped IPv6 form (`::ffff:a.b.c.d`) therefore give the same
/// words: the keys still differ (they compare unequal), but `hash64` does not tell
/// them apart. The table hash does, as it also hashes the address family.
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
    /// The addresses (an IPv4 pair as one 64-bit half, IPv6 addresses whole), the
    /// ports/protocol/VNI word, and the address families with the ICMP type and code,
    /// written as 128-bit words: foldhash folds each with one multiply and keeps
    /// nothing pending for `finish`.
    fn hash<H: Hasher>(&self, state: &mut H) {
        let tail = (u64::from(self.src_port) << 48)
            | (u64::from(self.dst_port) << 32)
            | (u64::from(self.proto) << 24)
            | u64::from(self.vni & 0x00ff_ffff);
        let family =
            u64::from(self.src_ip.is_ipv6()) << 32 | u64::from(self.dst_ip.is_ipv6()) << 33;
        let rest = u128::from(family | self.icmp_word());
        match (self.src_ip, self.dst_ip) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                let addrs = u64::from(s.to_bits()) << 32 | u64::from(d.to_bits());
                state.write_u128(u128::from(addrs) << 64 | u128::from(tail));
                state.write_u128(rest);
            }
            (s, d) => {
                state.write_u128(ip_bits(s));
                state.write_u128(ip_bits(d));
                state.write_u128(u128::from(tail) << 64 | rest);
            }
        }
    }
}

/// An address as 128 bits; IPv4 in its IPv4-mapped IPv6 form (the family is hashed
/// separately).
fn ip_bits(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => a.to_ipv6_mapped().to_bits(),
        IpAddr::V6(a) => a.to_bits(),
    }
}

/// `BuildHasher` for tables keyed by [`FlowKey`]: foldhash keyed by a seed.
#[derive(Clone, Debug)]
pub struct FlowHashBuilder {
    per_hasher: u64,
    shared: SharedSeed,
}

impl FlowHashBuilder {
    /// A builder keyed by `seed`: foldhash's per-hasher seed and its shared seed (the
    /// multipliers) are both derived from it.
    pub fn new(seed: u64) -> Self {
        FlowHashBuilder {
            per_hasher: fmix64(seed ^ 0x9e37_79b9_7f4a_7c15),
            shared: SharedSeed::from_u64(seed),
        }
    }
}

/// The hasher built by [`FlowHashBuilder`].
pub type FlowHasher = FoldHasher;

impl BuildHasher for FlowHashBuilder {
    type Hasher = FlowHasher;
    #[inline]
    fn build_hasher(&self) -> FlowHasher {
        FoldHasher::with_seed(self.per_hasher, &self.shared)
    }
}

/// A `HashMap` keyed by flows.
pub type FlowMap<V> = std::collections::HashMap<FlowKey, V, FlowHashBuilder>;

/// An empty [`FlowMap`] hashed with `seed`.
pub fn flow_map<V>(seed: u64) -> FlowMap<V> {
    FlowMap::with_hasher(FlowHashBuilder::new(seed))
}

/// A UDP flow 10.0.0.1:`sp` -> 10.0.0.2:53 in VNI 5: keys that differ by one number,
/// for the tables' unit tests.
#[cfg(test)]
pub(crate) fn udp_test_key(sp: u16) -> FlowKey {
    FlowKey {
        vni: 5,
        proto: 17,
        src_ip: "10.0.0.1".parse().unwrap(),
        dst_ip: "10.0.0.2".parse().unwrap(),
        src_port: sp,
        dst_port: 53,
        icmp_type: 0,
        icmp_code: 0,
    }
}

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
            icmp_type: 0,
            icmp_code: 0,
        }
    }

    fn icmp(t: u8, code: u8, id: u16) -> InnerMeta {
        let f = etherparse::PacketBuilder::ethernet2([2; 6], [4; 6])
            .ipv4([172, 30, 0, 5], [172, 30, 0, 6], 64)
            .icmpv4(etherparse::Icmpv4Type::Unknown {
                type_u8: t,
                code_u8: code,
                bytes5to8: [(id >> 8) as u8, id as u8, 0, 1],
            });
        let mut buf = Vec::new();
        f.write(&mut buf, &[0; 28]).unwrap();
        wire::meta::parse_inner(&buf).unwrap()
    }

    fn table_hash(seed: u64, k: &FlowKey) -> u64 {
        FlowHashBuilder::new(seed).hash_one(k)
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
        // An IPv4 address and its IPv4-mapped form share hash64 but not the table hash.
        b.src_ip = "::ffff:0.0.0.1".parse().unwrap();
        assert_eq!(a.hash64(), b.hash64());
        assert_ne!(table_hash(7, &a), table_hash(7, &b));
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

    #[test]
    fn table_hash_spreads_flows_over_buckets() {
        // hashbrown picks buckets from the low bits and a tag from the top 7: 4096
        // flows differing in one port must spread over both, for each family.
        for v6 in [false, true] {
            let (mut low, mut top) = (std::collections::HashSet::new(), [0u32; 128]);
            for sp in 0..4096u16 {
                let mut k = key(sp, 443);
                if v6 {
                    k.src_ip = "fd00::5".parse().unwrap();
                    k.dst_ip = "fd00::6".parse().unwrap();
                }
                let h = table_hash(0x1234, &k);
                low.insert(h & 0xfff);
                top[(h >> 57) as usize] += 1;
            }
            assert!(
                low.len() > 2400,
                "v6={v6}: {} of 4096 low values",
                low.len()
            );
            assert!(
                top.iter().all(|&n| n > 0 && n < 80),
                "v6={v6}: tags {top:?}"
            );
        }
    }

    #[test]
    fn table_hash_depends_on_the_seed() {
        let k = key(40000, 80);
        assert_eq!(table_hash(1, &k), table_hash(1, &k));
        assert_ne!(table_hash(1, &k), table_hash(2, &k));
        // Keys differing in one port differ under every seed.
        assert_ne!(table_hash(1, &k), table_hash(1, &key(40001, 80)));
    }

    #[test]
    fn icmp_type_is_part_of_the_key_and_echo_maps_to_its_reply() {
        let req = FlowKey::from_meta(1, &icmp(ICMP_ECHO_REQUEST, 0, 77));
        assert_eq!((req.src_port, req.dst_port, req.icmp_type), (77, 77, 8));
        assert!(req.opens_connection() && !req.is_icmp_error());
        let mut reply = FlowKey::from_meta(1, &icmp(ICMP_ECHO_REPLY, 0, 77));
        reply.src_ip = req.dst_ip;
        reply.dst_ip = req.src_ip;
        assert_eq!(req.reversed(), reply);
        assert!(!reply.opens_connection());
        // Errors: ports 0, type and code in the key, never a connection.
        let unreach = FlowKey::from_meta(1, &icmp(3, 3, 77));
        let other = FlowKey::from_meta(1, &icmp(3, 1, 77));
        let exceeded = FlowKey::from_meta(1, &icmp(11, 0, 77));
        assert_eq!((unreach.src_port, unreach.dst_port), (0, 0));
        assert_eq!((unreach.icmp_type, unreach.icmp_code), (3, 3));
        assert_ne!(unreach, other);
        assert_ne!(unreach, exceeded);
        assert_ne!(unreach.hash64(), other.hash64());
        assert!(unreach.is_icmp_error() && !unreach.opens_connection());
        // A timestamp request is no error but opens nothing either.
        let ts = FlowKey::from_meta(1, &icmp(13, 0, 77));
        assert!(!ts.is_icmp_error() && !ts.opens_connection());
    }

    #[test]
    fn quoted_flows_are_read_from_error_bodies() {
        // IPv4/UDP quote, as a port-unreachable carries it.
        let mut q4 = Vec::new();
        etherparse::PacketBuilder::ipv4([172, 30, 0, 5], [8, 8, 8, 8], 64)
            .udp(5353, 53)
            .write(&mut q4, &[1, 2, 3])
            .unwrap();
        let k = quoted_flow(9, PROTO_ICMP, &q4[..28]).unwrap();
        assert_eq!(
            (k.vni, k.proto, k.src_port, k.dst_port),
            (9, PROTO_UDP, 5353, 53)
        );
        assert_eq!(k.dst_ip, "8.8.8.8".parse::<IpAddr>().unwrap());
        assert_eq!(quoted_flow(9, PROTO_ICMP, &q4[..23]), None);
        assert_eq!(quoted_flow(9, PROTO_ICMPV6, &q4), None);
        // IPv6/TCP behind a destination-options header.
        let mut q6 = vec![0u8; 40 + 8 + 20];
        q6[0] = 0x60;
        q6[6] = 60;
        q6[8..24].copy_from_slice(&"fd00::5".parse::<std::net::Ipv6Addr>().unwrap().octets());
        q6[24..40].copy_from_slice(&"fd00::9".parse::<std::net::Ipv6Addr>().unwrap().octets());
        q6[40] = PROTO_TCP;
        q6[48..52].copy_from_slice(&[0x9c, 0x40, 0x01, 0xbb]);
        let k = quoted_flow(9, PROTO_ICMPV6, &q6).unwrap();
        assert_eq!((k.proto, k.src_port, k.dst_port), (PROTO_TCP, 40000, 443));
        assert_eq!(quoted_flow(9, PROTO_ICMPV6, &q6[..50]), None);
        // An ICMP echo quote gives the echo key.
        let mut qe = Vec::new();
        etherparse::PacketBuilder::ipv4([172, 30, 0, 5], [8, 8, 8, 8], 64)
            .icmpv4_echo_request(0x1234, 1)
            .write(&mut qe, &[])
            .unwrap();
        let k = quoted_flow(9, PROTO_ICMP, &qe).unwrap();
        assert_eq!((k.icmp_type, k.src_port, k.dst_port), (8, 0x1234, 0x1234));
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

        #[test]
        fn quoted_flow_never_panics(body: Vec<u8>, v6: bool) {
            let _ = quoted_flow(1, if v6 { PROTO_ICMPV6 } else { PROTO_ICMP }, &body);
        }
    }
}
