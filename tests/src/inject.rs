//! Putting raw Ethernet frames on a link: an AF_PACKET socket bound to one interface
//! of a network namespace, and a rogue host on the rack's switch that sends through
//! one (the attacker of the hostile-underlay tests, `tests/tests/hostile.rs`).
//!
//! The frames go out exactly as given: no checksum, length or header is fixed up on
//! the way, so a test can send every kind of malformed frame. The kernel refuses only
//! frames shorter than an Ethernet header (14 bytes) or longer than the link's MTU.

use crate::cmd::Cmd;
use crate::netns::Netns;
use crate::rack::{Rack, BRIDGE, UNDERLAY_IF, UNDERLAY_MTU};
use crate::{Context, Error, Result};
use std::net::Ipv6Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// A send-only AF_PACKET socket for one interface.
#[derive(Debug)]
pub struct RawSocket {
    fd: OwnedFd,
    ifindex: i32,
    /// `IFACE in NAMESPACE`, for errors.
    what: String,
    /// Whether `PACKET_VNET_HDR` is on ([`RawSocket::with_vnet_hdr`]): every frame
    /// sent is then read behind a `virtio_net_hdr`.
    vnet_hdr: bool,
}

impl RawSocket {
    /// Opens a socket in namespace `ns` for its interface `ifname`. The socket is
    /// created on a thread that entered the namespace and keeps that namespace for
    /// its life, so sending needs no further namespace switch. It is opened with
    /// protocol 0: it receives nothing, so it never queues the link's traffic.
    pub fn open(ns: &Netns, ifname: &str) -> Result<RawSocket> {
        let what = format!("{ifname} in {}", ns.name());
        let ifindex = ifindex(ns, ifname)?;
        let handle = std::fs::File::open(format!("/run/netns/{}", ns.name()))
            .with_context(|| format!("opening the handle of namespace {}", ns.name()))?;
        let fd = std::thread::spawn(move || -> std::io::Result<OwnedFd> {
            // SAFETY: setns(2) on a valid namespace fd changes only this thread's
            // network namespace; the thread ends right after.
            if unsafe { libc::setns(handle.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // SAFETY: socket(2) has no memory-safety preconditions.
            let fd =
                unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // SAFETY: a fresh descriptor that nothing else owns.
            Ok(unsafe { OwnedFd::from_raw_fd(fd) })
        })
        .join()
        .map_err(|_| Error::new(format!("AF_PACKET socket for {what}: the thread panicked")))?
        .with_context(|| format!("AF_PACKET socket for {what}"))?;
        Ok(RawSocket {
            fd,
            ifindex,
            what,
            vnet_hdr: false,
        })
    }

    /// Sends one frame as it is.
    pub fn send(&self, frame: &[u8]) -> Result<()> {
        if self.vnet_hdr {
            return Err(Error::new(format!(
                "{} has PACKET_VNET_HDR on: send with send_with_vnet_hdr",
                self.what
            )));
        }
        self.send_raw(frame, frame)
    }

    /// The socket with `PACKET_VNET_HDR` on (it stays on for the socket's life):
    /// each frame then goes behind a 10-byte `virtio_net_hdr`
    /// ([`Self::send_with_vnet_hdr`]) and the kernel takes its offloads.
    pub fn with_vnet_hdr(mut self) -> Result<RawSocket> {
        let on: libc::c_int = 1;
        // SAFETY: setsockopt reads one c_int of the length passed.
        let r = unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_VNET_HDR,
                (&on as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(Error::new(format!(
                "PACKET_VNET_HDR on {}: {}",
                self.what,
                std::io::Error::last_os_error()
            )));
        }
        self.vnet_hdr = true;
        Ok(self)
    }

    /// Sends one frame behind the `virtio_net_hdr` `vnet` on a socket
    /// [`Self::with_vnet_hdr`]: a GSO frame larger than the link's MTU goes out
    /// whole to a device with TSO (a tap) as a guest's TCP stack sends one.
    pub fn send_with_vnet_hdr(&self, vnet: &[u8; 10], frame: &[u8]) -> Result<()> {
        if !self.vnet_hdr {
            return Err(Error::new(format!(
                "{} has no PACKET_VNET_HDR: open it with_vnet_hdr",
                self.what
            )));
        }
        let mut bytes = vnet.to_vec();
        bytes.extend_from_slice(frame);
        self.send_raw(frame, &bytes)
    }

    /// Sends `bytes` (the frame `frame`, behind a vnet header if one was asked for).
    fn send_raw(&self, frame: &[u8], bytes: &[u8]) -> Result<()> {
        let ethertype = frame.get(12..14).map_or([0, 0], |t| [t[0], t[1]]);
        let addr = libc::sockaddr_ll {
            sll_family: libc::AF_PACKET as u16,
            // Network order, as the frame carries it.
            sll_protocol: u16::from_ne_bytes(ethertype),
            sll_ifindex: self.ifindex,
            sll_hatype: 0,
            sll_pkttype: 0,
            sll_halen: 6,
            sll_addr: [0; 8],
        };
        // SAFETY: `bytes` is valid for reads of its length and `addr` is a
        // sockaddr_ll whose size is passed with it.
        let n = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                bytes.as_ptr().cast(),
                bytes.len(),
                0,
                (&addr as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if n == bytes.len() as isize {
            return Ok(());
        }
        Err(Error::new(format!(
            "sending a {}-byte frame on {}: {}",
            frame.len(),
            self.what,
            if n < 0 {
                std::io::Error::last_os_error().to_string()
            } else {
                format!("only {n} bytes went out")
            }
        )))
    }
}

/// The interface index of `ifname` inside `ns` (from `ip -j link show`).
pub fn ifindex(ns: &Netns, ifname: &str) -> Result<i32> {
    link_field(ns, ifname, "ifindex")?
        .as_i64()
        .and_then(|i| i32::try_from(i).ok())
        .ok_or_else(|| Error::new(format!("{ifname} in {} has no ifindex", ns.name())))
}

/// The MAC address of `ifname` inside `ns`, as `ip` prints it (`aa:bb:...`).
pub fn mac_of(ns: &Netns, ifname: &str) -> Result<String> {
    link_field(ns, ifname, "address")?
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| Error::new(format!("{ifname} in {} has no MAC address", ns.name())))
}

fn link_field(ns: &Netns, ifname: &str, field: &str) -> Result<serde_json::Value> {
    let out = ns.ip(&["-j", "link", "show", "dev", ifname])?;
    let v: serde_json::Value = serde_json::from_str(&out)
        .map_err(|e| Error::new(format!("`ip -j link show {ifname}` printed {out:?}: {e}")))?;
    Ok(v[0][field].clone())
}

/// The rogue host's MAC address (locally administered, unicast).
pub const ROGUE_MAC: [u8; 6] = [0x02, 0xbd, 0x00, 0x00, 0x00, 0x66];

/// The rogue's interface inside its own namespace.
pub const ROGUE_IF: &str = "rg0";

/// The rogue's port on the switch's bridge.
pub const ROGUE_PORT: &str = "rg";

/// A host on the rack's switch that is not a sled: a namespace whose veth is a port
/// of the bridge, with an address in the sleds' underlay /64 that it puts in the
/// outer source of what it sends.
///
/// Its own kernel is mute (IPv6 disabled, no IPv4 address): every frame from
/// [`ROGUE_MAC`] on the switch is one the test injected, so captures can count them
/// exactly. Joining also pins every sled's MAC to its bridge port (static FDB
/// entries), so a frame for a sled goes to that sled only, never flooded to all.
#[derive(Debug)]
pub struct Rogue {
    pub ns: Netns,
    /// The underlay address it claims as outer source.
    pub addr: Ipv6Addr,
    socket: RawSocket,
}

impl Rogue {
    /// Plugs a rogue host into `rack`'s switch.
    pub fn join(rack: &Rack) -> Result<Rogue> {
        let ns = Netns::create(
            &format!("{}-rg", rack.id),
            &[
                ("net.ipv6.conf.all.disable_ipv6", "1"),
                ("net.ipv6.conf.default.disable_ipv6", "1"),
            ],
        )?;
        let mtu = UNDERLAY_MTU.to_string();
        Cmd::new("ip")
            .args(["link", "add", ROGUE_IF, "netns", ns.name(), "mtu", &mtu])
            .args(["type", "veth", "peer", "name", ROGUE_PORT])
            .args(["netns", rack.switch.name(), "mtu", &mtu])
            .run()
            .context("creating the rogue host's veth")?;
        ns.ip(&[
            "link",
            "set",
            ROGUE_IF,
            "address",
            &mac_string(ROGUE_MAC),
            "up",
        ])?;
        rack.switch
            .ip(&["link", "set", ROGUE_PORT, "master", BRIDGE, "up"])?;
        for sled in &rack.sleds {
            // The bridge takes a VLAN tag off into the frame's metadata on receipt
            // and a veth would pass it on there, where the sled's XDP program cannot
            // see it: with tx VLAN offload off, the switch port writes the tag back
            // into the frame, as it is on a real wire.
            rack.switch
                .run("ethtool", &["-K", &sled.bridge_port, "txvlan", "off"])?;
            let mac = mac_of(&sled.ns, UNDERLAY_IF)?;
            rack.switch.run(
                "bridge",
                &[
                    "fdb",
                    "replace",
                    &mac,
                    "dev",
                    &sled.bridge_port,
                    "master",
                    "static",
                ],
            )?;
        }
        let socket = RawSocket::open(&ns, ROGUE_IF)?;
        Ok(Rogue {
            ns,
            addr: ROGUE_ADDR,
            socket,
        })
    }

    /// Puts one frame on the switch.
    pub fn send(&self, frame: &[u8]) -> Result<()> {
        self.socket.send(frame)
    }
}

/// The rogue's claimed underlay address: in the sleds' /64 but at least four bytes
/// away from every sled's `fd00:99::N`, so a few corrupted bytes never turn it into
/// a real sled's address.
pub const ROGUE_ADDR: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x99, 0, 0, 0xbad, 0xbad, 0xbad, 0xbad);

/// `aa:bb:cc:dd:ee:ff`.
pub fn mac_string(mac: [u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Parses `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(s: &str) -> Result<[u8; 6]> {
    let bytes: Vec<u8> = s
        .split(':')
        .map(|b| u8::from_str_radix(b, 16))
        .collect::<Result<_, _>>()
        .map_err(|e| Error::new(format!("MAC {s:?}: {e}")))?;
    bytes
        .try_into()
        .map_err(|_| Error::new(format!("MAC {s:?} does not have 6 bytes")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_round_trip_and_bad_ones_are_named() {
        assert_eq!(mac_string(ROGUE_MAC), "02:bd:00:00:00:66");
        assert_eq!(parse_mac("02:bd:00:00:00:66").unwrap(), ROGUE_MAC);
        let e = parse_mac("02:bd:00").unwrap_err();
        assert!(e.0.contains("02:bd:00"), "{e}");
        assert!(parse_mac("zz:bd:00:00:00:66").is_err());
    }

    #[test]
    fn rogue_address_is_far_from_every_sled() {
        for i in 0..16 {
            let sled = crate::rack::sled_underlay_addr(i).octets();
            let differ = ROGUE_ADDR
                .octets()
                .iter()
                .zip(sled)
                .filter(|(a, b)| *a != b)
                .count();
            assert!(differ >= 4, "sled {i}: only {differ} bytes differ");
        }
    }
}
