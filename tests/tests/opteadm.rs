//! Flows, layers and opteadm's command lines against a running daemon: opteadm-style
//! lines (as OPTE's `opteadm` usage writes them: `-p PORT`, `--dir`, `--hosts
//! subnet=`, `--protocol TCP`, `sub4=` targets with a class, rule ids, rules on
//! standard input, `clear-v2p` with the whole mapping) change the port as
//! `xdeadm`'s own forms do, what the engine cannot do is refused by name,
//! `set-xde-underlay` is a check of the daemon's links, and after
//! a TCP transfer `dump-tcp-flows` and `dump-uft` count its packets and bytes and
//! every layer `list-layers` names can be dumped.
//!
//! opteadm's `create-xde` line as OPTE's own set-up scripts write it (falcon's
//! softnpu example: `--private-mac`, `--bsvc-addr`/`--bsvc-vni`,
//! `--src-underlay-addr`, SNAT) with its DHCP flags (`--dns-servers`,
//! `--host-domain`, `--domain-search-list`) makes the port, checked against the
//! sled (a line for another sled is refused, naming both values); stock DHCP
//! clients in the guest (busybox's udhcpc, dhcpcd for DHCPv6) get the DNS servers,
//! domain and search list; the port keeps them across a restart; `clear-lft`
//! clears the firewall's connections; `attach-subnet -e` makes an external subnet
//! that the port keeps across a restart.

use e2e::guest::GuestSpec;
use e2e::standard::{self, A1, B1};
use e2e::{poll_until, Guest, Result, Sled};
use serde_json::Value;
use std::path::Path;
use std::time::Duration;

fn xfer_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_e2e-xfer"))
}

/// The `data` of `xdeadm --json ARGS...`.
fn json(sled: &Sled, args: &[&str]) -> Result<Value> {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let out = sled.admin(&all)?;
    let v: Value =
        serde_json::from_str(&out).map_err(|e| e2e::Error::new(format!("{args:?}: {e}: {out}")))?;
    Ok(v["data"].clone())
}

/// Runs an xdeadm line that must be refused; returns its error output.
fn refused(sled: &Sled, line: &str) -> Result<String> {
    let args: Vec<&str> = line.split_whitespace().collect();
    let o = sled.xdeadm(&args)?.output()?;
    assert!(!o.status.success(), "{line}: accepted: {}", o.stdout);
    Ok(o.stderr)
}

/// The firewall rules of `port` as `dump-layer` shows them: (id for rm-fw-rule,
/// priority, hits) per engine rule of `side`.
fn fw_rules(sled: &Sled, port: &str, side: &str) -> Result<Vec<(u64, u64, u64)>> {
    let d = json(sled, &["dump-layer", "-p", port, "firewall"])?;
    Ok(d[side]["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            (
                r["fw_rule"].as_u64().unwrap_or(0),
                r["priority"].as_u64().unwrap_or(0),
                r["hits"].as_u64().unwrap_or(0),
            )
        })
        .collect())
}

#[test]
fn opteadm_lines_and_flow_dumps_work_against_the_daemon() -> Result<()> {
    let rack = standard::rack("e2e", &[])?;
    let sled = rack.sled(0)?;
    let (a1, b1) = (rack.guest(A1)?, rack.guest(B1)?);

    // Firewall rules, opteadm's way: add, find by id, remove by id.
    sled.admin(&[
        "add-fw-rule",
        "-p",
        A1,
        "--dir",
        "in",
        "--hosts",
        "subnet=10.0.0.0/24",
        "--protocol",
        "TCP",
        "--ports",
        "7000",
        "--action",
        "allow",
        "--priority",
        "10",
    ])?;
    let rules = fw_rules(sled, A1, "inbound")?;
    let &(id, _, _) = rules
        .iter()
        .find(|r| r.1 == 10)
        .ok_or_else(|| e2e::Error::new(format!("the new rule is not shown: {rules:?}")))?;
    assert!(id > 0, "no rule id shown: {rules:?}");
    let e = refused(sled, &format!("rm-fw-rule -p {A1} --dir out {id}"))?;
    assert!(e.contains("not a out rule"), "{e}");
    sled.admin(&["rm-fw-rule", "-p", A1, "--dir", "in", &id.to_string()])?;
    assert!(fw_rules(sled, A1, "inbound")?.iter().all(|r| r.1 != 10));

    // set-fw-rules -p reads opteadm's rule lines from standard input: the VPC's
    // inbound rules again, plus a deny out to one port.
    sled.xdeadm(&["set-fw-rules", "-p", A1])?
        .stdin(
            "dir=in action=allow priority=65534 hosts=subnet=10.0.0.0/24 protocol=any\n\
             dir=in action=allow priority=65534 hosts=subnet=fd00:1::/64 protocol=any\n\
             dir=out action=deny priority=100 hosts=any protocol=UDP port=9\n",
        )
        .run()?;
    let shown = sled.admin(&["dump-layer", "-p", A1, "firewall"])?;
    assert!(shown.contains("dst_port=9-9"), "{shown}");
    assert_eq!(fw_rules(sled, A1, "inbound")?.len(), 2, "{shown}");

    // Router entries with opteadm's targets and classes; what the engine lacks is
    // refused by name.
    sled.admin(&[
        "add-router-entry",
        "-p",
        A1,
        "10.9.0.0/16",
        "sub4=10.9.0.0/16",
        "system",
    ])?;
    let routes = sled.admin(&["dump-routes", A1])?;
    assert!(routes.contains("10.9.0.0/16  subnet"), "{routes}");
    sled.admin(&[
        "del-router-entry",
        "-p",
        A1,
        "10.9.0.0/16",
        "sub4=10.9.0.0/16",
        "system",
    ])?;
    // Next-hop targets and the custom class (a custom route of the same prefix
    // as a system route; deleted by its class).
    for words in [
        [
            "add-router-entry",
            "-p",
            A1,
            "10.8.0.0/16",
            "ip4=10.0.0.5",
            "system",
        ],
        [
            "add-router-entry",
            "-p",
            A1,
            "10.8.0.0/16",
            "drop",
            "custom",
        ],
    ] {
        sled.admin(&words)?;
    }
    let routes = sled.admin(&["dump-routes", A1])?;
    let has = |words: &[&str]| {
        routes
            .lines()
            .any(|l| l.split_whitespace().take(3).eq(words.iter().copied()))
    };
    assert!(
        has(&["10.8.0.0/16", "ip4=10.0.0.5", "system"]) && has(&["10.8.0.0/16", "drop", "custom"]),
        "{routes}"
    );
    sled.admin(&[
        "del-router-entry",
        "-p",
        A1,
        "10.8.0.0/16",
        "drop",
        "custom",
    ])?;
    sled.admin(&["del-router-entry", A1, "10.8.0.0/16"])?;
    assert!(!sled.admin(&["dump-routes", A1])?.contains("10.8.0.0/16"));
    // A route through one of several internet gateways (the gateways' own
    // addresses: opteadm_create_xde_lines_dhcp_and_clear_lft).
    let ig = "add-router-entry -p a1 10.8.0.0/16 ig=0b8b2f6e-8b44-4a8e-9f5c-0d1c1d0e5b1a system";
    sled.admin(&ig.split_whitespace().collect::<Vec<_>>())?;
    let routes = sled.admin(&["dump-routes", A1])?;
    assert!(
        routes.contains("igw=0b8b2f6e-8b44-4a8e-9f5c-0d1c1d0e5b1a"),
        "{routes}"
    );
    sled.admin(&["del-router-entry", A1, "10.8.0.0/16"])?;
    let arp = format!(
        "add-fw-rule -p {A1} --dir in --hosts vni=7 --protocol arp --ports any --action allow --priority 5"
    );
    let e = refused(sled, &arp)?;
    assert!(
        e.contains("arp") && e.contains("not supported yet"),
        "{arp}: {e}"
    );

    // The underlay links are the daemon's: naming them is accepted, other links
    // are refused by name, and clearing them is refused saying why.
    sled.admin(&["set-xde-underlay", &sled.underlay_if])?;
    let e = refused(sled, &format!("set-xde-underlay {} ul9", sled.underlay_if))?;
    assert!(
        e.contains("not the daemon's: ul9") && e.contains(&sled.underlay_if),
        "{e}"
    );
    let e = refused(sled, "clear-xde-underlay")?;
    assert!(e.contains("overlayd's configuration"), "{e}");

    // clear-v2p with the whole mapping: a stale one is refused, the right one goes.
    let host = rack.sled(1)?.addr.to_string();
    let b1_ip = b1.ipv4()?.to_string();
    let vni = b1.spec.vni.to_string();
    let e = refused(
        sled,
        &format!("clear-v2p {b1_ip} a8:40:25:00:00:99 {host} {vni}"),
    )?;
    assert!(e.contains("left as it is"), "{e}");
    sled.admin(&["clear-v2p", &b1_ip, &b1.spec.mac, &host, &vni])?;
    assert!(!sled.admin(&["dump-v2p"])?.contains(&b1_ip));
    sled.admin(&["set-v2p", &b1_ip, &b1.spec.mac, &host, &vni])?;

    // Traffic: a checked TCP transfer a1 -> b1, then the flow dumps count it.
    let bytes = 4 << 20;
    e2e::xfer::transfer(
        xfer_bin(),
        a1,
        b1,
        b1.ipv4()?,
        5311,
        bytes,
        Duration::from_secs(60),
    )?;
    let flows = json(sled, &["dump-tcp-flows", "-p", A1])?;
    let conn = flows
        .as_array()
        .into_iter()
        .flatten()
        .find(|f| f["key"]["dst_port"] == 5311)
        .ok_or_else(|| e2e::Error::new(format!("no connection to 5311: {flows}")))?;
    assert_eq!(conn["initiator"], "out", "{conn}");
    assert!(conn["out"]["bytes"].as_u64().unwrap_or(0) > bytes, "{conn}");
    assert!(conn["in"]["packets"].as_u64().unwrap_or(0) > 0, "{conn}");
    assert!(conn["tcp_state"].is_string(), "{conn}");
    let table = sled.admin(&["dump-tcp-flows", A1])?;
    assert!(
        table.contains("BYTES OUT") && table.contains("5311"),
        "{table}"
    );

    let uft = json(sled, &["dump-uft", "-p", A1])?;
    let out = uft["outbound"].as_array().cloned().unwrap_or_default();
    let e = out
        .iter()
        .find(|e| e["key"]["dst_port"] == 5311)
        .ok_or_else(|| e2e::Error::new(format!("no cached flow to 5311: {uft}")))?;
    assert!(
        e["hits"].as_u64().unwrap_or(0) > 0 && e["bytes"].as_u64().unwrap_or(0) > 0,
        "{e}"
    );

    // Every layer list-layers names dumps; the firewall's flows are connections.
    let layers = json(sled, &["list-layers", "-p", A1])?;
    let names: Vec<&str> = layers
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| l["name"].as_str())
        .collect();
    assert_eq!(names, ["gateway", "firewall", "router", "overlay"]);
    for name in &names {
        let d = json(sled, &["dump-layer", "-p", A1, name])?;
        assert_eq!(d["name"], *name);
    }
    assert!(layers[1]["flows"].as_u64().unwrap_or(0) >= 1, "{layers}");
    // The transfer's first packet was decided by the router's VPC route.
    let router = json(sled, &["dump-layer", "-p", A1, "router"])?;
    let hits: u64 = router["outbound"]["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["hits"].as_u64())
        .sum();
    assert!(hits >= 1, "{router}");

    sled.admin(&["clear-uft", "-p", A1])?;
    let uft = json(sled, &["dump-uft", "-p", A1])?;
    assert_eq!(uft["outbound"].as_array().map(Vec::len), Some(0), "{uft}");
    Ok(())
}

/// Boundary services of the rack in these tests (`overlayd --boundary-services`).
const BSVC: &str = "fd00:99::ff";

/// opteadm's create-xde line for `spec` (one private IP per family given, as
/// opteadm takes one) naming `sled_addr` and boundary services `bsvc`/`bsvc_vni`,
/// with the DHCP flags; `--netns` is ours (OPTE's port is a device that `dladm
/// create-vnic` then uses).
fn opteadm_create_xde(spec: &GuestSpec, sled_addr: &str, bsvc: &str, bsvc_vni: &str) -> String {
    let (Some(v4), Some(v6)) = (spec.ipv4, spec.ipv6) else {
        panic!("a dual-stack guest is needed")
    };
    format!(
        "create-xde {name} --private-mac {mac} --private-ip {v4} --private-ip {v6} \
         --gateway-mac {gw_mac} --gateway-ip {gw} --bsvc-addr {bsvc} --bsvc-vni {bsvc_vni} \
         --vpc-vni {vni} --vpc-subnet {s4} --vpc-subnet {s6} --src-underlay-addr {sled_addr} \
         --snat-start 4000 --snat-end 7000 --snat-ip 10.100.0.5 --mtu 8500 \
         --dns-servers 10.0.0.53,fd00:1::53,8.8.8.8 --hostname {name} \
         --host-domain oxide.test --domain-search-list eng.oxide.test,oxide.test",
        name = spec.name,
        mac = spec.mac.to_uppercase(),
        gw_mac = spec.gateway_mac.to_uppercase(),
        gw = spec.gateway_ipv4,
        vni = spec.vni,
        s4 = spec.subnet4,
        s6 = spec.subnet6,
    )
}

/// What busybox's udhcpc hands its script on a lease: `KEY=VALUE` lines.
const UDHCPC_SCRIPT: &str = "#!/bin/sh\n\
    [ \"$1\" = bound ] && printf 'ip=%s\\ndns=%s\\ndomain=%s\\nsearch=%s\\nhostname=%s\\n' \
    \"$ip\" \"$dns\" \"$domain\" \"$search\" \"$hostname\"\nexit 0\n";

/// The value of `key` in `KEY=VALUE` lines (the last one given).
fn field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines()
        .filter_map(|l| l.trim().split_once('='))
        .filter(|(k, _)| *k == key)
        .map(|(_, v)| v.trim_matches('\''))
        .next_back()
}

#[test]
fn opteadm_create_xde_lines_dhcp_and_clear_lft() -> Result<()> {
    let mut rack = standard::rack("e2e", &["--boundary-services", BSVC])?;
    let sled_addr = rack.sled(0)?.addr.to_string();
    let spec = GuestSpec::dual("o1", 0, 20);

    // A line for another sled, or other boundary services, is refused naming both
    // values, and makes no port.
    let sled = rack.sled(0)?;
    for (line, named) in [
        (
            opteadm_create_xde(&spec, "fd00:99::77", BSVC, "99"),
            ["fd00:99::77", sled_addr.as_str()],
        ),
        (
            opteadm_create_xde(&spec, &sled_addr, "fd00:99::fe", "99"),
            ["fd00:99::fe", BSVC],
        ),
        (
            opteadm_create_xde(&spec, &sled_addr, BSVC, "98"),
            ["--bsvc-vni 98", "99"],
        ),
    ] {
        let e = refused(sled, &line)?;
        assert!(named.iter().all(|n| e.contains(n)), "{line}: {e}");
    }
    assert!(!sled.admin(&["list-ports"])?.contains("o1"));

    // The whole line, as OPTE's scripts write it.
    let ns = Guest::namespace(&format!("{}-o1", rack.id))?;
    let line = opteadm_create_xde(&spec, &sled_addr, BSVC, "99");
    let mut args: Vec<&str> = line.split_whitespace().collect();
    args.extend(["--netns", ns.name()]);
    sled.admin(&args)?;
    let guest = Guest { spec, ns };
    guest.configure_os()?;
    let config = |sled: &Sled| -> Result<Value> {
        let ports = json(sled, &["list-ports"])?;
        Ok(ports
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["config"]["name"] == "o1")
            .map(|p| p["config"].clone())
            .unwrap_or_default())
    };
    let c = config(sled)?;
    assert_eq!(c["domain"], "oxide.test", "{c}");
    assert_eq!(
        c["domain_search"],
        serde_json::json!(["eng.oxide.test", "oxide.test"]),
        "{c}"
    );
    assert_eq!(
        c["dns_servers4"],
        serde_json::json!(["10.0.0.53", "8.8.8.8"])
    );
    assert_eq!(c["dns_servers6"], serde_json::json!(["fd00:1::53"]));
    assert_eq!(c["external"]["snat"]["ip"], "10.100.0.5", "{c}");

    // The rest of those scripts' lines (falcon's 03-overlay.sh: V2P with
    // opteadm's upper-case MACs, a next-hop route without a class) and opteadm's
    // set-external-ips, each doing what it says.
    let peer = "set-v2p 10.0.0.99 A8:40:25:FF:00:63 fd00:99::2 10";
    sled.admin(&peer.split_whitespace().collect::<Vec<_>>())?;
    assert!(sled.admin(&["dump-v2p"])?.contains("a8:40:25:ff:00:63"));
    sled.admin(&[
        "clear-v2p",
        "10.0.0.99",
        "A8:40:25:FF:00:63",
        "fd00:99::2",
        "10",
    ])?;
    assert!(!sled.admin(&["dump-v2p"])?.contains("10.0.0.99"));
    sled.admin(&[
        "add-router-entry",
        "-p",
        "o1",
        "10.0.0.13/32",
        "ip4=10.0.0.13",
    ])?;
    let routes = sled.admin(&["dump-routes", "o1"])?;
    assert!(
        routes.lines().any(|l| l
            .split_whitespace()
            .take(2)
            .eq(["10.0.0.13/32", "ip4=10.0.0.13"])),
        "{routes}"
    );
    sled.admin(&[
        "set-external-ips",
        "-p",
        "o1",
        "--ephemeral-ip",
        "10.100.0.7",
    ])?;
    let c = config(sled)?;
    assert_eq!(c["external"]["ephemeral"], "10.100.0.7", "{c}");
    assert!(c["external"]["snat"].is_null(), "{c}");
    // Two internet gateways (OPTE's `ig=UUID` routes): each external address
    // tied to the gateways it serves, routes naming one.
    let (igw_a, igw_b) = (
        "0b8b2f6e-8b44-4a8e-9f5c-0d1c1d0e5b1a",
        "7c9e6679-7425-40de-944b-e07fc1f90ae7",
    );
    let tie_a = format!("10.100.0.7={igw_a}");
    let tie_b = format!("10.100.0.8={igw_b}");
    let ext = [
        "set-external-ips",
        "-p",
        "o1",
        "--ephemeral-ip",
        "10.100.0.7",
        "--floating-ip",
        "10.100.0.8",
        "--inet-gw",
        &tie_a,
        "--inet-gw",
        &tie_b,
    ];
    sled.admin(&ext)?;
    let c = config(sled)?;
    assert_eq!(
        c["external"]["gateways"],
        serde_json::json!({"10.100.0.7": [igw_a], "10.100.0.8": [igw_b]}),
        "{c}"
    );
    let ig_a = format!("ig={igw_a}");
    let route = ["add-router-entry", "-p", "o1", "203.0.113.0/24", &ig_a];
    sled.admin(&route)?;
    let routes = sled.admin(&["dump-routes", "o1"])?;
    let want = format!("igw={igw_a}");
    assert!(
        routes.lines().any(|l| l
            .split_whitespace()
            .take(2)
            .eq(["203.0.113.0/24", want.as_str()])),
        "{routes}"
    );
    sled.admin(&["del-router-entry", "-p", "o1", "203.0.113.0/24", &ig_a])?;
    // A gateway for an address the port does not have: refused by name.
    let stray = format!("192.0.2.99={igw_a}");
    let e = refused(
        sled,
        &format!("set-external-ips -p o1 --ephemeral-ip 10.100.0.7 --inet-gw {stray}"),
    )?;
    assert!(e.contains("192.0.2.99"), "{e}");
    let e = refused(sled, "add-router-entry -p o1 203.0.113.0/24 ig=0b8b2f6e")?;
    assert!(e.contains("not an internet gateway id"), "{e}");

    // DHCPv4: busybox's udhcpc (as the VM test's guest runs it).
    let script = rack.dir().join("udhcpc.script");
    std::fs::write(&script, UDHCPC_SCRIPT)?;
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let script = script.display().to_string();
    let lease = poll_until(
        "a DHCPv4 lease from udhcpc",
        Duration::from_secs(30),
        || {
            guest
                .cmd("busybox")
                .args(["udhcpc", "-i", "o1", "-f", "-q", "-n", "-t", "3", "-T", "1"])
                .args(["-O", "search", "-s", &script])
                .timeout(Duration::from_secs(20))
                .run()
        },
    )?;
    assert_eq!(field(&lease, "ip"), Some("10.0.0.30"), "{lease}");
    assert_eq!(field(&lease, "dns"), Some("10.0.0.53 8.8.8.8"), "{lease}");
    assert_eq!(field(&lease, "domain"), Some("oxide.test"), "{lease}");
    assert_eq!(
        field(&lease, "search"),
        Some("eng.oxide.test oxide.test"),
        "{lease}"
    );
    assert_eq!(field(&lease, "hostname"), Some("o1"), "{lease}");

    // DHCPv6: dhcpcd, in test mode (it prints what it got and changes nothing).
    let v6 = poll_until("a DHCPv6 reply to dhcpcd", Duration::from_secs(40), || {
        let out = guest
            .cmd("dhcpcd")
            .args(["-6", "-T", "-t", "15", "o1"])
            .timeout(Duration::from_secs(30))
            .output()?;
        let text = format!("{}{}", out.stdout, out.stderr);
        match field(&text, "new_dhcp6_name_servers") {
            Some(_) => Ok(text),
            None => Err(e2e::Error::new(format!("no DHCPv6 answer: {text}"))),
        }
    })?;
    assert_eq!(
        field(&v6, "new_dhcp6_name_servers"),
        Some("fd00:1::53"),
        "{v6}"
    );
    assert_eq!(
        field(&v6, "new_dhcp6_domain_search"),
        Some("eng.oxide.test oxide.test"),
        "{v6}"
    );

    // clear-lft: a ping from a1 opens a firewall connection; the router keeps no
    // flows; the firewall's are cleared; a layer list-layers does not name is
    // refused by name.
    let (a1, b1) = (rack.guest(A1)?, rack.guest(B1)?);
    a1.ping(b1.ipv4()?, 56, Duration::from_secs(10))?;
    let sled = rack.sled(0)?;
    let firewall_flows = |sled: &Sled| -> Result<u64> {
        Ok(json(sled, &["list-layers", "-p", A1])?[1]["flows"]
            .as_u64()
            .unwrap_or(0))
    };
    assert!(firewall_flows(sled)? >= 1);
    let cleared = json(sled, &["clear-lft", "-p", A1, "router"])?;
    assert_eq!(cleared["flows"], 0, "{cleared}");
    let out = sled.admin(&["clear-lft", "-p", A1, "firewall"])?;
    assert!(
        out.contains("flows cleared") && !out.starts_with("0 "),
        "{out}"
    );
    assert_eq!(firewall_flows(sled)?, 0);
    let e = refused(sled, &format!("clear-lft -p {A1} nat"))?;
    assert!(e.contains("\"nat\"") && e.contains("firewall"), "{e}");
    a1.ping(b1.ipv4()?, 56, Duration::from_secs(10))?;

    // attach-subnet -e: an external subnet, exempt from NAT (through boundary
    // services: tests/tests/boundary.rs), shown, removed both ways only, saved.
    sled.admin(&["attach-subnet", "-p", "o1", "192.168.50.0/24", "-e"])?;
    let c = config(sled)?;
    let exempt = serde_json::json!(["192.168.50.0/24"]);
    assert_eq!(c["cidrs"]["external"], exempt, "{c}");
    assert_eq!(c["cidrs"]["inbound"], exempt, "{c}");
    let e = refused(sled, "remove-cidr -p o1 192.168.50.0/24 --dir in")?;
    assert!(e.contains("192.168.50.0/24") && e.contains("detach"), "{e}");

    // The search list is saved with the port: a restarted daemon has it.
    rack.restart_daemon(0, &["--boundary-services", BSVC])?;
    let c = config(rack.sled(0)?)?;
    assert_eq!(
        c["domain_search"],
        serde_json::json!(["eng.oxide.test", "oxide.test"]),
        "{c}"
    );
    assert_eq!(c["cidrs"]["external"], exempt, "{c}");
    rack.sled(0)?
        .admin(&["detach-subnet", "-p", "o1", "192.168.50.0/24"])?;
    assert!(config(rack.sled(0)?)?["cidrs"].is_null());
    rack.sled(0)?.admin(&["delete-xde", "o1"])?;
    assert!(config(rack.sled(0)?)?.is_null());
    Ok(())
}
