//! A port moving to another sled (`export-port`, `import-port`): the connections
//! and NAT state exported by one engine and imported by another carry on there as
//! if the port had never moved, and an export that cannot be the port's is refused
//! whole. Frames are built and checked with etherparse.

mod common;

use common::internet::*;
use common::*;
use engine::{EngineError, ExternalIps, Imported, LiveImportError, LiveState};
use etherparse::PacketBuilder;
use std::net::IpAddr;

const REMOTE: &str = "2001:db8:99::1";

/// A TCP segment on guest 1's connection to `REMOTE` port 80 from private port
/// 40000: from the guest (`out`) or from the internet to its floating address.
fn tcp(out: bool, flags: &str, seq: u32, ack: u32, payload: &[u8]) -> Vec<u8> {
    let g = guest(1);
    let (_, f6) = floating(&g);
    let remote: std::net::Ipv6Addr = REMOTE.parse().unwrap();
    let b = if out {
        PacketBuilder::ethernet2(g.mac.0, g.gw_mac.0)
            .ipv6(g.v6.octets(), remote.octets(), 64)
            .tcp(40000, 80, seq, 65535)
    } else {
        PacketBuilder::ethernet2(SWITCH_MAC, g.mac.0)
            .ipv6(remote.octets(), f6.octets(), 60)
            .tcp(80, 40000, seq, 65535)
    };
    let b = if flags.contains('S') { b.syn() } else { b };
    let b = if flags.contains('A') { b.ack(ack) } else { b };
    let mut buf = Vec::new();
    b.write(&mut buf, payload).unwrap();
    buf
}

fn floating_ips() -> ExternalIps {
    let (f4, f6) = floating(&guest(1));
    ExternalIps {
        floating: vec![IpAddr::V4(f4), IpAddr::V6(f6)],
        ..Default::default()
    }
}

/// `flows` after its text form and back, as `import-port` reads a file.
fn through_json(flows: &LiveState) -> LiveState {
    serde_json::from_str(&serde_json::to_string(flows).unwrap()).unwrap()
}

#[test]
fn a_snat_connection_keeps_its_external_port_on_the_new_sled() {
    let ext = snat(IpAddr::V4(snat4()), 5000, 5099);
    let (mut a, pa) = internet_sled(ext.clone());
    let remote = ip("8.8.8.8");
    let port_of = |got: Vec<Vec<u8>>| checked(&got[0]).1 .0;
    let ports: Vec<u16> = [1111, 2222, 3333]
        .iter()
        .map(|&sp| port_of(send(&mut a, pa, &udp_to(remote, sp), S)))
        .collect();
    let mut flows = through_json(&a.export_live("ga").unwrap());
    assert_eq!(flows.connections.len(), 3);
    assert_eq!(flows.nat.snat.len(), 3);
    // Counters come as they are, whatever they are: at the top they wrap.
    let last = |c: &&mut engine::ConnRecord| c.key.src_port == 3333;
    flows.connections.iter_mut().find(last).unwrap().out.packets = u64::MAX;

    let (mut b, pb) = internet_sled(ext);
    let got = b.import_live("ga", &flows).unwrap();
    assert_eq!(
        got,
        Imported {
            connections: 3,
            snat_ports: 3
        }
    );
    // The last flow first: a sled that had not imported it would give it the
    // range's first port.
    assert_eq!(
        port_of(send(&mut b, pb, &udp_to(remote, 3333), 2 * S)),
        ports[2]
    );
    let now = b.export_live("ga").unwrap().connections;
    let last = now.iter().find(|c| c.key.src_port == 3333).unwrap();
    assert_eq!(last.out.packets, 0);
    // A reply to the first flow's port reaches the guest.
    let back = from_internet(
        &mut b,
        &udp_reply(remote, IpAddr::V4(snat4()), ports[0]),
        2 * S,
    );
    assert_eq!(back.len(), 1);
    assert_eq!(checked(&back[0]).1, (53, 1111));
    assert_eq!(drops(&b, "nat_no_mapping"), 0);
    // A new flow gets a port the moved ones do not hold.
    let fresh = port_of(send(&mut b, pb, &udp_to(remote, 4444), 2 * S));
    assert!(!ports.contains(&fresh), "{fresh} is held by a moved flow");
}

#[test]
fn an_inbound_segment_of_a_moved_tcp_connection_is_taken_and_its_window_kept() {
    let (mut a, pa) = internet_sled(floating_ips());
    assert_eq!(send(&mut a, pa, &tcp(true, "S", 1000, 0, b""), S).len(), 1);
    assert_eq!(
        from_internet(&mut a, &tcp(false, "SA", 5000, 1001, b""), S).len(),
        1
    );
    assert_eq!(
        send(&mut a, pa, &tcp(true, "A", 1001, 5001, b""), S).len(),
        1
    );
    let flows = through_json(&a.export_live("ga").unwrap());
    assert_eq!(flows.connections.len(), 1);

    // The sled the port moved to, and one where it was made anew, whose firewall
    // (no inbound rule) refuses what is not a reply.
    let (mut moved, _) = internet_sled(floating_ips());
    moved.import_live("ga", &flows).unwrap();
    let (mut anew, _) = internet_sled(floating_ips());
    let data = tcp(false, "A", 5001, 1001, &[7; 100]);
    assert_eq!(from_internet(&mut moved, &data, 2 * S).len(), 1);
    assert!(from_internet(&mut anew, &data, 2 * S).is_empty());
    assert_eq!(drops(&anew, "fw_deny_in"), 1);
    // The peer's window moved along: a segment far beyond it is refused.
    let beyond = tcp(false, "A", 5101 + 10_000_000, 1001, &[7; 100]);
    assert!(from_internet(&mut moved, &beyond, 2 * S).is_empty());
    assert_eq!(drops(&moved, "tcp_out_of_window"), 1);
    assert_eq!(drops(&moved, "fw_deny_in"), 0);
    // And the connection kept its age and counters.
    let dumped = moved.export_live("ga").unwrap().connections;
    assert_eq!(dumped[0].out.packets, 2);
    assert_eq!(dumped[0].inb.packets, 2);
}

/// The refusal of importing `flows` into guest 1's port of a new sled with
/// external addresses `ext`, after checking that the port holds nothing after it.
fn refused(ext: ExternalIps, flows: &LiveState) -> LiveImportError {
    let (mut b, _) = internet_sled(ext);
    let err = b.import_live("ga", flows).unwrap_err();
    assert_eq!(b.stats().ports[0].firewall.flows, 0, "half applied: {err}");
    let empty = LiveState {
        from_sled: Some(SLED_A.parse().unwrap()),
        ..LiveState::default()
    };
    assert_eq!(b.export_live("ga").unwrap(), empty);
    match err {
        EngineError::Import { port, error } => {
            assert_eq!(port, "ga");
            error
        }
        other => panic!("not an import refusal: {other}"),
    }
}

#[test]
fn an_export_that_cannot_be_the_ports_is_refused_whole() {
    let ext = snat(IpAddr::V4(snat4()), 5000, 5099);
    let (mut a, pa) = internet_sled(ext.clone());
    send(&mut a, pa, &udp_to(ip("8.8.8.8"), 1111), S);
    send(&mut a, pa, &udp_to(ip("8.8.4.4"), 2222), S);
    let flows = a.export_live("ga").unwrap();

    // SNAT ports the port does not have on the new sled.
    let elsewhere = snat(IpAddr::V4(snat4()), 6000, 6099);
    let e = refused(elsewhere, &flows);
    assert!(
        e.to_string().contains("outside the port's SNAT range"),
        "{e}"
    );
    // A connection of another VPC, or from an address that is not the port's.
    let mut other_vni = flows.clone();
    other_vni.connections[1].key.vni += 1;
    assert!(matches!(
        refused(ext.clone(), &other_vni),
        LiveImportError::WrongVni { index: 1, .. }
    ));
    let mut spoofed = flows.clone();
    spoofed.connections[0].key.src_ip = ip("172.30.0.99");
    assert!(matches!(
        refused(ext.clone(), &spoofed),
        LiveImportError::NotPortAddress { index: 0, .. }
    ));
    // Between two families; idle past its timeout (60 s for UDP).
    let mut mixed = flows.clone();
    mixed.connections[0].key.dst_ip = ip("2001:db8::8");
    assert!(matches!(
        refused(ext.clone(), &mixed),
        LiveImportError::MixedFamilies { index: 0, .. }
    ));
    let mut stale = flows.clone();
    stale.connections[1].idle_ns = 61 * S;
    let e = refused(ext.clone(), &stale);
    assert!(e.to_string().contains("past its timeout"), "{e}");
    // A connection given twice; a SNAT port without its connection.
    let mut twice = flows.clone();
    twice.connections.push(twice.connections[0].clone());
    assert!(refused(ext.clone(), &twice)
        .to_string()
        .contains("given twice"));
    let mut orphan = flows.clone();
    orphan.connections.truncate(1);
    assert!(refused(ext.clone(), &orphan)
        .to_string()
        .contains("belongs to no imported connection"));

    // A port that has connections of its own takes none.
    let (mut busy, pb) = internet_sled(ext);
    send(&mut busy, pb, &udp_to(ip("9.9.9.9"), 3333), S);
    let err = busy.import_live("ga", &flows).unwrap_err();
    assert_eq!(err.code(), "conflict", "{err}");
    assert_eq!(busy.stats().ports[0].firewall.flows, 1);
}

#[test]
fn tcp_state_no_segment_could_have_made_does_not_decode() {
    let (mut a, pa) = internet_sled(floating_ips());
    send(&mut a, pa, &tcp(true, "S", 1000, 0, b""), S);
    let json = serde_json::to_value(a.export_live("ga").unwrap()).unwrap();
    let decode = |v: &serde_json::Value| serde_json::from_value::<LiveState>(v.clone());
    assert!(decode(&json).is_ok());
    let mut shifted = json.clone();
    shifted["connections"][0]["tcp"]["peer"]["shift"] = 15.into();
    let e = decode(&shifted).unwrap_err().to_string();
    assert!(e.contains("window shift 15 is above 14"), "{e}");
    let mut scaled = json.clone();
    scaled["connections"][0]["tcp"]["guest"]["ws"] = 20.into();
    let e = decode(&scaled).unwrap_err().to_string();
    assert!(e.contains("window scale 20"), "{e}");
    let mut wide = json.clone();
    wide["connections"][0]["tcp"]["peer"]["max_win"] = u32::MAX.into();
    let e = decode(&wide).unwrap_err().to_string();
    assert!(e.contains("window 4294967295 is above"), "{e}");
    let mut unknown = json.clone();
    unknown["connections"][0]["colour"] = "blue".into();
    assert!(decode(&unknown).is_err());
    // TCP without its state is refused on import (it would be picked up blind).
    let mut flows: LiveState = decode(&json).unwrap();
    flows.connections[0].tcp = None;
    assert!(refused(floating_ips(), &flows)
        .to_string()
        .contains("TCP without TCP state"));
}

#[test]
fn a_guest_that_spent_its_burst_does_not_get_a_new_one_by_moving() {
    let ext = snat(IpAddr::V4(snat4()), 5000, 5099);
    let limits = engine::PortLimits {
        egress_mbps: Some(8), // 1 MB/s
        burst_kib: Some(64),
        ..engine::PortLimits::default()
    };
    let limited = || {
        let (mut e, p) = internet_sled(ext.clone());
        e.set_port_limits("ga", limits).unwrap();
        (e, p)
    };
    let (mut a, pa) = limited();
    let mut sent = 0;
    while a.egress_wait(pa, S).is_none() {
        send(&mut a, pa, &udp_to(ip("8.8.8.8"), 1111), S);
        sent += 1;
    }
    assert!(sent > 1, "the burst let {sent} frames through");
    let live = through_json(&a.export_live("ga").unwrap());
    let owed = live.buckets.egress_bytes.unwrap();
    assert!(owed <= 0, "{owed}");
    // The new sled's clock is where the old one's was (a worker ticks it).
    let (mut moved, pm) = limited();
    moved.tick(S, &mut engine::TxBatch::new());
    moved.import_live("ga", &live).unwrap();
    assert!(moved.egress_wait(pm, S).is_some(), "the burst came back");
    let (mut anew, pn) = limited();
    assert!(anew.egress_wait(pn, S).is_none());
}
