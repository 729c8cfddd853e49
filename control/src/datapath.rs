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
//! A port whose tap goes away (its guest's namespace deleted, the device removed)
//! is marked down and its tap re-opened by a [`Reattacher`] thread on a back-off
//! until the tap can be had again; the worker then serves it as before. The
//! worker only takes fds out of and into its poll set: it never waits for a tap
//! to be opened.
//!
//! Without I/O (tests, `--no-io` style embedding) the same [`Datapath`] runs with no
//! taps and no underlay: requests are applied to the engine alone.

use crate::api::VhostUserMode;
use crate::api::{
    Direction, FwAction, FwHost, FwRule, Outcome, PortInfo, PortLink, Reply, RouteEntry,
    RouteTarget, V2pEntry,
};
use crate::config::DaemonConfig;
use crate::controller::{Dataplane, Inspect, PortTables};
use crate::stats::{QueueRef, WorkerInfo, WorkerReport, WorkerView};
use crate::worker::{Backoff, WorkerIo, WorkerStats};
use crate::workers::{PortKey, WorkerPlane, Workers};
use dpio::guest::GuestPort;
use dpio::netlink::Netlink;
use dpio::packet::PacketPort;
use dpio::tap::TapPort;
use dpio::vhost::VhostPort;
use engine::ExternalIps;
use engine::V2b;
use engine::{Engine, EngineConfig, MacAddr, PortCidrs, PortLimits, PortState, TxBatch, Vni};
use engine::{Finalized, PortRange, Predicate, Rule};
use ipnet::IpNet;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// One worker's engine plus, when I/O is on, its taps and underlay queues.
pub struct Datapath {
    pub(crate) engine: Engine,
    /// Each port's tap, by the engine's port id (`None`: no I/O, or no such port).
    pub(crate) taps: Vec<Option<PortTap>>,
    /// Numbers the ports this worker was given, so that a tap re-attached for a
    /// deleted port never goes to a later port in the same slot.
    next_gen: u64,
    pub(crate) io: Option<WorkerIo>,
    pub(crate) stats: WorkerStats,
    /// The output batch, kept for its capacity.
    pub(crate) batch: TxBatch<'static>,
    /// This worker's index (0 without I/O).
    index: usize,
    /// The core its thread is pinned to, if any, and when it was made.
    core: Option<usize>,
    started: SystemTime,
    /// Monotonic origin of the engine's clock.
    epoch: Instant,
    /// Per port, the firewall rule (its id: position from 1 in the port's rule list)
    /// each engine rule was compiled from, so `dump-layer` shows the ids
    /// `rm-fw-rule` takes next to the engine's rules and their hits.
    fw_rule_ids: HashMap<String, HashMap<u64, u64>>,
}

/// The engine's configuration from the daemon's and the underlay link's MTU, with a
/// flow-table hash seed drawn for this process.
pub fn engine_config(cfg: &DaemonConfig, underlay_mtu: u32) -> Result<EngineConfig, String> {
    let mut e = EngineConfig::new(cfg.underlay_addr);
    e.underlay_mtu = u16::try_from(underlay_mtu)
        .map_err(|_| format!("underlay MTU {underlay_mtu} is above 65535"))?;
    e.external_jumbo = cfg.external_jumbo;
    e.boundary_services = cfg.boundary_services;
    e.boundary_vni = cfg.boundary_vni;
    // One engine per worker (one worker per configured core, or one): together
    // they keep to the sled's table budget.
    e.tables = cfg.tables.split(cfg.cores.len().max(1));
    e.hash_seed = random_seed()?;
    Ok(e)
}

/// 64 bits from the kernel's CSPRNG (getrandom(2)). Remote peers choose inbound
/// flow keys, so the flow and connection tables' hash must be keyed with a value
/// they cannot know or predict; the engine makes no syscalls and takes it from us.
fn random_seed() -> Result<u64, String> {
    getrandom::u64().map_err(|e| format!("cannot draw the flow hash seed: {e}"))
}

impl Datapath {
    /// A datapath with no I/O: ports exist only in the engine.
    pub fn without_io(engine: Engine) -> Datapath {
        Datapath {
            engine,
            taps: Vec::new(),
            next_gen: 0,
            io: None,
            stats: WorkerStats::default(),
            batch: TxBatch::new(),
            index: 0,
            core: None,
            started: SystemTime::now(),
            epoch: Instant::now(),
            fw_rule_ids: HashMap::new(),
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

    /// Records the core the worker's thread is pinned to, for `xdeadm workers`.
    pub fn on_core(self, core: Option<usize>) -> Datapath {
        Datapath { core, ..self }
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Plans with an underlay of `mtu` from now on (segment sizes, MTU budget,
    /// Packet Too Big); returns this worker's ports whose MTU no longer fits.
    pub(crate) fn set_underlay_mtu(&mut self, mtu: u32) -> Result<Vec<String>, String> {
        let mtu = u16::try_from(mtu).map_err(|_| format!("underlay MTU {mtu} is above 65535"))?;
        self.engine.set_underlay_mtu(mtu).map_err(|e| e.to_string())
    }

    /// The engine's clock at `at`: nanoseconds since this datapath started.
    pub(crate) fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    fn now(&self) -> u64 {
        self.nanos(Instant::now())
    }
}

/// Opens a port's device: attaches to its interface (`--attach`), or opens (or,
/// after a restart or once its guest is back, reattaches to) its tap and puts it
/// where the guest expects it.
fn open_port(p: &PortInfo) -> Result<GuestPort, String> {
    match &p.attach {
        Some(iface) => attach_port(p, iface).map(GuestPort::Attached),
        None => open_tap(p).map(GuestPort::Tap),
    }
}

/// Attaches port `p` to the hypervisor's interface `iface`, in the daemon's
/// namespace, saying what had to change on it.
fn attach_port(p: &PortInfo, iface: &str) -> Result<PacketPort, String> {
    let name = &p.config.name;
    let mtu = u32::from(p.config.mtu);
    let (port, done) = PacketPort::attach(iface, mtu).map_err(|e| format!("port {name:?}: {e}"))?;
    if let Some(was) = done.mtu_raised_from {
        // The hypervisor made it at its default; the VM's frames and ours are up to
        // the port's MTU, which the VM's virtio device must advertise too
        // (`xdeadm mtu`).
        tracing::info!(port = %name, iface, from = was, to = mtu, "attached interface's MTU raised to the port's");
    }
    if done.brought_up {
        tracing::info!(port = %name, iface, "attached interface was down: brought up");
    }
    Ok(port)
}

/// Refuses to attach port `p` to one of the daemon's underlay links (every worker
/// has a socket on each): its Geneve traffic would be taken for a guest's frames
/// and the guest's sent onto the sled's network. An interface that cannot be
/// looked up is left for the attach to report.
fn not_an_underlay_link(p: &PortInfo, io: &WorkerIo) -> Result<(), String> {
    let Some(iface) = &p.attach else {
        return Ok(());
    };
    let Ok(link) = Netlink::open().and_then(|mut nl| nl.link_by_name(iface)) else {
        return Ok(());
    };
    if io
        .queues
        .sockets
        .iter()
        .any(|s| s.ifindex() == link.ifindex)
    {
        return Err(format!(
            "port {:?}: interface {iface:?} is an underlay link of this daemon, not a hypervisor's",
            p.config.name
        ));
    }
    Ok(())
}

/// Opens (or, after a restart or once its guest is back, reattaches to) the tap of a
/// port and puts it where the guest expects it.
fn open_tap(p: &PortInfo) -> Result<TapPort, String> {
    let name = &p.config.name;
    let ctx = |e: std::io::Error| format!("tap {name:?}: {e}");
    if let Some(ns) = &p.netns {
        // A tap made for a namespace that is not there could only be destroyed again.
        let path = dpio::netns::netns_path(ns).map_err(ctx)?;
        if !path.exists() {
            return Err(format!(
                "tap {name:?}: network namespace {ns:?} ({}) does not exist",
                path.display()
            ));
        }
        // A persistent tap survives the daemon; if it is already in the guest's
        // namespace, take it over there.
        match TapPort::attach_in_netns(ns, name) {
            Ok(t) => return Ok(t),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(ctx(e)),
        }
    }
    let mac = match p.netns {
        Some(_) => p.config.guest_mac,
        None => bridge_port_mac(p.config.guest_mac),
    };
    let tap = TapPort::create(name, mac).map_err(ctx)?;
    tap.set_mtu(u32::from(p.config.mtu)).map_err(ctx)?;
    if let Some(ns) = &p.netns {
        if let Err(e) = tap.move_to_netns(ns) {
            let _ = tap.destroy();
            return Err(ctx(e));
        }
    }
    Ok(tap)
}

/// The MAC of a tap left in the daemon's namespace (no `--netns`): there it is not
/// the guest's interface but the datapath's end of a link to it, to be bridged to
/// a VM's own tap (as libvirt attaches VMs). Were it the guest's MAC, a bridge would
/// take every frame for the guest as addressed to the bridge itself and never
/// forward it: the VM would get no DHCP offer, RA or traffic. libvirt's rule: the
/// guest's MAC with the first octet 0xfe (locally administered, and high, so a
/// bridge does not take it for its own address).
fn bridge_port_mac(guest: MacAddr) -> MacAddr {
    let mut m = guest.0;
    m[0] = 0xfe;
    MacAddr(m)
}

/// A new port's guest side: its tap, or its vhost-user socket served.
fn open_guest(p: &PortInfo, io: &WorkerIo) -> Result<GuestPort, String> {
    let Some(v) = &p.vhost_user else {
        return open_port(p);
    };
    let cfg = dpio::vhost::DeviceConfig {
        name: p.config.name.clone(),
        socket: v.socket.clone(),
        mode: match v.mode {
            VhostUserMode::Server => dpio::vhost::Mode::Server,
            VhostUserMode::Client => dpio::vhost::Mode::Client,
        },
    };
    // A kick wakes the worker like its doorbell: the round then looks at every
    // vhost-user port's transmit ring.
    io.epoll
        .watcher()
        .and_then(|w| VhostPort::start(cfg, w, crate::worker::TOKEN_DOORBELL))
        .map(GuestPort::Vhost)
        .map_err(|e| format!("port {:?}: {e}", p.config.name))
}

/// One port's tap as its worker serves it.
pub(crate) struct PortTap {
    /// What the tap is opened from: name, MAC, MTU, the guest's namespace.
    pub(crate) info: PortInfo,
    /// Which port of this worker it is (see [`Datapath::next_gen`]).
    pub(crate) gen: u64,
    pub(crate) link: TapLink,
}

/// Whether a port's tap (or attached interface) is served.
pub(crate) enum TapLink {
    /// Open and served: a tap or attached interface in the worker's poll set, or
    /// a vhost-user port (whose link follows its front end: see [`TapLink::view`]).
    Up(GuestPort),
    /// Gone since `since` (why: `reason`); the [`Reattacher`] is getting it back.
    Down { since: SystemTime, reason: String },
}

/// Milliseconds since the Unix epoch (0 for a time before it), as the API shows times.
fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl TapLink {
    /// As `list-ports` shows it.
    fn view(&self) -> PortLink {
        match self {
            TapLink::Up(GuestPort::Vhost(v)) if !v.is_up() => PortLink::Down {
                since_unix_ms: unix_ms(v.changed()),
                reason: format!(
                    "no vhost-user front end on {} has started the rings",
                    v.socket().display()
                ),
            },
            TapLink::Up(_) => PortLink::Up,
            TapLink::Down { since, reason } => PortLink::Down {
                since_unix_ms: unix_ms(*since),
                reason: reason.clone(),
            },
        }
    }
}

impl Datapath {
    /// The link state of each of this worker's ports.
    fn port_links(&self) -> Vec<(String, PortLink)> {
        self.taps
            .iter()
            .flatten()
            .map(|p| (p.info.config.name.clone(), p.link.view()))
            .collect()
    }
}

/// A `list-ports` answer with each port's link state filled in, asked of the
/// workers that serve the taps; any other answer as it is.
pub fn with_port_links(out: Outcome, workers: &Workers<Datapath>) -> Outcome {
    let Outcome::Ok(Reply::Ports(mut ports)) = out else {
        return out;
    };
    let mut links = HashMap::new();
    for w in 0..workers.count() {
        match workers.call(w, |dp: &mut Datapath| dp.port_links()) {
            Ok(l) => links.extend(l),
            Err(e) => tracing::warn!(worker = w, error = %e, "port link states not read"),
        }
    }
    for p in &mut ports {
        p.link = links.remove(&p.port.config.name);
    }
    Outcome::Ok(Reply::Ports(ports))
}

/// How soon a port whose tap went away is first tried again, and the longest wait
/// between tries: a guest back within a second gets its link back at once, one
/// that stays away costs one failed open every few seconds.
const REATTACH_FIRST: Duration = Duration::from_millis(100);
const REATTACH_MAX: Duration = Duration::from_secs(5);

/// What a worker asks of its [`Reattacher`].
enum Want {
    /// Get the tap of port `slot` number `gen` back.
    Tap {
        slot: usize,
        gen: u64,
        port: Box<PortInfo>,
    },
    /// That port was deleted: stop trying.
    Forget { slot: usize, gen: u64 },
}

/// A tap opened again for port `slot` number `gen`.
pub(crate) struct Reattached {
    pub(crate) slot: usize,
    pub(crate) gen: u64,
    pub(crate) tap: GuestPort,
}

/// One worker's tap re-opener: a thread that tries to open the taps of the
/// worker's down ports, each on its own back-off, and hands back those it got.
/// On a thread because opening a tap in a guest's namespace takes a thread of its
/// own and several netlink round trips, which the worker must not wait for.
pub struct Reattacher {
    /// `None` once dropped, which ends the thread.
    wants: Option<Sender<Want>>,
    back: Receiver<Reattached>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Reattacher {
    /// Starts worker `index`'s re-opener (it opens taps in the caller's network
    /// namespace, like the worker's own ports). `wake` is called after a tap is
    /// handed back, so a sleeping worker serves the port at once.
    pub fn start(index: usize, wake: impl Fn() + Send + 'static) -> Result<Reattacher, String> {
        let (wants, wants_rx) = mpsc::channel();
        let (back_tx, back) = mpsc::channel();
        let thread = thread::Builder::new()
            .name(format!("taps{index}"))
            .spawn(move || reattach_loop(&wants_rx, &back_tx, &wake))
            .map_err(|e| format!("cannot start worker {index}'s tap re-opener: {e}"))?;
        Ok(Reattacher {
            wants: Some(wants),
            back,
            thread: Some(thread),
        })
    }

    fn send(&self, w: Want) {
        if let Some(tx) = &self.wants {
            if tx.send(w).is_err() {
                tracing::error!("tap re-opener has stopped");
            }
        }
    }

    /// Starts getting the tap of port `slot` number `gen` back.
    pub(crate) fn want(&self, slot: usize, gen: u64, port: &PortInfo) {
        self.send(Want::Tap {
            slot,
            gen,
            port: Box::new(port.clone()),
        });
    }

    /// Stops trying for a port that was deleted.
    pub(crate) fn forget(&self, slot: usize, gen: u64) {
        self.send(Want::Forget { slot, gen });
    }

    /// A tap opened again, if one is waiting (never blocks).
    pub(crate) fn take(&self) -> Option<Reattached> {
        self.back.try_recv().ok()
    }
}

impl Drop for Reattacher {
    fn drop(&mut self) {
        self.wants.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A down port's tap being tried for.
struct Waiting {
    port: Box<PortInfo>,
    due: Instant,
    backoff: Backoff,
}

/// The re-opener's loop: sleeps until a request or the next try, tries the ports
/// that are due. Returns once the worker's side is dropped.
fn reattach_loop(wants: &Receiver<Want>, back: &Sender<Reattached>, wake: &dyn Fn()) {
    let mut waiting: HashMap<(usize, u64), Waiting> = HashMap::new();
    loop {
        let first = match waiting.values().map(|w| w.due).min() {
            None => wants.recv().map_err(|_| RecvTimeoutError::Disconnected),
            Some(due) => wants.recv_timeout(due.saturating_duration_since(Instant::now())),
        };
        match first {
            Ok(w) => note(&mut waiting, w),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        let now = Instant::now();
        let due: Vec<(usize, u64)> = waiting
            .iter()
            .filter(|(_, w)| w.due <= now)
            .map(|(k, _)| *k)
            .collect();
        for key in due {
            if !try_reattach(key, &mut waiting, wants, back, wake) {
                return;
            }
        }
    }
}

/// Records one request.
fn note(waiting: &mut HashMap<(usize, u64), Waiting>, w: Want) {
    match w {
        Want::Tap { slot, gen, port } => {
            let mut backoff = Backoff::new(REATTACH_FIRST, REATTACH_MAX);
            let due = Instant::now() + backoff.next();
            waiting.insert((slot, gen), Waiting { port, due, backoff });
        }
        Want::Forget { slot, gen } => {
            waiting.remove(&(slot, gen));
        }
    }
}

/// Records every request waiting; false once the worker's side is gone.
fn note_all(waiting: &mut HashMap<(usize, u64), Waiting>, wants: &Receiver<Want>) -> bool {
    loop {
        match wants.try_recv() {
            Ok(w) => note(waiting, w),
            Err(TryRecvError::Empty) => return true,
            Err(TryRecvError::Disconnected) => return false,
        }
    }
}

/// One try at port `key`'s tap: handed back when opened (unless the port was
/// deleted meanwhile: then the new tap is destroyed), else tried again after the
/// port's next back-off. False once the worker's side is gone.
fn try_reattach(
    key: (usize, u64),
    waiting: &mut HashMap<(usize, u64), Waiting>,
    wants: &Receiver<Want>,
    back: &Sender<Reattached>,
    wake: &dyn Fn(),
) -> bool {
    let Some(w) = waiting.get_mut(&key) else {
        return true;
    };
    let tap = match open_port(&w.port) {
        Ok(tap) => tap,
        Err(e) => {
            w.due = Instant::now() + w.backoff.next();
            tracing::debug!(port = %w.port.config.name, error = %e, "tap not back yet");
            return true;
        }
    };
    if !note_all(waiting, wants) {
        // Shutting down: the tap (persistent) stays for the next start.
        return false;
    }
    if waiting.remove(&key).is_none() {
        if let Err(e) = tap.release() {
            tracing::warn!(error = %e, "tap of a deleted port not destroyed");
        }
        return true;
    }
    let (slot, gen) = key;
    let sent = back.send(Reattached { slot, gen, tap }).is_ok();
    wake();
    sent
}

fn engine_target(t: RouteTarget) -> engine::RouteTarget {
    match t {
        RouteTarget::Subnet => engine::RouteTarget::VpcSubnet,
        RouteTarget::Igw => engine::RouteTarget::InternetGateway,
        RouteTarget::Drop => engine::RouteTarget::Drop,
        RouteTarget::Ip(a) => engine::RouteTarget::Ip(a),
    }
}

fn api_target(t: engine::RouteTarget) -> RouteTarget {
    match t {
        engine::RouteTarget::VpcSubnet => RouteTarget::Subnet,
        engine::RouteTarget::InternetGateway => RouteTarget::Igw,
        engine::RouteTarget::Drop => RouteTarget::Drop,
        engine::RouteTarget::Ip(a) => RouteTarget::Ip(a),
    }
}

impl Datapath {
    /// Adds and deletes routes until the engine's table equals `want`. Used by
    /// `set_routes`, which undoes a partial change with a second call.
    fn sync_routes(&mut self, port: &str, want: &[RouteEntry]) -> Result<(), String> {
        let have = self.routes(port)?;
        for r in have.iter().filter(|r| !want.contains(r)) {
            self.engine
                .del_route_in(port, r.class, r.dest)
                .map_err(|e| e.to_string())?;
        }
        for r in want.iter().filter(|r| !have.contains(r)) {
            self.engine
                .add_route_in(port, r.class, r.dest, engine_target(r.target), r.mtu)
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Gives a new port its routing table (unless it keeps the engine's default
    /// routes) and its firewall rules.
    fn set_tables(&mut self, port: &str, tables: &PortTables) -> Result<(), String> {
        if let Some(routes) = &tables.routes {
            self.sync_routes(port, routes)?;
        }
        self.set_fw_rules(port, &tables.fw_rules)?;
        self.set_port_paused(port, tables.paused)
    }
}

impl Dataplane for Datapath {
    fn add_port(&mut self, p: &PortInfo, tables: &PortTables) -> Result<(), String> {
        let id = self
            .engine
            .add_port(p.config.clone())
            .map_err(|e| e.to_string())?;
        // The tables are in force before the tap exists: the port's first frame
        // already meets them.
        if let Err(e) = self.set_tables(&p.config.name, tables) {
            let _ = self.engine.remove_port(&p.config.name);
            return Err(e);
        }
        let Some(io) = &self.io else {
            return Ok(());
        };
        let tap = not_an_underlay_link(p, io)
            .and_then(|()| open_guest(p, io))
            .and_then(|t| io.watch_tap(&t, u64::from(id.0)).map(|()| t));
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
        self.next_gen += 1;
        self.taps[i] = Some(PortTap {
            info: p.clone(),
            gen: self.next_gen,
            link: TapLink::Up(tap),
        });
        Ok(())
    }

    fn remove_port(&mut self, name: &str) -> Result<(), String> {
        let id = self.engine.remove_port(name).map_err(|e| e.to_string())?;
        self.fw_rule_ids.remove(name);
        if let Some(io) = self.io.as_mut() {
            io.captures.forget(id);
        }
        let slot = id.0 as usize;
        let (Some(port), Some(io)) = (self.taps.get_mut(slot).and_then(Option::take), &self.io)
        else {
            return Ok(());
        };
        match port.link {
            TapLink::Up(tap) => {
                io.unwatch_tap(&tap);
                // A tap is destroyed; an attached interface stays its owner's; a
                // vhost-user port stops serving its socket.
                if let Err(e) = tap.release() {
                    tracing::warn!(port = name, error = %e, "tap not destroyed");
                }
            }
            TapLink::Down { .. } => io.reattach.forget(slot, port.gen),
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

    fn set_v2b(&mut self, table: &V2b) -> Result<(), String> {
        self.engine.set_v2b(table).map_err(|e| e.to_string())
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
                class: r.class,
            })
            .collect())
    }

    fn set_fw_rules(&mut self, port: &str, rules: &[FwRule]) -> Result<(), String> {
        let (mut compiled, mut origin) = (Vec::new(), Vec::new());
        for r in rules {
            let c = engine_fw_rules(r)?;
            origin.extend(std::iter::repeat_n(r.id, c.len()));
            compiled.extend(c);
        }
        let ids = self
            .engine
            .set_fw_rules(port, compiled)
            .map_err(|e| e.to_string())?;
        self.fw_rule_ids
            .insert(port.to_string(), ids.into_iter().zip(origin).collect());
        Ok(())
    }

    fn set_port_paused(&mut self, port: &str, paused: bool) -> Result<(), String> {
        self.engine
            .set_port_paused(port, paused)
            .map_err(|e| e.to_string())
    }

    fn port_state(&self, port: &str) -> Result<PortState, String> {
        self.engine.port_state(port).map_err(|e| e.to_string())
    }

    fn clear_uft(&mut self, port: &str) -> Result<(), String> {
        self.engine.clear_uft(port).map_err(|e| e.to_string())
    }

    fn set_external_ips(&mut self, port: &str, ext: &ExternalIps) -> Result<(), String> {
        self.engine
            .set_external_ips(port, ext.clone())
            .map_err(|e| e.to_string())
    }

    fn set_port_limits(&mut self, port: &str, limits: &PortLimits) -> Result<(), String> {
        self.engine
            .set_port_limits(port, *limits)
            .map_err(|e| e.to_string())
    }

    fn set_port_cidrs(&mut self, port: &str, cidrs: &PortCidrs) -> Result<(), String> {
        self.engine
            .set_port_cidrs(port, cidrs.clone())
            .map_err(|e| e.to_string())
    }

    fn inspect(&mut self, what: &Inspect) -> Result<serde_json::Value, String> {
        let json = |v: Result<serde_json::Value, serde_json::Error>| {
            v.map_err(|e| format!("cannot encode result: {e}"))
        };
        let e = |e: engine::EngineError| e.to_string();
        match what {
            Inspect::Layer { port, layer } => {
                let mut v = json(serde_json::to_value(
                    self.engine.dump_layer(port, layer).map_err(e)?,
                ))?;
                if let Some(ids) = self.fw_rule_ids.get(port).filter(|_| layer == "firewall") {
                    label_fw_rules(&mut v, ids);
                }
                Ok(v)
            }
            Inspect::Layers { port } => json(serde_json::to_value(
                self.engine.list_layers(port).map_err(e)?,
            )),
            Inspect::TcpFlows { port } => json(serde_json::to_value(
                self.engine.dump_tcp_flows(port).map_err(e)?,
            )),
            Inspect::Uft {
                port,
                cursor,
                limit,
            } => {
                // Without a limit, the engine's largest page.
                let limit = limit.unwrap_or(usize::MAX);
                let page = self.engine.dump_uft(port, cursor.unwrap_or(0), limit);
                json(serde_json::to_value(page.map_err(e)?))
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
            Inspect::Stats { port: None } => json(serde_json::to_value(self.report())),
            // A daemon without workers (headless): this datapath is the one worker.
            Inspect::V2b => json(serde_json::to_value(self.engine.dump_v2b())),
            Inspect::Workers => {
                let ports = self.engine.stats().ports.into_iter().map(|p| p.name);
                let view = WorkerView::new(0, ports.collect(), self.info(), &self.stats);
                json(serde_json::to_value([view]))
            }
        }
    }
}

impl WorkerPlane for Datapath {
    fn report(&mut self) -> WorkerReport {
        let xsk = self.io.as_ref().map(|io| io.queues.stats());
        let next_hops = self.io.as_ref().map(|io| io.next_hops.stats());
        WorkerReport::new(self.engine.stats(), self.stats.clone(), xsk, next_hops)
    }

    fn info(&self) -> WorkerInfo {
        let queues = self.io.as_ref().map_or_else(Vec::new, |io| {
            let socks = io.queues.sockets.iter();
            socks
                .map(|s| QueueRef {
                    ifindex: s.ifindex(),
                    queue: s.queue(),
                })
                .collect()
        });
        WorkerInfo {
            core: self.core,
            queues,
            started_unix_ms: unix_ms(self.started),
        }
    }

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

/// Adds to each engine rule of a firewall dump the id of the rule it was compiled
/// from (`fw_rule`), which `rm-fw-rule --dir DIR ID` takes.
fn label_fw_rules(dump: &mut serde_json::Value, ids: &HashMap<u64, u64>) {
    for side in ["inbound", "outbound"] {
        let Some(rules) = dump[side]["rules"].as_array_mut() else {
            continue;
        };
        for r in rules {
            let origin = r["id"].as_u64().and_then(|id| ids.get(&id));
            if let (Some(&o), Some(m)) = (origin, r.as_object_mut()) {
                m.insert("fw_rule".into(), o.into());
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
    // The remote end: the source of inbound traffic, the destination of outbound.
    let remote = |n: IpNet| match dir {
        engine::Direction::In => Predicate::SrcIp(n),
        engine::Direction::Out => Predicate::DstIp(n),
    };
    let host = match r.filters.host {
        FwHost::Any => None,
        FwHost::Ip(ip) => Some(remote(IpNet::from(ip))),
        FwHost::Subnet(n) => Some(remote(n)),
        FwHost::Vni(v) => Some(Predicate::Vni(v.get())),
    };
    let proto = r.filters.proto.number();
    let base = || {
        let mut rule = Rule::new(r.priority, action);
        if let Some(h) = host {
            rule = rule.matching(h);
        }
        if let Some(p) = proto {
            rule = rule.matching(Predicate::Proto(p));
        }
        if let Some(i) = r.filters.icmp {
            rule = rule.matching(Predicate::IcmpType(i.icmp_type));
            if let Some(c) = i.code {
                rule = rule.matching(Predicate::IcmpCode(c));
            }
        }
        rule
    };
    let unfinished = if r.filters.ports.is_empty() {
        vec![base()]
    } else {
        r.filters
            .ports
            .iter()
            .map(|p| {
                let (start, end) = p.bounds();
                base().matching(Predicate::DstPort(PortRange { start, end }))
            })
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::api::{FwFilters, FwPorts, FwProto, Request};
    use crate::controller::Controller;

    /// A tap left for a bridge gets a MAC that is locally administered, unicast,
    /// not the guest's, and the same for the same guest (a restart re-creates it
    /// alike).
    #[test]
    fn bridge_port_mac_is_local_unicast_and_not_the_guests() {
        let guest = MacAddr([0xa8, 0x40, 0x25, 0xf0, 0x00, 0x01]);
        let m = bridge_port_mac(guest);
        assert_eq!(m, MacAddr([0xfe, 0x40, 0x25, 0xf0, 0x00, 0x01]));
        assert_ne!(m, guest);
        assert!(m.is_unicast());
        assert_eq!(m.0[0] & 0x02, 0x02, "locally administered");
    }

    /// `dump-layer PORT firewall` labels each engine rule with the id of the rule it
    /// came from (several ports: several engine rules, one id), and `rm-fw-rule`
    /// by that id removes that rule, checking its direction.
    #[test]
    fn firewall_dump_shows_the_ids_rm_fw_rule_takes() {
        let engine = Engine::new(EngineConfig::new("fd00::1".parse().unwrap())).unwrap();
        let mut c = Controller::new(Datapath::without_io(engine), None);
        let call = |c: &mut Controller<Datapath>, r: Request| match c.handle(r) {
            Outcome::Ok(Reply::Inspect(v)) => v,
            Outcome::Ok(_) => serde_json::Value::Null,
            Outcome::Error(e) => panic!("{e}"),
        };
        let port = || "opte0".to_string();
        call(
            &mut c,
            Request::CreatePort(Box::new(crate::api::CreatePort {
                config: crate::api::tests::sample_port("opte0", 5),
                netns: None,
                vhost_user: None,
                attach: None,
            })),
        );
        let rule = FwRule {
            id: 0,
            direction: Direction::In,
            priority: 10,
            action: FwAction::Allow,
            filters: FwFilters {
                host: FwHost::Any,
                proto: FwProto::Tcp,
                ports: vec![
                    FwPorts::One(22),
                    FwPorts::Range {
                        start: 8000,
                        end: 8080,
                    },
                ],
                icmp: None,
            },
        };
        call(&mut c, Request::AddFwRule { port: port(), rule });
        let dump = |c: &mut Controller<Datapath>| {
            let v = call(
                c,
                Request::DumpLayer {
                    port: port(),
                    layer: "firewall".into(),
                },
            );
            v["inbound"]["rules"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| {
                    (
                        r["fw_rule"].as_u64().unwrap(),
                        r["priority"].as_u64().unwrap(),
                    )
                })
                .collect::<Vec<_>>()
        };
        // The two default VPC rules (ids 1, 2), then the new one, one engine rule
        // per port.
        assert_eq!(dump(&mut c), [(3, 10), (3, 10), (1, 65534), (2, 65534)]);
        let rm = |c: &mut Controller<Datapath>, direction, id| {
            c.handle(Request::RmFwRuleId {
                port: port(),
                direction,
                id,
            })
        };
        let Outcome::Error(e) = rm(&mut c, Some(Direction::Out), 3) else {
            panic!("removed through the wrong direction")
        };
        assert!(e.contains("not a out rule") && e.contains("prio=10"), "{e}");
        let Outcome::Error(e) = rm(&mut c, Some(Direction::In), 4) else {
            panic!("removed a rule that is not there")
        };
        assert!(
            e.contains("no firewall rule 4") && e.contains("1, 2, 3"),
            "{e}"
        );
        assert_eq!(rm(&mut c, Some(Direction::In), 1), Outcome::Ok(Reply::Done));
        // Ids are stable: the others keep theirs.
        assert_eq!(dump(&mut c), [(3, 10), (3, 10), (2, 65534)]);
        // A VPC, ICMP type and code rule compiles to the engine's predicates; it
        // gets the next id (never one removed), and goes by id alone.
        let ptb = FwRule {
            id: 77,
            direction: Direction::In,
            priority: 5,
            action: FwAction::Allow,
            filters: FwFilters {
                host: FwHost::Vni(engine::Vni::new(1701).unwrap()),
                proto: FwProto::Icmp6,
                ports: vec![],
                icmp: Some(crate::api::IcmpMatch {
                    icmp_type: 2,
                    code: Some(0),
                }),
            },
        };
        call(
            &mut c,
            Request::AddFwRule {
                port: port(),
                rule: ptb,
            },
        );
        let v = call(
            &mut c,
            Request::DumpLayer {
                port: port(),
                layer: "firewall".into(),
            },
        );
        let first = &v["inbound"]["rules"][0];
        assert_eq!(first["fw_rule"], 4);
        assert_eq!(
            first["predicates"],
            serde_json::json!([{"vni": 1701}, {"proto": 58}, {"icmp_type": 2}, {"icmp_code": 0}])
        );
        assert_eq!(
            v["inbound"]["rules"][2]["predicates"][1]["dst_port"]["end"],
            8080
        );
        let Outcome::Ok(Reply::FwRules(listed)) = c.handle(Request::ListFwRules { port: port() })
        else {
            panic!("no rule list")
        };
        let ids: Vec<u64> = listed.iter().map(|r| r.id).collect();
        assert_eq!(ids, [2, 3, 4]);
        assert_eq!(
            listed[2].to_string(),
            "id=4 in prio=5 allow host=vni=1701 proto=icmp6:2/0"
        );
        assert_eq!(rm(&mut c, None, 4), Outcome::Ok(Reply::Done));
        assert_eq!(dump(&mut c), [(3, 10), (3, 10), (2, 65534)]);
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
            underlay_gso: crate::config::UnderlayGso::Auto,
            poll: crate::config::PollMode::Adaptive,
            log_level: "info".into(),
            tables: engine::TableBudget {
                bytes: 64 << 20,
                ports: 4,
            },
            log_format: crate::config::LogFormat::Text,
            path_check_interval: None,
            metrics_listen: None,
        };
        let fixed = EngineConfig::new(cfg.underlay_addr).hash_seed;
        let a = engine_config(&cfg, 9000).unwrap();
        let b = engine_config(&cfg, 9000).unwrap();
        assert_ne!(a.hash_seed, fixed);
        assert_ne!(a.hash_seed, b.hash_seed);
        assert_eq!(a.underlay_mtu, 9000);
        assert_eq!(a.tables, cfg.tables);
    }

    /// `ip ARGS...`, which must succeed.
    pub(crate) fn ip(args: &[&str]) {
        let ok = std::process::Command::new("ip")
            .args(args)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "ip {args:?} failed (this test needs root)");
    }

    /// A network namespace deleted on drop.
    pub(crate) struct Netns(pub(crate) String);

    impl Netns {
        /// `ctl-TAG-PID`, created.
        pub(crate) fn new(tag: &str) -> Netns {
            let name = format!("ctl-{tag}-{}", std::process::id());
            ip(&["netns", "add", &name]);
            Netns(name)
        }
    }

    impl Drop for Netns {
        fn drop(&mut self) {
            let _ = std::process::Command::new("ip")
                .args(["netns", "del", &self.0])
                .status();
        }
    }

    /// A down port's tap is not made while its guest's namespace is missing, and
    /// comes back (made in the namespace) once it exists; a port deleted while it
    /// waited gets no tap.
    #[test]
    fn reattacher_waits_for_the_namespace_and_skips_deleted_ports() {
        let ns = format!("ctl-reattach-{}", std::process::id());
        // Created below, once the ports wait for it.
        let port = |name: &str, last: u8| PortInfo {
            config: crate::api::tests::sample_port(name, last),
            netns: Some(ns.clone()),
            vhost_user: None,
            attach: None,
        };
        let r = Reattacher::start(0, || {}).unwrap();
        r.want(3, 1, &port("rat0", 1));
        r.want(4, 2, &port("rat1", 2));
        r.forget(4, 2);
        std::thread::sleep(REATTACH_FIRST * 3);
        assert!(r.take().is_none(), "no namespace, no tap");
        ip(&["netns", "add", &ns]);
        let _guard = Netns(ns.clone());
        let deadline = Instant::now() + Duration::from_secs(10);
        let back = loop {
            if let Some(b) = r.take() {
                break b;
            }
            assert!(Instant::now() < deadline, "the tap did not come back");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!((back.slot, back.gen, back.tap.name()), (3, 1, "rat0"));
        ip(&["-n", &ns, "link", "show", "rat0"]);
        let forgotten = std::process::Command::new("ip")
            .args(["-n", &ns, "link", "show", "rat1"])
            .output()
            .unwrap();
        assert!(!forgotten.status.success(), "a deleted port's tap was made");
        assert!(r.take().is_none());
        back.tap.release().unwrap();
    }
}
