//! V2B end to end: a guest whose default routes go to the internet gateway reaches a
//! server on the "internet" through the boundary switch (`e2e::boundary`) that the
//! V2B table names, and the replies the switch sends back marked External reach the
//! guest; an External frame from a host that is not a V2B endpoint is refused.
//!
//! The guest reaches the internet from its floating IPs (the NAT layer rewrites its
//! private source): the internet routes them back to the switch, whose ingress
//! table maps each to the guest's sled, VNI and MAC.

use e2e::boundary::{Ingress, Internet};
use e2e::counters::Snapshot;
use e2e::frames::{self, geneve_option, Host, Outer, L4, OXIDE_CLASS, OXIDE_EXTERNAL};
use e2e::guest::GuestSpec;
use e2e::inject::{mac_of, parse_mac, Rogue};
use e2e::rack::{sled_underlay_addr, UNDERLAY_IF};
use e2e::{Error, Rack, RackSpec, Result};
use std::net::IpAddr;
use std::process::Stdio;
use std::time::Duration;

const BOUNDARY_SLED: usize = 2;
const GUEST: &str = "w0";
const XFER_BYTES: u64 = 2 * 1024 * 1024;
/// The guest's floating IPs, its addresses on the internet.
const FLOATING4: &str = "203.0.113.7";
const FLOATING6: &str = "2001:db8:7::7";
/// The SNAT address two guests share.
const SNAT4: &str = "203.0.113.9";

/// A guest of the rack: its spec, its external addresses (`set-external-ips`
/// flags), and the switch's ingress entries that bring its traffic back
/// (address, SNAT port range).
struct Outside {
    spec: GuestSpec,
    external: Vec<String>,
    ingress: Vec<(&'static str, Option<(u16, u16)>)>,
}

/// Guest w0, dual-stack, reached from the internet at its floating IPs.
fn floating_guest() -> Outside {
    Outside {
        spec: GuestSpec::dual(GUEST, 0, 7),
        external: ["--floating-ip", FLOATING4, "--floating-ip", FLOATING6]
            .map(String::from)
            .to_vec(),
        ingress: vec![(FLOATING4, None), (FLOATING6, None)],
    }
}

/// Three sleds: daemons on 0 and 1 (no `--boundary-services`: V2B alone), the
/// switch on 2. The guests on sled 0, each with both default routes to the internet
/// gateway and its external addresses, and the V2B table sending everything to the
/// switch; the internet routes `back` to the switch.
fn rack(guests: Vec<Outside>, back: &[&str]) -> Result<(Rack, Internet)> {
    let mut rack = Rack::build(&RackSpec::new("e2e", 3))?;
    // No daemon on the switch's sled: its XDP program would take the Geneve.
    rack.start_daemon(0, &[])?;
    rack.start_daemon(1, &[])?;
    let switch = sled_underlay_addr(BOUNDARY_SLED).to_string();
    for net in ["0.0.0.0/0", "::/0"] {
        rack.sled(0)?.admin(&["set-v2b", net, &switch])?;
    }
    let mut ingress = Vec::new();
    for g in guests {
        let (name, mac, vni) = (g.spec.name.clone(), parse_mac(&g.spec.mac)?, g.spec.vni);
        rack.add_guest(g.spec)?;
        let sled0 = rack.sled(0)?;
        for net in ["0.0.0.0/0", "::/0"] {
            sled0.admin(&["add-router-entry", &name, net, "igw"])?;
        }
        let mut args = vec!["set-external-ips", name.as_str()];
        args.extend(g.external.iter().map(String::as_str));
        sled0.admin(&args)?;
        for (addr, ports) in g.ingress {
            ingress.push(Ingress {
                dst: addr
                    .parse()
                    .map_err(|e| Error::new(format!("{addr}: {e}")))?,
                ports,
                sled: sled0.addr,
                vni,
                mac,
            });
        }
    }
    let table = rack.sled(0)?.admin(&["--json", "dump-v2b"])?;
    if table.matches(&switch).count() != 2 {
        return Err(Error::new(format!(
            "dump-v2b does not show the switch twice: {table}"
        )));
    }
    let bin = env!("CARGO_BIN_EXE_boundary");
    let internet = Internet::attach(&rack, BOUNDARY_SLED, bin, &ingress, back)?;
    Ok((rack, internet))
}

/// The rack of the floating-IP tests.
fn floating_rack() -> Result<(Rack, Internet)> {
    rack(
        vec![floating_guest()],
        &[&format!("{FLOATING4}/32"), &format!("{FLOATING6}/128")],
    )
}

/// A checked TCP transfer of [`XFER_BYTES`] from guest `g` to the internet server
/// on `port`, through the MTU-1400 link.
fn upload(internet: &Internet, g: &e2e::Guest, port: u16) -> Result<()> {
    let xfer = env!("CARGO_BIN_EXE_e2e-xfer");
    let seed = u64::from(std::process::id()).to_string();
    let bytes = XFER_BYTES.to_string();
    let mut receiver = internet
        .server
        .cmd(xfer)
        .args(["recv", &format!("0.0.0.0:{port}"), &bytes, &seed])
        .spawn_with(Stdio::piped(), Stdio::piped())?;
    let dest = format!("{}:{port}", Internet::SERVER4);
    let sent = g
        .cmd(xfer)
        .args(["send", &dest, &bytes, &seed])
        .timeout(Duration::from_secs(60))
        .run();
    if sent.is_err() {
        // The receiver would wait for the bytes forever.
        let _ = receiver.kill();
    }
    let out = receiver.wait_with_output()?;
    let received = String::from_utf8_lossy(&out.stdout).into_owned();
    let sent = sent.map_err(|e| Error::new(format!("upload to port {port}: {e}")))?;
    assert!(
        out.status.success(),
        "receiver: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        received.contains(&format!("bytes={XFER_BYTES} ")),
        "{received}"
    );
    let hash = |s: &str| {
        s.split_whitespace()
            .find(|w| w.starts_with("fnv64="))
            .map(str::to_string)
    };
    assert_eq!(
        hash(&sent),
        hash(&received),
        "sent {sent} received {received}"
    );
    Ok(())
}

#[test]
fn guest_reaches_the_internet_through_the_v2b_endpoint_and_back() -> Result<()> {
    let (mut rack, internet) = floating_rack()?;
    let g = rack.guest(GUEST)?;
    for server in [IpAddr::V4(Internet::SERVER4), IpAddr::V6(Internet::SERVER6)] {
        g.ping(server, 56, Duration::from_secs(10))?;
    }
    let c = internet.counters()?;
    assert!(c.decap >= 2 && c.encap >= 2, "{c:?}");
    // Every frame from the sled came in the boundary VNI.
    assert_eq!(
        (c.wrong_vni, c.bad_geneve, c.no_ingress),
        (0, 0, 0),
        "{c:?}"
    );

    // A checked TCP transfer to the server, whose link is MTU 1400.
    upload(&internet, g, 5201)?;

    let after = Snapshot::take(rack.sled(0)?)?;
    let mismatch = after.get(&format!("engine.ports.{GUEST}.drops.underlay_src_mismatch"));
    assert_eq!(mismatch, 0, "the switch's frames were refused");

    // The table is saved: after a restart the guest reaches the server again.
    rack.restart_daemon(0, &[])?;
    let table = rack.sled(0)?.admin(&["dump-v2b"])?;
    let switch = sled_underlay_addr(BOUNDARY_SLED).to_string();
    assert_eq!(table.matches(&switch).count(), 2, "{table}");
    let g = rack.guest(GUEST)?;
    g.ping(IpAddr::V4(Internet::SERVER4), 56, Duration::from_secs(10))?;
    Ok(())
}

#[test]
fn external_frames_from_a_host_not_in_v2b_are_refused() -> Result<()> {
    let (rack, internet) = floating_rack()?;
    let g = rack.guest(GUEST)?;
    // A flow the guest opened, so that only the sender check can refuse the reply.
    g.ping(IpAddr::V4(Internet::SERVER4), 56, Duration::from_secs(10))?;
    let rogue = Rogue::join(&rack)?;
    let sled0 = rack.sled(0)?;
    let guest_mac = parse_mac(&g.spec.mac)?;
    let udp = frames::inner(
        Host {
            mac: [0x02, 0xb0, 0, 0, 0, 1],
            ip: IpAddr::V4(Internet::SERVER4),
        },
        Host {
            mac: guest_mac,
            ip: g.ipv4()?,
        },
        L4::Udp {
            sport: 53,
            dport: 40000,
        },
        b"forged answer",
    );
    let outer = Outer {
        src_mac: e2e::inject::ROGUE_MAC,
        dst_mac: parse_mac(&mac_of(&sled0.ns, UNDERLAY_IF)?)?,
        src: rogue.addr,
        dst: sled0.addr,
        vni: g.spec.vni,
    };
    let frame = frames::geneve(
        &outer,
        &geneve_option(OXIDE_CLASS, OXIDE_EXTERNAL, &[]),
        &udp,
    );
    let count = |s: &Snapshot| s.get(&format!("engine.ports.{GUEST}.drops.underlay_src_mismatch"));
    let before = count(&Snapshot::take(sled0)?);
    for _ in 0..5 {
        rogue.send(&frame)?;
    }
    e2e::poll::poll_until("5 refused External frames", Duration::from_secs(10), || {
        let n = count(&Snapshot::take(sled0)?);
        if n >= before + 5 {
            Ok(())
        } else {
            Err(Error::new(format!("underlay_src_mismatch {before} -> {n}")))
        }
    })?;
    // The switch itself is still trusted.
    g.ping(IpAddr::V4(Internet::SERVER4), 56, Duration::from_secs(10))?;
    assert_eq!(internet.counters()?.no_ingress, 0);
    Ok(())
}

/// Two guests share one SNAT address with disjoint port ranges: each one's TCP
/// leaves from a port of its own range (the switch's ingress table sends a reply to
/// the guest whose range holds its port, so a port outside the range would stall
/// the transfer), and both transfers arrive intact.
#[test]
fn two_guests_share_a_snat_address_with_disjoint_ranges() -> Result<()> {
    let shared = |name: &str, n: u8, range: (u16, u16)| Outside {
        spec: GuestSpec::v4(name, 0, n),
        external: vec![
            "--snat-ip".into(),
            SNAT4.into(),
            "--snat-start".into(),
            range.0.to_string(),
            "--snat-end".into(),
            range.1.to_string(),
        ],
        ingress: vec![(SNAT4, Some(range))],
    };
    let (rack, internet) = rack(
        vec![shared("s0", 8, (2000, 2099)), shared("s1", 9, (2100, 2199))],
        &[&format!("{SNAT4}/32")],
    )?;
    let (s0, s1) = (rack.guest("s0")?, rack.guest("s1")?);
    upload(&internet, s0, 5301)?;
    upload(&internet, s1, 5302)?;
    let c = internet.counters()?;
    assert_eq!(
        c.no_ingress, 0,
        "a reply to a port outside both ranges: {c:?}"
    );
    Ok(())
}
