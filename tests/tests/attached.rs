//! A guest attached the way a hypervisor attaches a VM with `--attach`: the
//! hypervisor owns the guest's link and the daemon attaches to the host side of it
//! with a packet socket (`PACKET_VNET_HDR`). Here the hypervisor's tap is a veth
//! pair made by the test: the sled-side end is the attached interface (left at the
//! default MTU 1500, as QEMU leaves a tap with `script=no`), the far end, in a
//! namespace of its own with the guest's MAC and MTU 8500, stands in for the VM's
//! virtio device. A veth keeps TSO and checksum offload on both ends, so the
//! stand-in sends 64 KiB GSO buffers, as a VM does, and receives coalesced ones.
//!
//! Proved: a port is not attached to the sled's underlay link or to an interface
//! that does not exist; the daemon raises the interface's MTU to the port's; the
//! guest learns MTU 8500 from the RA; full-size pings cross the sleds both ways
//! over IPv4 and IPv6; bulk TCP arrives byte-exact both ways with the port's
//! `tso_buffers_in` growing one way and GSO frames handed to the guest the other
//! (also through an interface without TSO, where the kernel segments them);
//! `delete-xde` leaves the interface alone; an interface deleted and made again
//! (the VM restarted) is attached again and traffic resumes, as after it is taken
//! down (the daemon brings it up again); a daemon restart restores the attached
//! port, and one while the interface is missing keeps the port until it is back.

use e2e::guest::GuestSpec;
use e2e::rack::UNDERLAY_IF;
use e2e::standard::{self, A1, B1};
use e2e::xfer::transfer;
use e2e::{Guest, Netns, Rack, Result, Sled};
use std::path::Path;
use std::time::Duration;

const VM: &str = "v1";
/// The attached interface: the sled-side end of the "hypervisor's tap".
const IFACE: &str = "vm-v1";
const FIRST: Duration = Duration::from_secs(20);
/// How long the daemon may take to notice an interface going or coming back.
const NOTICE: Duration = Duration::from_secs(15);
const BULK: u64 = 100 << 20;

fn xfer_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_e2e-xfer"))
}

/// The "hypervisor" makes the VM's link: a veth whose sled end `IFACE` stays at the
/// default MTU and down, and whose far end, named like the guest, goes into `vm_ns`
/// with the guest's MAC and the MTU its virtio device advertises (8500).
fn hypervisor_link(sled: &Sled, vm_ns: &Netns, spec: &GuestSpec) -> Result<()> {
    sled.ns.ip(&[
        "link",
        "add",
        IFACE,
        "type",
        "veth",
        "peer",
        "name",
        &spec.name,
        "netns",
        vm_ns.name(),
        "address",
        &spec.mac,
        "mtu",
        "8500",
    ])?;
    Ok(())
}

/// `IFACE`'s MTU on the sled.
fn iface_mtu(sled: &Sled) -> Result<u32> {
    let v = sled
        .ns
        .run("cat", &[&format!("/sys/class/net/{IFACE}/mtu")])?;
    v.trim()
        .parse()
        .map_err(|_| e2e::Error::new(format!("{IFACE} MTU is {v:?}")))
}

/// Full-size pings between the VM and b1, both ways, IPv4 and IPv6.
fn full_size_pings(rack: &Rack, within: Duration) -> Result<()> {
    rack.guest(VM)?.full_size_pings(rack.guest(B1)?, within)
}

#[test]
fn an_attached_vm_link_carries_full_size_traffic_and_tso_and_survives_restarts() -> Result<()> {
    let (mut rack, spec, vm_ns) = standard::rack_with_vm("va", VM)?;
    let sled = rack.sled(0)?;
    hypervisor_link(sled, &vm_ns, &spec)?;
    assert_eq!(iface_mtu(sled)?, 1500);
    // Not to the sled's underlay link, nor to an interface that is not there.
    for (iface, why) in [
        (UNDERLAY_IF, "is an underlay link of this daemon"),
        ("vm-none", "\"vm-none\": no such interface"),
    ] {
        let wrong = spec.create_args_in_sled(&["--attach", iface]);
        let wrong: Vec<&str> = wrong.iter().map(String::as_str).collect();
        let e = sled
            .admin(&wrong)
            .expect_err("attached to the wrong interface");
        assert!(e.to_string().contains(why), "{e}");
    }
    let args = spec.create_args_in_sled(&["--attach", IFACE]);
    let create: Vec<&str> = args.iter().map(String::as_str).collect();
    sled.admin(&create)?;
    assert_eq!(iface_mtu(sled)?, 8500, "the daemon raised {IFACE}'s MTU");
    let log = sled.daemon()?.log();
    assert!(
        log.contains("attached interface's MTU raised to the port's")
            && log.contains("from=1500 to=8500")
            && log.contains("attached interface was down: brought up"),
        "{log}"
    );
    let budget = sled.admin(&["--json", "mtu", VM])?;
    let budget: serde_json::Value = serde_json::from_str(&budget).expect("mtu JSON");
    assert_eq!(budget["data"]["virtio_host_mtu"], 8500, "{budget}");
    let listed = sled.admin(&["--json", "list-ports"])?;
    let v: serde_json::Value = serde_json::from_str(&listed).expect("list-ports JSON");
    let vm_port = v["data"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["config"]["name"] == VM))
        .cloned()
        .unwrap_or_default();
    assert_eq!(vm_port["attach"], IFACE, "{listed}");
    assert_eq!(vm_port["link"]["state"], "up", "{listed}");
    rack.guests.push(Guest { spec, ns: vm_ns });
    rack.guest(VM)?.configure_os()?;
    rack.publish_v2p()?;

    full_size_pings(&rack, FIRST)?;
    let vm = rack.guest(VM)?;
    vm.wait_for_ipv6_mtu(8500, FIRST)?;

    // Bulk TCP both ways, byte-exact; the stand-in VM sends GSO buffers, which
    // arrive whole through the packet socket.
    let (a1, b1) = (rack.guest(A1)?, rack.guest(B1)?);
    let sled = rack.sled(0)?;
    let tso_before = sled.counter(Some(VM), e2e::stats::TSO_BUFFERS)?;
    let out = transfer(xfer_bin(), vm, b1, b1.ipv4()?, 5301, BULK, FIRST * 6)?;
    let tso_after = sled.counter(Some(VM), e2e::stats::TSO_BUFFERS)?;
    assert!(
        tso_after > tso_before + 100,
        "tso_buffers_in of the attached port went from {tso_before} to {tso_after}"
    );
    // Toward the VM the datapath coalesces the segments and hands it GSO frames,
    // which the kernel takes through the packet socket (a refused one would count
    // as `tap_tx_errors`).
    let gso_before = sled.counter(None, "gso_frames_out")?;
    let back = transfer(xfer_bin(), b1, vm, vm.ipv6()?, 5302, BULK, FIRST * 6)?;
    let gso_after = sled.counter(None, "gso_frames_out")?;
    assert!(
        gso_after > gso_before + 100,
        "GSO frames to the guests went from {gso_before} to {gso_after}"
    );
    assert_eq!(sled.counter(None, "tap_tx_errors")?, 0);
    // The same transfers through a daemon-made tap on the same sled, for
    // comparison (informational: the machine is shared).
    let tap = transfer(xfer_bin(), a1, b1, b1.ipv4()?, 5303, BULK, FIRST * 6)?;
    let tap_back = transfer(xfer_bin(), b1, a1, a1.ipv6()?, 5304, BULK, FIRST * 6)?;
    eprintln!(
        "100 MiB, Mbit/s: attached vm -> b1 {}, b1 -> attached vm {}; tap a1 -> b1 {}, b1 -> tap a1 {}",
        out.mbit_per_s, back.mbit_per_s, tap.mbit_per_s, tap_back.mbit_per_s
    );
    assert_eq!(sled.counter(None, "attached_rx_dropped")?, 0);

    // A VM whose device takes no TSO (QEMU sets the tap's offloads from the VM's
    // virtio features): the kernel segments the GSO frames written to the
    // interface before it, and the transfer is still byte-exact.
    sled.ns.run("ethtool", &["-K", IFACE, "tso", "off"])?;
    let gso_before = sled.counter(None, "gso_frames_out")?;
    transfer(xfer_bin(), b1, vm, vm.ipv4()?, 5305, BULK / 4, FIRST * 6)?;
    assert!(sled.counter(None, "gso_frames_out")? > gso_before + 10);
    sled.ns.run("ethtool", &["-K", IFACE, "tso", "on"])?;

    // delete-xde lets go of the interface but leaves it to its owner; the port
    // made again attaches to it again.
    sled.admin(&["delete-xde", VM])?;
    sled.ns.ip(&["link", "show", IFACE])?;
    sled.admin(&create)?;
    full_size_pings(&rack, FIRST)?;

    // The VM goes (the hypervisor deletes its tap) and comes back with a new one:
    // the port goes down and is attached again by itself.
    sled.ns.ip(&["link", "del", IFACE])?;
    sled.wait_for_link(VM, "down", NOTICE)?;
    let vm_ns = &rack.guest(VM)?.ns;
    hypervisor_link(sled, vm_ns, &rack.guest(VM)?.spec)?;
    sled.wait_for_link(VM, "up", NOTICE)?;
    assert_eq!(sled.counter(None, "tap_gone")?, 1);
    assert_eq!(sled.counter(None, "tap_reattached")?, 1);
    assert_eq!(iface_mtu(sled)?, 8500);
    rack.guest(VM)?.configure_os()?;
    full_size_pings(&rack, FIRST)?;

    // Taken down, the interface is attached again at once, and so brought up.
    sled.ns.ip(&["link", "set", IFACE, "down"])?;
    e2e::poll_until("the downed interface to be attached again", NOTICE, || {
        let (gone, back) = (
            sled.counter(None, "tap_gone")?,
            sled.counter(None, "tap_reattached")?,
        );
        let flags = sled.ns.ip(&["-o", "link", "show", IFACE])?;
        if (gone, back) == (2, 2) && flags.contains(",UP") {
            Ok(())
        } else {
            Err(e2e::Error::new(format!(
                "gone {gone}, reattached {back}: {flags}"
            )))
        }
    })?;
    full_size_pings(&rack, FIRST)?;

    // A daemon restart restores the attached port from its state.
    rack.restart_daemon(0, &[])?;
    let sled = rack.sled(0)?;
    sled.wait_for_link(VM, "up", NOTICE)?;
    full_size_pings(&rack, FIRST)?;

    // Restarted while the VM is away, the daemon keeps the port, not applied,
    // and attaches it once the interface is back.
    rack.stop_daemon(0)?;
    rack.sled(0)?.ns.ip(&["link", "del", IFACE])?;
    rack.start_daemon(0, &[])?;
    let sled = rack.sled(0)?;
    let listed = sled.admin(&["--json", "list-ports"])?;
    assert!(
        listed.contains("interface \\\"vm-v1\\\": no such interface"),
        "{listed}"
    );
    hypervisor_link(sled, &rack.guest(VM)?.ns, &rack.guest(VM)?.spec)?;
    // Retried after 1, 2, 4, 8 s.
    sled.wait_for_link(VM, "up", NOTICE * 2)?;
    rack.guest(VM)?.configure_os()?;
    full_size_pings(&rack, FIRST)?;
    Ok(())
}
