//! opteadm's command lines, accepted by `xdeadm` as they are written for OPTE
//! (docs/operating.md, "opteadm command lines").
//!
//! Most of opteadm's forms are `xdeadm`'s own with other spellings, which the verbs
//! take as aliases (`--dir`, `--hosts ip=ADDR`, `--protocol TCP`, `--ports any`,
//! `clear-v2p` with the whole mapping, router targets `sub4=`/`ig`, a router class).
//! What needs more than an alias lives here: opteadm names the port with `-p PORT`
//! where `xdeadm` takes it as the first positional argument, so [`normalize`] moves it
//! there before clap sees the line (and makes `set-fw-rules -p PORT` read its rules
//! from standard input, as opteadm's does); and the values whose meaning differs
//! ([`route_target`]; router classes parse as [`engine::RouteClass`]) or that come
//! from a stream ([`read_rules`]). What the engine cannot do (internet gateway ids,
//! ARP filters) is refused, naming the value, never approximated.

use crate::api::{FwRule, RouteTarget};
use crate::cli::parse_rule;
use ipnet::IpNet;
use std::ffi::OsString;
use std::io::BufRead;

/// The verbs where opteadm takes the port as `-p PORT`.
const PORT_FLAG_VERBS: &[&str] = &[
    "list-layers",
    "dump-layer",
    "dump-uft",
    "clear-uft",
    "dump-tcp-flows",
    "add-router-entry",
    "del-router-entry",
    "add-fw-rule",
    "rm-fw-rule",
    "remove-fw-rule",
    "list-fw-rules",
    "set-fw-rules",
    "pause-port",
    "resume-port",
    "set-external-ips",
    "set-port-limits",
    "allow-cidr",
    "remove-cidr",
    "attach-subnet",
    "detach-subnet",
];

/// Rewrites an opteadm-style line (`xdeadm VERB ... -p PORT ...`) into `xdeadm`'s
/// own (`xdeadm VERB PORT ...`) for the verbs where opteadm names the port with
/// `-p`/`--port`; `set-fw-rules -p PORT` also gets `--stdin`. Any other line is
/// returned as it is, so today's forms keep working.
pub fn normalize(args: Vec<OsString>) -> Vec<OsString> {
    // The verb is the first word that is not a global option (or its value).
    let mut verb_at = None;
    let mut i = 1;
    while i < args.len() {
        match args[i].to_str() {
            Some("--socket") => i += 2,
            Some(a) if a.starts_with('-') => i += 1,
            Some(a) if PORT_FLAG_VERBS.contains(&a) => {
                verb_at = Some(i);
                break;
            }
            _ => break,
        }
    }
    let Some(v) = verb_at else {
        return args;
    };
    let mut port = None;
    let mut rest = Vec::new();
    let mut words = args[v + 1..].iter();
    while let Some(w) = words.next() {
        match w.to_str() {
            Some("-p" | "--port") if port.is_none() => match words.next() {
                Some(p) => port = Some(p.clone()),
                // `-p` with nothing after it: clap names the problem.
                None => rest.push(w.clone()),
            },
            Some(s) if port.is_none() && s.starts_with("--port=") => {
                port = Some(OsString::from(&s["--port=".len()..]));
            }
            Some(s) if port.is_none() && s.starts_with("-p") && s.len() > 2 => {
                port = Some(OsString::from(&s[2..]));
            }
            _ => rest.push(w.clone()),
        }
    }
    let Some(port) = port else {
        return args;
    };
    let mut out: Vec<OsString> = args[..=v].to_vec();
    out.push(port);
    if args[v] == "set-fw-rules" {
        out.push("--stdin".into());
    }
    out.extend(rest);
    out
}

/// A router target for a route to `dest`: `xdeadm`'s `subnet`, `igw`, `drop`, or
/// opteadm's `sub4=CIDR`/`sub6=CIDR` (the VPC subnet: the overlay's V2P table then
/// names the sled, so the CIDR is checked, not used), `ig`, `drop` (any case).
/// opteadm's `ip4=ADDR`/`ip6=ADDR` route to the VPC guest with that address (an
/// appliance), of the destination's family. `ig=UUID` (one of several internet
/// gateways) is refused: the engine has one internet gateway.
pub fn route_target(dest: &IpNet, s: &str) -> Result<RouteTarget, String> {
    let lower = s.to_ascii_lowercase();
    let family_of = |want_v4: bool, cidr: &str| -> Result<RouteTarget, String> {
        let net: IpNet = cidr
            .parse()
            .map_err(|_| format!("invalid route target {s:?}: {cidr:?} is not a prefix"))?;
        if matches!(net, IpNet::V4(_)) != want_v4 {
            return Err(format!(
                "invalid route target {s:?}: {cidr:?} is not an IPv{} prefix",
                if want_v4 { 4 } else { 6 }
            ));
        }
        if matches!(dest, IpNet::V4(_)) != want_v4 {
            return Err(format!(
                "route target {s:?} is of another address family than the destination {dest}"
            ));
        }
        Ok(RouteTarget::Subnet)
    };
    match lower.split_once('=') {
        None if lower == "ig" => Ok(RouteTarget::Igw),
        None => lower.parse(),
        Some(("sub4", cidr)) => family_of(true, cidr),
        Some(("sub6", cidr)) => family_of(false, cidr),
        Some(("ip4" | "ip6", _)) => {
            let t: RouteTarget = lower.parse()?;
            match t {
                RouteTarget::Ip(a) if a.is_ipv4() != matches!(dest, IpNet::V4(_)) => Err(format!(
                    "route target {s:?} is of another address family than the destination {dest}"
                )),
                t => Ok(t),
            }
        }
        Some(("ig", _)) => Err(format!(
            "route target {s:?}: internet gateway ids are not supported yet (one internet gateway: ig)"
        )),
        Some(_) => Err(format!(
            "invalid route target {s:?}: expected subnet, igw, drop, sub4=CIDR, sub6=CIDR, ip4=ADDR, ip6=ADDR or ig"
        )),
    }
}

/// Firewall rules one per line, as `set-fw-rules -p PORT` takes them on standard
/// input: opteadm's `dir=in action=allow priority=10 hosts=any protocol=TCP port=22`
/// or `xdeadm`'s own `--rule` strings. Blank lines and lines starting with `#` are
/// skipped; a bad line is refused with its number.
pub fn read_rules(input: impl BufRead) -> Result<Vec<FwRule>, String> {
    let mut rules = Vec::new();
    for (n, line) in (1..).zip(input.lines()) {
        let line = line.map_err(|e| format!("cannot read rules from standard input: {e}"))?;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        rules.push(parse_rule(line).map_err(|e| format!("line {n}: {e}"))?);
    }
    Ok(rules)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<OsString> {
        s.split_whitespace().map(OsString::from).collect()
    }

    #[test]
    fn the_port_flag_becomes_the_first_argument() {
        assert_eq!(
            normalize(words("xdeadm dump-layer -p opte0 firewall")),
            words("xdeadm dump-layer opte0 firewall")
        );
        assert_eq!(
            normalize(words(
                "xdeadm --json add-router-entry -p opte0 10.0.0.0/24 sub4=10.0.0.0/24 system"
            )),
            words("xdeadm --json add-router-entry opte0 10.0.0.0/24 sub4=10.0.0.0/24 system")
        );
        assert_eq!(
            normalize(words("xdeadm --socket /s rm-fw-rule --dir in -popte0 3")),
            words("xdeadm --socket /s rm-fw-rule opte0 --dir in 3")
        );
        assert_eq!(
            normalize(words("xdeadm set-fw-rules --port=opte0")),
            words("xdeadm set-fw-rules opte0 --stdin")
        );
        // Today's forms, and verbs opteadm gives no -p, are left alone.
        for line in [
            "xdeadm dump-layer opte0 firewall",
            "xdeadm set-fw-rules opte0",
            "xdeadm create-xde -p opte0",
            "xdeadm dump-uft -p",
        ] {
            assert_eq!(normalize(words(line)), words(line), "{line}");
        }
    }

    #[test]
    fn router_targets_and_classes() {
        let v4: IpNet = "10.0.0.0/24".parse().unwrap();
        let v6: IpNet = "fd00::/64".parse().unwrap();
        assert_eq!(
            route_target(&v4, "sub4=10.0.0.0/24"),
            Ok(RouteTarget::Subnet)
        );
        assert_eq!(route_target(&v6, "SUB6=fd00::/64"), Ok(RouteTarget::Subnet));
        assert_eq!(route_target(&v4, "IG"), Ok(RouteTarget::Igw));
        assert_eq!(route_target(&v4, "Drop"), Ok(RouteTarget::Drop));
        assert_eq!(route_target(&v4, "igw"), Ok(RouteTarget::Igw));
        assert_eq!(
            route_target(&v4, "ip4=10.0.0.5"),
            Ok(RouteTarget::Ip("10.0.0.5".parse().unwrap()))
        );
        assert_eq!(
            route_target(&v6, "IP6=fd00::5"),
            Ok(RouteTarget::Ip("fd00::5".parse().unwrap()))
        );
        for (dest, bad, named) in [
            (&v6, "ip4=10.0.0.1", "another address family"),
            (&v4, "ip6=fd00::1", "another address family"),
            (&v4, "ip4=fd00::1", "not an IPv4 address"),
            (&v4, "ip4=10.0.0", "not an address"),
            (
                &v4,
                "ig=0b8b2f6e-8b44-4a8e-9f5c-0d1c1d0e5b1a",
                "not supported yet",
            ),
            (&v4, "sub6=fd00::/64", "another address family"),
            (&v4, "sub4=fd00::/64", "not an IPv4 prefix"),
            (&v4, "sub4=10.0.0.0/33", "not a prefix"),
            (&v4, "router", "expected subnet"),
        ] {
            let e = route_target(dest, bad).unwrap_err();
            assert!(e.contains(bad) && e.contains(named), "{bad}: {e}");
        }
    }

    #[test]
    fn rules_from_a_stream_name_the_bad_line() {
        let input = "dir=in action=allow priority=10 hosts=any protocol=TCP port=22\n\
                     \n# web\n\
                     dir=out action=deny priority=5 hosts=subnet=10.0.0.0/8 protocol=UDP port=53\n\
                     direction=in priority=20 host=10.1.2.3 proto=icmp\n";
        let rules = read_rules(input.as_bytes()).unwrap();
        let shown: Vec<String> = rules.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "in prio=10 allow host=any proto=tcp ports=22",
                "out prio=5 deny host=10.0.0.0/8 proto=udp ports=53",
                "in prio=20 allow host=10.1.2.3 proto=icmp",
            ]
        );
        let e = read_rules(
            "dir=in action=allow priority=1\ndir=in priority=2 hosts=vni=16777216\n".as_bytes(),
        )
        .unwrap_err();
        assert!(
            e.starts_with("line 2:") && e.contains("vni=16777216"),
            "{e}"
        );
        let rules = read_rules(
            "dir=in action=deny priority=1 hosts=vni=7 protocol=icmp6:128/0\n\
             dir=in priority=2 protocol=proto=47\n\
             dir=in priority=3 protocol=TCP ports=80,8000-8080\n"
                .as_bytes(),
        )
        .unwrap();
        let shown: Vec<String> = rules.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "in prio=1 deny host=vni=7 proto=icmp6:128/0",
                "in prio=2 allow host=any proto=proto=47",
                "in prio=3 allow host=any proto=tcp ports=80,8000-8080",
            ]
        );
        assert_eq!(read_rules("".as_bytes()), Ok(vec![]));
    }
}
