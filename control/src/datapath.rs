//! The glue between the engine and the I/O edge: one worker's [`Datapath`] (its
//! engine, its ports' taps, its underlay queues, inspection) and the poll-mode loop
//! that moves its frames.
//!
//! Threading: one worker per configured core, each pinned and each owning a
//! `Datapath` with an engine of its own; every port lives on exactly one worker
//! (see [`crate::workers`], which also fans API requests out to the workers). A
//! worker applies requests between batches, so its fast path takes no lock and a
//! batch never sees configuration change half-way. Underlay next hops are resolved
//! by a helper thread per worker ([`crate::neighbours`]): a worker never waits on
//! netlink.
//!
//! With several workers, frames can arrive at the wrong worker: an underlay queue
//! carries frames for every port, and a guest's frame to a port of another worker
//! on this sled leaves its engine encapsulated toward our own underlay address.
//! Both are handed to the owning worker through [`crate::handoff`] rings and enter
//! its engine as underlay frames. With one worker none of this runs: the loop is
//! the single-threaded datapath it always was.
//!
//! Without I/O (tests, `--no-io` style embedding) the same [`Datapath`] runs with no
//! taps and no underlay: requests are applied to the engine alone.

use crate::api::{
    Direction, FwAction, FwHost, FwProto, FwRule, PortInfo, RouteEntry, RouteTarget, V2pEntry,
};
use crate::config::DaemonConfig;
use crate::controller::{Dataplane, Inspect};
use crate::handoff::{handoff_ring, Doorbell, HandoffRx, HandoffTx, PushError};
use crate::neighbours::NextHops;
use crate::underlay::{SendError, UnderlayQueues};
use crate::workers::{serve_jobs, JobRx, PortKey, WorkerPlane};
use dpio::tap::{TapPort, MAX_TAP_FRAME};
use engine::rule::{Finalized, PortRange, Predicate, Rule};
use engine::{Engine, EngineConfig, MacAddr, PortId, TxBatch, TxDest, UnderlayRoutes, Vni};
use ipnet::IpNet;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
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
    /// Underlay frames received for a port of another worker and handed to it.
    pub handoff_out: u64,
    /// Frames other workers handed to this one (received and loopback).
    pub handoff_in: u64,
    /// The ring to the owning worker was full: dropped.
    pub handoff_full: u64,
    /// A frame longer than a ring slot: dropped.
    pub handoff_too_long: u64,
    /// Frames from a local guest to a port of another worker on this sled (sent
    /// to our own underlay address), handed to the owner instead of the wire.
    pub loopback_handoff: u64,
    /// Frames to our own underlay address whose (VNI, MAC) no other worker
    /// owns: dropped.
    pub loopback_unowned: u64,
}

/// How many frames may wait in one worker-to-worker ring.
pub const HANDOFF_SLOTS: usize = 512;

/// The rings between one worker and each of the others.
pub struct Mesh {
    /// Indexed by worker; `None` for this worker itself.
    to: Vec<Option<HandoffTx>>,
    /// The other workers' doorbells, by worker (`None` for this one).
    wake: Vec<Option<Arc<Doorbell>>>,
    /// Which of `to` got frames since they were last woken.
    pushed: Vec<bool>,
    from: Vec<HandoffRx>,
}

impl Mesh {
    /// Hands `frame` to worker `w`, counting the outcome.
    fn push(&mut self, w: usize, frame: &[u8], st: &mut WorkerStats) -> bool {
        let Some(Some(tx)) = self.to.get_mut(w) else {
            return false;
        };
        match tx.push(frame) {
            Ok(()) => {
                if let Some(p) = self.pushed.get_mut(w) {
                    *p = true;
                }
                true
            }
            Err(PushError::Full) => {
                st.handoff_full += 1;
                false
            }
            Err(PushError::TooLong { .. }) => {
                st.handoff_too_long += 1;
                false
            }
        }
    }

    /// Wakes the workers that were handed frames (if they sleep).
    fn wake(&mut self) {
        for (w, p) in self.pushed.iter_mut().enumerate() {
            if std::mem::take(p) {
                if let Some(Some(d)) = self.wake.get(w) {
                    d.ring();
                }
            }
        }
    }

    fn pending(&self) -> bool {
        self.from.iter().any(|r| !r.is_empty())
    }
}

/// The rings between `doorbells.len()` workers, `slot_size` bytes per frame: one
/// [`Mesh`] per worker, in worker order.
pub fn mesh(doorbells: &[Arc<Doorbell>], slot_size: usize) -> Vec<Mesh> {
    let n = doorbells.len();
    let mut meshes: Vec<Mesh> = (0..n)
        .map(|_| Mesh {
            to: (0..n).map(|_| None).collect(),
            wake: vec![None; n],
            pushed: vec![false; n],
            from: Vec::new(),
        })
        .collect();
    for src in 0..n {
        for dst in (0..n).filter(|&d| d != src) {
            let (tx, rx) = handoff_ring(HANDOFF_SLOTS, slot_size);
            meshes[src].to[dst] = Some(tx);
            meshes[src].wake[dst] = Some(doorbells[dst].clone());
            meshes[dst].from.push(rx);
        }
    }
    meshes
}

/// What a worker needs for I/O besides its taps.
pub struct WorkerIo {
    /// This worker's index.
    pub index: usize,
    pub queues: UnderlayQueues,
    pub next_hops: NextHops,
    pub mesh: Mesh,
    pub doorbell: Arc<Doorbell>,
    /// With several workers: the next hop the engine is given for our own
    /// underlay address (see [`crate::underlay::Underlay::loopback_next_hop`]).
    /// `None` with one worker, where such frames go to the wire as they always did.
    pub loopback: Option<engine::NextHop>,
}

/// The engine's view of underlay next hops on one worker: the resolver's table,
/// plus our own address when other workers own some of this sled's ports.
struct WorkerRoutes<'a> {
    next_hops: &'a NextHops,
    own: Ipv6Addr,
    loopback: Option<engine::NextHop>,
}

impl UnderlayRoutes for WorkerRoutes<'_> {
    fn next_hop(&self, dst: Ipv6Addr) -> Option<engine::NextHop> {
        match self.loopback {
            Some(l) if dst == self.own => Some(l),
            _ => self.next_hops.next_hop(dst),
        }
    }
}

/// The worker owning the port an underlay frame is for, by outer VNI and inner
/// destination MAC — the engine's own dispatch key. `None` when the frame does
/// not parse (the local engine then counts why) or no worker owns the key.
fn frame_owner(owners: &HashMap<(u32, MacAddr), usize>, frame: &[u8]) -> Option<usize> {
    let um = wire::meta::parse_underlay(frame).ok()?;
    let mac: [u8; 6] = frame.get(um.inner_off..um.inner_off + 6)?.try_into().ok()?;
    owners.get(&(um.vni, MacAddr(mac))).copied()
}

/// The outer IPv6 destination of an untagged underlay frame the engine built.
fn outer_dst(frame: &[u8]) -> Option<Ipv6Addr> {
    if frame.get(12..14)? != [0x86, 0xdd] {
        return None;
    }
    let b: [u8; 16] = frame.get(38..54)?.try_into().ok()?;
    Some(Ipv6Addr::from(b))
}

/// A port's I/O side.
struct PortSlot {
    id: PortId,
    tap: Option<TapPort>,
}

/// One worker's engine plus, when I/O is on, its taps and underlay queues.
pub struct Datapath {
    engine: Engine,
    ports: BTreeMap<String, PortSlot>,
    io: Option<WorkerIo>,
    /// Which worker owns each (VNI, guest MAC), this one's ports included.
    owners: HashMap<(u32, MacAddr), usize>,
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
            io: None,
            owners: HashMap::new(),
            stats: WorkerStats::default(),
            epoch: Instant::now(),
        }
    }

    /// A worker's datapath serving its underlay queues and creating a tap per port.
    pub fn with_io(engine: Engine, io: WorkerIo) -> Datapath {
        Datapath {
            io: Some(io),
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
        let tap = match &self.io {
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
        let key = (port.vni.get(), port.mac);
        let me = self.io.as_ref().map(|io| io.index);
        let own_addr = self.engine.config().underlay_addr;
        match owner {
            Some(w) => {
                self.owners.insert(key, w);
                // Another worker's port is, for this worker's engine, a guest on
                // this sled: map it here so our guests reach it (through the
                // loopback handoff) without an operator-made V2P entry, as they
                // would with one worker.
                if me.is_some_and(|me| me != w) {
                    for ip in &port.ips {
                        if let Err(e) = self.engine.set_v2p(port.vni, *ip, own_addr, port.mac) {
                            tracing::warn!(%ip, error = %e, "cannot map another worker's port");
                        }
                    }
                }
            }
            None => {
                if self
                    .owners
                    .remove(&key)
                    .is_some_and(|w| me.is_some_and(|me| me != w))
                {
                    for ip in &port.ips {
                        let _ = self.engine.clear_v2p(port.vni, *ip);
                    }
                }
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
/// the engine, controller jobs between batches, timers every [`TICK`], and sleep
/// in poll(2) after [`SPIN_ROUNDS`] empty rounds.
pub fn run_worker(dp: &mut Datapath, jobs: &JobRx<Datapath>, stop: &AtomicBool) {
    let mut batch = TxBatch::new();
    let mut buf = vec![0u8; MAX_TAP_FRAME];
    let mut idle_rounds = 0u32;
    let mut last_tick = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let mut work = serve_jobs(jobs, dp);
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
        // Say we sleep before the last look, so a peer that hands us a frame
        // or a job after that look rings the doorbell.
        let bell = dp.io.as_ref().map(|io| io.doorbell.clone());
        if let Some(b) = &bell {
            b.going_to_sleep();
        }
        if serve_jobs(jobs, dp) == 0 && !dp.handoffs_pending() {
            dp.stats.idle_sleeps += 1;
            dp.wait(IDLE_POLL);
        }
        if let Some(b) = &bell {
            b.woke();
        }
    }
}

impl Datapath {
    /// One round: a batch from every tap, every underlay queue and every ring
    /// from the other workers. Returns how many frames came in.
    fn poll_once(&mut self, batch: &mut TxBatch, buf: &mut [u8]) -> usize {
        let Some(io) = self.io.as_mut() else {
            return 0;
        };
        let now = u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let routes = WorkerRoutes {
            next_hops: &io.next_hops,
            own: self.engine.config().underlay_addr,
            loopback: io.loopback,
        };
        let several = io.loopback.is_some();
        let me = io.index;
        let mut got = 0;
        batch.clear();
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
                            .process_guest(slot.id, vnet, frame, now, &routes, batch);
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
        for sock in &mut io.queues.sockets {
            let engine = &mut self.engine;
            let (owners, st, mesh) = (&self.owners, &mut self.stats, &mut io.mesh);
            let n = sock.recv_batch(BATCH, |frame| {
                if several {
                    if let Some(w) = frame_owner(owners, frame).filter(|&w| w != me) {
                        if mesh.push(w, frame, st) {
                            st.handoff_out += 1;
                        }
                        return;
                    }
                }
                engine.process_underlay(frame, now, &routes, batch);
            });
            self.stats.underlay_rx_frames += n as u64;
            got += n;
        }
        for ring in &mut io.mesh.from {
            let engine = &mut self.engine;
            let n = ring.pop_batch(BATCH, |frame| {
                engine.process_underlay(frame, now, &routes, batch);
            });
            self.stats.handoff_in += n as u64;
            got += n;
        }
        self.engine.end_of_batch(batch);
        self.drain(batch);
        self.sync_next_hops();
        got
    }

    /// Frames other workers handed to this one and it has not taken yet.
    fn handoffs_pending(&self) -> bool {
        self.io.as_ref().is_some_and(|io| io.mesh.pending())
    }

    /// Hands the next hops the engine just missed to the resolver (so only the
    /// first packets toward a new sled are lost) and takes the resolver's newest
    /// table for the next batch. Flows compiled with a next hop that has since
    /// changed or gone are dropped, so they are recompiled with the new one.
    fn sync_next_hops(&mut self) {
        let Some(io) = self.io.as_mut() else {
            return;
        };
        if io.next_hops.sync(Instant::now()) {
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

    /// Sends every frame of the batch where the engine said. With several
    /// workers, a frame to our own underlay address is for a port of another
    /// worker: it goes to that worker, not to the wire.
    fn drain(&mut self, batch: &TxBatch) {
        let Some(io) = self.io.as_mut() else {
            return;
        };
        if batch.is_empty() {
            // Frames received for other workers leave nothing in the batch, but
            // their owners still need waking.
            io.mesh.wake();
            return;
        }
        let own = io.loopback.map(|_| self.engine.config().underlay_addr);
        let st = &mut self.stats;
        for (dest, frame) in batch.iter() {
            match dest {
                TxDest::Underlay { .. } if own.is_some() && outer_dst(frame) == own => {
                    match frame_owner(&self.owners, frame).filter(|&w| w != io.index) {
                        Some(w) => {
                            if io.mesh.push(w, frame, st) {
                                st.loopback_handoff += 1;
                            }
                        }
                        None => st.loopback_unowned += 1,
                    }
                }
                TxDest::Underlay { ifindex } => match io.queues.send(ifindex, frame) {
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
        io.queues.kick();
        io.mesh.wake();
        st.batches += 1;
    }

    /// Sleeps until a tap, an underlay socket or the doorbell has something, or
    /// `timeout`.
    fn wait(&self, timeout: Duration) {
        let mut fds: Vec<libc::pollfd> = self
            .ports
            .values()
            .filter_map(|s| s.tap.as_ref())
            .map(|t| t.as_raw_fd())
            .chain(self.io.iter().flat_map(|io| io.queues.fds()))
            .chain(self.io.iter().map(|io| io.doorbell.fd()))
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

    /// An untagged Geneve frame to `dst` with VNI `vni`, one 8-byte option
    /// (shifting the inner frame), and an inner Ethernet frame to `inner_dst`.
    fn geneve_frame(dst: Ipv6Addr, vni: u32, inner_dst: [u8; 6]) -> Vec<u8> {
        let inner: Vec<u8> = inner_dst
            .iter()
            .chain(&[2, 0, 0, 0, 0, 9, 0x08, 0x00])
            .chain(&[0u8; 20])
            .copied()
            .collect();
        let opt = [0x02, 0x00, 0x01, 0x01, 0, 0, 0, 0]; // class 0x0200, type 1, 4 bytes
        let udp_len = 8 + 8 + opt.len() + inner.len();
        let mut f = vec![2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 0x86, 0xdd];
        f.extend([0x60, 0, 0, 0]);
        f.extend((udp_len as u16).to_be_bytes());
        f.extend([17, 64]);
        f.extend("fd00:99::2".parse::<Ipv6Addr>().unwrap().octets());
        f.extend(dst.octets());
        f.extend([0x12, 0x34, 0x17, 0xc1]);
        f.extend((udp_len as u16).to_be_bytes());
        f.extend([0, 0]);
        f.extend([(opt.len() / 4) as u8, 0, 0x65, 0x58]);
        f.extend(&vni.to_be_bytes()[1..]);
        f.push(0);
        f.extend(opt);
        f.extend(inner);
        f
    }

    /// The dispatch key is the outer VNI and the inner destination MAC (behind
    /// the Geneve options); frames that do not parse, or whose key nobody owns,
    /// stay with the receiving worker.
    #[test]
    fn frames_are_dispatched_by_vni_and_inner_mac() {
        let us: Ipv6Addr = "fd00:99::1".parse().unwrap();
        let mac = [0xa8, 0x40, 0x25, 0xff, 0, 5];
        let owners = HashMap::from([((1701, MacAddr(mac)), 1), ((1702, MacAddr(mac)), 0)]);
        let f = geneve_frame(us, 1701, mac);
        assert!(wire::meta::parse_underlay(&f).is_ok());
        assert_eq!(frame_owner(&owners, &f), Some(1));
        assert_eq!(frame_owner(&owners, &geneve_frame(us, 1702, mac)), Some(0));
        assert_eq!(frame_owner(&owners, &geneve_frame(us, 1703, mac)), None);
        let mut other = mac;
        other[5] = 6;
        assert_eq!(frame_owner(&owners, &geneve_frame(us, 1701, other)), None);
        for cut in [0, 13, 53, 70, f.len() - 30] {
            assert_eq!(frame_owner(&owners, &f[..cut]), None, "cut at {cut}");
        }
        assert_eq!(outer_dst(&f), Some(us));
        assert_eq!(outer_dst(&f[..53]), None);
        let mut tagged = f.clone();
        tagged[12..14].copy_from_slice(&[0x81, 0x00]);
        assert_eq!(outer_dst(&tagged), None);
    }

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
