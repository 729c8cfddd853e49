//! Background processes the benchmark starts (OVS daemons, iperf3 and sockperf
//! servers), each owned by a guard that stops it on drop, also when a run fails or
//! is interrupted.

use crate::cmd::Cmd;
use crate::{Context, Error, Result};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How many lines of a log an error message quotes.
pub const LOG_TAIL_LINES: usize = 15;

/// A running background process with its stdout and stderr in a log file.
#[derive(Debug)]
pub struct Background {
    child: Option<Child>,
    label: String,
    log: PathBuf,
}

impl Background {
    /// Starts `cmd` with its output going to `log`. The process gets SIGTERM if this
    /// thread dies ([`Cmd::die_with_parent`]), so even a killed benchmark leaves
    /// nothing running.
    pub fn start(cmd: Cmd, log: &Path, label: &str) -> Result<Background> {
        let out = File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let err = out
            .try_clone()
            .with_context(|| format!("duplicating {}", log.display()))?;
        let child = cmd
            .die_with_parent()
            .spawn_with(Stdio::from(out), Stdio::from(err))
            .with_context(|| format!("starting {label}"))?;
        Ok(Background {
            child: Some(child),
            label: label.to_string(),
            log: log.to_path_buf(),
        })
    }

    /// The process id while it runs (`ip netns exec` execs the program, so this is
    /// the program's own pid).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// An error naming the exit status and quoting the log if the process has exited.
    pub fn check_running(&mut self) -> Result<()> {
        let status = match self.child.as_mut() {
            Some(c) => c.try_wait()?,
            None => return Err(Error::new(format!("{} was already stopped", self.label))),
        };
        match status {
            None => Ok(()),
            Some(status) => Err(Error::new(format!(
                "{} exited with {status}; log {}:\n{}",
                self.label,
                self.log.display(),
                self.log_tail()
            ))),
        }
    }

    /// The last lines of the log (empty if unreadable: for diagnostics only).
    pub fn log_tail(&self) -> String {
        tail(&std::fs::read_to_string(&self.log).unwrap_or_default())
    }

    /// Waits up to `timeout` for the process to exit by itself; true if it did.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<bool> {
        let Some(child) = self.child.as_mut() else {
            return Ok(true);
        };
        let deadline = Instant::now() + timeout;
        loop {
            if child.try_wait()?.is_some() {
                self.child = None;
                return Ok(true);
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends SIGTERM, waits up to [`crate::cmd::STOP_GRACE`], then SIGKILLs. Returns the exit
    /// status, or `None` if the process was already reaped.
    pub fn stop(&mut self) -> Result<Option<ExitStatus>> {
        let Some(mut child) = self.child.take() else {
            return Ok(None);
        };
        crate::cmd::terminate(&mut child, &format!("bench-e2e: {}", self.label)).map(Some)
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            eprintln!("bench-e2e cleanup: stopping {}: {e}", self.label);
        }
    }
}

/// The last [`LOG_TAIL_LINES`] lines of `text`.
pub fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
}

/// A temporary directory removed (with its contents) on drop.
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Creates `$TMPDIR/name` (which must not exist yet: names carry the pid).
    pub fn create(name: &str) -> Result<TempDir> {
        let path = std::env::temp_dir().join(name);
        std::fs::create_dir(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(TempDir { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.path) {
            eprintln!("bench-e2e cleanup: removing {}: {e}", self.path.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fmt::Write as _;

    #[test]
    fn tail_keeps_the_last_lines() {
        let text = (0..40).fold(String::new(), |mut s, i| {
            let _ = writeln!(s, "line {i}");
            s
        });
        let t = tail(&text);
        assert!(t.starts_with("line 25\n"), "{t}");
        assert!(t.ends_with("line 39"), "{t}");
        assert_eq!(tail("one\ntwo"), "one\ntwo");
    }

    #[test]
    fn stopping_a_background_process_reaps_it() {
        let dir = TempDir::create(&crate::netns::unique_id("bxtest")).unwrap();
        let mut p = Background::start(
            Cmd::new("sleep").arg("30"),
            &dir.path().join("sleep.log"),
            "sleep",
        )
        .unwrap();
        assert!(p.pid().is_some());
        p.check_running().unwrap();
        assert!(!p.wait_exit(Duration::from_millis(50)).unwrap());
        let status = p.stop().unwrap().unwrap();
        assert!(!status.success());
        assert!(p.check_running().is_err());
    }
}
