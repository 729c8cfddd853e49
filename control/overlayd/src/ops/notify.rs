//! systemd's readiness and watchdog protocol (`sd_notify(3)`), spoken by `overlayd`
//! when it runs as a `Type=notify` service.
//!
//! Why: with `Type=notify` systemd holds back units ordered after `overlayd` (and
//! `systemctl start` returns) until the daemon says `READY=1`, which it does once
//! its API socket is bound, the saved state is restored and the workers run: an
//! orchestrator started after it finds a daemon that answers. `STOPPING=1` tells
//! systemd a shutdown is deliberate, and `WATCHDOG=1`, sent from the main loop,
//! lets systemd restart a daemon whose main thread is stuck.
//!
//! The protocol is one datagram per message to the Unix socket named by
//! `$NOTIFY_SOCKET` (a path, or an abstract name written with a leading `@`).
//! Without `$NOTIFY_SOCKET` (not started by systemd) every call does nothing.

use std::ffi::OsString;
use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::{Duration, Instant};

/// A setting systemd passed that cannot be used, named with its value.
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    #[error("NOTIFY_SOCKET {0:?} is not UTF-8")]
    NotUtf8(OsString),
    #[error("NOTIFY_SOCKET {0:?} is neither an absolute path nor an abstract name (@...)")]
    NotAnAddress(String),
    #[error("NOTIFY_SOCKET {path:?}: {error}")]
    Address { path: String, error: io::Error },
    #[error("cannot open a socket for NOTIFY_SOCKET {path:?}: {error}")]
    Socket { path: String, error: io::Error },
    #[error("WATCHDOG_PID {0:?} is not a process id")]
    WatchdogPid(String),
    #[error("WATCHDOG_USEC {0:?} is not a positive number")]
    WatchdogUsec(String),
}

/// Where and how often to tell systemd the daemon is alive.
pub struct Notifier {
    socket: UnixDatagram,
    addr: SocketAddr,
    /// Half of systemd's watchdog timeout (`$WATCHDOG_USEC`): a ping this often
    /// leaves room for one late main-loop turn. `None`: no watchdog.
    ping_every: Option<Duration>,
    last_ping: Instant,
}

impl Notifier {
    /// The notifier systemd asked for through the environment, `None` when the
    /// daemon was not started by systemd (no `$NOTIFY_SOCKET`). An address or
    /// watchdog setting that cannot be used is an error naming it.
    pub fn from_env() -> Result<Option<Notifier>, NotifyError> {
        let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
            return Ok(None);
        };
        let path = path.into_string().map_err(NotifyError::NotUtf8)?;
        let usec = std::env::var("WATCHDOG_USEC").ok();
        let pid = std::env::var("WATCHDOG_PID").ok();
        let ping_every = watchdog_interval(usec.as_deref(), pid.as_deref(), std::process::id())?;
        Notifier::new(&path, ping_every).map(Some)
    }

    /// A notifier sending to `path` (`@name`: the abstract socket `name`), pinging
    /// the watchdog every `ping_every` if set.
    pub fn new(path: &str, ping_every: Option<Duration>) -> Result<Notifier, NotifyError> {
        let addr = notify_addr(path)?;
        let socket = UnixDatagram::unbound().map_err(|error| NotifyError::Socket {
            path: path.to_string(),
            error,
        })?;
        Ok(Notifier {
            socket,
            addr,
            ping_every,
            last_ping: Instant::now(),
        })
    }

    /// Sends one state message (`READY=1`, `STOPPING=1`, ...). A failure is
    /// logged, not fatal: the datapath works whether or not systemd listens.
    pub fn send(&self, state: &str) {
        if let Err(e) = self.socket.send_to_addr(state.as_bytes(), &self.addr) {
            tracing::warn!(state, error = %e, "systemd notification not sent");
        }
    }

    /// Pings the watchdog if one is configured and a ping is due; called from the
    /// main loop, so a stuck main thread stops the pings.
    pub fn watchdog(&mut self, now: Instant) {
        let Some(every) = self.ping_every else {
            return;
        };
        if now.duration_since(self.last_ping) >= every {
            self.send("WATCHDOG=1");
            self.last_ping = now;
        }
    }
}

/// The socket address `$NOTIFY_SOCKET` names: a path, or with a leading `@` an
/// abstract name (systemd's convention for the abstract namespace).
fn notify_addr(path: &str) -> Result<SocketAddr, NotifyError> {
    let addr = match path.strip_prefix('@') {
        Some(name) => SocketAddr::from_abstract_name(name.as_bytes()),
        None if path.starts_with('/') => SocketAddr::from_pathname(path),
        None => return Err(NotifyError::NotAnAddress(path.to_string())),
    };
    addr.map_err(|error| NotifyError::Address {
        path: path.to_string(),
        error,
    })
}

/// How often to ping the watchdog: half of `$WATCHDOG_USEC`, when it is set and
/// `$WATCHDOG_PID` (if set) is this process (`own_pid`); a watchdog meant for
/// another process is not ours to feed.
fn watchdog_interval(
    usec: Option<&str>,
    pid: Option<&str>,
    own_pid: u32,
) -> Result<Option<Duration>, NotifyError> {
    let Some(usec) = usec else {
        return Ok(None);
    };
    if let Some(pid) = pid {
        let pid: u32 = pid
            .parse()
            .map_err(|_| NotifyError::WatchdogPid(pid.to_string()))?;
        if pid != own_pid {
            return Ok(None);
        }
    }
    let us: u64 = usec
        .parse()
        .ok()
        .filter(|&us| us > 0)
        .ok_or_else(|| NotifyError::WatchdogUsec(usec.to_string()))?;
    Ok(Some(Duration::from_micros(us / 2)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watchdog_interval_is_half_the_timeout_for_this_process() {
        let interval = |usec, pid| watchdog_interval(usec, pid, 7);
        assert_eq!(interval(None, None).unwrap(), None);
        assert_eq!(
            interval(Some("30000000"), None).unwrap(),
            Some(Duration::from_secs(15))
        );
        assert_eq!(
            interval(Some("2000000"), Some("7")).unwrap(),
            Some(Duration::from_secs(1))
        );
        assert_eq!(interval(Some("2000000"), Some("8")).unwrap(), None);
        let e = interval(Some("soon"), None).unwrap_err().to_string();
        assert!(e.contains("\"soon\""), "{e}");
        let e = interval(Some("0"), None).unwrap_err().to_string();
        assert!(e.contains("\"0\""), "{e}");
        let e = interval(Some("5"), Some("x")).unwrap_err().to_string();
        assert!(e.contains("\"x\""), "{e}");
    }

    #[test]
    fn addresses_are_paths_or_abstract_names() {
        let a = notify_addr("@overlayd/notify").unwrap();
        assert_eq!(a.as_abstract_name(), Some(&b"overlayd/notify"[..]));
        let a = notify_addr("/run/systemd/notify").unwrap();
        assert_eq!(
            a.as_pathname(),
            Some(std::path::Path::new("/run/systemd/notify"))
        );
        let e = notify_addr("notify").unwrap_err().to_string();
        assert!(e.contains("\"notify\""), "{e}");
    }

    /// Messages arrive as datagrams at a path socket and at an abstract one.
    #[test]
    fn messages_reach_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let listener = UnixDatagram::bind(&path).unwrap();
        let n = Notifier::new(path.to_str().unwrap(), None).unwrap();
        n.send("READY=1");
        let mut buf = [0u8; 64];
        let len = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"READY=1");

        let name = format!("overlayd-test-{}", std::process::id());
        let abs = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let listener = UnixDatagram::bind_addr(&abs).unwrap();
        let mut n = Notifier::new(&format!("@{name}"), Some(Duration::ZERO)).unwrap();
        n.watchdog(Instant::now());
        let len = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"WATCHDOG=1");
    }
}
