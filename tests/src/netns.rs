//! Network namespaces owned by a guard, and the unique names they carry.

use crate::cmd::{Cmd, Outcome};
use crate::Result;
use std::sync::atomic::{AtomicU32, Ordering};

/// A short name unique to this process and call: `{prefix}{pid hex}x{counter hex}`.
/// Short because interface names that embed it are limited to 15 bytes; the pid
/// keeps parallel test processes apart and the counter parallel tests in one process.
pub fn unique_id(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}{:x}x{n:x}", std::process::id())
}

/// Deletes namespaces named by [`unique_id`] with `prefix` whose creating process is
/// gone (a run killed before its guards could clean up), after stopping whatever
/// still runs inside them (daemons of that dead run). A namespace whose pid is alive
/// is left alone: it may belong to a run in progress.
pub fn sweep_stale(prefix: &str) -> Result<()> {
    for name in Cmd::new("ip")
        .args(["netns", "list"])
        .run()?
        .lines()
        .filter_map(|l| l.split_whitespace().next())
    {
        let Some(pid) = creator_pid(prefix, name) else {
            continue;
        };
        if std::path::Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let pids = Cmd::new("ip").args(["netns", "pids", name]).run()?;
        for p in pids
            .split_whitespace()
            .filter_map(|p| p.parse::<libc::pid_t>().ok())
        {
            // SAFETY: kill(2) has no memory-safety preconditions; the pid was just
            // listed as running inside a namespace of a dead test run.
            unsafe { libc::kill(p, libc::SIGKILL) };
        }
        if let Err(e) = Cmd::new("ip").args(["netns", "del", name]).run() {
            eprintln!("e2e: removing stale namespace {name}: {e}");
        }
    }
    Ok(())
}

/// The pid embedded in a name made by [`unique_id`] with `prefix`, if it is one.
pub(crate) fn creator_pid(prefix: &str, name: &str) -> Option<u32> {
    let rest = name.strip_prefix(prefix)?;
    let (pid, after) = rest.split_once('x')?;
    let counter: String = after.chars().take_while(char::is_ascii_hexdigit).collect();
    if counter.is_empty() || !after[counter.len()..].starts_with('-') {
        return None;
    }
    u32::from_str_radix(pid, 16).ok()
}

/// A network namespace that is deleted when dropped. Processes still running inside
/// keep the namespace alive after deletion, so owners stop them first.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates the namespace (replacing a stale one of the same name left by a
    /// crashed run), brings its loopback up and sets the given sysctls before any
    /// interface exists, so interfaces created later inherit `default.*` values.
    pub fn create(name: &str, sysctls: &[(&str, &str)]) -> Result<Netns> {
        if Cmd::new("ip")
            .args(["netns", "list"])
            .run()?
            .lines()
            .any(|l| l.split_whitespace().next() == Some(name))
        {
            Cmd::new("ip").args(["netns", "del", name]).run()?;
        }
        Cmd::new("ip").args(["netns", "add", name]).run()?;
        let ns = Netns {
            name: name.to_string(),
        };
        ns.ip(&["link", "set", "lo", "up"])?;
        for (key, value) in sysctls {
            ns.sysctl(key, value)?;
        }
        Ok(ns)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// A command to run inside this namespace.
    pub fn cmd(&self, program: &str) -> Cmd {
        Cmd::in_netns(&self.name, program)
    }

    /// Runs `program args...` inside; requires success; returns stdout.
    pub fn run(&self, program: &str, args: &[&str]) -> Result<String> {
        self.cmd(program).args(args.iter().copied()).run()
    }

    /// Runs `program args...` inside; returns the outcome whatever the exit status.
    pub fn output(&self, program: &str, args: &[&str]) -> Result<Outcome> {
        self.cmd(program).args(args.iter().copied()).output()
    }

    /// `ip -n NS ARGS...` (no mount namespace needed, so cheaper than `netns exec`).
    pub fn ip(&self, args: &[&str]) -> Result<String> {
        Cmd::new("ip")
            .args(["-n", self.name.as_str()])
            .args(args.iter().copied())
            .run()
    }

    pub fn sysctl(&self, key: &str, value: &str) -> Result<()> {
        self.run("sysctl", &["-qw", &format!("{key}={value}")])
            .map(drop)
    }

    /// Makes a bridge in this namespace forward like a switch: where the kernel has
    /// `br_netfilter` (Debian loads it for Docker and OVS), bridged frames would
    /// otherwise go through iptables, ip6tables and arptables, which no switch does
    /// and which costs every setup that bridges frames. Without the module there is
    /// nothing to turn off.
    pub fn bridge_without_netfilter(&self) -> Result<()> {
        for family in ["iptables", "ip6tables", "arptables"] {
            let key = format!("net.bridge.bridge-nf-call-{family}");
            if self.read_sysctl(&key).is_ok() {
                self.sysctl(&key, "0")?;
            }
        }
        Ok(())
    }

    pub fn read_sysctl(&self, key: &str) -> Result<String> {
        Ok(self.run("sysctl", &["-n", key])?.trim().to_string())
    }

    /// Runs `f` on a thread that has entered this namespace (`setns`), and returns
    /// what it returns: sockets it creates belong to the namespace for their whole
    /// life, wherever they are used afterwards. The calling thread is not moved.
    pub fn within<T: Send>(&self, f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
        let path = self.path();
        std::thread::scope(|s| {
            s.spawn(|| {
                enter(&path)?;
                f()
            })
            .join()
            .unwrap_or_else(|_| Err(crate::Error::new(format!("a thread in {path} panicked"))))
        })
    }

    /// Starts a thread named `name` that enters this namespace and runs `f`, for
    /// a helper that lives as long as a test does (a client holding its
    /// connection). The thread keeps the namespace alive until it ends.
    pub fn spawn<T: Send + 'static>(
        &self,
        name: &str,
        f: impl FnOnce() -> Result<T> + Send + 'static,
    ) -> Result<std::thread::JoinHandle<Result<T>>> {
        let path = self.path();
        std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                enter(&path)?;
                f()
            })
            .map_err(|e| crate::Error::new(format!("starting thread {name}: {e}")))
    }

    fn path(&self) -> String {
        format!("/var/run/netns/{}", self.name)
    }
}

/// Moves the calling thread into the network namespace mounted at `path`.
fn enter(path: &str) -> Result<()> {
    use std::os::fd::AsRawFd;
    let ns = std::fs::File::open(path).map_err(|e| crate::Error::new(format!("{path}: {e}")))?;
    // SAFETY: setns(2) on a valid descriptor of a network namespace changes only
    // the calling thread's namespace; the callers run it on a thread of their own.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(crate::Error::new(format!("entering {path}: {e}")));
    }
    Ok(())
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Err(e) = Cmd::new("ip").args(["netns", "del", &self.name]).run() {
            eprintln!("e2e cleanup: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creator_pid_only_from_our_names() {
        assert_eq!(creator_pid("e2e", "e2e1f4x0-sw"), Some(0x1f4));
        assert_eq!(creator_pid("e2e", "e2e1f4x1a-s0"), Some(0x1f4));
        assert_eq!(creator_pid("e2e", "e2e1f4x0"), None);
        assert_eq!(creator_pid("e2e", "other1f4x0-sw"), None);
        assert_eq!(creator_pid("e2e", "e2ezzx0-sw"), None);
        assert_eq!(creator_pid("e2e", "e2e1f4xg-sw"), None);
    }

    #[test]
    fn ids_are_unique_and_short() {
        let a = unique_id("e2e");
        let b = unique_id("e2e");
        assert_ne!(a, b);
        assert!(a.starts_with("e2e"));
        // pid_max is at most 2^22 (6 hex digits): prefix 3 + 6 + 'x' + counter.
        assert!(a.len() <= 3 + 6 + 1 + 8, "{a}");
    }
}
