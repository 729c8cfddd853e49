//! A guest attached the way libvirt attaches a VM: the port is created without
//! `--netns`, so its tap stays in the sled's namespace, and a Linux bridge joins
//! it to the guest's own link (here a veth whose far end, in a namespace of its
//! own, stands in for the VM's virtio device: it has the guest's MAC, as the VM's
//! NIC would). The tap must not carry the guest's MAC then (it gets
//! `fe:` + the rest of it): a bridge takes frames to its ports' own MACs for
//! itself, and the guest would receive nothing, not even the RA or a reply from
//! the gateway. Through the bridge the guest learns the port's MTU from the RA and
//! exchanges full-size packets with a guest on the other sled, both ways, IPv4
//! and IPv6.

use e2e::guest::create_port;
use e2e::standard::{self, B1};
use e2e::{Guest, Result};
use std::time::Duration;

const VM: &str = "v1";

/// The sled-side names of the bridge and of the veth end bridged to the "VM".
const BRIDGE: &str = "br-v1";
const VETH_SLED: &str = "vm-v1";

#[test]
fn a_guest_behind_a_bridge_gets_the_ra_and_full_size_traffic() -> Result<()> {
    let (mut rack, spec, vm_ns) = standard::rack_with_vm("vb", VM)?;
    let sled = rack.sled(0)?;
    // The port without --netns: its tap stays in the sled's namespace.
    create_port(sled, &spec, None)?;
    let tap_mac = sled
        .ns
        .run("cat", &[&format!("/sys/class/net/{VM}/address")])?;
    let want = format!("fe{}", &spec.mac[2..]);
    assert_eq!(tap_mac.trim(), want, "the tap's MAC is not the guest's");
    // The hypervisor's side: a bridge with the port's tap and a veth whose far end
    // is the "VM"'s NIC, with the guest's MAC and the port's MTU.
    let mtu = "8500";
    let peer = "vm-v1-nic";
    for cmd in [
        vec!["link", "add", BRIDGE, "type", "bridge"],
        vec![
            "link", "add", VETH_SLED, "mtu", mtu, "type", "veth", "peer", "name", peer, "mtu", mtu,
        ],
        vec![
            "link",
            "set",
            peer,
            "address",
            &spec.mac,
            "netns",
            vm_ns.name(),
        ],
        vec!["link", "set", VETH_SLED, "master", BRIDGE, "up"],
        vec!["link", "set", VM, "master", BRIDGE],
        vec!["link", "set", BRIDGE, "up"],
    ] {
        sled.ns.run("ip", &cmd)?;
    }
    // In the "VM", the NIC has the port's name, as the harness's guests do.
    vm_ns.run("ip", &["link", "set", peer, "name", VM])?;
    rack.guests.push(Guest { spec, ns: vm_ns });
    let vm = rack.guest(VM)?;
    vm.configure_os()?;
    rack.publish_v2p()?;

    let b1 = rack.guest(B1)?;
    let first = Duration::from_secs(20);
    vm.full_size_pings(b1, first)?;
    // The RA reached the guest through the bridge: its IPv6 MTU is the port's.
    vm.wait_for_ipv6_mtu(8500, first)?;
    Ok(())
}
