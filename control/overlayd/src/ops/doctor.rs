//! `xdeadm doctor`: is this host set up to run the datapath well, and is the
//! datapath serving its ports? Each check passes, warns or fails, and says how to
//! fix what it finds.
//!
//! The daemon gathers the facts ([`gather`]: its own view of the underlay, the
//! workers and the ports, and the host's files, read in the daemon's network
//! namespace), and [`checks`] judges them. Everything that reads the host is a
//! small function of the text it parses, so the judgement is tested with fixed
//! inputs.

use crate::config::{CoreList, DaemonConfig, UnderlayGso, XdpMode};
use crate::controller::Controller;
use crate::worker::Datapath;
use crate::workers::Workers;
use api::{Check, CheckStatus, PeerPath, PortLink, PortStatus, Reply, Request};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io;
use std::process::{Command, ExitStatus};

/// The underlay MTU the datapath is built for: guests at 8500 plus encapsulation
/// fit, with room to spare.
pub const RECOMMENDED_UNDERLAY_MTU: u32 = 9000;

/// What the encapsulation adds to a guest's packet inside the underlay MTU.
const ENCAP: u32 = wire::geneve::ENCAP_LEN_WITH_MSS as u32;

/// Why a fact could not be read; the check that needs it warns with this.
#[derive(Debug, thiserror::Error)]
pub enum DoctorError {
    #[error("cannot run `ethtool -k {iface}`: {error}")]
    EthtoolRun { iface: String, error: io::Error },
    #[error("`ethtool -k {iface}` exited with {status}: {stderr}")]
    EthtoolFailed {
        iface: String,
        status: ExitStatus,
        stderr: String,
    },
    #[error("netlink: {0}")]
    Netlink(io::Error),
    #[error("tap {name:?}: {error}")]
    Tap { name: String, error: io::Error },
    /// The namespace could not be entered (dpio's error names it).
    #[error("{error}")]
    Netns { netns: String, error: io::Error },
}

/// One underlay link as the daemon has it.
#[derive(Debug)]
pub struct LinkFacts {
    pub name: String,
    pub mtu: u32,
    pub queues: u32,
    /// `ethtool -k IFACE` output, or why it could not be read.
    pub features: Result<String, DoctorError>,
    /// The link's tunnel tap when guest TSO buffers leave through it as
    /// super-frames (`--underlay-gso`); `None`: the datapath segments them and
    /// AF_XDP sends the frames.
    pub tunnel_tap: Option<String>,
}

/// One port as the daemon has it.
#[derive(Debug)]
pub struct PortFacts {
    pub status: PortStatus,
    /// The MTU of the port's tap as the guest sees it (in the guest's namespace),
    /// or why it could not be read; `None` when not looked at (port not served).
    pub guest_mtu: Option<Result<u32, DoctorError>>,
    /// Milliseconds since the port's last Router Advertisement (`None`: none sent
    /// yet, or an IPv4-only port).
    pub ra_ms_ago: Option<u64>,
    /// The longest the port waits between unsolicited RAs.
    pub ra_max_interval_s: u64,
    /// DHCPv4 and DHCPv6 replies the gateway sent.
    pub dhcp_replies: u64,
}

/// The host's CPU and interrupt configuration, as text from `/proc` and `/sys`
/// (each `None` when unreadable).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HostFacts {
    /// `/proc/interrupts`.
    pub interrupts: Option<String>,
    /// `/proc/irq/N/smp_affinity_list` of each numbered IRQ.
    pub irq_affinity: BTreeMap<u32, String>,
    /// `/sys/devices/system/cpu/isolated`.
    pub isolated: Option<String>,
    /// `/proc/cmdline`.
    pub cmdline: Option<String>,
    /// `/proc/PID/task/TID/stat` of every thread.
    pub tasks: Vec<String>,
    /// The daemon's own process id (its workers run on the worker cores).
    pub own_pid: u32,
}

/// Everything the checks look at.
#[derive(Debug)]
pub struct Facts {
    pub xdp_mode: XdpMode,
    pub underlay_gso: UnderlayGso,
    pub links: Vec<LinkFacts>,
    /// The mode of every AF_XDP socket (`copy` or `zero_copy`).
    pub xsk_modes: Vec<String>,
    pub workers: usize,
    /// Cores the workers are pinned to (empty: not pinned).
    pub cores: Vec<usize>,
    pub host: HostFacts,
    pub ports: Vec<PortFacts>,
}

fn check(name: &str, status: CheckStatus, detail: String, fix: Option<String>) -> Check {
    Check {
        name: name.to_string(),
        status,
        detail,
        fix,
    }
}

fn pass(name: &str, detail: String) -> Check {
    check(name, CheckStatus::Pass, detail, None)
}

fn warn(name: &str, detail: String, fix: impl Into<String>) -> Check {
    check(name, CheckStatus::Warn, detail, Some(fix.into()))
}

fn fail(name: &str, detail: String, fix: impl Into<String>) -> Check {
    check(name, CheckStatus::Fail, detail, Some(fix.into()))
}

/// Every check, host first, then each port.
pub fn checks(f: &Facts) -> Vec<Check> {
    let mut out = vec![xdp_mode(f.xdp_mode), xsk_mode(&f.xsk_modes)];
    for l in &f.links {
        out.push(queues(l, f.workers));
        out.push(offloads(l));
        out.push(tx_path(l, f.underlay_gso));
    }
    out.push(underlay_mtu(&f.links, &f.ports));
    out.extend(worker_cores(&f.cores, &f.host));
    for p in &f.ports {
        out.extend(port(p));
    }
    out
}

fn xdp_mode(mode: XdpMode) -> Check {
    match mode {
        XdpMode::Native => pass("xdp-mode", "native: the program runs in the driver".into()),
        XdpMode::Skb => warn(
            "xdp-mode",
            "generic (skb): every frame costs an skb, and AF_XDP may get unsegmented GSO packets"
                .into(),
            "run with --xdp-mode native (a driver with XDP support)",
        ),
    }
}

fn xsk_mode(modes: &[String]) -> Check {
    let copy = modes.iter().filter(|m| m.as_str() != "zero_copy").count();
    match (modes.len(), copy) {
        (0, _) => fail(
            "af-xdp-mode",
            "no AF_XDP socket is open: no underlay frame reaches the workers".into(),
            "see the daemon's log for the underlay attach error",
        ),
        (n, 0) => pass("af-xdp-mode", format!("zero-copy on all {n} sockets")),
        (n, c) => warn(
            "af-xdp-mode",
            format!("copy mode on {c} of {n} sockets: the kernel copies every frame"),
            "use a NIC whose driver supports AF_XDP zero-copy (e.g. ice, i40e, mlx5) in native XDP mode",
        ),
    }
}

/// How guest TSO buffers leave by link `l`, against what `--underlay-gso` asked.
fn tx_path(l: &LinkFacts, mode: UnderlayGso) -> Check {
    let name = format!("underlay-tx-path:{}", l.name);
    match (&l.tunnel_tap, mode) {
        (Some(tap), _) => pass(
            &name,
            format!(
                "tunnel GSO: guest TSO buffers leave as super-frames through tap {tap}, \
                 segmented by the kernel or the NIC"
            ),
        ),
        (None, UnderlayGso::Off) => pass(
            &name,
            "AF_XDP (--underlay-gso off): the datapath segments every guest TSO buffer".into(),
        ),
        (None, _) => warn(
            &name,
            "AF_XDP: the datapath segments every guest TSO buffer, the tunnel tap could not \
             be used (the daemon's log says why)"
                .into(),
            "UDP-tunnel GSO on taps needs Linux 6.17 or later",
        ),
    }
}

fn queues(l: &LinkFacts, workers: usize) -> Check {
    let name = format!("underlay-queues:{}", l.name);
    let detail = format!("rx queues: {}, workers: {workers}", l.queues);
    if (l.queues as usize) < workers {
        fail(
            &name,
            format!("{detail}: a worker without a queue cannot send on {}", l.name),
            format!("ethtool -L {} combined {workers} (or rx {workers} tx {workers}), then restart overlayd", l.name),
        )
    } else {
        pass(&name, detail)
    }
}

/// `ethtool -k` output as feature name -> (on, fixed).
fn parse_features(text: &str) -> BTreeMap<&str, (bool, bool)> {
    text.lines()
        .filter_map(|l| {
            let (name, rest) = l.trim().split_once(": ")?;
            let on = rest.starts_with("on");
            if !on && !rest.starts_with("off") {
                return None;
            }
            Some((name, (on, rest.contains("[fixed]"))))
        })
        .collect()
}

/// Offloads that hide from XDP what the datapath relies on: rx VLAN offload moves
/// the tag out of the frame (a frame tagged for another VLAN looks untagged), LRO
/// and hardware GRO merge frames before XDP sees them (and block native XDP on
/// many drivers).
fn offloads(l: &LinkFacts) -> Check {
    let name = format!("offloads:{}", l.name);
    let text = match &l.features {
        Ok(t) => t,
        Err(e) => {
            return warn(
                &name,
                format!("offloads not readable: {e}"),
                "install ethtool, or check `ethtool -k IFACE` by hand",
            )
        }
    };
    let features = parse_features(text);
    let bad: Vec<(&str, &str, bool)> = [
        ("rx-vlan-offload", "rxvlan"),
        ("large-receive-offload", "lro"),
        ("rx-gro-hw", "rx-gro-hw"),
    ]
    .into_iter()
    .filter_map(|(feature, short)| match features.get(feature) {
        Some(&(true, fixed)) => Some((feature, short, fixed)),
        _ => None,
    })
    .collect();
    if bad.is_empty() {
        return pass(
            &name,
            "rx VLAN offload, LRO and hardware GRO are off".into(),
        );
    }
    let on: Vec<&str> = bad.iter().map(|(f, _, _)| *f).collect();
    let settable: Vec<String> = bad
        .iter()
        .filter(|(_, _, fixed)| !fixed)
        .map(|(_, s, _)| format!("{s} off"))
        .collect();
    let fixed: Vec<&str> = bad
        .iter()
        .filter(|(_, _, fixed)| *fixed)
        .map(|(f, _, _)| *f)
        .collect();
    let mut fix = String::new();
    if !settable.is_empty() {
        fix = format!("ethtool -K {} {}", l.name, settable.join(" "));
    }
    if !fixed.is_empty() {
        if !fix.is_empty() {
            fix.push_str("; ");
        }
        fix.push_str(&format!(
            "{} fixed on by the driver: use another NIC or driver",
            fixed.join(", ")
        ));
    }
    fail(
        &name,
        format!(
            "{} on: XDP does not see frames as they were on the wire",
            on.join(", ")
        ),
        fix,
    )
}

fn underlay_mtu(links: &[LinkFacts], ports: &[PortFacts]) -> Check {
    let Some(low) = links.iter().min_by_key(|l| l.mtu) else {
        return fail(
            "underlay-mtu",
            "no underlay link is attached".into(),
            "check --underlay and the daemon's log",
        );
    };
    let mtu = low.mtu;
    let too_big: Vec<String> = ports
        .iter()
        .map(|p| &p.status.port.config)
        .filter(|c| u32::from(c.mtu) + ENCAP > mtu)
        .map(|c| {
            format!(
                "{} (MTU {} needs {})",
                c.name,
                c.mtu,
                u32::from(c.mtu) + ENCAP
            )
        })
        .collect();
    let fix = format!(
        "ip link set {} mtu {RECOMMENDED_UNDERLAY_MTU}, on every sled and switch port of the underlay",
        low.name
    );
    if !too_big.is_empty() {
        return fail(
            "underlay-mtu",
            format!(
                "underlay MTU {mtu} ({}) is below port MTU + {ENCAP} for {}: their large packets get Packet Too Big",
                low.name,
                too_big.join(", ")
            ),
            fix,
        );
    }
    if mtu < RECOMMENDED_UNDERLAY_MTU {
        return warn(
            "underlay-mtu",
            format!("underlay MTU {mtu} ({}) fits every port, below the recommended {RECOMMENDED_UNDERLAY_MTU}", low.name),
            fix,
        );
    }
    pass(
        "underlay-mtu",
        format!("underlay MTU {mtu}: every port MTU + {ENCAP} fits"),
    )
}

/// A kernel CPU list (`0-3,8`), empty text meaning none; `None` if it does not
/// parse.
fn cpu_list(text: &str) -> Option<Vec<usize>> {
    let t = text.trim();
    if t.is_empty() {
        return Some(Vec::new());
    }
    t.parse::<CoreList>().ok().map(|c| c.cores().to_vec())
}

/// The CPUs named by `key=` on the kernel command line (`isolcpus=` may start
/// with flags such as `domain,managed_irq,`).
fn cmdline_cpus(cmdline: &str, key: &str) -> Vec<usize> {
    cmdline
        .split_whitespace()
        .filter_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .flat_map(|v| {
            let list =
                v.trim_start_matches(|c: char| c.is_ascii_alphabetic() || c == '_' || c == ',');
            cpu_list(list).unwrap_or_default()
        })
        .collect()
}

/// Numbered IRQs that fired on `core` (from `/proc/interrupts`) and may still go
/// there (their affinity includes it, or is unknown), with their device names.
fn irqs_on_core(interrupts: &str, affinity: &BTreeMap<u32, String>, core: usize) -> Vec<String> {
    let mut lines = interrupts.lines();
    let Some(head) = lines.next() else {
        return Vec::new();
    };
    let Some(column) = head
        .split_whitespace()
        .position(|c| c == format!("CPU{core}"))
    else {
        return Vec::new();
    };
    lines
        .filter_map(|l| {
            let (irq, rest) = l.trim().split_once(':')?;
            let irq: u32 = irq.parse().ok()?;
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let count: u64 = fields.get(column)?.parse().ok()?;
            let may_go = affinity
                .get(&irq)
                .and_then(|a| cpu_list(a))
                .is_none_or(|cpus| cpus.contains(&core));
            let device = fields.last().copied().unwrap_or("");
            (count > 0 && may_go).then(|| format!("{irq} ({device})"))
        })
        .collect()
}

fn worker_cores(cores: &[usize], host: &HostFacts) -> Vec<Check> {
    if cores.is_empty() {
        return vec![warn(
            "worker-cores",
            "workers are not pinned: the scheduler moves them among the guests' cores".into(),
            "run with --cores LIST (cores kept free of guests)",
        )];
    }
    let mut isolated = host
        .isolated
        .as_deref()
        .and_then(cpu_list)
        .unwrap_or_default();
    let cmdline = host.cmdline.as_deref().unwrap_or("");
    isolated.extend(cmdline_cpus(cmdline, "isolcpus"));
    let nohz = cmdline_cpus(cmdline, "nohz_full");
    let mut out = Vec::new();
    for &core in cores {
        let name = format!("worker-core:{core}");
        // Each problem found: what, and how to fix it.
        let mut found: Vec<(String, String)> = Vec::new();
        let irqs = host
            .interrupts
            .as_deref()
            .map(|t| irqs_on_core(t, &host.irq_affinity, core))
            .unwrap_or_default();
        if let Some(first) = irqs.first() {
            let irq = first.split(' ').next().unwrap_or("N");
            found.push((
                format!("device interrupts fire on it: {}", irqs.join(", ")),
                format!(
                    "echo OTHER_CPUS > /proc/irq/{irq}/smp_affinity_list (each IRQ named), \
                     and keep irqbalance off it (IRQBALANCE_BANNED_CPULIST={core})"
                ),
            ));
        }
        let busy = busy_on_core(&host.tasks, core, host.own_pid);
        if !busy.is_empty() {
            found.push((
                format!("other tasks were running on it: {}", busy.join(", ")),
                "pin them elsewhere (taskset, a cpuset), or give the workers other cores".into(),
            ));
        }
        if !isolated.contains(&core) {
            found.push((
                "not isolated: the scheduler may put any task on it".into(),
                format!("boot with isolcpus={core} nohz_full={core} (or keep other tasks off it with a cpuset)"),
            ));
        } else if !nohz.contains(&core) {
            found.push((
                "isolated but still takes the scheduler tick".into(),
                format!("add nohz_full={core} to the kernel command line"),
            ));
        }
        out.push(if found.is_empty() {
            pass(
                &name,
                format!(
                    "core {core} is isolated, tickless, free of device interrupts and other tasks"
                ),
            )
        } else {
            let (what, fix): (Vec<String>, Vec<String>) = found.into_iter().unzip();
            warn(
                &name,
                format!("core {core}: {}", what.join("; ")),
                fix.join("; "),
            )
        });
    }
    out
}

/// Tasks other than this process (`own_pid`) that were running (state `R`) on
/// `core` when their `/proc/PID/task/TID/stat` line (in `stats`) was read, as
/// `comm (pid)`.
fn busy_on_core(stats: &[String], core: usize, own_pid: u32) -> Vec<String> {
    stats
        .iter()
        .filter_map(|line| {
            let (pid, rest) = line.split_once(" (")?;
            let (comm, fields) = rest.rsplit_once(") ")?;
            let pid: u32 = pid.trim().parse().ok()?;
            let fields: Vec<&str> = fields.split_whitespace().collect();
            // Field 3 (state) is the first after the name; field 39 (processor)
            // the 37th.
            let running = *fields.first()? == "R";
            let cpu: usize = fields.get(36)?.parse().ok()?;
            (running && cpu == core && pid != own_pid).then(|| format!("{comm} ({pid})"))
        })
        .collect()
}

fn port(p: &PortFacts) -> Vec<Check> {
    let cfg = &p.status.port.config;
    let name = &cfg.name;
    let tap = format!("port-tap:{name}");
    if let Some(n) = &p.status.not_applied {
        return vec![fail(
            &tap,
            format!("not in the dataplane: {}", n.reason),
            "act on the reason (create the guest's namespace, raise the underlay MTU), or delete-xde it",
        )];
    }
    let mut out = vec![match &p.status.link {
        Some(PortLink::Down { reason, .. }) => fail(
            &tap,
            format!("tap down: {reason}"),
            "the guest (its namespace or VM) is gone: the port comes back when it does; delete-xde a port that is not coming back",
        ),
        _ => pass(&tap, "tap up".into()),
    }];
    let mtu_name = format!("port-mtu:{name}");
    out.push(match &p.guest_mtu {
        None => pass(&mtu_name, format!("advertised MTU {}", cfg.mtu)),
        Some(Ok(m)) if *m == u32::from(cfg.mtu) => {
            pass(&mtu_name, format!("guest-visible MTU {m} = advertised"))
        }
        Some(Ok(m)) => fail(
            &mtu_name,
            format!("guest-visible MTU {m}, advertised {}", cfg.mtu),
            format!(
                "ip link set {name} mtu {} in the guest's namespace (or recreate the port with --mtu {m})",
                cfg.mtu
            ),
        ),
        Some(Err(e)) => warn(
            &mtu_name,
            format!("guest-visible MTU not readable: {e}"),
            "check `ip link` in the guest",
        ),
    });
    if cfg.ipv6.is_some() {
        let ra = format!("port-ra:{name}");
        // Unsolicited RAs go out at least every max interval: two missed is wrong.
        let limit_ms = p.ra_max_interval_s.saturating_mul(2_000);
        out.push(match p.ra_ms_ago {
            Some(ms) if ms <= limit_ms => pass(&ra, format!("last RA {} s ago", ms / 1000)),
            Some(ms) => warn(
                &ra,
                format!("last RA {} s ago, more than twice the {} s maximum interval", ms / 1000, p.ra_max_interval_s),
                "check the port's worker (xdeadm stats, the daemon's log)",
            ),
            None => warn(
                &ra,
                "no RA sent yet".into(),
                "wait for the first unsolicited RA, or have the guest solicit one (xdeadm ra listen IFACE in the guest)",
            ),
        });
    }
    let dhcp = format!("port-dhcp:{name}");
    out.push(if p.dhcp_replies > 0 {
        pass(&dhcp, format!("{} DHCP replies sent", p.dhcp_replies))
    } else {
        warn(
            &dhcp,
            "no DHCP request answered yet".into(),
            "nothing to do if the guest is configured statically; otherwise check that its DHCP client runs on the port's interface",
        )
    });
    out
}

/// The underlay paths to the V2P peers (`xdeadm path-check`'s probes): what the
/// jumbo underlay exists for, and what fails silently when one switch port is
/// left at 1500.
pub fn underlay_paths(paths: &[PeerPath]) -> Check {
    const NAME: &str = "underlay-paths";
    let short: Vec<String> = paths
        .iter()
        .filter(|p| !p.ok())
        .map(|p| match (&p.error, p.largest) {
            (Some(e), _) => format!("{} (not probed: {e})", p.peer),
            (None, Some(l)) => format!("{} (largest {l})", p.peer),
            (None, None) => format!("{} (no answer)", p.peer),
        })
        .collect();
    match (paths.first(), short.is_empty()) {
        (None, _) => pass(NAME, "no other sled in V2P to probe".into()),
        (Some(p), true) => pass(
            NAME,
            format!("{} peers carry {}-byte packets", paths.len(), p.wanted),
        ),
        (Some(p), false) => fail(
            NAME,
            format!(
                "{} of {} peers do not carry {}-byte packets: {}",
                short.len(),
                paths.len(),
                p.wanted,
                short.join(", ")
            ),
            format!(
                "set every underlay link and switch port on the way to MTU {} (xdeadm path-check for details)",
                p.wanted
            ),
        ),
    }
}

/// Reads a host file, `None` if it cannot be read (the check then says so or is
/// skipped).
fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// `/proc`, `/sys` and the IRQ affinities, as [`HostFacts`].
fn host_facts() -> HostFacts {
    let mut irq_affinity = BTreeMap::new();
    if let Ok(dir) = std::fs::read_dir("/proc/irq") {
        for e in dir.flatten() {
            let Some(irq) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            if let Some(a) = read(&format!("/proc/irq/{irq}/smp_affinity_list")) {
                irq_affinity.insert(irq, a);
            }
        }
    }
    let mut tasks = Vec::new();
    let dirs = |path: &str| -> Vec<String> {
        std::fs::read_dir(path)
            .map(|d| {
                d.flatten()
                    .filter_map(|e| e.file_name().into_string().ok())
                    .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
                    .collect()
            })
            .unwrap_or_default()
    };
    for pid in dirs("/proc") {
        for tid in dirs(&format!("/proc/{pid}/task")) {
            tasks.extend(read(&format!("/proc/{pid}/task/{tid}/stat")));
        }
    }
    HostFacts {
        interrupts: read("/proc/interrupts"),
        irq_affinity,
        isolated: read("/sys/devices/system/cpu/isolated"),
        cmdline: read("/proc/cmdline"),
        tasks,
        own_pid: std::process::id(),
    }
}

/// `ethtool -k IFACE`, run in the daemon's namespace.
fn features(iface: &str) -> Result<String, DoctorError> {
    let out = Command::new("ethtool")
        .args(["-k", iface])
        .env_remove("NOTIFY_SOCKET")
        .output()
        .map_err(|error| DoctorError::EthtoolRun {
            iface: iface.to_string(),
            error,
        })?;
    if !out.status.success() {
        return Err(DoctorError::EthtoolFailed {
            iface: iface.to_string(),
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// An underlay link's MTU as the kernel has it now (`None`: not readable).
fn link_mtu(name: &str) -> Option<u32> {
    let mut nl = dpio::netlink::Netlink::open().ok()?;
    nl.link_by_name(name).ok().map(|l| l.mtu)
}

/// The MTU of port `name`'s tap in namespace `netns` (the daemon's own when
/// `None`).
fn tap_mtu(name: &str, netns: Option<&str>) -> Result<u32, DoctorError> {
    let read = {
        let name = name.to_string();
        move || -> Result<u32, DoctorError> {
            let mut nl = dpio::netlink::Netlink::open().map_err(DoctorError::Netlink)?;
            nl.link_by_name(&name)
                .map(|l| l.mtu)
                .map_err(|error| DoctorError::Tap { name, error })
        }
    };
    match netns {
        Some(ns) => dpio::netns::run_in_netns(ns, read).map_err(|error| DoctorError::Netns {
            netns: ns.to_string(),
            error,
        })?,
        None => read(),
    }
}

/// What the daemon's own answers say, as JSON (`Value::Null` when refused).
fn ask(ctl: &mut Controller<Workers<Datapath>>, req: Request) -> Value {
    match ctl.handle(req) {
        api::Outcome::Ok(Reply::Inspect(v)) => v,
        _ => Value::Null,
    }
}

/// Gathers the facts: the daemon's configuration and stats, each port's state,
/// the host's files.
pub fn gather(cfg: &DaemonConfig, ctl: &mut Controller<Workers<Datapath>>) -> Facts {
    let stats = ask(ctl, Request::Stats { port: None });
    let attached = stats["underlay"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let links = cfg
        .underlay
        .iter()
        .map(|name| {
            let link = attached.iter().find(|l| l["name"] == name.as_str());
            let from_stats = |key: &str| {
                link.and_then(|l| l[key].as_u64())
                    .and_then(|v| u32::try_from(v).ok())
                    .unwrap_or(0)
            };
            LinkFacts {
                // The kernel's MTU now (the attached one is from the last attach).
                mtu: link_mtu(name).unwrap_or_else(|| from_stats("mtu")),
                queues: from_stats("queues"),
                features: features(name),
                tunnel_tap: link.and_then(|l| l["tunnel_tap"].as_str().map(str::to_string)),
                name: name.clone(),
            }
        })
        .collect();
    let xsk_modes = stats["xsk"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|s| s["mode"].as_str().unwrap_or("unknown").to_string())
        .collect();
    let gateways: BTreeMap<String, u64> = stats["engine"]["ports"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|p| {
            let g = &p["gateway"];
            let replies = g["dhcp4_replies"]
                .as_u64()
                .unwrap_or(0)
                .saturating_add(g["dhcp6_replies"].as_u64().unwrap_or(0));
            (p["name"].as_str().unwrap_or_default().to_string(), replies)
        })
        .collect();
    let ports = ctl.handle(Request::ListPorts);
    let listed = ctl.dataplane().with_port_links(ports);
    let statuses = match listed {
        api::Outcome::Ok(Reply::Ports(p)) => p,
        _ => Vec::new(),
    };
    let mut ports = Vec::new();
    for status in statuses {
        let name = status.port.config.name.clone();
        let served = status.not_applied.is_none() && matches!(status.link, Some(PortLink::Up));
        let guest_mtu = served.then(|| tap_mtu(&name, status.port.netns.as_deref()));
        let ra = if status.not_applied.is_none() && status.port.config.ipv6.is_some() {
            ask(ctl, Request::Ra { port: name.clone() })
        } else {
            Value::Null
        };
        ports.push(PortFacts {
            guest_mtu,
            ra_ms_ago: ra["last_sent_ms_ago"].as_u64(),
            ra_max_interval_s: ra["max_interval_s"].as_u64().unwrap_or(0),
            dhcp_replies: gateways.get(&name).copied().unwrap_or(0),
            status,
        });
    }
    Facts {
        xdp_mode: cfg.xdp_mode,
        underlay_gso: cfg.underlay_gso,
        links,
        xsk_modes,
        workers: cfg.cores.len().max(1),
        cores: cfg.cores.clone(),
        host: host_facts(),
        ports,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::{NotApplied, PortInfo};

    const ETHTOOL: &str = "Features for ul0:
rx-checksumming: on
tx-checksumming: on
	tx-checksum-ipv4: off [fixed]
generic-receive-offload: on
large-receive-offload: off [fixed]
rx-vlan-offload: on
tx-vlan-offload: on
rx-gro-hw: off [fixed]
";

    const INTERRUPTS: &str = "           CPU0       CPU1       CPU2
  0:         22          0          0   IO-APIC   2-edge      timer
 24:          0       5123          0   PCI-MSI 524288-edge      eth0-rx-0
 25:          0          0          0   PCI-MSI 524289-edge      eth0-rx-1
 26:         10          0         99   PCI-MSI 524290-edge      nvme0q1
NMI:          0          0          0   Non-maskable interrupts
LOC:     123456      65432      11111   Local timer interrupts
";

    fn link(mtu: u32, queues: u32, features: &str) -> LinkFacts {
        LinkFacts {
            name: "ul0".into(),
            mtu,
            queues,
            features: Ok(features.into()),
            tunnel_tap: None,
        }
    }

    fn port_facts(name: &str, mtu: u16) -> PortFacts {
        let mut config = api::testing::sample_port(name, 5);
        config.mtu = mtu;
        PortFacts {
            status: PortStatus {
                port: PortInfo {
                    config,
                    netns: Some("g".into()),
                    vhost_user: None,
                    attach: None,
                },
                not_applied: None,
                link: Some(PortLink::Up),
                state: Some(api::PortState::Running),
                vhost_negotiated: None,
            },
            guest_mtu: Some(Ok(u32::from(mtu))),
            ra_ms_ago: Some(3_000),
            ra_max_interval_s: 600,
            dhcp_replies: 2,
        }
    }

    fn facts() -> Facts {
        let mut ul0 = link(9000, 2, "rx-vlan-offload: off\n");
        ul0.tunnel_tap = Some("gso-ul0".into());
        Facts {
            xdp_mode: XdpMode::Native,
            underlay_gso: UnderlayGso::Auto,
            links: vec![ul0],
            xsk_modes: vec!["zero_copy".into(), "zero_copy".into()],
            workers: 2,
            cores: vec![2, 3],
            host: HostFacts {
                interrupts: None,
                irq_affinity: BTreeMap::new(),
                isolated: Some("2-3\n".into()),
                cmdline: Some(
                    "BOOT_IMAGE=/vmlinuz isolcpus=managed_irq,domain,2-3 nohz_full=2-3".into(),
                ),
                tasks: vec![],
                own_pid: 7,
            },
            ports: vec![port_facts("opte0", 8500)],
        }
    }

    fn find<'a>(checks: &'a [Check], name: &str) -> &'a Check {
        checks
            .iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("no check {name}: {checks:?}"))
    }

    #[test]
    fn a_healthy_host_passes_everything() {
        let c = checks(&facts());
        assert!(c.iter().all(|c| c.status == CheckStatus::Pass), "{c:#?}");
        assert!(c.iter().all(|c| c.fix.is_none()));
    }

    #[test]
    fn the_transmit_path_says_which_and_warns_when_auto_fell_back() {
        let mut f = facts();
        let path = |f: &Facts| find(&checks(f), "underlay-tx-path:ul0").clone();
        let on = path(&f);
        assert_eq!(on.status, CheckStatus::Pass);
        assert!(
            on.detail.contains("tunnel GSO") && on.detail.contains("gso-ul0"),
            "{on:?}"
        );
        f.links[0].tunnel_tap = None;
        let fell_back = path(&f);
        assert_eq!(fell_back.status, CheckStatus::Warn);
        assert!(fell_back.detail.starts_with("AF_XDP"), "{fell_back:?}");
        assert!(fell_back.fix.as_deref().unwrap().contains("6.17"));
        f.underlay_gso = UnderlayGso::Off;
        let off = path(&f);
        assert_eq!(off.status, CheckStatus::Pass);
        assert!(off.detail.contains("--underlay-gso off"), "{off:?}");
    }

    #[test]
    fn underlay_mtu_below_port_plus_encapsulation_fails() {
        let mut f = facts();
        f.links[0].mtu = 8500;
        let c = checks(&f);
        let m = find(&c, "underlay-mtu");
        assert_eq!(m.status, CheckStatus::Fail);
        assert!(m.detail.contains("opte0 (MTU 8500 needs 8578)"), "{m:?}");
        assert!(m.fix.as_deref().unwrap().contains("mtu 9000"), "{m:?}");
        f.links[0].mtu = 8578;
        assert_eq!(find(&checks(&f), "underlay-mtu").status, CheckStatus::Warn);
    }

    #[test]
    fn offloads_that_hide_frames_from_xdp_fail_with_the_command() {
        let c = offloads(&link(9000, 1, ETHTOOL));
        assert_eq!(c.status, CheckStatus::Fail);
        assert!(c.detail.contains("rx-vlan-offload"), "{c:?}");
        assert_eq!(c.fix.as_deref(), Some("ethtool -K ul0 rxvlan off"));
        let c = offloads(&link(9000, 1, "large-receive-offload: on [fixed]\n"));
        assert!(c.fix.unwrap().contains("fixed on by the driver"));
        let c = offloads(&LinkFacts {
            features: Err(DoctorError::EthtoolRun {
                iface: "ul0".into(),
                error: io::ErrorKind::NotFound.into(),
            }),
            ..link(9000, 1, "")
        });
        assert_eq!(c.status, CheckStatus::Warn);
        assert!(c.detail.contains("cannot run `ethtool -k ul0`"), "{c:?}");
    }

    #[test]
    fn modes_and_queues() {
        let mut f = facts();
        f.xdp_mode = XdpMode::Skb;
        f.xsk_modes = vec!["copy".into(), "zero_copy".into()];
        f.links[0].queues = 1;
        let c = checks(&f);
        assert_eq!(find(&c, "xdp-mode").status, CheckStatus::Warn);
        let x = find(&c, "af-xdp-mode");
        assert_eq!(x.status, CheckStatus::Warn);
        assert!(x.detail.contains("1 of 2"), "{x:?}");
        let q = find(&c, "underlay-queues:ul0");
        assert_eq!(q.status, CheckStatus::Fail);
        assert!(q
            .fix
            .as_deref()
            .unwrap()
            .contains("ethtool -L ul0 combined 2"));
        f.xsk_modes.clear();
        assert_eq!(find(&checks(&f), "af-xdp-mode").status, CheckStatus::Fail);
    }

    #[test]
    fn kernel_cpu_lists() {
        assert_eq!(cpu_list("0-2,5\n"), Some(vec![0, 1, 2, 5]));
        assert_eq!(cpu_list("\n"), Some(vec![]));
        assert_eq!(cpu_list("x"), None);
        let cmd = "ro isolcpus=domain,managed_irq,1-2 nohz_full=3 quiet";
        assert_eq!(cmdline_cpus(cmd, "isolcpus"), [1, 2]);
        assert_eq!(cmdline_cpus(cmd, "nohz_full"), [3]);
        assert!(cmdline_cpus(cmd, "rcu_nocbs").is_empty());
    }

    #[test]
    fn interrupts_on_worker_cores() {
        let aff = BTreeMap::from([(24, "1\n".to_string()), (26, "0,2".to_string())]);
        assert_eq!(irqs_on_core(INTERRUPTS, &aff, 1), ["24 (eth0-rx-0)"]);
        assert_eq!(irqs_on_core(INTERRUPTS, &aff, 2), ["26 (nvme0q1)"]);
        let moved = BTreeMap::from([(26, "0".to_string())]);
        assert!(
            irqs_on_core(INTERRUPTS, &moved, 2).is_empty(),
            "affinity moved away"
        );
        assert!(irqs_on_core(INTERRUPTS, &aff, 7).is_empty(), "no such CPU");
        let mut f = facts();
        f.host.interrupts = Some(INTERRUPTS.into());
        f.host.irq_affinity = aff;
        let c = checks(&f);
        let w = find(&c, "worker-core:2");
        assert_eq!(w.status, CheckStatus::Warn);
        assert!(w.fix.as_deref().unwrap().contains("/proc/irq/26/"), "{w:?}");
        assert_eq!(find(&c, "worker-core:3").status, CheckStatus::Pass);
        f.host.cmdline = None;
        f.host.isolated = None;
        assert!(find(&checks(&f), "worker-core:3")
            .fix
            .as_deref()
            .unwrap()
            .contains("isolcpus=3"));
        f.cores.clear();
        assert_eq!(find(&checks(&f), "worker-cores").status, CheckStatus::Warn);
    }

    /// `stat` of a thread in state `state` last on CPU `cpu` (fields as in
    /// proc(5); a name with a space and a parenthesis, as kernels allow).
    fn stat(pid: u32, state: &str, cpu: usize) -> String {
        let mut fields = vec!["0"; 49];
        fields[0] = state;
        let cpu = cpu.to_string();
        fields[36] = &cpu;
        format!("{pid} (my (odd) task) {}", fields.join(" "))
    }

    #[test]
    fn busy_tasks_on_worker_cores() {
        let tasks = vec![
            stat(100, "R", 2),
            stat(101, "S", 2),
            stat(7, "R", 2),
            stat(102, "R", 3),
        ];
        assert_eq!(busy_on_core(&tasks, 2, 7), ["my (odd) task (100)"]);
        assert!(busy_on_core(&["garbage".into()], 2, 7).is_empty());
        let mut f = facts();
        f.host.tasks = tasks;
        let c = checks(&f);
        let w = find(&c, "worker-core:2");
        assert_eq!(w.status, CheckStatus::Warn);
        assert!(
            w.detail.contains("(100)") && !w.detail.contains("(7)"),
            "{w:?}"
        );
        assert!(w.fix.as_deref().unwrap().contains("taskset"), "{w:?}");
        assert_eq!(find(&c, "worker-core:3").status, CheckStatus::Warn);
    }

    #[test]
    fn underlay_paths_short_of_the_mtu_fail() {
        let path = |last: u16, largest| PeerPath {
            peer: std::net::Ipv6Addr::new(0xfd00, 0x99, 0, 0, 0, 0, 0, last),
            wanted: 9000,
            largest,
            probes: 1,
            error: None,
        };
        assert_eq!(underlay_paths(&[]).status, CheckStatus::Pass);
        assert_eq!(
            underlay_paths(&[path(2, Some(9000))]).status,
            CheckStatus::Pass
        );
        let c = underlay_paths(&[path(2, Some(9000)), path(3, Some(1504)), path(4, None)]);
        assert_eq!(c.status, CheckStatus::Fail);
        assert!(
            c.detail
                .contains("2 of 3 peers do not carry 9000-byte packets: fd00:99::3 (largest 1504), fd00:99::4 (no answer)"),
            "{c:?}"
        );
    }

    #[test]
    fn ports_down_mismatched_or_silent() {
        let mut p = port_facts("opte1", 8500);
        p.status.link = Some(PortLink::Down {
            since_unix_ms: 0,
            reason: "read: EBADFD".into(),
        });
        p.guest_mtu = Some(Ok(1500));
        p.ra_ms_ago = None;
        p.dhcp_replies = 0;
        let c = port(&p);
        assert_eq!(find(&c, "port-tap:opte1").status, CheckStatus::Fail);
        let m = find(&c, "port-mtu:opte1");
        assert_eq!(m.status, CheckStatus::Fail);
        assert!(
            m.detail.contains("1500") && m.detail.contains("8500"),
            "{m:?}"
        );
        assert_eq!(find(&c, "port-ra:opte1").status, CheckStatus::Warn);
        assert_eq!(find(&c, "port-dhcp:opte1").status, CheckStatus::Warn);
        p.status.not_applied = Some(NotApplied {
            reason: "network namespace \"g\" not found".into(),
            attempts: 1,
            retry_in_ms: 1000,
        });
        let c = port(&p);
        assert_eq!(c.len(), 1);
        assert!(c[0].detail.contains("not found"));
    }
}
