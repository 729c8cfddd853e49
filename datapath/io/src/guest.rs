//! A guest port's I/O, whichever way the guest is reached: a tap the daemon made
//! ([`TapPort`]), an interface a hypervisor owns, attached with a packet socket
//! ([`PacketPort`]), or a VM's virtqueues over vhost-user ([`VhostPort`]). All
//! read and write (`virtio_net_hdr`, frame), so the worker serves them alike; they
//! differ in who owns the device, i.e. in what deleting the port does to it, and
//! in how the worker learns that frames wait (a tap's or packet socket's fd is
//! in its epoll set; a vhost-user port's transmit ring is memory, looked at every
//! round).

use std::io::{self, IoSlice};
use std::os::fd::RawFd;

use wire::vnet::VnetHdr;

use crate::packet::PacketPort;
use crate::tap::TapPort;
use crate::vhost::VhostPort;

/// What a failed read or write of a guest port (a tap, or a packet socket on an
/// attached interface) says about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuestFault {
    /// The guest's side of the link is down (a tap write gets EIO; a packet
    /// socket's, ENETDOWN: the attached interface is down): the device is
    /// there, this frame is lost and later ones go through once the guest
    /// brings its link up.
    LinkDown,
    /// The kernel refused this one frame (a malformed frame or vnet header,
    /// memory pressure, a full send buffer), or a frame we could not assemble:
    /// the port is fine.
    Frame,
    /// Anything else: the descriptor no longer reaches a device (EBADFD once
    /// the device was deleted, e.g. with the guest's namespace; ENXIO for a
    /// packet socket whose interface was deleted). The fd is useless; the port
    /// must be opened again.
    Gone,
}

impl GuestFault {
    /// Classifies an error of a [`GuestPort`]'s read or write
    /// (reads handle EAGAIN and EINTR themselves; a packet socket's write may
    /// still say EAGAIN when its send buffer is full).
    pub fn of(e: &io::Error) -> GuestFault {
        match e.raw_os_error() {
            Some(libc::EIO | libc::ENETDOWN) => GuestFault::LinkDown,
            Some(
                libc::EINVAL
                | libc::EMSGSIZE
                | libc::EFAULT
                | libc::ENOMEM
                | libc::ENOBUFS
                | libc::EAGAIN,
            ) => GuestFault::Frame,
            Some(_) => GuestFault::Gone,
            // Our own refusals (buffer, vnet header, part count) name no errno.
            None => GuestFault::Frame,
        }
    }
}

/// One guest port's open device.
#[derive(Debug)]
pub enum GuestPort {
    /// A persistent tap the daemon created (and destroys with the port).
    Tap(TapPort),
    /// An interface attached with `--attach`: its owner (the hypervisor) deletes it.
    Attached(PacketPort),
    /// A VM's virtio-net device served over vhost-user (`--vhost-user`).
    Vhost(VhostPort),
}

impl GuestPort {
    /// The device's interface name.
    pub fn name(&self) -> &str {
        match self {
            GuestPort::Tap(t) => t.name(),
            GuestPort::Attached(p) => p.name(),
            GuestPort::Vhost(v) => v.name(),
        }
    }

    /// The fd to poll; `None` for a vhost-user port, whose ring is polled.
    pub fn poll_fd(&self) -> Option<RawFd> {
        match self {
            GuestPort::Tap(t) => Some(t.as_raw_fd()),
            GuestPort::Attached(p) => Some(p.as_raw_fd()),
            GuestPort::Vhost(_) => None,
        }
    }

    /// One frame from the guest into `buf` ([`crate::tap::MAX_TAP_FRAME`] bytes):
    /// its vnet header and length, or `None` when there is none.
    pub fn read(&mut self, buf: &mut [u8]) -> io::Result<Option<(VnetHdr, usize)>> {
        match self {
            GuestPort::Tap(t) => t.read(buf),
            GuestPort::Attached(p) => p.read(buf),
            GuestPort::Vhost(v) => v.recv(buf),
        }
    }

    /// One frame to the guest: `parts[0]` its vnet header, then the frame.
    pub fn write_gather(&self, parts: &[IoSlice<'_>]) -> io::Result<()> {
        match self {
            GuestPort::Tap(t) => t.write_gather(parts),
            GuestPort::Attached(p) => p.write_gather(parts),
            GuestPort::Vhost(v) => v.write_gather(parts),
        }
    }

    /// After a round: interrupts a VM whose rings returned buffers (a tap or a
    /// packet socket needs nothing).
    pub fn flush(&self) {
        if let GuestPort::Vhost(v) = self {
            v.flush();
        }
    }

    /// One frame to the guest in one piece.
    pub fn write(&self, vnet: &VnetHdr, frame: &[u8]) -> io::Result<()> {
        let hdr = vnet.to_bytes();
        self.write_gather(&[IoSlice::new(&hdr), IoSlice::new(frame)])
    }

    /// Frames from the guest the kernel dropped before we read them, since the
    /// last call, where that is counted per fd (a packet socket's full receive
    /// buffer); `None` for a tap, whose queue counts them on the device.
    pub fn take_drops(&self) -> Option<io::Result<u32>> {
        match self {
            GuestPort::Tap(_) | GuestPort::Vhost(_) => None,
            GuestPort::Attached(p) => Some(p.take_drops()),
        }
    }

    /// Lets go of the device for a deleted port: a tap the daemon made is
    /// destroyed; an attached interface is left to its owner (only our socket
    /// closes); a vhost-user port stops serving its socket (its VM sees the
    /// backend go away).
    pub fn release(self) -> io::Result<()> {
        match self {
            GuestPort::Tap(t) => t.destroy(),
            GuestPort::Attached(_) | GuestPort::Vhost(_) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_are_classified_by_errno() {
        let os = io::Error::from_raw_os_error;
        assert_eq!(GuestFault::of(&os(libc::EIO)), GuestFault::LinkDown);
        assert_eq!(GuestFault::of(&os(libc::ENETDOWN)), GuestFault::LinkDown);
        assert_eq!(GuestFault::of(&os(libc::EAGAIN)), GuestFault::Frame);
        assert_eq!(GuestFault::of(&os(libc::ENXIO)), GuestFault::Gone);
        assert_eq!(GuestFault::of(&os(libc::EINVAL)), GuestFault::Frame);
        assert_eq!(GuestFault::of(&os(libc::ENOBUFS)), GuestFault::Frame);
        assert_eq!(GuestFault::of(&os(libc::EBADFD)), GuestFault::Gone);
        assert_eq!(GuestFault::of(&os(libc::ENODEV)), GuestFault::Gone);
        let ours = io::Error::new(io::ErrorKind::InvalidData, "short frame");
        assert_eq!(GuestFault::of(&ours), GuestFault::Frame);
    }
}
