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
            // SAFETY: setns on a valid namespace fd; affects only this thread.
            if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                let e = io::Error::last_os_error();
                return Err(io::Error::new(
                    e.kind(),
                    format!("setns into {name:?}: {e}"),
                ));
            }
            Ok(f())
        })?;
    match handle.join() {
        Ok(r) => r,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}
