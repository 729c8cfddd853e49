//! Captures that show where hostile frames went: on every guest (nothing hostile
//! may arrive there) and on each sled's switch port (what the sled's XDP program
//! was given, to account for every frame).

use crate::capture::Capture;
use crate::frames::{self, be16};
use crate::guest::Guest;
use crate::inject::{mac_of, mac_string, ROGUE_MAC};
use crate::netns::Netns;
use crate::pcap;
use crate::rack::UNDERLAY_IF;
use crate::{Result, Sled};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

/// A capture of what a guest receives, except one TCP port (a transfer's, too
/// busy to record and checked on its own).
#[derive(Debug)]
pub struct LeakWatch {
    capture: Capture,
    guest: GuestView,
}

/// What a leak check needs to know of the guest.
#[derive(Debug)]
struct GuestView {
    name: String,
    file: PathBuf,
    gateway_v4: Ipv4Addr,
    gateway_v6: Ipv6Addr,
}

impl LeakWatch {
    /// Starts capturing what the datapath delivers on `guest`'s interface (frames
    /// from the gateway's MAC: the datapath rewrites the source MAC of everything
    /// it delivers), except TCP port `except_port`. libpcap's `inbound` is no help
    /// here: it misses multicast frames.
    pub fn start(guest: &Guest, dir: &Path, except_port: u16) -> Result<LeakWatch> {
        let file = dir.join(format!("leak-{}.pcap", guest.spec.name));
        let filter = format!(
            "ether src {} and not tcp port {except_port}",
            guest.spec.gateway_mac
        );
        let capture = Capture::start(&guest.ns, guest.ifname(), &file, &filter)?;
        Ok(LeakWatch {
            capture,
            guest: GuestView {
                name: guest.spec.name.clone(),
                file,
                gateway_v4: guest.spec.gateway_ipv4,
                gateway_v6: guest.spec.gateway_ipv6()?,
            },
        })
    }

    /// Stops the capture and describes every frame the guest should not have got:
    /// anything that is not the virtual gateway speaking (ARP replies, RAs and NAs,
    /// echo replies, and ICMP errors, which may quote a hostile frame's marker).
    pub fn finish(self) -> Result<Vec<String>> {
        let LeakWatch { capture, guest } = self;
        // Dropping the capture stops tcpdump cleanly (the file is complete).
        drop(capture);
        guest.leaks()
    }
}

impl GuestView {
    fn leaks(&self) -> Result<Vec<String>> {
        let mut leaks = Vec::new();
        for r in pcap::read(&self.file)? {
            let f = &r.data;
            if self.sent_by_gateway(f) {
                continue;
            }
            leaks.push(match frames::find_marker(f) {
                Some(m) => format!(
                    "{} received hostile frame {m} ({} bytes)",
                    self.name, r.orig_len
                ),
                None => format!(
                    "{} received an unexpected {}-byte frame: {:02x?}",
                    self.name,
                    r.orig_len,
                    &f[..f.len().min(64)]
                ),
            });
        }
        Ok(leaks)
    }

    fn sent_by_gateway(&self, f: &[u8]) -> bool {
        match (f.len() >= 14).then(|| be16(f, 12)) {
            Some(frames::ETHERTYPE_ARP) => f.get(28..32) == Some(&self.gateway_v4.octets()[..]),
            Some(frames::ETHERTYPE_IPV4) => f.get(26..30) == Some(&self.gateway_v4.octets()[..]),
            Some(frames::ETHERTYPE_IPV6) => f.get(22..38) == Some(&self.gateway_v6.octets()[..]),
            _ => false,
        }
    }
}

/// A capture on a sled's switch port of every frame toward the sled that the XDP
/// program does not steer as legitimate Geneve: everything from the rogue host,
/// and everything that is not IPv6/UDP to port 6081 (the NDP, RS and MLD of the
/// other sleds' kernels and the bridge's own). Legitimate Geneve is left out:
/// there is too much of it, and the accounting does not need it. Frames carry
/// their capture time, so the kernels' occasional frames are counted in the same
/// window as the XDP counters.
#[derive(Debug)]
pub struct WireWatch {
    capture: Capture,
    file: PathBuf,
    /// The sled's underlay addresses (for the XDP model).
    pub addrs: Vec<Ipv6Addr>,
}

impl WireWatch {
    pub fn start(switch: &Netns, sled: &Sled, dir: &Path) -> Result<WireWatch> {
        let file = dir.join(format!("wire-{}.pcap", sled.bridge_port));
        // Both directions pass the port: the sled's own frames are told apart by
        // their source MAC (libpcap's `outbound` misses frames the bridge forwards).
        let filter = format!(
            "not ether src {} and (ether src {} or not (ip6 and udp dst port {}))",
            mac_of(&sled.ns, UNDERLAY_IF)?,
            mac_string(ROGUE_MAC),
            frames::GENEVE_PORT
        );
        let capture = Capture::start(switch, &sled.bridge_port, &file, &filter)?;
        Ok(WireWatch {
            capture,
            file,
            addrs: vec![sled.addr],
        })
    }

    /// Stops the capture; returns the frames (the first 512 bytes of each) with
    /// the time each passed the switch port.
    pub fn finish(self) -> Result<Vec<pcap::Record>> {
        let WireWatch { capture, file, .. } = self;
        drop(capture);
        pcap::read(&file)
    }
}

/// Whether `f` was sent by the rogue host.
pub fn from_rogue(f: &[u8]) -> bool {
    f.get(6..12) == Some(&ROGUE_MAC[..])
}
