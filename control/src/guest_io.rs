//! A port's guest side: a tap, or a VM's virtqueues over vhost-user. The worker
//! moves frames through either the same way; they differ in how it learns that
//! frames wait (a tap is in the worker's epoll set, a vhost-user port's transmit
//! ring is looked at every round: it is memory) and in what can fail.

use dpio::tap::TapPort;
use dpio::vhost::VhostPort;
use std::io::{self, IoSlice};
use std::os::fd::RawFd;
use wire::vnet::VnetHdr;

pub enum GuestIo {
    Tap(TapPort),
    Vhost(VhostPort),
}

impl GuestIo {
    pub(crate) fn name(&self) -> &str {
        match self {
            GuestIo::Tap(t) => t.name(),
            GuestIo::Vhost(v) => v.name(),
        }
    }

    /// The fd to watch for frames from the guest; `None` for a port whose ring
    /// is polled.
    pub(crate) fn poll_fd(&self) -> Option<RawFd> {
        match self {
            GuestIo::Tap(t) => Some(t.as_raw_fd()),
            GuestIo::Vhost(_) => None,
        }
    }

    /// The next frame from the guest (see [`TapPort::read`], [`VhostPort::recv`]).
    pub(crate) fn read(&mut self, buf: &mut [u8]) -> io::Result<Option<(VnetHdr, usize)>> {
        match self {
            GuestIo::Tap(t) => t.read(buf),
            GuestIo::Vhost(v) => v.recv(buf),
        }
    }

    pub(crate) fn write(&self, vnet: &VnetHdr, frame: &[u8]) -> io::Result<()> {
        let hdr = vnet.to_bytes();
        self.write_gather(&[IoSlice::new(&hdr), IoSlice::new(frame)])
    }

    /// One frame to the guest: `parts[0]` its vnet header, the rest the frame.
    /// Errors classify with [`dpio::tap::TapFault::of`].
    pub(crate) fn write_gather(&self, parts: &[IoSlice<'_>]) -> io::Result<()> {
        match self {
            GuestIo::Tap(t) => t.write_gather(parts),
            GuestIo::Vhost(v) => v.write_gather(parts),
        }
    }

    /// After a round: interrupts a VM whose rings returned buffers (a tap needs
    /// nothing).
    pub(crate) fn flush(&self) {
        if let GuestIo::Vhost(v) = self {
            v.flush();
        }
    }

    /// Deletes the guest side: the tap is destroyed; a vhost-user port stops
    /// serving its socket (its VM sees the backend go away).
    pub(crate) fn destroy(self) -> io::Result<()> {
        match self {
            GuestIo::Tap(t) => t.destroy(),
            GuestIo::Vhost(v) => {
                drop(v);
                Ok(())
            }
        }
    }
}
