//! The setups compared, and building each one's topology for a guest MTU.
//!
//! Every topology has a client guest (on sled 0, or one end of the plain veth) and
//! a server guest (sled 1), addressed alike in every setup, so the same iperf3
//! and sockperf commands (or testpmd's frames) run on all of them. Setups with an underlay start from the harness's
//! [`Rack`]: a switch namespace with a bridge at MTU 9000 and two sled namespaces
//! (`fd00:99::1`, `fd00:99::2` on `ul0`) whose full-size path is checked.

use super::cpu::Watched;
use super::iperf::{Family, GuestKind, Test};
use super::ovs::Ovs;
use super::pmd::{OursVhost, PmdPorts};
use super::process::tail;
use super::vm::VmPair;
use crate::guest::GuestSpec;
use crate::netns::{unique_id, Netns};
use crate::poll::poll_until;
use crate::rack::{Rack, RackSpec, Sled, UNDERLAY_MTU};
use crate::vm::{Vm, Way};
use crate::{Cmd, Error, Result};
use std::cell::RefCell;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

/// The client guest's addresses (the iperf3 and sockperf client).
pub const CLIENT_V4: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 11);
pub const CLIENT_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 1, 0, 0, 0, 0, 0, 0x11);
/// The server guest's addresses (the iperf3 and sockperf server).
pub const SERVER_V4: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 12);
pub const SERVER_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 1, 0, 0, 0, 0, 0, 0x12);

/// The guests' interface name in the kernel-networking setups.
pub const GUEST_IF: &str = "eth0";
/// The sled's end of the veth to its guest in the kernel-networking setups.
pub const SLED_GUEST_IF: &str = "gv";

/// VXLAN over IPv6 adds outer Ethernet 14 + IPv6 40 + UDP 8 + VXLAN 8 bytes.
const VXLAN_MTU: u16 = UNDERLAY_MTU - 70;
/// Each sled's bridge between its VXLAN device and its guest.
const VXLAN_BRIDGE: &str = "brv";
const VXLAN_DEV: &str = "vx0";
/// The VNI every setup with a tunnel uses (the harness's VPC VNI).
pub const VNI: u32 = 10;

/// How long the first packets may take (neighbour resolution, flow set-up).
const FIRST_REPLY: Duration = Duration::from_secs(20);

/// What carries the guests' traffic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// This datapath, `overlayd` started with these extra flags.
    Ours {
        flags: Vec<String>,
    },
    Vxlan,
    /// Kernel VXLAN with the sleds' underlay devices unable to take UDP-tunnel
    /// GSO: TSO buffers are cut into underlay-sized frames at the sled's edge, as
    /// a NIC without tunnel offloads would need.
    VxlanWire,
    Veth,
    Ovs,
    /// This datapath (default flags) with testpmd guests on vhost-user ports.
    OursVhost,
    /// OVS with DPDK (`netdev` datapath, `dpdkvhostuser` ports) and testpmd guests.
    OvsDpdk,
    /// This datapath (default flags) with a VM as the client guest, attached to
    /// its port this way.
    Vm {
        way: Way,
    },
}

/// A named setup: a column of the results.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Setup {
    pub name: String,
    pub kind: Kind,
}

/// The setup every other is compared with.
pub const BASELINE: &str = "vxlan";

/// The setup the testpmd rows are compared with.
pub const PMD_BASELINE: &str = "ovs-dpdk";

/// Names of the fixed setups, in run order after this datapath's variants.
pub const FIXED: [&str; 6] = [
    "vxlan",
    "vxlan-wire",
    "veth",
    "ovs",
    "ours-vhost",
    "ovs-dpdk",
];

/// `--skip` names of groups of setups: every variant of this datapath, every VM
/// setup, both testpmd setups.
pub const GROUPS: [&str; 3] = ["ours", "vm", "testpmd"];

impl Setup {
    /// The VM setups, one per attachment way, in run order.
    pub fn vms() -> Vec<Setup> {
        Way::ALL
            .into_iter()
            .map(|way| Setup {
                name: format!("vm-{}", way.name()),
                kind: Kind::Vm { way },
            })
            .collect()
    }

    pub fn is_vm(&self) -> bool {
        matches!(self.kind, Kind::Vm { .. })
    }

    /// What plays its guests.
    pub fn guest_kind(&self) -> GuestKind {
        match self.kind {
            Kind::Vm { .. } => GuestKind::Vm,
            Kind::OursVhost | Kind::OvsDpdk => GuestKind::Testpmd,
            _ => GuestKind::Netns,
        }
    }

    /// Whether `--skip group` names this setup (see [`GROUPS`]).
    pub fn in_group(&self, group: &str) -> bool {
        match group {
            "ours" => matches!(self.kind, Kind::Ours { .. }),
            "vm" => self.is_vm(),
            "testpmd" => self.guest_kind() == GuestKind::Testpmd,
            _ => false,
        }
    }

    /// Whether the setup runs this datapath's `overlayd` (its variants, the VM
    /// setups and `ours-vhost`).
    pub fn runs_overlayd(&self) -> bool {
        matches!(
            self.kind,
            Kind::Ours { .. } | Kind::Vm { .. } | Kind::OursVhost
        )
    }

    /// Whether `test` runs on this setup: each test on the setups whose guests
    /// can run it (VM tests on the VM setups, testpmd's on the testpmd setups,
    /// iperf3's and sockperf's everywhere else).
    pub fn runs(&self, test: &Test) -> bool {
        test.guest_kind() == self.guest_kind()
    }

    /// A fixed setup by name (one of [`FIXED`]).
    pub fn fixed(name: &str) -> Option<Setup> {
        let kind = match name {
            "vxlan" => Kind::Vxlan,
            "vxlan-wire" => Kind::VxlanWire,
            "veth" => Kind::Veth,
            "ovs" => Kind::Ovs,
            "ours-vhost" => Kind::OursVhost,
            "ovs-dpdk" => Kind::OvsDpdk,
            _ => return None,
        };
        Some(Setup {
            name: name.to_string(),
            kind,
        })
    }

    /// Builds the topology for guest MTU `mtu` (namespace names start with
    /// `prefix`), and checks that the client reaches the server over both families
    /// with full-size unfragmented packets (where the guests can ping).
    pub fn build(&self, prefix: &str, mtu: u16) -> Result<Box<dyn Topology>> {
        let topo: Box<dyn Topology> = match &self.kind {
            Kind::Ours { flags } => Box::new(Ours::build(prefix, mtu, flags)?),
            Kind::Vxlan => Box::new(Vxlan::build(prefix, mtu, false)?),
            Kind::VxlanWire => Box::new(Vxlan::build(prefix, mtu, true)?),
            Kind::Veth => Box::new(Veth::build(prefix, mtu)?),
            Kind::Ovs => Box::new(Ovs::build(prefix, mtu, false)?),
            Kind::OursVhost => Box::new(OursVhost::build(prefix, mtu)?),
            Kind::OvsDpdk => Box::new(Ovs::build(prefix, mtu, true)?),
            Kind::Vm { way } => Box::new(VmPair::build(prefix, mtu, *way)?),
        };
        check_path(topo.as_ref(), mtu).map_err(|e| with_diagnostics(e, topo.as_ref()))?;
        Ok(topo)
    }
}

/// The guests a test runs between.
pub enum Guests<'a> {
    /// Guest namespaces: iperf3, sockperf and the host's tools.
    Netns {
        client: &'a Netns,
        server: &'a Netns,
    },
    /// A VM client (busybox over its command channel) and a namespace server.
    Vm {
        client: &'a RefCell<Vm>,
        server: &'a Netns,
    },
    /// vhost-user ports that testpmd guests connect to, one per run.
    Testpmd(&'a PmdPorts),
}

impl Guests<'_> {
    /// One ping of `size` payload bytes from the client to `target`;
    /// fragmentation forbidden in a namespace (a VM's kernel sets DF itself: see
    /// [`check_path`]). testpmd guests cannot ping ([`check_path`] leaves them
    /// out: their runs fail when nothing arrives instead).
    fn ping(&self, target: IpAddr, size: usize) -> Result<()> {
        let family = if target.is_ipv4() { "-4" } else { "-6" };
        match self {
            Guests::Testpmd(_) => Err(Error::new("testpmd guests cannot ping")),
            Guests::Netns { client: ns, .. } => {
                let (size, target) = (size.to_string(), target.to_string());
                let args = [
                    family, "-c", "1", "-W", "1", "-M", "do", "-s", &size, &target,
                ];
                ns.run("ping", &args).map(drop)
            }
            Guests::Vm { client: vm, .. } => vm
                .borrow_mut()
                .run(
                    &format!("ping {family} -c 1 -W 2 -s {size} {target}"),
                    super::vm::VM_COMMAND,
                )
                .map(drop),
        }
    }
}

/// A built topology. Dropping it removes everything it created.
pub trait Topology {
    /// The client and server guests.
    fn guests(&self) -> Guests<'_>;
    /// The processes doing this setup's packet work in user space, whose CPU is
    /// reported per thread.
    fn daemons(&self) -> Vec<Watched> {
        Vec::new()
    }
    /// The end of the daemons' logs, for error messages.
    fn diagnostics(&self) -> String {
        String::new()
    }
}

/// Appends the topology's diagnostics (daemon logs) to an error, if it has any.
pub fn with_diagnostics(e: Error, topo: &dyn Topology) -> Error {
    let d = topo.diagnostics();
    if d.is_empty() {
        e
    } else {
        Error::new(format!("{e}\n{d}"))
    }
}

/// The server's address in `family`.
pub fn server_addr(family: Family) -> IpAddr {
    match family {
        Family::V4 => SERVER_V4.into(),
        Family::V6 => SERVER_V6.into(),
    }
}

/// The client guest as a port of this datapath (sled 0), at `mtu`.
pub fn client_spec(mtu: u16) -> GuestSpec {
    GuestSpec {
        ipv4: Some(CLIENT_V4),
        ipv6: Some(CLIENT_V6),
        ..GuestSpec::dual("g0", 0, 1)
    }
    .mtu(Some(mtu))
}

/// The server guest as a port of this datapath (sled 1), at `mtu`.
pub fn server_spec(mtu: u16) -> GuestSpec {
    GuestSpec {
        ipv4: Some(SERVER_V4),
        ipv6: Some(SERVER_V6),
        ..GuestSpec::dual("g1", 1, 2)
    }
    .mtu(Some(mtu))
}

/// Pings the server from the client over both families until a reply comes, then
/// requires a full-size ping with fragmentation forbidden: a smaller MTU anywhere
/// on the path fails here, not as a mysteriously slow run. A VM's busybox ping
/// cannot forbid fragmentation, so its kernel's counters must show none instead.
fn check_path(topo: &dyn Topology, mtu: u16) -> Result<()> {
    let client = topo.guests();
    if let Guests::Testpmd(_) = client {
        return Ok(());
    }
    for family in [Family::V4, Family::V6] {
        let target = server_addr(family);
        poll_until(&format!("a ping reply from {target}"), FIRST_REPLY, || {
            client.ping(target, 56)
        })?;
        let headers = match family {
            Family::V4 => 20 + 8,
            Family::V6 => 40 + 8,
        };
        client
            .ping(target, usize::from(mtu) - headers)
            .map_err(|e| e.context(format!("full-size ping at guest MTU {mtu}")))?;
    }
    if let Guests::Vm { client: vm, .. } = client {
        super::vm::require_unfragmented(&mut vm.borrow_mut())?;
    }
    Ok(())
}

/// A guest namespace `{id}-{name}` (DAD off, so addresses work at once).
pub fn guest_ns(id: &str, name: &str) -> Result<Netns> {
    Netns::create(
        &format!("{id}-{name}"),
        &[
            ("net.ipv6.conf.all.accept_dad", "0"),
            ("net.ipv6.conf.default.accept_dad", "0"),
        ],
    )
}

/// A veth pair at `mtu` with one end in each namespace (created there directly:
/// nothing appears in the root namespace), both ends up.
pub fn veth(a: (&Netns, &str), b: (&Netns, &str), mtu: u16) -> Result<()> {
    let mtu = mtu.to_string();
    Cmd::new("ip")
        .args(["link", "add", a.1, "netns", a.0.name(), "mtu", &mtu])
        .args(["type", "veth", "peer", "name", b.1, "netns", b.0.name()])
        .args(["mtu", &mtu])
        .run()?;
    a.0.ip(&["link", "set", a.1, "up"])?;
    b.0.ip(&["link", "set", b.1, "up"])?;
    Ok(())
}

/// Addresses a kernel guest's interface from `spec` (on-link /24 and /64: the
/// guests share one L2 segment, no gateway).
pub fn address_guest(ns: &Netns, spec: &GuestSpec) -> Result<()> {
    if let Some(ip) = spec.ipv4 {
        ns.ip(&["addr", "add", &format!("{ip}/24"), "dev", GUEST_IF])?;
    }
    if let Some(ip) = spec.ipv6 {
        let addr = format!("{ip}/64");
        ns.ip(&["-6", "addr", "add", &addr, "dev", GUEST_IF, "nodad"])?;
    }
    Ok(())
}

/// This datapath: the harness's rack with one `overlayd` per sled and one guest
/// per sled on a tap port at the guest MTU, V2P published.
struct Ours {
    rack: Rack,
}

impl Ours {
    fn build(prefix: &str, mtu: u16, flags: &[String]) -> Result<Ours> {
        let mut rack = rack_with_daemons(prefix, flags)?;
        rack.add_guest(client_spec(mtu))?;
        rack.add_guest(server_spec(mtu))?;
        rack.publish_v2p()?;
        quiet_logs(&mut rack)?;
        Ok(Ours { rack })
    }
}

impl Topology for Ours {
    fn guests(&self) -> Guests<'_> {
        Guests::Netns {
            client: &self.rack.guests[0].ns,
            server: &self.rack.guests[1].ns,
        }
    }

    fn daemons(&self) -> Vec<Watched> {
        daemons(&self.rack)
    }

    fn diagnostics(&self) -> String {
        diagnostics(&self.rack)
    }
}

/// The harness's two-sled rack with `overlayd` started on each sled with `flags`.
pub fn rack_with_daemons(prefix: &str, flags: &[String]) -> Result<Rack> {
    let mut rack = Rack::build(&RackSpec::new(prefix, 2))?;
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    rack.start_daemons(&flags)?;
    Ok(rack)
}

/// From here on, failures quote the daemons' logs' ends through [`diagnostics`]
/// instead of printing whole logs when the rack is dropped.
pub fn quiet_logs(rack: &mut Rack) -> Result<()> {
    for i in 0..rack.sleds.len() {
        rack.sled_mut(i)?.daemon_mut()?.set_log_on_drop(false);
    }
    Ok(())
}

/// The rack's `overlayd` processes, one per sled.
pub fn daemons(rack: &Rack) -> Vec<Watched> {
    rack.sleds
        .iter()
        .filter_map(|s| {
            Some(Watched {
                label: format!("overlayd s{}", s.index),
                pid: s.daemon().ok()?.pid()?,
            })
        })
        .collect()
}

/// The end of each sled's `overlayd` log.
pub fn diagnostics(rack: &Rack) -> String {
    rack.sleds
        .iter()
        .filter_map(|s| {
            let d = s.daemon().ok()?;
            Some(format!(
                "overlayd s{} log ({}), last lines:\n{}",
                s.index,
                d.paths().log.display(),
                tail(&d.log())
            ))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Kernel VXLAN over IPv6: per sled a VXLAN device toward the other sled and a
/// bridge joining it to a veth whose other end is the guest.
///
/// `wire` (the `vxlan-wire` setup): the sled's underlay veth loses its UDP-tunnel
/// segmentation offloads, so the kernel cuts each guest TSO buffer into frames of
/// the underlay MTU (computing their checksums) before they reach the veth, as it
/// must for a NIC without tunnel offloads; with them on (`vxlan`), super-frames
/// of up to 64 KiB (47 KB on average, measured on the switch's port) cross the
/// veths and the switch's bridge whole, which no wire carries. The veth also gets
/// GRO (its NAPI receive path), so the receiving sled coalesces the frames again
/// as a NIC driver's receive path does.
struct Vxlan {
    client: Netns,
    server: Netns,
    /// Dropped last: the guests' veths go with the guest namespaces.
    _rack: Rack,
}

impl Vxlan {
    fn build(prefix: &str, mtu: u16, wire: bool) -> Result<Vxlan> {
        let rack = Rack::build(&RackSpec::new(prefix, 2))?;
        let client = guest_ns(&rack.id, "g0")?;
        let server = guest_ns(&rack.id, "g1")?;
        let guests = [(&client, client_spec(mtu)), (&server, server_spec(mtu))];
        for (i, (guest, spec)) in guests.iter().enumerate() {
            let sled = rack.sled(i)?;
            if wire {
                sled.ns.run(
                    "ethtool",
                    &[
                        "-K",
                        &sled.underlay_if,
                        "tx-udp_tnl-segmentation",
                        "off",
                        "tx-udp_tnl-csum-segmentation",
                        "off",
                        "gro",
                        "on",
                    ],
                )?;
            }
            vxlan_bridge(sled, rack.sled(1 - i)?.addr)?;
            veth((&sled.ns, SLED_GUEST_IF), (guest, GUEST_IF), mtu)?;
            sled.ns
                .ip(&["link", "set", SLED_GUEST_IF, "master", VXLAN_BRIDGE])?;
            address_guest(guest, spec)?;
        }
        Ok(Vxlan {
            client,
            server,
            _rack: rack,
        })
    }
}

/// Sled `sled`'s VXLAN device (VNI [`VNI`], port 4789, toward `peer`; zero UDP
/// checksums like this datapath's Geneve, which RFC 6935 allows for tunnels over
/// IPv6) in a bridge.
fn vxlan_bridge(sled: &Sled, peer: Ipv6Addr) -> Result<()> {
    let ns = &sled.ns;
    let (local, remote) = (sled.addr.to_string(), peer.to_string());
    ns.ip(&[
        "link",
        "add",
        VXLAN_DEV,
        "mtu",
        &VXLAN_MTU.to_string(),
        "type",
        "vxlan",
        "id",
        &VNI.to_string(),
        "local",
        &local,
        "remote",
        &remote,
        "dstport",
        "4789",
        "udp6zerocsumtx",
        "udp6zerocsumrx",
    ])?;
    ns.bridge_without_netfilter()?;
    ns.ip(&["link", "add", VXLAN_BRIDGE, "type", "bridge"])?;
    ns.ip(&["link", "set", VXLAN_DEV, "master", VXLAN_BRIDGE, "up"])?;
    ns.ip(&["link", "set", VXLAN_BRIDGE, "up"])?;
    Ok(())
}

impl Topology for Vxlan {
    fn guests(&self) -> Guests<'_> {
        Guests::Netns {
            client: &self.client,
            server: &self.server,
        }
    }
}

/// The ceiling: the two guests on one veth pair, no sleds, no overlay.
struct Veth {
    client: Netns,
    server: Netns,
}

impl Veth {
    fn build(prefix: &str, mtu: u16) -> Result<Veth> {
        let id = unique_id(prefix);
        let client = guest_ns(&id, "g0")?;
        let server = guest_ns(&id, "g1")?;
        veth((&client, GUEST_IF), (&server, GUEST_IF), mtu)?;
        address_guest(&client, &client_spec(mtu))?;
        address_guest(&server, &server_spec(mtu))?;
        Ok(Veth { client, server })
    }
}

impl Topology for Veth {
    fn guests(&self) -> Guests<'_> {
        Guests::Netns {
            client: &self.client,
            server: &self.server,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guests_are_addressed_alike_in_every_setup() {
        let (c, s) = (client_spec(1500), server_spec(8500));
        assert_eq!(c.addresses(), [IpAddr::from(CLIENT_V4), CLIENT_V6.into()]);
        assert_eq!(
            s.addresses(),
            [server_addr(Family::V4), server_addr(Family::V6)]
        );
        assert_eq!((c.sled, s.sled), (0, 1));
        assert_eq!((c.mtu, s.mtu), (Some(1500), Some(8500)));
        assert_ne!(c.mac, s.mac);
    }

    #[test]
    fn vm_tests_run_on_vm_setups_only() {
        let vm = &Setup::vms()[0];
        let ours = Setup {
            name: "ours".into(),
            kind: Kind::Ours { flags: vec![] },
        };
        for test in Test::vm_list() {
            assert!(vm.runs(&test) && !ours.runs(&test), "{test}");
        }
        for test in Test::default_list() {
            let netns = test.guest_kind() == GuestKind::Netns;
            assert!(!vm.runs(&test) && ours.runs(&test) == netns, "{test}");
        }
        assert_eq!(vm.name, "vm-bridge");
    }

    #[test]
    fn fixed_setups_by_name() {
        for name in FIXED {
            assert_eq!(Setup::fixed(name).unwrap().name, name);
        }
        assert!(Setup::fixed("ours").is_none());
        assert!(FIXED.contains(&BASELINE) && FIXED.contains(&PMD_BASELINE));
        assert!(GROUPS.iter().all(|g| Setup::fixed(g).is_none()));
    }

    #[test]
    fn testpmd_tests_run_on_testpmd_setups_only() {
        let pmd = Test::parse("pmd64-v4-1500").unwrap();
        let tcp = Test::parse("tcp1-v4-1500").unwrap();
        for name in FIXED {
            let s = Setup::fixed(name).unwrap();
            let testpmd = matches!(name, "ours-vhost" | "ovs-dpdk");
            assert_eq!((s.runs(&pmd), s.runs(&tcp)), (testpmd, !testpmd), "{name}");
            assert_eq!(s.in_group("testpmd"), testpmd, "{name}");
            assert!(!s.in_group("ours") && !s.in_group("vm"), "{name}");
        }
        assert!(Setup::fixed("ours-vhost").unwrap().runs_overlayd());
    }
}
