//! The facts about an interface that a host sending Neighbor Discovery needs: its
//! index (to send on it, and the scope of its link-local addresses) and its MAC
//! (offered in a Router Solicitation's source link-layer address option).
//!
//! Both come from the kernel's interface ioctls (`SIOCGIFINDEX`, `SIOCGIFHWADDR`) on
//! a throwaway datagram socket, which needs no privilege and no netlink. They answer
//! for the network namespace the process runs in, which is what a guest's view is
//! wherever it runs: `/sys/class/net` would do inside a VM and under `ip netns
//! exec` (which mounts sysfs afresh), but shows the wrong namespace to a process
//! that only entered the namespace (`nsenter --net`).

use std::io;
use std::mem::zeroed;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// One interface, as Neighbor Discovery on it needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Link {
    /// The interface index.
    pub index: u32,
    /// The Ethernet address, if the interface is an Ethernet one (a tap or a
    /// virtio-net device is; loopback and tun devices are not).
    pub mac: Option<[u8; 6]>,
}

impl Link {
    /// Looks `name` up in this network namespace; a name no interface bears is
    /// [`io::ErrorKind::NotFound`], naming it.
    pub fn by_name(name: &str) -> io::Result<Link> {
        let sock = Ioctls::open()?;
        let index = sock.ask(name, libc::SIOCGIFINDEX)?;
        // SAFETY: SIOCGIFINDEX answers in the union's `ifru_ifindex` member.
        let index = unsafe { index.ifr_ifru.ifru_ifindex };
        let hw = sock.ask(name, libc::SIOCGIFHWADDR)?;
        // SAFETY: SIOCGIFHWADDR answers in the union's `ifru_hwaddr` member.
        let hw = unsafe { hw.ifr_ifru.ifru_hwaddr };
        let mac = (hw.sa_family == libc::ARPHRD_ETHER).then(|| {
            let mut mac = [0u8; 6];
            for (m, &b) in mac.iter_mut().zip(&hw.sa_data) {
                *m = b as u8;
            }
            mac
        });
        Ok(Link {
            index: u32::try_from(index)
                .map_err(|_| io::Error::other(format!("{name:?} has index {index}")))?,
            mac,
        })
    }
}

/// A datagram socket that only carries interface ioctls.
struct Ioctls(OwnedFd);

impl Ioctls {
    fn open() -> io::Result<Ioctls> {
        // SAFETY: socket(2) with constant arguments; the result is checked.
        let fd = unsafe { libc::socket(libc::AF_INET6, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor we own.
        Ok(Ioctls(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// The kernel's answer to `request` about the interface `name`.
    fn ask(&self, name: &str, request: libc::Ioctl) -> io::Result<libc::ifreq> {
        let no_such = || io::Error::new(io::ErrorKind::NotFound, format!("no link named {name:?}"));
        // SAFETY: ifreq is plain C data; all-zero is a valid value.
        let mut req: libc::ifreq = unsafe { zeroed() };
        // The name must leave room for its terminating NUL, which zeroed() put there.
        if name.is_empty() || name.len() >= req.ifr_name.len() || name.contains('\0') {
            return Err(no_such());
        }
        for (c, &b) in req.ifr_name.iter_mut().zip(name.as_bytes()) {
            *c = b as libc::c_char;
        }
        // SAFETY: `req` is a live ifreq, which is what both requests read and write.
        let r = unsafe { libc::ioctl(self.0.as_raw_fd(), request, &mut req as *mut libc::ifreq) };
        if r < 0 {
            let e = io::Error::last_os_error();
            return Err(if e.raw_os_error() == Some(libc::ENODEV) {
                no_such()
            } else {
                e
            });
        }
        Ok(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Loopback is index 1 in every network namespace, and has no MAC.
    #[test]
    fn loopback_has_an_index_and_no_mac() {
        assert_eq!(
            Link::by_name("lo").unwrap(),
            Link {
                index: 1,
                mac: None
            }
        );
    }

    #[test]
    fn an_unknown_name_is_not_found_by_name() {
        for name in ["nosuch0", "", "a-name-longer-than-ifnamsiz"] {
            let e = Link::by_name(name).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::NotFound, "{name:?}: {e}");
            assert_eq!(e.to_string(), format!("no link named {name:?}"));
        }
    }
}
