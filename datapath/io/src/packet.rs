//! Ports attached to an interface someone else owns: an `AF_PACKET` socket with
//! `PACKET_VNET_HDR` on the host side of a hypervisor's tap (QEMU, libvirt).
//!
//! The hypervisor holds the tap's fd and the VM's virtio-net device; the daemon
//! reads what the tap's interface receives (every frame the VM sends) and
//! transmits on it (every frame goes to the VM). With `PACKET_VNET_HDR` each
//! frame is preceded by the same `struct virtio_net_hdr` a tap opened with
//! `IFF_VNET_HDR` carries, so the VM's 64 KiB TSO buffers arrive whole with their
//! GSO and partial-checksum metadata, and the datapath hands coalesced buffers to
//! the VM the same way: to the worker an attached port is a tap.
//!
//! No promiscuous mode is needed: a packet socket sees every frame the interface
//! receives whatever its destination MAC (a tap's and a veth's receive side
//! filter nothing; `PACKET_OTHERHOST` frames are delivered to packet sockets).
//! `PACKET_IGNORE_OUTGOING` keeps our own transmissions (and the host stack's
//! own, e.g. its router solicitations) out of what we read.

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use wire::vnet::VnetHdr;

use crate::netlink::Netlink;
use crate::tap::read_vnet;

/// Receive buffer asked for: room for about 60 of the VM's 64 KiB TSO buffers, so
/// a worker busy for a millisecond does not make the kernel drop them (the default,
/// ~200 KiB, holds three).
const RCVBUF: libc::c_int = 4 << 20;

/// A packet socket bound to one interface, non-blocking, reading and writing
/// (`virtio_net_hdr`, frame) like a tap with `IFF_VNET_HDR`.
#[derive(Debug)]
pub struct PacketPort {
    fd: OwnedFd,
    /// The interface's name (as given) and index (as bound).
    name: String,
    ifindex: u32,
}

/// What [`PacketPort::attach`] found and changed on the interface, for the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attached {
    /// The interface's MTU before the attach, when it had to be raised.
    pub mtu_raised_from: Option<u32>,
    /// Whether the interface was down and was brought up.
    pub brought_up: bool,
}

fn setsockopt_int(
    fd: RawFd,
    level: libc::c_int,
    opt: libc::c_int,
    v: libc::c_int,
) -> io::Result<()> {
    // SAFETY: setsockopt reads size_of::<c_int>() bytes from a live c_int.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// C values any bytes leave valid: what [`getsockopt_into`] may write.
trait PlainC: Copy {}
impl PlainC for libc::c_int {}
impl PlainC for libc::tpacket_stats {}

/// `getsockopt(fd, level, opt)` into `out`, a plain C value ([`PlainC`]).
fn getsockopt_into<T: PlainC>(
    fd: RawFd,
    level: libc::c_int,
    opt: libc::c_int,
    out: &mut T,
) -> io::Result<()> {
    let mut len = std::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `out`, which is live and
    // exclusively borrowed; T is plain C data (`PlainC`), valid whatever is
    // written, and len is updated in place.
    let r = unsafe { libc::getsockopt(fd, level, opt, (out as *mut T).cast(), &mut len) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `ETH_P_ALL` in network byte order, as `socket` and `sockaddr_ll` take it.
fn eth_p_all() -> u16 {
    (libc::ETH_P_ALL as u16).to_be()
}

impl PacketPort {
    /// Attaches to interface `name` in the calling thread's namespace for a port of
    /// `mtu`: raises the interface's MTU to `mtu` if it is lower (frames above it
    /// would be refused on transmit), brings it up if it is down (as a hypervisor's
    /// ifup script would), and binds a packet socket to it.
    pub fn attach(name: &str, mtu: u32) -> io::Result<(PacketPort, Attached)> {
        let mut nl = Netlink::open()?;
        let link = nl.link_by_name(name).map_err(|e| {
            let what = match e.kind() {
                io::ErrorKind::NotFound => "no such interface".to_string(),
                _ => e.to_string(),
            };
            io::Error::new(e.kind(), format!("interface {name:?}: {what}"))
        })?;
        let mut done = Attached {
            mtu_raised_from: None,
            brought_up: false,
        };
        if link.mtu < mtu {
            nl.set_mtu(link.ifindex, mtu).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("interface {name:?} has MTU {}, below the port's {mtu}, and cannot be raised: {e}", link.mtu),
                )
            })?;
            done.mtu_raised_from = Some(link.mtu);
        }
        if !link.up {
            nl.set_up(link.ifindex, true)
                .map_err(|e| io::Error::new(e.kind(), format!("set interface {name:?} up: {e}")))?;
            done.brought_up = true;
        }
        let port = PacketPort::open(name, link.ifindex)?;
        Ok((port, done))
    }

    /// The socket: `PACKET_VNET_HDR`, `PACKET_IGNORE_OUTGOING`, a large receive
    /// buffer, bound to `ifindex` for every protocol.
    ///
    /// Not `PACKET_QDISC_BYPASS`: the kernel's direct transmit drops a frame that
    /// has to be changed on the way (`__dev_direct_xmit`), and a GSO frame for a
    /// tap whose VM takes no TSO must be segmented by the kernel there. Through
    /// the qdisc it is.
    fn open(name: &str, ifindex: u32) -> io::Result<PacketPort> {
        let ctx = |what: &str, e: io::Error| {
            io::Error::new(e.kind(), format!("{what} on interface {name:?}: {e}"))
        };
        // Protocol 0: the socket takes no frames until `bind` names the interface
        // (and ETH_P_ALL); created with ETH_P_ALL it would queue every interface's
        // frames meanwhile, which `read` would then return as the guest's.
        // SAFETY: socket has no memory preconditions; the fd is checked below.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        };
        if raw < 0 {
            return Err(ctx("AF_PACKET socket", io::Error::last_os_error()));
        }
        // SAFETY: raw is a fresh, valid fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let s = fd.as_raw_fd();
        // The header must be asked for before the socket is bound (the kernel
        // refuses it on a socket with a ring, and we want it from the first frame).
        setsockopt_int(s, libc::SOL_PACKET, libc::PACKET_VNET_HDR, 1)
            .map_err(|e| ctx("PACKET_VNET_HDR", e))?;
        setsockopt_int(s, libc::SOL_PACKET, libc::PACKET_IGNORE_OUTGOING, 1)
            .map_err(|e| ctx("PACKET_IGNORE_OUTGOING", e))?;
        // FORCE goes past net.core.rmem_max (needs CAP_NET_ADMIN, which the daemon
        // has); without it, whatever rmem_max allows.
        if setsockopt_int(s, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, RCVBUF).is_err() {
            setsockopt_int(s, libc::SOL_SOCKET, libc::SO_RCVBUF, RCVBUF)
                .map_err(|e| ctx("SO_RCVBUF", e))?;
        }
        let ifindex_c = libc::c_int::try_from(ifindex).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("ifindex {ifindex} out of range"),
            )
        })?;
        // SAFETY: sockaddr_ll is plain data; all-zero is a valid value.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = eth_p_all();
        sll.sll_ifindex = ifindex_c;
        // SAFETY: bind reads a sockaddr_ll of the size given.
        let r = unsafe {
            libc::bind(
                s,
                (&sll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if r < 0 {
            return Err(ctx("bind", io::Error::last_os_error()));
        }
        let port = PacketPort {
            fd,
            name: name.to_string(),
            ifindex,
        };
        // Binding to an interface that is down records ENETDOWN as the socket's
        // pending error, which epoll reports as an error until it is read: clear
        // it, the socket starts receiving once the interface is up.
        port.take_error();
        Ok(port)
    }

    /// Reads and clears the socket's pending error (`SO_ERROR`), if any.
    fn take_error(&self) -> Option<io::Error> {
        let mut v: libc::c_int = 0;
        let r = getsockopt_into(
            self.fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ERROR,
            &mut v,
        );
        (r.is_ok() && v != 0).then(|| io::Error::from_raw_os_error(v))
    }

    /// The interface's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The index of the interface the socket is bound to.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// The socket's fd, for poll/epoll.
    pub fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Reads one frame the interface received into `buf` (at least
    /// [`crate::tap::MAX_TAP_FRAME`] bytes): its vnet header and its length, or
    /// `None` when there is none. A frame longer than `buf` is an error (it would
    /// be cut short), as is one without a header.
    pub fn read(&self, buf: &mut [u8]) -> io::Result<Option<(VnetHdr, usize)>> {
        let (fd, cap) = (self.fd.as_raw_fd(), buf.len());
        let what = format!("interface {:?}", self.name);
        read_vnet(&what, |hdr| {
            let mut iov = [IoSliceMut::new(hdr), IoSliceMut::new(buf)];
            // SAFETY: msghdr is plain data; all-zero is a valid value (no name, no
            // control data).
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            msg.msg_iov = iov.as_mut_ptr().cast();
            msg.msg_iovlen = iov.len();
            // SAFETY: IoSliceMut is ABI-compatible with iovec; both slices are live
            // and exclusively borrowed for the call, which writes at most their
            // lengths.
            let n = unsafe { libc::recvmsg(fd, &mut msg, 0) };
            let n = usize::try_from(n).map_err(|_| io::Error::last_os_error())?;
            if msg.msg_flags & libc::MSG_TRUNC != 0 {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{what}: a frame longer than {cap} bytes was cut short"),
                ));
            }
            Ok(n)
        })
    }

    /// Transmits one frame on the interface (to the VM) from pieces: `parts[0]` its
    /// vnet header, the rest the frame in order; one `writev` (at most
    /// [`crate::tap::MAX_GATHER`] parts).
    pub fn write_gather(&self, parts: &[IoSlice<'_>]) -> io::Result<()> {
        crate::tap::writev_all(self.fd.as_raw_fd(), parts)
    }

    /// Frames the kernel dropped for want of room in the receive buffer since the
    /// last call (`PACKET_STATISTICS`, which resets on read).
    pub fn take_drops(&self) -> io::Result<u32> {
        let mut st = libc::tpacket_stats {
            tp_packets: 0,
            tp_drops: 0,
        };
        getsockopt_into(
            self.fd.as_raw_fd(),
            libc::SOL_PACKET,
            libc::PACKET_STATISTICS,
            &mut st,
        )?;
        Ok(st.tp_drops)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guest::GuestFault;
    use crate::guest::GuestPort;
    use crate::poll::Epoll;
    use crate::tap::MAX_TAP_FRAME;
    use crate::testnet::{address_guest, guest_tso_buffer, Netns, GUEST, GUEST_MAC, GW, GW_MAC};
    use etherparse::PacketBuilder;
    use std::net::UdpSocket;
    use std::time::{Duration, Instant};

    /// The hypervisor's link, as QEMU with `script=no` leaves it: `hv0` in `host`,
    /// down at MTU 1500, whose far end `vm0` (the VM's NIC) is in `guest` with the
    /// guest's MAC, MTU 9000, up and addressed. A veth keeps TSO on, so the guest
    /// sends GSO buffers as a VM does.
    fn vm_link(host: &Netns, guest: &Netns) {
        #[rustfmt::skip]
        host.ip(&[
            "link", "add", "hv0", "type", "veth", "peer", "name", "vm0", "netns", &guest.name,
            "address", "02:08:20:00:00:02", "mtu", "9000",
        ]);
        guest.ip(&["link", "set", "vm0", "up"]);
        address_guest(guest, "vm0");
    }

    fn attach(host: &Netns) -> io::Result<(PacketPort, Attached)> {
        host.run(|| PacketPort::attach("hv0", 9000))
    }

    /// Attaching raises the interface's MTU to the port's and brings it up; a
    /// jumbo frame written with a vnet header reaches the guest and is not read
    /// back (our own transmission); the guest's TCP arrives as a TSO buffer.
    #[test]
    fn attach_fits_the_link_and_carries_frames_and_tso_both_ways() {
        let (host, guest) = (Netns::new(), Netns::new());
        vm_link(&host, &guest);
        let (port, done) = attach(&host).expect("attach");
        host.wait_oper_up("hv0");
        assert_eq!(
            done,
            Attached {
                mtu_raised_from: Some(1500),
                brought_up: true
            }
        );
        let link = host.run(|| Netlink::open().unwrap().link_by_name("hv0").unwrap());
        assert_eq!((link.mtu, link.up), (9000, true));
        assert_eq!((port.name(), port.ifindex()), ("hv0", link.ifindex));
        let mut port = GuestPort::Attached(port);

        let rx = guest.run(|| {
            let s = UdpSocket::bind("[fd01::2]:7777").unwrap();
            s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
            s
        });
        let payload = vec![0xa5; 8000];
        let mut frame = Vec::new();
        PacketBuilder::ethernet2(GW_MAC, GUEST_MAC)
            .ipv6(GW, GUEST, 64)
            .udp(5555, 7777)
            .write(&mut frame, &payload)
            .unwrap();
        port.write(&VnetHdr::default(), &frame).expect("write");
        let mut got = vec![0u8; 9000];
        let (n, _) = rx
            .recv_from(&mut got)
            .expect("the guest received the datagram");
        assert_eq!(&got[..n], &payload[..]);
        let mut buf = vec![0u8; MAX_TAP_FRAME];
        while let Some((_, n)) = port.read(&mut buf).expect("read") {
            assert_ne!(&buf[..n], &frame[..], "our own frame was read back");
        }
        assert_eq!(port.take_drops().map(Result::unwrap), Some(0));

        guest_tso_buffer(&mut port, &guest);
        port.release().unwrap();
        host.ip(&["link", "show", "hv0"]);
    }

    /// Frames the guest sends faster than the socket is read are dropped by the
    /// kernel once its receive buffer is full, and `take_drops` counts them (once:
    /// reading resets the count).
    #[test]
    fn an_unread_socket_counts_what_it_drops() {
        let (host, guest) = (Netns::new(), Netns::new());
        vm_link(&host, &guest);
        let (port, _) = attach(&host).expect("attach");
        guest.run(|| {
            let s = UdpSocket::bind("[fd01::2]:0").unwrap();
            // 8000 datagrams of 1400 bytes: about 19 MB of buffers for 4 MiB.
            for _ in 0..8000 {
                let _ = s.send_to(&[0u8; 1400], "[fd01::1]:9");
            }
        });
        let dropped = port.take_drops().unwrap();
        assert!(dropped > 1000, "only {dropped} of 8000 frames dropped");
        assert_eq!(port.take_drops().unwrap(), 0, "the count resets on read");
    }

    /// An interface taken down makes epoll report the socket (its pending
    /// ENETDOWN) and writes fail as `LinkDown`; once deleted, writes fail as
    /// `Gone`, and attaching again says there is no such interface.
    #[test]
    fn a_downed_link_is_link_down_and_a_deleted_one_gone() {
        let (host, guest) = (Netns::new(), Netns::new());
        vm_link(&host, &guest);
        let (port, _) = attach(&host).expect("attach");
        let ep = Epoll::new().unwrap();
        ep.add(port.as_raw_fd(), 9).unwrap();
        let mut ep = ep;
        let reported = |ep: &mut Epoll| {
            ep.wait(Duration::ZERO)
                .unwrap()
                .any(|r| r.token == 9 && r.gone)
        };
        assert!(!reported(&mut ep), "a live interface reports nothing");
        host.ip(&["link", "set", "hv0", "down"]);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !reported(&mut ep) {
            assert!(
                Instant::now() < deadline,
                "epoll never reported the link down"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let port = GuestPort::Attached(port);
        let e = port
            .write(&VnetHdr::default(), &[0u8; 60])
            .expect_err("write to a downed link");
        assert_eq!(GuestFault::of(&e), GuestFault::LinkDown, "{e}");
        host.ip(&["link", "del", "hv0"]);
        let e = port
            .write(&VnetHdr::default(), &[0u8; 60])
            .expect_err("write to a deleted link");
        assert_eq!(GuestFault::of(&e), GuestFault::Gone, "{e}");
        let e = attach(&host).expect_err("attach to a deleted link");
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(
            e.to_string()
                .contains("interface \"hv0\": no such interface"),
            "{e}"
        );
    }
}
