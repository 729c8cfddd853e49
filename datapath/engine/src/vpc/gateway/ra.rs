//! Router Advertisements: the RA the gateway sends (solicited and unsolicited), its
//! timers, and its decoded form for the admin tool.
//!
//! The RA is what the reference sends: from fe80::EUI-64(gateway MAC), IPv6 hop limit
//! 255, cur hop limit 255, M=1 O=0 (addresses come from DHCPv6), router lifetime
//! 9000 s, reachable 0, retrans 0, options source link-layer address (gateway MAC) and
//! MTU (the port MTU), no prefix information. Unlike the reference we also send
//! unsolicited RAs (RFC 4861 §6.2.4), so a guest that never solicits, or solicited
//! before the port was up, still learns the MTU, and an MTU change reaches it.

use super::frame::{self, ALL_NODES};
use super::{GatewayState, Sent};
use crate::frames::output::TxBatch;
use crate::ids::PortId;
use crate::vpc::port::PortConfig;
use std::net::Ipv6Addr;
use wire::ndp::{self, RaSummary};
use wire::MacAddr;

/// RA header values (RFC 4861 §4.2), as the reference sends them.
pub(super) const CUR_HOP_LIMIT: u8 = 255;
pub(super) const ROUTER_LIFETIME_S: u16 = 9000;
/// NDP messages are sent and accepted only with IPv6 hop limit 255 (RFC 4861 §6.1).
pub(super) const NDP_HOP_LIMIT: u8 = 255;

/// RFC 4861 §10 router constants.
pub const MAX_INITIAL_RTR_ADVERTISEMENTS: u8 = 3;
/// The RFC's upper bound for the initial intervals; ours are shorter (below).
pub const MAX_INITIAL_RTR_ADVERT_INTERVAL_NS: u64 = 16 * NS_PER_S;
/// Intervals after the 1st and 2nd initial RA: short, so a booting guest learns the
/// MTU within seconds, and within the RFC's "at most 16 s".
const INITIAL_INTERVALS_NS: [u64; 2] = [NS_PER_S, 2 * NS_PER_S];
/// MaxRtrAdvInterval: the RFC default (600 s), well under the 9000 s lifetime.
pub const MAX_RTR_ADV_INTERVAL_NS: u64 = 600 * NS_PER_S;
/// MinRtrAdvInterval: the RFC default 0.33 * MaxRtrAdvInterval.
pub const MIN_RTR_ADV_INTERVAL_NS: u64 = 198 * NS_PER_S;
/// MIN_DELAY_BETWEEN_RAS: the shortest time between two RAs that answer
/// solicitations (RFC 4861 §6.2.6).
pub const MIN_DELAY_BETWEEN_RAS_NS: u64 = 3 * NS_PER_S;

const NS_PER_S: u64 = 1_000_000_000;

/// Ethernet/IPv6 framing plus the RA body: 14 + 40 + 16 + 8 (SLLA) + 8 (MTU).
const RA_FRAME_LEN: usize = frame::ETH_LEN + frame::IPV6_LEN + 32;

/// The RA timer and what was last sent.
#[derive(Clone, Debug)]
pub(super) struct RaTimer {
    /// Initial (fast) RAs sent since the port came up or the MTU changed.
    initial_sent: u8,
    next_due_ns: u64,
    last_sent_ns: Option<u64>,
    /// MTU carried by the last RA sent (of any kind).
    last_mtu: Option<u16>,
    /// When an RA to all nodes answers the solicitations [`Self::may_answer_rs`]
    /// turned away; cleared by any RA sent.
    answer_due_ns: Option<u64>,
    /// xorshift state; 0 until seeded from the port's MACs on first use, because the
    /// state is created before the config is at hand and the engine has no RNG.
    rng: u64,
}

impl RaTimer {
    pub(super) fn new(now: u64) -> Self {
        RaTimer {
            initial_sent: 0,
            next_due_ns: now,
            last_sent_ns: None,
            last_mtu: None,
            answer_due_ns: None,
            rng: 0,
        }
    }

    pub(super) fn solicited_sent(&mut self, now: u64, mtu: u16) {
        self.last_sent_ns = Some(now);
        self.last_mtu = Some(mtu);
        self.answer_due_ns = None;
    }

    /// Whether a Router Solicitation may be answered at `now`: not within
    /// [`MIN_DELAY_BETWEEN_RAS_NS`] of the last RA (solicited or not). A solicitation
    /// that may not is answered by an RA to all nodes at the end of that interval
    /// (RFC 4861 §6.2.6), unless another RA goes out first: a flood of solicitations
    /// gets one RA every 3 s, and a guest that asked still hears one.
    pub(super) fn may_answer_rs(&mut self, now: u64) -> bool {
        match self.last_sent_ns {
            Some(last) if now.saturating_sub(last) < MIN_DELAY_BETWEEN_RAS_NS => {
                self.answer_due_ns = Some(last.saturating_add(MIN_DELAY_BETWEEN_RAS_NS));
                false
            }
            _ => true,
        }
    }

    /// When the next RA to all nodes is due: the periodic one, or an earlier answer
    /// to solicitations.
    fn due_ns(&self) -> u64 {
        self.answer_due_ns
            .map_or(self.next_due_ns, |a| a.min(self.next_due_ns))
    }

    /// Seeds from both MACs (splitmix64 finaliser) so that ports on one sled, which
    /// start at the same time, spread their RAs instead of firing together.
    fn next_random(&mut self, cfg: &PortConfig) -> u64 {
        if self.rng == 0 {
            let mut z = u64::from_be_bytes([
                0,
                0,
                cfg.guest_mac.0[0],
                cfg.guest_mac.0[1],
                cfg.guest_mac.0[2],
                cfg.guest_mac.0[3],
                cfg.guest_mac.0[4],
                cfg.guest_mac.0[5],
            ]) ^ u64::from_be_bytes([
                cfg.gateway_mac.0[0],
                cfg.gateway_mac.0[1],
                cfg.gateway_mac.0[2],
                cfg.gateway_mac.0[3],
                cfg.gateway_mac.0[4],
                cfg.gateway_mac.0[5],
                0,
                0,
            ]);
            z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            // xorshift must never hold 0.
            self.rng = z | 1;
        }
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        x
    }

    /// Schedules the next unsolicited RA after one was sent at `now`.
    fn schedule_after_send(&mut self, cfg: &PortConfig, now: u64) {
        self.last_sent_ns = Some(now);
        self.last_mtu = Some(cfg.mtu);
        self.answer_due_ns = None;
        let interval = if self.initial_sent < MAX_INITIAL_RTR_ADVERTISEMENTS {
            // initial_sent is 1 or 2 here (0 never: a send precedes this).
            let i = usize::from(self.initial_sent.saturating_sub(1));
            INITIAL_INTERVALS_NS
                .get(i)
                .copied()
                .unwrap_or(MAX_INITIAL_RTR_ADVERT_INTERVAL_NS)
        } else {
            let span = MAX_RTR_ADV_INTERVAL_NS - MIN_RTR_ADV_INTERVAL_NS + 1;
            MIN_RTR_ADV_INTERVAL_NS + self.next_random(cfg) % span
        };
        self.next_due_ns = now.saturating_add(interval);
    }
}

/// The RA for a port, as an NDP representation.
pub(super) fn ra_repr(cfg: &PortConfig) -> ndp::Repr {
    ndp::Repr::RouterAdvert {
        hop_limit: CUR_HOP_LIMIT,
        managed: true,
        other: false,
        router_lifetime: ROUTER_LIFETIME_S,
        reachable_time: 0,
        retrans_time: 0,
        lladdr: Some(cfg.gateway_mac),
        mtu: Some(u32::from(cfg.mtu)),
        prefix_info: None,
    }
}

/// Appends an RA from the gateway to `dst_mac`/`dst_ip`.
pub(super) fn emit_ra(
    cfg: &PortConfig,
    port: PortId,
    dst_mac: MacAddr,
    dst_ip: Ipv6Addr,
    out: &mut TxBatch,
) {
    let src = cfg.gateway_ipv6();
    let buf = frame::push_to_guest(out, port, RA_FRAME_LEN);
    write_ra(cfg, dst_mac, dst_ip, src, buf);
}

/// Writes the whole RA frame into `buf` (exactly `RA_FRAME_LEN` bytes).
fn write_ra(cfg: &PortConfig, dst_mac: MacAddr, dst_ip: Ipv6Addr, src: Ipv6Addr, buf: &mut [u8]) {
    let repr = ra_repr(cfg);
    let body_len = repr.buffer_len();
    debug_assert_eq!(frame::ETH_LEN + frame::IPV6_LEN + body_len, buf.len());
    frame::eth(buf, dst_mac, cfg.gateway_mac, frame::ETHERTYPE_IPV6);
    frame::ipv6(
        &mut buf[frame::ETH_LEN..],
        src,
        dst_ip,
        frame::PROTO_ICMPV6,
        body_len,
        NDP_HOP_LIMIT,
    );
    let body = &mut buf[frame::ETH_LEN + frame::IPV6_LEN..];
    // The body is sized from the same repr, so emit cannot fail.
    let _ = repr.emit(&mut ndp::Packet::new_unchecked(body), src, dst_ip);
}

/// Answers a validated Router Solicitation: unicast back to the soliciting guest, or
/// to all nodes when it came from the unspecified address (RFC 4861 §6.2.6).
pub(super) fn answer_rs(
    cfg: &PortConfig,
    port: PortId,
    rs_src_mac: MacAddr,
    rs_src: Ipv6Addr,
    out: &mut TxBatch,
) -> Sent {
    if rs_src.is_unspecified() {
        emit_ra(
            cfg,
            port,
            MacAddr::from_ipv6_multicast(&ALL_NODES),
            ALL_NODES,
            out,
        );
    } else {
        emit_ra(cfg, port, rs_src_mac, rs_src, out);
    }
    Sent::SolicitedRa
}

/// Timers: unsolicited RAs to ff02::1 — the first three at 0 s, 1 s and 3 s after the
/// port came up (RFC 4861 §6.2.4 allows up to MAX_INITIAL_RTR_ADVERTISEMENTS at
/// intervals of at most 16 s), then every MinRtrAdvInterval..MaxRtrAdvInterval
/// (198..600 s), randomised; earlier when solicitations were turned away by the
/// rate limit (`RaTimer::may_answer_rs`). Only for ports with IPv6.
pub fn tick(cfg: &PortConfig, st: &mut GatewayState, port: PortId, now: u64, out: &mut TxBatch) {
    if cfg.ipv6.is_none() || now < st.ra.due_ns() {
        return;
    }
    send_unsolicited(cfg, st, port, now, out);
    st.counters.ra_unsolicited += 1;
}

fn send_unsolicited(
    cfg: &PortConfig,
    st: &mut GatewayState,
    port: PortId,
    now: u64,
    out: &mut TxBatch,
) {
    emit_ra(
        cfg,
        port,
        MacAddr::from_ipv6_multicast(&ALL_NODES),
        ALL_NODES,
        out,
    );
    st.ra.initial_sent = st.ra.initial_sent.saturating_add(1);
    st.ra.schedule_after_send(cfg, now);
}

/// The port's MTU changed (`cfg` holds the new one): send an RA to all nodes now, and
/// restart the initial fast sequence so a guest that misses this one hears another
/// within seconds (RFC 4861 §6.2.4 allows this when advertised values change).
pub fn on_mtu_change(
    cfg: &PortConfig,
    st: &mut GatewayState,
    port: PortId,
    now: u64,
    out: &mut TxBatch,
) {
    if cfg.ipv6.is_none() {
        return;
    }
    st.ra.initial_sent = 0;
    send_unsolicited(cfg, st, port, now, out);
    st.counters.ra_mtu_change += 1;
}

/// Every field of the RA this port sends, decoded from the bytes it would put on the
/// wire (so the admin tool shows what the guest receives, not what we meant), plus
/// the timer state.
#[derive(serde::Serialize, Clone, Debug, PartialEq, Eq)]
pub struct RaInfo {
    pub source_mac: MacAddr,
    pub source: Ipv6Addr,
    /// Destination of unsolicited RAs; solicited ones go back to the soliciting guest.
    pub unsolicited_destination: Ipv6Addr,
    pub ip_hop_limit: u8,
    /// The RA's own fields, decoded by the same code as `xdeadm ra listen` uses.
    #[serde(flatten)]
    pub ra: RaSummary,
    /// MTU carried by the last RA actually sent (differs from `mtu` only between an
    /// MTU change and the RA it triggers).
    pub last_sent_mtu: Option<u16>,
    pub last_sent_ns: Option<u64>,
    pub solicited_sent: u64,
    pub unsolicited_sent: u64,
    pub mtu_change_sent: u64,
    pub next_unsolicited_due_ns: u64,
    pub min_interval_s: u64,
    pub max_interval_s: u64,
}

/// The RA this port sends, decoded; `None` for IPv4-only ports (they send no RAs).
pub fn ra_info(cfg: &PortConfig, st: &GatewayState) -> Option<RaInfo> {
    cfg.ipv6?;
    let src = cfg.gateway_ipv6();
    let mut buf = [0u8; RA_FRAME_LEN];
    let dst_mac = MacAddr::from_ipv6_multicast(&ALL_NODES);
    write_ra(cfg, dst_mac, ALL_NODES, src, &mut buf);
    let ip = &buf[frame::ETH_LEN..frame::ETH_LEN + frame::IPV6_LEN];
    let body = &buf[frame::ETH_LEN + frame::IPV6_LEN..];
    let ra = RaSummary::decode(body, src, ALL_NODES).ok()?;
    let mut smac = [0u8; 6];
    smac.copy_from_slice(&buf[6..12]);
    let mut sip = [0u8; 16];
    sip.copy_from_slice(&ip[8..24]);
    Some(RaInfo {
        source_mac: MacAddr(smac),
        source: Ipv6Addr::from(sip),
        unsolicited_destination: ALL_NODES,
        ip_hop_limit: ip[7],
        ra,
        last_sent_mtu: st.ra.last_mtu,
        last_sent_ns: st.ra.last_sent_ns,
        solicited_sent: st.counters.ra_solicited,
        unsolicited_sent: st.counters.ra_unsolicited,
        mtu_change_sent: st.counters.ra_mtu_change,
        next_unsolicited_due_ns: st.ra.due_ns(),
        min_interval_s: MIN_RTR_ADV_INTERVAL_NS / NS_PER_S,
        max_interval_s: MAX_RTR_ADV_INTERVAL_NS / NS_PER_S,
    })
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::super::vectors::vector;
    use super::*;

    #[test]
    fn unsolicited_ras_match_scapy_for_each_mtu() {
        for mtu in [1500u16, 8500, 8922] {
            let mut cfg = sample();
            cfg.mtu = mtu;
            let mut st = GatewayState::new(0);
            let mut out = TxBatch::new();
            tick(&cfg, &mut st, PORT, 0, &mut out);
            assert_eq!(out.len(), 1);
            let (dest, f) = out.frame(0).unwrap();
            assert_eq!(dest, frame::to_guest(PORT));
            assert_eq!(hex(f), vector(&format!("ra_unsolicited_{mtu}")));
        }
    }

    #[test]
    fn initial_then_randomised_schedule() {
        let cfg = sample();
        let t0 = 5 * NS_PER_S;
        let mut st = GatewayState::new(t0);
        let mut out = TxBatch::new();
        let mut sent_at = vec![];
        // Walk time in 100 ms steps for 2 hours.
        let mut now = t0;
        while now < t0 + 7200 * NS_PER_S {
            let before = out.len();
            tick(&cfg, &mut st, PORT, now, &mut out);
            if out.len() > before {
                sent_at.push(now - t0);
            }
            now += NS_PER_S / 10;
        }
        assert_eq!(&sent_at[..3], &[0, NS_PER_S, 3 * NS_PER_S]);
        let gaps: Vec<u64> = sent_at.windows(2).skip(2).map(|w| w[1] - w[0]).collect();
        assert!(gaps.len() >= 11, "{gaps:?}");
        for g in &gaps {
            // 100 ms tick granularity may delay a send by one step.
            assert!(
                (MIN_RTR_ADV_INTERVAL_NS..=MAX_RTR_ADV_INTERVAL_NS + NS_PER_S / 10).contains(g),
                "{g}"
            );
        }
        // Randomised: not all the same.
        assert!(gaps.iter().any(|g| *g != gaps[0]));
        assert_eq!(st.counters().ra_unsolicited as usize, sent_at.len());
    }

    #[test]
    fn ipv4_only_ports_send_no_ras() {
        let mut cfg = sample();
        cfg.ipv6 = None;
        cfg.vpc_subnet6 = None;
        let mut st = GatewayState::new(0);
        let mut out = TxBatch::new();
        tick(&cfg, &mut st, PORT, 0, &mut out);
        on_mtu_change(&cfg, &mut st, PORT, 0, &mut out);
        assert!(out.is_empty());
        assert!(ra_info(&cfg, &st).is_none());
    }

    #[test]
    fn mtu_change_sends_now_and_restarts_fast_sequence() {
        let mut cfg = sample();
        let mut st = GatewayState::new(0);
        let mut out = TxBatch::new();
        // Past the initial sequence.
        for s in [0, 1, 3] {
            tick(&cfg, &mut st, PORT, s * NS_PER_S, &mut out);
        }
        assert_eq!(out.len(), 3);
        let later = 100 * NS_PER_S;
        tick(&cfg, &mut st, PORT, later, &mut out);
        assert_eq!(out.len(), 3, "no RA before MinRtrAdvInterval");
        cfg.mtu = 1500;
        on_mtu_change(&cfg, &mut st, PORT, later, &mut out);
        assert_eq!(out.len(), 4);
        assert_eq!(hex(out.frame(3).unwrap().1), vector("ra_unsolicited_1500"));
        tick(&cfg, &mut st, PORT, later + NS_PER_S, &mut out);
        assert_eq!(out.len(), 5, "fast follow-up 1 s after the change");
        let info = ra_info(&cfg, &st).unwrap();
        assert_eq!(info.last_sent_mtu, Some(1500));
        assert_eq!(info.ra.mtu, Some(1500));
        assert_eq!(info.mtu_change_sent, 1);
        assert_eq!(info.unsolicited_sent, 4);
    }

    #[test]
    fn ra_info_decodes_the_wire_ra() {
        let cfg = sample();
        let st = GatewayState::new(7);
        let i = ra_info(&cfg, &st).unwrap();
        assert_eq!(i.source.to_string(), "fe80::aa40:25ff:fe00:1");
        assert_eq!(i.source_mac, cfg.gateway_mac);
        assert_eq!(i.ip_hop_limit, 255);
        assert_eq!(i.ra.cur_hop_limit, 255);
        assert!(i.ra.managed && !i.ra.other);
        assert_eq!(i.ra.router_lifetime_s, 9000);
        assert_eq!((i.ra.reachable_time_ms, i.ra.retrans_time_ms), (0, 0));
        assert_eq!(i.ra.source_link_layer_addr, Some(cfg.gateway_mac));
        assert_eq!(i.ra.mtu, Some(8500));
        assert_eq!(i.ra.prefix_info, None);
        assert_eq!(i.last_sent_ns, None);
        assert_eq!(i.next_unsolicited_due_ns, 7);
    }
}
