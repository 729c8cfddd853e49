//! Readiness for poll-mode workers: one epoll set over a worker's taps, AF_XDP
//! sockets and wake-up eventfd.
//!
//! Why epoll rather than reading every tap each round: a `readv` on an empty tap is
//! a failed syscall, and a busy worker used to issue one per tap per round. One
//! `epoll_wait` with a zero timeout says which taps have frames, whatever their
//! number; and when the worker has nothing to do, the same call with a timeout is
//! where it sleeps, woken by the first tap, socket or doorbell that has something.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// Most events one [`Epoll::wait`] reports; more stay pending for the next call
/// (level-triggered: nothing is lost).
pub const MAX_EVENTS: usize = 64;

/// What [`Epoll::wait`] reports for one registered descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ready {
    /// The token it was registered with.
    pub token: u64,
    /// Readable.
    pub input: bool,
    /// `EPOLLERR` or `EPOLLHUP`: the other side is gone (a tap whose device was
    /// deleted); it will be reported on every call until removed.
    pub gone: bool,
}

/// Adds descriptors to an [`Epoll`] set from another thread: a vhost-user
/// port's connection thread puts its rings' kick eventfds in its worker's set.
pub struct EpollWatch {
    fd: OwnedFd,
}

impl EpollWatch {
    /// As [`Epoll::add_edge`].
    pub fn add_edge(&self, fd: RawFd, token: u64) -> io::Result<()> {
        ctl_add(&self.fd, fd, token, (libc::EPOLLIN | libc::EPOLLET) as u32)
    }

    /// As [`Epoll::remove`].
    pub fn remove(&self, fd: RawFd) -> io::Result<()> {
        ctl_del(&self.fd, fd)
    }
}

fn ctl_add(epoll: &OwnedFd, fd: RawFd, token: u64, events: u32) -> io::Result<()> {
    let mut ev = libc::epoll_event { events, u64: token };
    // SAFETY: `ev` is a valid epoll_event for the duration of the call.
    let rc = unsafe { libc::epoll_ctl(epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) };
    if rc < 0 {
        return Err(os_err(format!("epoll_ctl ADD fd {fd}")));
    }
    Ok(())
}

fn ctl_del(epoll: &OwnedFd, fd: RawFd) -> io::Result<()> {
    // SAFETY: EPOLL_CTL_DEL ignores the event argument (NULL is allowed since 2.6.9).
    let rc = unsafe {
        libc::epoll_ctl(
            epoll.as_raw_fd(),
            libc::EPOLL_CTL_DEL,
            fd,
            std::ptr::null_mut(),
        )
    };
    if rc < 0 {
        return Err(os_err(format!("epoll_ctl DEL fd {fd}")));
    }
    Ok(())
}

/// An epoll instance (level-triggered, `EPOLLIN`).
pub struct Epoll {
    fd: OwnedFd,
    events: Vec<libc::epoll_event>,
}

impl Epoll {
    pub fn new() -> io::Result<Epoll> {
        // SAFETY: plain epoll_create1(2); the result is checked before use.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(os_err("epoll_create1"));
        }
        Ok(Epoll {
            // SAFETY: `fd` was just returned by epoll_create1 and is owned by nothing else.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            events: vec![libc::epoll_event { events: 0, u64: 0 }; MAX_EVENTS],
        })
    }

    /// Watches `fd` for input, reported with `token` on every wait while it lasts
    /// (level-triggered: a tap not read empty is reported again).
    pub fn add(&self, fd: RawFd, token: u64) -> io::Result<()> {
        self.ctl_add(fd, token, libc::EPOLLIN as u32)
    }

    /// Watches `fd` for input, reported once each time input arrives
    /// (edge-triggered). For descriptors the caller checks without a syscall and
    /// only needs to be woken by: an AF_XDP socket's rx ring is memory, and a
    /// level-triggered AF_XDP socket is polled again by every wait (in copy mode its
    /// poll also runs the transmit path).
    pub fn add_edge(&self, fd: RawFd, token: u64) -> io::Result<()> {
        self.ctl_add(fd, token, (libc::EPOLLIN | libc::EPOLLET) as u32)
    }

    fn ctl_add(&self, fd: RawFd, token: u64, events: u32) -> io::Result<()> {
        ctl_add(&self.fd, fd, token, events)
    }

    /// A handle another thread can add descriptors to this set with (the same
    /// epoll instance, through a duplicate of its fd).
    pub fn watcher(&self) -> io::Result<EpollWatch> {
        Ok(EpollWatch {
            fd: self.fd.try_clone()?,
        })
    }

    /// Stops watching `fd`.
    pub fn remove(&self, fd: RawFd) -> io::Result<()> {
        ctl_del(&self.fd, fd)
    }

    /// Waits up to `timeout` (zero: just looks) and returns what is ready. An
    /// interrupted wait returns nothing.
    pub fn wait(&mut self, timeout: Duration) -> io::Result<impl Iterator<Item = Ready> + '_> {
        // Rounded up to whole milliseconds: a wait that ends before the deadline
        // the caller computed (999.7 ms taken as 999) finds its timer not yet due
        // and costs a second wake-up, or a spin if the rest rounds to zero.
        let ms = i32::try_from(timeout.as_nanos().div_ceil(1_000_000)).unwrap_or(i32::MAX);
        // SAFETY: `events` holds MAX_EVENTS initialized entries the kernel may write.
        let n = unsafe {
            libc::epoll_wait(
                self.fd.as_raw_fd(),
                self.events.as_mut_ptr(),
                MAX_EVENTS as libc::c_int,
                ms,
            )
        };
        let n = if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(io::Error::new(e.kind(), format!("epoll_wait: {e}")));
            }
            0
        } else {
            n as usize
        };
        Ok(self.events[..n].iter().map(|e| {
            let bits = e.events;
            Ready {
                token: e.u64,
                input: bits & libc::EPOLLIN as u32 != 0,
                gone: bits & (libc::EPOLLERR | libc::EPOLLHUP) as u32 != 0,
            }
        }))
    }
}

/// A non-blocking eventfd: one thread's wake-up call for another.
pub struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    pub fn new() -> io::Result<EventFd> {
        // SAFETY: plain eventfd(2); the result is checked before use.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(os_err("eventfd"));
        }
        Ok(EventFd {
            // SAFETY: `fd` was just returned by eventfd(2) and is owned by nothing else.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Makes the eventfd readable (a saturated counter already is: not an error).
    pub fn notify(&self) {
        let one = 1u64;
        // SAFETY: writes 8 bytes from `one`.
        unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Clears it (nothing pending is fine).
    pub fn clear(&self) {
        let mut v = 0u64;
        // SAFETY: reads 8 bytes into `v`; with nothing pending the non-blocking
        // read fails with EAGAIN and writes nothing.
        unsafe { libc::read(self.fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

fn os_err(what: impl std::fmt::Display) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn wakes_on_an_eventfd_and_reports_its_token() {
        let mut ep = Epoll::new().unwrap();
        let (a, b) = (EventFd::new().unwrap(), EventFd::new().unwrap());
        ep.add(b.as_raw_fd(), 9).unwrap();
        assert_eq!(ep.wait(Duration::ZERO).unwrap().count(), 0);
        b.notify();
        let ready: Vec<Ready> = ep.wait(Duration::from_secs(5)).unwrap().collect();
        assert_eq!(
            ready,
            [Ready {
                token: 9,
                input: true,
                gone: false
            }]
        );
        // Level-triggered: still there until cleared.
        assert_eq!(ep.wait(Duration::ZERO).unwrap().count(), 1);
        b.clear();
        b.clear();
        assert_eq!(ep.wait(Duration::ZERO).unwrap().count(), 0);
        // Edge-triggered: reported once per arrival.
        ep.add_edge(a.as_raw_fd(), 7).unwrap();
        a.notify();
        assert_eq!(ep.wait(Duration::ZERO).unwrap().count(), 1);
        assert_eq!(ep.wait(Duration::ZERO).unwrap().count(), 0);
        a.notify();
        assert_eq!(ep.wait(Duration::ZERO).unwrap().count(), 1);
        // A timeout is a timeout.
        let t = Instant::now();
        assert_eq!(ep.wait(Duration::from_millis(30)).unwrap().count(), 0);
        assert!(t.elapsed() >= Duration::from_millis(25));
        ep.remove(b.as_raw_fd()).unwrap();
        b.notify();
        assert_eq!(ep.wait(Duration::ZERO).unwrap().count(), 0);
        assert!(ep.remove(b.as_raw_fd()).is_err(), "not registered any more");
    }
}
