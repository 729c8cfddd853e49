//! V2B and NAT end to end: guests whose default routes go to the internet gateway
//! reach a server on the "internet" through the boundary switch (`e2e::boundary`)
//! that the V2B table names, from their external addresses (floating, ephemeral,
//! SNAT: the NAT layer rewrites their private sources), and what the switch sends
//! back marked External reaches them; the internet connects in to floating IPs; an
//! exhausted SNAT range is counted; ICMP errors from the internet (the MTU-1400
//! router's Packet Too Big) are translated back so path MTU discovery works; an
//! External frame from a host that is not a V2B endpoint is refused.
//!
//! The internet routes every guest's external addresses back to the switch, whose
//! ingress table maps each (with its SNAT port range) to the guest's sled, VNI and
//! MAC; ICMP is mapped by echo identifier, or for an error by the quoted packet's
//! source port.

// One socket option std does not wrap (SO_LINGER, for a reset instead of a FIN).
#![allow(unsafe_code)]

use e2e::boundary::{nat_rack, Internet, Outside, INTERNET_MTU};
use e2e::counters::Snapshot;
use e2e::frames::{self, geneve_option, Host, Outer, L4, OXIDE_CLASS, OXIDE_EXTERNAL};
use e2e::guest::GuestSpec;
use e2e::inject::{mac_of, parse_mac, Rogue};
use e2e::poll::poll_until;
use e2e::rack::{sled_underlay_addr, UNDERLAY_IF};
use e2e::xfer::{connect, fetch, stream, transfer_between, Report};
use e2e::{Error, Guest, Netns, Rack, Result};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::Path;
use std::time::{Duration, Instant};

const BOUNDARY_SLED: usize = 2;
const GUEST: &str = "w0";
const XFER_BYTES: u64 = 2 * 1024 * 1024;
/// The guest's floating IPs, its addresses on the internet.
const FLOATING4: &str = "203.0.113.7";
const FLOATING6: &str = "2001:db8:7::7";
/// SNAT addresses (shared by guests, each with its own port range).
const SNAT4: &str = "203.0.113.9";
const SNAT6: &str = "2001:db8:9::9";
/// The internet, as the guests' firewalls name it when they let it in.
const INTERNET_NETS: [&str; 2] = ["198.51.100.0/24", "2001:db8:51::/64"];

fn ip(s: &str) -> IpAddr {
    s.parse().expect("a constant address")
}

/// The internet server's address of the family of `like`.
fn server(like: IpAddr) -> IpAddr {
    match like {
        IpAddr::V4(_) => IpAddr::V4(Internet::SERVER4),
        IpAddr::V6(_) => IpAddr::V6(Internet::SERVER6),
    }
}

const SERVERS: [IpAddr; 2] = [IpAddr::V4(Internet::SERVER4), IpAddr::V6(Internet::SERVER6)];

/// Three sleds: daemons on 0 and 1, the switch on 2; `guests` on sled 0.
fn rack(guests: Vec<Outside>) -> Result<(Rack, Internet)> {
    nat_rack("e2e", BOUNDARY_SLED, guests, env!("CARGO_BIN_EXE_boundary"))
}

/// Guest w0, dual-stack, reached from the internet at its floating IPs.
fn floating_guest() -> Outside {
    Outside::floating(
        GuestSpec::dual(GUEST, 0, 7),
        &[ip(FLOATING4), ip(FLOATING6)],
    )
}

/// The rack of the floating-IP tests.
fn floating_rack() -> Result<(Rack, Internet)> {
    rack(vec![floating_guest()])
}

/// A checked TCP transfer of `bytes` from namespace `from` to `to`, reached at
/// `to_ip:port` (for a guest: its external address).
fn xfer(from: &Netns, to: &Netns, to_ip: IpAddr, port: u16, bytes: u64) -> Result<Report> {
    let bin = Path::new(env!("CARGO_BIN_EXE_e2e-xfer"));
    transfer_between(bin, from, to, to_ip, port, bytes, Duration::from_secs(60))
        .map_err(|e| e.context(format!("{bytes} bytes to {to_ip} port {port}")))
}

/// A checked upload of `bytes` from guest `g` to the internet server's address of
/// the family of `like`, through the MTU-1400 link.
fn upload(internet: &Internet, g: &Guest, like: IpAddr, port: u16, bytes: u64) -> Result<()> {
    xfer(&g.ns, &internet.server, server(like), port, bytes).map(drop)
}

/// The port's drop counter `reason` on sled 0.
fn port_drops(rack: &Rack, port: &str, reason: &str) -> Result<u64> {
    Ok(Snapshot::take(rack.sled(0)?)?.get(&format!("engine.ports.{port}.drops.{reason}")))
}

/// A guest with floating IPs pings the internet server over IPv4 and IPv6 and
/// uploads a checked 2 MiB over TCP: its frames reach the switch in the boundary
/// VNI (the V2B endpoint), the answers come back External and are accepted; the
/// V2B table survives a daemon restart and the guest reaches the server again.
#[test]
fn guest_reaches_the_internet_through_the_v2b_endpoint_and_back() -> Result<()> {
    let (mut rack, internet) = floating_rack()?;
    let g = rack.guest(GUEST)?;
    for server in SERVERS {
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
    upload(&internet, g, SERVERS[0], 5201, XFER_BYTES)?;
    let mismatch = port_drops(&rack, GUEST, "underlay_src_mismatch")?;
    assert_eq!(mismatch, 0, "the switch's frames were refused");

    // The table is saved: after a restart the guest reaches the server again.
    rack.restart_daemon(0, &[])?;
    let table = rack.sled(0)?.admin(&["dump-v2b"])?;
    let switch = sled_underlay_addr(BOUNDARY_SLED).to_string();
    assert_eq!(table.matches(&switch).count(), 2, "{table}");
    let g = rack.guest(GUEST)?;
    g.ping(SERVERS[0], 56, Duration::from_secs(10))?;
    Ok(())
}

/// The internet connects in to the guest's floating IPs, IPv4 and IPv6: a client
/// on the internet server sends a checked 2 MiB stream to a receiver in the guest,
/// at the floating address; then, on a second connection in, the guest sends 1 MiB
/// back, checked byte by byte. Proves the inbound translation of 1:1 addresses (the
/// switch delivers to the floating IP, the guest's socket is on its private one and
/// sees the server's own address) and that the replies leave from the floating IP:
/// the client's kernel accepts only a SYN|ACK from the address it connected to.
/// Then UDP to a closed port is refused: the guest's ICMP error comes back
/// translated, quote included.
#[test]
fn the_internet_connects_in_to_floating_ips() -> Result<()> {
    let mut guest = floating_guest();
    guest
        .spec
        .allow_inbound_from
        .extend(INTERNET_NETS.map(String::from));
    let (rack, internet) = rack(vec![guest])?;
    let g = rack.guest(GUEST)?;
    for (floating, private, port) in [
        (ip(FLOATING4), g.ipv4()?, 5211),
        (ip(FLOATING6), g.ipv6()?, 5212),
    ] {
        let got = xfer(&internet.server, &g.ns, floating, port, XFER_BYTES)?;
        assert_eq!(got.bytes, XFER_BYTES);

        let to = SocketAddr::new(floating, port + 10);
        let any = SocketAddr::new(unspecified(floating), to.port());
        let listener = g.ns.within(|| Ok(TcpListener::bind(any)?))?;
        let client = connect(&internet.server, to, Duration::from_secs(20))?;
        // Connected: the connection waits in the backlog, accept returns at once.
        let (inside, peer) = listener.accept()?;
        assert_eq!(peer.ip(), server(floating), "the guest sees the server");
        assert_eq!(inside.local_addr()?.ip(), private, "on its private address");
        assert_eq!(client.peer_addr()?, to);
        stream(inside, client, 1 << 20)?;

        // UDP to a port nothing listens on: the guest's port unreachable comes back
        // from the floating IP, quoting the datagram as sent, so the server's kernel
        // matches it to the socket.
        let closed = SocketAddr::new(floating, port + 20);
        let refused = internet.server.within(|| {
            let s = UdpSocket::bind(SocketAddr::new(unspecified(floating), 0))?;
            s.connect(closed)?;
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            s.send(b"anyone?")?;
            Ok(s.recv(&mut [0; 16]).map_err(|e| e.kind()))
        })?;
        assert_eq!(
            refused,
            Err(std::io::ErrorKind::ConnectionRefused),
            "{closed}: the guest's ICMP error, translated"
        );
    }
    assert_eq!(port_drops(&rack, GUEST, "nat_no_mapping")?, 0);
    assert_eq!(internet.counters()?.no_ingress, 0);
    Ok(())
}

/// The unspecified address of `like`'s family.
fn unspecified(like: IpAddr) -> IpAddr {
    match like {
        IpAddr::V4(_) => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
    }
}

/// A guest with only an ephemeral IP reaches the internet: pings, a checked 1 MiB
/// upload and a checked 1 MiB download, IPv4 (guest e4) and IPv6 (guest e6: a port
/// has one ephemeral IP, of either family, so one guest per family), and the flows'
/// cached entries show the ephemeral source.
#[test]
fn ephemeral_ips_reach_the_internet() -> Result<()> {
    let guests = [
        ("e4", GuestSpec::v4("e4", 0, 20), "203.0.113.20"),
        ("e6", GuestSpec::v6("e6", 0, 21), "2001:db8:7::21"),
    ];
    let (rack, internet) = rack(
        guests
            .iter()
            .map(|(_, spec, eph)| Outside::ephemeral(spec.clone(), ip(eph)))
            .collect(),
    )?;
    for (i, (name, _, eph)) in guests.iter().enumerate() {
        let g = rack.guest(name)?;
        let eph = ip(eph);
        g.ping(server(eph), 56, Duration::from_secs(10))?;
        upload(&internet, g, eph, 5221 + i as u16, 1 << 20)?;
        fetch(
            &g.ns,
            &internet.server,
            server(eph),
            5225 + i as u16,
            1 << 20,
        )?;
        let uft = rack.sled(0)?.admin(&["dump-uft", name])?;
        assert!(uft.contains(&eph.to_string()), "{name}: {uft}");
        assert_eq!(port_drops(&rack, name, "no_external_ip")?, 0);
    }
    assert_eq!(internet.counters()?.no_ingress, 0);
    Ok(())
}

/// Sends a line each way on an established pair and checks it arrived.
fn exchange(client: &mut TcpStream, server: &mut TcpStream, what: &str) -> Result<()> {
    let one_way = |from: &mut TcpStream, to: &mut TcpStream, msg: String| -> Result<()> {
        from.write_all(msg.as_bytes())?;
        let mut got = vec![0; msg.len()];
        to.read_exact(&mut got)
            .map_err(|e| Error::new(format!("{}: {e}", msg.trim())))?;
        assert_eq!(got, msg.as_bytes());
        Ok(())
    };
    one_way(client, server, format!("{what} out\n"))?;
    one_way(server, client, format!("{what} in\n"))
}

/// Closes `s` with an RST (SO_LINGER 0) rather than a FIN.
fn reset(s: TcpStream) -> Result<()> {
    use std::os::fd::AsRawFd;
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setsockopt on the stream's open descriptor with a correctly sized
    // `linger` value.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            std::ptr::addr_of!(linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    drop(s);
    Ok(())
}

/// A SNAT range of two ports holds two connections: the guest opens two TCP
/// connections to the internet server (both carry data each way, from ports 3000
/// and 3001 of the range), a third one's SYNs are dropped and counted
/// `snat_exhausted` (its connect times out); once the first connection is reset
/// (its firewall connection closed, free after the 5 s incipient timeout) a new one
/// gets through, and the second still carries data.
#[test]
fn an_exhausted_snat_range_is_counted_and_frees_up() -> Result<()> {
    const RANGE: (u16, u16) = (3000, 3001);
    let (rack, internet) = rack(vec![Outside::snat(
        GuestSpec::v4("x0", 0, 30),
        ip(SNAT4),
        RANGE,
    )])?;
    let g = rack.guest("x0")?;
    let to = SocketAddr::new(SERVERS[0], 5231);
    let listener = internet.server.within(|| {
        let l = TcpListener::bind(("0.0.0.0", to.port()))?;
        l.set_nonblocking(true)?;
        Ok(l)
    })?;
    let accept = || {
        poll_until("the server to accept", Duration::from_secs(20), || {
            let (s, _) = listener.accept()?;
            s.set_nonblocking(false)?;
            s.set_read_timeout(Some(Duration::from_secs(20)))?;
            Ok(s)
        })
    };
    // The first SYN may wait for the underlay neighbour: a generous connect.
    let mut c1 = connect(&g.ns, to, Duration::from_secs(20))?;
    let mut s1 = accept()?;
    let mut c2 = connect(&g.ns, to, Duration::from_secs(20))?;
    let mut s2 = accept()?;
    exchange(&mut c1, &mut s1, "first")?;
    exchange(&mut c2, &mut s2, "second")?;
    let uft = rack.sled(0)?.admin(&["dump-uft", "x0"])?;
    for port in [RANGE.0, RANGE.1] {
        assert!(uft.contains(&format!("port {port}")), "{uft}");
    }

    let before = port_drops(&rack, "x0", "snat_exhausted")?;
    assert_eq!(before, 0, "two connections fit a 2-port range");
    let third = connect(&g.ns, to, Duration::from_secs(4));
    match &third {
        Err(e) if e.0.contains("timed out") => {}
        other => panic!("a third connection through a 2-port range: {other:?}"),
    }
    let after = port_drops(&rack, "x0", "snat_exhausted")?;
    assert!(after > before, "snat_exhausted {before} -> {after}");

    // An RST ends the first connection; its port is free once the closed
    // connection's incipient timeout (5 s) has passed, and the guest's SYN
    // retransmissions find it.
    reset(c1)?;
    let started = Instant::now();
    let mut c4 = connect(&g.ns, to, Duration::from_secs(40))?;
    let mut s4 = accept()?;
    eprintln!("a freed port took {:.1?}", started.elapsed());
    exchange(&mut c4, &mut s4, "fourth")?;
    exchange(&mut c2, &mut s2, "second again")?;
    assert_eq!(internet.counters()?.no_ingress, 0);
    Ok(())
}

/// The `mtu N` the guest's kernel has cached for its route to `dst`, if any.
fn cached_mtu(g: &Guest, dst: IpAddr) -> Result<Option<u32>> {
    let fam = if dst.is_ipv4() { "-4" } else { "-6" };
    let out = g.ns.ip(&[fam, "route", "get", &dst.to_string()])?;
    let mut words = out.split_whitespace();
    while let Some(w) = words.next() {
        if w == "mtu" {
            let n = words.next().unwrap_or_default();
            return n
                .parse()
                .map(Some)
                .map_err(|_| Error::new(format!("`mtu {n}` in {out}")));
        }
    }
    Ok(None)
}

/// Path MTU discovery through SNAT, IPv4 (guest p4) and IPv6 (guest p6, through an
/// IPv6 SNAT address): each pings the server and uploads 10 MB through the MTU-1400
/// router link, and afterwards its kernel has cached `mtu 1400` for the server;
/// then it downloads a checked 2 MiB (data segments in through SNAT).
///
/// The server advertises a large MSS (its routes' `advmss`, as a server behind a
/// bigger link would), so the guests (MTU 8500) send segments the router cannot
/// forward and it answers with Packet Too Big (ICMPv4 fragmentation needed) to the
/// SNAT address, quoting the segment as it left. Only that error can teach the guest
/// 1400: the datapath's own PTB for traffic to the internet says 1500, and the
/// guest's kernel takes a PTB only when its quote matches one of its own connections
/// (private address and port, sequence in flight), so the cached value proves the
/// error came through the switch and NAT with its quoted packet translated. Were it
/// dropped or left untranslated, the upload would stall (no PLPMTUD) and the cached
/// MTU would not be 1400: the test would fail either way.
#[test]
fn path_mtu_discovery_works_through_snat() -> Result<()> {
    let guests = [
        ("p4", GuestSpec::v4("p4", 0, 40), SNAT4),
        ("p6", GuestSpec::v6("p6", 0, 41), SNAT6),
    ];
    let (rack, internet) = rack(
        guests
            .iter()
            .map(|(_, spec, nat)| Outside::snat(spec.clone(), ip(nat), (3100, 3199)))
            .collect(),
    )?;
    for (fam, via) in [("-4", "198.51.100.1"), ("-6", "2001:db8:51::1")] {
        internet.server.ip(&[
            fam, "route", "replace", "default", "via", via, "advmss", "8400",
        ])?;
    }
    for (i, (name, _, nat)) in guests.iter().enumerate() {
        let g = rack.guest(name)?;
        let dst = server(ip(nat));
        g.ping(dst, 56, Duration::from_secs(10))?;
        let cached = cached_mtu(g, dst)?;
        assert!(
            cached.is_none_or(|m| m > u32::from(INTERNET_MTU)),
            "{name}: {cached:?}"
        );
        upload(&internet, g, dst, 5241 + i as u16, 10_000_000)?;
        let cached = cached_mtu(g, dst)?;
        assert!(
            cached.is_some_and(|m| m <= u32::from(INTERNET_MTU)),
            "{name}: the guest did not learn the path MTU: {cached:?}"
        );
        fetch(&g.ns, &internet.server, dst, 5245 + i as u16, XFER_BYTES)?;
        assert_eq!(port_drops(&rack, name, "nat_no_mapping")?, 0, "{name}");
    }
    assert_eq!(internet.counters()?.no_ingress, 0);
    Ok(())
}

/// A frame marked External from a host on the underlay that is not a V2B endpoint
/// is refused (`underlay_src_mismatch`), even as a reply to a flow the guest
/// opened; the switch's own frames still get through.
#[test]
fn external_frames_from_a_host_not_in_v2b_are_refused() -> Result<()> {
    let (rack, internet) = floating_rack()?;
    let g = rack.guest(GUEST)?;
    // A flow the guest opened, so that only the sender check can refuse the reply.
    g.ping(SERVERS[0], 56, Duration::from_secs(10))?;
    let rogue = Rogue::join(&rack)?;
    let sled0 = rack.sled(0)?;
    let guest_mac = parse_mac(&g.spec.mac)?;
    let udp = frames::inner(
        Host {
            mac: [0x02, 0xb0, 0, 0, 0, 1],
            ip: SERVERS[0],
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
    let count = || port_drops(&rack, GUEST, "underlay_src_mismatch");
    let before = count()?;
    for _ in 0..5 {
        rogue.send(&frame)?;
    }
    poll_until("5 refused External frames", Duration::from_secs(10), || {
        let n = count()?;
        if n >= before + 5 {
            Ok(())
        } else {
            Err(Error::new(format!("underlay_src_mismatch {before} -> {n}")))
        }
    })?;
    // The switch itself is still trusted.
    g.ping(SERVERS[0], 56, Duration::from_secs(10))?;
    assert_eq!(internet.counters()?.no_ingress, 0);
    Ok(())
}

/// Two guests share one SNAT address with disjoint port ranges: each one's TCP
/// leaves from a port of its own range (the switch's ingress table sends a reply to
/// the guest whose range holds its port, so a port outside the range would stall
/// the transfer), and both transfers arrive intact.
#[test]
fn two_guests_share_a_snat_address_with_disjoint_ranges() -> Result<()> {
    let shared =
        |name: &str, n: u8, range| Outside::snat(GuestSpec::v4(name, 0, n), ip(SNAT4), range);
    let (rack, internet) = rack(vec![
        shared("s0", 8, (2000, 2099)),
        shared("s1", 9, (2100, 2199)),
    ])?;
    let (s0, s1) = (rack.guest("s0")?, rack.guest("s1")?);
    upload(&internet, s0, SERVERS[0], 5301, XFER_BYTES)?;
    upload(&internet, s1, SERVERS[0], 5302, XFER_BYTES)?;
    let c = internet.counters()?;
    assert_eq!(
        c.no_ingress, 0,
        "a reply to a port outside both ranges: {c:?}"
    );
    Ok(())
}

/// The guest's external attached subnet (`attach-subnet -e`), exempt from NAT, and
/// the address of it the guest uses.
const EXEMPT_NET: &str = "192.0.2.0/28";
const EXEMPT: &str = "192.0.2.5";

/// An external attached subnet is exempt from NAT both ways: a guest that otherwise
/// leaves from its SNAT address sends UDP from an address of the subnet and the
/// server sees that address and port, and its answer comes back to it; the server
/// connects in to that address (the firewall permitting) and a checked 2 MiB
/// stream arrives, the guest's socket on the subnet's address; no flow of the
/// subnet's address is translated. The switch's ingress table sends the address to
/// the guest's sled, as it would a floating IP.
#[test]
fn an_external_attached_subnet_is_reached_untranslated() -> Result<()> {
    let mut guest = Outside::snat(GuestSpec::v4("x0", 0, 30), ip(SNAT4), (6000, 6099));
    guest.ingress.push((ip(EXEMPT), None));
    guest
        .spec
        .allow_inbound_from
        .extend(INTERNET_NETS.map(String::from));
    let (rack, internet) = rack(vec![guest])?;
    let g = rack.guest("x0")?;
    rack.sled(0)?
        .admin(&["attach-subnet", "-p", "x0", EXEMPT_NET, "-e"])?;
    g.ns.ip(&["addr", "add", &format!("{EXEMPT}/32"), "dev", g.ifname()])?;

    // UDP out from the subnet: the server sees the address and port as sent.
    let at_server = SocketAddr::new(SERVERS[0], 5241);
    let in_subnet = SocketAddr::new(ip(EXEMPT), 5242);
    let server_sock = internet.server.within(|| Ok(UdpSocket::bind(at_server)?))?;
    let guest_sock = g.ns.within(|| Ok(UdpSocket::bind(in_subnet)?))?;
    for s in [&server_sock, &guest_sock] {
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
    }
    let mut buf = [0; 64];
    // The first datagram may wait for the underlay neighbour: sent until one
    // arrives.
    let from = poll_until(
        "a datagram from the subnet",
        Duration::from_secs(20),
        || {
            guest_sock.send_to(b"from the subnet", at_server)?;
            Ok(server_sock.recv_from(&mut buf)?.1)
        },
    )?;
    assert_eq!(from, in_subnet, "the source is not translated");
    server_sock.send_to(b"back", from)?;
    let (n, from) = guest_sock.recv_from(&mut buf)?;
    assert_eq!((&buf[..n], from), (&b"back"[..], at_server));

    // TCP in, to the subnet's address.
    let got = xfer(&internet.server, &g.ns, ip(EXEMPT), 5243, XFER_BYTES)?;
    assert_eq!(got.bytes, XFER_BYTES);
    let to = SocketAddr::new(ip(EXEMPT), 5244);
    let listener =
        g.ns.within(|| Ok(TcpListener::bind(("0.0.0.0", to.port()))?))?;
    let client = connect(&internet.server, to, Duration::from_secs(20))?;
    let (inside, peer) = listener.accept()?;
    assert_eq!(peer.ip(), SERVERS[0]);
    assert_eq!(inside.local_addr()?.ip(), ip(EXEMPT), "untranslated");
    assert_eq!(client.peer_addr()?, to);

    let uft = rack.sled(0)?.admin(&["dump-uft", "x0"])?;
    let exempt_flows: Vec<&str> = uft.lines().filter(|l| l.contains(EXEMPT)).collect();
    assert!(
        !exempt_flows.is_empty() && exempt_flows.iter().all(|l| !l.contains("nat src")),
        "{uft}"
    );
    assert_eq!(port_drops(&rack, "x0", "nat_no_mapping")?, 0);
    assert_eq!(internet.counters()?.no_ingress, 0);
    Ok(())
}

/// The source address the internet server sees on a UDP datagram guest `g` sends
/// it (to `port`), sent again until one arrives (the first may wait for the
/// underlay next hop).
fn source_seen_by_the_server(internet: &Internet, g: &Guest, port: u16) -> Result<IpAddr> {
    let to = SocketAddr::new(IpAddr::V4(Internet::SERVER4), port);
    let server = internet.server.within(move || {
        let s = UdpSocket::bind(to)?;
        s.set_read_timeout(Some(Duration::from_millis(200)))?;
        Ok(s)
    })?;
    let client = g.ns.within(|| Ok(UdpSocket::bind("0.0.0.0:0")?))?;
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut buf = [0u8; 64];
    loop {
        client.send_to(b"which address?", to)?;
        if let Ok((_, from)) = server.recv_from(&mut buf) {
            return Ok(from.ip());
        }
        if Instant::now() > deadline {
            return Err(Error::new(format!("no datagram reached {to}")));
        }
    }
}

/// Two internet gateways (OPTE's `ig=UUID` routes and internet gateway map): the
/// guest's two floating IPs each serve one gateway; traffic routed through the
/// second gateway reaches the internet from the second address, traffic on the
/// default route (`ig`, any gateway) from the first, as without gateways.
#[test]
fn each_internet_gateway_leaves_from_its_own_address() -> Result<()> {
    let (first, second) = (ip("203.0.113.30"), ip("203.0.113.31"));
    let (gw1, gw2) = (
        "0b8b2f6e-8b44-4a8e-9f5c-0d1c1d0e5b1a",
        "7c9e6679-7425-40de-944b-e07fc1f90ae7",
    );
    let mut outside = Outside::floating(GuestSpec::v4("i0", 0, 30), &[first, second]);
    for tie in [format!("{first}={gw1}"), format!("{second}={gw2}")] {
        outside.external.extend(["--inet-gw".to_string(), tie]);
    }
    let (rack, internet) = rack(vec![outside])?;
    let g = rack.guest("i0")?;
    assert_eq!(source_seen_by_the_server(&internet, g, 5401)?, first);
    let server = format!("{}/32", Internet::SERVER4);
    let through_gw2 = format!("ig={gw2}");
    let route = ["add-router-entry", "-p", "i0", &server, &through_gw2];
    rack.sled(0)?.admin(&route)?;
    assert_eq!(source_seen_by_the_server(&internet, g, 5402)?, second);
    assert_eq!(port_drops(&rack, "i0", "no_external_ip")?, 0);
    Ok(())
}
