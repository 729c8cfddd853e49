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

/// Three sleds: daemons on 0 and 1 (no `--boundary-services`: V2B alone), the
/// switch on 2. Guest w0 on sled 0 with both default routes to the internet gateway,
/// and the V2B table sending everything to the switch.
fn rack() -> Result<(Rack, Internet)> {
    let mut rack = Rack::build(&RackSpec::new("e2e", 3))?;
    // No daemon on the switch's sled: its XDP program would take the Geneve.
    rack.start_daemon(0, &[])?;
    rack.start_daemon(1, &[])?;
    let spec = GuestSpec::dual(GUEST, 0, 7);
    let (mac, vni) = (spec.mac.clone(), spec.vni);
    rack.add_guest(spec)?;
    let switch = sled_underlay_addr(BOUNDARY_SLED).to_string();
    let sled0 = rack.sled(0)?;
    for net in ["0.0.0.0/0", "::/0"] {
        sled0.admin(&["set-v2b", net, &switch])?;
        sled0.admin(&["add-router-entry", GUEST, net, "igw"])?;
    }
    sled0.admin(&[
        "set-external-ips",
        GUEST,
        "--floating-ip",
        FLOATING4,
        "--floating-ip",
        FLOATING6,
    ])?;
    let table = sled0.admin(&["--json", "dump-v2b"])?;
    if table.matches(&switch).count() != 2 {
        return Err(Error::new(format!(
            "dump-v2b does not show the switch twice: {table}"
        )));
    }
    let mac = parse_mac(&mac)?;
    let floating: Vec<IpAddr> = [FLOATING4, FLOATING6]
        .iter()
        .map(|a| a.parse().map_err(|e| Error::new(format!("{a}: {e}"))))
        .collect::<Result<_>>()?;
    let ingress: Vec<Ingress> = floating
        .into_iter()
        .map(|dst| Ingress {
            dst,
            ports: None,
            sled: sled0.addr,
            vni,
            mac,
        })
        .collect();
    let bin = env!("CARGO_BIN_EXE_boundary");
    let back = [format!("{FLOATING4}/32"), format!("{FLOATING6}/128")];
    let internet = Internet::attach(&rack, BOUNDARY_SLED, bin, &ingress, &[&back[0], &back[1]])?;
    Ok((rack, internet))
}

#[test]
fn guest_reaches_the_internet_through_the_v2b_endpoint_and_back() -> Result<()> {
    let (mut rack, internet) = rack()?;
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
    let xfer = env!("CARGO_BIN_EXE_e2e-xfer");
    let seed = u64::from(std::process::id()).to_string();
    let bytes = XFER_BYTES.to_string();
    let receiver = internet
        .server
        .cmd(xfer)
        .args(["recv", "0.0.0.0:5201", &bytes, &seed])
        .spawn_with(Stdio::piped(), Stdio::piped())?;
    let dest = format!("{}:5201", Internet::SERVER4);
    let sent = g
        .cmd(xfer)
        .args(["send", &dest, &bytes, &seed])
        .timeout(Duration::from_secs(60))
        .run();
    let out = receiver.wait_with_output()?;
    let received = String::from_utf8_lossy(&out.stdout).into_owned();
    let sent = sent?;
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
    let (rack, internet) = rack()?;
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
