//! Open vSwitch's userspace datapath (`datapath_type=netdev`) with a Geneve/IPv6
//! tunnel, one private OVS per sled namespace.
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

use super::cpu::Watched;
use super::process::Background;
use super::setup::{
    address_guest, client_spec, guest_ns, server_spec, veth, Client, Topology, GUEST_IF,
    SLED_GUEST_IF, VNI,
};
use crate::cmd::Cmd;
use crate::netns::Netns;
use crate::poll::poll_until;
use crate::rack::{Rack, RackSpec, Sled, UNDERLAY_MTU};
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

/// The OVS setup: one private OVS per sled, guests on veths.
pub struct Ovs {
    /// Dropped first: the daemons hold the sleds' interfaces.
    switches: Vec<SledOvs>,
    client: Netns,
    server: Netns,
    rack: Rack,
}

impl Ovs {
    pub fn build(prefix: &str, mtu: u16) -> Result<Ovs> {
        let rack = Rack::build(&RackSpec::new(prefix, 2))?;
        let client = guest_ns(&rack.id, "g0")?;
        let server = guest_ns(&rack.id, "g1")?;
        let mut switches = Vec::new();
        let guests = [(&client, client_spec(mtu)), (&server, server_spec(mtu))];
        for (i, (guest, spec)) in guests.iter().enumerate() {
            let sled = rack.sled(i)?;
            let dir = rack.dir().join(format!("ovs{i}"));
            let ovs = SledOvs::start(sled, &dir)?;
            ovs.attach_underlay(sled)?;
            veth((&sled.ns, SLED_GUEST_IF), (guest, GUEST_IF), mtu)?;
            ovs.add_overlay(rack.sled(1 - i)?.addr)?;
            guest.run(
                "ethtool",
                &["-K", GUEST_IF, "tx", "off", "tso", "off", "gso", "off"],
            )?;
            address_guest(guest, spec)?;
            switches.push(ovs);
        }
        let ovs = Ovs {
            switches,
            client,
            server,
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
    fn client(&self) -> Client<'_> {
        Client::Netns(&self.client)
    }

    fn server(&self) -> &Netns {
        &self.server
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

/// One sled's OVS: its two daemons (stopped on drop, switch first) and its files.
struct SledOvs {
    sled: usize,
    vswitchd: Background,
    _ovsdb: Background,
    dir: PathBuf,
}

impl SledOvs {
    /// Creates the database and starts `ovsdb-server` and `ovs-vswitchd` in the
    /// sled's namespace, all files under `dir`.
    fn start(sled: &Sled, dir: &Path) -> Result<SledOvs> {
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
        let vswitchd = Background::start(
            ovs_cmd(dir, sled.ns.cmd("ovs-vswitchd")).args([
                format!("unix:{}", socket(dir)),
                format!("--pidfile={}", dir.join("run/ovs-vswitchd.pid").display()),
                format!("--log-file={}", dir.join("log/ovs-vswitchd.log").display()),
            ]),
            &dir.join("log/ovs-vswitchd.out"),
            &label("ovs-vswitchd"),
        )?;
        Ok(SledOvs {
            sled: sled.index,
            vswitchd,
            _ovsdb: ovsdb,
            dir: dir.to_path_buf(),
        })
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

    /// `br-int` with the Geneve port toward `peer` and the guest veth's sled end.
    fn add_overlay(&self, peer: Ipv6Addr) -> Result<()> {
        let remote = format!("options:remote_ip={peer}");
        let key = format!("options:key={VNI}");
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
            SLED_GUEST_IF,
            "--",
            "set",
            "interface",
            SLED_GUEST_IF,
            "type=system",
        ])
        .map(drop)
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
