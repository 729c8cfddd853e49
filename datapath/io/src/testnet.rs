//! Test scaffolding: throwaway network namespaces, veth pairs and AF_PACKET
//! sockets. Everything created here is removed by a Drop guard, also when
//! the test fails.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::guest::GuestPort;
use crate::netns::run_in_netns;
use crate::tap::MAX_TAP_FRAME;
use etherparse::{PacketBuilder, SlicedPacket, TransportSlice};
use std::net::TcpStream;
use wire::vnet::{VnetHdr, GSO_TCPV6};

/// These tests create namespaces and attach XDP programs: they need root.
/// They fail loudly rather than skip, because CI runs them as root.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "this test needs root (network namespaces, XDP, taps); CI runs it as root"
    );
}

fn run(cmd: &[&str]) {
    let out = Command::new(cmd[0])
        .args(&cmd[1..])
        .output()
        .expect("spawn command");
    assert!(
        out.status.success(),
        "{:?} failed: {}{}",
        cmd,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A network namespace named `dpio-test-<pid>-<n>`, deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new() -> Netns {
        require_root();
        let name = format!(
            "dpio-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        run(&["ip", "netns", "add", &name]);
        let ns = Netns { name };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    /// `ip -n NAME ARGS...`, asserting success.
    pub fn ip(&self, args: &[&str]) {
        let mut cmd = vec!["ip", "-n", &self.name];
        cmd.extend_from_slice(args);
        run(&cmd);
    }

    /// Waits (up to 5 s) until `dev` is operationally up. The kernel swaps the
    /// link's drop-everything qdisc for a real one only then (`dev_activate`,
    /// from linkwatch, late on a busy machine): a frame written to a link just
    /// brought up can vanish.
    pub fn wait_oper_up(&self, dev: &str) {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let out = Command::new("ip")
                .args(["-n", &self.name, "-o", "link", "show", dev])
                .output()
                .expect("spawn ip");
            if String::from_utf8_lossy(&out.stdout).contains("state UP") {
                return;
            }
            assert!(Instant::now() < deadline, "{dev} never came up");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Runs `f` on a thread inside the namespace.
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        run_in_netns(&self.name, f).expect("enter test namespace")
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

pub const MAC_A: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0a];
pub const MAC_B: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0b];

fn mac_str(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Two namespaces joined by veth `va` (in `a`, fd00::a/64) <-> `vb` (in `b`,
/// fd00::b/64), both MTU `mtu` and up, with fixed MACs [`MAC_A`]/[`MAC_B`].
pub struct VethPair {
    pub a: Netns,
    pub b: Netns,
}

impl VethPair {
    pub fn new(mtu: u32) -> VethPair {
        Self::with_queues(mtu, 1)
    }

    /// As [`VethPair::new`] with `queues` rx and tx queues on both ends.
    pub fn with_queues(mtu: u32, queues: u32) -> VethPair {
        let a = Netns::new();
        let b = Netns::new();
        let q = queues.to_string();
        #[rustfmt::skip]
        a.ip(&[
            "link", "add", "va", "numrxqueues", &q, "numtxqueues", &q, "type", "veth",
            "peer", "name", "vb", "numrxqueues", &q, "numtxqueues", &q, "netns", &b.name,
        ]);
        let mtu = mtu.to_string();
        for (ns, dev, mac, addr) in [
            (&a, "va", MAC_A, "fd00::a/64"),
            (&b, "vb", MAC_B, "fd00::b/64"),
        ] {
            ns.ip(&[
                "link",
                "set",
                dev,
                "address",
                &mac_str(mac),
                "mtu",
                &mtu,
                "up",
            ]);
            ns.ip(&["-6", "addr", "add", addr, "dev", dev, "nodad"]);
        }
        VethPair { a, b }
    }
}

/// An AF_PACKET socket bound to one interface (of the namespace it was opened in).
pub struct PacketSocket {
    fd: OwnedFd,
    ifindex: i32,
}

impl PacketSocket {
    /// Opens the socket in the calling thread's namespace.
    pub fn open(ifname: &str) -> io::Result<PacketSocket> {
        let cname = std::ffi::CString::new(ifname).expect("ifname");
        // SAFETY: valid NUL-terminated string.
        let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) } as i32;
        if ifindex == 0 {
            return Err(io::Error::last_os_error());
        }
        let proto = (libc::ETH_P_ALL as u16).to_be();
        // SAFETY: plain socket call.
        let fd = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                i32::from(proto),
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fresh fd we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: sockaddr_ll is plain data.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = proto;
        sll.sll_ifindex = ifindex;
        // SAFETY: sll is a valid sockaddr_ll of the stated size.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(PacketSocket { fd, ifindex })
    }

    pub fn send(&self, frame: &[u8]) {
        // SAFETY: sockaddr_ll is plain data.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_ifindex = self.ifindex;
        sll.sll_halen = 6;
        // SAFETY: frame and sll are valid for the lengths given.
        let n = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                0,
                (&sll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        assert_eq!(
            n,
            frame.len() as isize,
            "AF_PACKET send: {}",
            io::Error::last_os_error()
        );
    }

    /// Receives incoming (not our own outgoing) frames until `pred` accepts
    /// one or `timeout` passes.
    pub fn recv_matching(
        &self,
        timeout: Duration,
        pred: impl Fn(&[u8]) -> bool,
    ) -> Option<Vec<u8>> {
        let deadline = Instant::now() + timeout;
        let mut buf = vec![0u8; 70000];
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            let mut pfd = libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            if unsafe { libc::poll(&mut pfd, 1, left.as_millis() as i32 + 1) } <= 0 {
                continue;
            }
            // SAFETY: sockaddr_ll is plain data.
            let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            let mut sl = std::mem::size_of::<libc::sockaddr_ll>() as u32;
            // SAFETY: buf and sll are valid for writes of their lengths.
            let n = unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                    (&mut sll as *mut libc::sockaddr_ll).cast(),
                    &mut sl,
                )
            };
            if n <= 0 || sll.sll_pkttype == libc::PACKET_OUTGOING {
                continue;
            }
            let frame = &buf[..n as usize];
            if pred(frame) {
                return Some(frame.to_vec());
            }
        }
        None
    }
}

/// A guest's MAC and fd01::2, and its gateway's MAC and fd01::1, for tests of a
/// guest port (tap or attached interface) with the guest in a namespace.
pub const GUEST_MAC: [u8; 6] = [0x02, 0x08, 0x20, 0, 0, 0x02];
pub const GW_MAC: [u8; 6] = [0x02, 0x08, 0x20, 0, 0, 0x01];
pub const GUEST: [u8; 16] = [0xfd, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
pub const GW: [u8; 16] = [0xfd, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];

/// Addresses the guest's interface `dev` in `guest` as fd01::2/64 with a permanent
/// neighbour fd01::1 -> [`GW_MAC`].
pub fn address_guest(guest: &Netns, dev: &str) {
    guest.ip(&["-6", "addr", "add", "fd01::2/64", "dev", dev, "nodad"]);
    guest.ip(&[
        "-6",
        "neigh",
        "add",
        "fd01::1",
        "lladdr",
        &mac_str(GW_MAC),
        "dev",
        dev,
        "nud",
        "permanent",
    ]);
}

/// The first frame from the guest `port` matching `pred`, read for up to 5 s.
pub fn read_until(
    port: &mut GuestPort,
    pred: impl Fn(&VnetHdr, &[u8]) -> bool,
) -> (VnetHdr, Vec<u8>) {
    let mut buf = vec![0u8; MAX_TAP_FRAME];
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        match port.read(&mut buf).expect("guest port read") {
            Some((vnet, n)) if pred(&vnet, &buf[..n]) => return (vnet, buf[..n].to_vec()),
            Some(_) => {}
            None => std::thread::sleep(Duration::from_millis(5)),
        }
    }
    panic!("no matching frame from the guest port within 5 s");
}

/// A TCP connection from the guest (addressed by [`address_guest`]) to fd01::1,
/// answered by hand through `port`, and the first TSO buffer the guest then sends:
/// asserted to be `GSO_TCPV6` with a `gso_size` no larger than the MSS, longer
/// than one MTU, with a partial checksum at 54/16.
pub fn guest_tso_buffer(port: &mut GuestPort, guest: &Netns) -> (VnetHdr, Vec<u8>) {
    let sender = std::thread::spawn({
        let name = guest.name.clone();
        move || {
            run_in_netns(&name, || {
                use std::io::Write;
                let addr = "[fd01::1]:8080".parse().unwrap();
                let mut s =
                    TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("handshake");
                s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
                let _ = s.write_all(&vec![0x5a; 60000]);
                std::thread::sleep(Duration::from_millis(500));
            })
            .unwrap();
        }
    });
    let is_syn = |_: &VnetHdr, f: &[u8]| matches!(SlicedPacket::from_ethernet(f), Ok(SlicedPacket { transport: Some(TransportSlice::Tcp(t)), .. }) if t.syn() && t.destination_port() == 8080);
    let (_, syn) = read_until(port, is_syn);
    let Ok(SlicedPacket {
        transport: Some(TransportSlice::Tcp(t)),
        ..
    }) = SlicedPacket::from_ethernet(&syn)
    else {
        unreachable!("matched above")
    };
    let mut synack = Vec::new();
    PacketBuilder::ethernet2(GW_MAC, GUEST_MAC)
        .ipv6(GW, GUEST, 64)
        .tcp(8080, t.source_port(), 1000, 65535)
        .syn()
        .ack(t.sequence_number().wrapping_add(1))
        .options(&[
            etherparse::TcpOptionElement::MaximumSegmentSize(1440),
            etherparse::TcpOptionElement::WindowScale(7),
        ])
        .unwrap()
        .write(&mut synack, &[])
        .unwrap();
    port.write(&VnetHdr::default(), &synack).unwrap();
    let (vnet, frame) = read_until(port, |v, _| v.is_gso());
    assert_eq!(vnet.gso_kind(), GSO_TCPV6);
    assert!(
        vnet.gso_size > 0 && vnet.gso_size <= 1440,
        "gso_size {}",
        vnet.gso_size
    );
    assert!(
        frame.len() > 1514,
        "a TSO buffer is longer than one MTU: {}",
        frame.len()
    );
    assert!(vnet.needs_csum(), "TSO buffers carry a partial checksum");
    assert_eq!(vnet.csum_start, 14 + 40);
    assert_eq!(vnet.csum_offset, 16);
    sender.join().unwrap();
    (vnet, frame)
}
