//! Two underlay links per sled, per-flow ECMP and failover, end to end: a rack
//! with two switches (bridges), each sled with one link to each and its underlay
//! address on loopback, reached by a multipath route over both links, as routed
//! fabrics do. Parallel TCP flows spread over both links; when switch B loses
//! its ports (both sleds' second link loses carrier) mid-transfer, the flows move
//! to switch A and every transfer completes intact, and they spread again when
//! it is back. When switch B silently stops forwarding to one sled (its link
//! stays up), the path watch's probes find it and take the path out of use.

use e2e::counters::Snapshot;
use e2e::guest::{GuestSpec, PingLog, Pings};
use e2e::rack::{Rack, RackSpec, UNDERLAY_IF, UNDERLAY_MTU};
use e2e::{poll_until, Cmd, Error, Result};
use serde_json::Value;
use std::net::{IpAddr, Ipv6Addr};
use std::path::Path;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

/// The second switch's bridge, and each sled's link to it.
const BRIDGE_B: &str = "br1";
const LINK_B: &str = "ul1";

/// Parallel TCP flows from a1 (sled 0) to b1 (sled 1).
const FLOWS: u16 = 16;

/// Ping streams (each its own ICMP id, so its own flow hash) that time the gap.
const PINGS: usize = 8;

fn xfer_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_e2e-xfer"))
}

/// Sled `i`'s address on the link to switch `switch` (0: A, 1: B).
fn link_addr(switch: u16, i: usize) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0xa0 + switch, 0, 0, 0, 0, 0, i as u16 + 1)
}

/// Adds switch B (a second bridge in the switch namespace) and each sled's link
/// to it; moves each sled's underlay address to loopback, gives each link an
/// address of its own and routes the other sled's underlay address over both
/// links (a multipath route).
fn second_switch(rack: &Rack) -> Result<()> {
    let sw = &rack.switch;
    let mtu = UNDERLAY_MTU.to_string();
    sw.ip(&["link", "add", BRIDGE_B, "mtu", &mtu, "type", "bridge"])?;
    sw.ip(&[
        "link",
        "set",
        BRIDGE_B,
        "type",
        "bridge",
        "mcast_snooping",
        "0",
    ])?;
    sw.ip(&["link", "set", BRIDGE_B, "up"])?;
    for s in &rack.sleds {
        let port = switch_b_port(s.index);
        Cmd::new("ip")
            .args(["link", "add", LINK_B, "netns", s.ns.name(), "mtu", &mtu])
            .args(["type", "veth", "peer", "name", &port])
            .args(["netns", sw.name(), "mtu", &mtu])
            .run()?;
        sw.ip(&["link", "set", &port, "master", BRIDGE_B, "up"])?;
        s.ns.ip(&["link", "set", LINK_B, "up"])?;
        // Fixed MACs: a next hop's identity (link and MAC) is part of the
        // choice, so fixed ones make the spread the same in every run.
        for (switch, dev) in [(0, UNDERLAY_IF), (1, LINK_B)] {
            let mac = format!("02:00:00:00:{:02x}:{:02x}", s.index, switch);
            s.ns.ip(&["link", "set", dev, "address", &mac])?;
        }
        let addr = s.addr.to_string();
        s.ns.ip(&[
            "-6",
            "addr",
            "del",
            &format!("{addr}/64"),
            "dev",
            UNDERLAY_IF,
        ])?;
        s.ns.ip(&["-6", "addr", "add", &format!("{addr}/128"), "dev", "lo"])?;
        for (switch, dev) in [(0, UNDERLAY_IF), (1, LINK_B)] {
            let a = format!("{}/64", link_addr(switch, s.index));
            s.ns.ip(&["-6", "addr", "add", &a, "dev", dev, "nodad"])?;
        }
    }
    for s in &rack.sleds {
        for peer in rack.sleds.iter().filter(|p| p.index != s.index) {
            let (via_a, via_b) = (link_addr(0, peer.index), link_addr(1, peer.index));
            s.ns.ip(&[
                "-6",
                "route",
                "add",
                &format!("{}/128", peer.addr),
                "nexthop",
                "via",
                &via_a.to_string(),
                "dev",
                UNDERLAY_IF,
                "nexthop",
                "via",
                &via_b.to_string(),
                "dev",
                LINK_B,
            ])?;
            // Both neighbours known before the first flow: its next hops are
            // resolved as a pair, not one then the other.
            for via in [via_a, via_b] {
                poll_until(
                    &format!("sled {} to reach {via}", s.index),
                    Duration::from_secs(10),
                    || {
                        s.ns.run("ping", &["-6", "-c", "1", "-W", "1", &via.to_string()])
                    },
                )?;
            }
        }
    }
    Ok(())
}

/// Sled `i`'s port on switch B (its port on switch A is `s{i}`).
fn switch_b_port(i: usize) -> String {
    format!("t{i}")
}

/// Frames switch port `port` received (from the sled behind it).
fn port_rx_frames(rack: &Rack, port: &str) -> Result<u64> {
    let text = rack.switch.run(
        "cat",
        &[&format!("/sys/class/net/{port}/statistics/rx_packets")],
    )?;
    text.trim()
        .parse()
        .map_err(|_| Error::new(format!("rx_packets of {port}: {text:?}")))
}

/// Frames sled 0 sent through switch A and switch B so far.
fn sled0_frames(rack: &Rack) -> Result<(u64, u64)> {
    Ok((
        port_rx_frames(rack, "s0")?,
        port_rx_frames(rack, &switch_b_port(0))?,
    ))
}

/// Sled 0's `stats` entry of underlay link `name`.
fn link_stats(rack: &Rack, name: &str) -> Result<Value> {
    sled_link_stats(rack, 0, name)
}

/// Sled `sled`'s `stats` entry of underlay link `name`.
fn sled_link_stats(rack: &Rack, sled: usize, name: &str) -> Result<Value> {
    let v: Value = serde_json::from_str(&rack.sled(sled)?.admin(&["--json", "stats"])?)
        .map_err(|e| Error::new(format!("stats is not JSON: {e}")))?;
    v["data"]["underlay"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|l| l["name"] == name)
        .cloned()
        .ok_or_else(|| Error::new(format!("no underlay link {name} in stats: {v}")))
}

/// Frames and super-frames a link's `stats` entry says the daemon sent.
fn link_sent(link: &Value) -> u64 {
    link["tx_frames"].as_u64().unwrap_or(0) + link["tx_super_frames"].as_u64().unwrap_or(0)
}

/// Runs [`FLOWS`] checked transfers of `bytes` each from a1 to b1 at once, each
/// its own TCP connection (to ports `base`, `base + 1`, ...); `during` runs
/// meanwhile, after `after`, told how many transfers have completed so far.
fn parallel_transfers(
    rack: &Rack,
    to: IpAddr,
    base: u16,
    bytes: u64,
    after: Duration,
    during: impl FnOnce(&AtomicU16) -> Result<()>,
) -> Result<()> {
    let (a1, b1) = (rack.guest("a1")?, rack.guest("b1")?);
    let done = AtomicU16::new(0);
    std::thread::scope(|scope| {
        let flows: Vec<_> = (0..FLOWS)
            .map(|i| {
                let done = &done;
                scope.spawn(move || {
                    let r = e2e::xfer::transfer(
                        xfer_bin(),
                        a1,
                        b1,
                        to,
                        base + i,
                        bytes,
                        Duration::from_secs(60),
                    );
                    done.fetch_add(1, Ordering::Relaxed);
                    r
                })
            })
            .collect();
        std::thread::sleep(after);
        let during = during(&done);
        for (i, f) in flows.into_iter().enumerate() {
            f.join()
                .map_err(|_| Error::new(format!("transfer {i} panicked")))?
                .map_err(|e| e.context(format!("transfer {i}")))?;
        }
        during
    })
}

/// The longest time without a reply of any ping stream, from `from` on, in
/// milliseconds.
fn longest_gap_ms(logs: &[PingLog], from: f64) -> f64 {
    logs.iter()
        .filter_map(|l| l.longest_gap(from))
        .map(|(a, b)| (b.1 - a.1) * 1000.0)
        .fold(0.0, f64::max)
}

/// The two-switch rack (named `name`) with guests a1 (sled 0) and b1 (sled 1),
/// the daemons running on both links, and b1's address once a1 reaches it.
fn two_switch_rack(name: &str) -> Result<(Rack, IpAddr)> {
    let mut rack = Rack::build(&RackSpec::new(name, 2))?;
    second_switch(&rack)?;
    rack.start_daemons(&["--underlay", LINK_B])?;
    for spec in [GuestSpec::dual("a1", 0, 1), GuestSpec::dual("b1", 1, 3)] {
        rack.add_guest(spec)?;
    }
    rack.publish_v2p()?;
    // Every connection from the one source port, to a port of its own: the 16
    // flows (and so their spread) are the same in every run. (With random
    // source ports, 16 flows put 5-11 on a link, 30-70% of the frames, in 92%
    // of runs: a binomial spread, checked over 1000 flows by the unit tests.)
    rack.guest("a1")?
        .ns
        .sysctl("net.ipv4.ip_local_port_range", "40000 40000")?;
    let to = rack.guest("b1")?.ipv4()?;
    rack.guest("a1")?.ping(to, 56, Duration::from_secs(20))?;
    Ok((rack, to))
}

/// Starts [`PINGS`] ping streams from a1 to `to`, one every 10 ms each.
fn start_pings(rack: &Rack, to: IpAddr, name: &str) -> Result<Vec<Pings>> {
    let a1 = rack.guest("a1")?;
    (0..PINGS)
        .map(|i| {
            let out = rack.dir().join(format!("{name}{i}.txt"));
            a1.start_pings(to, Duration::from_millis(10), &out)
        })
        .collect()
}

/// Seconds since the Unix epoch, the clock of the ping logs.
fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

#[test]
fn flows_spread_over_two_links_and_fail_over_when_one_goes() -> Result<()> {
    let (rack, to) = two_switch_rack("ecmp")?;

    // 16 flows over two links: each carries 30-70% of sled 0's frames.
    let before = sled0_frames(&rack)?;
    parallel_transfers(&rack, to, 7000, 8 << 20, Duration::ZERO, |_| Ok(()))?;
    let after = sled0_frames(&rack)?;
    let (on_a, on_b) = (after.0 - before.0, after.1 - before.1);
    let share_a = on_a as f64 * 100.0 / (on_a + on_b).max(1) as f64;
    let (ul0, ul1) = (link_stats(&rack, UNDERLAY_IF)?, link_stats(&rack, LINK_B)?);
    eprintln!(
        "ecmp: {FLOWS} flows, frames via switch A {on_a}, via switch B {on_b} \
         ({share_a:.1}% / {:.1}%); daemon per link: {UNDERLAY_IF} tx_frames {} \
         tx_super_frames {}, {LINK_B} tx_frames {} tx_super_frames {}",
        100.0 - share_a,
        ul0["tx_frames"],
        ul0["tx_super_frames"],
        ul1["tx_frames"],
        ul1["tx_super_frames"],
    );
    assert!(
        (30.0..=70.0).contains(&share_a),
        "switch A carried {share_a:.1}% of the frames"
    );
    for l in [&ul0, &ul1] {
        assert!(
            link_sent(l) > 0,
            "a link the daemon sent nothing through: {l}"
        );
    }

    // Switch B loses both sleds' ports mid-transfer (both sleds' LINK_B loses
    // carrier): every flow moves to switch A, every transfer completes intact;
    // then it comes back and the flows spread again.
    let pings = start_pings(&rack, to, "pings")?;
    let mut down_at = 0.0;
    let changes_before = link_stats(&rack, LINK_B)?["in_use_changes"]
        .as_u64()
        .unwrap_or(0);
    parallel_transfers(
        &rack,
        to,
        7100,
        24 << 20,
        Duration::from_millis(300),
        |done| {
            down_at = unix_now();
            for s in &rack.sleds {
                rack.switch
                    .ip(&["link", "set", &switch_b_port(s.index), "down"])?;
            }
            let t = Instant::now();
            let done_at_down = done.load(Ordering::Relaxed);
            // The daemon stops sending into the dead link at once: what it sent
            // through it 200 ms after is all it sends until it is back.
            std::thread::sleep(Duration::from_millis(200));
            let sent_then = link_sent(&link_stats(&rack, LINK_B)?);
            std::thread::sleep(Duration::from_millis(1300));
            let sent_later = link_sent(&link_stats(&rack, LINK_B)?);
            for s in &rack.sleds {
                rack.switch
                    .ip(&["link", "set", &switch_b_port(s.index), "up"])?;
            }
            let done_at_up = done.load(Ordering::Relaxed);
            eprintln!(
                "ecmp: switch B down for {:?}; transfers done when it went {done_at_down}, \
             when it came back {done_at_up} of {FLOWS}",
                t.elapsed()
            );
            if done_at_down == FLOWS {
                return Err(Error::new("every transfer ended before switch B went down"));
            }
            if sent_later == sent_then {
                Ok(())
            } else {
                Err(Error::new(format!(
                    "sled 0 kept sending into {LINK_B} while it was down: {} frames",
                    sent_later - sent_then
                )))
            }
        },
    )?;
    let logs: Vec<PingLog> = pings.into_iter().map(Pings::stop).collect::<Result<_>>()?;
    let gap = longest_gap_ms(&logs, down_at);
    let lost: u64 = logs.iter().map(PingLog::lost).sum();
    eprintln!("ecmp: failover gap {gap:.0} ms (longest of {PINGS} ping streams every 10 ms), {lost} pings lost");
    poll_until(
        "sled 0 to count switch B's link going and coming back",
        Duration::from_secs(10),
        || {
            let l = link_stats(&rack, LINK_B)?;
            match (l["in_use"].as_bool(), l["in_use_changes"].as_u64()) {
                (Some(true), Some(n)) if n >= changes_before + 2 => Ok(()),
                _ => Err(Error::new(format!("{l}"))),
            }
        },
    )?;
    assert!(gap < 1000.0, "the longest gap was {gap:.0} ms");
    // Switch B's next hop is usable once its neighbour is learnt again (the
    // link's return only starts that): the transfers below are short, and all
    // of them could end on switch A before it is.
    poll_until(
        "sled 0 to resolve both next hops again",
        Duration::from_secs(10),
        || {
            let s = Snapshot::take(rack.sled(0)?)?;
            let (entries, paths) = (s.get("next_hops.entries"), s.get("next_hops.paths"));
            match entries > 0 && paths == 2 * entries {
                true => Ok(()),
                false => Err(Error::new(format!(
                    "{paths} next hops for {entries} destinations"
                ))),
            }
        },
    )?;

    // Back on both links: new flows use switch B again.
    let before = sled0_frames(&rack)?;
    parallel_transfers(&rack, to, 7200, 4 << 20, Duration::ZERO, |_| Ok(()))?;
    let after = sled0_frames(&rack)?;
    let on_b = after.1 - before.1;
    assert!(
        on_b > (after.0 - before.0) / 5,
        "switch B unused after it came back: {on_b} frames"
    );
    Ok(())
}

/// nftables table in the switch namespace that makes switch B drop what it
/// forwards to sled 1 (its link stays up).
const DROP_TABLE: &str = "silent";

/// Sled 0's count of paths out of use through switch B's link.
fn paths_down_b(rack: &Rack) -> Result<u64> {
    let l = link_stats(rack, LINK_B)?;
    l["paths_down"]
        .as_u64()
        .ok_or_else(|| Error::new(format!("no paths_down in {l}")))
}

/// Polls until sled 0's paths down through switch B's link number `want`;
/// returns how long that took.
fn until_paths_down(rack: &Rack, want: u64, within: Duration) -> Result<Duration> {
    let t = Instant::now();
    poll_until(
        &format!("sled 0 to have {want} paths out of use through {LINK_B}"),
        within,
        || match paths_down_b(rack)? {
            n if n == want => Ok(()),
            n => Err(Error::new(format!("{n} paths down"))),
        },
    )?;
    Ok(t.elapsed())
}

#[test]
fn a_path_that_silently_drops_is_taken_out_of_use() -> Result<()> {
    let (rack, to) = two_switch_rack("ecmpsd")?;
    assert_eq!(paths_down_b(&rack)?, 0);
    let sw = &rack.switch;
    sw.run("nft", &["add", "table", "bridge", DROP_TABLE])?;
    let chain = format!(
        "add chain bridge {DROP_TABLE} forward {{ type filter hook forward priority 0 ; }}"
    );
    sw.run("nft", &[chain.as_str()])?;
    let pings = start_pings(&rack, to, "silent")?;
    let mut drop_at = 0.0;
    let mut detected = Duration::ZERO;
    let mut back = Duration::ZERO;
    // Switch B stops forwarding to sled 1 mid-transfer, its link up: sled 0's
    // path through it must be found by its probes and left, every transfer
    // completing intact; then switch B forwards again and the path is back.
    parallel_transfers(
        &rack,
        to,
        7300,
        32 << 20,
        Duration::from_millis(300),
        |done| {
            let rule = format!(
                "add rule bridge {DROP_TABLE} forward oifname {} counter drop",
                switch_b_port(1)
            );
            drop_at = unix_now();
            sw.run("nft", &[rule.as_str()])?;
            let done_at_drop = done.load(Ordering::Relaxed);
            detected = until_paths_down(&rack, 1, Duration::from_secs(10))?;
            // Out of use: sled 0 sends nothing more through switch B (sled 1 is its
            // only peer).
            std::thread::sleep(Duration::from_millis(200));
            let sent_then = link_sent(&link_stats(&rack, LINK_B)?);
            std::thread::sleep(Duration::from_millis(1000));
            let sent_later = link_sent(&link_stats(&rack, LINK_B)?);
            sw.run("nft", &["flush", "chain", "bridge", DROP_TABLE, "forward"])?;
            back = until_paths_down(&rack, 0, Duration::from_secs(10))?;
            eprintln!(
                "ecmp: silent drop found after {} ms; transfers done when it began \
             {done_at_drop} of {FLOWS}",
                detected.as_millis()
            );
            if done_at_drop == FLOWS {
                return Err(Error::new("every transfer ended before switch B dropped"));
            }
            if sent_later != sent_then {
                return Err(Error::new(format!(
                    "sled 0 kept sending into {LINK_B} after its path was out of use: {} frames",
                    sent_later - sent_then
                )));
            }
            Ok(())
        },
    )?;
    let logs: Vec<PingLog> = pings.into_iter().map(Pings::stop).collect::<Result<_>>()?;
    let gap = longest_gap_ms(&logs, drop_at);
    let lost: u64 = logs.iter().map(PingLog::lost).sum();
    let events = link_stats(&rack, LINK_B)?["path_down_events"].as_u64();
    // Sled 1 sends through switch B unharmed, but its probes' replies from sled
    // 0 may come back through the dropping port: it may take paths out of use
    // too (reported, not asserted: its flows keep a working path either way).
    let far: Vec<Value> = [UNDERLAY_IF, LINK_B]
        .iter()
        .map(|l| sled_link_stats(&rack, 1, l).map(|v| v["path_down_events"].clone()))
        .collect::<Result<_>>()?;
    eprintln!(
        "ecmp: silent-drop gap {gap:.0} ms (longest of {PINGS} ping streams every 10 ms), \
         {lost} pings lost; path back {} ms after the drop ended; sled 0 \
         path_down_events {events:?}; sled 1 path_down_events {UNDERLAY_IF} {} {LINK_B} {}",
        back.as_millis(),
        far[0],
        far[1]
    );
    assert!(
        detected < Duration::from_secs(5),
        "the silent drop took {detected:?} to find"
    );
    assert!(gap < 5000.0, "the longest gap was {gap:.0} ms");
    // At least the one change (more only if a busy machine delayed replies
    // past half an interval three times in a row: reported above).
    assert!(events >= Some(1), "path_down_events {events:?}");
    let log = rack.sled(0)?.daemon()?.log();
    for line in [
        "underlay path lost its probes",
        "underlay path answers probes again",
    ] {
        assert!(log.contains(line), "no log line {line:?} in sled 0's log");
    }
    Ok(())
}
