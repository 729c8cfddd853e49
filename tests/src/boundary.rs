//! A boundary-services switch for the tests: the rack's exit, in userspace.
//!
//! The real switch decapsulates Geneve from the sleds, routes the inner packet to the
//! world, and encapsulates what comes back toward the sled hosting its destination
//! (its NAT-ingress table), marking it with the Oxide External option. This program
//! does the same on one host of the rack's underlay bridge: a UDP socket on port 6081
//! at its underlay address receives the sleds' Geneve (the kernel has checked the
//! outer headers), the inner IP packet goes into a tun device (and the kernel of the
//! boundary's namespace routes it to the "internet" namespaces), and IP packets the
//! kernel routes into the tun are encapsulated toward the sled the ingress table
//! names. Counters go to a JSON file after every packet, so a test reads what the
//! switch saw. The binary is `boundary` (`tests/src/bin/boundary.rs`); the harness
//! that builds the internet around it is [`Internet`].

use crate::cmd::{terminate, Cmd};
use crate::frames::{
    geneve_option, ETHERTYPE_IPV4, ETHERTYPE_IPV6, OXIDE_CLASS, OXIDE_EXTERNAL, PROTO_ICMP,
    PROTO_ICMPV6, PROTO_TCP, PROTO_UDP, TRANSPARENT_ETHERNET,
};
use crate::guest::GuestSpec;
use crate::inject::{mac_string, parse_mac};
use crate::netns::Netns;
use crate::poll::poll_until;
use crate::rack::Rack;
use crate::{Context, Error, Result};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

pub use crate::frames::GENEVE_PORT;
/// Source MAC of the inner frames the switch sends (the engine does not check it for
/// External traffic).
const SWITCH_MAC: [u8; 6] = [0x02, 0xb0, 0, 0, 0, 0x01];

/// One row of the NAT-ingress table: traffic to `dst` (and, if given, a TCP/UDP
/// destination port in `ports`, as for a SNAT range) goes to the guest with `mac` in
/// VPC `vni` on the sled at `sled`. Written `IP[:LO-HI]=SLED,VNI,MAC`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ingress {
    pub dst: IpAddr,
    pub ports: Option<(u16, u16)>,
    pub sled: Ipv6Addr,
    pub vni: u32,
    pub mac: [u8; 6],
}

impl Ingress {
    pub fn parse(s: &str) -> Result<Ingress> {
        let bad = |why: &str| Error::new(format!("ingress entry {s:?}: {why}"));
        let (key, target) = s
            .split_once('=')
            .ok_or_else(|| bad("expected IP[:LO-HI]=SLED,VNI,MAC"))?;
        // An IPv6 address has colons of its own: a range follows the last `:` only
        // when it holds a `-`.
        let (ip, ports) = match key.rsplit_once(':') {
            Some((ip, range)) if range.contains('-') => {
                let (lo, hi) = range.split_once('-').ok_or_else(|| bad("port range"))?;
                let port = |p: &str| p.parse::<u16>().map_err(|_| bad(&format!("port {p:?}")));
                (ip.trim_matches(['[', ']']), Some((port(lo)?, port(hi)?)))
            }
            _ => (key, None),
        };
        let dst = ip.parse().map_err(|_| bad(&format!("address {ip:?}")))?;
        let mut parts = target.split(',');
        let (Some(sled), Some(vni), Some(mac), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad("expected SLED,VNI,MAC after `=`"));
        };
        Ok(Ingress {
            dst,
            ports,
            sled: sled.parse().map_err(|_| bad(&format!("sled {sled:?}")))?,
            vni: vni
                .parse()
                .ok()
                .filter(|v| *v < 1 << 24)
                .ok_or_else(|| bad(&format!("VNI {vni:?}")))?,
            mac: parse_mac(mac)?,
        })
    }

    /// The command-line form [`Ingress::parse`] reads.
    pub fn arg(&self) -> String {
        let key = match (self.dst, self.ports) {
            (IpAddr::V6(a), Some((lo, hi))) => format!("[{a}]:{lo}-{hi}"),
            (a, Some((lo, hi))) => format!("{a}:{lo}-{hi}"),
            (a, None) => a.to_string(),
        };
        format!("{key}={},{},{}", self.sled, self.vni, mac_string(self.mac))
    }

    fn matches(&self, dst: IpAddr, port: Option<u16>) -> bool {
        self.dst == dst
            && self
                .ports
                .is_none_or(|(lo, hi)| port.is_some_and(|p| (lo..=hi).contains(&p)))
    }
}

/// What the switch counted, written as JSON to its stats file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SwitchCounters {
    /// Geneve frames from the sleds whose inner packet went to the internet.
    pub decap: u64,
    /// Of those, how many came in the boundary VNI (the rest count as `wrong_vni`).
    pub wrong_vni: u64,
    /// Geneve payloads that were not Ethernet carrying IPv4 or IPv6.
    pub bad_geneve: u64,
    /// Packets from the internet encapsulated toward a sled.
    pub encap: u64,
    /// Packets from the internet no ingress entry matched (dropped).
    pub no_ingress: u64,
    /// Multicast the kernel of the switch's namespace sends into the tun itself
    /// (MLD reports): not traffic from the internet, dropped.
    pub multicast: u64,
}

impl SwitchCounters {
    fn json(&self) -> String {
        format!(
            "{{\"decap\":{},\"wrong_vni\":{},\"bad_geneve\":{},\"encap\":{},\"no_ingress\":{},\"multicast\":{}}}\n",
            self.decap, self.wrong_vni, self.bad_geneve, self.encap, self.no_ingress, self.multicast
        )
    }

    /// Reads the stats file the switch writes.
    pub fn read(path: &Path) -> Result<SwitchCounters> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the switch's counters {}", path.display()))?;
        let v: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Error::new(format!("{}: {e}: {text}", path.display())))?;
        let n = |k: &str| v[k].as_u64().unwrap_or(0);
        Ok(SwitchCounters {
            decap: n("decap"),
            wrong_vni: n("wrong_vni"),
            bad_geneve: n("bad_geneve"),
            encap: n("encap"),
            no_ingress: n("no_ingress"),
            multicast: n("multicast"),
        })
    }
}

/// One line for people (the demo prints it): each counter named by what it counts.
impl std::fmt::Display for SwitchCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "from the sleds: {} packets sent on to the internet ({} of them not in the \
             boundary VNI), {} dropped as not Ethernet with IP; from the internet: {} \
             packets encapsulated toward a sled, {} dropped for no guest, {} multicast of the \
             switch's own kernel dropped",
            self.decap,
            self.wrong_vni,
            self.bad_geneve,
            self.encap,
            self.no_ingress,
            self.multicast
        )
    }
}

/// The inner IP packet of a Geneve payload (the UDP payload) in VNI `vni`, if it is
/// Ethernet carrying IPv4 or IPv6 with consistent lengths.
pub fn decapsulate(geneve: &[u8]) -> Option<(u32, &[u8])> {
    let h = geneve.get(..8)?;
    if h[0] >> 6 != 0 || u16::from_be_bytes([h[2], h[3]]) != TRANSPARENT_ETHERNET {
        return None;
    }
    let vni = u32::from_be_bytes([0, h[4], h[5], h[6]]);
    let inner = geneve.get(8 + usize::from(h[0] & 0x3f) * 4..)?;
    let ethertype = u16::from_be_bytes([*inner.get(12)?, *inner.get(13)?]);
    let ip = inner.get(14..)?;
    let len = match ethertype {
        ETHERTYPE_IPV4 => usize::from(u16::from_be_bytes([*ip.get(2)?, *ip.get(3)?])),
        ETHERTYPE_IPV6 => 40 + usize::from(u16::from_be_bytes([*ip.get(4)?, *ip.get(5)?])),
        _ => return None,
    };
    Some((vni, ip.get(..len)?))
}

/// The Geneve payload carrying IP packet `ip` to the guest `to`, marked External.
pub fn encapsulate(ip: &[u8], to: &Ingress) -> Vec<u8> {
    let ethertype = if ip.first().is_some_and(|b| b >> 4 == 6) {
        ETHERTYPE_IPV6
    } else {
        ETHERTYPE_IPV4
    };
    let vni = to.vni.to_be_bytes();
    let mut g = Vec::with_capacity(12 + 14 + ip.len());
    // Version 0, one 4-byte word of options, no flags.
    g.extend_from_slice(&[0x01, 0x00]);
    g.extend_from_slice(&TRANSPARENT_ETHERNET.to_be_bytes());
    g.extend_from_slice(&[vni[1], vni[2], vni[3], 0]);
    g.extend(geneve_option(OXIDE_CLASS, OXIDE_EXTERNAL, &[]));
    g.extend_from_slice(&to.mac);
    g.extend_from_slice(&SWITCH_MAC);
    g.extend_from_slice(&ethertype.to_be_bytes());
    g.extend_from_slice(ip);
    g
}

/// Destination address of an IP packet from the internet and the port a NAT
/// binding would hold for it, as a switch's NAT ingress looks them up: the TCP/UDP
/// destination port; the identifier of an ICMP echo reply; for an ICMP error
/// (destination unreachable, packet too big, time exceeded, parameter problem), the
/// quoted packet's *source* port or echo identifier — the quote is the packet as it
/// left, from the external address and port. No port for anything else.
pub fn destination(ip: &[u8]) -> Option<(IpAddr, Option<u16>)> {
    let (dst, proto, l4) = addresses(ip)?;
    Some((dst, nat_port(ip, proto, l4, false)))
}

/// Destination, protocol and L4 offset of an IPv4 or IPv6 packet (IPv6 without
/// extension headers).
fn addresses(ip: &[u8]) -> Option<(IpAddr, u8, usize)> {
    match ip.first()? >> 4 {
        4 => {
            let a: [u8; 4] = ip.get(16..20)?.try_into().ok()?;
            Some((
                Ipv4Addr::from(a).into(),
                *ip.get(9)?,
                usize::from(ip[0] & 0x0f) * 4,
            ))
        }
        6 => {
            let a: [u8; 16] = ip.get(24..40)?.try_into().ok()?;
            Some((Ipv6Addr::from(a).into(), *ip.get(6)?, 40))
        }
        _ => None,
    }
}

/// The NAT port of the packet `ip` whose L4 header of protocol `proto` is at `l4`:
/// its destination port (`quoted`: its source port, the packet being the quote of an
/// ICMP error), or its echo identifier, or for an ICMP error the quote's.
fn nat_port(ip: &[u8], proto: u8, l4: usize, quoted: bool) -> Option<u16> {
    let be16 = |at: usize| ip.get(at..at + 2).map(|p| u16::from_be_bytes([p[0], p[1]]));
    let icmp_type = ip.get(l4).copied();
    match (proto, icmp_type) {
        (PROTO_TCP | PROTO_UDP, _) => be16(if quoted { l4 } else { l4 + 2 }),
        // An echo reply, or (quoted) the echo request that left: the identifier.
        (PROTO_ICMP, Some(0)) | (PROTO_ICMPV6, Some(129)) if !quoted => be16(l4 + 4),
        (PROTO_ICMP, Some(8)) | (PROTO_ICMPV6, Some(128)) if quoted => be16(l4 + 4),
        // An error (not itself quoted: errors are never sent about errors).
        (PROTO_ICMP, Some(3 | 11 | 12)) | (PROTO_ICMPV6, Some(1..=4)) if !quoted => {
            let quote = ip.get(l4 + 8..)?;
            let (_, qproto, ql4) = addresses(quote)?;
            nat_port(quote, qproto, ql4, true)
        }
        _ => None,
    }
}

/// The switch's state: its table, its boundary VNI and its counters.
#[derive(Debug)]
pub struct Switch {
    pub ingress: Vec<Ingress>,
    pub boundary_vni: u32,
    pub counters: SwitchCounters,
}

impl Switch {
    /// A Geneve payload from a sled: the IP packet to route to the internet.
    pub fn from_sled<'a>(&mut self, geneve: &'a [u8]) -> Option<&'a [u8]> {
        let Some((vni, ip)) = decapsulate(geneve) else {
            self.counters.bad_geneve += 1;
            return None;
        };
        if vni != self.boundary_vni {
            self.counters.wrong_vni += 1;
        }
        self.counters.decap += 1;
        Some(ip)
    }

    /// An IP packet from the internet: the sled to send it to and the Geneve payload.
    pub fn from_internet(&mut self, ip: &[u8]) -> Option<(Ipv6Addr, Vec<u8>)> {
        let dst = destination(ip);
        if dst.is_some_and(|(d, _)| d.is_multicast()) {
            self.counters.multicast += 1;
            return None;
        }
        let found = dst.and_then(|(dst, port)| self.ingress.iter().find(|e| e.matches(dst, port)));
        let Some(to) = found else {
            self.counters.no_ingress += 1;
            return None;
        };
        self.counters.encap += 1;
        Some((to.sled, encapsulate(ip, to)))
    }

    /// Writes the counters to `path` (through a temporary file, so a reader never
    /// sees half of them).
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, self.counters.json())?;
        std::fs::rename(tmp, path)
    }
}

/// The switch and the internet behind it, around a sled namespace of `rack` that
/// runs no daemon (its underlay address becomes a boundary-services endpoint):
///
/// ```text
/// sleds --Geneve--> [boundary ns: `boundary` program, tun bnd0] --veth-- [router ns]
///                                                  --veth MTU 1400-- [server ns]
/// ```
///
/// The server is [`Internet::SERVER4`] / [`Internet::SERVER6`]. The router routes
/// the prefixes given to `attach` back to the boundary namespace, which routes them
/// into the tun: the switch's ingress table decides where they go on the underlay.
/// Dropping it stops the program and deletes the namespaces.
#[derive(Debug)]
pub struct Internet {
    pub router: Netns,
    pub server: Netns,
    /// The switch's counters file.
    pub stats: PathBuf,
    /// The switch's log (stderr; every switch started appends to it).
    pub log: PathBuf,
    switch: Child,
    /// The sled namespace the switch runs in, for removing what was added there.
    boundary_ns: String,
    /// The switch's binary, underlay address and table: what it is started with
    /// again when its table changes ([`Internet::move_guest`]).
    bin: String,
    listen: Ipv6Addr,
    ingress: Vec<Ingress>,
}

/// A guest that reaches the internet through the switch: its spec, its external
/// addresses (`set-external-ips` flags), and the switch's ingress entries that
/// bring its traffic back (address, SNAT port range).
#[derive(Clone, Debug)]
pub struct Outside {
    pub spec: GuestSpec,
    pub external: Vec<String>,
    pub ingress: Vec<(IpAddr, Option<(u16, u16)>)>,
}

impl Outside {
    /// Reached at its floating IPs (any family mix).
    pub fn floating(spec: GuestSpec, addrs: &[IpAddr]) -> Outside {
        Outside {
            spec,
            external: Vec::new(),
            ingress: Vec::new(),
        }
        .with_floating(addrs)
    }

    /// Also reached at floating IPs `addrs`: with SNAT of one family, a floating IP
    /// of the other (a flow leaves from a floating IP of its family if the port has
    /// one, so a port that has both of one family never uses its SNAT address).
    pub fn with_floating(mut self, addrs: &[IpAddr]) -> Outside {
        self.external.extend(
            addrs
                .iter()
                .flat_map(|a| ["--floating-ip".to_string(), a.to_string()]),
        );
        self.ingress.extend(addrs.iter().map(|a| (*a, None)));
        self
    }

    /// Leaving from its ephemeral IP.
    pub fn ephemeral(spec: GuestSpec, addr: IpAddr) -> Outside {
        Outside {
            spec,
            external: vec!["--ephemeral-ip".into(), addr.to_string()],
            ingress: vec![(addr, None)],
        }
    }

    /// Leaving from SNAT address `addr`, ports `range` (inclusive).
    pub fn snat(spec: GuestSpec, addr: IpAddr, range: (u16, u16)) -> Outside {
        Outside {
            spec,
            external: vec![
                "--snat-ip".into(),
                addr.to_string(),
                "--snat-start".into(),
                range.0.to_string(),
                "--snat-end".into(),
                range.1.to_string(),
            ],
            ingress: vec![(addr, Some(range))],
        }
    }
}

/// A rack whose guests reach the internet through the switch: sleds 0..`daemons`
/// run daemons (no `--boundary-services`: V2B alone), the switch runs on sled
/// `daemons`. The guests go on sled 0, each with both default routes to the
/// internet gateway and its external addresses, and every daemon's V2B table sends
/// everything to the switch (the table is the rack's, not a guest's: a guest moved
/// to another sled leaves by the same switch); the internet routes every guest's
/// external addresses back to the switch, whose ingress table sends them to sled 0.
/// `bin` is the switch's binary.
pub fn nat_rack(
    prefix: &str,
    daemons: usize,
    guests: Vec<Outside>,
    bin: &str,
) -> Result<(Rack, Internet)> {
    let mut rack = Rack::build(&crate::RackSpec::new(prefix, daemons + 1))?;
    let switch = crate::rack::sled_underlay_addr(daemons).to_string();
    // No daemon on the switch's sled: its XDP program would take the Geneve.
    for i in 0..daemons {
        rack.start_daemon(i, &[])?;
        for net in ["0.0.0.0/0", "::/0"] {
            rack.sled(i)?.admin(&["set-v2b", net, &switch])?;
        }
        let table = rack.sled(i)?.admin(&["--json", "dump-v2b"])?;
        if table.matches(&switch).count() != 2 {
            return Err(Error::new(format!(
                "sled {i}'s dump-v2b does not show the switch twice: {table}"
            )));
        }
    }
    let (mut ingress, mut back) = (Vec::new(), Vec::new());
    for g in guests {
        let (name, mac, vni) = (g.spec.name.clone(), parse_mac(&g.spec.mac)?, g.spec.vni);
        rack.add_guest(g.spec)?;
        let sled0 = rack.sled(0)?;
        for net in ["0.0.0.0/0", "::/0"] {
            sled0.admin(&["add-router-entry", &name, net, "igw"])?;
        }
        let mut args = vec!["set-external-ips", name.as_str()];
        args.extend(g.external.iter().map(String::as_str));
        sled0.admin(&args)?;
        for (dst, ports) in g.ingress {
            let host = format!("{dst}/{}", if dst.is_ipv4() { 32 } else { 128 });
            if !back.contains(&host) {
                back.push(host);
            }
            ingress.push(Ingress {
                dst,
                ports,
                sled: sled0.addr,
                vni,
                mac,
            });
        }
    }
    let back: Vec<&str> = back.iter().map(String::as_str).collect();
    let internet = Internet::attach(&rack, daemons, bin, &ingress, &back)?;
    Ok((rack, internet))
}

/// The tun device of the switch.
const TUN: &str = "bnd0";
/// The router's link to the server has this MTU: smaller than what guests send.
/// The server's own MSS (1360) already keeps TCP segments within it; a test that
/// wants path MTU discovery to work raises the server's `advmss`.
pub const INTERNET_MTU: u16 = 1400;

impl Internet {
    pub const SERVER4: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 10);
    pub const SERVER6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x51, 0, 0, 0, 0, 0x10);

    /// Builds it around sled `sled` of `rack`, the switch being binary `bin` (tests
    /// pass `env!("CARGO_BIN_EXE_boundary")`) with `ingress` as its table; `back` are
    /// the prefixes the internet routes to the switch (the addresses guests are
    /// reached at).
    pub fn attach(
        rack: &Rack,
        sled: usize,
        bin: &str,
        ingress: &[Ingress],
        back: &[&str],
    ) -> Result<Internet> {
        let s = rack.sled(sled)?;
        // Named after the rack, so whoever removes the rack's namespaces by prefix
        // (the demo's exit trap, the stale sweep) removes these too.
        let id = format!("{}-", rack.id);
        let fwd = [
            ("net.ipv4.ip_forward", "1"),
            ("net.ipv6.conf.all.forwarding", "1"),
            ("net.ipv4.conf.all.rp_filter", "0"),
            ("net.ipv4.conf.default.rp_filter", "0"),
        ];
        let router = Netns::create(&format!("{id}inr"), &fwd)?;
        let server = Netns::create(&format!("{id}ins"), &[])?;
        for (k, v) in fwd {
            s.ns.sysctl(k, v)?;
        }
        let (b_if, r_in, r_out, srv_if) = ("inet0", "bnd0r", "srv0r", "eth0");
        Cmd::new("ip")
            .args(["link", "add", b_if, "netns", s.ns.name()])
            .args(["type", "veth", "peer", "name", r_in, "netns", router.name()])
            .run()
            .context("creating the boundary's link to the internet router")?;
        let mtu = INTERNET_MTU.to_string();
        Cmd::new("ip")
            .args(["link", "add", r_out, "netns", router.name(), "mtu", &mtu])
            .args(["type", "veth", "peer", "name", srv_if])
            .args(["netns", server.name(), "mtu", &mtu])
            .run()
            .context("creating the router's link to the server")?;
        let ns_ip = |ns: &Netns, args: &[&str]| ns.ip(args).map(|_| ());
        ns_ip(&s.ns, &["addr", "add", "10.99.0.1/30", "dev", b_if])?;
        ns_ip(
            &s.ns,
            &["addr", "add", "fd99:1::1/64", "dev", b_if, "nodad"],
        )?;
        ns_ip(&s.ns, &["link", "set", b_if, "up"])?;
        ns_ip(&router, &["addr", "add", "10.99.0.2/30", "dev", r_in])?;
        ns_ip(
            &router,
            &["addr", "add", "fd99:1::2/64", "dev", r_in, "nodad"],
        )?;
        ns_ip(&router, &["addr", "add", "198.51.100.1/24", "dev", r_out])?;
        ns_ip(
            &router,
            &["addr", "add", "2001:db8:51::1/64", "dev", r_out, "nodad"],
        )?;
        ns_ip(&router, &["link", "set", r_in, "up"])?;
        ns_ip(&router, &["link", "set", r_out, "up"])?;
        ns_ip(&server, &["addr", "add", "198.51.100.10/24", "dev", srv_if])?;
        ns_ip(
            &server,
            &["addr", "add", "2001:db8:51::10/64", "dev", srv_if, "nodad"],
        )?;
        ns_ip(&server, &["link", "set", srv_if, "up"])?;
        ns_ip(&server, &["route", "add", "default", "via", "198.51.100.1"])?;
        ns_ip(
            &server,
            &["-6", "route", "add", "default", "via", "2001:db8:51::1"],
        )?;
        ns_ip(
            &s.ns,
            &["route", "add", "198.51.100.0/24", "via", "10.99.0.2"],
        )?;
        ns_ip(
            &s.ns,
            &["-6", "route", "add", "2001:db8:51::/64", "via", "fd99:1::2"],
        )?;
        // The tun exists before the switch attaches to it, so routes can point at it.
        ns_ip(&s.ns, &["tuntap", "add", "dev", TUN, "mode", "tun"])?;
        // No link-local address: the kernel would send router solicitations and MLD
        // reports into the tun, which the switch counts as `no_ingress`.
        ns_ip(&s.ns, &["link", "set", TUN, "addrgenmode", "none"])?;
        ns_ip(&s.ns, &["link", "set", TUN, "up", "mtu", "9000"])?;
        for prefix in back {
            let six = prefix.contains(':');
            let via = if six { "fd99:1::1" } else { "10.99.0.1" };
            let fam = if six { "-6" } else { "-4" };
            ns_ip(&router, &[fam, "route", "add", prefix, "via", via])?;
            ns_ip(&s.ns, &[fam, "route", "add", prefix, "dev", TUN])?;
        }
        let stats = rack.dir().join("switch.json");
        let log = rack.dir().join("switch.log");
        let boundary_ns = s.ns.name().to_string();
        let ingress = ingress.to_vec();
        let switch = start_switch(&boundary_ns, bin, s.addr, &ingress, &stats, &log)?;
        Ok(Internet {
            router,
            server,
            stats,
            log,
            switch,
            boundary_ns,
            bin: bin.to_string(),
            listen: s.addr,
            ingress,
        })
    }

    /// What the switch has counted since it was last started.
    pub fn counters(&self) -> Result<SwitchCounters> {
        SwitchCounters::read(&self.stats)
    }

    /// Sends what comes from the internet for the guest with MAC `mac` to the sled
    /// at `to` (every ingress entry of the guest: its floating IPs, its SNAT
    /// range), as the control plane reprograms the switch when a guest moves.
    /// The switch takes its table on its command line only, so it is stopped and
    /// started again with the new one: packets either way are dropped for the
    /// moment that takes (a real switch changes its table in place), and its
    /// counters start from zero.
    pub fn move_guest(&mut self, mac: [u8; 6], to: Ipv6Addr) -> Result<()> {
        let mut entries = self.ingress.iter_mut().filter(|e| e.mac == mac).peekable();
        if entries.peek().is_none() {
            return Err(Error::new(format!(
                "the switch's table has no entry for {}",
                mac_string(mac)
            )));
        }
        entries.for_each(|e| e.sled = to);
        terminate(&mut self.switch, "the boundary switch")?;
        self.switch = start_switch(
            &self.boundary_ns,
            &self.bin,
            self.listen,
            &self.ingress,
            &self.stats,
            &self.log,
        )?;
        Ok(())
    }
}

/// Starts the switch `bin` in namespace `ns` at underlay address `listen` with
/// table `ingress`, its counters in `stats` and its stderr appended to `log`, and
/// waits until it has written its counters (it has bound its socket and attached
/// to the tun by then).
fn start_switch(
    ns: &str,
    bin: &str,
    listen: Ipv6Addr,
    ingress: &[Ingress],
    stats: &Path,
    log: &Path,
) -> Result<Child> {
    // A file a switch before this one left would pass for this one's.
    match std::fs::remove_file(stats) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(Error::new(format!("removing {}: {e}", stats.display())))
        }
        _ => {}
    }
    let mut cmd = Cmd::in_netns(ns, bin)
        .args(["--listen", &listen.to_string(), "--tun", TUN])
        .args(["--stats", &stats.display().to_string()])
        .die_with_parent();
    for e in ingress {
        cmd = cmd.args(["--ingress".to_string(), e.arg()]);
    }
    let err = std::fs::File::options()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    let mut switch = cmd.spawn_with(Stdio::null(), Stdio::from(err))?;
    let started = poll_until(
        "the boundary switch's counters file",
        std::time::Duration::from_secs(10),
        || SwitchCounters::read(stats),
    );
    if let Err(e) = started {
        let _ = terminate(&mut switch, "the boundary switch");
        return Err(e);
    }
    Ok(switch)
}

impl Drop for Internet {
    fn drop(&mut self) {
        if let Err(e) = terminate(&mut self.switch, "the boundary switch") {
            eprintln!("e2e: stopping the boundary switch: {e}");
        }
        // The sled namespace outlives this: take out the tun (the veth goes with the
        // router's namespace).
        let _ = Cmd::in_netns(&self.boundary_ns, "ip")
            .args(["link", "del", TUN])
            .output();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> Ingress {
        Ingress {
            dst: "172.30.0.5".parse().unwrap(),
            ports: None,
            sled: "fd00:99::1".parse().unwrap(),
            vni: 1701,
            mac: [0xa8, 0x40, 0x25, 0xff, 0, 1],
        }
    }

    #[test]
    fn ingress_entries_round_trip_and_bad_ones_are_named() {
        let mut e = entry();
        assert_eq!(Ingress::parse(&e.arg()).unwrap(), e);
        e.ports = Some((1024, 2047));
        assert_eq!(Ingress::parse(&e.arg()).unwrap(), e);
        e.dst = "2001:db8::5".parse().unwrap();
        assert_eq!(Ingress::parse(&e.arg()).unwrap(), e);
        e.ports = None;
        assert_eq!(Ingress::parse(&e.arg()).unwrap(), e);
        for (bad, named) in [
            ("172.30.0.5", "IP[:LO-HI]"),
            ("172.30.0.x=fd00:99::1,1701,a8:40:25:ff:00:01", "172.30.0.x"),
            (
                "172.30.0.5=fd00:99::1,16777216,a8:40:25:ff:00:01",
                "16777216",
            ),
            ("172.30.0.5:1-x=fd00:99::1,1,a8:40:25:ff:00:01", "\"x\""),
        ] {
            let err = Ingress::parse(bad).unwrap_err();
            assert!(err.0.contains(named), "{bad}: {err}");
        }
    }

    #[test]
    fn encapsulated_packets_decapsulate_and_are_routed_by_the_table() {
        // An IPv4/UDP packet to 172.30.0.5:1500.
        let mut ip = vec![0x45, 0, 0, 28, 0, 0, 0x40, 0, 64, 17, 0, 0];
        ip.extend_from_slice(&[198, 51, 100, 10, 172, 30, 0, 5]);
        ip.extend_from_slice(&[0x13, 0x88, 0x05, 0xdc, 0, 8, 0, 0]);
        let mut sw = Switch {
            ingress: vec![Ingress {
                ports: Some((1024, 2047)),
                ..entry()
            }],
            boundary_vni: 1701,
            counters: SwitchCounters::default(),
        };
        let (sled, g) = sw.from_internet(&ip).unwrap();
        assert_eq!(sled, entry().sled);
        // The External option, then the guest's MAC.
        assert_eq!(&g[8..12], &[0x01, 0x29, 0x00, 0x00]);
        assert_eq!(&g[12..18], &entry().mac);
        assert_eq!(sw.from_sled(&g), Some(&ip[..]));
        // Outside the port range: no entry.
        ip[22] = 0x20;
        assert!(sw.from_internet(&ip).is_none());
        assert!(sw.from_sled(&g[..20]).is_none());
        let c = &sw.counters;
        assert_eq!((c.encap, c.no_ingress, c.decap, c.bad_geneve), (1, 1, 1, 1));
        assert_eq!(
            c.to_string(),
            "from the sleds: 1 packets sent on to the internet (0 of them not in the boundary \
             VNI), 1 dropped as not Ethernet with IP; from the internet: 1 packets encapsulated \
             toward a sled, 1 dropped for no guest, 0 multicast of the switch's own kernel dropped"
        );
    }

    #[test]
    fn icmp_is_routed_by_echo_identifier_and_by_the_quoted_source_port() {
        let v4 = |proto: u8, l4: &[u8]| {
            let mut ip = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, proto, 0, 0];
            ip.extend_from_slice(&[198, 51, 100, 1, 203, 0, 113, 9]);
            ip.extend_from_slice(l4);
            ip
        };
        let nat = IpAddr::from([203, 0, 113, 9]);
        // Echo reply, identifier 2001.
        let reply = v4(PROTO_ICMP, &[0, 0, 0, 0, 0x07, 0xd1, 0, 1]);
        assert_eq!(destination(&reply), Some((nat, Some(2001))));
        // Fragmentation needed quoting TCP from 203.0.113.9:2002 to port 5201.
        let quote = v4(PROTO_TCP, &[0x07, 0xd2, 0x14, 0x51, 0, 0, 0, 1]);
        let mut error = vec![3, 4, 0, 0, 0, 0, 0x05, 0x78];
        error.extend_from_slice(&quote);
        assert_eq!(
            destination(&v4(PROTO_ICMP, &error)),
            Some((nat, Some(2002)))
        );
        // Packet Too Big (IPv6) quoting an echo request with identifier 2003.
        let v6 = |next: u8, l4: &[u8]| {
            let mut ip = vec![0x60, 0, 0, 0, 0, 0, next, 64];
            ip.extend_from_slice(&[
                0x20, 0x01, 0x0d, 0xb8, 0, 0x51, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1,
            ]);
            ip.extend_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9]);
            ip.extend_from_slice(l4);
            ip
        };
        let quote = v6(PROTO_ICMPV6, &[128, 0, 0, 0, 0x07, 0xd3, 0, 1]);
        let mut ptb = vec![2, 0, 0, 0, 0, 0, 0x05, 0x78];
        ptb.extend_from_slice(&quote);
        let (dst, port) = destination(&v6(PROTO_ICMPV6, &ptb)).unwrap();
        assert_eq!(
            (dst.to_string().as_str(), port),
            ("2001:db8:9::9", Some(2003))
        );
        // Other ICMP: no port.
        assert_eq!(
            destination(&v4(PROTO_ICMP, &[8, 0, 0, 0, 0, 1, 0, 1]))
                .unwrap()
                .1,
            None
        );
    }
}
