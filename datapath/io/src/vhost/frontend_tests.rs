//! A port driven by a front end written in the test ([`super::test_frontend`]).

use vhost::VhostBackend as _;
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_net::{
    VIRTIO_NET_F_CSUM, VIRTIO_NET_F_GUEST_TSO4, VIRTIO_NET_F_HOST_TSO4,
};
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use wire::vnet::VnetHdr;

use super::test_frontend::{bits, connect, frame, linux_features, wait_for, write, Guest};

#[test]
fn a_front_end_with_accepted_features_is_served() {
    let (port, g) = connect("ok", linux_features(), 2048);
    assert!(wait_for(|| port.is_up()), "the rings started");
    write(&port, &frame()).unwrap();
    assert_eq!(g.rx_used(), 1, "the frame reached the guest");
    let n = port.negotiation();
    assert_eq!(n.features, linux_features());
    assert_eq!((n.refusals, n.last_refusal), (0, None));
    let all = super::GuestTakes {
        csum: true,
        tso4: true,
        tso6: true,
        ecn: false,
    };
    assert_eq!(port.guest_takes(), all);
    assert!(g.frontend.get_features().is_ok(), "the connection is open");
}

/// The front end is disconnected: no ring starts, no frame reaches it, and the
/// refusal is counted and kept for `list-ports`.
fn assert_refused(port: &super::VhostPort, g: &Guest, why: &str) {
    assert!(
        wait_for(|| g.frontend.get_features().is_err()),
        "the connection was closed"
    );
    assert!(!port.is_up(), "no ring runs");
    let e = write(port, &frame()).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "the link is down");
    assert_eq!(g.rx_used(), 0, "no frame reached the guest");
    let n = port.negotiation();
    assert_eq!(n.features, 0);
    assert_eq!(n.refusals, 1);
    let last = n.last_refusal.map(|r| r.to_string()).unwrap_or_default();
    assert!(last.contains(why), "{last:?} names {why:?}");
    let counts = port.take_counts();
    assert_eq!(counts.refused, 1);
    assert_eq!(port.take_counts().refused, 0, "counted once");
}

#[test]
fn a_legacy_front_end_is_disconnected_and_never_served() {
    let legacy = linux_features() & !bits(&[VIRTIO_F_VERSION_1]);
    let (port, g) = connect("legacy", legacy, 2048);
    assert_refused(&port, &g, "VERSION_1");
}

#[test]
fn a_front_end_with_guest_tso_but_no_guest_csum_is_disconnected() {
    let impossible = bits(&[VIRTIO_F_VERSION_1, VIRTIO_NET_F_GUEST_TSO4]);
    let (port, g) = connect("nocsum", impossible, 2048);
    assert_refused(&port, &g, "GUEST_CSUM");
}

/// A guest that took no offload (a DPDK guest by default) is served: each frame
/// in one receive buffer behind a header without offloads; a frame larger than
/// its buffers is dropped (`ENOBUFS`), the ring left as it was.
#[test]
fn a_front_end_without_offloads_is_served_one_buffer_per_frame() {
    let (port, g) = connect("plain", bits(&[VIRTIO_F_VERSION_1]), 1526);
    assert!(wait_for(|| port.is_up()), "the rings started");
    let none = super::GuestTakes {
        csum: false,
        tso4: false,
        tso6: false,
        ecn: false,
    };
    assert_eq!(port.guest_takes(), none, "the worker remakes frames for it");
    let mut big = frame();
    big.resize(1514, 0x5a);
    write(&port, &big).unwrap();
    assert_eq!(g.rx_used(), 1);
    let got = g.received(0);
    assert_eq!(got.len(), 12 + 1514);
    assert_eq!(&got[..10], &[0u8; 10], "no offload in the header");
    assert_eq!(u16::from_le_bytes([got[10], got[11]]), 1, "num_buffers");
    assert_eq!(&got[12..], &big[..]);
    big.resize(1515, 0);
    let e = write(&port, &big).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOBUFS));
    assert_eq!(g.rx_used(), 1, "nothing more published");
    assert_eq!(port.negotiation().refusals, 0);
}

/// What a guest sends is held to what it negotiated: a GSO frame without
/// HOST_TSO4 and a partial checksum without CSUM are dropped and counted; the
/// frame after them is read.
#[test]
fn a_gso_frame_from_a_guest_without_host_tso_is_dropped_and_counted() {
    let tcp4 = VnetHdr {
        flags: 1,
        gso_type: 1,
        hdr_len: 54,
        gso_size: 1448,
        csum_start: 34,
        csum_offset: 16,
    };
    let csum = VnetHdr {
        gso_type: 0,
        gso_size: 0,
        ..tcp4
    };
    let mut buf = vec![0u8; 65536];
    // CSUM but no HOST_TSO4: the GSO frame goes, the partial checksum is fine.
    let (port, g) = connect(
        "notso",
        bits(&[VIRTIO_F_VERSION_1, VIRTIO_NET_F_CSUM]),
        2048,
    );
    assert!(wait_for(|| port.is_up()), "the rings started");
    g.send(&tcp4, &frame());
    g.send(&csum, &frame());
    g.send(&VnetHdr::default(), &frame());
    let (hdr, len) = port.recv(&mut buf).unwrap().unwrap();
    assert_eq!((hdr, len), (csum, 60), "the GSO frame was skipped");
    let (hdr, _) = port.recv(&mut buf).unwrap().unwrap();
    assert_eq!(hdr, VnetHdr::default());
    assert!(port.recv(&mut buf).unwrap().is_none());
    assert_eq!(port.take_counts().rx_not_negotiated, 1);
    assert_eq!(port.take_counts().rx_not_negotiated, 0, "counted once");
    drop((port, g));

    // No CSUM either: the partial checksum is dropped too.
    let (port, g) = connect("nocsum-tx", bits(&[VIRTIO_F_VERSION_1]), 2048);
    assert!(wait_for(|| port.is_up()), "the rings started");
    g.send(&csum, &frame());
    assert!(port.recv(&mut buf).unwrap().is_none());
    assert_eq!(port.take_counts().rx_not_negotiated, 1);
    drop((port, g));

    // With HOST_TSO4 the GSO frame is the guest's to send.
    let tso = bits(&[
        VIRTIO_F_VERSION_1,
        VIRTIO_NET_F_CSUM,
        VIRTIO_NET_F_HOST_TSO4,
    ]);
    let (port, g) = connect("tso", tso, 2048);
    assert!(wait_for(|| port.is_up()), "the rings started");
    g.send(&tcp4, &frame());
    let (hdr, _) = port.recv(&mut buf).unwrap().unwrap();
    assert_eq!(hdr, tcp4);
    assert_eq!(port.take_counts().rx_not_negotiated, 0);
}

/// While QEMU migrates the VM, every page the port writes — the receive buffer
/// a frame went into, both used rings — is marked in the dirty log, and nothing
/// else; once the migration ends, nothing is marked.
#[test]
fn while_migrating_every_page_the_port_writes_is_marked_in_the_dirty_log() {
    let (port, mut g) = connect("log", linux_features(), 2048);
    assert!(wait_for(|| port.is_up()), "the rings started");
    let log = g.start_logging().unwrap();
    assert!(
        port.negotiation().features & (1 << 26) != 0,
        "LOG_ALL acked"
    );
    let mut buf = vec![0u8; 65536];
    g.send(&VnetHdr::default(), &frame());
    let before = g.snapshot();
    write(&port, &frame()).unwrap();
    assert!(port.recv(&mut buf).unwrap().is_some());
    let changed = g.pages_changed_since(&before);
    // Receive used ring (page 0), transmit used ring (page 1), buffer 0.
    assert_eq!(changed, [0, 1, 0x40].into(), "what the port wrote");
    assert_eq!(log.pages(), changed, "marked: exactly what it wrote");

    // A frame refused for want of buffers marks the ones it wrote into.
    log.clear();
    let before = g.snapshot();
    let big = vec![0x5au8; 16 * 2048];
    assert!(write(&port, &big).is_err());
    let changed = g.pages_changed_since(&before);
    assert!(!changed.is_empty(), "the refused frame wrote buffers");
    assert!(log.pages().is_superset(&changed), "{changed:?} all marked");

    g.stop_logging().unwrap();
    log.clear();
    write(&port, &frame()).unwrap();
    assert!(log.pages().is_empty(), "nothing marked after the migration");
    assert!(g.frontend.get_features().is_ok(), "the connection is open");
}

/// Interrupts: a guest that sets `VRING_AVAIL_F_NO_INTERRUPT` gets none; with
/// `EVENT_IDX`, one when the used index passes its `used_event`.
#[test]
fn a_guest_is_interrupted_only_when_it_asks_to_be() {
    let (port, g) = connect("intr", linux_features(), 2048);
    assert!(wait_for(|| port.is_up()), "the rings started");
    g.set_avail_flags(0, 1);
    write(&port, &frame()).unwrap();
    port.flush();
    assert!(!g.interrupted(0), "NO_INTERRUPT honoured");
    g.set_avail_flags(0, 0);
    write(&port, &frame()).unwrap();
    port.flush();
    assert!(g.interrupted(0), "interrupted once the flag is gone");
    drop((port, g));

    let event_idx = linux_features() | bits(&[VIRTIO_RING_F_EVENT_IDX]);
    let (port, g) = connect("intr-ev", event_idx, 2048);
    assert!(wait_for(|| port.is_up()), "the rings started");
    g.set_avail_flags(0, 1); // ignored with EVENT_IDX
    g.set_used_event(0, 1); // interrupt when the used index passes 1
    write(&port, &frame()).unwrap();
    port.flush();
    assert!(!g.interrupted(0), "used index 1: not past used_event");
    write(&port, &frame()).unwrap();
    write(&port, &frame()).unwrap();
    port.flush();
    assert!(g.interrupted(0), "used index 3: past used_event");
    write(&port, &frame()).unwrap();
    port.flush();
    assert!(!g.interrupted(0), "used_event not moved: no more");
}

/// Kicks: while the worker polls (it takes frames), the guest is asked not to
/// kick; before it sleeps it asks again, and hears of frames already waiting.
#[test]
fn a_guest_is_asked_to_kick_only_while_the_worker_sleeps() {
    for (name, features) in [
        ("kick", linux_features()),
        (
            "kick-ev",
            linux_features() | bits(&[VIRTIO_RING_F_EVENT_IDX]),
        ),
    ] {
        let event_idx = features & bits(&[VIRTIO_RING_F_EVENT_IDX]) != 0;
        let (port, g) = connect(name, features, 2048);
        assert!(wait_for(|| port.is_up()), "the rings started");
        let mut buf = vec![0u8; 65536];
        assert_eq!(g.used_flags(1), 0, "{name}: kicks at first");
        assert!(port.recv(&mut buf).unwrap().is_none());
        let quiet = if event_idx { 0 } else { 1 };
        assert_eq!(g.used_flags(1), quiet, "{name}: polled, no kicks wanted");
        assert!(!port.arm_kicks(), "{name}: nothing waiting");
        assert_eq!(g.used_flags(1), 0, "{name}: kicks wanted before a sleep");
        g.send(&VnetHdr::default(), &frame());
        g.send(&VnetHdr::default(), &frame());
        assert!(port.arm_kicks(), "{name}: frames waiting: no sleep");
        assert!(port.recv(&mut buf).unwrap().is_some());
        assert!(port.recv(&mut buf).unwrap().is_some());
        assert!(!port.arm_kicks(), "{name}: all taken");
        if event_idx {
            assert_eq!(g.avail_event(1), 2, "kick for the frame after the 2 taken");
        }
        // Receive buffers are found when a frame comes: never a kick for them.
        write(&port, &frame()).unwrap();
        assert_eq!(g.used_flags(0), quiet, "{name}: no receive kicks");
    }
}
