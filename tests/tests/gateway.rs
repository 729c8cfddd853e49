//! What the datapath's gateway tells a guest about its MTU: the Router Advertisement's
//! MTU option (seen by the kernel, rdisc6 and `xdeadm ra listen`) and DHCPv4 option
//! 26, both equal to the port's `--mtu`, and 1500 for a port created without it.

use e2e::guest::GuestSpec;
use e2e::{poll_until, stats, Error, Guest, Rack, RackSpec, Result};
use std::time::Duration;

const JUMBO: &str = "j1";
const DEFAULT: &str = "d1";

/// One sled, a port with `--mtu 8500` and one without, both dual-stack.
fn rack() -> Result<Rack> {
    let mut rack = Rack::build(&RackSpec::new("e2e", 1))?;
    rack.start_daemons(&[])?;
    rack.add_guest(GuestSpec::dual(JUMBO, 0, 1))?;
    rack.add_guest(GuestSpec::dual(DEFAULT, 0, 2).mtu(None))?;
    Ok(rack)
}

/// `rdisc6 -1 IF` in the guest: sends a Router Solicitation and prints the first RA.
fn rdisc6(g: &Guest) -> Result<String> {
    poll_until(
        &format!("an RA on {}", g.ifname()),
        Duration::from_secs(20),
        || g.run("rdisc6", &["-1", "-w", "2000", g.ifname()]),
    )
}

/// rdisc6 prints `MTU                      :         8500 bytes (valid)`.
fn rdisc6_mtu(out: &str) -> Result<u32> {
    out.lines()
        .find(|l| l.trim_start().starts_with("MTU"))
        .and_then(|l| l.split(':').nth(1))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| Error::new(format!("no MTU line in rdisc6 output:\n{out}")))
}

#[test]
fn router_advertisement_carries_the_port_mtu() -> Result<()> {
    let rack = rack()?;
    let jumbo = rack.guest(JUMBO)?;
    // Start the guest's IPv6 MTU at the minimum, so only an RA carrying 8500 can
    // raise it (the tap's link MTU of 8500 is the ceiling the kernel accepts).
    jumbo
        .ns
        .sysctl(&format!("net.ipv6.conf.{}.mtu", jumbo.ifname()), "1280")?;
    assert_eq!(jumbo.ipv6_mtu()?, 1280);
    let out = rdisc6(jumbo)?;
    assert_eq!(rdisc6_mtu(&out)?, 8500, "rdisc6 output:\n{out}");
    poll_until(
        "the guest kernel to apply the RA's MTU",
        Duration::from_secs(10),
        || match jumbo.ipv6_mtu()? {
            8500 => Ok(()),
            m => Err(Error::new(format!("IPv6 MTU is {m}"))),
        },
    )?;

    let plain = rack.guest(DEFAULT)?;
    let out = rdisc6(plain)?;
    assert_eq!(rdisc6_mtu(&out)?, 1500, "rdisc6 output:\n{out}");
    Ok(())
}

#[test]
fn xdeadm_reports_and_listens_for_the_ra_mtu() -> Result<()> {
    let rack = rack()?;
    let sled = rack.sled(0)?;
    let bins = e2e::bins::bins()?;
    for (name, mtu) in [(JUMBO, 8500), (DEFAULT, 1500)] {
        let g = rack.guest(name)?;
        // From inside the guest: what the guest's side actually receives.
        let heard = poll_until(
            &format!("xdeadm ra listen {name}"),
            Duration::from_secs(20),
            || {
                g.cmd(&bins.xdeadm.display().to_string())
                    .args(["--json", "ra", "listen", name])
                    .run()
            },
        )?;
        let heard = stats::parse(&heard)?;
        assert_eq!(
            stats::get(&heard, "mtu"),
            Some(mtu),
            "ra listen {name}: {heard:?}"
        );
        // RFC 4861: an RA must arrive with hop limit 255.
        assert_eq!(stats::get(&heard, "ip_hop_limit"), Some(255), "{heard:?}");
        // From the sled: what the daemon will advertise, and the port's MTU budget.
        let ra = stats::parse(&sled.admin(&["--json", "ra", name])?)?;
        assert_eq!(
            stats::get(&ra, "data.mtu"),
            Some(mtu),
            "xdeadm ra {name}: {ra:?}"
        );
        let budget = stats::parse(&sled.admin(&["--json", "mtu", name])?)?;
        assert_eq!(
            stats::get(&budget, "data.port_mtu"),
            Some(mtu),
            "{budget:?}"
        );
        assert_eq!(
            stats::get(&budget, "data.underlay_mtu"),
            Some(9000),
            "{budget:?}"
        );
        // The human-readable forms say the same.
        let text = g
            .cmd(&bins.xdeadm.display().to_string())
            .args(["ra", "listen", name])
            .run()?;
        assert!(
            text.contains(&mtu.to_string()),
            "xdeadm ra listen {name}:\n{text}"
        );
    }
    Ok(())
}

/// A DHCPDISCOVER from the guest (scapy, raw socket) gets an OFFER with option 26
/// (interface MTU) equal to the port MTU, the guest's address and the gateway.
fn dhcp_offer(g: &Guest) -> Result<Vec<(String, String)>> {
    let script = format!(
        "from scapy.all import *\n\
         conf.checkIPaddr = False\n\
         mac = '{mac}'\n\
         p = (Ether(src=mac, dst='ff:ff:ff:ff:ff:ff') / IP(src='0.0.0.0', dst='255.255.255.255')\n\
              / UDP(sport=68, dport=67) / BOOTP(chaddr=mac2str(mac), xid=0x5eed, flags=0x8000)\n\
              / DHCP(options=[('message-type', 'discover'), ('param_req_list', [1, 3, 6, 26, 121]), 'end']))\n\
         a = srp1(p, iface='{iface}', timeout=3, verbose=False)\n\
         if a is None or DHCP not in a: sys.exit('no DHCP answer')\n\
         print('yiaddr=' + a[BOOTP].yiaddr)\n\
         for o in a[DHCP].options:\n\
         \x20   if isinstance(o, tuple) and len(o) == 2: print(f'{{o[0]}}={{o[1]}}')\n",
        mac = g.spec.mac,
        iface = g.ifname(),
    );
    let out = poll_until(
        &format!("a DHCP offer on {}", g.ifname()),
        Duration::from_secs(20),
        || {
            g.cmd("python3")
                .arg("-")
                .stdin(script.clone())
                .timeout(Duration::from_secs(30))
                .run()
        },
    )?;
    Ok(out
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect())
}

fn option<'a>(opts: &'a [(String, String)], key: &str) -> Option<&'a str> {
    opts.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

#[test]
fn dhcp_offer_carries_the_port_mtu() -> Result<()> {
    let rack = rack()?;
    for (name, mtu) in [(JUMBO, "8500"), (DEFAULT, "1500")] {
        let g = rack.guest(name)?;
        let opts = dhcp_offer(g)?;
        let ip = g.ipv4()?.to_string();
        assert_eq!(option(&opts, "yiaddr"), Some(ip.as_str()), "{opts:?}");
        // scapy names message type 2 "offer" in recent versions, 2 in older ones.
        assert!(
            matches!(option(&opts, "message-type"), Some("2" | "offer")),
            "{opts:?}"
        );
        assert_eq!(
            option(&opts, "interface-mtu"),
            Some(mtu),
            "{name}: {opts:?}"
        );
        let gw = g.spec.gateway_ipv4.to_string();
        assert_eq!(option(&opts, "router"), Some(gw.as_str()), "{opts:?}");
    }
    Ok(())
}
