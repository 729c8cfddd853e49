//! `xdeadm ra listen IFACE`: run inside a guest, solicit a Router Advertisement on
//! IFACE and report what the router (our datapath's gateway) says.
//!
//! This checks the datapath from the guest's side with nothing but a raw ICMPv6
//! socket: it shows exactly what the guest's kernel would learn (MTU, flags,
//! lifetimes), which is what matters when a guest ends up with the wrong MTU. The
//! messages are built and parsed with `wire::ndp`, the same code the gateway uses,
//! but the checksum is verified independently by the kernel on receive and our
//! own parse verifies it again against the addresses the packet arrived with.

use icmp6::{Icmp6Socket, Link};
use serde::Serialize;
use std::io;
use std::net::Ipv6Addr;
use std::time::{Duration, Instant};
use wire::icmpv6::msg;
use wire::ndp::{self, RaSummary};
use wire::{MacAddr, WireError};

/// All-routers link-local multicast (RFC 4291), where a Router Solicitation goes.
pub const ALL_ROUTERS: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 2);

/// Why no Router Advertisement was reported, or why one received was not taken;
/// each names the interface or the sender.
#[derive(Debug, thiserror::Error)]
pub enum RaListenError {
    #[error("interface {iface:?}: {error}")]
    Interface { iface: String, error: io::Error },
    #[error("raw ICMPv6 socket on {iface:?}: {error} (needs root or CAP_NET_RAW)")]
    Socket { iface: String, error: io::Error },
    #[error("cannot build Router Solicitation: {0}")]
    Solicitation(WireError),
    #[error("send Router Solicitation on {iface:?}: {error}")]
    Send { iface: String, error: io::Error },
    #[error("receive on {iface:?}: {error}")]
    Receive { iface: String, error: io::Error },
    #[error("ICMPv6 message from {from}: {error}")]
    NotAnRa { from: Ipv6Addr, error: WireError },
    #[error(
        "could not send a Router Solicitation on {iface:?} within {} s (no usable link-local address yet?)",
        timeout.as_secs_f32()
    )]
    NothingSent { iface: String, timeout: Duration },
    #[error(
        "no Router Advertisement on {iface:?} within {} s ({sent} solicitations sent)",
        timeout.as_secs_f32()
    )]
    NoAnswer {
        iface: String,
        timeout: Duration,
        sent: u32,
    },
}

/// What the guest learnt from one Router Advertisement.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RaReport {
    pub interface: String,
    /// The router's address (its IPv6 source).
    pub source: Ipv6Addr,
    pub destination: Ipv6Addr,
    /// The IPv6 hop limit the RA arrived with: RFC 4861 §6.1.2 requires 255 (proof it
    /// was not forwarded).
    pub ip_hop_limit: Option<u8>,
    /// The RA's own fields, decoded by the same `wire::ndp` code the gateway's `ra`
    /// inspection uses (so both print the same names).
    #[serde(flatten)]
    pub ra: RaSummary,
    /// How long after the last Router Solicitation the RA arrived (an unsolicited
    /// RA may arrive sooner than any answer could).
    pub after_ms: u128,
}

impl RaReport {
    /// Decodes an ICMPv6 message received from `source` to `destination` as a Router
    /// Advertisement; anything else (or a bad checksum) is an error naming why.
    pub fn decode(
        interface: &str,
        msg_bytes: &[u8],
        source: Ipv6Addr,
        destination: Ipv6Addr,
        ip_hop_limit: Option<u8>,
        after: Duration,
    ) -> Result<RaReport, RaListenError> {
        let ra = RaSummary::decode(msg_bytes, source, destination).map_err(|error| {
            RaListenError::NotAnRa {
                from: source,
                error,
            }
        })?;
        Ok(RaReport {
            interface: interface.to_string(),
            source,
            destination,
            ip_hop_limit,
            ra,
            after_ms: after.as_millis(),
        })
    }

    /// Problems a guest would have with this RA, per RFC 4861 and our gateway's
    /// contract.
    pub fn warnings(&self) -> Vec<String> {
        let mut w = Vec::new();
        if self.ip_hop_limit.is_some_and(|h| h != 255) {
            w.push(format!(
                "IPv6 hop limit {} is not 255: hosts discard this RA",
                self.ip_hop_limit.unwrap_or(0)
            ));
        }
        if !is_link_local(self.source) {
            w.push(format!(
                "source {} is not link-local: hosts discard this RA",
                self.source
            ));
        }
        match self.ra.mtu {
            None => w.push("no MTU option: the guest keeps its link's MTU".into()),
            Some(m) if m < 1280 => w.push(format!("MTU {m} is below 1280: hosts ignore it")),
            Some(_) => {}
        }
        if self.ra.router_lifetime_s == 0 {
            w.push("router lifetime 0: not a default router".into());
        }
        w
    }
}

fn is_link_local(a: Ipv6Addr) -> bool {
    a.segments()[0] & 0xffc0 == 0xfe80
}

impl core::fmt::Display for RaReport {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let opt = |v: Option<String>| v.unwrap_or_else(|| "-".into());
        writeln!(f, "Router Advertisement on {}", self.interface)?;
        writeln!(f, "  from                {}", self.source)?;
        writeln!(f, "  to                  {}", self.destination)?;
        writeln!(
            f,
            "  IPv6 hop limit      {}",
            opt(self.ip_hop_limit.map(|h| h.to_string()))
        )?;
        writeln!(f, "  cur hop limit       {}", self.ra.cur_hop_limit)?;
        writeln!(
            f,
            "  flags               M={} O={}",
            u8::from(self.ra.managed),
            u8::from(self.ra.other)
        )?;
        writeln!(f, "  router lifetime     {} s", self.ra.router_lifetime_s)?;
        writeln!(f, "  reachable time      {} ms", self.ra.reachable_time_ms)?;
        writeln!(f, "  retrans timer       {} ms", self.ra.retrans_time_ms)?;
        writeln!(
            f,
            "  MTU                 {}",
            opt(self.ra.mtu.map(|m| m.to_string()))
        )?;
        writeln!(
            f,
            "  source link-layer   {}",
            opt(self.ra.source_link_layer_addr.map(|m| m.to_string()))
        )?;
        if let Some(p) = &self.ra.prefix_info {
            writeln!(f, "  prefix              {p}")?;
        }
        writeln!(f, "  received after      {} ms", self.after_ms)?;
        for w in self.warnings() {
            writeln!(f, "  warning: {w}")?;
        }
        Ok(())
    }
}

/// The Router Solicitation we send: no options when we have no MAC to offer.
pub fn router_solicitation(lladdr: Option<MacAddr>) -> Result<Vec<u8>, RaListenError> {
    let repr = ndp::Repr::RouterSolicit { lladdr };
    let mut buf = vec![0u8; repr.buffer_len()];
    let mut p = ndp::Packet::new_unchecked(&mut buf[..]);
    // The kernel computes the checksum of ICMPv6 raw sockets itself (RFC 3542 §3.1),
    // with the source address it picks; the one emitted here is overwritten.
    repr.emit(&mut p, Ipv6Addr::UNSPECIFIED, ALL_ROUTERS)
        .map_err(RaListenError::Solicitation)?;
    Ok(buf)
}

/// Sends a Router Solicitation on `iface` and waits up to `timeout` for an RA.
/// RAs that fail validation are reported on stderr and waiting continues.
pub fn listen(iface: &str, timeout: Duration) -> Result<RaReport, RaListenError> {
    let link = Link::by_name(iface).map_err(|error| RaListenError::Interface {
        iface: iface.to_string(),
        error,
    })?;
    let sock = Icmp6Socket::open(iface, link.index, &[msg::ROUTER_ADVERT]).map_err(|error| {
        RaListenError::Socket {
            iface: iface.to_string(),
            error,
        }
    })?;
    let rs = router_solicitation(link.mac.map(MacAddr).filter(api::MacAddr::is_unicast))?;
    let start = Instant::now();
    let deadline = start + timeout;
    let mut buf = vec![0u8; 65536];
    let mut sent = 0u32;
    let mut next_send = start;
    let mut sent_at = start;
    loop {
        let now = Instant::now();
        if now >= deadline {
            let iface = iface.to_string();
            return Err(if sent == 0 {
                RaListenError::NothingSent { iface, timeout }
            } else {
                RaListenError::NoAnswer {
                    iface,
                    timeout,
                    sent,
                }
            });
        }
        if sent < MAX_RTR_SOLICITATIONS && now >= next_send {
            match sock.send_to(&rs, ALL_ROUTERS, link.index) {
                Ok(()) => {
                    sent += 1;
                    sent_at = now;
                    next_send = now + RTR_SOLICITATION_INTERVAL;
                }
                // The link-local address is still tentative (DAD runs for about a
                // second after the link comes up): try again shortly.
                Err(e) if e.raw_os_error() == Some(libc::EADDRNOTAVAIL) => {
                    next_send = now + Duration::from_millis(200);
                }
                Err(error) => {
                    return Err(RaListenError::Send {
                        iface: iface.to_string(),
                        error,
                    })
                }
            }
        }
        let wait = deadline.min(next_send.max(now + Duration::from_millis(1))) - now;
        let Some(rx) = sock
            .recv(&mut buf, wait)
            .map_err(|error| RaListenError::Receive {
                iface: iface.to_string(),
                error,
            })?
        else {
            continue;
        };
        if rx.ifindex.is_some_and(|i| i != link.index) {
            continue;
        }
        let Some(msg_bytes) = buf.get(..rx.len) else {
            continue;
        };
        if msg_bytes.first() != Some(&msg::ROUTER_ADVERT) {
            continue;
        }
        let dst = rx.destination.unwrap_or(Ipv6Addr::UNSPECIFIED);
        match RaReport::decode(
            iface,
            msg_bytes,
            rx.source,
            dst,
            rx.hop_limit,
            sent_at.elapsed(),
        ) {
            Ok(r) => return Ok(r),
            Err(e) => eprintln!("ignoring: {e}"),
        }
    }
}

/// RFC 4861 §10 host constants: at most 3 solicitations, 4 s apart.
const MAX_RTR_SOLICITATIONS: u32 = 3;
const RTR_SOLICITATION_INTERVAL: Duration = Duration::from_secs(4);

#[cfg(test)]
mod tests {
    use super::*;

    fn ra_bytes(mtu: Option<u32>, src: Ipv6Addr, dst: Ipv6Addr) -> Vec<u8> {
        let repr = ndp::Repr::RouterAdvert {
            hop_limit: 255,
            managed: true,
            other: false,
            router_lifetime: 9000,
            reachable_time: 0,
            retrans_time: 0,
            lladdr: Some("a8:40:25:00:00:01".parse().unwrap()),
            mtu,
            prefix_info: None,
        };
        let mut b = vec![0u8; repr.buffer_len()];
        repr.emit(&mut ndp::Packet::new_unchecked(&mut b[..]), src, dst)
            .unwrap();
        b
    }

    #[test]
    fn solicitation_bytes() {
        let rs = router_solicitation(Some("a8:40:25:ff:00:01".parse().unwrap())).unwrap();
        // type 133, code 0, checksum (overwritten by the kernel), reserved, SLLA option.
        assert_eq!(rs.len(), 16);
        assert_eq!(&rs[..2], &[133, 0]);
        assert_eq!(&rs[4..8], &[0, 0, 0, 0]);
        assert_eq!(&rs[8..16], &[1, 1, 0xa8, 0x40, 0x25, 0xff, 0x00, 0x01]);
        assert_eq!(router_solicitation(None).unwrap().len(), 8);
    }

    #[test]
    fn decodes_the_gateway_ra() {
        let src: Ipv6Addr = "fe80::aa40:25ff:fe00:1".parse().unwrap();
        let dst: Ipv6Addr = "fe80::aa40:25ff:feff:1".parse().unwrap();
        let b = ra_bytes(Some(8500), src, dst);
        let r =
            RaReport::decode("eth0", &b, src, dst, Some(255), Duration::from_millis(3)).unwrap();
        assert_eq!(r.ra.mtu, Some(8500));
        assert!(r.ra.managed && !r.ra.other);
        assert_eq!(r.ra.router_lifetime_s, 9000);
        assert_eq!(r.ra.cur_hop_limit, 255);
        assert_eq!(
            r.ra.source_link_layer_addr.unwrap().to_string(),
            "a8:40:25:00:00:01"
        );
        assert!(r.warnings().is_empty(), "{:?}", r.warnings());
        let text = r.to_string();
        assert!(text.contains("MTU                 8500"), "{text}");
        assert!(text.contains("M=1 O=0"), "{text}");
    }

    #[test]
    fn refuses_bad_checksums_and_warns_on_bad_ras() {
        let src: Ipv6Addr = "fe80::1".parse().unwrap();
        let dst: Ipv6Addr = "ff02::1".parse().unwrap();
        let mut b = ra_bytes(Some(8500), src, dst);
        b[2] ^= 0xff;
        let e = RaReport::decode("eth0", &b, src, dst, Some(255), Duration::ZERO)
            .unwrap_err()
            .to_string();
        assert!(e.contains("checksum"), "{e}");
        let global: Ipv6Addr = "fd00::1".parse().unwrap();
        let b = ra_bytes(None, global, dst);
        let r = RaReport::decode("eth0", &b, global, dst, Some(64), Duration::ZERO).unwrap();
        let w = r.warnings().join("\n");
        assert!(w.contains("hop limit 64"), "{w}");
        assert!(w.contains("fd00::1"), "{w}");
        assert!(w.contains("no MTU option"), "{w}");
        // Truncated input is an error, not a panic.
        for cut in 0..b.len() {
            let _ = RaReport::decode("eth0", &b[..cut], global, dst, None, Duration::ZERO);
        }
    }
}
