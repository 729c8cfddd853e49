//! Traffic leaving the rack (router target igw, through boundary services) is held
//! to 1500 bytes unless both the sled-wide and the port's external-jumbo flags are
//! set: an IPv6 guest sending a bigger datagram gets Packet Too Big with MTU 1500 and
//! its kernel learns the path MTU; with both flags the same datagram leaves the sled.
//!
//! Boundary services are a third sled namespace without a daemon: the test checks
//! the encapsulated frame on the bridge port toward it.

use e2e::capture::Capture;
use e2e::guest::GuestSpec;
use e2e::rack::sled_underlay_addr;
use e2e::{Error, Guest, Rack, RackSpec, Result};
use std::time::Duration;

/// An external destination (documentation prefix): it exists only as far as the
/// boundary's bridge port, where the capture sees it.
const EXTERNAL: &str = "2001:db8::7";
const BOUNDARY_SLED: usize = 2;
const DATAGRAM: usize = 4000;

/// The ephemeral IP of guest `n` (its traffic to the internet leaves from it).
fn ephemeral(n: u8) -> std::net::IpAddr {
    std::net::IpAddr::V6(std::net::Ipv6Addr::new(
        0x2001,
        0xdb8,
        0xe,
        0,
        0,
        0,
        0,
        n.into(),
    ))
}

/// Sled 0 without the sled-wide flag, sled 1 with it; sled 2 is boundary services.
/// Guests: x0 on sled 0 with the port flag; y1 (port flag) and z1 (no port flag) on
/// sled 1. Each has an ephemeral IP and a default IPv6 route to the internet gateway.
fn rack() -> Result<Rack> {
    let mut rack = Rack::build(&RackSpec::new("e2e", 3))?;
    let boundary = sled_underlay_addr(BOUNDARY_SLED).to_string();
    rack.start_daemon(0, &["--boundary-services", &boundary])?;
    rack.start_daemon(1, &["--boundary-services", &boundary, "--external-jumbo"])?;
    for spec in [
        GuestSpec::v6("x0", 0, 1)
            .external_jumbo(true)
            .ephemeral_ip(ephemeral(1)),
        GuestSpec::v6("y1", 1, 2)
            .external_jumbo(true)
            .ephemeral_ip(ephemeral(2)),
        GuestSpec::v6("z1", 1, 3).ephemeral_ip(ephemeral(3)),
    ] {
        let (sled, name) = (spec.sled, spec.name.clone());
        rack.add_guest(spec)?;
        // With boundary services configured, a port's router sends the default
        // routes to the internet gateway.
        let routes = rack.sled(sled)?.admin(&["dump-routes", &name])?;
        let default = routes
            .lines()
            .find(|l| l.split_whitespace().next() == Some("::/0"))
            .ok_or_else(|| Error::new(format!("{name} has no ::/0 route:\n{routes}")))?;
        if default.split_whitespace().nth(1) != Some("igw") {
            return Err(Error::new(format!(
                "{name}'s ::/0 route is not igw: {default}"
            )));
        }
    }
    Ok(rack)
}

/// Sends one `DATAGRAM`-byte UDP datagram to `EXTERNAL` from a socket kept open
/// (the kernel applies a Packet Too Big to the route only while the sending socket
/// exists), re-sending every 200 ms, and prints `ip -6 route get` once its MTU is
/// 1500 or after 5 s. Returns that output.
fn send_and_route(g: &Guest) -> Result<String> {
    let script = format!(
        "import socket, subprocess, time\n\
         s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)\n\
         s.connect(('{EXTERNAL}', 9))\n\
         out = ''\n\
         for _ in range(25):\n\
         \x20   s.send(b'x' * {DATAGRAM})\n\
         \x20   time.sleep(0.2)\n\
         \x20   out = subprocess.run(['ip', '-6', 'route', 'get', '{EXTERNAL}'], capture_output=True, text=True).stdout\n\
         \x20   if ' mtu 1500' in out: break\n\
         print(out)\n"
    );
    g.cmd("python3").arg("-").stdin(script).run()
}

#[test]
fn oversized_external_datagram_gets_packet_too_big_unless_both_jumbo_flags() -> Result<()> {
    let rack = rack()?;
    let boundary = rack.sled(BOUNDARY_SLED)?;
    let cap = Capture::start(
        &rack.switch,
        &boundary.bridge_port,
        &rack.dir().join("boundary.pcap"),
        "udp port 6081",
    )?;
    for name in ["x0", "z1"] {
        let g = rack.guest(name)?;
        let route = send_and_route(g)?;
        if !route.contains(" mtu 1500") {
            return Err(Error::new(format!(
                "{name}: no Packet Too Big learned for {EXTERNAL}; route: {route}"
            )));
        }
    }
    let y1 = rack.guest("y1")?;
    let route = send_and_route(y1)?;
    assert!(
        !route.contains(" mtu 1500"),
        "y1 has both jumbo flags yet learned MTU 1500: {route}"
    );
    // IPv6 40 + UDP 8 + payload, inside Ethernet 14, inside the 70-byte-plus Geneve
    // encapsulation: only the unsplit datagram makes a frame this big.
    let min_len = u32::try_from(DATAGRAM + 48 + 14 + 70).unwrap_or(u32::MAX);
    let external: std::net::Ipv6Addr = EXTERNAL
        .parse()
        .map_err(|e| Error::new(format!("{EXTERNAL}: {e}")))?;
    let y1_sled = rack.sled(1)?.addr;
    cap.wait_for(
        "y1's whole datagram on the way to boundary services",
        Duration::from_secs(10),
        |frames| {
            frames.iter().any(|f| {
                f.len >= min_len
                    && f.ipv6_src.first() == Some(&y1_sled)
                    && f.ipv6_dst.first() == Some(&boundary.addr)
                    && f.ipv6_dst.contains(&external)
            })
        },
    )?;
    let frames = cap.stop()?;
    // x0 and z1 were refused before encapsulation: nothing of theirs that large left
    // (from their external address, as their traffic leaves through NAT).
    for (name, n) in [("x0", 1), ("z1", 3)] {
        let src = ephemeral(n);
        let big: Vec<_> = frames
            .iter()
            .filter(|f| f.len >= min_len && f.has_src(src))
            .collect();
        assert!(
            big.is_empty(),
            "{name}'s oversized datagram left the rack without both jumbo flags: {big:?}"
        );
    }
    Ok(())
}
