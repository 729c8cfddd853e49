//! Link facts and IPv6 neighbour/route lookups over a `NETLINK_ROUTE` socket.
//!
//! Small hand-written rtnetlink: the daemon needs a handful of requests (link
//! by name, set MTU/MAC/up/netns, neighbour dump, route get), and a full
//! netlink crate would bring an async runtime and many types for that. Every
//! reply is parsed with checked bounds: a malformed message is an error, never
//! a panic.
//!
//! A [`Netlink`] socket belongs to the network namespace of the thread that
//! opened it, which is how the tests and the daemon address other namespaces.

use std::collections::HashMap;
use std::io;
use std::net::{Ipv6Addr, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use wire::MacAddr;

const NLMSG_HDR_LEN: usize = 16;
const IFINFOMSG_LEN: usize = 16;
const NDMSG_LEN: usize = 12;
const RTMSG_LEN: usize = 12;
/// Large enough for a neighbour or link dump chunk (the kernel sizes dump
/// messages to the reader's buffer, up to a page or two per message).
const RECV_BUF_LEN: usize = 64 * 1024;

/// The facts about one link that the datapath uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkInfo {
    pub name: String,
    pub ifindex: u32,
    pub mtu: u32,
    /// `None` for links without an Ethernet address (loopback has all zeros, tun none).
    pub mac: Option<MacAddr>,
    /// `IFF_UP` (administratively up).
    pub up: bool,
    /// `IFF_LOWER_UP` (the link has carrier).
    pub carrier: bool,
    /// Packets the link dropped on transmit (`tx_dropped` of `IFLA_STATS64`). For a
    /// tap, transmit is the guest's side: frames the guest sent that the tap's queue
    /// dropped because the datapath did not read them in time.
    pub tx_dropped: u64,
}

/// One IPv6 neighbour entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Neighbour {
    pub ifindex: u32,
    pub addr: Ipv6Addr,
    /// Absent for entries still INCOMPLETE or FAILED.
    pub mac: Option<MacAddr>,
    /// `NUD_*` state bits.
    pub state: u16,
}

impl Neighbour {
    /// REACHABLE, STALE, DELAY, PROBE and PERMANENT entries carry a MAC the
    /// kernel itself would use; INCOMPLETE/FAILED/NOARP do not.
    pub fn is_usable(&self) -> bool {
        let usable = libc::NUD_REACHABLE
            | libc::NUD_STALE
            | libc::NUD_DELAY
            | libc::NUD_PROBE
            | libc::NUD_PERMANENT;
        self.mac.is_some() && self.state & usable != 0
    }
}

/// One path of the route the kernel would use for an IPv6 address: the route's
/// only one, or one of its multipath next hops (`RTA_MULTIPATH`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoutePath {
    pub oif: u32,
    /// `None` when the destination is on-link.
    pub gateway: Option<Ipv6Addr>,
    /// Neither dead (`RTNH_F_DEAD`: its link went down) nor without carrier
    /// (`RTNH_F_LINKDOWN`).
    pub usable: bool,
}

impl RoutePath {
    /// The address whose neighbour entry gives the next hop's MAC.
    pub fn neighbour(&self, dst: Ipv6Addr) -> Ipv6Addr {
        self.gateway.unwrap_or(dst)
    }
}

/// `rtnh_flags` / `rtm_flags` of a next hop whose link is down or has lost carrier.
const RTNH_F_DEAD: u32 = 1;
const RTNH_F_LINKDOWN: u32 = 16;
/// `rtm_flags` of a route lookup that asks for the matching route itself (every
/// multipath next hop) rather than the one path the kernel would pick.
const RTM_F_FIB_MATCH: u32 = 0x2000;
/// `struct rtnexthop`: length, flags, hops, ifindex; its attributes follow.
const RTNEXTHOP_LEN: usize = 8;

/// A `NETLINK_ROUTE` socket.
pub struct Netlink {
    fd: OwnedFd,
    seq: u32,
    buf: Vec<u8>,
}

/// Error for a reply that does not parse; names what was wrong.
fn bad_reply(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("malformed netlink reply: {what}"),
    )
}

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// Appends one `rtattr` (4-byte header + payload, padded to 4).
fn push_attr(msg: &mut Vec<u8>, kind: u16, payload: &[u8]) {
    let len = 4 + payload.len();
    msg.extend_from_slice(&(len as u16).to_ne_bytes());
    msg.extend_from_slice(&kind.to_ne_bytes());
    msg.extend_from_slice(payload);
    msg.resize(align4(msg.len()), 0);
}

/// Iterates `(type, payload)` over a run of `rtattr`s; stops at the first malformed one.
fn attrs(mut b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        let len = u16::from_ne_bytes([*b.first()?, *b.get(1)?]) as usize;
        let kind = u16::from_ne_bytes([*b.get(2)?, *b.get(3)?]) & 0x3fff; // strip NLA_F_* bits
        if len < 4 || len > b.len() {
            return None;
        }
        let payload = &b[4..len];
        b = b.get(align4(len)..).unwrap_or(&[]);
        Some((kind, payload))
    })
}

fn read_u16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn read_u32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn read_u64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Offset of `tx_dropped` in `struct rtnl_link_stats64` (the eighth u64).
const STATS64_TX_DROPPED: usize = 7 * 8;

fn ipv6_from(b: &[u8]) -> Option<Ipv6Addr> {
    let a: [u8; 16] = b.try_into().ok()?;
    Some(Ipv6Addr::from(a))
}

fn mac_from(b: &[u8]) -> Option<MacAddr> {
    let a: [u8; 6] = b.try_into().ok()?;
    Some(MacAddr(a))
}

fn parse_link(body: &[u8]) -> Option<LinkInfo> {
    let ifindex = read_u32(body, 4)?;
    let flags = read_u32(body, 8)?;
    let mut info = LinkInfo {
        name: String::new(),
        ifindex,
        mtu: 0,
        mac: None,
        up: flags & libc::IFF_UP as u32 != 0,
        carrier: flags & libc::IFF_LOWER_UP as u32 != 0,
        tx_dropped: 0,
    };
    for (kind, p) in attrs(body.get(IFINFOMSG_LEN..)?) {
        match kind {
            libc::IFLA_IFNAME => {
                let end = p.iter().position(|&c| c == 0).unwrap_or(p.len());
                info.name = String::from_utf8_lossy(&p[..end]).into_owned();
            }
            libc::IFLA_MTU => info.mtu = read_u32(p, 0)?,
            libc::IFLA_ADDRESS => info.mac = mac_from(p),
            libc::IFLA_STATS64 => info.tx_dropped = read_u64(p, STATS64_TX_DROPPED)?,
            _ => {}
        }
    }
    Some(info)
}

fn parse_neigh(body: &[u8]) -> Option<Neighbour> {
    if *body.first()? != libc::AF_INET6 as u8 {
        return None;
    }
    let ifindex = read_u32(body, 4)?;
    let state = read_u16(body, 8)?;
    let mut addr = None;
    let mut mac = None;
    for (kind, p) in attrs(body.get(NDMSG_LEN..)?) {
        match kind {
            libc::NDA_DST => addr = ipv6_from(p),
            libc::NDA_LLADDR => mac = mac_from(p),
            _ => {}
        }
    }
    Some(Neighbour {
        ifindex,
        addr: addr?,
        mac,
        state,
    })
}

fn usable(flags: u32) -> bool {
    flags & (RTNH_F_DEAD | RTNH_F_LINKDOWN) == 0
}

/// The paths of a route (`RTM_NEWROUTE` body): each multipath next hop, or the
/// route's own output interface and gateway. `None` for a malformed body or a
/// route without any output interface.
fn parse_route(body: &[u8]) -> Option<Vec<RoutePath>> {
    let flags = read_u32(body, 8)?;
    let mut oif = None;
    let mut gateway = None;
    let mut paths = Vec::new();
    for (kind, p) in attrs(body.get(RTMSG_LEN..)?) {
        match kind {
            libc::RTA_OIF => oif = read_u32(p, 0),
            libc::RTA_GATEWAY => gateway = ipv6_from(p),
            libc::RTA_MULTIPATH => paths = parse_multipath(p)?,
            _ => {}
        }
    }
    if paths.is_empty() {
        paths.push(RoutePath {
            oif: oif?,
            gateway,
            usable: usable(flags),
        });
    }
    Some(paths)
}

/// The next hops of an `RTA_MULTIPATH` attribute: a run of `struct rtnexthop`,
/// each followed by its own attributes (`RTA_GATEWAY`).
fn parse_multipath(mut b: &[u8]) -> Option<Vec<RoutePath>> {
    let mut paths = Vec::new();
    while !b.is_empty() {
        let len = usize::from(read_u16(b, 0)?);
        let flags = u32::from(*b.get(2)?);
        let oif = read_u32(b, 4)?;
        let nh_attrs = b.get(RTNEXTHOP_LEN..len)?;
        let gateway = attrs(nh_attrs)
            .find(|(k, _)| *k == libc::RTA_GATEWAY)
            .and_then(|(_, p)| ipv6_from(p));
        paths.push(RoutePath {
            oif,
            gateway,
            usable: usable(flags),
        });
        b = b.get(align4(len)..).unwrap_or(&[]);
    }
    Some(paths)
}

/// Opens a `NETLINK_ROUTE` socket bound to the multicast groups in `groups` (a
/// `RTMGRP_*` mask; 0 for a request socket) with extra socket `flags`.
fn route_socket(flags: libc::c_int, groups: u32) -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2) call; the result is checked before use.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC | flags,
            libc::NETLINK_ROUTE,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh, valid descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sockaddr_nl is plain data; all-zero is "kernel assigns the port id".
    let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    sa.nl_family = libc::AF_NETLINK as u16;
    sa.nl_groups = groups;
    // SAFETY: sa is a valid sockaddr_nl and the length matches it.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            &sa as *const libc::sockaddr_nl as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_nl>() as u32,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// One `recv` into `buf` (retried when interrupted); `flags` as for recv(2).
fn recv(fd: &OwnedFd, buf: &mut [u8], flags: libc::c_int) -> io::Result<usize> {
    loop {
        // SAFETY: buf is valid for writes of its full length.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), flags) };
        if let Ok(n) = usize::try_from(n) {
            return Ok(n);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// One netlink message of a datagram: its type, sequence number and body.
struct Message<'a> {
    kind: u16,
    seq: u32,
    body: &'a [u8],
}

/// The messages of one datagram, in order; a header whose length does not fit
/// ends the datagram with an error.
fn messages(mut rest: &[u8]) -> impl Iterator<Item = io::Result<Message<'_>>> {
    std::iter::from_fn(move || {
        let (mlen, kind, seq) = (read_u32(rest, 0)?, read_u16(rest, 4)?, read_u32(rest, 8)?);
        let mlen = mlen as usize;
        if mlen < NLMSG_HDR_LEN || mlen > rest.len() {
            let e = bad_reply(&format!("message length {mlen} of {}", rest.len()));
            rest = &[];
            return Some(Err(e));
        }
        let body = &rest[NLMSG_HDR_LEN..mlen];
        rest = rest.get(align4(mlen)..).unwrap_or(&[]);
        Some(Ok(Message { kind, seq, body }))
    })
}

impl Netlink {
    /// Opens a `NETLINK_ROUTE` socket in the calling thread's network namespace.
    pub fn open() -> io::Result<Netlink> {
        Ok(Netlink {
            fd: route_socket(0, 0)?,
            seq: 1,
            buf: vec![0; RECV_BUF_LEN],
        })
    }

    /// Starts a message: header with length patched by [`Self::transact`].
    fn header(&mut self, kind: u16, flags: u16) -> Vec<u8> {
        self.seq = self.seq.wrapping_add(1);
        let mut m = Vec::with_capacity(128);
        m.extend_from_slice(&0u32.to_ne_bytes());
        m.extend_from_slice(&kind.to_ne_bytes());
        m.extend_from_slice(&(flags | libc::NLM_F_REQUEST as u16).to_ne_bytes());
        m.extend_from_slice(&self.seq.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        m
    }

    /// Sends `msg` and collects the bodies of the replies (for a dump, until
    /// `NLMSG_DONE`; otherwise until the ack or the single answer).
    fn transact(&mut self, mut msg: Vec<u8>, dump: bool) -> io::Result<Vec<Vec<u8>>> {
        let len = msg.len() as u32;
        msg[..4].copy_from_slice(&len.to_ne_bytes());
        // SAFETY: msg is a valid buffer of msg.len() bytes; the netlink socket is
        // unconnected and send() addresses the kernel (port 0).
        let rc = unsafe { libc::send(self.fd.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        let seq = self.seq;
        let mut out = Vec::new();
        loop {
            let n = recv(&self.fd, &mut self.buf, 0)?;
            for m in messages(&self.buf[..n]) {
                let m = m?;
                if m.seq != seq {
                    continue; // a late reply to an earlier request
                }
                match i32::from(m.kind) {
                    libc::NLMSG_DONE => return Ok(out),
                    libc::NLMSG_ERROR => {
                        let errno =
                            read_u32(m.body, 0).ok_or_else(|| bad_reply("error body"))? as i32;
                        if errno == 0 {
                            return Ok(out); // ack
                        }
                        return Err(io::Error::from_raw_os_error(-errno));
                    }
                    _ => {
                        out.push(m.body.to_vec());
                        if !dump {
                            return Ok(out);
                        }
                    }
                }
            }
        }
    }

    fn ifinfomsg(msg: &mut Vec<u8>, ifindex: u32, flags: u32, change: u32) {
        msg.push(libc::AF_UNSPEC as u8);
        msg.push(0);
        msg.extend_from_slice(&0u16.to_ne_bytes());
        msg.extend_from_slice(&(ifindex as i32).to_ne_bytes());
        msg.extend_from_slice(&flags.to_ne_bytes());
        msg.extend_from_slice(&change.to_ne_bytes());
    }

    /// Looks a link up by name. `NotFound` names the link.
    pub fn link_by_name(&mut self, name: &str) -> io::Result<LinkInfo> {
        let mut m = self.header(libc::RTM_GETLINK, 0);
        Self::ifinfomsg(&mut m, 0, 0, 0);
        let mut cname = name.as_bytes().to_vec();
        cname.push(0);
        push_attr(&mut m, libc::IFLA_IFNAME, &cname);
        let replies = self.transact(m, false).map_err(|e| {
            if e.raw_os_error() == Some(libc::ENODEV) {
                io::Error::new(io::ErrorKind::NotFound, format!("no link named {name:?}"))
            } else {
                e
            }
        })?;
        replies
            .first()
            .and_then(|b| parse_link(b))
            .ok_or_else(|| bad_reply(&format!("RTM_NEWLINK for {name:?}")))
    }

    /// Looks a link up by index.
    pub fn link_by_index(&mut self, ifindex: u32) -> io::Result<LinkInfo> {
        let mut m = self.header(libc::RTM_GETLINK, 0);
        Self::ifinfomsg(&mut m, ifindex, 0, 0);
        let replies = self.transact(m, false)?;
        replies
            .first()
            .and_then(|b| parse_link(b))
            .ok_or_else(|| bad_reply(&format!("RTM_NEWLINK for ifindex {ifindex}")))
    }

    /// RTM_NEWLINK on an existing link with the given attributes.
    fn set_link(
        &mut self,
        ifindex: u32,
        flags: u32,
        change: u32,
        attrs: &[(u16, &[u8])],
    ) -> io::Result<()> {
        let mut m = self.header(libc::RTM_NEWLINK, libc::NLM_F_ACK as u16);
        Self::ifinfomsg(&mut m, ifindex, flags, change);
        for (kind, payload) in attrs {
            push_attr(&mut m, *kind, payload);
        }
        self.transact(m, false).map(drop)
    }

    /// Sets the link administratively up or down.
    pub fn set_up(&mut self, ifindex: u32, up: bool) -> io::Result<()> {
        let flag = libc::IFF_UP as u32;
        self.set_link(ifindex, if up { flag } else { 0 }, flag, &[])
    }

    pub fn set_mtu(&mut self, ifindex: u32, mtu: u32) -> io::Result<()> {
        self.set_link(ifindex, 0, 0, &[(libc::IFLA_MTU, &mtu.to_ne_bytes())])
            .map_err(|e| {
                io::Error::new(e.kind(), format!("set MTU {mtu} on ifindex {ifindex}: {e}"))
            })
    }

    pub fn set_mac(&mut self, ifindex: u32, mac: MacAddr) -> io::Result<()> {
        self.set_link(ifindex, 0, 0, &[(libc::IFLA_ADDRESS, &mac.0)])
    }

    /// Moves a link into the network namespace referred to by `netns_fd`
    /// (an open `/run/netns/NAME` or `/proc/PID/ns/net`).
    pub fn move_to_netns(&mut self, ifindex: u32, netns_fd: RawFd) -> io::Result<()> {
        self.set_link(
            ifindex,
            0,
            0,
            &[(libc::IFLA_NET_NS_FD, &(netns_fd as u32).to_ne_bytes())],
        )
    }

    /// Dumps the IPv6 neighbour table (all interfaces).
    pub fn neighbours(&mut self) -> io::Result<Vec<Neighbour>> {
        let mut m = self.header(libc::RTM_GETNEIGH, libc::NLM_F_DUMP as u16);
        m.push(libc::AF_INET6 as u8);
        m.extend_from_slice(&[0; NDMSG_LEN - 1]);
        let replies = self.transact(m, true)?;
        Ok(replies.iter().filter_map(|b| parse_neigh(b)).collect())
    }

    /// The neighbour entry for `addr` on `ifindex`, usable or not.
    pub fn neighbour(&mut self, ifindex: u32, addr: Ipv6Addr) -> io::Result<Option<Neighbour>> {
        Ok(self
            .neighbours()?
            .into_iter()
            .find(|n| n.ifindex == ifindex && n.addr == addr))
    }

    /// Asks the kernel which route it would use for `dst` and returns all its
    /// paths (`ip -6 route get fibmatch`): a multipath route's every next hop,
    /// dead or alive, not only the one the kernel would pick for one packet.
    pub fn route_paths(&mut self, dst: Ipv6Addr) -> io::Result<Vec<RoutePath>> {
        let mut m = self.header(libc::RTM_GETROUTE, 0);
        m.push(libc::AF_INET6 as u8);
        m.push(128); // dst_len
        m.extend_from_slice(&[0; 6]); // src_len, tos, table, protocol, scope, type
        m.extend_from_slice(&RTM_F_FIB_MATCH.to_ne_bytes());
        push_attr(&mut m, libc::RTA_DST, &dst.octets());
        let replies = self
            .transact(m, false)
            .map_err(|e| io::Error::new(e.kind(), format!("route lookup for {dst}: {e}")))?;
        replies.first().and_then(|b| parse_route(b)).ok_or_else(|| {
            bad_reply(&format!(
                "RTM_NEWROUTE for {dst} without an output interface"
            ))
        })
    }
}

/// Kinds of kernel notification an [`Events`] socket can subscribe to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    /// Links appearing, changing (MTU, state, MAC, queues) and disappearing.
    Link,
    /// Neighbour entries (only IPv6 ones are reported).
    Neighbour,
    /// IPv6 routes.
    Ipv6Route,
}

impl Group {
    /// The group's bit in `sockaddr_nl.nl_groups` (`RTMGRP_*`).
    fn mask(self) -> u32 {
        let m = match self {
            Group::Link => libc::RTMGRP_LINK,
            Group::Neighbour => libc::RTMGRP_NEIGH,
            Group::Ipv6Route => libc::RTMGRP_IPV6_ROUTE,
        };
        m as u32
    }
}

/// A change the kernel announced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A link appeared or changed (`RTM_NEWLINK`), or was deleted (`RTM_DELLINK`).
    Link { info: LinkInfo, deleted: bool },
    /// An IPv6 neighbour entry changed state (`RTM_NEWNEIGH`) or was deleted.
    Neighbour { neigh: Neighbour, deleted: bool },
    /// An IPv6 route was added or removed.
    Route,
    /// Notifications were lost (the socket's buffer overflowed, or one did not
    /// parse): whatever is watched must be read again from the kernel.
    Lost,
}

/// What one notification says, if it is one of the kinds [`Event`] reports.
fn parse_event(kind: u16, body: &[u8]) -> Option<Event> {
    let deleted = matches!(
        kind,
        libc::RTM_DELLINK | libc::RTM_DELNEIGH | libc::RTM_DELROUTE
    );
    match kind {
        libc::RTM_NEWLINK | libc::RTM_DELLINK => Some(Event::Link {
            info: parse_link(body)?,
            deleted,
        }),
        libc::RTM_NEWNEIGH | libc::RTM_DELNEIGH => Some(Event::Neighbour {
            neigh: parse_neigh(body)?,
            deleted,
        }),
        libc::RTM_NEWROUTE | libc::RTM_DELROUTE => {
            (*body.first()? == libc::AF_INET6 as u8).then_some(Event::Route)
        }
        _ => None,
    }
}

/// How much the kernel may queue for an [`Events`] socket before it drops
/// notifications (reported as [`Event::Lost`]): a link flap on a sled with many
/// neighbours announces each of them.
const EVENTS_RCVBUF: libc::c_int = 1 << 20;

/// A non-blocking `NETLINK_ROUTE` socket subscribed to kernel notifications:
/// how the daemon learns of link, neighbour and route changes when they happen
/// instead of polling for them. Register [`Events::as_raw_fd`] with epoll and
/// call [`Events::drain`] when it is readable.
pub struct Events {
    fd: OwnedFd,
    buf: Vec<u8>,
}

impl Events {
    /// Subscribes, in the calling thread's network namespace, to `groups`.
    pub fn subscribe(groups: &[Group]) -> io::Result<Events> {
        let mask = groups.iter().fold(0, |m, g| m | g.mask());
        let fd = route_socket(libc::SOCK_NONBLOCK, mask)
            .map_err(|e| io::Error::new(e.kind(), format!("netlink subscription: {e}")))?;
        // SAFETY: SO_RCVBUF reads one c_int from the pointer, which outlives the call.
        let rc = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUF,
                (&EVENTS_RCVBUF as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as u32,
            )
        };
        if rc < 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(e.kind(), format!("netlink SO_RCVBUF: {e}")));
        }
        Ok(Events {
            fd,
            buf: vec![0; RECV_BUF_LEN],
        })
    }

    /// Appends every notification waiting to `out`, without blocking.
    pub fn drain(&mut self, out: &mut Vec<Event>) -> io::Result<()> {
        loop {
            let n = match recv(&self.fd, &mut self.buf, libc::MSG_DONTWAIT) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    out.push(Event::Lost);
                    continue;
                }
                Err(e) => return Err(io::Error::new(e.kind(), format!("netlink events: {e}"))),
            };
            for m in messages(&self.buf[..n]) {
                match m {
                    Ok(m) => out.extend(parse_event(m.kind, m.body)),
                    Err(_) => out.push(Event::Lost),
                }
            }
        }
    }
}

impl AsRawFd for Events {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Makes the kernel start neighbour discovery for `addr`: a one-byte UDP
/// datagram to the discard port makes it queue the packet and send a
/// Neighbour Solicitation, exactly as any local sender would, without forging
/// neighbour-table state over netlink. Link-local addresses need the
/// interface as scope id.
pub fn request_resolution(addr: Ipv6Addr, ifindex: u32) -> io::Result<()> {
    let sock = UdpSocket::bind("[::]:0")?;
    let dst = std::net::SocketAddrV6::new(addr, 9, 0, ifindex);
    match sock.send_to(&[0], dst) {
        Ok(_) => Ok(()),
        // The kernel reports a failed earlier resolution on the next send; the
        // request itself still went out.
        Err(e) if e.raw_os_error() == Some(libc::EHOSTUNREACH) => Ok(()),
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!("resolution request for {addr}: {e}"),
        )),
    }
}

/// How the datapath reaches one underlay destination over one path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct NextHop {
    pub ifindex: u32,
    pub src_mac: MacAddr,
    pub dst_mac: MacAddr,
}

/// The kernel's view of underlay next hops, cached: route + neighbour lookups
/// per destination, kept in a HashMap. A destination reached by a multipath
/// route has one next hop per usable path (sorted, so that equal sets compare
/// equal); the datapath spreads its flows over them.
///
/// Every method that refreshes does netlink round trips (three per path), so
/// this belongs to a slow-path thread, never to the datapath worker: the daemon
/// runs it on a resolver thread and publishes [`NeighbourCache::entries`] to the
/// worker as an immutable snapshot. What [`NeighbourCache::update`] and
/// [`NeighbourCache::refresh`] report tells the daemon whether flows compiled
/// with an older next hop must be recompiled.
pub struct NeighbourCache {
    nl: Netlink,
    entries: HashMap<Ipv6Addr, Vec<NextHop>>,
    /// The neighbours (each with its link) each destination was last found to go
    /// through (gateways, or itself when on-link), resolved or not: what neighbour
    /// notifications are matched against ([`NeighbourCache::through`]).
    via: HashMap<Ipv6Addr, Vec<(u32, Ipv6Addr)>>,
    /// Whether each link a route went through was up with carrier when last
    /// seen: a link event that changes it makes every destination be resolved
    /// again (the kernel marks the paths through it dead or back without a
    /// route notification).
    links: HashMap<u32, bool>,
    last_refresh: Option<Instant>,
    /// Entries older than this are re-read from the kernel (MAC changes, route changes).
    max_age: Duration,
}

/// What one pass over some destinations did to the cache.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Refresh {
    /// Destinations without a usable neighbour on any path (resolution was
    /// requested); they are not in the cache.
    pub unresolved: Vec<Ipv6Addr>,
    /// Cached destinations with a path whose neighbour is not usable yet
    /// (resolution was requested): to be tried again, as their next hops are
    /// fewer than their paths.
    pub incomplete: Vec<Ipv6Addr>,
    /// A cached next hop changed (interface or MAC), disappeared, or a
    /// destination gained a path: anything compiled with the old set sends to the
    /// wrong place (or does not spread) and must be redone.
    pub next_hops_changed: bool,
    /// A destination got its first next hops: nothing was compiled with them yet,
    /// but the new entries must reach whoever looks them up.
    pub next_hops_added: bool,
}

/// What a notification means for the destinations a [`NeighbourCache`] knows.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Affected {
    /// Destinations without a next hop whose neighbour just became usable:
    /// worth resolving now rather than at their next retry.
    pub resolvable: Vec<Ipv6Addr>,
    /// Cached destinations whose next hops may have changed, vanished or grown
    /// (a neighbour's MAC changed, it failed, was deleted or became usable on a
    /// path the destination lacks; a link's MAC changed or the link was
    /// deleted): resolve them again now.
    pub stale: Vec<Ipv6Addr>,
    /// Routes changed, a link went down or came back, or notifications were
    /// lost: resolve everything again.
    pub all: bool,
}

/// How storing one lookup result changed the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stored {
    Unchanged,
    Added,
    /// An existing entry now says something else, or is gone.
    Changed,
}

/// Stores `hops` (a fresh kernel answer, sorted; empty = unresolved) for `dst`
/// and says what that did. Kept apart from the netlink calls so the change
/// detection is testable without a kernel.
fn store(
    entries: &mut HashMap<Ipv6Addr, Vec<NextHop>>,
    dst: Ipv6Addr,
    hops: Vec<NextHop>,
) -> Stored {
    match (hops.is_empty(), entries.get(&dst)) {
        (false, Some(old)) if *old == hops => Stored::Unchanged,
        (false, old) => {
            let existed = old.is_some();
            entries.insert(dst, hops);
            if existed {
                Stored::Changed
            } else {
                Stored::Added
            }
        }
        (true, Some(_)) => {
            entries.remove(&dst);
            Stored::Changed
        }
        (true, None) => Stored::Unchanged,
    }
}

/// The paths a next hop may be taken from: those the kernel has neither dead
/// nor without carrier. When none is, all of them: a single-path route whose
/// link lost carrier keeps its next hop as before (the frames go nowhere
/// either way, and it is back the moment the carrier is).
fn paths_in_use<L>(paths: Vec<(RoutePath, L)>) -> Vec<(RoutePath, L)> {
    if paths.iter().any(|(p, _)| p.usable) {
        paths.into_iter().filter(|(p, _)| p.usable).collect()
    } else {
        paths
    }
}

impl NeighbourCache {
    pub fn new(max_age: Duration) -> io::Result<NeighbourCache> {
        Ok(NeighbourCache {
            nl: Netlink::open()?,
            entries: HashMap::new(),
            via: HashMap::new(),
            links: HashMap::new(),
            last_refresh: None,
            max_age,
        })
    }

    /// The resolved next hops, for publishing to the fast path.
    pub fn entries(&self) -> &HashMap<Ipv6Addr, Vec<NextHop>> {
        &self.entries
    }

    /// The destinations last found to go through `neighbour`: those a change of
    /// that neighbour's entry may resolve, move or break.
    pub fn through(&self, neighbour: Ipv6Addr) -> impl Iterator<Item = Ipv6Addr> + '_ {
        self.via
            .iter()
            .filter(move |(_, n)| n.iter().any(|(_, a)| *a == neighbour))
            .map(|(d, _)| *d)
    }

    /// Adds to `out` what notification `ev` means for the known destinations.
    pub fn affected_by(&self, ev: &Event, out: &mut Affected) {
        match ev {
            Event::Route | Event::Lost => out.all = true,
            Event::Link { info, deleted } => {
                let in_use = !deleted && info.up && info.carrier;
                if self
                    .links
                    .get(&info.ifindex)
                    .is_some_and(|&was| was != in_use)
                {
                    out.all = true;
                }
                out.stale.extend(
                    self.entries
                        .iter()
                        .filter(|(_, hs)| {
                            hs.iter().any(|h| {
                                h.ifindex == info.ifindex
                                    && (*deleted || info.mac != Some(h.src_mac))
                            })
                        })
                        .map(|(d, _)| *d),
                );
            }
            Event::Neighbour { neigh, deleted } => {
                let usable = !deleted && neigh.is_usable();
                for dst in self.through(neigh.addr) {
                    let hop = self
                        .entries
                        .get(&dst)
                        .map(|hs| hs.iter().find(|h| h.ifindex == neigh.ifindex));
                    match hop {
                        None if usable => out.resolvable.push(dst),
                        None => {}
                        // A path the destination lacks may now resolve.
                        Some(None) if usable => out.stale.push(dst),
                        Some(None) => {}
                        Some(Some(h)) if usable && neigh.mac == Some(h.dst_mac) => {}
                        Some(Some(_)) => out.stale.push(dst),
                    }
                }
            }
        }
    }

    /// Stops tracking `dst` (nobody sends to it any more). A cached next hop
    /// stays until a refresh finds it gone.
    pub fn forget(&mut self, dst: Ipv6Addr) {
        if !self.entries.contains_key(&dst) {
            self.via.remove(&dst);
        }
    }

    /// How long until the cached entries are due for a [`Self::refresh`] (zero when
    /// due now or never refreshed).
    pub fn refresh_due_in(&self, now: Instant) -> Duration {
        self.last_refresh.map_or(Duration::ZERO, |t| {
            self.max_age.saturating_sub(now.duration_since(t))
        })
    }

    /// Asks the kernel how `dst` is reached right now: one next hop per path
    /// in use whose neighbour is usable, sorted, and whether that is every path
    /// in use. Neighbours not usable yet get a resolution request and are left
    /// out (their path joins when the neighbour is announced, or at a retry);
    /// empty when no path resolves.
    pub fn resolve(&mut self, dst: Ipv6Addr) -> io::Result<(Vec<NextHop>, bool)> {
        let mut paths = Vec::new();
        for p in self.nl.route_paths(dst)? {
            let link = self.nl.link_by_index(p.oif)?;
            let in_use = link.up && link.carrier;
            self.links.insert(p.oif, in_use);
            let usable = p.usable && in_use;
            paths.push((RoutePath { usable, ..p }, link));
        }
        let paths = paths_in_use(paths);
        self.via.insert(
            dst,
            paths
                .iter()
                .map(|(p, _)| (p.oif, p.neighbour(dst)))
                .collect(),
        );
        let mut hops = Vec::with_capacity(paths.len());
        for (p, link) in &paths {
            if let Some(hop) = self.next_hop(dst, p, link)? {
                hops.push(hop);
            }
        }
        let complete = hops.len() == paths.len();
        hops.sort_unstable();
        hops.dedup();
        Ok((hops, complete))
    }

    /// The next hop of one path toward `dst`, or `None` (and a resolution
    /// request) while its neighbour is not usable.
    fn next_hop(
        &mut self,
        dst: Ipv6Addr,
        path: &RoutePath,
        link: &LinkInfo,
    ) -> io::Result<Option<NextHop>> {
        let Some(src_mac) = link.mac else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "route to {dst} leaves through {} which has no MAC",
                    link.name
                ),
            ));
        };
        let hop = path.neighbour(dst);
        match self.nl.neighbour(path.oif, hop)? {
            Some(n) if n.is_usable() => {
                let dst_mac = n
                    .mac
                    .ok_or_else(|| bad_reply("usable neighbour without MAC"))?;
                Ok(Some(NextHop {
                    ifindex: path.oif,
                    src_mac,
                    dst_mac,
                }))
            }
            _ => {
                request_resolution(hop, path.oif)?;
                Ok(None)
            }
        }
    }

    /// Re-resolves `dsts` and stores the answers. A destination that no longer
    /// resolves leaves the cache (its traffic is then a counted
    /// `underlay_unresolved` drop, never a stale MAC).
    pub fn update(&mut self, dsts: &[Ipv6Addr]) -> Refresh {
        let mut out = Refresh::default();
        for &dst in dsts {
            let (hops, complete) = match self.resolve(dst) {
                Ok(r) => r,
                Err(e) => {
                    tracing::debug!(%dst, error = %e, "underlay next hop unresolved");
                    (Vec::new(), false)
                }
            };
            if hops.is_empty() {
                out.unresolved.push(dst);
            } else if !complete {
                out.incomplete.push(dst);
            }
            match store(&mut self.entries, dst, hops) {
                Stored::Unchanged => {}
                Stored::Added => out.next_hops_added = true,
                Stored::Changed => out.next_hops_changed = true,
            }
        }
        out
    }

    /// Re-resolves every cached destination (MAC and route changes show up here).
    pub fn refresh(&mut self, now: Instant) -> Refresh {
        let all: Vec<Ipv6Addr> = self.entries.keys().copied().collect();
        self.last_refresh = Some(now);
        self.update(&all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attrs_stop_on_malformed_length() {
        let mut m = Vec::new();
        push_attr(&mut m, 3, b"eth0\0");
        push_attr(&mut m, 4, &9000u32.to_ne_bytes());
        let got: Vec<_> = attrs(&m).collect();
        assert_eq!(
            got,
            vec![(3, &b"eth0\0"[..]), (4, &9000u32.to_ne_bytes()[..])]
        );
        // Claimed length beyond the buffer: nothing is yielded, no panic.
        let bad = [0xff, 0x00, 0x01, 0x00, 0xaa];
        assert_eq!(attrs(&bad).count(), 0);
        // Length below the header size.
        assert_eq!(attrs(&[2, 0, 1, 0]).count(), 0);
    }

    #[test]
    fn parses_neighbour_message() {
        let mut b = vec![libc::AF_INET6 as u8, 0, 0, 0];
        b.extend_from_slice(&7u32.to_ne_bytes());
        b.extend_from_slice(&(libc::NUD_STALE).to_ne_bytes());
        b.extend_from_slice(&[0, 1]);
        let addr: Ipv6Addr = "fd00::2".parse().unwrap();
        push_attr(&mut b, libc::NDA_DST, &addr.octets());
        push_attr(&mut b, libc::NDA_LLADDR, &[2, 0, 0, 0, 0, 9]);
        let n = parse_neigh(&b).unwrap();
        assert_eq!(
            n,
            Neighbour {
                ifindex: 7,
                addr,
                mac: Some(MacAddr([2, 0, 0, 0, 0, 9])),
                state: libc::NUD_STALE
            }
        );
        assert!(n.is_usable());
        let incomplete = Neighbour {
            state: libc::NUD_INCOMPLETE,
            mac: None,
            ..n
        };
        assert!(!incomplete.is_usable());
        // Truncated bodies are rejected, not indexed.
        for cut in 0..NDMSG_LEN {
            assert!(parse_neigh(&b[..cut]).is_none());
        }
    }

    /// Change detection: only an existing entry that now says something else, or
    /// is gone, is a change (flows compiled with it are wrong); a first answer is
    /// an addition; the same answer, or still nothing, is no change.
    #[test]
    fn store_reports_changed_and_vanished_next_hops() {
        let dst: Ipv6Addr = "fd00::7".parse().unwrap();
        let hop = NextHop {
            ifindex: 2,
            src_mac: MacAddr([2, 0, 0, 0, 0, 1]),
            dst_mac: MacAddr([2, 0, 0, 0, 0, 2]),
        };
        let mut m = HashMap::new();
        assert_eq!(store(&mut m, dst, vec![]), Stored::Unchanged);
        assert!(m.is_empty());
        assert_eq!(store(&mut m, dst, vec![hop]), Stored::Added);
        assert_eq!(store(&mut m, dst, vec![hop]), Stored::Unchanged);
        let new_mac = NextHop {
            dst_mac: MacAddr([2, 0, 0, 0, 0, 3]),
            ..hop
        };
        assert_eq!(store(&mut m, dst, vec![new_mac]), Stored::Changed);
        assert_eq!(m.get(&dst), Some(&vec![new_mac]));
        let new_link = NextHop {
            ifindex: 3,
            ..new_mac
        };
        assert_eq!(store(&mut m, dst, vec![new_link]), Stored::Changed);
        let two = vec![new_mac, new_link];
        assert_eq!(
            store(&mut m, dst, two.clone()),
            Stored::Changed,
            "a path joined"
        );
        assert_eq!(store(&mut m, dst, two), Stored::Unchanged);
        assert_eq!(
            store(&mut m, dst, vec![new_link]),
            Stored::Changed,
            "a path left"
        );
        assert_eq!(store(&mut m, dst, vec![]), Stored::Changed);
        assert!(m.is_empty(), "an unresolved destination leaves the cache");
    }

    /// A netlink message: header (length patched, sequence `seq`) and body.
    fn message(kind: u16, seq: u32, body: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&((NLMSG_HDR_LEN + body.len()) as u32).to_ne_bytes());
        m.extend_from_slice(&kind.to_ne_bytes());
        m.extend_from_slice(&0u16.to_ne_bytes());
        m.extend_from_slice(&seq.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        m.extend_from_slice(body);
        m.resize(align4(m.len()), 0);
        m
    }

    /// Notifications of each kind become events; other families and kinds are
    /// skipped; a datagram whose header lies about its length ends in an error
    /// instead of being read past.
    #[test]
    fn notifications_parse_into_events() {
        let mut link = Vec::new();
        Netlink::ifinfomsg(&mut link, 7, libc::IFF_UP as u32, 0);
        push_attr(&mut link, libc::IFLA_IFNAME, b"ul0\0");
        push_attr(&mut link, libc::IFLA_MTU, &4000u32.to_ne_bytes());
        let mut neigh = vec![libc::AF_INET6 as u8, 0, 0, 0];
        neigh.extend_from_slice(&7u32.to_ne_bytes());
        neigh.extend_from_slice(&libc::NUD_REACHABLE.to_ne_bytes());
        neigh.extend_from_slice(&[0, 1]);
        let addr: Ipv6Addr = "fd00::2".parse().unwrap();
        push_attr(&mut neigh, libc::NDA_DST, &addr.octets());
        let mut route6 = vec![libc::AF_INET6 as u8];
        route6.resize(RTMSG_LEN, 0);
        let mut route4 = vec![libc::AF_INET as u8];
        route4.resize(RTMSG_LEN, 0);
        let mut dgram = message(libc::RTM_DELLINK, 0, &link);
        dgram.extend(message(libc::RTM_NEWNEIGH, 0, &neigh));
        dgram.extend(message(libc::RTM_NEWROUTE, 0, &route6));
        dgram.extend(message(libc::RTM_DELROUTE, 0, &route4));
        dgram.extend(message(libc::RTM_NEWADDR, 0, &route6));
        let events: Vec<Event> = messages(&dgram)
            .map(|m| m.unwrap())
            .filter_map(|m| parse_event(m.kind, m.body))
            .collect();
        let Event::Link { info, deleted } = &events[0] else {
            panic!("{events:?}")
        };
        assert_eq!(
            (info.name.as_str(), info.ifindex, info.mtu),
            ("ul0", 7, 4000)
        );
        assert!(*deleted && info.up);
        assert!(matches!(
            events[1],
            Event::Neighbour { neigh: Neighbour { addr: a, ifindex: 7, mac: None, .. }, deleted: false } if a == addr
        ));
        assert_eq!(
            events[2..],
            [Event::Route],
            "IPv4 routes and addresses skipped"
        );
        let mut lying = message(libc::RTM_NEWROUTE, 0, &route6);
        lying[0] = 200;
        assert!(messages(&lying).next().unwrap().is_err());
        assert!(
            parse_event(libc::RTM_NEWLINK, &[0; 3]).is_none(),
            "truncated"
        );
    }

    /// A neighbour becoming usable makes the unresolved destinations behind it
    /// resolvable; a cached next hop is stale when its neighbour's MAC changes,
    /// fails or goes, or its link's MAC changes or the link goes; state changes
    /// that keep the MAC, other links, and other neighbours change nothing.
    #[test]
    fn notifications_select_the_destinations_they_affect() {
        let gw: Ipv6Addr = "fd00::1".parse().unwrap();
        let (cached, waiting, elsewhere): (Ipv6Addr, Ipv6Addr, Ipv6Addr) = (
            "fd00:99::1".parse().unwrap(),
            "fd00:99::2".parse().unwrap(),
            "fd00:98::1".parse().unwrap(),
        );
        let hop = NextHop {
            ifindex: 2,
            src_mac: MacAddr([2, 0, 0, 0, 0, 1]),
            dst_mac: MacAddr([2, 0, 0, 0, 0, 2]),
        };
        let mut cache = NeighbourCache::new(Duration::from_secs(30)).unwrap();
        store(&mut cache.entries, cached, vec![hop]);
        cache.via.extend([
            (cached, vec![(2, gw)]),
            (waiting, vec![(2, gw)]),
            (elsewhere, vec![(2, elsewhere)]),
        ]);
        cache.links.insert(2, true);
        let neigh = |state: u16, mac: Option<MacAddr>, deleted: bool| Event::Neighbour {
            neigh: Neighbour {
                ifindex: 2,
                addr: gw,
                mac,
                state,
            },
            deleted,
        };
        let affected = |ev: Event| {
            let mut a = Affected::default();
            cache.affected_by(&ev, &mut a);
            a
        };
        let reachable = affected(neigh(libc::NUD_REACHABLE, Some(hop.dst_mac), false));
        assert_eq!(
            (reachable.resolvable, reachable.stale),
            (vec![waiting], vec![])
        );
        let stale = affected(neigh(libc::NUD_STALE, Some(hop.dst_mac), false));
        assert!(stale.stale.is_empty(), "same MAC, still usable");
        let moved = affected(neigh(
            libc::NUD_REACHABLE,
            Some(MacAddr([2, 0, 0, 0, 0, 9])),
            false,
        ));
        assert_eq!(moved.stale, vec![cached]);
        let failed = affected(neigh(libc::NUD_FAILED, None, false));
        assert_eq!((failed.resolvable, failed.stale), (vec![], vec![cached]));
        assert_eq!(
            affected(neigh(libc::NUD_REACHABLE, Some(hop.dst_mac), true)).stale,
            vec![cached]
        );
        let link_in = |ifindex: u32, mac: MacAddr, deleted: bool, carrier: bool| Event::Link {
            info: LinkInfo {
                name: "ul0".into(),
                ifindex,
                mtu: 9000,
                mac: Some(mac),
                up: true,
                carrier,
                tx_dropped: 0,
            },
            deleted,
        };
        let link = |ifindex, mac, deleted| link_in(ifindex, mac, deleted, true);
        assert!(
            affected(link(2, hop.src_mac, false)).stale.is_empty(),
            "MTU or state change"
        );
        assert_eq!(
            affected(link(2, MacAddr([2, 0, 0, 0, 0, 7]), false)).stale,
            vec![cached]
        );
        assert_eq!(affected(link(2, hop.src_mac, true)).stale, vec![cached]);
        assert!(
            affected(link(3, hop.src_mac, true)).stale.is_empty(),
            "another link"
        );
        assert!(affected(Event::Route).all && affected(Event::Lost).all);
        // A known link losing its carrier re-resolves everything (the kernel
        // marks its paths without a route notification); an unknown one does not.
        assert!(!affected(link(2, hop.src_mac, false)).all, "no change");
        assert!(affected(link_in(2, hop.src_mac, false, false)).all);
        assert!(!affected(link_in(3, hop.src_mac, false, false)).all);
        // A usable neighbour on a path a cached destination lacks: resolved again.
        let other_path = Event::Neighbour {
            neigh: Neighbour {
                ifindex: 5,
                addr: gw,
                mac: Some(hop.dst_mac),
                state: libc::NUD_REACHABLE,
            },
            deleted: false,
        };
        let a = affected(other_path);
        assert_eq!((a.resolvable, a.stale), (vec![waiting], vec![cached]));
    }

    #[test]
    fn route_neighbour_prefers_gateway() {
        let dst: Ipv6Addr = "fd00:1::5".parse().unwrap();
        let gw: Ipv6Addr = "fe80::1".parse().unwrap();
        let r = RoutePath {
            oif: 2,
            gateway: Some(gw),
            usable: true,
        };
        assert_eq!(r.neighbour(dst), gw);
        assert_eq!(RoutePath { gateway: None, ..r }.neighbour(dst), dst);
    }

    /// An `RTM_NEWROUTE` body with `RTA_MULTIPATH` gives one path per next hop,
    /// dead and carrier-less ones marked; without it, the route's own interface
    /// and gateway, marked by the route's flags; a truncated next hop is
    /// rejected, not read past.
    #[test]
    fn routes_parse_into_paths() {
        let (g1, g2): (Ipv6Addr, Ipv6Addr) =
            ("fd00:1::1".parse().unwrap(), "fd00:2::1".parse().unwrap());
        let nexthop = |flags: u8, ifindex: u32, gw: Ipv6Addr| {
            let mut a = Vec::new();
            push_attr(&mut a, libc::RTA_GATEWAY, &gw.octets());
            let mut nh = ((RTNEXTHOP_LEN + a.len()) as u16).to_ne_bytes().to_vec();
            nh.extend_from_slice(&[flags, 0]);
            nh.extend_from_slice(&ifindex.to_ne_bytes());
            nh.extend(a);
            nh
        };
        let rtmsg = |flags: u32| {
            let mut b = vec![libc::AF_INET6 as u8, 128, 0, 0, 254, 3, 0, 1];
            b.extend_from_slice(&flags.to_ne_bytes());
            b
        };
        let mut multi = nexthop(0, 2, g1);
        multi.extend(nexthop(RTNH_F_LINKDOWN as u8, 3, g2));
        multi.extend(nexthop((RTNH_F_DEAD | RTNH_F_LINKDOWN) as u8, 4, g2));
        let mut body = rtmsg(0);
        push_attr(&mut body, libc::RTA_MULTIPATH, &multi);
        let paths = parse_route(&body).unwrap();
        let got: Vec<_> = paths.iter().map(|p| (p.oif, p.gateway, p.usable)).collect();
        assert_eq!(
            got,
            [
                (2, Some(g1), true),
                (3, Some(g2), false),
                (4, Some(g2), false)
            ]
        );
        let mut single = rtmsg(RTNH_F_LINKDOWN);
        push_attr(&mut single, libc::RTA_OIF, &7u32.to_ne_bytes());
        assert_eq!(
            parse_route(&single).unwrap(),
            [RoutePath {
                oif: 7,
                gateway: None,
                usable: false
            }]
        );
        let mut cut = rtmsg(0);
        push_attr(&mut cut, libc::RTA_MULTIPATH, &nexthop(0, 2, g1)[..10]);
        assert!(parse_route(&cut).is_none(), "truncated next hop");
        assert!(parse_route(&rtmsg(0)).is_none(), "no interface at all");
        // Every path in use when one is; all of them when none is.
        let p = |usable| (RoutePath { usable, ..paths[0] }, ());
        assert_eq!(paths_in_use(vec![p(true), p(false)]).len(), 1);
        assert_eq!(paths_in_use(vec![p(false), p(false)]).len(), 2);
    }

    /// Link facts, route lookup and the neighbour cache against a real veth
    /// pair: a first pass misses and triggers resolution, a later one finds the
    /// peer's MAC; after the peer's MAC changes, a refresh reports the change.
    #[test]
    fn neighbour_cache_resolves_peer() {
        use crate::testnet::{VethPair, MAC_A, MAC_B};
        let pair = VethPair::new(9000);
        pair.a.ip(&[
            "-6",
            "route",
            "add",
            "fd00:99::/64",
            "via",
            "fd00::b",
            "dev",
            "va",
        ]);
        let (a_name, b_name) = (pair.a.name.clone(), pair.b.name.clone());
        pair.a.run(move || {
            let ip = |ns: &str, args: &[&str]| {
                let ok = std::process::Command::new("ip")
                    .arg("-n")
                    .arg(ns)
                    .args(args)
                    .status()
                    .is_ok_and(|s| s.success());
                assert!(ok, "ip -n {ns} {args:?}");
            };
            let mut nl = Netlink::open().unwrap();
            let va = nl.link_by_name("va").unwrap();
            assert_eq!((va.mtu, va.mac, va.up), (9000, Some(MacAddr(MAC_A)), true));
            assert_eq!(nl.link_by_index(va.ifindex).unwrap().name, "va");
            let e = nl.link_by_name("nonexistent0").unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::NotFound);
            assert!(e.to_string().contains("nonexistent0"), "{e}");

            let peer: Ipv6Addr = "fd00::b".parse().unwrap();
            let far: Ipv6Addr = "fd00:99::7".parse().unwrap();
            let r = nl.route_paths(far).unwrap();
            let via_peer = RoutePath {
                oif: va.ifindex,
                gateway: Some(peer),
                usable: true,
            };
            assert_eq!(r, [via_peer]);
            assert_eq!(
                nl.route_paths(peer).unwrap(),
                [RoutePath {
                    gateway: None,
                    ..via_peer
                }]
            );
            assert!(
                nl.route_paths("2001:db8::1".parse().unwrap()).is_err(),
                "no default route"
            );

            let mut cache = NeighbourCache::new(Duration::from_secs(30)).unwrap();
            let now = Instant::now();
            assert_eq!(cache.refresh_due_in(now), Duration::ZERO);
            // The first pass finds no neighbour entry and asks the kernel to resolve.
            let r = cache.update(&[far]);
            assert_eq!(r.unresolved, vec![far]);
            assert!(!r.next_hops_changed && !r.next_hops_added);
            assert!(cache.entries().is_empty());
            let want = NextHop {
                ifindex: va.ifindex,
                src_mac: MacAddr(MAC_A),
                dst_mac: MacAddr(MAC_B),
            };
            let deadline = Instant::now() + Duration::from_secs(3);
            let mut added = false;
            while cache.entries().get(&far).is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
                added |= cache.update(&[far]).next_hops_added;
            }
            assert_eq!(cache.entries().get(&far), Some(&vec![want]));
            assert!(added, "the first next hop is reported as added");
            // Nothing moved: a refresh changes nothing and is due again in max_age.
            let later = Instant::now();
            assert_eq!(cache.refresh(later), Refresh::default());
            assert_eq!(cache.refresh_due_in(later), Duration::from_secs(30));
            // The peer's MAC changes: the refresh reports a changed next hop.
            ip(
                &b_name,
                &["link", "set", "vb", "address", "02:00:00:00:00:42"],
            );
            ip(
                &a_name,
                &[
                    "-6",
                    "neigh",
                    "replace",
                    "fd00::b",
                    "lladdr",
                    "02:00:00:00:00:42",
                    "dev",
                    "va",
                ],
            );
            let r = cache.refresh(Instant::now());
            assert!(r.next_hops_changed, "{r:?}");
            assert_eq!(
                cache.entries().get(&far).map(|h| h[0].dst_mac),
                Some(MacAddr([2, 0, 0, 0, 0, 0x42]))
            );
            let n = nl
                .neighbour(va.ifindex, peer)
                .unwrap()
                .expect("kernel entry");
            assert!(n.is_usable(), "state {:#x}", n.state);
        });
    }

    /// Waits up to 3 s for an event `want` accepts, draining `events`.
    fn wait_for(events: &mut Events, what: &str, want: impl Fn(&Event) -> bool) -> Event {
        let mut ep = crate::poll::Epoll::new().unwrap();
        ep.add(events.as_raw_fd(), 1).unwrap();
        let deadline = Instant::now() + Duration::from_secs(3);
        let mut seen = Vec::new();
        while Instant::now() < deadline {
            ep.wait(Duration::from_millis(100)).unwrap().for_each(drop);
            let mut got = Vec::new();
            events.drain(&mut got).unwrap();
            if let Some(e) = got.iter().find(|e| want(e)) {
                return e.clone();
            }
            seen.extend(got);
        }
        panic!("no {what} event within 3 s; saw {seen:?}");
    }

    /// A subscription hears of an MTU change, a neighbour becoming usable and a
    /// route added, as they happen; and the cache knows which destinations go
    /// through that neighbour.
    #[test]
    fn events_announce_link_neighbour_and_route_changes() {
        use crate::testnet::{VethPair, MAC_B};
        let pair = VethPair::new(9000);
        let a_name = pair.a.name.clone();
        pair.a.run(move || {
            let ip = |args: &[&str]| {
                let ok = std::process::Command::new("ip")
                    .args(["-n", &a_name])
                    .args(args)
                    .status()
                    .is_ok_and(|s| s.success());
                assert!(ok, "ip {args:?}");
            };
            let mut events =
                Events::subscribe(&[Group::Link, Group::Neighbour, Group::Ipv6Route]).unwrap();
            ip(&["link", "set", "va", "mtu", "4000"]);
            let e = wait_for(&mut events, "MTU", |e| {
                matches!(e, Event::Link { info, deleted: false } if info.name == "va" && info.mtu == 4000)
            });
            let Event::Link { info, .. } = e else { unreachable!() };
            ip(&["-6", "route", "add", "fd00:99::/64", "via", "fd00::b", "dev", "va"]);
            wait_for(&mut events, "route", |e| *e == Event::Route);
            let peer: Ipv6Addr = "fd00::b".parse().unwrap();
            let far: Ipv6Addr = "fd00:99::7".parse().unwrap();
            let mut cache = NeighbourCache::new(Duration::from_secs(30)).unwrap();
            assert_eq!(cache.update(&[far]).unresolved, vec![far]);
            assert_eq!(cache.through(peer).collect::<Vec<_>>(), vec![far]);
            wait_for(&mut events, "usable neighbour", |e| {
                matches!(e, Event::Neighbour { neigh, deleted: false }
                    if neigh.addr == peer && neigh.ifindex == info.ifindex && neigh.is_usable()
                        && neigh.mac == Some(MacAddr(MAC_B)))
            });
            assert!(cache.update(&[far]).unresolved.is_empty(), "resolved once announced");
            cache.forget(far);
            assert_eq!(cache.through(peer).count(), 1, "a cached destination stays tracked");
        });
    }
}
