//! The API's Unix socket: accepts connections, reads one request per line, hands each
//! to whoever owns the controller, and writes back the answer.
//!
//! The server never touches the controller itself. Requests travel over a channel to
//! the thread that owns it (the datapath worker, which applies them between batches,
//! or a plain loop when the daemon runs without I/O), so the fast path takes no lock
//! and sees configuration change only between batches.

use crate::api::{self, Outcome, Request, MAX_LINE};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
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

/// Waits up to `timeout` for one request and answers it with `handle`; for a
/// thread whose only job is the controller. Returns false once every sender is
/// gone (the server stopped).
pub fn serve_next(
    rx: &RequestRx,
    timeout: Duration,
    handle: impl FnOnce(Request) -> Outcome,
) -> bool {
    match rx.recv_timeout(timeout) {
        Ok(p) => {
            let _ = p.reply.send(handle(p.request));
            true
        }
        Err(mpsc::RecvTimeoutError::Timeout) => true,
        Err(mpsc::RecvTimeoutError::Disconnected) => false,
    }
}

/// The listening socket; removed from the filesystem when dropped.
pub struct ApiServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    accept: Option<thread::JoinHandle<()>>,
}

impl ApiServer {
    /// Binds `path` and starts accepting. The API is root-only: the socket's
    /// directory is made private first (see [`private_dir`]), so the socket is
    /// unreachable by anyone else from the moment it exists, and then it is chmod
    /// 0600. A stale socket from a previous run is replaced; a live one (another
    /// daemon answering) is an error.
    pub fn start(path: &Path, requests: RequestTx) -> Result<ApiServer, String> {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        private_dir(dir)?;
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

/// Makes `dir` a directory only its owner (this process's user) can enter: created
/// 0700 when missing; when it exists it must be a directory owned by us and not a
/// shared sticky one such as /tmp (chmod 0700 there would break the system), and its
/// mode is then forced to 0700, since `DirBuilder::mode` does nothing to a directory
/// that already exists. Binding inside it leaves no window in which another user
/// can connect before the socket's own mode is set.
fn private_dir(dir: &Path) -> Result<(), String> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let meta = std::fs::metadata(dir).map_err(|e| format!("cannot stat {}: {e}", dir.display()))?;
    if !meta.is_dir() {
        return Err(format!(
            "API socket directory {} is not a directory",
            dir.display()
        ));
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        return Err(format!(
            "API socket directory {} is owned by uid {}, not by us (uid {me}): refusing to \
             serve the API from a directory another user controls",
            dir.display(),
            meta.uid()
        ));
    }
    if meta.mode() & libc::S_ISVTX != 0 {
        return Err(format!(
            "API socket directory {} is a shared sticky directory (mode {:o}): give the \
             socket a directory of its own",
            dir.display(),
            meta.mode() & 0o7777
        ));
    }
    if meta.mode() & 0o777 != 0o700 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| format!("cannot make {} private (chmod 0700): {e}", dir.display()))?;
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().mode() & 0o7777
    }

    /// A directory that already exists with a looser mode is tightened to 0700 (a
    /// `DirBuilder` mode would leave it alone), and the socket is 0600.
    #[test]
    fn existing_dir_is_made_private_and_socket_is_0600() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(mode(&dir), 0o755);
        let sock = dir.join("api.sock");
        let (tx, _rx) = request_channel();
        let server = ApiServer::start(&sock, tx).unwrap();
        assert_eq!(mode(&dir), 0o700);
        let meta = std::fs::symlink_metadata(&sock).unwrap();
        assert!(std::os::unix::fs::FileTypeExt::is_socket(&meta.file_type()));
        assert_eq!(meta.mode() & 0o7777, 0o600);
        drop(server);
        assert!(!sock.exists(), "socket removed on drop");
    }

    /// A missing directory (and its parents) is created 0700.
    #[test]
    fn missing_dir_is_created_private() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/b");
        let (tx, _rx) = request_channel();
        let _server = ApiServer::start(&dir.join("api.sock"), tx).unwrap();
        assert_eq!(mode(&dir), 0o700);
    }

    /// A directory owned by another user, or a shared sticky one, is refused and
    /// left as it was.
    #[test]
    fn foreign_or_shared_dir_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let foreign = tmp.path().join("foreign");
        std::fs::create_dir(&foreign).unwrap();
        std::fs::set_permissions(&foreign, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::chown(&foreign, Some(65534), None).unwrap();
        let (tx, _rx) = request_channel();
        let err = ApiServer::start(&foreign.join("api.sock"), tx)
            .err()
            .unwrap();
        assert!(err.contains("owned by uid 65534"), "{err}");
        assert_eq!(mode(&foreign), 0o755);

        let shared = tmp.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let (tx, _rx) = request_channel();
        let err = ApiServer::start(&shared.join("api.sock"), tx)
            .err()
            .unwrap();
        assert!(err.contains("sticky"), "{err}");
        assert_eq!(mode(&shared), 0o1777);
        assert!(!shared.join("api.sock").exists());
    }
}
