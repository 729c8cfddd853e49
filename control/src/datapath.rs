//! One worker's [`Datapath`]: its engine, its ports' taps and, when I/O is on, its
//! underlay queues ([`crate::worker`] runs the loop that moves the frames); and the
//! translation of API requests into engine calls ([`Dataplane`]).
//!
//! Threading: one worker per configured core, each pinned and each owning a
//! `Datapath` with an engine of its own; every port lives on exactly one worker
//! (see [`crate::workers`], which also fans API requests out to the workers). A
//! worker applies requests between rounds, so its fast path takes no lock and a
//! round never sees configuration change half-way. Underlay next hops are resolved
//! by a helper thread per worker ([`crate::neighbours`]): a worker never waits on
//! netlink.
//!
//! With several workers, every engine learns where the other workers' ports are
//! (`Engine::set_sibling_port`, from [`WorkerPlane::set_port_owner`]); the engine
//! then says when a frame belongs to another worker and the loop hands it over.
//!
//! Without I/O (tests, `--no-io` style embedding) the same [`Datapath`] runs with no
//! taps and no underlay: requests are applied to the engine alone.

use crate::api::{
    Direction, FwAction, FwHost, FwProto, FwRule, PortInfo, RouteEntry, RouteTarget, V2pEntry,
};
use crate::config::DaemonConfig;
use crate::controller::{Dataplane, Inspect};
use crate::worker::{WorkerIo, WorkerStats};
use crate::workers::{PortKey, WorkerPlane};
use dpio::tap::TapPort;
use engine::rule::{Finalized, PortRange, Predicate, Rule};
use engine::{Engine, EngineConfig, TxBatch, Vni};
use ipnet::IpNet;
use std::net::IpAddr;
use std::time::Instant;

/// One worker's engine plus, when I/O is on, its taps and underlay queues.
pub struct Datapath {
    pub(crate) engine: Engine,
    /// Each port's tap, by the engine's port id (`None`: no I/O, or the tap is gone).
    pub(crate) taps: Vec<Option<TapPort>>,
    pub(crate) io: Option<WorkerIo>,
    pub(crate) stats: WorkerStats,
    /// The output batch, kept for its capacity.
    pub(crate) batch: TxBatch<'static>,
    /// This worker's index (0 without I/O).
    index: usize,
    /// Monotonic origin of the engine's clock.
    epoch: Instant,
}

/// The engine's configuration from the daemon's and the underlay link's MTU, with a
/// flow-table hash seed drawn for this process.
pub fn engine_config(cfg: &DaemonConfig, underlay_mtu: u32) -> Result<EngineConfig, String> {
    let mut e = EngineConfig::new(cfg.underlay_addr);
    e.underlay_mtu = u16::try_from(underlay_mtu)
        .map_err(|_| format!("underlay MTU {underlay_mtu} is above 65535"))?;
    e.external_jumbo = cfg.external_jumbo;
    e.boundary_services = cfg.boundary_services.map(|a| (a, cfg.boundary_vni));
    e.hash_seed = random_seed()?;
    Ok(e)
}

/// 64 bits from the kernel's CSPRNG (getrandom(2)). Remote peers choose inbound
/// flow keys, so the flow and connection tables' hash must be keyed with a value
/// they cannot know or predict; the engine makes no syscalls and takes it from us.
fn random_seed() -> Result<u64, String> {
    let mut b = [0u8; 8];
    loop {
        // SAFETY: `b` is valid for writes of b.len() bytes; flags 0 = the urandom
        // source, blocking only until the pool is first initialised.
        let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
        match usize::try_from(n) {
            Ok(n) if n == b.len() => return Ok(u64::from_ne_bytes(b)),
            Ok(n) => return Err(format!("getrandom returned {n} of {} bytes", b.len())),
            Err(_) => {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(format!("cannot draw the flow hash seed: {e}"));
                }
            }
        }
    }
}

impl Datapath {
    /// A datapath with no I/O: ports exist only in the engine.
    pub fn without_io(engine: Engine) -> Datapath {
        Datapath {
            engine,
            taps: Vec::new(),
            io: None,
            stats: WorkerStats::default(),
            batch: TxBatch::new(),
            index: 0,
            epoch: Instant::now(),
        }
    }

    /// A worker's datapath serving its underlay queues and creating a tap per port.
    pub fn with_io(engine: Engine, io: WorkerIo) -> Datapath {
        Datapath {
            index: io.index,
            io: Some(io),
            ..Datapath::without_io(engine)
        }
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The engine's clock at `at`: nanoseconds since this datapath started.
    pub(crate) fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    fn now(&self) -> u64 {
        self.nanos(Instant::now())
    }
}

/// Opens (or, after a restart, reattaches to) the tap of a port and puts it where the
/// guest expects it.
fn open_tap(p: &PortInfo) -> Result<TapPort, String> {
    let name = &p.config.name;
    let ctx = |e: std::io::Error| format!("tap {name:?}: {e}");
    if let Some(ns) = &p.netns {
        // A persistent tap survives the daemon; if it is already in the guest's
        // namespace, take it over there.
        match TapPort::attach_in_netns(ns, name) {
            Ok(t) => return Ok(t),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(ctx(e)),
        }
    }
    let tap = TapPort::create(name, p.config.guest_mac).map_err(ctx)?;
    tap.set_mtu(u32::from(p.config.mtu)).map_err(ctx)?;
    if let Some(ns) = &p.netns {
        if let Err(e) = tap.move_to_netns(ns) {
            let _ = tap.destroy();
            return Err(ctx(e));
        }
    }
    Ok(tap)
}

fn engine_target(t: RouteTarget) -> engine::RouteTarget {
    match t {
        RouteTarget::Subnet => engine::RouteTarget::VpcSubnet,
        RouteTarget::Igw => engine::RouteTarget::InternetGateway,
        RouteTarget::Drop => engine::RouteTarget::Drop,
    }
}

fn api_target(t: engine::RouteTarget) -> RouteTarget {
    match t {
        engine::RouteTarget::VpcSubnet => RouteTarget::Subnet,
        engine::RouteTarget::InternetGateway => RouteTarget::Igw,
        engine::RouteTarget::Drop => RouteTarget::Drop,
    }
}

impl Datapath {
    /// Adds and deletes routes until the engine's table equals `want`. Used by
    /// `set_routes`, which undoes a partial change with a second call.
    fn sync_routes(&mut self, port: &str, want: &[RouteEntry]) -> Result<(), String> {
        let have = self.routes(port)?;
        for r in have.iter().filter(|r| !want.contains(r)) {
            self.engine
                .del_route(port, r.dest)
                .map_err(|e| e.to_string())?;
        }
        for r in want.iter().filter(|r| !have.contains(r)) {
            self.engine
                .add_route(port, r.dest, engine_target(r.target), r.mtu)
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

impl Dataplane for Datapath {
    fn add_port(&mut self, p: &PortInfo) -> Result<(), String> {
        let id = self
            .engine
            .add_port(p.config.clone())
            .map_err(|e| e.to_string())?;
        let Some(io) = &self.io else {
            return Ok(());
        };
        let tap = open_tap(p).and_then(|t| io.watch_tap(&t, u64::from(id.0)).map(|()| t));
        let tap = match tap {
            Ok(t) => t,
            Err(e) => {
                let _ = self.engine.remove_port(&p.config.name);
                return Err(e);
            }
        };
        let i = id.0 as usize;
        if self.taps.len() <= i {
            self.taps.resize_with(i + 1, || None);
        }
        self.taps[i] = Some(tap);
        Ok(())
    }

    fn remove_port(&mut self, name: &str) -> Result<(), String> {
        let id = self.engine.remove_port(name).map_err(|e| e.to_string())?;
        if let Some(tap) = self.taps.get_mut(id.0 as usize).and_then(Option::take) {
            if let Some(io) = &self.io {
                io.unwatch_tap(&tap);
            }
            if let Err(e) = tap.destroy() {
                tracing::warn!(port = name, error = %e, "tap not destroyed");
            }
        }
        Ok(())
    }

    fn set_v2p(&mut self, e: &V2pEntry) -> Result<(), String> {
        self.engine
            .set_v2p(e.vni, e.vpc_ip, e.underlay_ip, e.vpc_mac)
            .map_err(|e| e.to_string())
    }

    fn clear_v2p(&mut self, vpc_ip: IpAddr, vni: Vni) -> Result<(), String> {
        self.engine
            .clear_v2p(vni, vpc_ip)
            .map_err(|e| e.to_string())
    }

    fn set_routes(&mut self, port: &str, routes: &[RouteEntry]) -> Result<(), String> {
        let before = self.routes(port)?;
        if let Err(e) = self.sync_routes(port, routes) {
            // Put back what was there; this only deletes and re-adds known-good routes.
            if let Err(undo) = self.sync_routes(port, &before) {
                tracing::error!(port, error = %undo, "routing table not restored");
            }
            return Err(e);
        }
        Ok(())
    }

    fn routes(&self, port: &str) -> Result<Vec<RouteEntry>, String> {
        Ok(self
            .engine
            .dump_routes(port)
            .map_err(|e| e.to_string())?
            .into_iter()
            .map(|r| RouteEntry {
                dest: r.dst,
                target: api_target(r.target),
                mtu: r.mtu,
            })
            .collect())
    }

    fn set_fw_rules(&mut self, port: &str, rules: &[FwRule]) -> Result<(), String> {
        let mut compiled = Vec::new();
        for r in rules {
            compiled.extend(engine_fw_rules(r)?);
        }
        self.engine
            .set_fw_rules(port, compiled)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    fn clear_uft(&mut self, port: &str) -> Result<(), String> {
        self.engine.clear_uft(port).map_err(|e| e.to_string())
    }

    fn inspect(&mut self, what: &Inspect) -> Result<serde_json::Value, String> {
        let json = |v: Result<serde_json::Value, serde_json::Error>| {
            v.map_err(|e| format!("cannot encode result: {e}"))
        };
        let e = |e: engine::EngineError| e.to_string();
        match what {
            Inspect::Layer { port, layer } => json(serde_json::to_value(
                self.engine.dump_layer(port, layer).map_err(e)?,
            )),
            Inspect::Uft { port } => {
                json(serde_json::to_value(self.engine.dump_uft(port).map_err(e)?))
            }
            Inspect::Mtu { port } => json(serde_json::to_value(
                self.engine.mtu_budget(port).map_err(e)?,
            )),
            Inspect::Ra { port } => {
                let info = self.engine.ra_info(port).map_err(e)?.ok_or_else(|| {
                    format!("port {port:?} advertises no RA (it has no IPv6 address)")
                })?;
                let mut v = json(serde_json::to_value(info))?;
                // The engine's clock is ours: say how long ago, not the raw nanoseconds.
                if let Some(sent) = v.get("last_sent_ns").and_then(|s| s.as_u64()) {
                    let ago = self.now().saturating_sub(sent) / 1_000_000;
                    v["last_sent_ms_ago"] = ago.into();
                }
                Ok(v)
            }
            Inspect::Stats { port: Some(port) } => {
                let stats = self.engine.stats();
                let p = stats
                    .ports
                    .into_iter()
                    .find(|p| &p.name == port)
                    .ok_or_else(|| format!("no port named {port:?}"))?;
                json(serde_json::to_value(p))
            }
            Inspect::Stats { port: None } => {
                let xsk = self.io.as_ref().map(|io| io.queues.stats());
                let next_hops = self.io.as_ref().map(|io| io.next_hops.stats());
                json(serde_json::to_value(serde_json::json!({
                    "engine": self.engine.stats(),
                    "worker": &self.stats,
                    "xsk": xsk,
                    "next_hops": next_hops,
                })))
            }
        }
    }
}

impl WorkerPlane for Datapath {
    fn set_port_owner(&mut self, port: &PortKey, owner: Option<usize>) {
        match owner {
            // This worker's own port: its engine has it already.
            Some(w) if w == self.index => {}
            Some(w) => {
                let worker = u16::try_from(w).unwrap_or(u16::MAX);
                if let Err(e) = self
                    .engine
                    .set_sibling_port(port.vni, port.mac, &port.ips, port.mtu, worker)
                {
                    // The owner's engine refused a port colliding with one of ours
                    // when it was created, so this does not happen.
                    tracing::error!(worker = w, error = %e, "another worker's port not recorded");
                }
            }
            None => self
                .engine
                .clear_sibling_port(port.vni, port.mac, &port.ips),
        }
    }
}

/// A finalized engine firewall rule with its direction.
type EngineFwRule = (engine::Direction, Rule<Finalized, engine::FwAction>);

/// Compiles an API firewall rule into engine rules: the remote host is the source
/// of inbound traffic and the destination of outbound; several ports become one rule
/// per port (the engine's predicates are all-of).
fn engine_fw_rules(r: &FwRule) -> Result<Vec<EngineFwRule>, String> {
    let dir = match r.direction {
        Direction::In => engine::Direction::In,
        Direction::Out => engine::Direction::Out,
    };
    let action = match r.action {
        FwAction::Allow => engine::FwAction::Allow,
        FwAction::Deny => engine::FwAction::Deny,
    };
    let host = match r.filters.host {
        FwHost::Any => None,
        FwHost::Ip(ip) => Some(IpNet::from(ip)),
        FwHost::Subnet(n) => Some(n),
    };
    let proto = match r.filters.proto {
        FwProto::Any => None,
        FwProto::Tcp => Some(6),
        FwProto::Udp => Some(17),
        FwProto::Icmp => Some(1),
        FwProto::Icmp6 => Some(58),
    };
    let base = || {
        let mut rule = Rule::new(r.priority, action);
        if let Some(h) = host {
            rule = rule.matching(match dir {
                engine::Direction::In => Predicate::SrcIp(h),
                engine::Direction::Out => Predicate::DstIp(h),
            });
        }
        if let Some(p) = proto {
            rule = rule.matching(Predicate::Proto(p));
        }
        rule
    };
    let unfinished = if r.filters.ports.is_empty() {
        vec![base()]
    } else {
        r.filters
            .ports
            .iter()
            .map(|p| base().matching(Predicate::DstPort(PortRange::single(*p))))
            .collect()
    };
    unfinished
        .into_iter()
        .map(|u| {
            u.finalize()
                .map(|f| (dir, f))
                .map_err(|e| format!("firewall rule \"{r}\": {e}"))
        })
        .collect()
}

/// Pins the calling thread to `core` so the worker keeps its caches and does not
/// compete with the other workers.
pub fn pin_to_core(core: usize) -> Result<(), String> {
    // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: CPU_SET writes one bit inside `set`; `core` is below CPU_SETSIZE
    // (checked by the config parser, MAX_CORE).
    unsafe { libc::CPU_SET(core, &mut set) };
    // SAFETY: pid 0 is the calling thread; `set` is a valid cpu_set_t of that size.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if r != 0 {
        return Err(format!(
            "cannot pin worker to core {core}: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every daemon draws its own seed: never the engine's fixed test default, and
    /// two draws differ (a collision has probability 2^-64).
    #[test]
    fn engine_config_has_a_random_hash_seed() {
        let cfg = DaemonConfig {
            underlay: vec!["eth1".into()],
            underlay_addr: "fd00::1".parse().unwrap(),
            api_socket: "/run/overlayd/api.sock".into(),
            state_dir: "/var/lib/overlayd".into(),
            cores: Vec::new(),
            external_jumbo: false,
            boundary_services: None,
            boundary_vni: Vni::new(99).unwrap(),
            xdp_mode: crate::config::XdpMode::Native,
            poll: crate::config::PollMode::Adaptive,
            log_level: "info".into(),
        };
        let fixed = EngineConfig::new(cfg.underlay_addr).hash_seed;
        let a = engine_config(&cfg, 9000).unwrap();
        let b = engine_config(&cfg, 9000).unwrap();
        assert_ne!(a.hash_seed, fixed);
        assert_ne!(a.hash_seed, b.hash_seed);
        assert_eq!(a.underlay_mtu, 9000);
    }
}
