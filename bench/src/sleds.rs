//! Two sleds on one underlay link, one dual-stack guest each, with V2P mappings both
//! ways: the smallest setup in which a packet takes the whole encap/decap path.

use engine::{
    Engine, EngineConfig, MacAddr, NextHop, NextHopSet, PortConfig, PortId, UnderlayRoutes, Vni,
};
use std::net::{IpAddr, Ipv6Addr};

/// The clock the fixtures run at (monotonic ns; the engine reads no clock). Fixed, so
/// no flow ever idles out during a measurement.
pub const NOW: u64 = 1_000_000_000;

/// The VPC both guests are in.
pub const VNI: u32 = 1701;
/// Underlay interface index both sleds send on.
pub const IFINDEX: u32 = 2;

/// An underlay with one neighbour: the other sled, reached directly over the link.
/// Anything else is unresolved, as the daemon's neighbour cache would say.
#[derive(Clone, Copy, Debug)]
pub struct PeerRoute {
    pub peer: Ipv6Addr,
    pub hop: NextHop,
}

impl UnderlayRoutes for PeerRoute {
    fn next_hops(&self, dst: Ipv6Addr) -> NextHopSet {
        (dst == self.peer).then_some(self.hop).into_iter().collect()
    }
}

/// One sled: its engine, its guest's port, and its view of the underlay.
pub struct Sled {
    pub engine: Engine,
    pub port: PortId,
    pub cfg: PortConfig,
    pub routes: PeerRoute,
}

/// Sled A (guest .5) and sled B (guest .6).
pub struct TwoSleds {
    pub a: Sled,
    pub b: Sled,
}

pub(crate) fn mac(s: &str) -> Result<MacAddr, String> {
    s.parse().map_err(|e| format!("MAC {s:?}: {e:?}"))
}

fn parse<T: std::str::FromStr>(s: &str) -> Result<T, String> {
    s.parse().map_err(|_| format!("cannot parse {s:?}"))
}

/// The guest port of sled `n` (1 or 2): as the end-to-end tests configure it (MTU
/// 8500, the VPC subnets 172.30.0.0/22 and fd00:1122:3344:100::/64).
pub(crate) fn guest_port(n: u8) -> Result<PortConfig, String> {
    Ok(PortConfig {
        name: format!("opte{n}"),
        guest_mac: mac(&format!("a8:40:25:ff:00:0{n}"))?,
        gateway_mac: mac("a8:40:25:ff:77:77")?,
        ipv4: Some(parse(&format!("172.30.0.{}", 4 + n))?),
        ipv6: Some(parse(&format!("fd00:1122:3344:100::{}", 4 + n))?),
        vpc_subnet4: Some(parse("172.30.0.0/22")?),
        vpc_subnet6: Some(parse("fd00:1122:3344:100::/64")?),
        gateway_ipv4: Some(parse("172.30.0.1")?),
        vni: Vni::new(VNI).map_err(|e| e.to_string())?,
        mtu: 8500,
        external_jumbo: false,
        dns_servers4: vec![parse("1.1.1.1")?],
        dns_servers6: vec![],
        hostname: Some(format!("guest{n}")),
        domain: Some("vpc.example".into()),
        domain_search: vec![],
        external: Default::default(),
        limits: Default::default(),
        cidrs: Default::default(),
    })
}

impl TwoSleds {
    /// Builds both sleds; errors are the engine's (naming the refused value).
    pub fn new() -> Result<TwoSleds, String> {
        TwoSleds::with_tunnel_gso(false)
    }

    /// [`TwoSleds::new`], with sled A sending guest TSO buffers as UDP-tunnel GSO
    /// super-frames when `tunnel_gso` (`EngineConfig::underlay_tunnel_gso`).
    pub fn with_tunnel_gso(tunnel_gso: bool) -> Result<TwoSleds, String> {
        let addr = |n: u16| Ipv6Addr::new(0xfd00, 0x99, 0, 0, 0, 0, 0, n);
        let (ua, ub) = (addr(1), addr(2));
        let (ma, mb) = (mac("02:00:00:00:99:01")?, mac("02:00:00:00:99:02")?);
        let ecfg_a = EngineConfig {
            underlay_tunnel_gso: tunnel_gso,
            ..EngineConfig::new(ua)
        };
        let mut a = sled(ecfg_a, ma, guest_port(1)?, ub, mb)?;
        let mut b = sled(EngineConfig::new(ub), mb, guest_port(2)?, ua, ma)?;
        map_peer_guest(&mut a, &b.cfg, ub)?;
        map_peer_guest(&mut b, &a.cfg, ua)?;
        Ok(TwoSleds { a, b })
    }
}

/// A sled of engine configuration `ecfg` with the guest port `cfg`, whose only
/// underlay neighbour is `peer`.
pub(crate) fn sled(
    ecfg: EngineConfig,
    mac: MacAddr,
    cfg: PortConfig,
    peer: Ipv6Addr,
    peer_mac: MacAddr,
) -> Result<Sled, String> {
    let mut engine = Engine::new(ecfg).map_err(|e| e.to_string())?;
    let port = engine.add_port(cfg.clone()).map_err(|e| e.to_string())?;
    Ok(Sled {
        engine,
        port,
        cfg,
        routes: PeerRoute {
            peer,
            hop: NextHop {
                ifindex: IFINDEX,
                src_mac: mac,
                dst_mac: peer_mac,
            },
        },
    })
}

/// Tells `sled` where the other sled's guest lives (both its addresses).
fn map_peer_guest(sled: &mut Sled, guest: &PortConfig, underlay: Ipv6Addr) -> Result<(), String> {
    for ip in [guest.ipv4.map(IpAddr::V4), guest.ipv6.map(IpAddr::V6)]
        .into_iter()
        .flatten()
    {
        sled.engine
            .set_v2p(guest.vni, ip, underlay, guest.guest_mac)
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}
