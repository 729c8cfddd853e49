//! Guest ports: persistent tap devices carrying a `virtio_net_hdr` per frame.
//!
//! `IFF_VNET_HDR` plus `TUNSETOFFLOAD(CSUM|TSO4|TSO6)` lets the guest's
//! kernel hand us unsegmented TCP buffers (up to 64 KiB) with a partial
//! checksum, and lets us hand it coalesced ones: that is what makes tunneled
//! TSO possible. The device is persistent (`TUNSETPERSIST`) so a daemon
//! restart keeps the guest's link and addresses; [`TapPort::attach`] picks it
//! up again.

use std::fs::{File, OpenOptions};
use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;

use wire::vnet::{VnetHdr, VNET_HDR_LEN};
use wire::MacAddr;

use crate::netlink::Netlink;
use crate::netns;

/// Largest frame a tap with TSO can hand us: a 64 KiB IP packet plus an
/// Ethernet header with one VLAN tag. [`TapPort::read`] wants a buffer this big.
pub const MAX_TAP_FRAME: usize = 65535 + 18;

/// Most parts [`TapPort::write_gather`] takes for one frame (the kernel's limit,
/// `IOV_MAX`, is 1024).
pub const MAX_GATHER: usize = 256;

/// A tap device opened with `IFF_TAP | IFF_NO_PI | IFF_VNET_HDR`, non-blocking.
#[derive(Debug)]
pub struct TapPort {
    file: File,
    name: String,
}

/// `struct ifreq` as used by TUNSETIFF: name + flags.
#[repr(C)]
struct IfReqFlags {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

fn name_bytes(name: &str) -> io::Result<[u8; libc::IFNAMSIZ]> {
    let b = name.as_bytes();
    if b.is_empty() || b.len() >= libc::IFNAMSIZ || b.contains(&0) || b.contains(&b'/') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "invalid interface name {name:?} (1..{} bytes, no NUL or '/')",
                libc::IFNAMSIZ - 1
            ),
        ));
    }
    let mut out = [0u8; libc::IFNAMSIZ];
    out[..b.len()].copy_from_slice(b);
    Ok(out)
}

fn ioctl_int(
    fd: RawFd,
    req: libc::Ioctl,
    arg: libc::c_ulong,
    what: &str,
    name: &str,
) -> io::Result<()> {
    // SAFETY: the tun ioctls used here take their argument by value (an int
    // or flag word), not as a pointer.
    if unsafe { libc::ioctl(fd, req, arg) } < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("{what} on tap {name:?}: {e}"),
        ));
    }
    Ok(())
}

/// One `writev` of a frame in at most [`MAX_GATHER`] parts to `fd` (a tap, or a
/// bound packet socket: both take one frame per write), retried on EINTR.
pub(crate) fn writev_all(fd: RawFd, parts: &[IoSlice<'_>]) -> io::Result<()> {
    if parts.len() > MAX_GATHER {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} parts, at most {MAX_GATHER} per frame", parts.len()),
        ));
    }
    loop {
        // SAFETY: IoSlice is ABI-compatible with iovec on Unix (std guarantees
        // it); every slice is live for the call, which only reads them, and
        // the count is at most MAX_GATHER <= IOV_MAX.
        let n = unsafe {
            libc::writev(
                fd,
                parts.as_ptr().cast::<libc::iovec>(),
                parts.len() as libc::c_int,
            )
        };
        if n >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// One read of (vnet header, frame) by `read`, which reads into the header it is
/// given and the caller's buffer and returns the byte count, or the error:
/// retried on EINTR, `None` on EAGAIN, the header and the frame's length
/// otherwise. `what` names the device in errors.
pub(crate) fn read_vnet(
    what: &str,
    mut read: impl FnMut(&mut [u8; VNET_HDR_LEN]) -> io::Result<usize>,
) -> io::Result<Option<(VnetHdr, usize)>> {
    let mut hdr = [0u8; VNET_HDR_LEN];
    loop {
        match read(&mut hdr) {
            Ok(n) => {
                let Some(len) = n.checked_sub(VNET_HDR_LEN) else {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("{what}: {n} bytes, shorter than the vnet header"),
                    ));
                };
                let vnet = VnetHdr::from_bytes(&hdr).ok_or_else(|| {
                    io::Error::new(io::ErrorKind::InvalidData, "vnet header did not parse")
                })?;
                return Ok(Some((vnet, len)));
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) => return Err(e),
        }
    }
}

/// Opens /dev/net/tun, non-blocking, and binds it to tap `name` with `flags`
/// (`IFF_*`), creating the tap if absent.
pub(crate) fn open_tun(name: &str, flags: libc::c_int) -> io::Result<File> {
    let ifname = name_bytes(name)?;
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open("/dev/net/tun")
        .map_err(|e| io::Error::new(e.kind(), format!("open /dev/net/tun: {e}")))?;
    let mut req = IfReqFlags {
        name: ifname,
        flags: flags as libc::c_short,
        _pad: [0; 22],
    };
    // SAFETY: TUNSETIFF reads and writes a struct ifreq; IfReqFlags has
    // its layout (16-byte name, then the flags union member, 40 bytes total).
    if unsafe {
        libc::ioctl(
            file.as_raw_fd(),
            libc::TUNSETIFF,
            &mut req as *mut IfReqFlags,
        )
    } < 0
    {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("TUNSETIFF tap {name:?}: {e}"),
        ));
    }
    Ok(file)
}

impl TapPort {
    /// Opens /dev/net/tun and binds it to tap `name`, creating it if absent.
    fn open(name: &str) -> io::Result<TapPort> {
        let file = open_tun(name, libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR)?;
        let fd = file.as_raw_fd();
        let hdr_len: libc::c_int = VNET_HDR_LEN as libc::c_int;
        // SAFETY: TUNSETVNETHDRSZ reads an int through the pointer.
        if unsafe { libc::ioctl(fd, libc::TUNSETVNETHDRSZ, &hdr_len as *const libc::c_int) } < 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!("TUNSETVNETHDRSZ on tap {name:?}: {e}"),
            ));
        }
        let offloads = libc::TUN_F_CSUM | libc::TUN_F_TSO4 | libc::TUN_F_TSO6;
        ioctl_int(
            fd,
            libc::TUNSETOFFLOAD,
            libc::c_ulong::from(offloads),
            "TUNSETOFFLOAD",
            name,
        )?;
        Ok(TapPort {
            file,
            name: name.to_string(),
        })
    }

    /// Creates (or takes over) persistent tap `name` in the calling thread's
    /// network namespace, sets its MAC and brings it up.
    ///
    /// `mac` is the guest-facing device's own address as the guest sees it
    /// (the guest's NIC MAC).
    pub fn create(name: &str, mac: MacAddr) -> io::Result<TapPort> {
        let tap = Self::open(name)?;
        ioctl_int(
            tap.file.as_raw_fd(),
            libc::TUNSETPERSIST,
            1,
            "TUNSETPERSIST",
            name,
        )?;
        let mut nl = Netlink::open()?;
        let link = nl.link_by_name(name)?;
        nl.set_mac(link.ifindex, mac)
            .map_err(|e| io::Error::new(e.kind(), format!("set MAC {mac} on tap {name:?}: {e}")))?;
        nl.set_up(link.ifindex, true)?;
        Ok(tap)
    }

    /// Reattaches to an existing persistent tap (after a daemon restart).
    ///
    /// The tap must be visible in the calling thread's namespace; for a tap
    /// already moved into a guest namespace use [`TapPort::attach_in_netns`].
    /// Fails with `NotFound` rather than creating a new device.
    pub fn attach(name: &str) -> io::Result<TapPort> {
        Netlink::open()?.link_by_name(name)?;
        Self::open(name)
    }

    /// [`TapPort::attach`] for a tap living in network namespace `netns_name`.
    /// The returned fd works from any namespace.
    pub fn attach_in_netns(netns_name: &str, name: &str) -> io::Result<TapPort> {
        let name = name.to_string();
        netns::run_in_netns(netns_name, move || TapPort::attach(&name))?
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The tap's fd, for poll/epoll.
    pub fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// Sets the tap's MTU (call before [`TapPort::move_to_netns`], or from the
    /// guest's namespace afterwards).
    pub fn set_mtu(&self, mtu: u32) -> io::Result<()> {
        let mut nl = Netlink::open()?;
        let link = nl.link_by_name(&self.name)?;
        nl.set_mtu(link.ifindex, mtu)
    }

    /// Moves the tap into network namespace `netns_name` and brings it up
    /// there (a move takes the link down). The fd keeps working.
    pub fn move_to_netns(&self, netns_name: &str) -> io::Result<()> {
        let ns = netns::open_netns(netns_name)?;
        let mut nl = Netlink::open()?;
        let link = nl.link_by_name(&self.name)?;
        nl.move_to_netns(link.ifindex, ns.as_raw_fd())
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("move tap {:?} to netns {netns_name:?}: {e}", self.name),
                )
            })?;
        let name = self.name.clone();
        netns::run_in_netns(netns_name, move || -> io::Result<()> {
            let mut nl = Netlink::open()?;
            let link = nl.link_by_name(&name)?;
            nl.set_up(link.ifindex, true)
        })?
    }

    /// Reads one frame sent by the guest into `buf` (which should be
    /// [`MAX_TAP_FRAME`] bytes: a shorter buffer is refused rather than
    /// silently truncating GSO buffers). `Ok(None)` when nothing is queued.
    pub fn read(&mut self, buf: &mut [u8]) -> io::Result<Option<(VnetHdr, usize)>> {
        if buf.len() < MAX_TAP_FRAME {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "tap read buffer of {} bytes, need {MAX_TAP_FRAME}",
                    buf.len()
                ),
            ));
        }
        let fd = self.file.as_raw_fd();
        read_vnet(&format!("tap {:?}", self.name), |hdr| {
            let iov = [
                libc::iovec {
                    iov_base: hdr.as_mut_ptr().cast(),
                    iov_len: hdr.len(),
                },
                libc::iovec {
                    iov_base: buf.as_mut_ptr().cast(),
                    iov_len: buf.len(),
                },
            ];
            // SAFETY: both iovecs point to live, writable buffers of the stated
            // lengths, exclusively borrowed for the call.
            let n = unsafe { libc::readv(fd, iov.as_ptr(), 2) };
            usize::try_from(n).map_err(|_| io::Error::last_os_error())
        })
    }

    /// Writes one frame to the guest with its vnet header (one `writev`, no copy).
    /// [`GuestFault::of`] says what an error means for the tap.
    pub fn write(&self, vnet: &VnetHdr, frame: &[u8]) -> io::Result<()> {
        let hdr = vnet.to_bytes();
        self.write_gather(&[IoSlice::new(&hdr), IoSlice::new(frame)])
    }

    /// Writes one frame to the guest from pieces: `parts[0]` is its vnet header
    /// ([`VnetHdr::to_bytes`]), the rest the frame in order — synthesized headers
    /// and payload gathered from wherever it was received. One `writev`: the kernel
    /// copies each piece once, into the guest's buffer. At most [`MAX_GATHER`]
    /// parts.
    pub fn write_gather(&self, parts: &[IoSlice<'_>]) -> io::Result<()> {
        writev_all(self.file.as_raw_fd(), parts)
    }

    /// Clears the persistent flag and closes the fd, which destroys the device
    /// (wherever it lives now).
    pub fn destroy(self) -> io::Result<()> {
        ioctl_int(
            self.file.as_raw_fd(),
            libc::TUNSETPERSIST,
            0,
            "TUNSETPERSIST 0",
            &self.name,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guest::{GuestFault, GuestPort};
    use crate::testnet::{address_guest, guest_tso_buffer, Netns, GUEST, GUEST_MAC, GW, GW_MAC};
    use etherparse::PacketBuilder;
    use std::net::UdpSocket;
    use std::time::{Duration, Instant};

    /// A tap created in `host`, moved into `guest`, addressed there as
    /// fd01::2 with a permanent neighbour fd01::1 -> GW_MAC.
    fn guest_tap(host: &Netns, guest: &Netns) -> TapPort {
        let gname = guest.name.clone();
        let tap = host.run(move || {
            let tap = TapPort::create("dpt0", MacAddr(GUEST_MAC)).expect("create tap");
            tap.set_mtu(1500).unwrap();
            tap.move_to_netns(&gname).expect("move tap");
            tap
        });
        address_guest(guest, "dpt0");
        let link = guest.run(|| Netlink::open().unwrap().link_by_name("dpt0").unwrap());
        assert_eq!(link.mac, Some(MacAddr(GUEST_MAC)));
        assert_eq!(link.mtu, 1500);
        assert!(link.up, "tap up after the move");
        tap
    }

    /// A frame written with a vnet header reaches a UDP socket in the guest.
    #[test]
    fn write_reaches_guest_and_link_down_is_eio() {
        let (host, guest) = (Netns::new(), Netns::new());
        let tap = guest_tap(&host, &guest);
        let rx = guest.run(|| {
            let s = UdpSocket::bind("[fd01::2]:7777").unwrap();
            s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
            s
        });
        let mut frame = Vec::new();
        PacketBuilder::ethernet2(GW_MAC, GUEST_MAC)
            .ipv6(GW, GUEST, 64)
            .udp(5555, 7777)
            .write(&mut frame, b"hello guest")
            .unwrap();
        tap.write(&VnetHdr::default(), &frame).expect("tap write");
        let mut buf = [0u8; 64];
        let (n, from) = rx.recv_from(&mut buf).expect("guest received the datagram");
        assert_eq!(&buf[..n], b"hello guest");
        assert_eq!(from.port(), 5555);

        guest.ip(&["link", "set", "dpt0", "down"]);
        let e = tap
            .write(&VnetHdr::default(), &frame)
            .expect_err("write to a downed tap");
        assert_eq!(
            GuestFault::of(&e),
            GuestFault::LinkDown,
            "EIO expected, got {e}"
        );
        tap.destroy().unwrap();
        assert!(
            guest
                .run(|| Netlink::open().unwrap().link_by_name("dpt0"))
                .is_err(),
            "destroyed"
        );
    }

    /// Frames the guest sends faster than the tap is read are dropped by the tap's
    /// queue, and its `tx_dropped` (what `stats` reports per port) counts them.
    #[test]
    fn an_unread_tap_counts_what_its_queue_drops() {
        let (host, guest) = (Netns::new(), Netns::new());
        let tap = guest_tap(&host, &guest);
        let queue = guest.run(|| {
            let s = UdpSocket::bind("[fd01::2]:0").unwrap();
            // The tap's queue holds tx_queue_len (1000) frames; the rest are dropped.
            for _ in 0..3000 {
                let _ = s.send_to(b"x", "[fd01::1]:9");
            }
            Netlink::open().unwrap().link_by_name("dpt0").unwrap()
        });
        assert!(
            queue.tx_dropped >= 1000,
            "tx_dropped {} after 3000 frames into a 1000-frame queue",
            queue.tx_dropped
        );
        drop(tap);
    }

    /// TCP from the guest arrives as a TSO buffer (see [`guest_tso_buffer`]).
    #[test]
    fn guest_tcp_arrives_as_tso_buffer() {
        let (host, guest) = (Netns::new(), Netns::new());
        let mut port = GuestPort::Tap(guest_tap(&host, &guest));
        guest_tso_buffer(&mut port, &guest);
        port.release().unwrap();
    }

    /// Deleting the guest's namespace deletes the tap in it: epoll reports the
    /// fd gone, and reads (once the frames already queued are read) and writes
    /// on it fail as [`GuestFault::Gone`].
    #[test]
    fn tap_deleted_with_its_namespace_is_gone() {
        let (host, guest) = (Netns::new(), Netns::new());
        let mut tap = guest_tap(&host, &guest);
        let mut ep = crate::poll::Epoll::new().unwrap();
        ep.add(tap.as_raw_fd(), 7).unwrap();
        let gone = |ep: &mut crate::poll::Epoll| {
            ep.wait(Duration::ZERO)
                .unwrap()
                .any(|r| r.token == 7 && r.gone)
        };
        assert!(!gone(&mut ep), "a live tap is not gone");
        drop(guest);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !gone(&mut ep) {
            assert!(
                Instant::now() < deadline,
                "epoll never reported the tap gone"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        // Frames the guest's stack queued before its namespace went (an MLD
        // report, a router solicitation) may still be read, and until the
        // kernel has finished detaching the device a read may find nothing
        // (seen once in CI, right after epoll said "gone"); then reads fail.
        let mut buf = vec![0u8; MAX_TAP_FRAME];
        let mut queued = 0;
        let e = loop {
            match tap.read(&mut buf) {
                Ok(Some(_)) if queued < 64 => queued += 1,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Ok(frame) => panic!("read from a deleted tap after {queued} queued: {frame:?}"),
                Err(e) => break e,
            }
        };
        assert_eq!(GuestFault::of(&e), GuestFault::Gone, "{e}");
        let e = tap
            .write(&VnetHdr::default(), &[0u8; 60])
            .expect_err("write to a deleted tap");
        assert_eq!(GuestFault::of(&e), GuestFault::Gone, "{e}");
    }

    /// A persistent tap survives its fd and can be attached again by name.
    #[test]
    fn persistent_tap_reattaches() {
        let host = Netns::new();
        let ok = host.run(|| {
            let tap = TapPort::create("dpt1", MacAddr(GUEST_MAC)).unwrap();
            drop(tap);
            assert!(
                Netlink::open().unwrap().link_by_name("dpt1").is_ok(),
                "persistent"
            );
            let again = TapPort::attach("dpt1").expect("reattach");
            assert_eq!(again.name(), "dpt1");
            again.destroy().unwrap();
            let missing = TapPort::attach("dpt1").expect_err("gone after destroy");
            missing.kind() == io::ErrorKind::NotFound
        });
        assert!(ok);
        assert!(TapPort::create("bad/name", MacAddr(GUEST_MAC)).is_err());
        assert!(TapPort::create("a-name-far-too-long", MacAddr(GUEST_MAC)).is_err());
    }
}
