//! The API's Unix socket: accepts connections, reads one request per line, hands each
//! to whoever owns the controller, and writes back the answer.
//!
//! The server never touches the controller itself. Requests travel over a channel to
//! the thread that owns it (the datapath worker, which applies them between batches,
//! or a plain loop when the daemon runs without I/O), so the fast path takes no lock
//! and sees configuration change only between batches.

use crate::api::{self, Outcome, Request, MAX_LINE};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

/// A request on its way to the controller, with where to send the answer.
pub struct Pending {
    pub request: Request,
    pub reply: mpsc::Sender<Outcome>,
}

/// The sending side the server uses; the receiving side belongs to the controller's
/// owner, which calls [`serve_pending`] between batches.
pub type RequestTx = mpsc::SyncSender<Pending>;
pub type RequestRx = mpsc::Receiver<Pending>;

/// How many requests may wait for the controller; beyond it, connection threads block
/// (there is no reason for an admin client to queue more).
const QUEUE: usize = 64;

pub fn request_channel() -> (RequestTx, RequestRx) {
    mpsc::sync_channel(QUEUE)
}

/// Answers every request waiting in `rx` with `handle`, without blocking. Returns how
/// many were served, so a worker knows it did work this round.
pub fn serve_pending(rx: &RequestRx, mut handle: impl FnMut(Request) -> Outcome) -> usize {
    let mut n = 0;
    while let Ok(p) = rx.try_recv() {
        // The client may have gone away; its answer is then simply dropped.
        let _ = p.reply.send(handle(p.request));
        n += 1;
    }
    n
}

/// The listening socket; removed from the filesystem when dropped.
pub struct ApiServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    accept: Option<thread::JoinHandle<()>>,
}

impl ApiServer {
    /// Binds `path` (root-only: the directory is created 0700 and the socket chmod
    /// 0600) and starts accepting. A stale socket from a previous run is replaced; a
    /// live one (another daemon answering) is an error.
    pub fn start(path: &Path, requests: RequestTx) -> Result<ApiServer, String> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        if path.exists() {
            if UnixStream::connect(path).is_ok() {
                return Err(format!(
                    "API socket {} is in use by a running daemon",
                    path.display()
                ));
            }
            std::fs::remove_file(path)
                .map_err(|e| format!("cannot remove stale socket {}: {e}", path.display()))?;
        }
        let listener = UnixListener::bind(path)
            .map_err(|e| format!("cannot bind API socket {}: {e}", path.display()))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| format!("cannot restrict API socket {}: {e}", path.display()))?;
        // Non-blocking accept, so the loop notices `stop` without a wake-up connection.
        listener
            .set_nonblocking(true)
            .map_err(|e| format!("API socket {}: {e}", path.display()))?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let accept = thread::Builder::new()
            .name("api-accept".into())
            .spawn(move || accept_loop(listener, requests, stop2))
            .map_err(|e| format!("cannot start API thread: {e}"))?;
        Ok(ApiServer {
            path: path.to_path_buf(),
            stop,
            accept: Some(accept),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

fn accept_loop(listener: UnixListener, requests: RequestTx, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, _)) => {
                let tx = requests.clone();
                let spawned = thread::Builder::new()
                    .name("api-conn".into())
                    .spawn(move || {
                        if let Err(e) = serve_connection(stream, &tx) {
                            tracing::debug!(error = %e, "API connection ended");
                        }
                    });
                if let Err(e) = spawned {
                    tracing::warn!(error = %e, "cannot start API connection thread");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                thread::sleep(Duration::from_millis(50));
            }
            Err(e) => {
                tracing::warn!(error = %e, "API accept failed");
                thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// Serves requests on one connection until the client closes it.
fn serve_connection(stream: UnixStream, requests: &RequestTx) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    let mut out = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    let mut line = Vec::new();
    loop {
        line.clear();
        // One byte over the limit tells an over-long line from one exactly at it.
        let n = (&mut reader)
            .take(MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut line)?;
        if n == 0 {
            return Ok(());
        }
        if line.last() != Some(&b'\n') {
            let msg = if line.len() > MAX_LINE {
                format!("request longer than {MAX_LINE} bytes refused")
            } else {
                "request not terminated by a newline".to_string()
            };
            out.write_all(&api::encode_response(Outcome::Error(msg)))?;
            return Ok(());
        }
        let outcome = match api::decode_request(&line) {
            Ok(request) => submit(requests, request),
            Err(e) => Outcome::Error(e),
        };
        out.write_all(&api::encode_response(outcome))?;
    }
}

fn submit(requests: &RequestTx, request: Request) -> Outcome {
    let (tx, rx) = mpsc::channel();
    if requests.send(Pending { request, reply: tx }).is_err() {
        return Outcome::Error("the daemon is shutting down".into());
    }
    rx.recv()
        .unwrap_or_else(|_| Outcome::Error("the daemon is shutting down".into()))
}
