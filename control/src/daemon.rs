//! `overlayd`'s life: start (state, underlay, engine, API), run the worker, stop
//! cleanly on SIGTERM/SIGINT (the XDP program is detached when the underlay is
//! dropped; taps are persistent and stay for the next start to reattach).

use crate::config::DaemonConfig;
use crate::controller::Controller;
use crate::datapath::{engine_config, pin_to_core, run_worker, Datapath};
use crate::server::{request_channel, serve_pending, ApiServer};
use crate::state::StateStore;
use crate::underlay::{warn_if_address_missing, Underlay};
use engine::{Engine, EngineConfig};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

/// Runs the daemon with full I/O until SIGTERM or SIGINT.
pub fn run(cfg: &DaemonConfig) -> Result<(), String> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone())
            .map_err(|e| format!("cannot install handler for signal {sig}: {e}"))?;
    }
    let store = StateStore::open(&cfg.state_dir)?;
    let saved = store.load()?;
    warn_if_address_missing(cfg.underlay_addr);
    let underlay = Underlay::open(cfg)?;
    let ecfg = engine_config(cfg, underlay.mtu())?;
    tracing::info!(underlay_mtu = ecfg.underlay_mtu, addr = %cfg.underlay_addr, "engine configured");
    let engine = Engine::new(ecfg).map_err(|e| e.to_string())?;
    let mut ctl = Controller::new(Datapath::with_io(engine, underlay), Some(store));
    let refused = ctl.restore(saved);
    tracing::info!(
        ports = ctl.state().ports.len(),
        v2p = ctl.state().v2p.len(),
        refused = refused.len(),
        "state restored"
    );
    let (tx, rx) = request_channel();
    let server = ApiServer::start(&cfg.api_socket, tx)?;
    tracing::info!(socket = %server.path().display(), "API listening");
    if let Some(&core) = cfg.cores.first() {
        pin_to_core(core)?;
        if cfg.cores.len() > 1 {
            tracing::warn!(
                cores = ?cfg.cores,
                "one worker in this version: pinned to core {core}, other cores unused"
            );
        }
    }
    run_worker(&mut ctl, &rx, &stop);
    tracing::info!("shutting down");
    drop(server);
    // Dropping the controller drops the datapath: sockets closed, XDP detached.
    drop(ctl);
    Ok(())
}

/// A daemon without I/O: the API and the engine only. For tests and for trying the
/// control plane on a machine without AF_XDP.
pub struct Headless {
    stop: Arc<AtomicBool>,
    worker: Option<thread::JoinHandle<Controller<Datapath>>>,
    server: Option<ApiServer>,
}

impl Headless {
    pub fn start(
        engine_cfg: EngineConfig,
        socket: &Path,
        state_dir: Option<&Path>,
    ) -> Result<Headless, String> {
        let engine = Engine::new(engine_cfg).map_err(|e| e.to_string())?;
        let store = state_dir.map(StateStore::open).transpose()?;
        let saved = match &store {
            Some(s) => s.load()?,
            None => Default::default(),
        };
        let mut ctl = Controller::new(Datapath::without_io(engine), store);
        for e in ctl.restore(saved) {
            tracing::error!(error = %e, "not restored");
        }
        let (tx, rx) = request_channel();
        let server = ApiServer::start(socket, tx)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let worker = thread::Builder::new()
            .name("headless".into())
            .spawn(move || {
                while !stop2.load(Ordering::Relaxed) {
                    if serve_pending(&rx, |r| ctl.handle(r)) == 0 {
                        thread::sleep(Duration::from_millis(2));
                    }
                }
                ctl
            })
            .map_err(|e| format!("cannot start worker: {e}"))?;
        Ok(Headless {
            stop,
            worker: Some(worker),
            server: Some(server),
        })
    }

    /// Stops serving and hands back the controller (to inspect its state).
    pub fn stop(mut self) -> Option<Controller<Datapath>> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Option<Controller<Datapath>> {
        self.server.take();
        self.stop.store(true, Ordering::Relaxed);
        self.worker.take().and_then(|w| w.join().ok())
    }
}

impl Drop for Headless {
    fn drop(&mut self) {
        self.shutdown();
    }
}
