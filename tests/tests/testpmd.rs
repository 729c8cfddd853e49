//! DPDK's testpmd as a vhost-user guest (issue 26): `dpdk-testpmd` with a
//! `net_virtio_user` device (no VM, no hugepages: `--no-huge` backs its memory
//! with a memfd) connects to a port in vhost-user server mode and acks what a
//! DPDK guest acks by default, no offload at all (VERSION_1 and MRG_RXBUF). The
//! port must serve it as a tap serves a guest without offloads:
//! - a TCP GSO buffer from a namespace guest on the same sled (sent with
//!   `PACKET_VNET_HDR`, as its TCP stack hands its tap one) reaches testpmd as
//!   segments of at most the port's MTU, each with valid IP and TCP checksums,
//!   the byte stream intact; UDP from the namespace guest (64-byte and
//!   1514-byte frames) arrives with valid checksums. What testpmd receives is
//!   forwarded to a `net_pcap` port and read back from its file;
//! - testpmd's own 64-byte and 1514-byte frames (`txonly`) reach the namespace
//!   guest.
//! - with offloads on (`--rx-offloads` TCP_LRO and TCP_CKSUM, so it acks
//!   GUEST_TSO4/6 and GUEST_CSUM), the same GSO buffer arrives whole, as before.
//!
//! - a front end (the `vhost` crate's, acking what the test says) that acks an
//!   impossible feature set is disconnected, and the daemon shows and counts it.
//!
//! Each run of testpmd lasts a few seconds. Needs `dpdk-testpmd` (Debian
//! `dpdk-dev`; scripts/install-deps.sh installs it): without it the test fails
//! saying so.

use e2e::guest::GATEWAY_MAC;
use e2e::inject::{parse_mac, RawSocket};
use e2e::testpmd::{self, accumulated, Testpmd};
use e2e::vm::vhost_user_port;
use e2e::{pcap, poll_until, Error, GuestSpec, Rack, RackSpec, Result};
use std::net::{IpAddr, Ipv4Addr, UdpSocket};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const A: &str = "pa";
const VM: &str = "pv";
/// The testpmd port's MTU: a DPDK guest's default.
const VM_MTU: u16 = 1500;
const GSO_PAYLOAD: usize = 20_000;
const GSO_SIZE: u16 = 1448;
const TCP_PORT: u16 = 7001;
const UDP_PORT: u16 = 7002;
const TXONLY_PORT: u16 = 7003;

/// Starts testpmd on the port's socket as `net_virtio_user0` (MAC `mac`), its
/// forwarding lcore on core 1, `pcap` (if any) as a second port that writes what
/// it is sent, and the application arguments `app`.
fn testpmd(
    dir: &Path,
    run: &str,
    socket: &Path,
    mac: &str,
    pcap: Option<&Path>,
    app: &[&str],
) -> Result<Testpmd> {
    let spec = testpmd::Spec {
        file_prefix: format!("e2e-{run}-{}", std::process::id()),
        socket,
        mac,
        cores: &["-l", "0,1"],
        pcap,
        interactive: false,
    };
    Testpmd::start(dir, &spec, app)
}

/// The one's-complement sum of `data` folded to 16 bits.
fn sum(data: &[u8], mut acc: u32) -> u32 {
    for c in data.chunks(2) {
        acc += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc
}

fn pseudo(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, len: usize) -> u32 {
    let mut p = Vec::new();
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&dst.octets());
    p.extend_from_slice(&[0, proto]);
    p.extend_from_slice(&(len as u16).to_be_bytes());
    sum(&p, 0)
}

/// An IPv4 frame's protocol, L4 bytes and whether its IP checksum and (for TCP,
/// and UDP with one) its L4 checksum verify.
fn l4_of(f: &[u8]) -> Option<(u8, &[u8], bool)> {
    if f.len() < 34 || f[12..14] != [0x08, 0x00] {
        return None;
    }
    let ihl = usize::from(f[14] & 0xf) * 4;
    let total = usize::from(u16::from_be_bytes([f[16], f[17]]));
    let ip = f.get(14..14 + total)?;
    let (src, dst) = (
        Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]),
        Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]),
    );
    let l4 = &ip[ihl..];
    let ip_ok = sum(&ip[..ihl], 0) == 0xffff;
    let proto = ip[9];
    let l4_ok = match proto {
        17 if l4.get(6..8) == Some(&[0, 0]) => true,
        6 | 17 => sum(l4, pseudo(src, dst, proto, l4.len())) == 0xffff,
        _ => true,
    };
    Some((proto, l4, ip_ok && l4_ok))
}

/// A TCP/IPv4 frame from `src` to `dst` (gateway MAC) with `payload` bytes
/// counting up from `seq` (a SYN without payload), its checksum field holding
/// the pseudo-header sum.
fn tcp_frame(src_mac: [u8; 6], src: Ipv4Addr, dst: Ipv4Addr, seq: u32, payload: usize) -> Vec<u8> {
    let flags = if payload == 0 { 0x02 } else { 0x18 };
    let mut f = Vec::with_capacity(54 + payload);
    f.extend_from_slice(&parse_mac(GATEWAY_MAC).unwrap_or([0; 6]));
    f.extend_from_slice(&src_mac);
    f.extend_from_slice(&[0x08, 0x00, 0x45, 0]);
    f.extend_from_slice(&((40 + payload) as u16).to_be_bytes());
    f.extend_from_slice(&[0x12, 0x34, 0x40, 0, 64, 6, 0, 0]);
    f.extend_from_slice(&src.octets());
    f.extend_from_slice(&dst.octets());
    let c = !(sum(&f[14..34], 0) as u16);
    f[24..26].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&40000u16.to_be_bytes());
    f.extend_from_slice(&TCP_PORT.to_be_bytes());
    f.extend_from_slice(&seq.to_be_bytes());
    f.extend_from_slice(&1u32.to_be_bytes());
    f.extend_from_slice(&[0x50, flags, 0xff, 0xff, 0, 0, 0, 0]);
    f.extend((0..payload).map(|i| (i % 251) as u8));
    let p = pseudo(src, dst, 6, 20 + payload) as u16;
    f[50..52].copy_from_slice(&p.to_be_bytes());
    f
}

/// The header of a [`tcp_frame`] without GSO: NEEDS_CSUM.
fn csum_hdr() -> [u8; 10] {
    let mut h = [0u8; 10];
    h[0] = 1;
    h[6..8].copy_from_slice(&34u16.to_le_bytes());
    h[8..10].copy_from_slice(&16u16.to_le_bytes());
    h
}

/// Sends the namespace guest's TCP connection opening (a SYN: the firewall
/// admits no flow picked up mid-stream) and then one GSO buffer of
/// [`GSO_PAYLOAD`] bytes, as its TCP stack hands its tap one.
fn send_gso(a: &e2e::Guest, a_ip: Ipv4Addr, vm_ip: Ipv4Addr) -> Result<()> {
    let raw = RawSocket::open(&a.ns, a.ifname())?.with_vnet_hdr()?;
    let a_mac = parse_mac(&a.spec.mac)?;
    raw.send_with_vnet_hdr(&csum_hdr(), &tcp_frame(a_mac, a_ip, vm_ip, 999_999, 0))?;
    std::thread::sleep(Duration::from_millis(100));
    let gso = tcp_frame(a_mac, a_ip, vm_ip, 1_000_000, GSO_PAYLOAD);
    raw.send_with_vnet_hdr(&gso_hdr(), &gso)
}

/// The GSO header of [`tcp_frame`]: NEEDS_CSUM, TCPV4, `gso_size` [`GSO_SIZE`].
fn gso_hdr() -> [u8; 10] {
    let mut h = [0u8; 10];
    h[0] = 1;
    h[1] = 1;
    h[2..4].copy_from_slice(&54u16.to_le_bytes());
    h[4..6].copy_from_slice(&GSO_SIZE.to_le_bytes());
    h[6..8].copy_from_slice(&34u16.to_le_bytes());
    h[8..10].copy_from_slice(&16u16.to_le_bytes());
    h
}

fn ipv4(ip: IpAddr) -> Result<Ipv4Addr> {
    match ip {
        IpAddr::V4(a) => Ok(a),
        IpAddr::V6(_) => Err(Error::new("an IPv4 guest was expected")),
    }
}

/// The sled with guest `A` in a namespace and the testpmd port (server mode,
/// MTU [`VM_MTU`]); returns the rack and the port's socket.
fn rack(prefix: &str) -> Result<(Rack, GuestSpec, PathBuf)> {
    let mut rack = Rack::build(&RackSpec::new(prefix, 1))?;
    rack.start_daemons(&[])?;
    rack.add_guest(GuestSpec::v4(A, 0, 3))?;
    let spec = GuestSpec::v4(VM, 0, 9).mtu(Some(VM_MTU));
    let socket = vhost_user_port(rack.sled(0)?, &spec)?;
    rack.publish_v2p()?;
    rack.publish_v2p_of(&spec)?;
    Ok((rack, spec, socket))
}

/// Waits until `list-ports` shows the port up with features for which `ok` holds.
fn wait_served(rack: &Rack, ok: impl Fn(&str) -> bool) -> Result<String> {
    poll_until(
        "testpmd's front end to start the rings",
        Duration::from_secs(20),
        || {
            let listed = rack.sled(0)?.admin(&["list-ports"])?;
            let row = listed.lines().find(|l| l.starts_with(VM)).unwrap_or("");
            let features = listed
                .lines()
                .find(|l| l.starts_with(&format!("{VM}: vhost-user features")))
                .unwrap_or("")
                .to_string();
            if row.ends_with(" up") && ok(&features) {
                Ok(features)
            } else {
                Err(Error::new(format!("{row}\n{features}")))
            }
        },
    )
}

/// A DPDK guest with its default features (no offloads): GSO buffers arrive as
/// valid segments of at most its MTU, UDP with valid checksums, and its own
/// 64-byte and 1514-byte frames reach the other guest.
#[test]
fn testpmd_without_offloads_gets_valid_segments_and_traffic_flows_both_ways() -> Result<()> {
    let (rack, spec, socket) = rack("tpa")?;
    let a = rack.guest(A)?;
    let a_ip = ipv4(a.ipv4()?)?;
    let vm_ip = spec
        .ipv4
        .ok_or_else(|| Error::new("the VM has no IPv4 address"))?;
    let capture = rack.dir().join("testpmd-rx.pcap");
    let pmd = testpmd(
        rack.dir(),
        "rx",
        &socket,
        &spec.mac,
        Some(&capture),
        &["--forward-mode=io"],
    )?;
    let features = wait_served(&rack, |f| f.contains("VERSION_1"))?;
    assert!(
        !features.contains("GUEST_TSO4") && !features.contains("GUEST_CSUM"),
        "{features}"
    );
    eprintln!("testpmd acked: {features}");

    // UDP of 64-byte and 1514-byte frames, and one 20000-byte TCP GSO buffer.
    const N: usize = 50;
    a.ns.within(|| {
        let s = UdpSocket::bind((a_ip, 0))?;
        for len in [18usize, 1472] {
            for _ in 0..N {
                s.send_to(&vec![0x5a; len], (vm_ip, UDP_PORT))?;
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        Ok(())
    })?;
    send_gso(a, a_ip, vm_ip)?;
    std::thread::sleep(Duration::from_secs(1));
    let out = pmd.stop()?;

    let frames = pcap::read(&capture)?;
    let (mut udp, mut stream, mut segments, mut bad) = ([0usize; 2], Vec::new(), 0, 0);
    for r in &frames {
        let Some((proto, l4, ok)) = l4_of(&r.data) else {
            continue;
        };
        let dport = u16::from_be_bytes([l4[2], l4[3]]);
        match (proto, dport) {
            (17, UDP_PORT) => {
                bad += usize::from(!ok);
                udp[usize::from(r.data.len() > 100)] += 1;
            }
            (6, TCP_PORT) if l4.len() > 20 => {
                bad += usize::from(!ok);
                assert!(
                    r.data.len() - 14 <= usize::from(VM_MTU),
                    "a segment of {} bytes",
                    r.data.len()
                );
                segments += 1;
                stream.extend_from_slice(&l4[20..]);
            }
            _ => {}
        }
    }
    let vhost = |name| rack.sled(0).and_then(|s| s.counter(None, name));
    eprintln!(
        "testpmd without offloads: {} frames captured: udp 64 B {} / 1514 B {}, tcp segments {segments} \
         ({} bytes), bad checksums {bad}; vhost_tx_segmented {} vhost_tx_segments {} \
         vhost_tx_csum_completed {}",
        frames.len(), udp[0], udp[1], stream.len(),
        vhost("vhost_tx_segmented")?, vhost("vhost_tx_segments")?, vhost("vhost_tx_csum_completed")?
    );
    let totals = out
        .rfind("Accumulated")
        .map_or(&out[out.len().saturating_sub(3000)..], |i| &out[i..]);
    eprintln!("testpmd:\n{totals}");
    assert_eq!(bad, 0, "every checksum verifies");
    assert_eq!(udp, [N, N], "every UDP frame arrived");
    assert_eq!(
        segments,
        GSO_PAYLOAD.div_ceil(usize::from(GSO_SIZE)),
        "segments of the GSO buffer"
    );
    let sent: Vec<u8> = (0..GSO_PAYLOAD).map(|i| (i % 251) as u8).collect();
    assert!(stream == sent, "the TCP payload arrived in order");
    assert!(
        vhost("vhost_tx_segmented")? >= 1,
        "cut by the datapath for the guest"
    );
    assert_eq!(vhost("vhost_rx_not_negotiated")?, 0);

    // testpmd's own frames toward A: 64 and 1514 bytes.
    for len in [64u16, 1514] {
        let rx = a.ns.within(|| {
            let s = UdpSocket::bind((a_ip, TXONLY_PORT))?;
            s.set_read_timeout(Some(Duration::from_millis(200)))?;
            Ok(s)
        })?;
        let txonly = testpmd::txonly_args(len, &GATEWAY_MAC, vm_ip, a_ip, TXONLY_PORT);
        let txonly: Vec<&str> = txonly.iter().map(String::as_str).collect();
        let pmd = testpmd(
            rack.dir(),
            &format!("tx{len}"),
            &socket,
            &spec.mac,
            None,
            &txonly,
        )?;
        wait_served(&rack, |f| f.contains("VERSION_1"))?;
        let (mut got, mut sizes) = (0u64, std::collections::BTreeSet::new());
        let end = Instant::now() + Duration::from_secs(2);
        let mut buf = [0u8; 2048];
        while Instant::now() < end {
            if let Ok(n) = rx.recv(&mut buf) {
                got += 1;
                sizes.insert(n);
            }
        }
        let out = pmd.stop()?;
        let sent = accumulated(&out, "TX-packets").unwrap_or(0);
        eprintln!("testpmd txonly {len} B: {sent} sent, {got} received by the namespace guest (payloads {sizes:?})");
        assert!(
            got >= 100,
            "testpmd's {len}-byte frames reached the guest: {got} of {sent}\n{out}"
        );
        assert_eq!(
            sizes.into_iter().collect::<Vec<_>>(),
            [usize::from(len) - 42]
        );
    }
    rack.teardown_quietly();
    Ok(())
}

/// With offloads on (TCP LRO and checksum offload: it acks GUEST_TSO4/6 and
/// GUEST_CSUM), the same GSO buffer reaches testpmd whole, as before: it counts
/// two frames (the SYN and the buffer), not the 14 segments a guest without
/// offloads gets.
#[test]
fn testpmd_with_offloads_gets_the_gso_buffer_whole() -> Result<()> {
    let (rack, spec, socket) = rack("tpb")?;
    let a = rack.guest(A)?;
    let a_ip = ipv4(a.ipv4()?)?;
    let vm_ip = spec
        .ipv4
        .ok_or_else(|| Error::new("the VM has no IPv4 address"))?;
    // TCP_CKSUM | TCP_LRO; one port, as a pcap port takes no offload.
    let pmd = testpmd(
        rack.dir(),
        "lro",
        &socket,
        &spec.mac,
        None,
        &["--forward-mode=rxonly", "--rx-offloads=0x18"],
    )?;
    let features = wait_served(&rack, |f| f.contains("GUEST_TSO4"))?;
    eprintln!("testpmd with offloads acked: {features}");
    assert!(
        features.contains("GUEST_CSUM") && features.contains("GUEST_TSO6"),
        "{features}"
    );
    send_gso(a, a_ip, vm_ip)?;
    std::thread::sleep(Duration::from_secs(1));
    let out = pmd.stop()?;
    let received = accumulated(&out, "RX-packets");
    let segmented = rack.sled(0)?.counter(None, "vhost_tx_segmented")?;
    eprintln!(
        "testpmd with offloads: {received:?} frames received, vhost_tx_segmented {segmented}"
    );
    assert_eq!(received, Some(2), "the SYN and the whole GSO buffer");
    assert_eq!(segmented, 0, "nothing cut");
    rack.teardown_quietly();
    Ok(())
}

/// A front end that acks an impossible feature set (GUEST_TSO4 without
/// GUEST_CSUM, which the virtio specification forbids) is disconnected, never
/// served: its connection is closed, `list-ports` shows the port down naming
/// why, and the daemon counts it (`vhost_refused`).
#[test]
fn a_front_end_acking_an_impossible_feature_set_is_disconnected_and_counted() -> Result<()> {
    use vhost::vhost_user::Frontend;
    use vhost::VhostBackend as _;
    let (rack, _spec, socket) = rack("tpc")?;
    let frontend =
        Frontend::connect(&socket, 2).map_err(|e| Error::new(format!("connect: {e}")))?;
    fn step<T>(r: vhost::Result<T>) -> Result<T> {
        r.map_err(|e| Error::new(format!("vhost-user: {e}")))
    }
    step(frontend.set_owner())?;
    let offered = step(frontend.get_features())?;
    // VERSION_1 (bit 32) and GUEST_TSO4 (bit 7), both offered; no GUEST_CSUM.
    let impossible = (1u64 << 32) | (1 << 7);
    assert_eq!(offered & impossible, impossible, "offered: {offered:#x}");
    step(frontend.set_features(impossible))?;
    poll_until(
        "the connection to be closed",
        Duration::from_secs(5),
        || match frontend.get_features() {
            Err(_) => Ok(()),
            Ok(_) => Err(Error::new("still served")),
        },
    )?;
    let sled = rack.sled(0)?;
    let listed = poll_until(
        "the port to show the refusal",
        Duration::from_secs(5),
        || {
            let listed = sled.admin(&["list-ports"])?;
            match listed
                .lines()
                .any(|l| l.starts_with(VM) && l.contains("refused and disconnected"))
            {
                true => Ok(listed),
                false => Err(Error::new(listed)),
            }
        },
    )?;
    eprintln!("{listed}");
    assert!(listed.contains("GUEST_TSO4 without GUEST_CSUM"), "{listed}");
    poll_until(
        "vhost_refused to count it",
        Duration::from_secs(5),
        || match sled.counter(None, "vhost_refused")? {
            1 => Ok(()),
            n => Err(Error::new(format!("vhost_refused {n}"))),
        },
    )?;
    rack.teardown_quietly();
    Ok(())
}
