//! `overlayd`'s life: start (state, underlay, one engine per worker, API), run the
//! workers, stop cleanly on SIGTERM/SIGINT (the XDP program is detached when the
//! underlay is dropped; taps are persistent and stay for the next start to
//! reattach).
//!
//! Threads: one poll-mode worker per configured core (one unpinned worker when no
//! cores are given), each with its own engine (see [`crate::worker`]); the main
//! thread owns the controller and serves the API, fanning requests out to the
//! workers ([`crate::workers`]).

pub mod headless;
pub mod watch;

use crate::config::{DaemonConfig, FleetConfig};
use crate::controller::fleet::FleetLayer;
use crate::controller::state::{StateError, StateStore};
use crate::controller::Controller;
use crate::fleet::channel::SharedView;
use crate::fleet::watcher::{self, WatcherStart};
use crate::ops::capture;
use crate::ops::doctor;
use crate::ops::metrics::{MetricsError, MetricsServer};
use crate::ops::notify::Notifier;
use crate::server::{serve_next, work_channel, Answer, ApiLimits, ApiServer, ServerError, WorkTx};
use crate::underlay::neighbours::{NeighbourError, NextHops};
use crate::underlay::pathcheck::{self, PathCheckError, PathMonitor};
use crate::underlay::paths_down::PathsDown;
use crate::underlay::pathwatch::{PathWatch, PathWatchError};
use crate::underlay::{warn_if_address_missing, Underlay, UnderlayError, FRAME_OVERHEAD};
use crate::util::Doorbell;
use crate::worker::handoff::mesh;
use crate::worker::io::{WorkerIo, WorkerIoError};
use crate::worker::jobs::JobTx;
use crate::worker::{run_worker, Datapath};
use crate::workers::Workers;
use api::{ErrorCode, Outcome, PeerPath, Refusal, Reply, Request, SledExpect, SledFacts};
use dpio::cpu::pin_to_core;
use engine::{Engine, EngineConfig, EngineError};
use fleet::{StoreConfig, TlsFiles};
use std::io;
use std::net::Ipv6Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};
use watch::UnderlayWatch;

/// Why the daemon did not start, or stopped before it was asked to: the error of
/// the piece that failed, or the worker that did.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("cannot install handler for signal {signal}: {error}")]
    Signal { signal: i32, error: io::Error },
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    #[error(transparent)]
    Server(#[from] ServerError),
    #[error(transparent)]
    Underlay(#[from] UnderlayError),
    #[error("underlay MTU {0} is above 65535")]
    UnderlayMtu(u32),
    #[error("cannot draw the flow hash seed: {0}")]
    Seed(getrandom::Error),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("cannot create a worker eventfd: {0}")]
    Doorbell(io::Error),
    #[error(transparent)]
    NextHops(#[from] NeighbourError),
    #[error(transparent)]
    WorkerIo(#[from] WorkerIoError),
    #[error("cannot start worker {worker}: {error}")]
    WorkerThread { worker: usize, error: io::Error },
    /// The worker could not be pinned to its core (dpio's error names it).
    #[error("worker {worker}: {error}")]
    Pin {
        worker: usize,
        error: dpio::cpu::PinError,
    },
    #[error("worker {0} ended while starting")]
    WorkerEnded(usize),
    /// The thread of a daemon without I/O ([`headless`]) did not start.
    #[error("cannot start worker: {0}")]
    HeadlessThread(io::Error),
    #[error(transparent)]
    PathCheck(#[from] PathCheckError),
    #[error(transparent)]
    PathWatch(#[from] PathWatchError),
    #[error("a worker stopped unexpectedly; shutting down")]
    WorkerStopped,
    /// The fleet's TLS files (the store client's error names the file).
    #[error("fleet: {0}")]
    Fleet(#[from] fleet::StoreError),
    #[error("cannot start the fleet watcher: {0}")]
    FleetThread(io::Error),
}

/// How long the fleet watcher waits for a member to connect or to answer.
const FLEET_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the main thread waits for an API request before checking for a
/// signal, a dead worker, underlay link notifications and retries that are due.
/// None of them needs less; each wake-up of an idle daemon costs CPU (in a VM,
/// 100-300 us of a core), and this thread's were most of an idle daemon's.
const MAIN_POLL: Duration = Duration::from_millis(250);

/// The running workers; stopped and joined when dropped.
struct WorkerPool {
    stop: Arc<AtomicBool>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl WorkerPool {
    fn any_stopped(&self) -> bool {
        self.threads
            .iter()
            .any(std::thread::JoinHandle::is_finished)
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            if t.join().is_err() {
                tracing::error!("a worker panicked");
            }
        }
    }
}

/// Starts worker `index` on its own thread, pinned to `core` if given; returns
/// once it is pinned (or why it could not be).
fn spawn_worker(
    index: usize,
    core: Option<usize>,
    dp: Datapath,
    stop: Arc<AtomicBool>,
) -> Result<(thread::JoinHandle<()>, JobTx<Datapath>), DaemonError> {
    let (jobs_tx, jobs_rx) = mpsc::channel();
    let (ready_tx, ready_rx) = mpsc::channel();
    let t = thread::Builder::new()
        .name(format!("worker{index}"))
        .spawn(move || {
            let mut dp = dp;
            if let Some(c) = core {
                if let Err(e) = pin_to_core(c) {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            }
            let _ = ready_tx.send(Ok(()));
            run_worker(&mut dp, &jobs_rx, &stop);
        })
        .map_err(|error| DaemonError::WorkerThread {
            worker: index,
            error,
        })?;
    match ready_rx.recv() {
        Ok(Ok(())) => Ok((t, jobs_tx)),
        Ok(Err(error)) => Err(DaemonError::Pin {
            worker: index,
            error,
        }),
        Err(_) => Err(DaemonError::WorkerEnded(index)),
    }
}

/// Runs the daemon with full I/O until SIGTERM or SIGINT.
pub fn run(cfg: &DaemonConfig) -> Result<(), DaemonError> {
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, stop.clone())
            .map_err(|error| DaemonError::Signal { signal, error })?;
    }
    let store = StateStore::open(&cfg.state_dir)?;
    let saved = store.load()?;
    let fleet_layer = cfg.fleet.as_ref().map(|_| store.load_fleet()).transpose()?;
    let fleet_store = cfg.fleet.as_ref().map(store_config).transpose()?;
    // Before the underlay is touched, so that a bad socket path stops the daemon
    // early; requests wait in the channel until the state is restored.
    let (tx, rx) = work_channel();
    let metrics = cfg
        .metrics_listen
        .map(|addr| MetricsServer::start(addr, tx.clone()))
        .transpose()?;
    let server = ApiServer::start(&cfg.api_socket, tx.clone(), ApiLimits::default())?;
    warn_if_address_missing(cfg.underlay_addr);
    let n = cfg.cores.len().max(1);
    let mut underlay = Underlay::open(cfg, n)?;
    let mut ecfg = engine_config(cfg, underlay.mtu())?;
    ecfg.underlay_tunnel_gso = underlay.tunnel_gso();
    tracing::info!(underlay_mtu = ecfg.underlay_mtu, addr = %cfg.underlay_addr, workers = n, poll = %cfg.poll, tunnel_gso = ecfg.underlay_tunnel_gso, "engine configured");
    let doorbells = (0..n)
        .map(|_| Doorbell::new().map(Arc::new))
        .collect::<Result<Vec<_>, _>>()
        .map_err(DaemonError::Doorbell)?;
    // Handed-over frames: underlay frames, or guest frames of up to a 64 KiB buffer.
    let largest = underlay.links.iter().map(|l| l.mtu).max().unwrap_or(0) as usize;
    let meshes = mesh(
        &doorbells,
        largest + FRAME_OVERHEAD,
        dpio::tap::MAX_TAP_FRAME,
    );
    let mut pool = WorkerPool {
        stop: Arc::new(AtomicBool::new(false)),
        threads: Vec::new(),
    };
    let mut jobs = Vec::new();
    let paths_down = Arc::new(PathsDown::default());
    let parts = underlay.take_queues(n).into_iter().zip(meshes);
    for (index, (queues, mesh)) in parts.enumerate() {
        let engine = Engine::new(ecfg.clone())?;
        let io = WorkerIo::new(
            index,
            queues,
            NextHops::start(Some(doorbells[index].clone()), paths_down.clone())?,
            mesh,
            doorbells[index].clone(),
            cfg.poll,
        )?;
        let core = cfg.cores.get(index).copied();
        let dp = Datapath::with_io(engine, io).on_core(core);
        let (t, tx) = spawn_worker(index, core, dp, pool.stop.clone())?;
        tracing::info!(worker = index, core = ?core, "worker started");
        pool.threads.push(t);
        jobs.push(tx);
    }
    let mut watch = UnderlayWatch::start(cfg, n, underlay, u32::from(ecfg.underlay_mtu))?;
    let mut path_watch = cfg
        .path_probe_interval
        .map(|every| PathWatch::start(cfg.underlay_addr, every, paths_down))
        .transpose()?;
    let link_stats = watch.stats(path_watch.as_ref().map(PathWatch::links));
    let workers = Workers::new(jobs, Some(Box::new(link_stats))).with_doorbells(doorbells);
    let mut ctl = Controller::new(workers, Some(store));
    ctl.set_api_counters(server.counters());
    let fleet_thread = match (&cfg.fleet, fleet_layer, fleet_store) {
        (Some(f), Some(layer), Some(store)) => Some(join_fleet(&mut ctl, f, layer, store, tx)?),
        _ => {
            drop(tx);
            None
        }
    };
    ctl.restore(saved, Instant::now());
    let mut monitor = cfg
        .path_check_interval
        .map(|every| PathMonitor::start(cfg.underlay_addr, every))
        .transpose()?;
    tracing::info!(socket = %server.path().display(), "API listening");
    // Socket bound, state restored, workers running: systemd may start what
    // depends on us.
    let mut notifier = Notifier::from_env().unwrap_or_else(|e| {
        tracing::error!("systemd notification: {e}");
        None
    });
    if let Some(n) = &notifier {
        n.send("READY=1");
    }
    let mut result = Ok(());
    while !stop.load(Ordering::Relaxed) {
        if pool.any_stopped() {
            result = Err(DaemonError::WorkerStopped);
            break;
        }
        let served = serve_next(
            &rx,
            MAIN_POLL,
            &mut ctl,
            |ctl, r| match r {
                Request::Doctor => {
                    // The facts on this thread (they come from the controller), the
                    // path probes (seconds for a black-holed peer) on another.
                    let facts = doctor::gather(cfg, ctl);
                    let peers = pathcheck::v2p_peers(&ctl.state().v2p, cfg.underlay_addr);
                    let probe = prober(cfg, watch.mtu());
                    Answer::Later(Box::new(move || {
                        let mut checks = doctor::checks(&facts);
                        checks.push(doctor::underlay_paths(&probe(&peers)));
                        Outcome::Ok(Reply::Doctor(checks))
                    }))
                }
                Request::PathCheck { peer } => path_check(cfg, ctl, watch.mtu(), peer),
                Request::CheckSled(expect) => check_sled(cfg, &expect),
                Request::Capture(spec) => capture::start(ctl.dataplane(), spec),
                r => {
                    let listed = ctl.handle(r);
                    let out = ctl.dataplane().with_port_links(listed);
                    with_path_stats(out, monitor.as_ref()).into()
                }
            },
            super::controller::Controller::apply_fleet,
        );
        if !served {
            break;
        }
        let now = Instant::now();
        ctl.retry_due(now);
        ctl.save_fleet_due(now);
        watch.poll(ctl.dataplane());
        if let Some(w) = &mut path_watch {
            let v2p = &ctl.state().v2p;
            w.poll(now, || pathcheck::v2p_peers(v2p, cfg.underlay_addr));
        }
        if let Some(m) = &mut monitor {
            let v2p = &ctl.state().v2p;
            m.poll(
                now,
                || pathcheck::v2p_peers(v2p, cfg.underlay_addr),
                pathcheck::wanted_size(watch.mtu()),
            );
        }
        if let Some(n) = &mut notifier {
            n.watchdog(now);
        }
    }
    tracing::info!("shutting down");
    if let Some(n) = &notifier {
        n.send("STOPPING=1");
    }
    drop(metrics);
    drop(server);
    ctl.flush_fleet();
    // Workers first (their sockets close), then the controller (whose link
    // statistics closure) and the underlay watch, which hold the underlay: XDP
    // detached, UMEM unmapped. The controller's going ends the fleet's watcher
    // (it revokes the status key), and the work channel's a watcher waiting to
    // hand over a batch.
    drop(pool);
    drop(ctl);
    drop(rx);
    drop(watch);
    if let Some(t) = fleet_thread {
        if t.join().is_err() {
            tracing::error!("the fleet watcher panicked");
        }
    }
    result
}

/// The fleet's store as the watcher reaches it. The TLS files are read once here,
/// so that a missing file or a key others may read stops the daemon at start
/// rather than at its first connection. A certificate that is not valid now does
/// not: the sled forwards on its saved tables meanwhile, the watcher says why it
/// cannot connect, and a renewed certificate is read at its next attempt.
fn store_config(f: &FleetConfig) -> Result<StoreConfig, DaemonError> {
    let tls = f.tls.as_ref().map(|t| TlsFiles {
        cert: t.cert.clone(),
        key: t.key.clone(),
        ca: t.ca.clone(),
    });
    match tls.as_ref().map(TlsFiles::load) {
        Some(Err(e @ fleet::StoreError::CertificateNotValid { .. })) => {
            tracing::error!(error = %e, "the fleet's store will refuse this sled until its certificate is renewed");
        }
        Some(Err(e)) => return Err(e.into()),
        Some(Ok(_)) | None => {}
    }
    Ok(StoreConfig {
        endpoints: f.endpoints.clone(),
        tls,
        timeout: FLEET_TIMEOUT,
    })
}

/// Makes the controller a member of the fleet `f` with its saved layer, and
/// starts the watcher that feeds it over `work`.
fn join_fleet(
    ctl: &mut Controller<Workers<Datapath>>,
    f: &FleetConfig,
    layer: FleetLayer,
    store: StoreConfig,
    work: WorkTx,
) -> Result<thread::JoinHandle<()>, DaemonError> {
    let view = SharedView::default();
    let (positions, cluster_id) = layer.position();
    let start = WatcherStart {
        store,
        sled: f.sled.clone(),
        positions,
        cluster_id,
    };
    let (commands, thread) =
        watcher::spawn(start, work, view.clone()).map_err(DaemonError::FleetThread)?;
    tracing::info!(sled = %f.sled, endpoints = ?f.endpoints, revision = layer.revision(), "fleet member");
    ctl.join_fleet(f.sled.clone(), layer, commands, view);
    Ok(thread)
}

/// Probes of the underlay paths from this sled for `underlay_mtu`-byte packets,
/// to run off the main thread.
fn prober(cfg: &DaemonConfig, underlay_mtu: u32) -> impl Fn(&[Ipv6Addr]) -> Vec<PeerPath> {
    let (src, wanted) = (cfg.underlay_addr, pathcheck::wanted_size(underlay_mtu));
    move |peers| pathcheck::check(src, peers, wanted)
}

/// `path-check`: probes `peer`, or every sled V2P names. The probes take seconds
/// for a black-holed peer: they run on a thread of their own, and the main loop
/// goes on.
fn path_check(
    cfg: &DaemonConfig,
    ctl: &Controller<Workers<Datapath>>,
    underlay_mtu: u32,
    peer: Option<Ipv6Addr>,
) -> Answer {
    let peers = match peer {
        Some(p) => vec![p],
        None => pathcheck::v2p_peers(&ctl.state().v2p, cfg.underlay_addr),
    };
    if peers.is_empty() {
        return Outcome::Error(PathCheckError::NoPeer.into()).into();
    }
    let probe = prober(cfg, underlay_mtu);
    Answer::Later(Box::new(move || {
        Outcome::Ok(Reply::PathCheck(probe(&peers)))
    }))
}

/// `check-sled`: the sled as configured against what a port's creator expects of
/// it (opteadm's `create-xde --src-underlay-addr`, `--bsvc-addr`, `--bsvc-vni`,
/// and `set-xde-underlay`).
fn check_sled(cfg: &DaemonConfig, expect: &SledExpect) -> Answer {
    let sled = SledFacts {
        underlay_addr: cfg.underlay_addr,
        boundary_services: cfg.boundary_services,
        boundary_vni: cfg.boundary_vni,
        underlay_links: cfg.underlay.clone(),
    };
    match expect.check(&sled) {
        Ok(()) => Outcome::Ok(Reply::Done),
        Err(e) => Outcome::Error(Refusal::new(ErrorCode::Invalid, e.to_string())),
    }
    .into()
}

/// A `stats` answer with what the periodic path checks found
/// (`control.path_check`); any other answer as it is.
fn with_path_stats(out: Outcome, monitor: Option<&PathMonitor>) -> Outcome {
    let Some(m) = monitor else {
        return out;
    };
    let Outcome::Ok(Reply::Inspect(mut v)) = out else {
        return out;
    };
    if let Some(control) = v.get_mut("control").and_then(|c| c.as_object_mut()) {
        control.insert("path_check".into(), m.stats());
    }
    Outcome::Ok(Reply::Inspect(v))
}

/// The engine's configuration from the daemon's and the underlay link's MTU, with a
/// flow-table hash seed drawn for this process.
pub fn engine_config(cfg: &DaemonConfig, underlay_mtu: u32) -> Result<EngineConfig, DaemonError> {
    let mut e = EngineConfig::new(cfg.underlay_addr);
    e.underlay_mtu =
        u16::try_from(underlay_mtu).map_err(|_| DaemonError::UnderlayMtu(underlay_mtu))?;
    e.external_jumbo = cfg.external_jumbo;
    e.boundary_services = cfg.boundary_services;
    e.boundary_vni = cfg.boundary_vni;
    e.outer_dscp = cfg.outer_dscp.0;
    // One engine per worker (one worker per configured core, or one): together
    // they keep to the sled's table budget.
    e.tables = cfg.tables.split(cfg.cores.len().max(1));
    e.hash_seed = random_seed()?;
    Ok(e)
}

/// 64 bits from the kernel's CSPRNG (getrandom(2)). Remote peers choose inbound
/// flow keys, so the flow and connection tables' hash must be keyed with a value
/// they cannot know or predict; the engine makes no syscalls and takes it from us.
fn random_seed() -> Result<u64, DaemonError> {
    getrandom::u64().map_err(DaemonError::Seed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine::Vni;
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
            outer_dscp: Default::default(),
            poll: crate::config::PollMode::Adaptive,
            log_level: "info".into(),
            tables: engine::TableBudget {
                bytes: 64 << 20,
                ports: 4,
            },
            log_format: crate::config::LogFormat::Text,
            path_check_interval: None,
            path_probe_interval: None,
            metrics_listen: None,
            fleet: None,
        };
        let fixed = EngineConfig::new(cfg.underlay_addr).hash_seed;
        let a = engine_config(&cfg, 9000).unwrap();
        let b = engine_config(&cfg, 9000).unwrap();
        assert_ne!(a.hash_seed, fixed);
        assert_ne!(a.hash_seed, b.hash_seed);
        assert_eq!(a.underlay_mtu, 9000);
        assert_eq!(a.tables, cfg.tables);
    }
}
