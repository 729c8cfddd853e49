//! One `overlayd` process per sled, stopped (SIGTERM, then SIGKILL) on drop, with its
//! log printed to the test's output (shown by the test runner only on failure).

use crate::cmd::Cmd;
use crate::netns::Netns;
use crate::poll::poll_until;
use crate::{Context, Error, Result};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

/// How long the daemon gets to exit after SIGTERM before it is killed.
pub use crate::cmd::STOP_GRACE;

/// How long a daemon may take to open its API socket: it loads and attaches the XDP
/// program and binds AF_XDP sockets, which is slow on a loaded 2-core machine.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Where a daemon keeps its files (all inside the rack's temporary directory).
#[derive(Clone, Debug)]
pub struct DaemonPaths {
    pub api_socket: PathBuf,
    pub state_dir: PathBuf,
    pub log: PathBuf,
}

impl DaemonPaths {
    /// The socket gets a directory of its own (`run/`): the daemon refuses one
    /// that holds other files.
    pub fn under(dir: &Path) -> DaemonPaths {
        DaemonPaths {
            api_socket: dir.join("run").join("api.sock"),
            state_dir: dir.join("state"),
            log: dir.join("overlayd.log"),
        }
    }
}

/// A running `overlayd`.
#[derive(Debug)]
pub struct Overlayd {
    child: Option<Child>,
    label: String,
    paths: DaemonPaths,
    /// Print the log when dropped (the default: a test runner shows it only when
    /// the test fails; the demo turns it off after a successful run).
    log_on_drop: bool,
}

impl Overlayd {
    /// Starts `overlayd ARGS...` inside `ns` with stdout and stderr going to the log
    /// file, then waits until `ready` succeeds (the caller probes the API) or the
    /// daemon exits, whichever comes first.
    pub fn start(
        ns: &Netns,
        binary: &Path,
        args: &[String],
        paths: DaemonPaths,
        label: &str,
        ready: impl FnMut() -> Result<()>,
    ) -> Result<Overlayd> {
        Self::start_with_env(ns, binary, args, &[], paths, label, ready)
    }

    /// [`Overlayd::start`] with `env` added to the daemon's environment (e.g. the
    /// `NOTIFY_SOCKET` systemd would give it).
    pub fn start_with_env(
        ns: &Netns,
        binary: &Path,
        args: &[String],
        env: &[(&str, &str)],
        paths: DaemonPaths,
        label: &str,
        ready: impl FnMut() -> Result<()>,
    ) -> Result<Overlayd> {
        std::fs::create_dir_all(&paths.state_dir)
            .with_context(|| format!("creating {}", paths.state_dir.display()))?;
        let log = File::create(&paths.log)
            .with_context(|| format!("creating {}", paths.log.display()))?;
        let mut cmd = ns
            .cmd(&binary.display().to_string())
            .args(args.iter().cloned())
            // Plain text: the log is a file read by people, not a terminal.
            .env("NO_COLOR", "1")
            .die_with_parent();
        for (k, v) in env {
            cmd = cmd.env(*k, *v);
        }
        let child = cmd.spawn_with(Stdio::from(log.try_clone()?), Stdio::from(log))?;
        let mut daemon = Overlayd {
            child: Some(child),
            label: label.to_string(),
            paths,
            log_on_drop: true,
        };
        let mut ready = ready;
        let started = poll_until(
            &format!("{label} to answer on its API socket"),
            START_TIMEOUT,
            || {
                if let Some(status) = daemon.exited()? {
                    // Not worth polling further: report at once with the log.
                    return Ok(Err(Error::new(format!("exited with {status}"))));
                }
                ready().map(Ok)
            },
        );
        match started.and_then(|r| r) {
            Ok(()) => Ok(daemon),
            Err(e) => Err(e.context(format!(
                "starting `{}`; log:\n{}",
                cmd.display(),
                daemon.log()
            ))),
        }
    }

    /// The exit status if the daemon has exited.
    pub fn exited(&mut self) -> Result<Option<std::process::ExitStatus>> {
        match self.child.as_mut() {
            Some(c) => Ok(c.try_wait()?),
            None => Err(Error::new(format!("{} was already stopped", self.label))),
        }
    }

    pub fn set_log_on_drop(&mut self, on: bool) {
        self.log_on_drop = on;
    }

    pub fn paths(&self) -> &DaemonPaths {
        &self.paths
    }

    /// The daemon's process id while it runs (`ip netns exec` execs the daemon, so
    /// this is overlayd's own pid), e.g. for reading its CPU time from `/proc`.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The log so far (empty if unreadable: this is for diagnostics only).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.paths.log).unwrap_or_default()
    }

    /// Sends SIGTERM, waits up to [`STOP_GRACE`], then SIGKILLs. Returns the exit
    /// status (a clean shutdown exits 0).
    pub fn stop(&mut self) -> Result<std::process::ExitStatus> {
        let mut child = self
            .child
            .take()
            .ok_or_else(|| Error::new(format!("{} was already stopped", self.label)))?;
        crate::cmd::terminate(&mut child, &format!("e2e: {}", self.label))
    }
}

impl Drop for Overlayd {
    fn drop(&mut self) {
        if self.child.is_some() {
            if let Err(e) = self.stop() {
                eprintln!("e2e cleanup: stopping {}: {e}", self.label);
            }
        }
        if !self.log_on_drop {
            return;
        }
        // Captured by the test runner and shown only when the test fails.
        eprintln!(
            "----- {} log ({}) -----\n{}----- end of {} log -----",
            self.label,
            self.paths.log.display(),
            self.log(),
            self.label
        );
    }
}

/// Runs `xdeadm --socket SOCKET ARGS...` (from the root namespace: the socket is a
/// path, reachable from anywhere).
pub fn xdeadm(binary: &Path, socket: &Path, args: &[&str]) -> Cmd {
    Cmd::new(binary.display().to_string())
        .arg("--socket")
        .arg(socket.display().to_string())
        .args(args.iter().copied())
}
