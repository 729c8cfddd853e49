//! Appliances through the daemons (docs/operating.md, "Appliances"): a1 routes
//! 192.168.50.0/24 to b1 (`add-router-entry a1 192.168.50.0/24 ip4=<b1>`), b1 on the
//! other sled holds 192.168.50.7 behind it. b1's port refuses that destination
//! (`inbound_dst_not_guest`) until it is allowed in, and b1's answers from it
//! (`spoofed_src_ip`) until it is allowed out; with both, and a V2P mapping for the
//! address on a1's sled (whose inbound check trusts a source only as V2P maps it),
//! a1's ping to 192.168.50.7 is answered. `detach-subnet` stops it again,
//! `attach-subnet` brings it back, and a restart of b1's daemon keeps it.

use e2e::counters::Snapshot;
use e2e::rack::Sled;
use e2e::standard::{self, A1, B1};
use e2e::{Error, Guest, Result};
use serde_json::Value;
use std::net::IpAddr;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(20);
const PREFIX: &str = "192.168.50.0/24";
const BEHIND: &str = "192.168.50.7";
const DST_NOT_GUEST: &str = "engine.ports.b1.drops.inbound_dst_not_guest";
const SPOOFED: &str = "engine.ports.b1.drops.spoofed_src_ip";

/// Pings `to` from `from` until `counter` on `sled` grows (at most [`WAIT`]).
fn ping_until_counted(from: &Guest, to: IpAddr, sled: &Sled, counter: &str) -> Result<()> {
    let before = Snapshot::take(sled)?.get(counter);
    e2e::poll_until(&format!("{counter} to grow"), WAIT, || {
        let o = from.ping_once(to, 56)?;
        if o.status.success() {
            return Err(Error::new(format!("{to} answered")));
        }
        let now = Snapshot::take(sled)?.get(counter);
        if now > before {
            Ok(())
        } else {
            Err(Error::new(format!("{counter} still {now}")))
        }
    })
}

/// b1's allowed prefixes as `list-ports --json` shows them.
fn cidrs_of_b1(sled: &Sled) -> Result<Value> {
    let out = sled.admin(&["--json", "list-ports"])?;
    let v: Value = serde_json::from_str(&out).map_err(|e| Error::new(format!("{e}: {out}")))?;
    v["data"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["config"]["name"] == B1)
        .map(|p| p["config"]["cidrs"].clone())
        .ok_or_else(|| Error::new(format!("no port {B1} in {out}")))
}

#[test]
fn a_route_to_an_appliance_with_an_attached_subnet() -> Result<()> {
    let mut rack = standard::rack("e2e", &[])?;
    let (sled0, sled1) = (rack.sled(0)?, rack.sled(1)?);
    let (a1, b1) = (rack.guest(A1)?, rack.guest(B1)?);
    let b1_v4 = b1.ipv4()?;
    let behind: IpAddr = BEHIND
        .parse()
        .map_err(|_| Error::new(format!("bad address {BEHIND}")))?;
    a1.ping(b1_v4, 56, WAIT)?;
    // The appliance's kernel holds the address behind it.
    b1.run(
        "ip",
        &["addr", "add", &format!("{BEHIND}/32"), "dev", b1.ifname()],
    )?;
    sled0.admin(&[
        "add-router-entry",
        "-p",
        A1,
        PREFIX,
        &format!("ip4={b1_v4}"),
        "system",
    ])?;
    let routes = sled0.admin(&["dump-routes", A1])?;
    assert!(routes.contains(&format!("ip4={b1_v4}")), "{routes}");

    // 1. Not allowed: b1's port refuses the destination, counted.
    ping_until_counted(a1, behind, sled1, DST_NOT_GUEST)?;

    // 2. Allowed in: b1's kernel gets the echo and answers from 192.168.50.7,
    // which its port refuses as spoofed.
    sled1.admin(&["allow-cidr", "-p", B1, PREFIX, "--dir", "in"])?;
    ping_until_counted(a1, behind, sled1, SPOOFED)?;

    // 3. Allowed out as well, and a1's sled maps the address to b1: answered.
    sled1.admin(&["allow-cidr", B1, PREFIX, "--dir", "out"])?;
    sled0.admin(&[
        "set-v2p",
        BEHIND,
        &b1.spec.mac,
        &sled1.addr.to_string(),
        &b1.spec.vni.to_string(),
    ])?;
    a1.ping(behind, 56, WAIT)?;
    let both = serde_json::json!({ "inbound": [PREFIX], "outbound": [PREFIX] });
    assert_eq!(cidrs_of_b1(sled1)?, both);

    // 4. Detached: refused again; attached: answered again.
    sled1.admin(&["detach-subnet", "-p", B1, PREFIX])?;
    assert_eq!(cidrs_of_b1(sled1)?, Value::Null);
    ping_until_counted(a1, behind, sled1, DST_NOT_GUEST)?;
    sled1.admin(&["attach-subnet", B1, PREFIX])?;
    a1.ping(behind, 56, WAIT)?;
    assert_eq!(cidrs_of_b1(sled1)?, both);

    // Errors name the value and change nothing.
    let o = sled1.xdeadm(&["attach-subnet", B1, PREFIX])?.output()?;
    assert!(!o.status.success(), "attached twice");
    assert!(o.stderr.contains(PREFIX), "{}", o.stderr);
    let o = sled1
        .xdeadm(&["remove-cidr", B1, "10.99.0.0/16", "--dir", "in"])?
        .output()?;
    assert!(!o.status.success(), "removed what is not there");
    assert!(o.stderr.contains("10.99.0.0/16"), "{}", o.stderr);
    assert_eq!(cidrs_of_b1(sled1)?, both);

    // Saved: after a restart of b1's daemon the subnet is still attached.
    rack.restart_daemon(1, &[])?;
    assert_eq!(cidrs_of_b1(rack.sled(1)?)?, both);
    // b1's kernel asks for the gateway's MAC from 192.168.50.7 (the source of the
    // answer waiting for it): the gateway answers ARP from an allowed-out address.
    let (a1, b1) = (rack.guest(A1)?, rack.guest(B1)?);
    b1.run("ip", &["neigh", "flush", "dev", b1.ifname()])?;
    a1.ping(behind, 56, WAIT)?;
    Ok(())
}
