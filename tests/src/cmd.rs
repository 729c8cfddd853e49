//! Running commands (optionally inside a network namespace) with captured output,
//! a deadline, and errors that show the command line, its exit status and stderr.

use crate::{Error, Result};
use std::io::{Read, Write};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// How long a command may run unless the caller says otherwise. Generous because the
/// machine is small and shared; the commands the harness runs finish in milliseconds.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// A command line to run, built like `std::process::Command` but kept as strings so it
/// can be printed in errors exactly as a person would retype it.
#[derive(Clone, Debug)]
pub struct Cmd {
    argv: Vec<String>,
    stdin: Option<Vec<u8>>,
    timeout: Duration,
    envs: Vec<(String, String)>,
    /// Variables of our environment the command does not inherit.
    unset: Vec<String>,
    die_with_parent: bool,
}

/// What a finished command printed.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Cmd {
    pub fn new(program: impl Into<String>) -> Cmd {
        Cmd {
            argv: vec![program.into()],
            stdin: None,
            timeout: DEFAULT_TIMEOUT,
            envs: Vec::new(),
            unset: Vec::new(),
            die_with_parent: false,
        }
    }

    /// Runs `argv` inside network namespace `ns` (through `ip netns exec`, which execs
    /// the program, so a spawned child's pid is the program's own).
    pub fn in_netns(ns: &str, program: impl Into<String>) -> Cmd {
        Cmd::new("ip").args(["netns", "exec", ns]).arg(program)
    }

    pub fn arg(mut self, a: impl Into<String>) -> Cmd {
        self.argv.push(a.into());
        self
    }

    pub fn args<I, S>(mut self, args: I) -> Cmd
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.argv.extend(args.into_iter().map(Into::into));
        self
    }

    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Cmd {
        self.envs.push((key.into(), value.into()));
        self
    }

    /// Does not pass variable `key` of our environment on to the command.
    pub fn env_remove(mut self, key: impl Into<String>) -> Cmd {
        self.unset.push(key.into());
        self
    }

    pub fn stdin(mut self, data: impl Into<Vec<u8>>) -> Cmd {
        self.stdin = Some(data.into());
        self
    }

    /// Has the kernel send SIGTERM to the command when the thread that spawned it
    /// dies, so a test process killed outright (CI timeout, Ctrl-C) leaves no daemon
    /// behind. The signal survives `ip netns exec`'s exec of the real program.
    pub fn die_with_parent(mut self) -> Cmd {
        self.die_with_parent = true;
        self
    }

    pub fn timeout(mut self, t: Duration) -> Cmd {
        self.timeout = t;
        self
    }

    /// The command line, shell-quoted where needed, for messages.
    pub fn display(&self) -> String {
        self.argv
            .iter()
            .map(|a| {
                if !a.is_empty()
                    && a.chars()
                        .all(|c| c.is_ascii_alphanumeric() || "-_./:=,@%+".contains(c))
                {
                    a.clone()
                } else {
                    format!("'{}'", a.replace('\'', r"'\''"))
                }
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    fn command(&self) -> Command {
        let mut c = Command::new(&self.argv[0]);
        c.args(&self.argv[1..]);
        for k in &self.unset {
            c.env_remove(k);
        }
        for (k, v) in &self.envs {
            c.env(k, v);
        }
        if self.die_with_parent {
            use std::os::unix::process::CommandExt;
            // SAFETY: the closure runs in the forked child before exec and calls only
            // prctl(2), which is async-signal-safe and touches no shared state.
            unsafe {
                c.pre_exec(|| {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) == 0 {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                });
            }
        }
        c
    }

    /// Starts the command with its output going to `stdout`/`stderr` as given (for
    /// long-running helpers such as daemons and captures).
    pub fn spawn_with(&self, stdout: Stdio, stderr: Stdio) -> Result<Child> {
        self.spawn_with_stdin(Stdio::null(), stdout, stderr)
    }

    /// [`Cmd::spawn_with`] with `stdin` as given too (a pipe for a program driven by
    /// commands, such as an interactive testpmd).
    pub fn spawn_with_stdin(&self, stdin: Stdio, stdout: Stdio, stderr: Stdio) -> Result<Child> {
        self.command()
            .stdin(stdin)
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .map_err(|e| Error::new(format!("cannot start `{}`: {e}", self.display())))
    }

    /// Runs to completion (or the deadline) and returns what it printed, whatever its
    /// exit status. Errors only when it cannot start or overruns the deadline.
    pub fn output(&self) -> Result<Outcome> {
        let mut child = self
            .command()
            .stdin(if self.stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| Error::new(format!("cannot start `{}`: {e}", self.display())))?;
        let writer = match (child.stdin.take(), self.stdin.clone()) {
            (Some(mut pipe), Some(data)) => Some(thread::spawn(move || {
                // A command that exits without reading its input is not our error.
                let _ = pipe.write_all(&data);
            })),
            _ => None,
        };
        let out = drain(child.stdout.take());
        let err = drain(child.stderr.take());
        let deadline = Instant::now() + self.timeout;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(5)),
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    let stderr = err.join().unwrap_or_default();
                    return Err(Error::new(format!(
                        "`{}` did not finish within {:?}; stderr: {}",
                        self.display(),
                        self.timeout,
                        stderr.trim()
                    )));
                }
                Err(e) => return Err(Error::new(format!("waiting for `{}`: {e}", self.display()))),
            }
        };
        if let Some(w) = writer {
            let _ = w.join();
        }
        Ok(Outcome {
            status,
            stdout: out.join().unwrap_or_default(),
            stderr: err.join().unwrap_or_default(),
        })
    }

    /// Runs to completion and requires exit status 0; returns stdout.
    pub fn run(&self) -> Result<String> {
        let o = self.output()?;
        if o.status.success() {
            Ok(o.stdout)
        } else {
            Err(Error::new(format!(
                "`{}` failed ({}); stderr: {}{}",
                self.display(),
                o.status,
                o.stderr.trim(),
                if o.stdout.trim().is_empty() {
                    String::new()
                } else {
                    format!("; stdout: {}", o.stdout.trim())
                }
            )))
        }
    }
}

/// Reads a pipe to the end on a thread, so a chatty command never blocks on a full pipe.
fn drain<R: Read + Send + 'static>(pipe: Option<R>) -> thread::JoinHandle<String> {
    thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_end(&mut buf);
        }
        String::from_utf8_lossy(&buf).into_owned()
    })
}

/// Whether `program` is a file in one of `PATH`'s directories.
pub fn on_path(program: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).any(|d| d.join(program).is_file())
}

/// How long [`terminate`] waits after SIGTERM before it kills.
pub const STOP_GRACE: Duration = Duration::from_secs(5);

/// Stops `child` as a service manager would: SIGTERM, up to [`STOP_GRACE`] to exit,
/// then SIGKILL (saying so, with `label`). Returns its exit status.
pub fn terminate(child: &mut Child, label: &str) -> Result<ExitStatus> {
    if let Some(status) = child.try_wait()? {
        return Ok(status);
    }
    let pid = libc::pid_t::try_from(child.id())
        .map_err(|_| Error::new(format!("pid {} out of range", child.id())))?;
    // SAFETY: kill(2) on the pid of our own unreaped child: it cannot have been
    // recycled for another process while we have not waited for it.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let deadline = Instant::now() + STOP_GRACE;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        thread::sleep(Duration::from_millis(20));
    }
    eprintln!("{label} ignored SIGTERM for {STOP_GRACE:?}; killing it");
    child.kill()?;
    Ok(child.wait()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_returns_stdout_and_failure_names_command_and_stderr() {
        let out = Cmd::new("sh").args(["-c", "echo hi"]).run().unwrap();
        assert_eq!(out, "hi\n");
        let err = Cmd::new("sh")
            .args(["-c", "echo oops >&2; exit 3"])
            .run()
            .unwrap_err();
        assert!(err.0.contains("sh -c 'echo oops >&2; exit 3'"), "{err}");
        assert!(err.0.contains("oops"), "{err}");
        assert!(err.0.contains("exit status: 3"), "{err}");
    }

    #[test]
    fn stdin_is_fed_and_timeout_kills() {
        let out = Cmd::new("cat").stdin("abc").run().unwrap();
        assert_eq!(out, "abc");
        let started = Instant::now();
        let err = Cmd::new("sleep")
            .arg("10")
            .timeout(Duration::from_millis(200))
            .output()
            .unwrap_err();
        assert!(err.0.contains("did not finish"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn display_quotes_only_when_needed() {
        let c = Cmd::in_netns("ns1", "ping").args(["-c", "1", "a b", ""]);
        assert_eq!(c.display(), "ip netns exec ns1 ping -c 1 'a b' ''");
    }
}
