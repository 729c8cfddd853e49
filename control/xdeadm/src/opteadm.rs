//! opteadm's command lines, accepted by `xdeadm` as they are written for OPTE
//! (docs/operating.md, "opteadm command lines").
//!
//! Most of opteadm's forms are `xdeadm`'s own with other spellings, which the verbs
//! take as aliases (`--dir`, `--hosts ip=ADDR`, `--protocol TCP`, `--ports any`,
//! `clear-v2p` with the whole mapping, router targets `sub4=`/`ig`, a router class).
//! What needs more than an alias lives here: opteadm names the port with `-p PORT`
//! where `xdeadm` takes it as the first positional argument, so [`normalize`] moves it
//! there before clap sees the line (and makes `set-fw-rules -p PORT` read its rules
//! from standard input, as opteadm's does); and the rules that come from a stream
//! ([`read_rules`]). The words whose meaning differs are the API's own syntaxes
//! (router targets: [`api::RouteTarget::parse_for`]; classes: [`api::RouteClass`];
//! rule lines: [`api::FwRule::parse_line`]). What the engine cannot do (internet gateway ids,
//! ARP filters) is refused, naming the value, never approximated.

use api::{FwRule, FwSyntaxError};
use std::ffi::OsString;
use std::io::BufRead;

/// The verbs where opteadm takes the port as `-p PORT`.
const PORT_FLAG_VERBS: &[&str] = &[
    "list-layers",
    "dump-layer",
    "dump-uft",
    "clear-uft",
    "clear-lft",
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

/// Why the rules on standard input were not taken: none is sent then.
#[derive(Debug, thiserror::Error)]
pub enum RulesError {
    #[error("cannot read rules from standard input: {0}")]
    Read(#[from] std::io::Error),
    #[error("line {line}: {error}")]
    Line { line: usize, error: FwSyntaxError },
}

/// Firewall rules one per line, as `set-fw-rules -p PORT` takes them on standard
/// input: opteadm's `dir=in action=allow priority=10 hosts=any protocol=TCP port=22`
/// or `xdeadm`'s own `--rule` strings. Blank lines and lines starting with `#` are
/// skipped; a bad line is refused with its number.
pub fn read_rules(input: impl BufRead) -> Result<Vec<FwRule>, RulesError> {
    let mut rules = Vec::new();
    for (n, line) in (1..).zip(input.lines()) {
        let line = line?;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        rules.push(FwRule::parse_line(line).map_err(|error| RulesError::Line { line: n, error })?);
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
        .unwrap_err()
        .to_string();
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
        assert!(read_rules("".as_bytes()).unwrap().is_empty());
    }
}
