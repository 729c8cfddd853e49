//! Guests: a namespace holding the tap port a sled's daemon created for it, configured
//! the way a VM's OS would be (addresses, routes via the virtual gateway).

use crate::cmd::{Cmd, Outcome};
use crate::netns::Netns;
use crate::poll::poll_until;
use crate::rack::Sled;
use crate::{Context, Error, Result};
use std::fs::File;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// The gateway MAC every port shows its guest (the value the reference uses).
pub const GATEWAY_MAC: &str = "a8:40:25:ff:77:77";
/// The IPv4 gateway of the default VPC subnet.
pub const GATEWAY_IPV4: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
pub const VPC_SUBNET4: &str = "10.0.0.0/24";
pub const VPC_SUBNET6: &str = "fd00:1::/64";
/// The guest MTU of a rack with a 9000-byte underlay (500 bytes kept for the
/// encapsulation and headroom).
pub const JUMBO_MTU: u16 = 8500;

/// How a guest's port is created and its OS configured.
#[derive(Clone, Debug)]
pub struct GuestSpec {
    /// Short name: the tap device's name (at most 15 bytes) and the guest
    /// namespace's suffix.
    pub name: String,
    /// Index of the sled whose daemon hosts the port.
    pub sled: usize,
    pub mac: String,
    pub vni: u32,
    pub ipv4: Option<Ipv4Addr>,
    pub ipv6: Option<Ipv6Addr>,
    pub subnet4: String,
    pub subnet6: String,
    pub gateway_ipv4: Ipv4Addr,
    pub gateway_mac: String,
    /// `--mtu` for create-xde; `None` leaves the daemon's default (1500).
    pub mtu: Option<u16>,
    /// The port's (instance-level) external jumbo flag.
    pub external_jumbo: bool,
    /// Sources allowed inbound by the port's firewall (which denies inbound by
    /// default, like the reference): the VPC's own subnets unless a test says
    /// otherwise, as the control plane's default "allow internal inbound" rule does.
    pub allow_inbound_from: Vec<String>,
    /// The port's ephemeral IP (`--ephemeral-ip`): without an external address a
    /// port may not reach the internet.
    pub ephemeral_ip: Option<IpAddr>,
}

impl GuestSpec {
    /// A dual-stack guest numbered `n` (1..=200) on `sled`: MAC a8:40:25:f0:00:n,
    /// 10.0.0.(10+n) and fd00:1::(10+n) in VNI 10, port MTU 8500.
    pub fn dual(name: &str, sled: usize, n: u8) -> GuestSpec {
        let host = n.saturating_add(10);
        GuestSpec {
            name: name.to_string(),
            sled,
            mac: format!("a8:40:25:f0:00:{n:02x}"),
            vni: 10,
            ipv4: Some(Ipv4Addr::new(10, 0, 0, host)),
            ipv6: Some(Ipv6Addr::new(0xfd00, 1, 0, 0, 0, 0, 0, u16::from(host))),
            subnet4: VPC_SUBNET4.to_string(),
            subnet6: VPC_SUBNET6.to_string(),
            gateway_ipv4: GATEWAY_IPV4,
            gateway_mac: GATEWAY_MAC.to_string(),
            mtu: Some(JUMBO_MTU),
            external_jumbo: false,
            allow_inbound_from: vec![VPC_SUBNET4.to_string(), VPC_SUBNET6.to_string()],
            ephemeral_ip: None,
        }
    }

    /// Like [`GuestSpec::dual`] with only IPv4.
    pub fn v4(name: &str, sled: usize, n: u8) -> GuestSpec {
        GuestSpec {
            ipv6: None,
            ..GuestSpec::dual(name, sled, n)
        }
    }

    /// Like [`GuestSpec::dual`] with only IPv6.
    pub fn v6(name: &str, sled: usize, n: u8) -> GuestSpec {
        GuestSpec {
            ipv4: None,
            ..GuestSpec::dual(name, sled, n)
        }
    }

    pub fn vni(mut self, vni: u32) -> GuestSpec {
        self.vni = vni;
        self
    }

    pub fn mtu(mut self, mtu: Option<u16>) -> GuestSpec {
        self.mtu = mtu;
        self
    }

    pub fn external_jumbo(mut self, on: bool) -> GuestSpec {
        self.external_jumbo = on;
        self
    }

    pub fn ephemeral_ip(mut self, ip: IpAddr) -> GuestSpec {
        self.ephemeral_ip = Some(ip);
        self
    }

    /// The guest's private addresses (what V2P maps).
    pub fn addresses(&self) -> Vec<IpAddr> {
        self.ipv4
            .map(IpAddr::V4)
            .into_iter()
            .chain(self.ipv6.map(IpAddr::V6))
            .collect()
    }

    /// The gateway's IPv6 address as the guest sees it: fe80::EUI-64(gateway MAC).
    pub fn gateway_ipv6(&self) -> Result<Ipv6Addr> {
        link_local_eui64(&self.gateway_mac)
    }

    /// The `xdeadm create-xde` arguments for this port without `--netns`, then
    /// `extra` (e.g. `--attach IFACE`).
    pub fn create_args_in_sled(&self, extra: &[&str]) -> Vec<String> {
        let mut a = self.create_args(None);
        a.extend(extra.iter().map(std::string::ToString::to_string));
        a
    }

    /// The `xdeadm create-xde` arguments for this port, its tap moved into
    /// namespace `netns`, or left in the daemon's namespace for a hypervisor to
    /// bridge to a VM when `netns` is `None`.
    pub fn create_args(&self, netns: Option<&str>) -> Vec<String> {
        let mut a: Vec<String> = vec![
            "create-xde".into(),
            self.name.clone(),
            "--guest-mac".into(),
            self.mac.clone(),
            "--gateway-mac".into(),
            self.gateway_mac.clone(),
            "--vpc-vni".into(),
            self.vni.to_string(),
        ];
        if let Some(ns) = netns {
            a.extend(["--netns".into(), ns.into()]);
        }
        if let Some(ip) = self.ipv4 {
            a.extend([
                "--private-ip".into(),
                ip.to_string(),
                "--vpc-subnet".into(),
                self.subnet4.clone(),
                "--gateway-ip".into(),
                self.gateway_ipv4.to_string(),
            ]);
        }
        if let Some(ip) = self.ipv6 {
            a.extend([
                "--private-ip".into(),
                ip.to_string(),
                "--vpc-subnet".into(),
                self.subnet6.clone(),
            ]);
        }
        if let Some(mtu) = self.mtu {
            a.extend(["--mtu".into(), mtu.to_string()]);
        }
        if self.external_jumbo {
            a.push("--external-jumbo".into());
        }
        if let Some(ip) = self.ephemeral_ip {
            a.extend(["--ephemeral-ip".into(), ip.to_string()]);
        }
        a
    }

    /// The `xdeadm add-fw-rule` arguments that let in `allow_inbound_from`.
    pub fn inbound_rule_args(&self) -> Vec<Vec<String>> {
        self.allow_inbound_from
            .iter()
            .enumerate()
            .map(|(i, host)| {
                let priority = (100 + i).to_string();
                [
                    "add-fw-rule",
                    &self.name,
                    "--direction",
                    "in",
                    "--priority",
                    &priority,
                    "--host",
                    host,
                    "--proto",
                    "any",
                    "--action",
                    "allow",
                ]
                .map(String::from)
                .to_vec()
            })
            .collect()
    }
}

/// fe80::/64 with the modified EUI-64 interface identifier of `mac` (RFC 4291 app. A).
pub fn link_local_eui64(mac: &str) -> Result<Ipv6Addr> {
    let bytes: Vec<u8> = mac
        .split(':')
        .map(|b| u8::from_str_radix(b, 16))
        .collect::<Result<_, _>>()
        .map_err(|e| Error::new(format!("MAC {mac:?}: {e}")))?;
    let [a, b, c, d, e, f] = bytes[..] else {
        return Err(Error::new(format!("MAC {mac:?} does not have 6 bytes")));
    };
    let seg = |hi: u8, lo: u8| u16::from_be_bytes([hi, lo]);
    Ok(Ipv6Addr::new(
        0xfe80,
        0,
        0,
        0,
        seg(a ^ 0x02, b),
        seg(c, 0xff),
        seg(0xfe, d),
        seg(e, f),
    ))
}

/// Creates `spec`'s port on `sled` (its tap moved into namespace `netns`, or left
/// in the sled's namespace when `None`) and allows inbound traffic from
/// `spec.allow_inbound_from`.
pub fn create_port(sled: &Sled, spec: &GuestSpec, netns: Option<&str>) -> Result<()> {
    let args = spec.create_args(netns);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    sled.admin(&refs)?;
    for rule in spec.inbound_rule_args() {
        let refs: Vec<&str> = rule.iter().map(String::as_str).collect();
        sled.admin(&refs)?;
    }
    Ok(())
}

/// A configured guest.
#[derive(Debug)]
pub struct Guest {
    pub spec: GuestSpec,
    pub ns: Netns,
}

impl Guest {
    /// Creates the port on `sled` with its tap moved into a new namespace `ns_name`,
    /// allows inbound traffic from `spec.allow_inbound_from`, then configures the
    /// guest OS side ([`Guest::configure_os`]).
    pub fn create(sled: &Sled, ns_name: &str, spec: GuestSpec) -> Result<Guest> {
        let ns = Guest::namespace(ns_name)?;
        create_port(sled, &spec, Some(ns.name()))?;
        let guest = Guest { spec, ns };
        guest.configure_os()?;
        Ok(guest)
    }

    /// A guest's namespace, with the sysctls its interfaces inherit: a host, not a
    /// router (IPv6 forwarding off, RAs accepted), and no DAD delay.
    pub fn namespace(name: &str) -> Result<Netns> {
        Netns::create(
            name,
            &[
                ("net.ipv6.conf.all.forwarding", "0"),
                ("net.ipv6.conf.default.accept_ra", "1"),
                ("net.ipv6.conf.all.accept_dad", "0"),
                ("net.ipv6.conf.default.accept_dad", "0"),
            ],
        )
    }

    /// The guest OS side, once the daemon has put the port's tap in the namespace
    /// (waited for):
    /// - IPv6 forwarding off and accept_ra on (a host, not a router: the kernel
    ///   applies the RA's MTU), DAD off;
    /// - IPv4 as a /32 with an on-link route to the gateway and a default route via it
    ///   (what the datapath's DHCP hands out);
    /// - IPv6 as a /128 with a default route via the gateway's link-local address (the
    ///   RA adds the same one; ours has a higher metric so they do not clash).
    pub fn configure_os(&self) -> Result<()> {
        let ifname = self.spec.name.clone();
        poll_until(
            &format!("tap {ifname} to appear in {}", self.ns.name()),
            Duration::from_secs(10),
            || self.ns.ip(&["link", "show", &ifname]),
        )?;
        for (key, value) in [("forwarding", "0"), ("accept_ra", "1"), ("accept_dad", "0")] {
            self.ns
                .sysctl(&format!("net.ipv6.conf.{ifname}.{key}"), value)?;
        }
        self.ns.ip(&["link", "set", &ifname, "up"])?;
        if let Some(ip) = self.spec.ipv4 {
            let gw = self.spec.gateway_ipv4.to_string();
            self.ns
                .ip(&["addr", "add", &format!("{ip}/32"), "dev", &ifname])?;
            self.ns
                .ip(&["route", "add", &gw, "dev", &ifname, "scope", "link"])?;
            self.ns
                .ip(&["route", "add", "default", "via", &gw, "dev", &ifname])?;
        }
        if let Some(ip) = self.spec.ipv6 {
            let gw = self.spec.gateway_ipv6()?.to_string();
            self.ns.ip(&[
                "-6",
                "addr",
                "add",
                &format!("{ip}/128"),
                "dev",
                &ifname,
                "nodad",
            ])?;
            self.ns.ip(&[
                "-6", "route", "add", "default", "via", &gw, "dev", &ifname, "metric", "2048",
            ])?;
        }
        Ok(())
    }

    /// The guest's IPv4 address (an error for an IPv6-only guest).
    pub fn ipv4(&self) -> Result<IpAddr> {
        self.spec
            .ipv4
            .map(IpAddr::V4)
            .ok_or_else(|| Error::new(format!("guest {} has no IPv4 address", self.spec.name)))
    }

    /// The guest's IPv6 address (an error for an IPv4-only guest).
    pub fn ipv6(&self) -> Result<IpAddr> {
        self.spec
            .ipv6
            .map(IpAddr::V6)
            .ok_or_else(|| Error::new(format!("guest {} has no IPv6 address", self.spec.name)))
    }

    pub fn ifname(&self) -> &str {
        &self.spec.name
    }

    /// A command to run inside the guest.
    pub fn cmd(&self, program: &str) -> Cmd {
        self.ns.cmd(program)
    }

    /// Runs inside the guest; requires success; returns stdout.
    pub fn run(&self, program: &str, args: &[&str]) -> Result<String> {
        self.ns.run(program, args)
    }

    /// One ping of `size` payload bytes with fragmentation forbidden; the outcome
    /// whatever it was (for checks that traffic does NOT pass).
    pub fn ping_once(&self, target: IpAddr, size: usize) -> Result<Outcome> {
        let family = if target.is_ipv4() { "-4" } else { "-6" };
        self.ns.output(
            "ping",
            &[
                family,
                "-c",
                "1",
                "-W",
                "1",
                "-M",
                "do",
                "-s",
                &size.to_string(),
                &target.to_string(),
            ],
        )
    }

    /// Pings until one reply comes back (the first packets may wait for neighbour
    /// resolution on the underlay), at most `timeout`.
    pub fn ping(&self, target: IpAddr, size: usize, timeout: Duration) -> Result<()> {
        poll_until(
            &format!(
                "{} to get a {size}-byte ping reply from {target}",
                self.spec.name
            ),
            timeout,
            || {
                let o = self.ping_once(target, size)?;
                if o.status.success() {
                    Ok(())
                } else {
                    Err(Error::new(format!(
                        "{}{}",
                        o.stdout.trim(),
                        o.stderr.trim()
                    )))
                }
            },
        )
    }

    /// Waits up to `within` until the guest's IPv6 MTU is `mtu` (an RA's MTU
    /// option applied).
    pub fn wait_for_ipv6_mtu(&self, mtu: u32, within: Duration) -> Result<()> {
        poll_until(
            &format!("IPv6 MTU {mtu} in guest {}", self.spec.name),
            within,
            || {
                let m = self.ipv6_mtu()?;
                if m == mtu {
                    Ok(())
                } else {
                    Err(Error::new(format!("IPv6 MTU {m}")))
                }
            },
        )
    }

    /// Pings of 8500-byte packets (the standard port MTU: 8472 bytes of ICMPv4
    /// payload, 8452 of ICMPv6) from this guest to `peer` and back, IPv4 and IPv6.
    pub fn full_size_pings(&self, peer: &Guest, within: Duration) -> Result<()> {
        self.ping(peer.ipv4()?, 8472, within)?;
        peer.ping(self.ipv4()?, 8472, within)?;
        self.ping(peer.ipv6()?, 8452, within)?;
        peer.ping(self.ipv6()?, 8452, within)
    }

    /// The kernel's IPv6 MTU for the guest's interface (what an RA's MTU option set).
    pub fn ipv6_mtu(&self) -> Result<u32> {
        let key = format!("net.ipv6.conf.{}.mtu", self.spec.name);
        let v = self.ns.read_sysctl(&key)?;
        v.parse()
            .map_err(|_| Error::new(format!("{key} is {v:?}, not a number")))
    }

    /// Starts pinging `target` every `interval` (56-byte payloads, each reply
    /// stamped with the time it came), in the background until [`Pings::stop`];
    /// the output goes to file `out`.
    ///
    /// The source address is given (`-I`), so ping skips its probe of the
    /// route (a UDP `connect`, which takes an ephemeral port): with several
    /// streams at once in a guest whose ephemeral range is one port, the probe
    /// fails with EAGAIN.
    pub fn start_pings(&self, target: IpAddr, interval: Duration, out: &Path) -> Result<Pings> {
        let source = match target {
            IpAddr::V4(_) => self.ipv4()?,
            IpAddr::V6(_) => self.ipv6()?,
        };
        let file = File::create(out).with_context(|| format!("creating {}", out.display()))?;
        let cmd = self
            .cmd("ping")
            .args(["-D", "-n", "-i", &format!("{:.3}", interval.as_secs_f64())])
            .args(["-I", &source.to_string()])
            .arg(target.to_string())
            .die_with_parent();
        let child = cmd.spawn_with(Stdio::from(file.try_clone()?), Stdio::from(file))?;
        Ok(Pings {
            child: Some(child),
            out: out.to_path_buf(),
            what: cmd.display(),
        })
    }
}

/// Pings running in the background ([`Guest::start_pings`]); killed if dropped
/// unstopped.
#[derive(Debug)]
pub struct Pings {
    child: Option<Child>,
    out: PathBuf,
    what: String,
}

/// What background pings saw.
#[derive(Clone, Debug)]
pub struct PingLog {
    /// Echo requests sent and replies received (ping's own summary).
    pub sent: u64,
    pub received: u64,
    /// Each reply's sequence number and when it came (seconds since the epoch).
    pub replies: Vec<(u64, f64)>,
}

impl Pings {
    /// Stops the pings as a person would (SIGINT: ping prints its summary) and
    /// reads what they saw.
    pub fn stop(mut self) -> Result<PingLog> {
        let mut child = self
            .child
            .take()
            .ok_or_else(|| Error::new("the pings were stopped already"))?;
        let pid = libc::pid_t::try_from(child.id())
            .map_err(|_| Error::new(format!("pid {} out of range", child.id())))?;
        // SAFETY: kill(2) on the pid of our own unreaped child: it cannot have
        // been recycled for another process while we have not waited for it.
        unsafe { libc::kill(pid, libc::SIGINT) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while child.try_wait()?.is_none() {
            if Instant::now() > deadline {
                child.kill()?;
                child.wait()?;
                return Err(Error::new(format!("`{}` ignored SIGINT", self.what)));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let text = self.output()?;
        let (sent, received) = ping_counts(&text).with_context(|| format!("`{}`", self.what))?;
        Ok(PingLog {
            sent,
            received,
            replies: text.lines().filter_map(ping_reply).collect(),
        })
    }

    /// The replies so far (see [`PingLog::replies`]), while the pings go on.
    pub fn replies(&self) -> Result<Vec<(u64, f64)>> {
        Ok(self.output()?.lines().filter_map(ping_reply).collect())
    }

    fn output(&self) -> Result<String> {
        std::fs::read_to_string(&self.out)
            .with_context(|| format!("reading {}", self.out.display()))
    }
}

impl Drop for Pings {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl PingLog {
    pub fn lost(&self) -> u64 {
        self.sent.saturating_sub(self.received)
    }

    /// The two replies in a row furthest apart in time, among those from the
    /// last one before `from` (seconds since the epoch; 0 for all) on: each
    /// reply's sequence number and time. `None` with fewer than two replies.
    pub fn longest_gap(&self, from: f64) -> Option<((u64, f64), (u64, f64))> {
        longest_gap(&self.replies, from)
    }
}

/// The two arrivals in a row furthest apart in time, among `arrivals` (sequence
/// number and seconds since the epoch, in order of arrival) from the last one
/// before `from` on: what [`PingLog::longest_gap`] finds among replies, for any
/// numbered stream. `None` with fewer than two arrivals.
pub fn longest_gap(arrivals: &[(u64, f64)], from: f64) -> Option<((u64, f64), (u64, f64))> {
    let first = arrivals.iter().rposition(|r| r.1 < from).unwrap_or(0);
    arrivals[first..]
        .windows(2)
        .map(|w| (w[0], w[1]))
        .max_by(|a, b| (a.1 .1 - a.0 .1).total_cmp(&(b.1 .1 - b.0 .1)))
}

/// `N packets transmitted, M received, ...` of ping's summary: (N, M).
pub fn ping_counts(text: &str) -> Result<(u64, u64)> {
    let line = text
        .lines()
        .find(|l| l.contains("packets transmitted"))
        .ok_or_else(|| Error::new(format!("no ping summary in {text:?}")))?;
    let nums: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    match nums[..] {
        [sent, received, ..] => Ok((sent, received)),
        _ => Err(Error::new(format!("ping summary {line:?}"))),
    }
}

/// `[1764650000.123456] 64 bytes from 10.0.0.13: icmp_seq=5 ttl=64 time=0.4 ms`
/// (`ping -D`): the sequence number and the time. Duplicates are not replies.
fn ping_reply(line: &str) -> Option<(u64, f64)> {
    if line.contains("DUP!") || !line.contains(" bytes from ") {
        return None;
    }
    let at = line.strip_prefix('[')?.split(']').next()?.parse().ok()?;
    let seq = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("icmp_seq="))?
        .parse()
        .ok()?;
    Some((seq, at))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ping_output_gives_counts_replies_and_gaps() {
        let text = "PING 10.0.0.13 (10.0.0.13) 56(84) bytes of data.\n\
            [1764650000.100000] 64 bytes from 10.0.0.13: icmp_seq=1 ttl=64 time=0.4 ms\n\
            [1764650000.110000] 64 bytes from 10.0.0.13: icmp_seq=2 ttl=64 time=0.4 ms\n\
            [1764650000.110500] 64 bytes from 10.0.0.13: icmp_seq=2 ttl=64 time=0.9 ms (DUP!)\n\
            [1764650000.450000] 64 bytes from 10.0.0.13: icmp_seq=36 ttl=64 time=0.4 ms\n\
            \n--- 10.0.0.13 ping statistics ---\n\
            36 packets transmitted, 3 received, +1 duplicates, 91.6667% packet loss, time 350ms\n";
        assert_eq!(ping_counts(text).unwrap(), (36, 3));
        let replies: Vec<(u64, f64)> = text.lines().filter_map(ping_reply).collect();
        assert_eq!(replies.iter().map(|r| r.0).collect::<Vec<_>>(), [1, 2, 36]);
        let log = PingLog {
            sent: 36,
            received: 3,
            replies,
        };
        assert_eq!(log.lost(), 33);
        let (from, to) = log.longest_gap(0.0).unwrap();
        assert_eq!((from.0, to.0), (2, 36));
        assert!((to.1 - from.1 - 0.34).abs() < 1e-6, "{from:?} {to:?}");
        let (from, _) = log.longest_gap(1_764_650_000.2).unwrap();
        assert_eq!(from.0, 2);
        // Only the last reply is from the last one before the time on.
        assert_eq!(log.longest_gap(1_764_650_000.5), None);
        assert!(ping_counts("nothing").is_err());
    }

    #[test]
    fn eui64_of_reference_gateway_mac() {
        assert_eq!(
            link_local_eui64("a8:40:25:ff:77:77").unwrap(),
            "fe80::aa40:25ff:feff:7777".parse::<Ipv6Addr>().unwrap()
        );
        assert!(link_local_eui64("a8:40:25:ff:77").is_err());
        assert!(link_local_eui64("zz:40:25:ff:77:77").is_err());
    }

    #[test]
    fn specs_number_guests_and_pick_families() {
        let g = GuestSpec::dual("vm3", 1, 3);
        assert_eq!(g.mac, "a8:40:25:f0:00:03");
        assert_eq!(
            g.addresses(),
            vec![
                IpAddr::from([10, 0, 0, 13]),
                "fd00:1::d".parse::<IpAddr>().unwrap()
            ]
        );
        assert_eq!(GuestSpec::v4("a", 0, 1).addresses().len(), 1);
        assert!(GuestSpec::v6("a", 0, 1).ipv4.is_none());
        let args = GuestSpec::v4("a", 0, 1).mtu(None).create_args(Some("ns"));
        assert!(!args.contains(&"--mtu".to_string()), "{args:?}");
    }
}
