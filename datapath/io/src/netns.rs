//! Running code inside a named network namespace (`/run/netns/NAME`, as
//! created by `ip netns add`).
//!
//! `setns(CLONE_NEWNET)` changes the namespace of the calling thread only, so
//! the closure runs on a fresh thread: sockets it opens (netlink, AF_XDP,
//! AF_PACKET, /dev/net/tun) belong to that namespace and keep it after the
//! thread ends, while the caller's threads are untouched.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::PathBuf;

/// Path of a named namespace's handle.
pub fn netns_path(name: &str) -> io::Result<PathBuf> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("invalid network namespace name {name:?}"),
        ));
    }
    Ok(PathBuf::from("/run/netns").join(name))
}

/// Opens the handle of a named namespace (for `setns` or `IFLA_NET_NS_FD`).
pub fn open_netns(name: &str) -> io::Result<File> {
    let path = netns_path(name)?;
    File::open(&path).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("network namespace {name:?} ({}): {e}", path.display()),
        )
    })
}

/// Runs `f` on a new thread that has entered network namespace `name`, and
/// returns its result.
pub fn run_in_netns<T, F>(name: &str, f: F) -> io::Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let ns = open_netns(name)?;
    let name = name.to_string();
    let handle = std::thread::Builder::new()
        .name(format!("netns-{name}"))
        .spawn(move || -> io::Result<T> {
            enter(&ns, &name)?;
            Ok(f())
        })?;
    match handle.join() {
        Ok(r) => r,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// One long-lived thread that visits network namespaces: it enters the one a call
/// names, runs the closure there, and goes back to its own before the next call.
///
/// For what is asked of other namespaces again and again (a tap's counters on every
/// stats request): [`run_in_netns`] would start a thread each time, and each new
/// thread may leave the allocator another arena behind.
pub struct NetnsVisitor {
    jobs: std::sync::mpsc::Sender<Job>,
}

/// A visit; false if the thread could not return home and must stop.
type Job = Box<dyn FnOnce(&File) -> bool + Send>;

impl NetnsVisitor {
    /// Starts the thread in the caller's namespace, which it returns to after
    /// every visit.
    pub fn start() -> io::Result<NetnsVisitor> {
        let home = File::open("/proc/thread-self/ns/net")?;
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("netns-visitor".into())
            .spawn(move || {
                for job in rx {
                    if !job(&home) {
                        break;
                    }
                }
            })?;
        Ok(NetnsVisitor { jobs: tx })
    }

    /// Runs `f` inside namespace `name` and returns its result.
    pub fn run<T, F>(&self, name: &str, f: F) -> io::Result<T>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let ns = open_netns(name)?;
        let name = name.to_string();
        let (tx, rx) = std::sync::mpsc::channel();
        let job: Job = Box::new(move |home: &File| {
            let r = enter(&ns, &name).map(|()| f());
            // Back home before anything else runs here: a thread that cannot
            // return stops rather than run the next visit from a guest's namespace.
            match enter(home, "the daemon's own") {
                Ok(()) => {
                    let _ = tx.send(r);
                    true
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                    false
                }
            }
        });
        self.jobs
            .send(job)
            .map_err(|_| io::Error::other("the netns visitor thread has stopped"))?;
        rx.recv()
            .map_err(|_| io::Error::other("the netns visitor thread has stopped"))?
    }
}

/// Moves the calling thread into the namespace `ns` refers to.
fn enter(ns: &File, name: &str) -> io::Result<()> {
    // SAFETY: setns on an open namespace fd; affects only the calling thread.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("setns into {name:?}: {e}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::Netlink;
    use crate::testnet::{require_root, Netns};

    /// Visits see each namespace's own links, one after the other; a namespace
    /// that does not exist is refused by name.
    #[test]
    fn visitor_sees_each_namespace_in_turn() {
        require_root();
        let (a, b) = (Netns::new(), Netns::new());
        a.ip(&[
            "link", "add", "vis-a", "type", "veth", "peer", "name", "vis-a1",
        ]);
        b.ip(&[
            "link", "add", "vis-b", "type", "veth", "peer", "name", "vis-b1",
        ]);
        let v = NetnsVisitor::start().unwrap();
        let has = |ns: &str, link: &'static str| {
            v.run(ns, move || {
                Netlink::open().unwrap().link_by_name(link).is_ok()
            })
            .unwrap()
        };
        for _ in 0..2 {
            assert!(has(&a.name, "vis-a") && !has(&a.name, "vis-b"));
            assert!(has(&b.name, "vis-b") && !has(&b.name, "vis-a"));
        }
        let e = v.run("no-such-netns-here", || ()).unwrap_err();
        assert!(e.to_string().contains("no-such-netns-here"), "{e}");
    }
}
