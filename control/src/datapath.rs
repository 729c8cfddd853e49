//! The glue between the engine and the I/O edge: the daemon's [`Dataplane`] (ports,
//! tables, inspection) and the worker loop that moves frames.
//!
//! Threading choice for this slice: one worker thread owns everything — the engine,
//! the taps, the AF_XDP sockets and the controller. API requests arrive over a
//! channel and are applied between batches, so the fast path takes no lock and a
//! batch never sees configuration change half-way. Underlay next hops are resolved
//! by a helper thread ([`crate::neighbours`]): the worker never waits on netlink. The worker is pinned to the first
//! configured core; more cores need the engine split per worker (per-queue flow
//! tables), which is future work.
//!
//! Without I/O (tests, `--no-io` style embedding) the same [`Datapath`] runs with no
//! taps and no underlay: requests are applied to the engine alone.

use crate::api::{
    Direction, FwAction, FwHost, FwProto, FwRule, PortInfo, RouteEntry, RouteTarget, V2pEntry,
};
use crate::config::DaemonConfig;
use crate::controller::Controller;
use crate::controller::{Dataplane, Inspect};
use crate::server::{serve_pending, RequestRx};
use crate::underlay::{SendError, Underlay};
use dpio::tap::{TapPort, MAX_TAP_FRAME};
use engine::rule::{Finalized, PortRange, Predicate, Rule};
use engine::{Engine, EngineConfig, PortId, TxBatch, TxDest, Vni};
use ipnet::IpNet;
use serde::Serialize;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Frames taken from one source before moving to the next, so one busy guest cannot
/// starve the others or the underlay.
pub const BATCH: usize = 64;

/// How often the engine's timers run (unsolicited RAs, flow expiry).
const TICK: Duration = Duration::from_millis(100);

/// Empty rounds before the worker sleeps in poll(2): long enough to ride out gaps
/// inside a burst, short enough that an idle daemon uses no measurable CPU.
const SPIN_ROUNDS: u32 = 256;

/// The longest an idle worker sleeps; also bounds API request latency when idle.
const IDLE_POLL: Duration = Duration::from_millis(10);

/// Worker counters: what happened at the I/O edge that the engine cannot see.
#[derive(Clone, Debug, Default, Serialize)]
pub struct WorkerStats {
    pub batches: u64,
    pub idle_sleeps: u64,
    pub tap_rx_frames: u64,
    pub tap_rx_errors: u64,
    pub tap_tx_frames: u64,
    /// Frames for a guest whose link is down (EIO from the tap): dropped.
    pub tap_tx_link_down: u64,
    pub tap_tx_errors: u64,
    /// Frames for a port that has no tap (deleted meanwhile): dropped.
    pub tap_tx_no_port: u64,
    pub underlay_rx_frames: u64,
    pub underlay_tx_frames: u64,
    /// The AF_XDP ring stayed full after a kick: dropped.
    pub underlay_tx_full: u64,
    /// Frame longer than the socket can send: dropped.
    pub underlay_tx_invalid: u64,
    /// The engine named an interface that is not an underlay link: dropped.
    pub underlay_tx_no_link: u64,
}

/// A port's I/O side.
struct PortSlot {
    id: PortId,
    tap: Option<TapPort>,
}

/// The engine plus, when I/O is on, the taps and the underlay.
pub struct Datapath {
    engine: Engine,
    ports: BTreeMap<String, PortSlot>,
    underlay: Option<Underlay>,
    stats: WorkerStats,
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
            ports: BTreeMap::new(),
            underlay: None,
            stats: WorkerStats::default(),
            epoch: Instant::now(),
        }
    }

    /// A datapath serving `underlay` and creating a tap per port.
    pub fn with_io(engine: Engine, underlay: Underlay) -> Datapath {
        Datapath {
            underlay: Some(underlay),
            ..Datapath::without_io(engine)
        }
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
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
        let tap = match &self.underlay {
            Some(_) => match open_tap(p) {
                Ok(t) => Some(t),
                Err(e) => {
                    let _ = self.engine.remove_port(&p.config.name);
                    return Err(e);
                }
            },
            None => None,
        };
        self.ports
            .insert(p.config.name.clone(), PortSlot { id, tap });
        Ok(())
    }

    fn remove_port(&mut self, name: &str) -> Result<(), String> {
        self.engine.remove_port(name).map_err(|e| e.to_string())?;
        if let Some(slot) = self.ports.remove(name) {
            if let Some(tap) = slot.tap {
                if let Err(e) = tap.destroy() {
                    tracing::warn!(port = name, error = %e, "tap not destroyed");
                }
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
                let links = self.underlay.as_mut().map(|u| u.stats());
                let next_hops = self.underlay.as_ref().map(|u| u.next_hops.stats());
                json(serde_json::to_value(serde_json::json!({
                    "engine": self.engine.stats(),
                    "worker": &self.stats,
                    "underlay": links,
                    "next_hops": next_hops,
                })))
            }
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

/// Runs the worker until `stop` is set: frames between taps and the underlay through
/// the engine, API requests between batches, timers every [`TICK`].
pub fn run_worker(ctl: &mut Controller<Datapath>, requests: &RequestRx, stop: &AtomicBool) {
    let mut batch = TxBatch::new();
    let mut buf = vec![0u8; MAX_TAP_FRAME];
    let mut idle_rounds = 0u32;
    let mut last_tick = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let mut work = serve_pending(requests, |r| ctl.handle(r));
        let dp = ctl.dataplane_mut();
        work += dp.poll_once(&mut batch, &mut buf);
        if last_tick.elapsed() >= TICK {
            last_tick = Instant::now();
            dp.tick(&mut batch);
        }
        if work > 0 {
            idle_rounds = 0;
            continue;
        }
        idle_rounds += 1;
        if idle_rounds < SPIN_ROUNDS {
            std::hint::spin_loop();
            continue;
        }
        dp.stats.idle_sleeps += 1;
        dp.wait(IDLE_POLL);
    }
}

impl Datapath {
    /// One round: a batch from every tap and every underlay queue. Returns how many
    /// frames came in.
    fn poll_once(&mut self, batch: &mut TxBatch, buf: &mut [u8]) -> usize {
        let Some(underlay) = self.underlay.as_mut() else {
            return 0;
        };
        let now = u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let mut got = 0;
        batch.clear();
        {
            let routes = &underlay.next_hops;
            for slot in self.ports.values_mut() {
                let Some(tap) = slot.tap.as_mut() else {
                    continue;
                };
                for _ in 0..BATCH {
                    match tap.read(buf) {
                        Ok(Some((vnet, len))) => {
                            got += 1;
                            self.stats.tap_rx_frames += 1;
                            let frame = buf.get(..len).unwrap_or(&[]);
                            self.engine
                                .process_guest(slot.id, vnet, frame, now, routes, batch);
                        }
                        Ok(None) => break,
                        Err(e) => {
                            self.stats.tap_rx_errors += 1;
                            tracing::debug!(port = tap.name(), error = %e, "tap read failed");
                            break;
                        }
                    }
                }
            }
            for link in &mut underlay.links {
                for sock in &mut link.sockets {
                    let engine = &mut self.engine;
                    let n = sock.recv_batch(BATCH, |frame| {
                        engine.process_underlay(frame, now, routes, batch);
                    });
                    self.stats.underlay_rx_frames += n as u64;
                    got += n;
                }
            }
        }
        self.engine.end_of_batch(batch);
        self.drain(batch);
        self.sync_next_hops();
        got
    }

    /// Hands the next hops the engine just missed to the resolver (so only the
    /// first packets toward a new sled are lost) and takes the resolver's newest
    /// table for the next batch. Flows compiled with a next hop that has since
    /// changed or gone are dropped, so they are recompiled with the new one.
    fn sync_next_hops(&mut self) {
        let Some(u) = self.underlay.as_mut() else {
            return;
        };
        if u.next_hops.sync(Instant::now()) {
            tracing::debug!("underlay next hop changed; recompiling flows");
            self.engine.invalidate_next_hops();
        }
    }

    /// The engine's timers: unsolicited RAs, flow expiry.
    fn tick(&mut self, batch: &mut TxBatch) {
        batch.clear();
        let now = self.now();
        self.engine.tick(now, batch);
        self.drain(batch);
    }

    /// Sends every frame of the batch where the engine said.
    fn drain(&mut self, batch: &TxBatch) {
        if batch.is_empty() {
            return;
        }
        let Some(underlay) = self.underlay.as_mut() else {
            return;
        };
        let st = &mut self.stats;
        for (dest, frame) in batch.iter() {
            match dest {
                TxDest::Underlay { ifindex } => match underlay.send(ifindex, frame) {
                    Ok(()) => st.underlay_tx_frames += 1,
                    Err(SendError::NoSuchLink) => st.underlay_tx_no_link += 1,
                    Err(SendError::Tx(dpio::xsk::TxError::Full)) => st.underlay_tx_full += 1,
                    Err(SendError::Tx(_)) => st.underlay_tx_invalid += 1,
                },
                TxDest::Port { port, vnet } => {
                    let tap = self
                        .ports
                        .values()
                        .find(|s| s.id == port)
                        .and_then(|s| s.tap.as_ref());
                    match tap.map(|t| t.write(&vnet, frame)) {
                        None => st.tap_tx_no_port += 1,
                        Some(Ok(())) => st.tap_tx_frames += 1,
                        Some(Err(e)) if dpio::tap::is_link_down(&e) => st.tap_tx_link_down += 1,
                        Some(Err(e)) => {
                            st.tap_tx_errors += 1;
                            tracing::debug!(?port, error = %e, "tap write failed");
                        }
                    }
                }
            }
        }
        underlay.kick();
        st.batches += 1;
    }

    /// Sleeps until a tap or an underlay socket has something, or `timeout`.
    fn wait(&self, timeout: Duration) {
        let mut fds: Vec<libc::pollfd> = self
            .ports
            .values()
            .filter_map(|s| s.tap.as_ref())
            .map(|t| t.as_raw_fd())
            .chain(
                self.underlay
                    .iter()
                    .flat_map(|u| u.links.iter())
                    .flat_map(|l| l.sockets.iter())
                    .map(|s| s.as_raw_fd()),
            )
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        if fds.is_empty() {
            std::thread::sleep(timeout);
            return;
        }
        let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
        // SAFETY: `fds` is a live array of `fds.len()` pollfd structs.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    }
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
