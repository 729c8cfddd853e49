//! DSCP and ECN across the tunnel, end to end (docs/operating.md, "DSCP and ECN
//! across the tunnel"): the outer traffic class tshark reads on the switch carries
//! the guest's DSCP and ECN field, or the sled's fixed class; and a switch that
//! marks CE on a share of the ECN-capable underlay frames slows a guest's TCP with
//! marks both guests see, not with losses. This kernel has no AQM qdisc (no
//! fq_codel, red or codel), so the congested switch is an nftables rule on the
//! bridge that rewrites the outer ECN field of every Nth ECT(0) Geneve frame.

use e2e::capture::{Capture, Frame};
use e2e::guest::Guest;
use e2e::standard::{self, A1, B1};
use e2e::{Error, Rack, Result};
use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

const EF_ECT0: u8 = (46 << 2) | 0b10;
const AF41_ECT1: u8 = (34 << 2) | 0b01;
/// The class `--outer-dscp cs1` puts on the outer header (CS1 = 8), before ECN.
const CS1: u8 = 8 << 2;
/// One frame in this many ECT(0) Geneve frames is marked CE by the switch.
const MARK_EVERY: u32 = 20;

fn xfer_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_e2e-xfer"))
}

/// Pings `to` from `from` three times with traffic class `tclass` (`ping -Q`).
fn ping_with_class(from: &Guest, to: IpAddr, tclass: u8) -> Result<()> {
    let family = if to.is_ipv4() { "-4" } else { "-6" };
    from.run(
        "ping",
        &[
            family,
            "-c",
            "3",
            "-i",
            "0.2",
            "-W",
            "5",
            "-Q",
            &format!("{tclass:#x}"),
            &to.to_string(),
        ],
    )
    .map(drop)
}

/// (outer traffic class, inner traffic class) of every captured Geneve frame whose
/// inner source is `src`.
fn classes(frames: &[Frame], src: IpAddr) -> Vec<(u8, u8)> {
    frames
        .iter()
        .filter(|f| f.is_geneve() && f.has_src(src))
        .map(|f| {
            let inner = match src {
                IpAddr::V4(_) => f.ipv4_tos.first(),
                IpAddr::V6(_) => f.ipv6_tclass.get(1),
            };
            (f.ipv6_tclass[0], inner.copied().unwrap_or(0))
        })
        .collect()
}

/// Pings b1 from a1 in both families with EF/ECT(0) and AF41/ECT(1), captured on
/// the switch: the outer and inner traffic classes of a1's requests.
fn classes_on_the_wire(rack: &Rack) -> Result<[Vec<(u8, u8)>; 2]> {
    let (a1, b1) = (rack.guest(A1)?, rack.guest(B1)?);
    let sled0 = rack.sled(0)?;
    let file = rack.dir().join("dscp.pcap");
    let cap = Capture::start(&rack.switch, &sled0.bridge_port, &file, "udp port 6081")?;
    ping_with_class(a1, b1.ipv4()?, EF_ECT0)?;
    ping_with_class(a1, b1.ipv6()?, AF41_ECT1)?;
    let frames = cap.stop()?;
    Ok([classes(&frames, a1.ipv4()?), classes(&frames, a1.ipv6()?)])
}

#[test]
fn the_outer_header_carries_the_guests_dscp_and_ecn() -> Result<()> {
    let rack = standard::rack("e2e", &[])?;
    let [v4, v6] = classes_on_the_wire(&rack)?;
    assert_eq!(
        v4,
        [(EF_ECT0, EF_ECT0); 3],
        "IPv4 EF/ECT(0): (outer, inner)"
    );
    assert_eq!(v6, [(AF41_ECT1, AF41_ECT1); 3], "IPv6 AF41/ECT(1)");
    Ok(())
}

#[test]
fn a_fixed_outer_dscp_replaces_the_guests_and_keeps_its_ecn() -> Result<()> {
    let rack = standard::rack("e2e", &["--outer-dscp", "cs1"])?;
    let [v4, v6] = classes_on_the_wire(&rack)?;
    // The guest's packet itself keeps its own class.
    assert_eq!(v4, [(CS1 | 0b10, EF_ECT0); 3]);
    assert_eq!(v6, [(CS1 | 0b01, AF41_ECT1); 3]);
    Ok(())
}

/// Counter `name` of group `group` (`TcpExt`, `IpExt`, `Tcp`) of the guest's
/// network namespace, from /proc/net/netstat and /proc/net/snmp (a header line of
/// names followed by a line of values, per group).
fn netstat(g: &Guest, group: &str, name: &str) -> Result<u64> {
    let text = g.run("cat", &["/proc/net/netstat", "/proc/net/snmp"])?;
    let prefix = format!("{group}:");
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with(&prefix)).collect();
    for pair in lines.chunks(2) {
        let [names, values] = pair else { continue };
        let names = names.split_whitespace().skip(1);
        if let Some((_, v)) = names
            .zip(values.split_whitespace().skip(1))
            .find(|(n, _)| *n == name)
        {
            return v
                .parse()
                .map_err(|_| Error::new(format!("{group} {name} = {v:?}")));
        }
    }
    Err(Error::new(format!("no {group} {name} in /proc/net")))
}

/// The counters the ECN test reads, of guest `g`.
fn tcp_counters(g: &Guest) -> Result<[u64; 4]> {
    Ok([
        netstat(g, "IpExt", "InCEPkts")?,
        netstat(g, "TcpExt", "TCPDeliveredCE")?,
        netstat(g, "Tcp", "OutSegs")?,
        netstat(g, "Tcp", "RetransSegs")?,
    ])
}

#[test]
fn a_switchs_congestion_marks_reach_the_guests_tcp_instead_of_losses() -> Result<()> {
    let rack = standard::rack("e2e", &[])?;
    let (a1, b1) = (rack.guest(A1)?, rack.guest(B1)?);
    for g in [a1, b1] {
        g.ns.sysctl("net.ipv4.tcp_ecn", "1")?;
    }
    rack.switch
        .run("nft", &["add", "table", "bridge", "congested"])?;
    rack.switch.run(
        "nft",
        &["add chain bridge congested forward { type filter hook forward priority 0 ; }"],
    )?;
    let rule = format!(
        "add rule bridge congested forward ip6 nexthdr udp udp dport 6081 ip6 ecn ect0 \
         numgen inc mod {MARK_EVERY} 0 ip6 ecn set ce counter"
    );
    rack.switch.run("nft", &[rule.as_str()])?;
    let (before_a, before_b) = (tcp_counters(a1)?, tcp_counters(b1)?);
    let report = e2e::xfer::transfer(
        xfer_bin(),
        a1,
        b1,
        b1.ipv4()?,
        5301,
        64 << 20,
        Duration::from_secs(300),
    )?;
    let (after_a, after_b) = (tcp_counters(a1)?, tcp_counters(b1)?);
    let delta = |a: [u64; 4], b: [u64; 4], i: usize| b[i] - a[i];
    let ce_in = delta(before_b, after_b, 0);
    let delivered_ce = delta(before_a, after_a, 1);
    let (out_segs, retrans) = (delta(before_a, after_a, 2), delta(before_a, after_a, 3));
    let marked_by_switch = rack
        .switch
        .run("nft", &["list", "table", "bridge", "congested"])?;
    let carried = rack.sled(1)?.counter(Some(B1), "ecn_ce_marked")?;
    let not_ect = rack.sled(1)?.counter(Some(B1), "ecn_ce_not_ect")?;
    eprintln!(
        "64 MiB a1 -> b1 with every {MARK_EVERY}th ECT(0) underlay frame marked CE: {report:?}; \
         b1 received {ce_in} CE packets (sled 1 carried {carried} marks in), a1 saw \
         {delivered_ce} delivered CE, sent {out_segs} segments of which {retrans} \
         retransmitted; switch: {}",
        marked_by_switch
            .lines()
            .find(|l| l.contains("counter"))
            .unwrap_or("?")
            .trim()
    );
    assert!(
        carried > 0,
        "sled 1 carried no CE mark into the inner packets"
    );
    assert!(ce_in > 0, "the receiving guest saw no CE-marked packet");
    assert!(
        delivered_ce > 0,
        "the sending guest's TCP saw no ECE for its marks"
    );
    assert_eq!(
        not_ect, 0,
        "a mark on a Not-ECT packet: the guests' ECN was not copied"
    );
    // Marks, not losses, told the sender to slow down: retransmissions stay a
    // small fraction of what it sent.
    assert!(
        retrans * 100 <= out_segs.max(1000),
        "{retrans} of {out_segs} segments retransmitted"
    );
    Ok(())
}
