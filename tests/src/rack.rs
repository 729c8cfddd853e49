//! The rack: a switch namespace with a bridge, sled namespaces joined to it by veth
//! pairs, one `overlayd` per sled, and guests behind the daemons' ports.

use crate::bins::{bins, Bins};
use crate::cmd::Cmd;
use crate::daemon::{xdeadm, DaemonPaths, Overlayd};
use crate::guest::{create_port, Guest, GuestSpec};
use crate::netns::{sweep_stale, unique_id, Netns};
use crate::poll::poll_until;
use crate::{Context, Error, Result};
use std::net::Ipv6Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Underlay MTU of every link in the rack (the switch ports and the sleds' NICs).
pub const UNDERLAY_MTU: u16 = 9000;

/// The sleds' underlay interface name (inside each sled's own namespace).
pub const UNDERLAY_IF: &str = "ul0";

/// The bridge's name inside the switch namespace.
pub const BRIDGE: &str = "br0";

/// Sled `i`'s underlay address: `fd00:99::(i+1)` in a /64 shared by the rack.
pub fn sled_underlay_addr(i: usize) -> Ipv6Addr {
    let host = u16::try_from(i + 1).unwrap_or(u16::MAX);
    Ipv6Addr::new(0xfd00, 0x99, 0, 0, 0, 0, 0, host)
}

/// What to build.
#[derive(Clone, Debug)]
pub struct RackSpec {
    /// Start of every namespace name: lets a person (or the demo's exit trap) tell
    /// whose namespaces these are.
    pub prefix: String,
    pub sleds: usize,
}

impl RackSpec {
    pub fn new(prefix: &str, sleds: usize) -> RackSpec {
        RackSpec {
            prefix: prefix.to_string(),
            sleds,
        }
    }
}

/// One sled: its namespace, underlay link and (once started) daemon.
#[derive(Debug)]
pub struct Sled {
    pub index: usize,
    pub ns: Netns,
    /// Underlay interface inside `ns`.
    pub underlay_if: String,
    /// The sled's end of the veth on the switch's bridge (in the switch namespace):
    /// where captures see this sled's underlay traffic.
    pub bridge_port: String,
    pub addr: Ipv6Addr,
    daemon: Option<Overlayd>,
    dir: PathBuf,
}

impl Sled {
    /// Each port's link state (`up`, `down`; `none` for a port without one) as
    /// `xdeadm --json list-ports` shows it.
    pub fn link_states(&self) -> Result<Vec<(String, String)>> {
        let out = self.admin(&["--json", "list-ports"])?;
        let v: serde_json::Value = serde_json::from_str(&out)
            .map_err(|e| Error::new(format!("list-ports is not JSON ({e}): {out}")))?;
        let ports = v["data"].as_array().cloned().unwrap_or_default();
        Ok(ports
            .iter()
            .map(|p| {
                let name = p["config"]["name"].as_str().unwrap_or("?").to_string();
                let state = p["link"]["state"].as_str().unwrap_or("none").to_string();
                (name, state)
            })
            .collect())
    }

    /// Waits up to `within` until port `port` shows link state `want`.
    pub fn wait_for_link(&self, port: &str, want: &str, within: Duration) -> Result<()> {
        poll_until(
            &format!("port {port} to be {want} on sled {}", self.index),
            within,
            || {
                let states = self.link_states()?;
                if states.iter().any(|(n, s)| n == port && s == want) {
                    Ok(())
                } else {
                    Err(Error::new(format!("{states:?}")))
                }
            },
        )
    }

    /// The sum of counter `name` over `xdeadm --json stats [PORT]`.
    pub fn counter(&self, port: Option<&str>, name: &str) -> Result<u64> {
        let mut args = vec!["--json", "stats"];
        args.extend(port);
        Ok(crate::stats::sum(
            &crate::stats::parse(&self.admin(&args)?)?,
            name,
        ))
    }

    pub fn daemon(&self) -> Result<&Overlayd> {
        self.daemon
            .as_ref()
            .ok_or_else(|| Error::new(format!("sled {} has no running overlayd", self.index)))
    }

    pub fn daemon_mut(&mut self) -> Result<&mut Overlayd> {
        let i = self.index;
        self.daemon
            .as_mut()
            .ok_or_else(|| Error::new(format!("sled {i} has no running overlayd")))
    }

    /// `xdeadm ARGS...` against this sled's daemon.
    pub fn xdeadm(&self, args: &[&str]) -> Result<Cmd> {
        let socket = self.daemon()?.paths().api_socket.clone();
        Ok(xdeadm(&bins()?.xdeadm, &socket, args))
    }

    /// Runs `xdeadm ARGS...` and requires success; returns its stdout.
    pub fn admin(&self, args: &[&str]) -> Result<String> {
        self.xdeadm(args)?.run()
    }

    /// This sled's directory (its daemon's files).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where this sled's daemon keeps its socket, state and log.
    pub fn daemon_paths(&self) -> DaemonPaths {
        DaemonPaths::under(&self.dir)
    }
}

/// A built rack. Dropping it stops the daemons, then deletes the guest, sled and
/// switch namespaces (with every interface in them) and the temporary directory.
#[derive(Debug)]
pub struct Rack {
    pub id: String,
    pub switch: Netns,
    pub sleds: Vec<Sled>,
    pub guests: Vec<Guest>,
    dir: PathBuf,
}

impl Rack {
    /// Builds the switch and the sleds and checks that every sled reaches every other
    /// over the bridge with a full-size (9000-byte) unfragmented packet. No daemons yet.
    pub fn build(spec: &RackSpec) -> Result<Rack> {
        crate::require_root()?;
        static SWEPT: std::sync::Once = std::sync::Once::new();
        SWEPT.call_once(|| {
            if let Err(e) = sweep_stale(&spec.prefix) {
                eprintln!("e2e: sweeping stale namespaces: {e}");
            }
        });
        let id = unique_id(&spec.prefix);
        let switch = Netns::create(&format!("{id}-sw"), &[])?;
        let dir = std::env::temp_dir().join(&id);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        // From here on, `rack`'s Drop cleans up whatever was created so far.
        let mut rack = Rack {
            switch,
            id,
            sleds: Vec::new(),
            guests: Vec::new(),
            dir,
        };
        let sw = &rack.switch;
        sw.bridge_without_netfilter()?;
        sw.ip(&["link", "add", BRIDGE, "mtu", "9000", "type", "bridge"])?;
        // No snooping: NDP multicast must reach every sled without an IGMP/MLD querier.
        sw.ip(&[
            "link",
            "set",
            BRIDGE,
            "type",
            "bridge",
            "mcast_snooping",
            "0",
        ])?;
        sw.ip(&["link", "set", BRIDGE, "up"])?;
        for i in 0..spec.sleds {
            let sled = rack.add_sled(i)?;
            rack.sleds.push(sled);
        }
        rack.check_underlay()?;
        Ok(rack)
    }

    fn add_sled(&self, index: usize) -> Result<Sled> {
        let ns = Netns::create(
            &format!("{}-s{index}", self.id),
            // DAD off: addresses usable at once instead of after ~1 s of probing.
            &[
                ("net.ipv6.conf.all.accept_dad", "0"),
                ("net.ipv6.conf.default.accept_dad", "0"),
            ],
        )?;
        let bridge_port = format!("s{index}");
        let mtu = UNDERLAY_MTU.to_string();
        // Both ends are created directly in their namespaces: nothing ever appears in
        // the root namespace, so parallel racks cannot collide on interface names.
        Cmd::new("ip")
            .args(["link", "add", UNDERLAY_IF, "netns", ns.name(), "mtu", &mtu])
            .args(["type", "veth", "peer", "name", &bridge_port])
            .args(["netns", self.switch.name(), "mtu", &mtu])
            .run()?;
        self.switch
            .ip(&["link", "set", &bridge_port, "master", BRIDGE, "up"])?;
        let addr = sled_underlay_addr(index);
        ns.ip(&[
            "-6",
            "addr",
            "add",
            &format!("{addr}/64"),
            "dev",
            UNDERLAY_IF,
            "nodad",
        ])?;
        ns.ip(&["link", "set", UNDERLAY_IF, "up"])?;
        let dir = self.dir.join(format!("sled{index}"));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Sled {
            index,
            ns,
            underlay_if: UNDERLAY_IF.to_string(),
            bridge_port,
            addr,
            daemon: None,
            dir,
        })
    }

    /// Every sled pings every other with an 8952-byte ICMPv6 payload (IPv6 40 + ICMPv6
    /// 8 + 8952 = 9000) and the don't-fragment policy, so a smaller MTU anywhere on
    /// the path fails here rather than later in a confusing way.
    pub fn check_underlay(&self) -> Result<()> {
        for a in &self.sleds {
            for b in &self.sleds {
                if a.index == b.index {
                    continue;
                }
                let target = b.addr.to_string();
                poll_until(
                    &format!("sled {} to reach sled {} ({target})", a.index, b.index),
                    Duration::from_secs(15),
                    || {
                        a.ns.run(
                            "ping",
                            &[
                                "-6", "-c", "1", "-W", "1", "-M", "do", "-s", "8952", &target,
                            ],
                        )
                    },
                )?;
            }
        }
        Ok(())
    }

    /// Starts `overlayd` on sled `index` with `--underlay ul0 --underlay-addr ADDR`,
    /// its socket and state in the rack's temporary directory, `--log-level info`
    /// unless `extra` gives a level, and `extra` flags. Returns once the daemon
    /// answers `xdeadm list-ports`.
    pub fn start_daemon(&mut self, index: usize, extra: &[&str]) -> Result<()> {
        self.start_daemon_with_env(index, extra, &[])
    }

    /// [`Rack::start_daemon`] with `env` added to the daemon's environment.
    pub fn start_daemon_with_env(
        &mut self,
        index: usize,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Result<()> {
        let Bins {
            overlayd,
            xdeadm: admin,
        } = bins()?.clone();
        let sled = self.sled(index)?;
        if sled.daemon.is_some() {
            return Err(Error::new(format!("sled {index} already runs overlayd")));
        }
        let paths = sled.daemon_paths();
        let mut args: Vec<String> = [
            "--underlay",
            &sled.underlay_if,
            "--underlay-addr",
            &sled.addr.to_string(),
            "--api-socket",
            &paths.api_socket.display().to_string(),
            "--state-dir",
            &paths.state_dir.display().to_string(),
        ]
        .iter()
        .map(std::string::ToString::to_string)
        .collect();
        // The flag may be given once only.
        if !extra.contains(&"--log-level") {
            args.extend(["--log-level".to_string(), "info".to_string()]);
        }
        args.extend(extra.iter().map(std::string::ToString::to_string));
        let socket = paths.api_socket.clone();
        let daemon = Overlayd::start_with_env(
            &sled.ns,
            &overlayd,
            &args,
            env,
            paths,
            &format!("overlayd on sled {index}"),
            || xdeadm(&admin, &socket, &["list-ports"]).run().map(drop),
        )?;
        self.sled_mut(index)?.daemon = Some(daemon);
        Ok(())
    }

    /// Stops sled `index`'s daemon with SIGTERM (it must exit cleanly) and starts a
    /// new one with the same socket and state directory: what an operator's restart
    /// or upgrade does. The new daemon restores ports and mappings from its state.
    pub fn restart_daemon(&mut self, index: usize, extra: &[&str]) -> Result<()> {
        self.stop_daemon(index)?;
        self.start_daemon(index, extra)
    }

    /// SIGKILLs sled `index`'s daemon (a crash) and reaps it; it must die of the
    /// signal. Its socket and state directory stay for [`Rack::start_daemon`].
    pub fn kill_daemon(&mut self, index: usize) -> Result<()> {
        let pid = self
            .sled(index)?
            .daemon()?
            .pid()
            .ok_or_else(|| Error::new(format!("sled {index}'s overlayd has no pid")))?;
        Cmd::new("kill").args(["-KILL", &pid.to_string()]).run()?;
        // Reaping it as a stop fails on its exit status, which says it died of
        // the signal.
        match self.stop_daemon(index) {
            Err(e) if e.0.contains("signal: 9") => Ok(()),
            Err(e) => Err(e.context("the daemon did not die of SIGKILL")),
            Ok(()) => Err(Error::new(format!(
                "sled {index}'s overlayd survived SIGKILL"
            ))),
        }
    }

    /// Stops sled `index`'s daemon with SIGTERM; it must exit cleanly. Its socket
    /// and state directory stay for [`Rack::start_daemon`].
    pub fn stop_daemon(&mut self, index: usize) -> Result<()> {
        let sled = self.sled_mut(index)?;
        let mut old = sled
            .daemon
            .take()
            .ok_or_else(|| Error::new(format!("sled {index} runs no overlayd")))?;
        let status = old.stop()?;
        if !status.success() {
            return Err(Error::new(format!(
                "overlayd on sled {index} exited with {status} on SIGTERM:\n{}",
                old.log()
            )));
        }
        old.set_log_on_drop(false);
        Ok(())
    }

    /// Starts a daemon on every sled (same extra flags for all).
    pub fn start_daemons(&mut self, extra: &[&str]) -> Result<()> {
        for i in 0..self.sleds.len() {
            self.start_daemon(i, extra)?;
        }
        Ok(())
    }

    pub fn sled(&self, index: usize) -> Result<&Sled> {
        self.sleds
            .get(index)
            .ok_or_else(|| Error::new(format!("no sled {index} (rack has {})", self.sleds.len())))
    }

    pub fn sled_mut(&mut self, index: usize) -> Result<&mut Sled> {
        let n = self.sleds.len();
        self.sleds
            .get_mut(index)
            .ok_or_else(|| Error::new(format!("no sled {index} (rack has {n})")))
    }

    /// Creates the guest's port on its sled (tap moved into a new guest namespace),
    /// configures the guest's addresses and routes, and returns its index in
    /// `self.guests`. V2P is not touched: see [`Rack::publish_v2p`].
    pub fn add_guest(&mut self, spec: GuestSpec) -> Result<usize> {
        let ns_name = format!("{}-{}", self.id, spec.name);
        let sled = self.sled(spec.sled)?;
        let guest = Guest::create(sled, &ns_name, spec)?;
        self.guests.push(guest);
        Ok(self.guests.len() - 1)
    }

    /// Moves guest `name` to sled `to` as a migration does: its port is deleted
    /// on its sled and created on `to` with the same MAC and addresses, its tap
    /// moved into the guest's same namespace, whose OS side is configured again.
    /// V2P is not touched.
    pub fn move_guest(&mut self, name: &str, to: usize) -> Result<()> {
        let i = self.guest_index(name)?;
        let from = self.guests[i].spec.sled;
        self.sled(from)?
            .admin(&["delete-xde", name])
            .with_context(|| format!("deleting {name}'s port on sled {from}"))?;
        let mut spec = self.guests[i].spec.clone();
        spec.sled = to;
        create_port(self.sled(to)?, &spec, Some(self.guests[i].ns.name()))
            .with_context(|| format!("creating {name}'s port on sled {to}"))?;
        self.guests[i].spec = spec;
        self.guests[i].configure_os()
    }

    /// Moves guest `name` to sled `to` with its port's state, as an operator
    /// moves a live guest (docs/operating.md, "Moving a port"): its port moves
    /// ([`Rack::move_port`]), then V2P on every sled but those two.
    pub fn migrate_guest(&mut self, name: &str, to: usize) -> Result<()> {
        let from = self.guest(name)?.spec.sled;
        self.move_port(name, to)?;
        let i = self.guest_index(name)?;
        self.publish_v2p_except(&self.guests[i].spec, &[from, to])
    }

    /// Moves guest `name`'s port to sled `to` with its state: `export-port
    /// --delete --to` on its sled into a file of the rack's directory (its sled
    /// then maps the guest to `to` and relays what the others still send it
    /// there), `import-port` on `to` into the guest's same namespace, whose OS
    /// side is configured again, and `resume-port`. The other sleds' V2P is left
    /// as it was.
    pub fn move_port(&mut self, name: &str, to: usize) -> Result<()> {
        let i = self.guest_index(name)?;
        let from = self.guests[i].spec.sled;
        let file = self.dir().join(format!("{name}.export"));
        let file = file.to_string_lossy();
        let to_addr = self.sled(to)?.addr.to_string();
        self.sled(from)?
            .admin(&[
                "export-port",
                name,
                "-o",
                &file,
                "--delete",
                "--to",
                &to_addr,
            ])
            .with_context(|| format!("exporting {name}'s port from sled {from}"))?;
        let ns = self.guests[i].ns.name().to_string();
        self.sled(to)?
            .admin(&["import-port", &file, "--netns", &ns])
            .with_context(|| format!("importing {name}'s port on sled {to}"))?;
        self.guests[i].spec.sled = to;
        self.guests[i].configure_os()?;
        self.sled(to)?.admin(&["resume-port", name])?;
        Ok(())
    }

    fn guest_index(&self, name: &str) -> Result<usize> {
        self.guests
            .iter()
            .position(|g| g.spec.name == name)
            .ok_or_else(|| Error::new(format!("no guest named {name:?}")))
    }

    /// The guest named `name`.
    pub fn guest(&self, name: &str) -> Result<&Guest> {
        Ok(&self.guests[self.guest_index(name)?])
    }

    /// Tells every sled where every guest on the other sleds lives (`xdeadm set-v2p`
    /// for each such guest address), as the control plane would. A sled needs no V2P
    /// entry for its own guests, with one worker or several: the tests rely on that.
    pub fn publish_v2p(&self) -> Result<()> {
        for g in &self.guests {
            self.publish_v2p_of(&g.spec)?;
        }
        Ok(())
    }

    /// Tells every sled but its own where the guest of `spec` lives: what
    /// [`Rack::publish_v2p`] does for one guest, also one that is not in
    /// `self.guests` (a virtual machine).
    pub fn publish_v2p_of(&self, spec: &GuestSpec) -> Result<()> {
        self.publish_v2p_except(spec, &[spec.sled])
    }

    /// Tells the sleds but those of `skip` where the guest of `spec` lives.
    fn publish_v2p_except(&self, spec: &GuestSpec, skip: &[usize]) -> Result<()> {
        let host = self.sled(spec.sled)?.addr.to_string();
        for sled in self.sleds.iter().filter(|s| !skip.contains(&s.index)) {
            for ip in spec.addresses() {
                sled.admin(&[
                    "set-v2p",
                    &ip.to_string(),
                    &spec.mac,
                    &host,
                    &spec.vni.to_string(),
                ])
                .with_context(|| format!("V2P for guest {} on sled {}", spec.name, sled.index))?;
            }
        }
        Ok(())
    }

    /// Tears the rack down without printing the daemons' logs (they are printed by
    /// default, for failing tests).
    pub fn teardown_quietly(mut self) {
        for sled in &mut self.sleds {
            if let Some(d) = sled.daemon.as_mut() {
                d.set_log_on_drop(false);
            }
        }
    }

    /// The rack's temporary directory (daemon files, captures).
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Rack {
    fn drop(&mut self) {
        // Daemons first: they hold the taps, and a process left in a namespace keeps
        // the namespace alive after `ip netns del`.
        for sled in &mut self.sleds {
            sled.daemon.take();
        }
        self.guests.clear();
        self.sleds.clear();
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            eprintln!("e2e cleanup: removing {}: {e}", self.dir.display());
        }
        // `switch` is dropped (deleted) after this body returns.
    }
}
