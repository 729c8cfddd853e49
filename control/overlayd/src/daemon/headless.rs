//! The daemon's own pieces without I/O, serving the API on a socket: what the
//! tests of the API, the admin tool and the restore path run against.

use super::DaemonError;
use crate::controller::state::StateStore;
use crate::controller::Controller;
use crate::server::{serve_pending, work_channel, ApiLimits, ApiServer};
use crate::worker::Datapath;
use engine::{Engine, EngineConfig};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

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
    ) -> Result<Headless, DaemonError> {
        let engine = Engine::new(engine_cfg)?;
        let store = state_dir.map(StateStore::open).transpose()?;
        let saved = match &store {
            Some(s) => s.load()?,
            None => Default::default(),
        };
        let mut ctl = Controller::new(Datapath::without_io(engine), store);
        let (tx, rx) = work_channel();
        let server = ApiServer::start(socket, tx, ApiLimits::default())?;
        ctl.set_api_counters(server.counters());
        ctl.restore(saved, Instant::now());
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let worker = thread::Builder::new()
            .name("headless".into())
            .spawn(move || {
                while !stop2.load(Ordering::Relaxed) {
                    if serve_pending(
                        &rx,
                        &mut ctl,
                        super::super::controller::Controller::handle,
                        super::super::controller::Controller::apply_fleet,
                    ) == 0
                    {
                        thread::sleep(Duration::from_millis(2));
                    }
                    ctl.retry_due(Instant::now());
                }
                ctl
            })
            .map_err(DaemonError::HeadlessThread)?;
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
