//! Neighbor Discovery for IPv6 (RFC 4861): Router Solicitation/Advertisement,
//! Neighbor Solicitation/Advertisement, and the options the gateway reads or writes
//! (source/target link-layer address, MTU, prefix information).
//!
//! A view covers the whole ICMPv6 message. The option walk is bounded by the message:
//! every option is at least 8 bytes, an option claiming length 0 is malformed (RFC 4861
//! §4.6: "nodes MUST silently discard an ND packet that contains an option with length
//! zero") and ends the walk, and one running past the end is truncated. Unknown options
//! are skipped, as §4.6 requires.

use crate::bytes;
use crate::icmpv6::{self, msg};
use crate::{MacAddr, Result, WireError};
use core::fmt;
use std::net::Ipv6Addr;

/// Option types (RFC 4861 §4.6).
pub mod opt {
    pub const SOURCE_LL_ADDR: u8 = 1;
    pub const TARGET_LL_ADDR: u8 = 2;
    pub const PREFIX_INFO: u8 = 3;
    pub const MTU: u8 = 5;
}

/// Length of a link-layer address option for Ethernet, and of the MTU option.
pub const LL_ADDR_OPT_LEN: usize = 8;
pub const MTU_OPT_LEN: usize = 8;
pub const PREFIX_INFO_OPT_LEN: usize = 32;

mod field {
    use core::ops::Range;
    pub const TYPE: usize = 0;
    pub const CODE: usize = 1;
    // Router Advertisement.
    pub const CUR_HOP_LIMIT: usize = 4;
    pub const ROUTER_FLAGS: usize = 5;
    pub const ROUTER_LIFETIME: Range<usize> = 6..8;
    pub const REACHABLE_TIME: Range<usize> = 8..12;
    pub const RETRANS_TIME: Range<usize> = 12..16;
    // Neighbor Solicitation/Advertisement.
    pub const NEIGHBOR_FLAGS: usize = 4;
    pub const TARGET_ADDR: Range<usize> = 8..24;
    // Where options start, per message type.
    pub const RS_OPTIONS: usize = 8;
    pub const RA_OPTIONS: usize = 16;
    pub const NS_NA_OPTIONS: usize = 24;
}

/// RA flag bits (byte 5).
pub const RA_FLAG_MANAGED: u8 = 0x80;
pub const RA_FLAG_OTHER: u8 = 0x40;
/// NA flag bits (byte 4).
pub const NA_FLAG_ROUTER: u8 = 0x80;
pub const NA_FLAG_SOLICITED: u8 = 0x40;
pub const NA_FLAG_OVERRIDE: u8 = 0x20;

/// Offset where options begin for an NDP message type, `None` for other types.
fn options_offset(msg_type: u8) -> Option<usize> {
    match msg_type {
        msg::ROUTER_SOLICIT => Some(field::RS_OPTIONS),
        msg::ROUTER_ADVERT => Some(field::RA_OPTIONS),
        msg::NEIGHBOR_SOLICIT | msg::NEIGHBOR_ADVERT => Some(field::NS_NA_OPTIONS),
        _ => None,
    }
}

/// A view of an NDP message (RS, RA, NS or NA).
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps a buffer holding at least the fixed part of its message type.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    pub fn check_len(&self) -> Result<()> {
        let b = self.buffer.as_ref();
        let Some(&t) = b.first() else {
            return Err(WireError::Truncated);
        };
        let need = options_offset(t).ok_or(WireError::Unsupported("ndp message type"))?;
        if b.len() < need {
            Err(WireError::Truncated)
        } else {
            Ok(())
        }
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    pub fn msg_type(&self) -> u8 {
        self.buffer.as_ref()[field::TYPE]
    }
    pub fn msg_code(&self) -> u8 {
        self.buffer.as_ref()[field::CODE]
    }
    pub fn current_hop_limit(&self) -> u8 {
        self.buffer.as_ref()[field::CUR_HOP_LIMIT]
    }
    pub fn router_flags(&self) -> u8 {
        self.buffer.as_ref()[field::ROUTER_FLAGS]
    }
    pub fn router_lifetime(&self) -> u16 {
        let b = &self.buffer.as_ref()[field::ROUTER_LIFETIME];
        u16::from_be_bytes([b[0], b[1]])
    }
    pub fn reachable_time(&self) -> u32 {
        bytes::get_u32(self.buffer.as_ref(), field::REACHABLE_TIME)
    }
    pub fn retrans_time(&self) -> u32 {
        bytes::get_u32(self.buffer.as_ref(), field::RETRANS_TIME)
    }
    pub fn neighbor_flags(&self) -> u8 {
        self.buffer.as_ref()[field::NEIGHBOR_FLAGS]
    }
    pub fn target_addr(&self) -> Ipv6Addr {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.buffer.as_ref()[field::TARGET_ADDR]);
        Ipv6Addr::from(a)
    }
    /// The options area (empty for a non-NDP type, which `new_checked` refuses).
    pub fn options(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        options_offset(self.msg_type())
            .and_then(|o| b.get(o..))
            .unwrap_or(&[])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_msg_type(&mut self, v: u8) {
        self.buffer.as_mut()[field::TYPE] = v;
    }
    pub fn set_msg_code(&mut self, v: u8) {
        self.buffer.as_mut()[field::CODE] = v;
    }
    pub fn set_current_hop_limit(&mut self, v: u8) {
        self.buffer.as_mut()[field::CUR_HOP_LIMIT] = v;
    }
    pub fn set_router_flags(&mut self, v: u8) {
        self.buffer.as_mut()[field::ROUTER_FLAGS] = v;
    }
    pub fn set_router_lifetime(&mut self, v: u16) {
        self.buffer.as_mut()[field::ROUTER_LIFETIME].copy_from_slice(&v.to_be_bytes());
    }
    pub fn set_reachable_time(&mut self, v: u32) {
        self.buffer.as_mut()[field::REACHABLE_TIME].copy_from_slice(&v.to_be_bytes());
    }
    pub fn set_retrans_time(&mut self, v: u32) {
        self.buffer.as_mut()[field::RETRANS_TIME].copy_from_slice(&v.to_be_bytes());
    }
    pub fn set_neighbor_flags(&mut self, v: u8) {
        self.buffer.as_mut()[field::NEIGHBOR_FLAGS] = v;
    }
    pub fn set_target_addr(&mut self, a: Ipv6Addr) {
        self.buffer.as_mut()[field::TARGET_ADDR].copy_from_slice(&a.octets());
    }
    /// Zeroes the 4 reserved bytes of RS/NS/NA (RA has none).
    fn clear_reserved(&mut self) {
        self.buffer.as_mut()[4..8].fill(0);
    }
    pub fn options_mut(&mut self) -> &mut [u8] {
        let off = options_offset(self.msg_type()).unwrap_or(0);
        let b = self.buffer.as_mut();
        let off = off.min(b.len());
        &mut b[off..]
    }
}

/// The Prefix Information option (RFC 4861 §4.6.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PrefixInfo {
    pub prefix_len: u8,
    /// L: the prefix is on-link.
    pub on_link: bool,
    /// A: usable for stateless address autoconfiguration.
    pub autonomous: bool,
    pub valid_lifetime: u32,
    pub preferred_lifetime: u32,
    pub prefix: Ipv6Addr,
}

/// As an operator reads it: `fd00::/64 L=1 A=1 valid 86400 s, preferred 14400 s`.
impl fmt::Display for PrefixInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{} L={} A={} valid {} s, preferred {} s",
            self.prefix,
            self.prefix_len,
            u8::from(self.on_link),
            u8::from(self.autonomous),
            self.valid_lifetime,
            self.preferred_lifetime
        )
    }
}

/// One NDP option, borrowed from the message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NdiscOption<'a> {
    SourceLinkLayerAddr(MacAddr),
    TargetLinkLayerAddr(MacAddr),
    Mtu(u32),
    PrefixInformation(PrefixInfo),
    /// An option this code does not decode (type, whole option bytes).
    Unknown(u8, &'a [u8]),
}

/// Walks an options area; yields an error (and then stops) on a malformed option.
pub struct OptionIter<'a> {
    rest: &'a [u8],
    failed: bool,
}

/// Walks the options area `opts`.
pub fn options(opts: &[u8]) -> OptionIter<'_> {
    OptionIter {
        rest: opts,
        failed: false,
    }
}

fn mac_from(b: &[u8]) -> MacAddr {
    let mut m = [0u8; 6];
    m.copy_from_slice(&b[..6]);
    MacAddr(m)
}

fn u32_from(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

fn decode_option(kind: u8, o: &[u8]) -> Result<NdiscOption<'_>> {
    match kind {
        opt::SOURCE_LL_ADDR | opt::TARGET_LL_ADDR => {
            // An Ethernet address option is exactly one unit (RFC 2464 §8).
            if o.len() != LL_ADDR_OPT_LEN {
                return Err(WireError::Malformed("ndp link-layer address option length"));
            }
            let m = mac_from(&o[2..8]);
            Ok(if kind == opt::SOURCE_LL_ADDR {
                NdiscOption::SourceLinkLayerAddr(m)
            } else {
                NdiscOption::TargetLinkLayerAddr(m)
            })
        }
        opt::MTU => {
            if o.len() != MTU_OPT_LEN {
                return Err(WireError::Malformed("ndp mtu option length"));
            }
            Ok(NdiscOption::Mtu(u32_from(&o[4..8])))
        }
        opt::PREFIX_INFO => {
            if o.len() != PREFIX_INFO_OPT_LEN {
                return Err(WireError::Malformed("ndp prefix information option length"));
            }
            let mut p = [0u8; 16];
            p.copy_from_slice(&o[16..32]);
            Ok(NdiscOption::PrefixInformation(PrefixInfo {
                prefix_len: o[2],
                on_link: o[3] & 0x80 != 0,
                autonomous: o[3] & 0x40 != 0,
                valid_lifetime: u32_from(&o[4..8]),
                preferred_lifetime: u32_from(&o[8..12]),
                prefix: Ipv6Addr::from(p),
            }))
        }
        k => Ok(NdiscOption::Unknown(k, o)),
    }
}

impl<'a> Iterator for OptionIter<'a> {
    type Item = Result<NdiscOption<'a>>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.rest.is_empty() {
            return None;
        }
        let r = (|| {
            let [kind, units, ..] = *self.rest else {
                return Err(WireError::Truncated);
            };
            if units == 0 {
                return Err(WireError::Malformed("ndp option length 0"));
            }
            let len = units as usize * 8;
            let o = self.rest.get(..len).ok_or(WireError::Truncated)?;
            self.rest = &self.rest[len..];
            decode_option(kind, o)
        })();
        if r.is_err() {
            self.failed = true;
        }
        Some(r)
    }
}

fn write_ll_opt(b: &mut [u8], kind: u8, m: MacAddr) -> usize {
    b[0] = kind;
    b[1] = 1;
    b[2..8].copy_from_slice(&m.0);
    LL_ADDR_OPT_LEN
}

fn write_mtu_opt(b: &mut [u8], mtu: u32) -> usize {
    b[0] = opt::MTU;
    b[1] = 1;
    b[2..4].fill(0);
    b[4..8].copy_from_slice(&mtu.to_be_bytes());
    MTU_OPT_LEN
}

fn write_prefix_opt(b: &mut [u8], p: &PrefixInfo) -> usize {
    b[0] = opt::PREFIX_INFO;
    b[1] = 4;
    b[2] = p.prefix_len;
    b[3] = if p.on_link { 0x80 } else { 0 } | if p.autonomous { 0x40 } else { 0 };
    b[4..8].copy_from_slice(&p.valid_lifetime.to_be_bytes());
    b[8..12].copy_from_slice(&p.preferred_lifetime.to_be_bytes());
    b[12..16].fill(0);
    b[16..32].copy_from_slice(&p.prefix.octets());
    PREFIX_INFO_OPT_LEN
}

/// A decoded NDP message. Options this code does not know are skipped on parse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Repr {
    RouterSolicit {
        /// Source link-layer address option.
        lladdr: Option<MacAddr>,
    },
    RouterAdvert {
        /// Current hop limit advertised to hosts (0 = unspecified).
        hop_limit: u8,
        managed: bool,
        other: bool,
        /// Seconds; 0 = not a default router.
        router_lifetime: u16,
        /// Milliseconds; 0 = unspecified.
        reachable_time: u32,
        /// Milliseconds; 0 = unspecified.
        retrans_time: u32,
        lladdr: Option<MacAddr>,
        mtu: Option<u32>,
        prefix_info: Option<PrefixInfo>,
    },
    NeighborSolicit {
        target_addr: Ipv6Addr,
        lladdr: Option<MacAddr>,
    },
    NeighborAdvert {
        router: bool,
        solicited: bool,
        override_: bool,
        target_addr: Ipv6Addr,
        /// Target link-layer address option.
        lladdr: Option<MacAddr>,
    },
}

impl Repr {
    /// Decodes an RS/RA/NS/NA after checking code 0 and the ICMPv6 checksum against the
    /// IPv6 addresses it arrived with (RFC 4861 §6.1/§7.1 validity checks that the
    /// message itself can answer; the IPv6 hop limit is the caller's to check).
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>, src: Ipv6Addr, dst: Ipv6Addr) -> Result<Repr> {
        p.check_len()?;
        if p.msg_code() != 0 {
            return Err(WireError::Malformed("ndp code"));
        }
        if !icmpv6::verify_checksum(src, dst, p.buffer.as_ref()) {
            return Err(WireError::Malformed("icmpv6 checksum"));
        }
        let (mut sll, mut tll, mut mtu, mut prefix) = (None, None, None, None);
        for o in options(p.options()) {
            match o? {
                NdiscOption::SourceLinkLayerAddr(m) => sll = Some(m),
                NdiscOption::TargetLinkLayerAddr(m) => tll = Some(m),
                NdiscOption::Mtu(v) => mtu = Some(v),
                NdiscOption::PrefixInformation(pi) => prefix = Some(pi),
                NdiscOption::Unknown(..) => {}
            }
        }
        Ok(match p.msg_type() {
            msg::ROUTER_SOLICIT => Repr::RouterSolicit { lladdr: sll },
            msg::ROUTER_ADVERT => {
                let f = p.router_flags();
                Repr::RouterAdvert {
                    hop_limit: p.current_hop_limit(),
                    managed: f & RA_FLAG_MANAGED != 0,
                    other: f & RA_FLAG_OTHER != 0,
                    router_lifetime: p.router_lifetime(),
                    reachable_time: p.reachable_time(),
                    retrans_time: p.retrans_time(),
                    lladdr: sll,
                    mtu,
                    prefix_info: prefix,
                }
            }
            msg::NEIGHBOR_SOLICIT => Repr::NeighborSolicit {
                target_addr: p.target_addr(),
                lladdr: sll,
            },
            msg::NEIGHBOR_ADVERT => {
                let f = p.neighbor_flags();
                Repr::NeighborAdvert {
                    router: f & NA_FLAG_ROUTER != 0,
                    solicited: f & NA_FLAG_SOLICITED != 0,
                    override_: f & NA_FLAG_OVERRIDE != 0,
                    target_addr: p.target_addr(),
                    lladdr: tll,
                }
            }
            // check_len refused every other type.
            _ => return Err(WireError::Unsupported("ndp message type")),
        })
    }

    pub fn buffer_len(&self) -> usize {
        let ll = |o: &Option<MacAddr>| if o.is_some() { LL_ADDR_OPT_LEN } else { 0 };
        match self {
            Repr::RouterSolicit { lladdr } => field::RS_OPTIONS + ll(lladdr),
            Repr::RouterAdvert {
                lladdr,
                mtu,
                prefix_info,
                ..
            } => {
                field::RA_OPTIONS
                    + ll(lladdr)
                    + if mtu.is_some() { MTU_OPT_LEN } else { 0 }
                    + if prefix_info.is_some() {
                        PREFIX_INFO_OPT_LEN
                    } else {
                        0
                    }
            }
            Repr::NeighborSolicit { lladdr, .. } | Repr::NeighborAdvert { lladdr, .. } => {
                field::NS_NA_OPTIONS + ll(lladdr)
            }
        }
    }

    /// Writes the message (options in the order link-layer address, MTU, prefix
    /// information) and its checksum. The buffer must be exactly `buffer_len()` long.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        p: &mut Packet<T>,
        src: Ipv6Addr,
        dst: Ipv6Addr,
    ) -> Result<()> {
        if p.buffer.as_ref().len() != self.buffer_len() {
            return Err(WireError::Truncated);
        }
        p.set_msg_code(0);
        match *self {
            Repr::RouterSolicit { lladdr } => {
                p.set_msg_type(msg::ROUTER_SOLICIT);
                p.clear_reserved();
                if let Some(m) = lladdr {
                    write_ll_opt(p.options_mut(), opt::SOURCE_LL_ADDR, m);
                }
            }
            Repr::RouterAdvert {
                hop_limit,
                managed,
                other,
                router_lifetime,
                reachable_time,
                retrans_time,
                lladdr,
                mtu,
                prefix_info,
            } => {
                p.set_msg_type(msg::ROUTER_ADVERT);
                p.set_current_hop_limit(hop_limit);
                p.set_router_flags(
                    if managed { RA_FLAG_MANAGED } else { 0 }
                        | if other { RA_FLAG_OTHER } else { 0 },
                );
                p.set_router_lifetime(router_lifetime);
                p.set_reachable_time(reachable_time);
                p.set_retrans_time(retrans_time);
                let o = p.options_mut();
                let mut at = 0;
                if let Some(m) = lladdr {
                    at += write_ll_opt(&mut o[at..], opt::SOURCE_LL_ADDR, m);
                }
                if let Some(v) = mtu {
                    at += write_mtu_opt(&mut o[at..], v);
                }
                if let Some(pi) = prefix_info {
                    write_prefix_opt(&mut o[at..], &pi);
                }
            }
            Repr::NeighborSolicit {
                target_addr,
                lladdr,
            } => {
                p.set_msg_type(msg::NEIGHBOR_SOLICIT);
                p.clear_reserved();
                p.set_target_addr(target_addr);
                if let Some(m) = lladdr {
                    write_ll_opt(p.options_mut(), opt::SOURCE_LL_ADDR, m);
                }
            }
            Repr::NeighborAdvert {
                router,
                solicited,
                override_,
                target_addr,
                lladdr,
            } => {
                p.set_msg_type(msg::NEIGHBOR_ADVERT);
                p.clear_reserved();
                p.set_neighbor_flags(
                    if router { NA_FLAG_ROUTER } else { 0 }
                        | if solicited { NA_FLAG_SOLICITED } else { 0 }
                        | if override_ { NA_FLAG_OVERRIDE } else { 0 },
                );
                p.set_target_addr(target_addr);
                if let Some(m) = lladdr {
                    write_ll_opt(p.options_mut(), opt::TARGET_LL_ADDR, m);
                }
            }
        }
        icmpv6::fill_checksum(src, dst, p.buffer.as_mut());
        Ok(())
    }
}

/// What a Router Advertisement tells hosts, decoded in one place for everyone who
/// reports an RA: the gateway's `ra` inspection (the RA a port sends, decoded from
/// its own bytes) and the admin tool's `ra listen` (the RA a guest receives). Field
/// names carry their units because this is what both print as JSON.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RaSummary {
    /// Hop limit the router tells hosts to use (0 = unspecified).
    pub cur_hop_limit: u8,
    /// M: addresses are available via DHCPv6.
    pub managed: bool,
    /// O: other configuration is available via DHCPv6.
    pub other: bool,
    /// 0 = not a default router.
    pub router_lifetime_s: u16,
    /// 0 = unspecified.
    pub reachable_time_ms: u32,
    /// 0 = unspecified.
    pub retrans_time_ms: u32,
    pub source_link_layer_addr: Option<MacAddr>,
    pub mtu: Option<u32>,
    pub prefix_info: Option<PrefixInfo>,
}

impl RaSummary {
    /// Decodes the ICMPv6 message `msg` that travelled from `src` to `dst` (checksum
    /// verified against them, as [`Repr::parse`] does) as a Router Advertisement.
    /// Any other NDP message is `Unsupported`, naming the type it was.
    pub fn decode(msg: &[u8], src: Ipv6Addr, dst: Ipv6Addr) -> Result<RaSummary> {
        let p = Packet::new_checked(msg)?;
        match Repr::parse(&p, src, dst)? {
            Repr::RouterAdvert {
                hop_limit,
                managed,
                other,
                router_lifetime,
                reachable_time,
                retrans_time,
                lladdr,
                mtu,
                prefix_info,
            } => Ok(RaSummary {
                cur_hop_limit: hop_limit,
                managed,
                other,
                router_lifetime_s: router_lifetime,
                reachable_time_ms: reachable_time,
                retrans_time_ms: retrans_time,
                source_link_layer_addr: lladdr,
                mtu,
                prefix_info,
            }),
            Repr::RouterSolicit { .. } => Err(WireError::Unsupported(
                "router solicitation where an RA was expected",
            )),
            Repr::NeighborSolicit { .. } => Err(WireError::Unsupported(
                "neighbor solicitation where an RA was expected",
            )),
            Repr::NeighborAdvert { .. } => Err(WireError::Unsupported(
                "neighbor advertisement where an RA was expected",
            )),
        }
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Repr::RouterSolicit { lladdr } => write!(f, "NDP RS lladdr={lladdr:?}"),
            Repr::RouterAdvert {
                hop_limit,
                managed,
                other,
                router_lifetime,
                lladdr,
                mtu,
                ..
            } => write!(
                f,
                "NDP RA hop_limit={hop_limit} M={} O={} lifetime={router_lifetime} lladdr={lladdr:?} mtu={mtu:?}",
                u8::from(*managed), u8::from(*other)
            ),
            Repr::NeighborSolicit {
                target_addr,
                lladdr,
            } => write!(f, "NDP NS target={target_addr} lladdr={lladdr:?}"),
            Repr::NeighborAdvert {
                router,
                solicited,
                override_,
                target_addr,
                lladdr,
            } => write!(
                f,
                "NDP NA target={target_addr} R={} S={} O={} lladdr={lladdr:?}",
                u8::from(*router), u8::from(*solicited), u8::from(*override_)
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gw() -> Ipv6Addr {
        "fe80::aa40:25ff:fe00:1".parse().unwrap()
    }
    fn guest() -> Ipv6Addr {
        "fe80::aa40:25ff:feff:1".parse().unwrap()
    }
    const GW_MAC: MacAddr = MacAddr([0xa8, 0x40, 0x25, 0x00, 0x00, 0x01]);
    const GUEST_MAC: MacAddr = MacAddr([0xa8, 0x40, 0x25, 0xff, 0x00, 0x01]);

    /// scapy: ICMPv6ND_RA(chlim=255, M=1, O=0, prf=0, routerlifetime=9000)
    ///   / ICMPv6NDOptSrcLLAddr(lladdr=GW_MAC) / ICMPv6NDOptMTU(mtu=8500),
    /// from fe80::aa40:25ff:fe00:1 to fe80::aa40:25ff:feff:1.
    const RA_HEX: &str = "8600c7ffff80232800000000000000000101a840250000010501000000002134";
    /// scapy: ICMPv6ND_RS() / ICMPv6NDOptSrcLLAddr(lladdr=GUEST_MAC), guest -> ff02::2.
    const RS_HEX: &str = "8500deac000000000101a84025ff0001";

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn ra_repr() -> Repr {
        Repr::RouterAdvert {
            hop_limit: 255,
            managed: true,
            other: false,
            router_lifetime: 9000,
            reachable_time: 0,
            retrans_time: 0,
            lladdr: Some(GW_MAC),
            mtu: Some(8500),
            prefix_info: None,
        }
    }

    #[test]
    fn router_advert_matches_scapy() {
        let r = ra_repr();
        let mut buf = vec![0u8; r.buffer_len()];
        r.emit(&mut Packet::new_unchecked(&mut buf[..]), gw(), guest())
            .unwrap();
        assert_eq!(buf, unhex(RA_HEX));
        let p = Packet::new_checked(&buf[..]).unwrap();
        assert_eq!(Repr::parse(&p, gw(), guest()).unwrap(), r);
    }

    /// The scapy RA decodes to a summary field for field; other NDP messages and
    /// damaged bytes are errors, and no prefix of the message panics.
    #[test]
    fn ra_summary_decodes_scapy_ra() {
        let b = unhex(RA_HEX);
        assert_eq!(
            RaSummary::decode(&b, gw(), guest()).unwrap(),
            RaSummary {
                cur_hop_limit: 255,
                managed: true,
                other: false,
                router_lifetime_s: 9000,
                reachable_time_ms: 0,
                retrans_time_ms: 0,
                source_link_layer_addr: Some(GW_MAC),
                mtu: Some(8500),
                prefix_info: None,
            }
        );
        // Checked against the addresses it travelled with.
        let all_nodes: Ipv6Addr = "ff02::1".parse().unwrap();
        assert_eq!(
            RaSummary::decode(&b, gw(), all_nodes),
            Err(WireError::Malformed("icmpv6 checksum"))
        );
        let rs = unhex(RS_HEX);
        let all_routers: Ipv6Addr = "ff02::2".parse().unwrap();
        let e = RaSummary::decode(&rs, guest(), all_routers).unwrap_err();
        assert!(e.to_string().contains("router solicitation"), "{e}");
        for cut in 0..b.len() {
            assert!(RaSummary::decode(&b[..cut], gw(), guest()).is_err());
        }
    }

    #[test]
    fn router_solicit_parses() {
        let b = unhex(RS_HEX);
        let all_routers: Ipv6Addr = "ff02::2".parse().unwrap();
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(
            Repr::parse(&p, guest(), all_routers).unwrap(),
            Repr::RouterSolicit {
                lladdr: Some(GUEST_MAC)
            }
        );
    }

    #[test]
    fn neighbor_messages_round_trip() {
        let sn: Ipv6Addr = "ff02::1:ff00:1".parse().unwrap();
        for r in [
            Repr::NeighborSolicit {
                target_addr: gw(),
                lladdr: Some(GUEST_MAC),
            },
            Repr::NeighborAdvert {
                router: true,
                solicited: true,
                override_: true,
                target_addr: gw(),
                lladdr: Some(GW_MAC),
            },
            Repr::RouterAdvert {
                hop_limit: 64,
                managed: false,
                other: true,
                router_lifetime: 0,
                reachable_time: 30000,
                retrans_time: 1000,
                lladdr: None,
                mtu: None,
                prefix_info: Some(PrefixInfo {
                    prefix_len: 64,
                    on_link: true,
                    autonomous: false,
                    valid_lifetime: u32::MAX,
                    preferred_lifetime: 7,
                    prefix: "fd00:1::".parse().unwrap(),
                }),
            },
        ] {
            let mut buf = vec![0u8; r.buffer_len()];
            r.emit(&mut Packet::new_unchecked(&mut buf[..]), guest(), sn)
                .unwrap();
            let p = Packet::new_checked(&buf[..]).unwrap();
            assert_eq!(Repr::parse(&p, guest(), sn).unwrap(), r, "{r}");
        }
    }

    #[test]
    fn malformed_options_are_refused() {
        let all_routers: Ipv6Addr = "ff02::2".parse().unwrap();
        let reparse = |mut b: Vec<u8>| {
            icmpv6::fill_checksum(guest(), all_routers, &mut b);
            let p = Packet::new_checked(b).unwrap();
            Repr::parse(&p, guest(), all_routers)
        };
        let mut zero_len = unhex(RS_HEX);
        zero_len[9] = 0;
        assert_eq!(
            reparse(zero_len).unwrap_err(),
            WireError::Malformed("ndp option length 0")
        );
        let mut overrun = unhex(RS_HEX);
        overrun[9] = 2;
        assert_eq!(reparse(overrun).unwrap_err(), WireError::Truncated);
        // An unknown option is skipped.
        let mut unknown = unhex(RS_HEX);
        unknown.extend_from_slice(&[200, 1, 0, 0, 0, 0, 0, 0]);
        assert!(reparse(unknown).is_ok());
        // A bad checksum or a nonzero code is refused.
        let mut b = unhex(RS_HEX);
        b[2] ^= 0xff;
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(
            Repr::parse(&p, guest(), all_routers).unwrap_err(),
            WireError::Malformed("icmpv6 checksum")
        );
        let mut b = unhex(RS_HEX);
        b[1] = 1;
        assert_eq!(reparse(b).unwrap_err(), WireError::Malformed("ndp code"));
    }

    #[test]
    fn short_and_foreign_buffers_are_refused() {
        assert_eq!(
            Packet::new_checked(&[134u8; 15][..]).unwrap_err(),
            WireError::Truncated
        );
        assert_eq!(
            Packet::new_checked(&[128u8; 30][..]).unwrap_err(),
            WireError::Unsupported("ndp message type")
        );
        assert_eq!(
            Packet::new_checked(&[][..]).unwrap_err(),
            WireError::Truncated
        );
    }
}
