//! `handle_from_guest` and `packet_too_big` against scapy-built frames: each request
//! frame from testdata/vectors.txt must produce exactly the expected reply bytes.

use super::test_util::*;
use super::vectors::vector;
use super::*;
use crate::frames::output::{TxBatch, TxDest};

/// Feeds vector `req` through the gateway; returns the verdict and the batch.
fn run(cfg: &PortConfig, st: &mut GatewayState, req: &[u8]) -> (GatewayVerdict, TxBatch<'static>) {
    let mut out = TxBatch::new();
    let v = handle_from_guest(cfg, st, PORT, &meta_of(req), req, 1_000, &mut out);
    (v, out)
}

/// Asserts that `req` is answered with exactly one frame equal to vector `reply`.
fn assert_reply(cfg: &PortConfig, req: &str, reply: &str) -> GatewayState {
    let mut st = GatewayState::new(0);
    let (v, out) = run(cfg, &mut st, &unhex(&vector(req)));
    assert_eq!(v, GatewayVerdict::Replied, "{req}");
    assert_eq!(out.len(), 1, "{req}");
    let (dest, f) = out.frame(0).unwrap();
    assert_eq!(dest, frame::to_guest(PORT));
    assert_eq!(hex(f), vector(reply), "{req} -> {reply}");
    st
}

fn deny(cfg: &PortConfig, req: &[u8]) -> &'static str {
    let mut st = GatewayState::new(0);
    let (v, out) = run(cfg, &mut st, req);
    assert!(out.is_empty());
    match v {
        GatewayVerdict::Deny(r) => {
            // The reason names a counter that was bumped.
            let c = counter_map(st.counters());
            assert_eq!(c.get(r.name()), Some(&1), "{r} in {c:?}");
            r.name()
        }
        v => panic!("expected a deny, got {v:?}"),
    }
}

/// The counters as name -> value. They are flat u64 fields, so their Debug output
/// gives the field names without a serde_json dev-dependency.
fn counter_map(c: &GatewayCounters) -> std::collections::BTreeMap<String, u64> {
    let dbg = format!("{c:?}");
    let mut m = std::collections::BTreeMap::new();
    for part in dbg
        .trim_start_matches("GatewayCounters {")
        .trim_end_matches('}')
        .split(',')
    {
        if let Some((k, v)) = part.split_once(':') {
            m.insert(k.trim().to_string(), v.trim().parse().unwrap());
        }
    }
    m
}

#[test]
fn rs_gets_unicast_ra_with_port_mtu() {
    let st = assert_reply(&sample(), "rs_req", "ra_solicited_8500");
    assert_eq!(st.counters().ra_solicited, 1);
    let info = ra_info(&sample(), &st).unwrap();
    assert_eq!(info.last_sent_ns, Some(1_000));
    assert_eq!(info.solicited_sent, 1);
}

#[test]
fn rs_from_unspecified_gets_ra_to_all_nodes() {
    assert_reply(&sample(), "rs_unspec_req", "ra_to_all_nodes_8500");
}

#[test]
fn invalid_rs_is_denied() {
    let good = unhex(&vector("rs_req"));
    // Hop limit 64 (off-link).
    let mut b = good.clone();
    b[14 + 7] = 64;
    assert_eq!(deny(&sample(), &b), "rs_invalid");
    // Bad checksum.
    let mut b = good.clone();
    b[14 + 40 + 2] ^= 1;
    assert_eq!(deny(&sample(), &b), "rs_invalid");
    // From a global address.
    let mut b = good.clone();
    b[14 + 8] = 0xfd;
    assert_eq!(deny(&sample(), &b), "rs_invalid");
    // Option length 0.
    let mut b = good;
    b[14 + 40 + 9] = 0;
    assert_eq!(deny(&sample(), &b), "rs_invalid");
}

#[test]
fn ns_for_gateway_gets_na() {
    let st = assert_reply(&sample(), "ns_req", "na");
    assert_eq!(st.counters().na_sent, 1);
    assert_reply(&sample(), "ns_dad_req", "na_dad");
}

#[test]
fn ns_for_other_targets_and_other_ndp_are_denied() {
    let mut b = unhex(&vector("ns_req"));
    // Target the guest's own link-local (its DAD/NUD for itself); fix the checksum.
    b[14 + 40 + 8 + 15] = 0x02;
    let (src, dst) = (
        "fe80::aa40:25ff:feff:1".parse().unwrap(),
        "ff02::1:ff00:1".parse().unwrap(),
    );
    wire::icmpv6::fill_checksum(src, dst, &mut b[54..]);
    assert_eq!(deny(&sample(), &b), "ns_not_gateway");
    // An RA from the guest.
    let mut ra = unhex(&vector("ra_solicited_8500"));
    ra[6..12].copy_from_slice(&sample().guest_mac.0);
    assert_eq!(deny(&sample(), &ra), "denied_ndp");
}

#[test]
fn arp_for_gateway_gets_reply_other_arp_denied() {
    let st = assert_reply(&sample(), "arp_req", "arp_reply");
    assert_eq!(st.counters().arp_replies, 1);
    // Gratuitous ARP for the guest's own address.
    let mut b = unhex(&vector("arp_req"));
    b[14 + 27] = 5;
    assert_eq!(deny(&sample(), &b), "denied_arp");
    // Truncated.
    let b = unhex(&vector("arp_req"));
    assert_eq!(deny(&sample(), &b[..30]), "arp_malformed");
    // From another MAC.
    let mut b = unhex(&vector("arp_req"));
    b[11] = 9;
    assert_eq!(deny(&sample(), &b), "src_mac_not_guest");
}

#[test]
fn arp_from_an_address_the_port_allows_out_is_answered() {
    let mut b = unhex(&vector("arp_req"));
    b[28..32].copy_from_slice(&[192, 168, 50, 7]);
    assert_eq!(deny(&sample(), &b), "denied_arp");
    let mut cfg = sample();
    cfg.cidrs.outbound.push("192.168.50.0/24".parse().unwrap());
    let mut st = GatewayState::new(0);
    let mut out = TxBatch::new();
    let v = handle_from_guest(&cfg, &mut st, PORT, &meta_of(&b), &b, 0, &mut out);
    assert_eq!(v, GatewayVerdict::Replied);
    assert_eq!(st.counters().arp_replies, 1);
    // Allowed in only is not enough.
    let mut cfg = sample();
    cfg.cidrs.inbound.push("192.168.50.0/24".parse().unwrap());
    assert_eq!(deny(&cfg, &b), "denied_arp");
}

#[test]
fn echo_to_gateway_is_answered() {
    let st = assert_reply(&sample(), "echo4_req", "echo4_reply");
    assert_eq!(st.counters().echo_replies, 1);
    assert_reply(&sample(), "echo6_req", "echo6_reply");
    let mut b = unhex(&vector("echo6_req"));
    b[60] ^= 1;
    assert_eq!(deny(&sample(), &b), "echo_malformed");
}

#[test]
fn traffic_not_for_the_gateway_passes() {
    let cfg = sample();
    let mut st = GatewayState::new(0);
    for v in ["big4_req", "big6_req"] {
        let (verdict, out) = run(&cfg, &mut st, &unhex(&vector(v)));
        assert_eq!(verdict, GatewayVerdict::NotForGateway, "{v}");
        assert!(out.is_empty());
    }
}

#[test]
fn packet_too_big_matches_scapy() {
    let cfg = sample();
    for (req, reply) in [("big6_req", "ptb6"), ("big4_req", "fragneeded4")] {
        let mut st = GatewayState::new(0);
        let mut out = TxBatch::new();
        let f = unhex(&vector(req));
        assert!(packet_too_big(
            &cfg,
            &mut st,
            PORT,
            &meta_of(&f),
            &f,
            1500,
            0,
            &mut out
        ));
        assert_eq!(hex(out.frame(0).unwrap().1), vector(reply), "{req}");
        assert!(out.frame(0).unwrap().1.len() - 14 <= 1280);
        assert_eq!(st.counters().ptb_sent, 1);
    }
}

#[test]
fn packet_too_big_is_rate_limited_and_suppressed() {
    let cfg = sample();
    let mut st = GatewayState::new(0);
    let mut out = TxBatch::new();
    let f = unhex(&vector("big6_req"));
    let m = meta_of(&f);
    let sent = (0..50)
        .filter(|_| packet_too_big(&cfg, &mut st, PORT, &m, &f, 1500, 0, &mut out))
        .count() as u64;
    assert_eq!(sent, limit::PTB.burst);
    assert_eq!(st.counters().ptb_rate_limited, 50 - limit::PTB.burst);
    // IPv4 without DF: fragmented by the caller, no error.
    let mut f4 = unhex(&vector("big4_req"));
    f4[14 + 6] = 0;
    let mut st = GatewayState::new(0);
    assert!(!packet_too_big(
        &cfg,
        &mut st,
        PORT,
        &meta_of(&f4),
        &f4,
        1500,
        0,
        &mut out
    ));
    // About an ICMPv6 error.
    let ptb = unhex(&vector("ptb6"));
    assert!(!packet_too_big(
        &cfg,
        &mut st,
        PORT,
        &meta_of(&ptb),
        &ptb,
        1280,
        0,
        &mut out
    ));
    assert_eq!(st.counters().ptb_suppressed, 2);
}

const NS_PER_S: u64 = 1_000_000_000;

/// Feeds `req` `n` times at `now`; returns how many were answered (one frame each).
fn flood(st: &mut GatewayState, req: &[u8], n: usize, now: u64) -> usize {
    let cfg = sample();
    let mut out = TxBatch::new();
    let mut replied = 0;
    for _ in 0..n {
        let before = out.len();
        match handle_from_guest(&cfg, st, PORT, &meta_of(req), req, now, &mut out) {
            GatewayVerdict::Replied => {
                assert_eq!(out.len(), before + 1);
                replied += 1;
            }
            v => {
                assert!(matches!(v, GatewayVerdict::Deny(_)), "{v:?}");
                assert_eq!(out.len(), before, "a refused reply leaves no frame");
            }
        }
    }
    replied
}

#[test]
fn arp_and_echo_floods_are_limited_separately() {
    let arp = unhex(&vector("arp_req"));
    let echo = unhex(&vector("echo4_req"));
    let burst = limit::REPLY.burst as usize;
    let mut st = GatewayState::new(0);
    assert_eq!(flood(&mut st, &arp, 100, 0), burst);
    // The echo bucket is untouched by the ARP flood.
    assert_eq!(flood(&mut st, &echo, 100, 0), burst);
    let c = st.counters();
    assert_eq!((c.arp_replies, c.arp_rate_limited), (20, 80));
    assert_eq!((c.echo_replies, c.echo_rate_limited), (20, 80));
    // 100 ms later: 10 tokens (100/s) each.
    assert_eq!(flood(&mut st, &arp, 100, NS_PER_S / 10), 10);
    assert_eq!(flood(&mut st, &echo, 100, NS_PER_S / 10), 10);
    // A flood sustained for 2 s gets the rate, not more.
    let mut answered = 0;
    for ms in (110..2110).step_by(10) {
        answered += flood(&mut st, &echo, 5, ms * NS_PER_S / 1000);
    }
    assert_eq!(answered, 200);
    // A rate-limited request also counts as the port's drop under its name.
    let mut st = GatewayState::new(0);
    flood(&mut st, &arp, burst, 0);
    let mut out = TxBatch::new();
    let v = handle_from_guest(&sample(), &mut st, PORT, &meta_of(&arp), &arp, 0, &mut out);
    assert_eq!(v, GatewayVerdict::Deny(crate::DropReason::ArpRateLimited));
}

#[test]
fn dhcp_and_na_floods_are_limited() {
    let cfg = dhcp_cfg();
    let discover = unhex(&vector("dhcp4_discover_req"));
    let solicit = unhex(&vector("dhcp6_solicit_rapid_req"));
    let ns = unhex(&vector("ns_req"));
    let mut st = GatewayState::new(0);
    let mut out = TxBatch::new();
    let mut verdicts = Vec::new();
    for f in [&discover, &solicit].iter().cycle().take(30) {
        let m = meta_of(f);
        verdicts.push(handle_from_guest(&cfg, &mut st, PORT, &m, f, 0, &mut out));
    }
    // DHCPv4 and DHCPv6 share one bucket.
    let replied = verdicts
        .iter()
        .filter(|v| **v == GatewayVerdict::Replied)
        .count();
    assert_eq!(replied, 20);
    assert_eq!(out.len(), 20);
    assert_eq!(st.counters().dhcp_rate_limited, 10);
    assert_eq!(flood(&mut st, &ns, 30, 0), 20);
    assert_eq!(st.counters().na_rate_limited, 10);
}

#[test]
fn rs_flood_is_answered_once_per_min_delay_between_ras() {
    let cfg = sample();
    let rs = unhex(&vector("rs_req"));
    let mut st = GatewayState::new(0);
    let mut out = TxBatch::new();
    // The initial unsolicited RAs (0, 1, 3 s) are done by 10 s.
    for s in 0..10 {
        tick(&cfg, &mut st, PORT, s * NS_PER_S, &mut out);
    }
    assert_eq!(out.len(), 3);
    out.clear();
    // An RS every 10 ms and a tick every 100 ms, for 30 s.
    let mut sent_at = Vec::new();
    let mut requests = 0;
    for ms in (10_000..40_000u64).step_by(10) {
        let now = ms * NS_PER_S / 1000;
        let before = out.len();
        let _ = handle_from_guest(&cfg, &mut st, PORT, &meta_of(&rs), &rs, now, &mut out);
        requests += 1;
        if ms % 100 == 0 {
            tick(&cfg, &mut st, PORT, now, &mut out);
        }
        sent_at.extend((before..out.len()).map(|_| ms));
    }
    // One RA every 3 s, each answering the solicitation that arrived as the 3 s ran
    // out; all the others are counted.
    let expected: Vec<u64> = (0..10).map(|i| 10_000 + i * 3_000).collect();
    assert_eq!(sent_at, expected);
    assert_eq!(hex(out.frame(0).unwrap().1), vector("ra_solicited_8500"));
    let c = st.counters();
    assert_eq!(c.ra_solicited, 10);
    assert_eq!(c.rs_rate_limited, requests - 10);
    // A solicitation turned away and not repeated is answered by an RA to all nodes
    // once the 3 s are over.
    out.clear();
    let t = 50 * NS_PER_S;
    assert_eq!(flood(&mut st, &rs, 1, t), 1);
    assert_eq!(flood(&mut st, &rs, 1, t + NS_PER_S), 0);
    tick(&cfg, &mut st, PORT, t + 3 * NS_PER_S - 1, &mut out);
    assert!(out.is_empty());
    tick(&cfg, &mut st, PORT, t + 3 * NS_PER_S, &mut out);
    assert_eq!(hex(out.frame(0).unwrap().1), vector("ra_unsolicited_8500"));
    // That RA answered it: nothing more is due before the periodic schedule.
    tick(&cfg, &mut st, PORT, t + 10 * NS_PER_S, &mut out);
    assert_eq!(out.len(), 1);
}

#[test]
fn fragments_reassemble_to_the_original() {
    let mut f = unhex(&vector("big4_req"));
    f[14 + 6] = 0; // clear DF
                   // Fix the header checksum after the flag change.
    f[24..26].fill(0);
    let c = wire::checksum::checksum(&f[14..34]);
    f[24..26].copy_from_slice(&c.to_be_bytes());
    let m = meta_of(&f);
    let mut out = TxBatch::new();
    let dest = TxDest::Underlay { ifindex: 1 };
    let n = fragment_ipv4(&m, &f, 1500, dest, &mut out).unwrap();
    assert_eq!(n, 6); // 7980 payload bytes / 1480 per fragment
    let mut payload = vec![0u8; 7980];
    let mut seen = 0;
    for (i, (d, fr)) in out.to_vecs(&[]).unwrap().into_iter().enumerate() {
        assert_eq!(d, dest);
        assert!(fr.len() - 14 <= 1500);
        assert_eq!(&fr[..14], &f[..14]);
        let ip = &fr[14..];
        assert_eq!(wire::checksum::checksum(&ip[..20]), 0);
        let fo = u16::from_be_bytes([ip[6], ip[7]]);
        assert_eq!(fo & 0x2000 != 0, i + 1 < n, "MF only on non-last fragments");
        let off = usize::from(fo & 0x1fff) * 8;
        let len = usize::from(u16::from_be_bytes([ip[2], ip[3]])) - 20;
        payload[off..off + len].copy_from_slice(&ip[20..20 + len]);
        seen += len;
        assert_eq!(&ip[4..6], &[0x12, 0x34], "same identification");
    }
    assert_eq!(seen, 7980);
    assert_eq!(payload, f[34..]);
    // DF set: refused.
    let f = unhex(&vector("big4_req"));
    assert_eq!(
        fragment_ipv4(&meta_of(&f), &f, 1500, dest, &mut out),
        Err(crate::DropReason::DontFragment)
    );
}

#[test]
fn arbitrary_bytes_never_panic() {
    use proptest::prelude::*;
    let cfg = sample();
    let reqs: Vec<Vec<u8>> = [
        "rs_req",
        "ns_req",
        "arp_req",
        "echo4_req",
        "echo6_req",
        "dhcp4_request_req",
        "dhcp6_solicit_rapid_req",
        "dhcp6_request_req",
    ]
    .iter()
    .map(|n| unhex(&vector(n)))
    .collect();
    proptest!(|(which in 0..reqs.len(), idx in any::<prop::sample::Index>(), byte in any::<u8>(), cut in any::<prop::sample::Index>())| {
        let mut f = reqs[which].clone();
        let i = idx.index(f.len());
        let m = meta_of(&f);
        f[i] = byte;
        let keep = cut.index(f.len()).max(14);
        // Metadata from the intact frame over corrupted/truncated bytes: the gateway
        // must cope with disagreements without panicking.
        let mut st = GatewayState::new(0);
        let mut out = TxBatch::new();
        let _ = handle_from_guest(&cfg, &mut st, PORT, &m, &f[..keep], 0, &mut out);
        let _ = packet_too_big(&cfg, &mut st, PORT, &m, &f[..keep], 1280, 0, &mut out);
        let _ = fragment_ipv4(&m, &f[..keep], 576, TxDest::Underlay { ifindex: 1 }, &mut out);
    });
}

/// The sample port with the DHCP settings gen_vectors.py uses.
fn dhcp_cfg() -> PortConfig {
    let mut c = sample();
    c.dns_servers4 = vec!["45.55.68.2".parse().unwrap(), "8.8.8.8".parse().unwrap()];
    c.dns_servers6 = vec!["2001:4860:4860::8888".parse().unwrap()];
    c.hostname = Some("db01".into());
    c.domain = Some("oxide.internal".into());
    c.domain_search = vec!["eng.oxide.internal".into(), "oxide.internal".into()];
    c
}

#[test]
fn dhcp4_offer_ack_nak_match_scapy() {
    let cfg = dhcp_cfg();
    assert_reply(&cfg, "dhcp4_discover_req", "dhcp4_offer");
    let st = assert_reply(&cfg, "dhcp4_request_req", "dhcp4_ack");
    assert_eq!(st.counters().dhcp4_replies, 1);
    let st = assert_reply(&cfg, "dhcp4_request_wrong_req", "dhcp4_nak");
    assert_eq!(st.counters().dhcp4_naks, 1);
}

#[test]
fn dhcp4_ack_carries_port_mtu_option_26() {
    let mut cfg = dhcp_cfg();
    cfg.mtu = 1500;
    let mut st = GatewayState::new(0);
    let (_, out) = run(&cfg, &mut st, &unhex(&vector("dhcp4_request_req")));
    let f = out.frame(0).unwrap().1;
    let p = wire::dhcpv4::Packet::new_checked(&f[42..]).unwrap();
    let r = wire::dhcpv4::Repr::parse(&p).unwrap();
    assert_eq!(r.interface_mtu, Some(1500));
    assert_eq!(r.message_type, wire::dhcpv4::MessageType::Ack);
}

/// Without a search list both servers offer the port's domain as the list; with
/// one, the list (scapy's vectors check its encoding).
#[test]
fn search_list_falls_back_to_the_domain() {
    let mut cfg = dhcp_cfg();
    cfg.domain_search.clear();
    let mut st = GatewayState::new(0);
    let (_, out) = run(&cfg, &mut st, &unhex(&vector("dhcp4_request_req")));
    let f = out.frame(0).unwrap().1;
    let opts: Vec<_> = wire::dhcpv4::options(&f[42 + wire::dhcpv4::HEADER_LEN..])
        .map(|o| o.unwrap())
        .collect();
    let search = opts
        .iter()
        .find(|o| o.code == wire::dhcpv4::opt::DOMAIN_SEARCH)
        .unwrap();
    assert_eq!(
        wire::dns::parse_names(search.data).unwrap(),
        ["oxide.internal"]
    );
    let (_, out) = run(&cfg, &mut st, &unhex(&vector("dhcp6_request_req")));
    let f = out.frame(0).unwrap().1;
    let opts: Vec<_> = wire::dhcpv6::options(&f[62 + wire::dhcpv6::HEADER_LEN..])
        .map(|o| o.unwrap())
        .collect();
    let list = opts
        .iter()
        .find(|o| o.code == wire::dhcpv6::opt::DOMAIN_LIST)
        .unwrap();
    assert_eq!(
        wire::dns::parse_names(list.data).unwrap(),
        ["oxide.internal"]
    );
}

#[test]
fn dhcp4_from_ipv6_only_port_or_other_client_is_denied() {
    let mut cfg = dhcp_cfg();
    cfg.ipv4 = None;
    cfg.gateway_ipv4 = None;
    assert_eq!(
        deny(&cfg, &unhex(&vector("dhcp4_discover_req"))),
        "dhcp4_no_ipv4"
    );
    let mut b = unhex(&vector("dhcp4_discover_req"));
    b[42 + 28 + 5] = 9; // chaddr of another client
    assert_eq!(deny(&dhcp_cfg(), &b), "dhcp4_ignored");
    let b = unhex(&vector("dhcp4_discover_req"));
    let m = meta_of(&b);
    let mut st = GatewayState::new(0);
    let mut out = TxBatch::new();
    let v = handle_from_guest(&dhcp_cfg(), &mut st, PORT, &m, &b[..250], 0, &mut out);
    assert_eq!(v, GatewayVerdict::Deny(crate::DropReason::Dhcp4Malformed));
}

#[test]
fn dhcp6_solicit_request_match_scapy() {
    let cfg = dhcp_cfg();
    let st = assert_reply(&cfg, "dhcp6_solicit_rapid_req", "dhcp6_reply_rapid");
    assert_eq!(st.counters().dhcp6_replies, 1);
    assert_reply(&cfg, "dhcp6_solicit_req", "dhcp6_advertise");
    assert_reply(&cfg, "dhcp6_request_req", "dhcp6_reply");
}

#[test]
fn dhcp6_for_another_server_is_ignored() {
    let mut b = unhex(&vector("dhcp6_request_req"));
    // Server DUID is at UDP payload + 4 (type, xid) + 14 (client id) + 4 (hdr) + 4.
    let at = 62 + 4 + 14 + 4 + 9;
    b[at] ^= 1;
    assert_eq!(deny(&dhcp_cfg(), &b), "dhcp6_ignored");
}
