//! Open vSwitch's userspace datapath (`datapath_type=netdev`) with a Geneve/IPv6
//! tunnel, one private OVS per sled namespace: the `ovs` setup (Debian's
//! `ovs-vswitchd`, guests on veths) and the `ovs-dpdk` setup (Debian's
//! `ovs-vswitchd-dpdk` with DPDK initialized, guests testpmd on `dpdkvhostuser`
//! ports). Everything but the guest ports is the same for both.
//!
//! Each sled runs its own `ovsdb-server` and `ovs-vswitchd`, started by hand inside
//! the sled's namespace with their database, sockets, logs and pid files in the
//! rack's temporary directory (`OVS_RUNDIR`, `OVS_DBDIR`, `OVS_LOGDIR`,
//! `OVS_SYSCONFDIR` all point there), so no system-wide OVS service is involved.
//!
//! Per sled:
//! - `br-phy` (netdev) holds the underlay NIC `ul0`; the sled's underlay address
//!   moves from `ul0` to `br-phy`'s internal port. OVS's userspace tunnel sends
//!   through the bridge its route to the remote endpoint leaves by, so the route to
//!   `fd00:99::/64` must go through an OVS bridge: with the address left on `ul0`
//!   (a port OVS reads with a packet socket) the sleds ping each other but the
//!   guests never reach each other;
//! - `br-int` (netdev) holds the Geneve port (`remote_ip` = the other sled, key =
//!   the VNI) and the guest veth's sled end as a `type=system` port;
//! - the guest's veth end has tx checksum, TSO and GSO offloads off: OVS 3.1's
//!   userspace datapath has no tunnelled TSO, and with the offloads on, pings pass
//!   but TCP connections never establish.
//!
//! With DPDK (`ovs-dpdk`), per sled in addition:
//! - `other_config:dpdk-init=true` before `ovs-vswitchd-dpdk` starts, DPDK's memory
//!   without hugepages (`dpdk-extra`: `--no-huge --legacy-mem`, the latter because
//!   OVS otherwise adds `--in-memory`, which DPDK refuses with `--no-huge`), a
//!   `--file-prefix` of the rack's and its runtime directory removed after the
//!   switch stops; one PMD thread, on core `sled index mod cores`
//!   (`pmd-cpu-mask`), so the two sleds' PMDs do not share a core; and
//!   `userspace-tso-enable=true`, without which OVS offers a guest no checksum or
//!   TSO offload and a testpmd asking for them cannot start;
//! - the guest port is a `dpdkvhostuser` port (OVS the socket's server, testpmd
//!   connects as it does to this datapath's ports), polled by the PMD thread; the
//!   underlay port stays the kernel veth `ul0`, read and written by OVS through a
//!   packet socket by the main thread (no DPDK driver exists for a veth);
//! - `br-int` forwards with two flows between the guest port and the tunnel
//!   instead of `NORMAL`: the receiving testpmd never sends, so a learning switch
//!   would flood every frame.

use super::cpu::Watched;
use super::pmd::{pair, PmdPort, PmdPorts};
use super::process::Background;
use super::setup::{
    address_guest, client_spec, guest_ns, server_spec, veth, Guests, Topology, GUEST_IF,
    SLED_GUEST_IF, VNI,
};
use crate::cmd::Cmd;
use crate::netns::Netns;
use crate::poll::poll_until;
use crate::rack::{Rack, RackSpec, Sled, UNDERLAY_MTU};
use crate::testpmd::RuntimeDir;
use crate::{Context, Error, Result};
use std::net::Ipv6Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The OVS database schema shipped by Debian's `openvswitch-common`.
const SCHEMA: &str = "/usr/share/openvswitch/vswitch.ovsschema";
const PHYS_BRIDGE: &str = "br-phy";
const INT_BRIDGE: &str = "br-int";
const TUNNEL_PORT: &str = "gnv0";
/// How long `ovs-vsctl` waits for `ovs-vswitchd` to apply a change.
const VSCTL_TIMEOUT_SECS: u32 = 30;

/// Debian's `openvswitch-switch-dpdk` installs its `ovs-vswitchd` here (and offers
/// it as an alternative of `/usr/sbin/ovs-vswitchd`, which is left as it is).
pub const DPDK_VSWITCHD: &str = "/usr/lib/openvswitch-switch-dpdk/ovs-vswitchd-dpdk";

/// DPDK's memory per switch (no hugepages: anonymous memory), in MiB: OVS sizes
/// its packet buffer pool down until it fits.
const DPDK_MEMORY_MIB: u32 = 1024;

/// The guest port of each sled with DPDK.
const VHOST_PORT: &str = "vhu0";

/// Fails unless Debian's OVS with DPDK is installed.
pub fn require_dpdk_vswitchd() -> Result<()> {
    if Path::new(DPDK_VSWITCHD).is_file() {
        Ok(())
    } else {
        Err(Error::new(format!(
            "{DPDK_VSWITCHD} is missing: install Debian's openvswitch-switch-dpdk \
             (scripts/install-deps.sh)"
        )))
    }
}

/// The guests of an OVS setup.
enum OvsGuests {
    /// Namespaces on veths whose sled ends are `type=system` ports (`ovs`).
    Netns { client: Netns, server: Netns },
    /// testpmd on `dpdkvhostuser` ports (`ovs-dpdk`).
    Testpmd(PmdPorts),
}

/// An OVS setup: one private OVS per sled.
pub struct Ovs {
    /// Dropped first: the daemons hold the sleds' interfaces.
    switches: Vec<SledOvs>,
    guests: OvsGuests,
    rack: Rack,
}

impl Ovs {
    /// `dpdk`: the `ovs-dpdk` setup, else `ovs` (see the module docs).
    pub fn build(prefix: &str, mtu: u16, dpdk: bool) -> Result<Ovs> {
        let rack = Rack::build(&RackSpec::new(prefix, 2))?;
        let mut switches = Vec::new();
        for i in 0..2 {
            let sled = rack.sled(i)?;
            let dir = rack.dir().join(format!("ovs{i}"));
            let with_dpdk = dpdk.then(|| Dpdk {
                file_prefix: format!("{}-ovs{i}", rack.id),
                pmd_core: i % std::thread::available_parallelism().map_or(1, usize::from),
            });
            let ovs = SledOvs::start(sled, &dir, with_dpdk)?;
            ovs.attach_underlay(sled)?;
            switches.push(ovs);
        }
        let specs = [client_spec(mtu), server_spec(mtu)];
        let guests = if dpdk {
            let mut ports = Vec::new();
            for (i, (ovs, spec)) in switches.iter().zip(&specs).enumerate() {
                ovs.add_overlay(rack.sled(1 - i)?.addr, VHOST_PORT, "dpdkvhostuser", mtu)?;
                ovs.connect_directly(VHOST_PORT)?;
                ports.push(PmdPort::of(spec, ovs.dir.join("run").join(VHOST_PORT))?);
            }
            let [tx, rx] = pair(ports)?;
            let next_hop = rx.mac.clone();
            OvsGuests::Testpmd(PmdPorts::new(&rack, tx, rx, next_hop))
        } else {
            let client = guest_ns(&rack.id, "g0")?;
            let server = guest_ns(&rack.id, "g1")?;
            for (i, (guest, spec)) in [&client, &server].into_iter().zip(&specs).enumerate() {
                let sled = rack.sled(i)?;
                veth((&sled.ns, SLED_GUEST_IF), (guest, GUEST_IF), mtu)?;
                switches[i].add_overlay(rack.sled(1 - i)?.addr, SLED_GUEST_IF, "system", mtu)?;
                guest.run(
                    "ethtool",
                    &["-K", GUEST_IF, "tx", "off", "tso", "off", "gso", "off"],
                )?;
                address_guest(guest, spec)?;
            }
            OvsGuests::Netns { client, server }
        };
        let ovs = Ovs {
            switches,
            guests,
            rack,
        };
        // The sleds now reach each other through OVS's br-phy.
        ovs.rack
            .check_underlay()
            .map_err(|e| e.context("underlay through br-phy"))?;
        Ok(ovs)
    }
}

impl Topology for Ovs {
    fn guests(&self) -> Guests<'_> {
        match &self.guests {
            OvsGuests::Netns { client, server } => Guests::Netns { client, server },
            OvsGuests::Testpmd(ports) => Guests::Testpmd(ports),
        }
    }

    fn daemons(&self) -> Vec<Watched> {
        self.switches
            .iter()
            .filter_map(|s| {
                Some(Watched {
                    label: format!("ovs-vswitchd s{}", s.sled),
                    pid: s.vswitchd.pid()?,
                })
            })
            .collect()
    }

    fn diagnostics(&self) -> String {
        self.switches
            .iter()
            .map(|s| {
                format!(
                    "ovs-vswitchd s{} log ({}), last lines:\n{}",
                    s.sled,
                    s.dir.join("log/ovs-vswitchd.log").display(),
                    s.vswitchd.log_tail()
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// How a sled's switch runs DPDK.
struct Dpdk {
    /// DPDK's `--file-prefix`: unique among the DPDK processes running at once.
    file_prefix: String,
    /// The core of its one PMD thread.
    pmd_core: usize,
}

impl Dpdk {
    /// The `Open_vSwitch` table's `other_config` settings, set before the switch
    /// starts (see the module docs).
    fn other_config(&self) -> [String; 4] {
        [
            "other_config:dpdk-init=true".to_string(),
            format!(
                "other_config:dpdk-extra=--no-huge --legacy-mem -m {DPDK_MEMORY_MIB} --no-pci \
                 --file-prefix={}",
                self.file_prefix
            ),
            format!("other_config:pmd-cpu-mask={:#x}", 1u64 << self.pmd_core),
            "other_config:userspace-tso-enable=true".to_string(),
        ]
    }
}

/// One sled's OVS: its two daemons (stopped on drop, switch first), DPDK's
/// runtime directory if it runs DPDK (removed after the switch stopped), and its
/// files.
struct SledOvs {
    sled: usize,
    vswitchd: Background,
    _ovsdb: Background,
    _dpdk_runtime: Option<RuntimeDir>,
    dir: PathBuf,
}

impl SledOvs {
    /// Creates the database and starts `ovsdb-server` and `ovs-vswitchd` (with
    /// `dpdk`, Debian's DPDK build, DPDK initialized) in the sled's namespace, all
    /// files under `dir`.
    fn start(sled: &Sled, dir: &Path, dpdk: Option<Dpdk>) -> Result<SledOvs> {
        for sub in ["run", "db", "log", "etc"] {
            let d = dir.join(sub);
            std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
        }
        if !Path::new(SCHEMA).is_file() {
            return Err(Error::new(format!(
                "{SCHEMA} is missing: install Debian's openvswitch-switch"
            )));
        }
        let db = dir.join("db/conf.db").display().to_string();
        ovs_cmd(dir, Cmd::new("ovsdb-tool").args(["create", &db, SCHEMA])).run()?;
        let label = |name: &str| format!("{name} on sled {}", sled.index);
        let mut ovsdb = Background::start(
            ovs_cmd(dir, sled.ns.cmd("ovsdb-server")).args([
                db.clone(),
                format!("--remote=punix:{}", socket(dir)),
                format!("--pidfile={}", dir.join("run/ovsdb-server.pid").display()),
                format!("--log-file={}", dir.join("log/ovsdb-server.log").display()),
            ]),
            &dir.join("log/ovsdb-server.out"),
            &label("ovsdb-server"),
        )?;
        poll_until(
            &format!("{} to answer", label("ovsdb-server")),
            Duration::from_secs(15),
            || {
                ovsdb.check_running()?;
                vsctl(dir, &["--no-wait", "init"]).map(drop)
            },
        )?;
        let mut program = "ovs-vswitchd";
        if let Some(dpdk) = &dpdk {
            // The benchmark's preflight required the DPDK build of ovs-vswitchd.
            let mut args = vec![
                "--no-wait".to_string(),
                "set".into(),
                "Open_vSwitch".into(),
                ".".into(),
            ];
            args.extend(dpdk.other_config());
            vsctl(dir, &args.iter().map(String::as_str).collect::<Vec<_>>())?;
            program = DPDK_VSWITCHD;
        }
        let dpdk_runtime = dpdk.as_ref().map(|d| RuntimeDir::new(&d.file_prefix));
        let vswitchd = Background::start(
            ovs_cmd(dir, sled.ns.cmd(program)).args([
                format!("unix:{}", socket(dir)),
                format!("--pidfile={}", dir.join("run/ovs-vswitchd.pid").display()),
                format!("--log-file={}", dir.join("log/ovs-vswitchd.log").display()),
            ]),
            &dir.join("log/ovs-vswitchd.out"),
            &label("ovs-vswitchd"),
        )?;
        let ovs = SledOvs {
            sled: sled.index,
            vswitchd,
            _ovsdb: ovsdb,
            _dpdk_runtime: dpdk_runtime,
            dir: dir.to_path_buf(),
        };
        if dpdk.is_some() {
            poll_until(
                &format!("DPDK to initialize in {}", label("ovs-vswitchd")),
                Duration::from_secs(30),
                || match ovs
                    .vsctl(&["get", "Open_vSwitch", ".", "dpdk_initialized"])?
                    .trim()
                {
                    "true" => Ok(()),
                    other => Err(Error::new(format!("dpdk_initialized is {other}"))),
                },
            )?;
        }
        Ok(ovs)
    }

    /// `ovs-vsctl` against this sled's database, waiting for `ovs-vswitchd` to apply.
    fn vsctl(&self, args: &[&str]) -> Result<String> {
        vsctl(&self.dir, args).map_err(|e| {
            Error::new(format!(
                "{e}\novs-vswitchd s{} log, last lines:\n{}",
                self.sled,
                self.vswitchd.log_tail()
            ))
        })
    }

    /// `br-phy` with `ul0` in it, and the sled's underlay address moved from `ul0`
    /// to `br-phy` (see the module docs for why).
    fn attach_underlay(&self, sled: &Sled) -> Result<()> {
        let mtu = format!("mtu_request={UNDERLAY_MTU}");
        self.vsctl(&[
            "add-br",
            PHYS_BRIDGE,
            "--",
            "set",
            "bridge",
            PHYS_BRIDGE,
            "datapath_type=netdev",
            "--",
            "add-port",
            PHYS_BRIDGE,
            &sled.underlay_if,
            "--",
            "set",
            "interface",
            PHYS_BRIDGE,
            &mtu,
        ])?;
        let addr = format!("{}/64", sled.addr);
        sled.ns
            .ip(&["-6", "addr", "del", &addr, "dev", &sled.underlay_if])?;
        sled.ns.ip(&["link", "set", PHYS_BRIDGE, "up"])?;
        sled.ns
            .ip(&["-6", "addr", "add", &addr, "dev", PHYS_BRIDGE, "nodad"])?;
        Ok(())
    }

    /// `br-int` with the Geneve port toward `peer` and the guest's port `port` of
    /// interface type `kind` (`system`: the guest veth's sled end;
    /// `dpdkvhostuser`) at MTU `mtu`.
    fn add_overlay(&self, peer: Ipv6Addr, port: &str, kind: &str, mtu: u16) -> Result<()> {
        let remote = format!("options:remote_ip={peer}");
        let key = format!("options:key={VNI}");
        let kind = format!("type={kind}");
        let mtu = format!("mtu_request={mtu}");
        self.vsctl(&[
            "add-br",
            INT_BRIDGE,
            "--",
            "set",
            "bridge",
            INT_BRIDGE,
            "datapath_type=netdev",
            "--",
            "add-port",
            INT_BRIDGE,
            TUNNEL_PORT,
            "--",
            "set",
            "interface",
            TUNNEL_PORT,
            "type=geneve",
            &remote,
            &key,
            "--",
            "add-port",
            INT_BRIDGE,
            port,
            "--",
            "set",
            "interface",
            port,
            &kind,
            &mtu,
        ])
        .map(drop)
    }

    /// Replaces `br-int`'s `NORMAL` flow by two: `port` to the tunnel and back.
    fn connect_directly(&self, port: &str) -> Result<()> {
        let ofctl = |args: &[&str]| {
            ovs_cmd(&self.dir, Cmd::new("ovs-ofctl"))
                .args(args.iter().copied())
                .run()
        };
        ofctl(&["del-flows", INT_BRIDGE])?;
        for (from, to) in [(port, TUNNEL_PORT), (TUNNEL_PORT, port)] {
            ofctl(&[
                "add-flow",
                INT_BRIDGE,
                &format!("in_port={from},actions=output:{to}"),
            ])?;
        }
        Ok(())
    }
}

/// The database socket under `dir`.
fn socket(dir: &Path) -> String {
    dir.join("run/db.sock").display().to_string()
}

/// `cmd` with the OVS directory variables pointing under `dir`, so nothing reads or
/// writes the system's OVS directories.
fn ovs_cmd(dir: &Path, cmd: Cmd) -> Cmd {
    let path = |sub: &str| dir.join(sub).display().to_string();
    cmd.env("OVS_RUNDIR", path("run"))
        .env("OVS_DBDIR", path("db"))
        .env("OVS_LOGDIR", path("log"))
        .env("OVS_SYSCONFDIR", path("etc"))
}

/// Runs `ovs-vsctl --db=unix:SOCKET --timeout=N ARGS...` (from the root namespace:
/// the socket is a path).
fn vsctl(dir: &Path, args: &[&str]) -> Result<String> {
    ovs_cmd(dir, Cmd::new("ovs-vsctl"))
        .arg(format!("--db=unix:{}", socket(dir)))
        .arg(format!("--timeout={VSCTL_TIMEOUT_SECS}"))
        .args(args.iter().copied())
        .run()
}
