//! VPC policy through the daemons (docs/operating.md, "Firewall rules" and "Port
//! states"): a `vni=` host admits its VPC's traffic and nothing else (neither
//! another VPC's filter nor traffic from outside the VPC); ICMP rules by type let
//! Packet Too Big through where echo is denied; a rule removed by its id
//! (`remove-fw-rule PORT ID`, as `list-fw-rules` shows it) stops applying at once;
//! a paused port drops both ways, keeps its connections for `resume-port`, and stays
//! paused across a daemon restart.

use e2e::capture::Capture;
use e2e::counters::Snapshot;
use e2e::frames::{ethernet, fill_l4_checksum, ipv6_header};
use e2e::inject::{parse_mac, RawSocket};
use e2e::rack::Sled;
use e2e::standard::{self, A1, B1};
use e2e::{Error, Guest, Result};
use serde_json::Value;
use std::net::{IpAddr, Ipv6Addr};
use std::path::Path;
use std::time::Duration;

fn xfer_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_e2e-xfer"))
}

const WAIT: Duration = Duration::from_secs(20);
const DENY_IN: &str = "engine.ports.a1.drops.fw_deny_in";

/// `xdeadm --json ARGS` on `sled`: the reply's data.
fn json(sled: &Sled, args: &[&str]) -> Result<Value> {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let out = sled.admin(&all)?;
    let v: Value =
        serde_json::from_str(&out).map_err(|e| Error::new(format!("{args:?}: {e}: {out}")))?;
    Ok(v["data"].clone())
}

/// Replaces a1's firewall rules with `rules` (opteadm's rule lines).
fn set_rules(sled: &Sled, rules: &[&str]) -> Result<()> {
    sled.xdeadm(&["set-fw-rules", "-p", A1])?
        .stdin(rules.join("\n"))
        .run()?;
    Ok(())
}

/// Pings `to` from `from` a few times; true if any reply came back.
fn reaches(from: &Guest, to: IpAddr) -> Result<bool> {
    for _ in 0..3 {
        if from.ping_once(to, 56)?.status.success() {
            return Ok(true);
        }
    }
    Ok(false)
}

fn ipv6_of(g: &Guest) -> Result<Ipv6Addr> {
    match g.ipv6()? {
        IpAddr::V6(a) => Ok(a),
        IpAddr::V4(a) => Err(Error::new(format!("{a} is not IPv6"))),
    }
}

/// An ICMPv6 Packet Too Big (MTU 1400) from `from` to `to`, as `from`'s kernel
/// would hand it to its tap, quoting a UDP datagram `to` sent `from` (no such flow
/// exists: the firewall decides it by its rules, not as a related packet).
fn packet_too_big(from: &Guest, to: &Guest) -> Result<Vec<u8>> {
    let (src, dst) = (ipv6_of(from)?, ipv6_of(to)?);
    let mut quoted = ipv6_header(dst, src, 17, 16);
    quoted.extend_from_slice(&[0x9c, 0x40, 0, 9, 0, 16, 0, 0]);
    quoted.extend_from_slice(&[0x5a; 8]);
    let mut icmp = vec![2, 0, 0, 0];
    icmp.extend_from_slice(&1400u32.to_be_bytes());
    icmp.extend_from_slice(&quoted);
    let mut f = ethernet(
        parse_mac(&from.spec.gateway_mac)?,
        parse_mac(&from.spec.mac)?,
        0x86dd,
    );
    let mut ip = ipv6_header(src, dst, 58, icmp.len());
    ip[7] = 255;
    f.extend_from_slice(&ip);
    f.extend_from_slice(&icmp);
    fill_l4_checksum(&mut f, 14);
    Ok(f)
}

#[test]
fn vpc_hosts_icmp_types_and_rule_ids() -> Result<()> {
    let rack = standard::rack("e2e", &[])?;
    let sled = rack.sled(0)?;
    let (a1, b1) = (rack.guest(A1)?, rack.guest(B1)?);
    let (a1_v4, a1_v6) = (a1.ipv4()?, a1.ipv6()?);
    b1.ping(a1_v4, 56, WAIT)?;

    // 1. A VPC filter: only VPC 20's traffic may come in; b1 (VPC 10) is denied,
    // and counted. Then VPC 10's filter admits it.
    let vpc = b1.spec.vni;
    set_rules(sled, &["dir=in action=allow priority=10 hosts=vni=20"])?;
    let before = Snapshot::take(sled)?;
    assert!(!reaches(b1, a1_v4)?, "vni=20 admitted VPC {vpc}");
    let after = Snapshot::take(sled)?;
    assert!(
        after.get(DENY_IN) > before.get(DENY_IN),
        "fw_deny_in did not grow"
    );
    set_rules(
        sled,
        &[&format!("dir=in action=allow priority=10 hosts=vni={vpc}")],
    )?;
    assert!(reaches(b1, a1_v4)?, "vni={vpc} did not admit its own VPC");
    assert!(reaches(b1, a1_v6)?, "vni={vpc} did not admit its own VPC");

    // 2. ICMP by type: the VPC may come in, but no echo request (ICMP 8, ICMPv6
    // 128), and of ICMPv6 nothing but Packet Too Big (2).
    set_rules(
        sled,
        &[
            "dir=in action=allow priority=65534 hosts=subnet=10.0.0.0/24 protocol=any",
            "dir=in action=allow priority=65534 hosts=subnet=fd00:1::/64 protocol=any",
            "dir=in action=deny priority=20 hosts=any protocol=icmp:8",
            "dir=in action=allow priority=10 hosts=any protocol=icmp6:2/0",
            "dir=in action=deny priority=20 hosts=any protocol=icmp6",
        ],
    )?;
    let rules = json(sled, &["list-fw-rules", "-p", A1])?;
    let id_of = |proto: &str| -> Result<u64> {
        rules
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| {
                let f = &r["filters"];
                let text = match (&f["proto"], &f["icmp"]) {
                    (Value::String(p), Value::Object(i)) => format!("{p}:{}", i["type"]),
                    (Value::String(p), _) => p.clone(),
                    _ => String::new(),
                };
                text == proto && r["action"] == "deny"
            })
            .and_then(|r| r["id"].as_u64())
            .ok_or_else(|| Error::new(format!("no deny rule for {proto} in {rules}")))
    };
    let (echo4, icmp6) = (id_of("icmp:8")?, id_of("icmp6")?);
    assert_ne!(echo4, icmp6);
    // The ids are in the table too.
    let shown = sled.admin(&["list-fw-rules", A1])?;
    assert!(
        shown.contains(&format!("id={echo4} in prio=20 deny host=any proto=icmp:8")),
        "{shown}"
    );
    let before = Snapshot::take(sled)?;
    assert!(!reaches(b1, a1_v4)?, "echo admitted");
    assert!(!reaches(b1, a1_v6)?, "ICMPv6 echo admitted");
    let after = Snapshot::take(sled)?;
    assert!(
        after.get(DENY_IN) >= before.get(DENY_IN) + 2,
        "fw_deny_in grew by {}",
        after.get(DENY_IN) - before.get(DENY_IN)
    );
    // TCP still passes (the rules are about ICMP only).
    e2e::xfer::transfer(xfer_bin(), b1, a1, a1_v4, 5001, 64 << 10, WAIT)?;
    // A Packet Too Big from b1 reaches a1.
    let seen = Capture::start(
        &a1.ns,
        a1.ifname(),
        &rack.dir().join("ptb.pcap"),
        "icmp6 and ip6[40] == 2",
    )?;
    let ptb = packet_too_big(b1, a1)?;
    let tap = RawSocket::open(&b1.ns, b1.ifname())?;
    let b1_v6 = b1.ipv6()?;
    e2e::poll_until("a Packet Too Big from b1 to reach a1", WAIT, || {
        tap.send(&ptb)?;
        let frames = seen.frames_so_far()?;
        if frames.iter().any(|f| f.has_src(b1_v6)) {
            Ok(())
        } else {
            Err(Error::new("no Packet Too Big from b1 reached a1"))
        }
    })?;
    drop(seen);

    // 3. Removing the echo denies by id restores ping at once.
    sled.admin(&["remove-fw-rule", A1, &echo4.to_string()])?;
    sled.admin(&["remove-fw-rule", "-p", A1, &icmp6.to_string()])?;
    assert!(
        reaches(b1, a1_v4)?,
        "echo still denied after remove-fw-rule"
    );
    assert!(
        reaches(b1, a1_v6)?,
        "echo6 still denied after remove-fw-rule"
    );
    // An id is not reused: removing it again names it.
    let o = sled
        .xdeadm(&["remove-fw-rule", A1, &echo4.to_string()])?
        .output()?;
    assert!(!o.status.success(), "removed twice");
    assert!(
        o.stderr.contains(&format!("no firewall rule {echo4}")),
        "{}",
        o.stderr
    );
    Ok(())
}

/// The state `list-ports --json` shows for `port`.
fn port_state(sled: &Sled, port: &str) -> Result<String> {
    let ports = json(sled, &["list-ports"])?;
    ports
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["config"]["name"] == port)
        .and_then(|p| p["state"].as_str())
        .map(str::to_string)
        .ok_or_else(|| Error::new(format!("no state for {port} in {ports}")))
}

/// A port paused for 2 s in the middle of a TCP transfer drops both ways (counted
/// `port_paused`), keeps the connection, and once resumed the transfer completes
/// with every byte intact.
#[test]
fn a_paused_port_resumes_its_tcp_connections() -> Result<()> {
    const BYTES: u64 = 300 << 20;
    const PAUSED: &str = "engine.ports.a1.drops.port_paused";
    let rack = standard::rack("e2e", &[])?;
    let sled = rack.sled(0)?;
    let (a1, b1) = (rack.guest(A1)?, rack.guest(B1)?);
    let a1_v4 = a1.ipv4()?;
    b1.ping(a1_v4, 56, WAIT)?;
    assert_eq!(port_state(sled, A1)?, "running");
    let start = Snapshot::take(sled)?.get("engine.ports.a1.in_bytes");
    std::thread::scope(|s| -> Result<()> {
        let xfer = s.spawn(|| {
            e2e::xfer::transfer(
                xfer_bin(),
                b1,
                a1,
                a1_v4,
                5002,
                BYTES,
                Duration::from_secs(180),
            )
        });
        // Mid-way: once 10 MB have reached a1.
        e2e::poll_until("10 MB of the transfer to reach a1", WAIT, || {
            let got = Snapshot::take(sled)?.get("engine.ports.a1.in_bytes") - start;
            if got >= 10 << 20 {
                Ok(())
            } else {
                Err(Error::new(format!("{got} bytes so far")))
            }
        })?;
        sled.admin(&["pause-port", A1])?;
        let paused_at = Snapshot::take(sled)?;
        assert_eq!(port_state(sled, A1)?, "paused");
        std::thread::sleep(Duration::from_secs(2));
        let before_resume = Snapshot::take(sled)?;
        assert!(
            !xfer.is_finished(),
            "the transfer ended while its receiver's port was paused"
        );
        let dropped = before_resume.get(PAUSED) - paused_at.get(PAUSED);
        assert!(dropped > 0, "nothing counted as port_paused");
        // Nothing was delivered to a1 while paused.
        assert_eq!(
            before_resume.get("engine.ports.a1.in_bytes"),
            paused_at.get("engine.ports.a1.in_bytes"),
        );
        sled.admin(&["resume-port", "-p", A1])?;
        assert_eq!(port_state(sled, A1)?, "running");
        let report = xfer
            .join()
            .map_err(|_| Error::new("the transfer thread panicked"))??;
        assert_eq!(report.bytes, BYTES);
        Ok(())
    })?;
    // The paused port's frames were dropped as paused, not by the firewall.
    let end = Snapshot::take(sled)?;
    assert_eq!(end.get("engine.ports.a1.drops.fw_deny_in"), 0);
    assert_eq!(end.get("engine.ports.a1.drops.tcp_out_of_window"), 0);
    Ok(())
}

/// A port paused when its daemon restarts comes back paused (its pings dropped as
/// `port_paused`) until resumed.
#[test]
fn a_paused_port_stays_paused_across_a_restart() -> Result<()> {
    let mut rack = standard::rack("e2e", &[])?;
    let b1_to_a1 = |rack: &e2e::Rack| -> Result<bool> {
        let (a1, b1) = (rack.guest(A1)?, rack.guest(B1)?);
        reaches(b1, a1.ipv4()?)
    };
    {
        let (a1, b1) = (rack.guest(A1)?, rack.guest(B1)?);
        b1.ping(a1.ipv4()?, 56, WAIT)?;
    }
    rack.sled(0)?.admin(&["pause-port", A1])?;
    assert!(!b1_to_a1(&rack)?, "a paused port answered");
    rack.restart_daemon(0, &[])?;
    let sled = rack.sled(0)?;
    assert_eq!(port_state(sled, A1)?, "paused");
    assert!(!b1_to_a1(&rack)?, "the restored port is not paused");
    let dropped = Snapshot::take(rack.sled(0)?)?.get("engine.ports.a1.drops.port_paused");
    assert!(dropped > 0, "no port_paused drop after the restart");
    rack.sled(0)?.admin(&["resume-port", A1])?;
    let (a1, b1) = (rack.guest(A1)?, rack.guest(B1)?);
    b1.ping(a1.ipv4()?, 56, WAIT)?;
    assert_eq!(port_state(rack.sled(0)?, A1)?, "running");
    Ok(())
}

/// Traffic from outside the VPC (boundary services' frames, with the Geneve
/// External option, to a floating IP) is of no VPC: a `vni=` rule of the port's own
/// VPC does not admit it, a rule for any host does. Boundary services are a rogue
/// host on the switch that the daemons take for them (`--boundary-services`).
#[test]
fn vpc_hosts_do_not_admit_traffic_from_outside_the_vpc() -> Result<()> {
    use e2e::frames::{geneve, geneve_option, inner, Host, Outer, OXIDE_CLASS, OXIDE_EXTERNAL};
    use e2e::inject::{mac_of, Rogue, ROGUE_ADDR, ROGUE_MAC};
    const FLOATING: &str = "203.0.113.10";
    const IN_PACKETS: &str = "engine.ports.a1.in_packets";
    let boundary = ROGUE_ADDR.to_string();
    let rack = standard::rack("e2e", &["--boundary-services", &boundary])?;
    let sled = rack.sled(0)?;
    let a1 = rack.guest(A1)?;
    sled.admin(&["set-external-ips", A1, "--floating-ip", FLOATING])?;
    let rogue = Rogue::join(&rack)?;
    let from_internet = inner(
        Host {
            mac: [2, 0, 0, 0, 0, 0x42],
            ip: "198.51.100.7".parse().map_err(|_| Error::new("address"))?,
        },
        Host {
            mac: parse_mac(&a1.spec.mac)?,
            ip: FLOATING.parse().map_err(|_| Error::new("address"))?,
        },
        e2e::frames::L4::Udp {
            sport: 40000,
            dport: 7777,
        },
        b"from the internet",
    );
    let frame = geneve(
        &Outer {
            src_mac: ROGUE_MAC,
            dst_mac: parse_mac(&mac_of(&sled.ns, e2e::rack::UNDERLAY_IF)?)?,
            src: ROGUE_ADDR,
            dst: sled.addr,
            vni: a1.spec.vni,
        },
        &geneve_option(OXIDE_CLASS, OXIDE_EXTERNAL, &[]),
        &from_internet,
    );
    // Sends the frame until `counter` of a1 grows.
    let send_until = |counter: &str| -> Result<()> {
        let before = Snapshot::take(sled)?.get(counter);
        e2e::poll_until(&format!("{counter} to grow"), WAIT, || {
            rogue.send(&frame)?;
            let now = Snapshot::take(sled)?.get(counter);
            if now > before {
                Ok(())
            } else {
                Err(Error::new(format!("{counter} still {now}")))
            }
        })
    };
    let vpc = a1.spec.vni;
    set_rules(
        sled,
        &[&format!(
            "dir=in action=allow priority=10 hosts=vni={vpc} protocol=UDP port=7777"
        )],
    )?;
    let delivered = Snapshot::take(sled)?.get(IN_PACKETS);
    send_until(DENY_IN)?;
    let after = Snapshot::take(sled)?;
    assert_eq!(after.get(IN_PACKETS), delivered, "vni={vpc} admitted it");
    assert_eq!(after.get("engine.ports.a1.drops.nat_no_mapping"), 0);
    // The same frame, admitted by a rule for any host: it is well formed.
    set_rules(
        sled,
        &["dir=in action=allow priority=10 hosts=any protocol=UDP port=7777"],
    )?;
    send_until(IN_PACKETS)?;
    Ok(())
}
