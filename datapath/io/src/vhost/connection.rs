//! A port's connection thread: gets a front end (accepts QEMU's connection, or
//! connects to QEMU's socket), serves its requests until it goes away, and does
//! it again until the port is deleted.

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use vhost::vhost_user::{BackendReqHandler, Error};

use super::device::FeatureRefusal;
use super::{Mode, Shared};

/// How long a client waits between tries to reach QEMU's socket, and how often
/// a server looks whether the port was deleted while it waits for QEMU.
const RETRY: Duration = Duration::from_millis(200);

/// How long a port waits after refusing a front end before it takes another: a
/// client would otherwise reconnect to a QEMU that replays the same refused
/// set-up as fast as it can.
const AFTER_REFUSAL: Duration = Duration::from_secs(1);

/// Why a connection ended.
#[derive(Debug, thiserror::Error)]
enum Ended {
    /// The front end went away, or a request failed in a way that ends it.
    #[error("{0}")]
    Gone(Error),
    /// Its features were refused: the connection is closed, never served.
    #[error("features refused: {0}")]
    Refused(FeatureRefusal),
}

/// The listening socket of a server-mode port (an old socket file is replaced).
pub(super) fn listen(cfg: &super::DeviceConfig) -> io::Result<Option<UnixListener>> {
    if cfg.mode == Mode::Client {
        return Ok(None);
    }
    let ctx = |e: io::Error| {
        io::Error::new(
            e.kind(),
            format!("vhost-user socket {}: {e}", cfg.socket.display()),
        )
    };
    // Only a socket no one listens on any more (left by an earlier run) is
    // replaced: a live socket (the daemon's API, another program's) or any other
    // file at the path is refused, never deleted.
    match std::fs::symlink_metadata(&cfg.socket) {
        Ok(_) if is_stale_socket(&cfg.socket) => std::fs::remove_file(&cfg.socket).map_err(ctx)?,
        Ok(_) => {
            return Err(ctx(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "the path exists and is not a socket left by an earlier run",
            )))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(ctx(e)),
    }
    UnixListener::bind(&cfg.socket).map(Some).map_err(ctx)
}

/// Whether `path` is a unix socket that no one listens on (its listener is gone).
pub(super) fn is_stale_socket(path: &std::path::Path) -> bool {
    let socket = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket());
    socket && UnixStream::connect(path).is_err_and(|e| e.kind() == io::ErrorKind::ConnectionRefused)
}

/// Ends the thread: no new connection, and the current one is shut down.
pub(super) fn stop(shared: &Shared) {
    shared.stop.store(true, Ordering::SeqCst);
    if let Some(c) = shared
        .conn
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .as_ref()
    {
        let _ = c.shutdown(std::net::Shutdown::Both);
    }
}

/// Serves front ends one after the other until the port is deleted: a VM that
/// goes away (shut down, QEMU restarted) may come back on the same socket, and
/// in client mode a restarted overlayd finds its VM again.
pub(super) fn serve(shared: &Arc<Shared>, listener: Option<UnixListener>) {
    let name = &shared.cfg.name;
    while !shared.stop.load(Ordering::SeqCst) {
        let stream = match &listener {
            Some(l) => accept(shared, l),
            None => UnixStream::connect(&shared.cfg.socket),
        };
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                if !shared.stop.load(Ordering::SeqCst) {
                    tracing::debug!(port = %name, error = %e, "no vhost-user front end yet");
                    thread::sleep(RETRY);
                }
                continue;
            }
        };
        match stream.try_clone() {
            Ok(c) => {
                *shared
                    .conn
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(c);
            }
            Err(e) => {
                tracing::warn!(port = %name, error = %e, "vhost-user connection not served");
                continue;
            }
        }
        // Deleted between the accept and here: `stop` found no connection to end.
        if shared.stop.load(Ordering::SeqCst) {
            break;
        }
        shared.mark_changed();
        tracing::info!(port = %name, socket = %shared.cfg.socket.display(), "vhost-user front end connected");
        let ended = serve_one(shared, stream);
        shared.device().reset();
        shared
            .conn
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        shared.mark_changed();
        tracing::info!(port = %name, why = %ended, "vhost-user front end gone; rings stopped");
        if matches!(ended, Ended::Refused(_)) {
            pause(shared, AFTER_REFUSAL);
        }
    }
}

/// Sleeps for `d`, or less if the port is deleted meanwhile.
fn pause(shared: &Shared, d: Duration) {
    let mut left = d;
    while !left.is_zero() && !shared.stop.load(Ordering::SeqCst) {
        let step = left.min(RETRY);
        thread::sleep(step);
        left -= step;
    }
}

/// Serves one connection's requests; returns why it ended. A front end whose
/// features are refused is not served any further: the connection is closed
/// (the handler, and with it the socket, is dropped) before any ring can start.
fn serve_one(shared: &Shared, stream: UnixStream) -> Ended {
    let mut handler = BackendReqHandler::from_stream(stream, shared.device.clone());
    loop {
        let r = handler.handle_request();
        if let Some(why) = shared.device().take_refusal() {
            return Ended::Refused(why);
        }
        match r {
            Ok(()) => {}
            // A request the parser refuses for a feature not (yet) negotiated has
            // been read whole and needs no reply: QEMU sends SET_VRING_ENABLE
            // before SET_FEATURES (see `device`). Skip it and go on.
            Err(e @ (Error::InactiveFeature(_) | Error::InactiveOperation(_))) => {
                tracing::debug!(port = %shared.cfg.name, error = %e, "vhost-user request refused");
            }
            Err(e @ (Error::InvalidOperation(_) | Error::InvalidParam)) => {
                tracing::warn!(port = %shared.cfg.name, error = %e, "vhost-user request refused");
            }
            Err(e) => return Ended::Gone(e),
        }
    }
}

/// Waits until a front end connects, looking every [`RETRY`] whether the port
/// was deleted.
fn accept(shared: &Shared, l: &UnixListener) -> io::Result<UnixStream> {
    loop {
        if shared.stop.load(Ordering::SeqCst) {
            return Err(io::Error::other("port deleted"));
        }
        let mut pfd = libc::pollfd {
            fd: l.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll reads and writes one valid pollfd for the call's duration.
        let n = unsafe { libc::poll(&mut pfd, 1, RETRY.as_millis() as libc::c_int) };
        if n > 0 {
            return l.accept().map(|(s, _)| s);
        }
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}
