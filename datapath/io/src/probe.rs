//! Underlay path probes: ICMPv6 echo requests of a chosen size that the kernel
//! neither fragments nor shrinks, and their replies.
//!
//! Why: the datapath sends 9000-byte underlay frames, and a switch port left at
//! 1500 drops them without a word (a switch port is not a router: no Packet Too
//! Big). An echo of a given size that comes back proves the path carries packets
//! that big both ways; one that does not, at a size where smaller ones do, finds
//! the black hole. `IPV6_MTU_DISCOVER = IPV6_PMTUDISC_PROBE` makes the kernel send
//! each probe at exactly its size, ignoring any path MTU it has cached, and
//! `IPV6_DONTFRAG` keeps it from fragmenting.
//!
//! [`PathProbes`] asks a smaller question of each link of a multipath route:
//! does the path through it forward at all?

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::io;
use std::mem::{size_of, MaybeUninit};
use std::net::Ipv6Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The IPv6 header the kernel puts in front of each probe's ICMPv6 message.
const IPV6_HEADER: u16 = 40;

/// The smallest probe: the IPv6 minimum MTU, which every link carries.
pub const MIN_PROBE: u16 = 1280;

const ECHO_REQUEST: u8 = 128;
const ECHO_REPLY: u8 = 129;

/// `ICMP6_FILTER` (linux/icmpv6.h): the socket option taking a 256-bit set of
/// ICMPv6 types to block.
const ICMP6_FILTER: libc::c_int = 1;

/// `SO_BINDTOIFINDEX` (asm-generic/socket.h, x86 and arm alike; the libc crate
/// has it for Android only): bind a socket to a link by index.
const SO_BINDTOIFINDEX: libc::c_int = 62;

/// A raw ICMPv6 socket bound to one source address, sending sized echo requests.
pub struct EchoProbe {
    fd: OwnedFd,
    /// Echo identifier of this prober: a raw socket sees every echo reply the host
    /// receives, so replies to other pingers are told apart by it.
    ident: u16,
    seq: u16,
    buf: Vec<u8>,
}

/// An echo identifier for a new prober: the process id mixed with a count of
/// probers, so concurrent probers of one process ignore each other's replies.
fn next_ident() -> u16 {
    static PROBERS: AtomicU32 = AtomicU32::new(0);
    let n = PROBERS.fetch_add(1, Ordering::Relaxed);
    (std::process::id().wrapping_mul(31).wrapping_add(n) & 0xffff) as u16
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn sockaddr(addr: Ipv6Addr) -> libc::sockaddr_in6 {
    libc::sockaddr_in6 {
        sin6_family: libc::AF_INET6 as libc::sa_family_t,
        sin6_port: 0,
        sin6_flowinfo: 0,
        sin6_addr: libc::in6_addr {
            s6_addr: addr.octets(),
        },
        sin6_scope_id: 0,
    }
}

/// Opens a raw ICMPv6 socket sending from `src` that the kernel neither
/// fragments nor shrinks probes on. It receives echo replies when `replies`,
/// nothing otherwise (a socket that only sends). Needs `CAP_NET_RAW`.
fn open_socket(src: Ipv6Addr, replies: bool, link: Option<u32>) -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2); the result is checked before use.
    let fd = unsafe {
        libc::socket(
            libc::AF_INET6,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::IPPROTO_ICMPV6,
        )
    };
    check(fd)?;
    // SAFETY: `fd` was just returned by socket(2) and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let set_int = |level, name, value: libc::c_int| {
        // SAFETY: setsockopt reads one c_int from a live local for the length given.
        check(unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                level,
                name,
                (&value as *const libc::c_int).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        })
    };
    set_int(
        libc::IPPROTO_IPV6,
        libc::IPV6_MTU_DISCOVER,
        libc::IPV6_PMTUDISC_PROBE,
    )?;
    set_int(libc::IPPROTO_IPV6, libc::IPV6_DONTFRAG, 1)?;
    if let Some(ifindex) = link {
        let ifindex = libc::c_int::try_from(ifindex).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("link index {ifindex} out of range"),
            )
        })?;
        set_int(libc::SOL_SOCKET, SO_BINDTOIFINDEX, ifindex)
            .map_err(|e| io::Error::new(e.kind(), format!("binding to link {ifindex}: {e}")))?;
    }
    // Only echo replies (or nothing): Packet Too Big and the rest would wake the
    // receive loop for nothing (a lost probe is the answer we act on).
    let mut filter = [u32::MAX; 8];
    if replies {
        filter[usize::from(ECHO_REPLY >> 5)] &= !(1u32 << (ECHO_REPLY & 31));
    }
    // SAFETY: setsockopt reads the 32-byte `struct icmp6_filter` from a live
    // local array of that size.
    check(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_ICMPV6,
            ICMP6_FILTER,
            filter.as_ptr().cast(),
            size_of::<[u32; 8]>() as libc::socklen_t,
        )
    })?;
    let sa = sockaddr(src);
    // SAFETY: bind reads a sockaddr_in6 of the length given from a live local.
    check(unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&sa as *const libc::sockaddr_in6).cast(),
            size_of::<libc::sockaddr_in6>() as libc::socklen_t,
        )
    })?;
    Ok(fd)
}

/// Sends one echo request of `icmp_len` bytes (at least 8) to `dst`, built in
/// `buf`. `Ok(false)`: larger than the local link takes (`EMSGSIZE`).
fn send_echo(
    fd: &OwnedFd,
    buf: &mut Vec<u8>,
    dst: Ipv6Addr,
    icmp_len: usize,
    ident: u16,
    seq: u16,
) -> io::Result<bool> {
    buf.clear();
    buf.resize(icmp_len.max(usize::from(u16::MAX)), 0);
    let msg = &mut buf[..icmp_len];
    msg[0] = ECHO_REQUEST;
    // Code and checksum stay 0: the kernel fills the checksum in on raw ICMPv6
    // sockets.
    msg[4..6].copy_from_slice(&ident.to_be_bytes());
    msg[6..8].copy_from_slice(&seq.to_be_bytes());
    for (i, b) in msg[8..].iter_mut().enumerate() {
        *b = i as u8;
    }
    let sa = sockaddr(dst);
    // SAFETY: sendto reads `icmp_len` bytes from `msg` and a sockaddr_in6 of
    // the length given, both live locals.
    let rc = unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            msg.as_ptr().cast(),
            icmp_len,
            0,
            (&sa as *const libc::sockaddr_in6).cast(),
            size_of::<libc::sockaddr_in6>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EMSGSIZE) => Ok(false),
            _ => Err(e),
        };
    }
    Ok(true)
}

/// An echo reply read from a socket: who sent it, its identifier and sequence
/// number, and its length.
struct Reply {
    from: Ipv6Addr,
    ident: u16,
    seq: u16,
    len: usize,
}

/// Waits until `deadline` for the next echo reply on `fd` (read into `buf`);
/// `None` when none came by then.
fn next_reply(fd: &OwnedFd, buf: &mut [u8], deadline: Instant) -> io::Result<Option<Reply>> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || !readable(fd, left)? {
            return Ok(None);
        }
        let (len, from) = recv(fd, buf)?;
        let msg = &buf[..len];
        if len >= 8 && msg[0] == ECHO_REPLY {
            return Ok(Some(Reply {
                from,
                ident: u16::from_be_bytes([msg[4], msg[5]]),
                seq: u16::from_be_bytes([msg[6], msg[7]]),
                len,
            }));
        }
    }
}

impl EchoProbe {
    /// Opens the socket, sending from `src` (this sled's underlay address, so the
    /// replies come back over the underlay). Needs `CAP_NET_RAW`.
    pub fn open(src: Ipv6Addr) -> io::Result<EchoProbe> {
        Ok(EchoProbe {
            fd: open_socket(src, true, None)?,
            ident: next_ident(),
            seq: 0,
            buf: Vec::new(),
        })
    }

    /// Sends one echo request making an IPv6 packet of `size` bytes to `dst` and
    /// waits up to `timeout` for its reply. `Ok(true)`: it came back whole;
    /// `Ok(false)`: lost (or larger than the local link takes: `EMSGSIZE`).
    pub fn probe(&mut self, dst: Ipv6Addr, size: u16, timeout: Duration) -> io::Result<bool> {
        if size < MIN_PROBE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("probe size {size} is below the IPv6 minimum MTU {MIN_PROBE}"),
            ));
        }
        self.seq = self.seq.wrapping_add(1);
        let icmp_len = usize::from(size - IPV6_HEADER);
        if !send_echo(&self.fd, &mut self.buf, dst, icmp_len, self.ident, self.seq)? {
            return Ok(false);
        }
        let deadline = Instant::now() + timeout;
        while let Some(r) = next_reply(&self.fd, &mut self.buf, deadline)? {
            if r.from == dst && r.len == icmp_len && r.ident == self.ident && r.seq == self.seq {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

/// Waits up to `timeout` for something to read.
fn readable(fd: &OwnedFd, timeout: Duration) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = libc::c_int::try_from(timeout.as_millis().max(1)).unwrap_or(libc::c_int::MAX);
    // SAFETY: poll reads and writes one pollfd, a live local.
    let n = unsafe { libc::poll(&mut pfd, 1, ms) };
    match n {
        n if n < 0 => {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                Ok(true)
            } else {
                Err(e)
            }
        }
        0 => Ok(false),
        _ => Ok(true),
    }
}

/// Reads one ICMPv6 message (without its IPv6 header) into the buffer without
/// blocking; returns its length and source.
fn recv(fd: &OwnedFd, buf: &mut [u8]) -> io::Result<(usize, Ipv6Addr)> {
    let mut from = MaybeUninit::<libc::sockaddr_in6>::zeroed();
    let mut from_len = size_of::<libc::sockaddr_in6>() as libc::socklen_t;
    // SAFETY: recvfrom writes at most `buf.len()` bytes into `buf` and at
    // most `from_len` bytes into `from`, both live and of those sizes.
    let n = unsafe {
        libc::recvfrom(
            fd.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT,
            from.as_mut_ptr().cast(),
            &mut from_len,
        )
    };
    if n < 0 {
        let e = io::Error::last_os_error();
        // Nothing after all (a spurious wakeup): an empty message matches nothing.
        return match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => {
                Ok((0, Ipv6Addr::UNSPECIFIED))
            }
            _ => Err(e),
        };
    }
    // SAFETY: `from` was zero-initialised, and recvfrom filled in (part of) it;
    // every bit pattern is a valid sockaddr_in6.
    let from = unsafe { from.assume_init() };
    let len = usize::try_from(n).unwrap_or(0).min(buf.len());
    Ok((len, Ipv6Addr::from(from.sin6_addr.s6_addr)))
}

/// The ICMPv6 message of a path probe: small, since it asks whether the path
/// forwards at all (the MTU is `path-check`'s business).
const PATH_PROBE_LEN: usize = 64;

/// Echo probes that leave through a chosen underlay link, whatever link the
/// kernel's multipath hash would pick: is the path behind each link alive?
///
/// Why this design: a socket bound to a link (`SO_BINDTOIFINDEX`) makes the
/// kernel take that link's next hop of a multipath route (a destination given
/// per message, `IPV6_PKTINFO`, does not: the hash still picks), so each link
/// has a sending socket of its own. The reply comes back by whatever path the
/// far kernel picks, and a socket bound to one link receives nothing from
/// another, so one unbound socket receives every reply; all share one echo
/// identifier, and the sequence number tells the probes apart. Plain ICMPv6
/// echoes need nothing from the far sled but its kernel (the XDP program passes
/// them), unlike probes the far daemon would have to answer, and frames built
/// by hand for a neighbour's MAC (AF_PACKET) would duplicate the next-hop
/// resolution. A reply is lost on the way back as well as the request on the way
/// out: the caller must read a lost probe as "this path, or the way back, drops".
pub struct PathProbes {
    src: Ipv6Addr,
    replies: OwnedFd,
    /// Sending sockets by link index, opened on first use.
    links: HashMap<u32, OwnedFd>,
    ident: u16,
    seq: u16,
    buf: Vec<u8>,
}

impl PathProbes {
    /// Opens the receiving socket, for probes from `src` (this sled's underlay
    /// address). Needs `CAP_NET_RAW`.
    pub fn open(src: Ipv6Addr) -> io::Result<PathProbes> {
        Ok(PathProbes {
            src,
            replies: open_socket(src, true, None)?,
            links: HashMap::new(),
            ident: next_ident(),
            seq: 0,
            buf: Vec::new(),
        })
    }

    /// Sends one probe to `dst` through link `ifindex`; returns its sequence
    /// number, which its reply carries ([`PathProbes::replies`]).
    pub fn send(&mut self, dst: Ipv6Addr, ifindex: u32) -> io::Result<u16> {
        let fd = match self.links.entry(ifindex) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => e.insert(open_socket(self.src, false, Some(ifindex))?),
        };
        self.seq = self.seq.wrapping_add(1);
        if !send_echo(fd, &mut self.buf, dst, PATH_PROBE_LEN, self.ident, self.seq)? {
            return Err(io::Error::other(format!(
                "a {PATH_PROBE_LEN}-byte probe does not fit link {ifindex}"
            )));
        }
        Ok(self.seq)
    }

    /// Closes the sending sockets of links not in `keep` (gone or re-created).
    pub fn retain_links(&mut self, keep: &[u32]) {
        self.links.retain(|ifindex, _| keep.contains(ifindex));
    }

    /// Calls `got(from, seq)` for each reply to these probes until `deadline`.
    pub fn replies(
        &mut self,
        deadline: Instant,
        mut got: impl FnMut(Ipv6Addr, u16),
    ) -> io::Result<()> {
        while let Some(r) = next_reply(&self.replies, &mut self.buf, deadline)? {
            if r.ident == self.ident && r.len == PATH_PROBE_LEN {
                got(r.from, r.seq);
            }
        }
        Ok(())
    }
}

/// Finds the largest probe size in `[MIN_PROBE, max]` for which `fits` says yes,
/// by bisection, assuming every size up to it fits and none above it does (a
/// path MTU). Tries `max` first (the healthy case costs one probe), then
/// `MIN_PROBE`. Returns `None` when not even `MIN_PROBE` fits (the peer does not
/// answer at all), and the number of probes asked.
pub fn largest_fitting(
    max: u16,
    mut fits: impl FnMut(u16) -> io::Result<bool>,
) -> io::Result<(Option<u16>, u32)> {
    let max = max.max(MIN_PROBE);
    let mut probes = 1;
    if fits(max)? {
        return Ok((Some(max), probes));
    }
    probes += 1;
    if max == MIN_PROBE || !fits(MIN_PROBE)? {
        return Ok((None, probes));
    }
    // Invariant: `lo` fits, `hi` does not.
    let (mut lo, mut hi) = (MIN_PROBE, max);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        probes += 1;
        if fits(mid)? {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok((Some(lo), probes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(mtu: u16) -> impl FnMut(u16) -> io::Result<bool> {
        move |size| Ok(size <= mtu)
    }

    #[test]
    fn bisection_finds_the_path_mtu() {
        assert_eq!(largest_fitting(9000, path(9000)).unwrap(), (Some(9000), 1));
        let (found, probes) = largest_fitting(9000, path(1500)).unwrap();
        assert_eq!(found, Some(1500));
        assert!(probes <= 2 + 13, "{probes} probes");
        assert_eq!(largest_fitting(9000, path(4000)).unwrap().0, Some(4000));
        assert_eq!(largest_fitting(9000, path(1280)).unwrap().0, Some(1280));
        assert_eq!(largest_fitting(9000, path(0)).unwrap(), (None, 2));
        assert_eq!(largest_fitting(1280, path(0)).unwrap(), (None, 2));
        assert_eq!(largest_fitting(1500, path(1499)).unwrap().0, Some(1499));
    }

    /// Against the loopback device (MTU 65536): a 9000-byte probe comes back,
    /// one below the IPv6 minimum is refused by name.
    #[test]
    fn loopback_answers_full_size_probes() {
        crate::testnet::require_root();
        let mut p = EchoProbe::open(Ipv6Addr::LOCALHOST).unwrap();
        assert!(p
            .probe(Ipv6Addr::LOCALHOST, 9000, Duration::from_secs(2))
            .unwrap());
        assert_eq!(
            largest_fitting(9000, |size| p.probe(
                Ipv6Addr::LOCALHOST,
                size,
                Duration::from_secs(2)
            ))
            .unwrap(),
            (Some(9000), 1)
        );
        let e = p
            .probe(Ipv6Addr::LOCALHOST, 1000, Duration::from_secs(1))
            .unwrap_err();
        assert!(e.to_string().contains("1000"), "{e}");
    }

    /// Through the loopback link: the reply comes back, named by the probe's
    /// sequence number, to the unbound socket.
    #[test]
    fn a_path_probe_through_a_link_is_answered() {
        crate::testnet::require_root();
        let mut p = PathProbes::open(Ipv6Addr::LOCALHOST).unwrap();
        let seq = p.send(Ipv6Addr::LOCALHOST, 1).unwrap();
        let mut got = Vec::new();
        let until = Instant::now() + Duration::from_millis(500);
        p.replies(until, |from, s| got.push((from, s))).unwrap();
        assert_eq!(got, [(Ipv6Addr::LOCALHOST, seq)]);
    }

    #[test]
    fn errors_stop_the_search() {
        let e = largest_fitting(9000, |_| Err(io::Error::other("no route"))).unwrap_err();
        assert!(e.to_string().contains("no route"));
    }
}
