//! A worker's guests: how a port's device is opened (a tap of its own, a
//! hypervisor's interface it attaches to, or a vhost-user socket), and whether it
//! is served ([`TapLink`]).

use crate::controller::DataplaneError;
use crate::underlay::queues::UnderlayQueues;
use api::{PortInfo, PortLink, VhostNegotiation, VhostUserMode};
use dpio::guest::GuestPort;
use dpio::netlink::Netlink;
use dpio::packet::PacketPort;
use dpio::poll::Epoll;
use dpio::tap::TapPort;
use dpio::vhost::VhostPort;
use engine::MacAddr;
use std::time::{SystemTime, UNIX_EPOCH};

/// Opens a port's device: attaches to its interface (`--attach`), or opens (or,
/// after a restart or once its guest is back, reattaches to) its tap and puts it
/// where the guest expects it.
pub(super) fn open_port(p: &PortInfo) -> Result<GuestPort, DataplaneError> {
    match &p.attach {
        Some(iface) => attach_port(p, iface).map(GuestPort::Attached),
        None => open_tap(p).map(GuestPort::Tap),
    }
}

/// Attaches port `p` to the hypervisor's interface `iface`, in the daemon's
/// namespace, saying what had to change on it.
fn attach_port(p: &PortInfo, iface: &str) -> Result<PacketPort, DataplaneError> {
    let name = &p.config.name;
    let mtu = u32::from(p.config.mtu);
    let (port, done) = PacketPort::attach(iface, mtu).map_err(|error| DataplaneError::Guest {
        device: "port",
        port: name.clone(),
        error,
    })?;
    if let Some(was) = done.mtu_raised_from {
        // The hypervisor made it at its default; the VM's frames and ours are up to
        // the port's MTU, which the VM's virtio device must advertise too
        // (`xdeadm mtu`).
        tracing::info!(port = %name, iface, from = was, to = mtu, "attached interface's MTU raised to the port's");
    }
    if done.brought_up {
        tracing::info!(port = %name, iface, "attached interface was down: brought up");
    }
    Ok(port)
}

/// Refuses to attach port `p` to one of the daemon's underlay links (every worker
/// has a socket on each): its Geneve traffic would be taken for a guest's frames
/// and the guest's sent onto the sled's network. An interface that cannot be
/// looked up is left for the attach to report.
pub(super) fn not_an_underlay_link(
    p: &PortInfo,
    queues: &UnderlayQueues,
) -> Result<(), DataplaneError> {
    let Some(iface) = &p.attach else {
        return Ok(());
    };
    let Ok(link) = Netlink::open().and_then(|mut nl| nl.link_by_name(iface)) else {
        return Ok(());
    };
    if queues.sockets.iter().any(|s| s.ifindex() == link.ifindex) {
        return Err(DataplaneError::UnderlayLink {
            port: p.config.name.clone(),
            iface: iface.clone(),
        });
    }
    Ok(())
}

/// Opens (or, after a restart or once its guest is back, reattaches to) the tap of a
/// port and puts it where the guest expects it.
fn open_tap(p: &PortInfo) -> Result<TapPort, DataplaneError> {
    let name = &p.config.name;
    let ctx = |error| DataplaneError::Guest {
        device: "tap",
        port: name.clone(),
        error,
    };
    if let Some(ns) = &p.netns {
        // A tap made for a namespace that is not there could only be destroyed again.
        let path = dpio::netns::netns_path(ns).map_err(ctx)?;
        if !path.exists() {
            return Err(DataplaneError::NoNetns {
                port: name.clone(),
                netns: ns.clone(),
                path,
            });
        }
        // A persistent tap survives the daemon; if it is already in the guest's
        // namespace, take it over there.
        match TapPort::attach_in_netns(ns, name) {
            Ok(t) => return Ok(t),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(ctx(e)),
        }
    }
    let mac = match p.netns {
        Some(_) => p.config.guest_mac,
        None => bridge_port_mac(p.config.guest_mac),
    };
    let tap = TapPort::create(name, mac).map_err(ctx)?;
    tap.set_mtu(u32::from(p.config.mtu)).map_err(ctx)?;
    if let Some(ns) = &p.netns {
        if let Err(e) = tap.move_to_netns(ns) {
            let _ = tap.destroy();
            return Err(ctx(e));
        }
    }
    Ok(tap)
}

/// The MAC of a tap left in the daemon's namespace (no `--netns`): there it is not
/// the guest's interface but the datapath's end of a link to it, to be bridged to
/// a VM's own tap (as libvirt attaches VMs). Were it the guest's MAC, a bridge would
/// take every frame for the guest as addressed to the bridge itself and never
/// forward it: the VM would get no DHCP offer, RA or traffic. libvirt's rule: the
/// guest's MAC with the first octet 0xfe (locally administered, and high, so a
/// bridge does not take it for its own address).
fn bridge_port_mac(guest: MacAddr) -> MacAddr {
    let mut m = guest.0;
    m[0] = 0xfe;
    MacAddr(m)
}

/// A new port's guest side: its tap, or its vhost-user socket served.
pub(super) fn open_guest(
    p: &PortInfo,
    epoll: &Epoll,
    kick_token: u64,
) -> Result<GuestPort, DataplaneError> {
    let Some(v) = &p.vhost_user else {
        return open_port(p);
    };
    let cfg = dpio::vhost::DeviceConfig {
        name: p.config.name.clone(),
        socket: v.socket.clone(),
        mode: match v.mode {
            VhostUserMode::Server => dpio::vhost::Mode::Server,
            VhostUserMode::Client => dpio::vhost::Mode::Client,
        },
    };
    // A kick wakes the worker (`kick_token` in its poll set): the round then looks
    // at every vhost-user port's transmit ring.
    epoll
        .watcher()
        .and_then(|w| VhostPort::start(cfg, w, kick_token))
        .map(GuestPort::Vhost)
        .map_err(|error| DataplaneError::Guest {
            device: "port",
            port: p.config.name.clone(),
            error,
        })
}

/// One port's tap as its worker serves it.
pub(crate) struct PortTap {
    /// What the tap is opened from: name, MAC, MTU, the guest's namespace.
    pub(crate) info: PortInfo,
    /// Which port of this worker it is (see [`Datapath::next_gen`]).
    pub(crate) gen: u64,
    pub(crate) link: TapLink,
}

/// Whether a port's tap (or attached interface) is served.
pub(crate) enum TapLink {
    /// Open and served: a tap or attached interface in the worker's poll set, or
    /// a vhost-user port (whose link follows its front end: see [`TapLink::view`]).
    Up(GuestPort),
    /// Gone since `since` (why: `reason`); the [`Reattacher`] is getting it back.
    Down { since: SystemTime, reason: String },
}

/// Milliseconds since the Unix epoch (0 for a time before it), as the API shows times.
pub(super) fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl TapLink {
    /// As `list-ports` shows it.
    pub(super) fn view(&self) -> PortLink {
        match self {
            TapLink::Up(GuestPort::Vhost(v)) if !v.is_up() => PortLink::Down {
                since_unix_ms: unix_ms(v.changed()),
                reason: vhost_down_reason(v),
            },
            TapLink::Up(_) => PortLink::Up,
            TapLink::Down { since, reason } => PortLink::Down {
                since_unix_ms: unix_ms(*since),
                reason: reason.clone(),
            },
        }
    }
}

impl TapLink {
    /// What a vhost-user port's front end negotiated; `None` for other ports.
    pub(super) fn negotiated(&self) -> Option<VhostNegotiation> {
        let TapLink::Up(GuestPort::Vhost(v)) = self else {
            return None;
        };
        let n = v.negotiation();
        Some(VhostNegotiation {
            features: dpio::vhost::feature_names(n.features),
            refused: n.refusals,
        })
    }
}

/// Why a vhost-user port is down: no front end has started its rings, or the
/// last one was refused for its features (and disconnected).
fn vhost_down_reason(v: &VhostPort) -> String {
    let n = v.negotiation();
    match n.last_refusal {
        Some(why) => format!(
            "vhost-user front end on {} refused and disconnected ({} so far): {why}",
            v.socket().display(),
            n.refusals
        ),
        None => format!(
            "no vhost-user front end on {} has started the rings",
            v.socket().display()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    /// A tap left for a bridge gets a MAC that is locally administered, unicast,
    /// not the guest's, and the same for the same guest (a restart re-creates it
    /// alike).
    #[test]
    fn bridge_port_mac_is_local_unicast_and_not_the_guests() {
        let guest = MacAddr([0xa8, 0x40, 0x25, 0xf0, 0x00, 0x01]);
        let m = bridge_port_mac(guest);
        assert_eq!(m, MacAddr([0xfe, 0x40, 0x25, 0xf0, 0x00, 0x01]));
        assert_ne!(m, guest);
        assert!(m.is_unicast());
        assert_eq!(m.0[0] & 0x02, 0x02, "locally administered");
    }
}

#[cfg(test)]
mod vhost_tests {
    use super::*;
    use dpio::vhost::test_frontend::{bits, connect, linux_features, wait_for};

    /// A port whose front end was refused shows down with why, and counts it;
    /// one that is served shows up with its features by name.
    #[test]
    fn a_refused_front_end_shows_the_port_down_with_the_reason() {
        // VERSION_1 (bit 32) and GUEST_TSO4 (bit 7) without GUEST_CSUM.
        let (port, _g) = connect("view-refused", bits(&[32, 7]), 2048);
        assert!(wait_for(|| port.negotiation().refusals == 1));
        let link = TapLink::Up(GuestPort::Vhost(port));
        let PortLink::Down { reason, .. } = link.view() else {
            panic!("the port is up");
        };
        assert!(
            reason.contains("refused and disconnected (1 so far)")
                && reason.contains("GUEST_TSO4 without GUEST_CSUM"),
            "{reason}"
        );
        let n = link.negotiated().unwrap();
        assert_eq!((n.features.len(), n.refused), (0, 1));

        let (port, _g) = connect("view-served", linux_features(), 2048);
        assert!(wait_for(|| port.is_up()));
        let link = TapLink::Up(GuestPort::Vhost(port));
        assert_eq!(link.view(), PortLink::Up);
        let n = link.negotiated().unwrap();
        assert_eq!(
            n.features,
            [
                "GUEST_CSUM",
                "GUEST_TSO4",
                "GUEST_TSO6",
                "MRG_RXBUF",
                "VERSION_1"
            ]
        );
    }
}
