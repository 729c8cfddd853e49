//! A raw ICMPv6 socket on one interface ([`Icmp6Socket`]), and what a host needs to
//! know of that interface to speak Neighbor Discovery on it ([`Link`]): what
//! `xdeadm ra listen` solicits and receives Router Advertisements with, from inside
//! a guest.
//!
//! A crate of its own rather than a module of the daemon's I/O layer (`dpio`), so
//! the admin tool links neither that layer nor what it pulls in (aya, vhost-user):
//! inside a guest this socket is all it needs. Every `unsafe` block is a syscall or
//! a read of what the kernel wrote, and says why it holds in a `// SAFETY:` comment.

// A raw socket and interface ioctls without a safe wrapper in std: each `unsafe`
// block carries its `// SAFETY:` line.
#![allow(unsafe_code)]

mod link;

pub use link::Link;

use std::io;
use std::mem::{size_of, zeroed};
use std::net::Ipv6Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// What one `recvmsg` on the raw socket yielded.
pub struct Received {
    pub len: usize,
    pub source: Ipv6Addr,
    pub destination: Option<Ipv6Addr>,
    pub ifindex: Option<u32>,
    pub hop_limit: Option<u8>,
}

/// A raw ICMPv6 socket bound to one interface, passing only the ICMPv6 types it was
/// opened for, with hop limit 255 on what it sends (as NDP requires).
pub struct Icmp6Socket {
    fd: OwnedFd,
}

/// `ICMP6_FILTER` from <netinet/icmp6.h> (not in the libc crate).
const ICMP6_FILTER: libc::c_int = 1;

impl Icmp6Socket {
    /// Opens the socket on `iface` (index `ifindex`), receiving ICMPv6 messages of
    /// the types in `pass` only.
    pub fn open(iface: &str, ifindex: u32, pass: &[u8]) -> io::Result<Icmp6Socket> {
        // SAFETY: socket(2) with constant arguments; the result is checked.
        let fd = unsafe {
            libc::socket(
                libc::AF_INET6,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::IPPROTO_ICMPV6,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let s = Icmp6Socket { fd };
        // Block every ICMPv6 type, then pass those asked for (bit set = blocked).
        let mut filter = [u32::MAX; 8];
        for &t in pass {
            let t = usize::from(t);
            filter[t >> 5] &= !(1u32 << (t & 31));
        }
        s.setsockopt(libc::IPPROTO_ICMPV6, ICMP6_FILTER, &filter)?;
        let hops: libc::c_int = 255;
        s.setsockopt(libc::IPPROTO_IPV6, libc::IPV6_MULTICAST_HOPS, &hops)?;
        s.setsockopt(libc::IPPROTO_IPV6, libc::IPV6_UNICAST_HOPS, &hops)?;
        let idx = ifindex as libc::c_int;
        s.setsockopt(libc::IPPROTO_IPV6, libc::IPV6_MULTICAST_IF, &idx)?;
        let on: libc::c_int = 1;
        s.setsockopt(libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO, &on)?;
        s.setsockopt(libc::IPPROTO_IPV6, libc::IPV6_RECVHOPLIMIT, &on)?;
        let name = iface.as_bytes();
        // SAFETY: SO_BINDTODEVICE reads `name.len()` bytes from the pointer.
        let r = unsafe {
            libc::setsockopt(
                s.fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_BINDTODEVICE,
                name.as_ptr().cast(),
                name.len() as libc::socklen_t,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(s)
    }

    fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    fn setsockopt<T>(&self, level: libc::c_int, name: libc::c_int, v: &T) -> io::Result<()> {
        // SAFETY: `v` is a live value of the size passed; setsockopt only reads it.
        let r = unsafe {
            libc::setsockopt(
                self.raw(),
                level,
                name,
                (v as *const T).cast(),
                size_of::<T>() as libc::socklen_t,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(e.kind(), format!("setsockopt {name}: {e}")));
        }
        Ok(())
    }

    /// Sends one ICMPv6 message (the kernel fills in the checksum) to `dst`.
    pub fn send_to(&self, msg_bytes: &[u8], dst: Ipv6Addr, ifindex: u32) -> io::Result<()> {
        // SAFETY: sockaddr_in6 is plain data; all-zero is a valid value.
        let mut sa: libc::sockaddr_in6 = unsafe { zeroed() };
        sa.sin6_family = libc::AF_INET6 as libc::sa_family_t;
        sa.sin6_addr.s6_addr = dst.octets();
        sa.sin6_scope_id = ifindex;
        // SAFETY: the buffer and address are live for the call, with their sizes.
        let n = unsafe {
            libc::sendto(
                self.raw(),
                msg_bytes.as_ptr().cast(),
                msg_bytes.len(),
                0,
                (&sa as *const libc::sockaddr_in6).cast(),
                size_of::<libc::sockaddr_in6>() as libc::socklen_t,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Waits up to `wait` for one message; `None` on timeout or interruption.
    pub fn recv(&self, buf: &mut [u8], wait: Duration) -> io::Result<Option<Received>> {
        let mut pfd = libc::pollfd {
            fd: self.raw(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = wait.as_millis().clamp(1, i32::MAX as u128) as libc::c_int;
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, ms) };
        if r < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted {
                Ok(None)
            } else {
                Err(e)
            };
        }
        if r == 0 {
            return Ok(None);
        }
        // SAFETY: plain C structs; all-zero is valid.
        let mut sa: libc::sockaddr_in6 = unsafe { zeroed() };
        // Room for IPV6_PKTINFO and IPV6_HOPLIMIT control messages, 8-byte aligned.
        let mut cbuf = [0u64; 16];
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: all-zero msghdr is valid; fields are set below.
        let mut mh: libc::msghdr = unsafe { zeroed() };
        mh.msg_name = (&mut sa as *mut libc::sockaddr_in6).cast();
        mh.msg_namelen = size_of::<libc::sockaddr_in6>() as libc::socklen_t;
        mh.msg_iov = &mut iov;
        mh.msg_iovlen = 1;
        mh.msg_control = cbuf.as_mut_ptr().cast();
        mh.msg_controllen = size_of::<[u64; 16]>();
        // SAFETY: every pointer in `mh` refers to a live buffer of the stated size.
        let n = unsafe { libc::recvmsg(self.raw(), &mut mh, libc::MSG_DONTWAIT) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock => Ok(None),
                _ => Err(e),
            };
        }
        let mut rx = Received {
            len: (n as usize).min(buf.len()),
            source: Ipv6Addr::from(sa.sin6_addr.s6_addr),
            destination: None,
            ifindex: None,
            hop_limit: None,
        };
        // SAFETY: the CMSG_* walk stays within msg_controllen as the kernel set it;
        // each payload is read unaligned after checking its length.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&mh);
            while !c.is_null() {
                let data = libc::CMSG_DATA(c);
                let len = (*c).cmsg_len as usize;
                let have = len.saturating_sub(libc::CMSG_LEN(0) as usize);
                if (*c).cmsg_level == libc::IPPROTO_IPV6 {
                    if (*c).cmsg_type == libc::IPV6_PKTINFO
                        && have >= size_of::<libc::in6_pktinfo>()
                    {
                        let pi: libc::in6_pktinfo = std::ptr::read_unaligned(data.cast());
                        rx.destination = Some(Ipv6Addr::from(pi.ipi6_addr.s6_addr));
                        rx.ifindex = Some(pi.ipi6_ifindex);
                    } else if (*c).cmsg_type == libc::IPV6_HOPLIMIT
                        && have >= size_of::<libc::c_int>()
                    {
                        let h: libc::c_int = std::ptr::read_unaligned(data.cast());
                        rx.hop_limit = u8::try_from(h).ok();
                    }
                }
                c = libc::CMSG_NXTHDR(&mh, c);
            }
        }
        Ok(Some(rx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo request to ::1 on loopback comes back through the filter with the
    /// addresses, interface and hop limit the control messages carry; the kernel's
    /// echo reply is filtered out. Needs root or CAP_NET_RAW (CI runs it as root).
    #[test]
    fn loopback_echo_through_the_filter() {
        const ECHO_REQUEST: u8 = 128;
        let lo = Link::by_name("lo").unwrap();
        let sock = Icmp6Socket::open("lo", lo.index, &[ECHO_REQUEST])
            .unwrap_or_else(|e| panic!("raw ICMPv6 socket (needs root or CAP_NET_RAW): {e}"));
        let echo = [ECHO_REQUEST, 0, 0, 0, 0x12, 0x34, 0, 1];
        sock.send_to(&echo, Ipv6Addr::LOCALHOST, lo.index).unwrap();
        let mut buf = [0u8; 64];
        let rx = sock
            .recv(&mut buf, Duration::from_secs(2))
            .unwrap()
            .expect("the echo request, within 2 s");
        assert_eq!(buf[..rx.len][0], ECHO_REQUEST);
        assert_eq!(&buf[4..rx.len], &echo[4..]);
        assert_eq!(rx.source, Ipv6Addr::LOCALHOST);
        assert_eq!(rx.destination, Some(Ipv6Addr::LOCALHOST));
        assert_eq!(rx.ifindex, Some(lo.index));
        assert_eq!(rx.hop_limit, Some(255));
        assert!(
            sock.recv(&mut buf, Duration::from_millis(100))
                .unwrap()
                .is_none(),
            "the echo reply passed the filter"
        );
    }
}
