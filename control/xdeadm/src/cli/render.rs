//! How answers are printed for people: each reply as a table or as indented
//! `key: value` lines ([`render`]), the flow and layer dumps as `flows` lays them
//! out ([`render_for`]), and the forms a command may ask for instead ([`Show`]:
//! an exposition for Prometheus, the workers table, JSON; [`to_json`] for `--json`). [`reply_fails`]
//! says whether a reply reports a failed check.

use super::fleet::{Counts, WriteReport};
use super::flows;
use super::layout::{render_value, table};
use super::mtu;
use api::openmetrics::Format;
use api::{CaptureEnd, Check, CheckStatus, PeerPath, PortLink, PortStatus, Reply, Request};
use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

/// Why a reply could not be printed as the command asked.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error(transparent)]
    Json(#[from] JsonError),
    #[error("not a stats reply: {0:?}")]
    NotStats(Box<Reply>),
}

/// A value that could not be printed as JSON.
#[derive(Debug, thiserror::Error)]
#[error("cannot print JSON: {0}")]
pub struct JsonError(#[from] serde_json::Error);

/// A reply (or `ra listen`'s report) as `--json` prints it: one pretty document,
/// without the final newline.
pub fn to_json(v: &impl serde::Serialize) -> Result<String, JsonError> {
    Ok(serde_json::to_string_pretty(v)?)
}

/// Answers printed in a form of their own rather than by [`render`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Show {
    /// A `stats` reply as an exposition in the given format.
    Exposition(Format),
    /// A `workers` reply as a table (or JSON).
    Workers,
    /// Any reply as JSON (`stats --format json`).
    Json,
}

/// Renders the reply to `request` for people: the flow and layer verbs as tables
/// (`flows`), `mtu` and `ra` as `mtu` lays them out, everything else as [`render`]
/// does.
pub fn render_for(request: &Request, reply: &Reply) -> String {
    flows::render(request, reply)
        .or_else(|| mtu::render(request, reply))
        .unwrap_or_else(|| render(reply))
}

/// Renders a reply for people: tables for lists, indented key/value lines for the
/// engine's inspection results.
pub fn render(reply: &Reply) -> String {
    let mut out = String::new();
    match reply {
        Reply::Done => {}
        Reply::Cleared { flows } => {
            let _ = writeln!(out, "{flows} flows cleared");
        }
        // A document, not a report: the JSON `import-port` reads.
        Reply::PortExport(export) => {
            let _ = writeln!(out, "{}", to_json(export).unwrap_or_default());
        }
        Reply::Imported {
            connections,
            snat_ports,
        } => {
            let _ = writeln!(
                out,
                "imported paused, with {connections} connections and {snat_ports} SNAT ports: resume-port starts it"
            );
        }
        Reply::Ports(ports) => render_ports(&mut out, ports),
        Reply::V2p(records) => {
            let rows = records
                .iter()
                .map(|r| {
                    let e = &r.entry;
                    let source = match r.overridden {
                        true => format!("{} (overridden)", r.source),
                        false => r.source.to_string(),
                    };
                    vec![
                        e.vni.to_string(),
                        e.vpc_ip.to_string(),
                        e.vpc_mac.to_string(),
                        e.underlay_ip.to_string(),
                        source,
                    ]
                })
                .collect();
            let head = ["VNI", "VPC IP", "VPC MAC", "UNDERLAY IP", "SOURCE"];
            table(&mut out, &head, rows);
        }
        Reply::Fleet(status) => render_fleet(&mut out, status),
        Reply::V2b(entries) => {
            let rows = entries
                .iter()
                .map(|e| {
                    let eps: Vec<String> = e
                        .endpoints
                        .iter()
                        .map(std::string::ToString::to_string)
                        .collect();
                    vec![e.prefix.to_string(), eps.join(",")]
                })
                .collect();
            table(&mut out, &["PREFIX", "BOUNDARY ENDPOINTS"], rows);
        }
        Reply::Routes(routes) => {
            let rows = routes
                .iter()
                .map(|r| {
                    vec![
                        r.dest.to_string(),
                        r.target.to_string(),
                        r.class.to_string(),
                        r.mtu.map_or("-".into(), |m| m.to_string()),
                    ]
                })
                .collect();
            table(&mut out, &["DEST", "TARGET", "CLASS", "MTU"], rows);
        }
        Reply::FwRules(rules) => {
            for r in rules {
                let _ = writeln!(out, "{r}");
            }
        }
        Reply::Inspect(v) => render_value(&mut out, v, 0),
        Reply::Doctor(checks) => render_checks(&mut out, checks),
        Reply::PathCheck(paths) => render_paths(&mut out, paths),
        Reply::Capture(r) => {
            let ended = match r.ended {
                CaptureEnd::Count => "count reached",
                CaptureEnd::Time => "time up",
                CaptureEnd::PortGone => "port deleted",
            };
            let _ = writeln!(
                out,
                "{} frames of {} written to {} ({ended}); {} not captured (the file was written too slowly)",
                r.frames,
                r.port,
                r.file.display(),
                r.dropped
            );
        }
    }
    out
}

/// Whether a reply reports a failure (a `doctor` check that failed, a path that
/// does not carry the underlay MTU): `xdeadm` then exits 1 after printing it.
pub fn reply_fails(reply: &Reply) -> bool {
    match reply {
        Reply::Doctor(checks) => checks.iter().any(|c| c.status == CheckStatus::Fail),
        Reply::PathCheck(paths) => paths.iter().any(|p| !p.ok()),
        _ => false,
    }
}

/// One line per check, `pass`/`warn`/`FAIL` first, and the fix under each
/// warning or failure.
fn render_checks(out: &mut String, checks: &[Check]) {
    for c in checks {
        let _ = writeln!(out, "{:<4}  {:<28}  {}", c.status, c.name, c.detail);
        if let Some(fix) = &c.fix {
            let _ = writeln!(out, "      fix: {fix}");
        }
    }
}

/// One row per peer: the largest size that made the round trip, and whether
/// that is the underlay MTU.
fn render_paths(out: &mut String, paths: &[PeerPath]) {
    let rows = paths
        .iter()
        .map(|p| {
            vec![
                p.peer.to_string(),
                p.wanted.to_string(),
                p.largest.map_or("none".into(), |l| l.to_string()),
                p.probes.to_string(),
                match (&p.error, p.ok()) {
                    (Some(e), _) => format!("ERROR: {e}"),
                    (None, true) => "ok".into(),
                    (None, false) if p.largest.is_none() => "FAIL: no probe answered".into(),
                    (None, false) => {
                        "FAIL: full-size frames are lost on the way (a smaller MTU on a link or switch port)".into()
                    }
                },
            ]
        })
        .collect();
    table(
        out,
        &["PEER", "WANTED", "LARGEST", "PROBES", "STATUS"],
        rows,
    );
}

/// Prints a reply as `show` says (`json`: the global `--json`).
pub fn render_as(show: Show, reply: &Reply, json: bool) -> Result<String, RenderError> {
    match (show, reply) {
        (Show::Exposition(format), Reply::Inspect(v)) => Ok(api::openmetrics::render(v, format)),
        (Show::Workers, Reply::Inspect(v)) if !json => {
            let rows = worker_rows(v, SystemTime::now());
            let mut out = String::new();
            let head = [
                "WORKER",
                "CORE",
                "PORTS",
                "QUEUES",
                "ROUNDS",
                "BUSY",
                "IDLE SLEEPS",
                "HANDOFF IN",
                "HANDOFF OUT",
                "UP FOR",
            ];
            table(&mut out, &head, rows);
            Ok(out)
        }
        (Show::Workers | Show::Json, r) => Ok(to_json(r)? + "\n"),
        (Show::Exposition(_), other) => Err(RenderError::NotStats(Box::new(other.clone()))),
    }
}

/// `fleet status`: the connection, the revisions, and what was refused.
fn render_fleet(out: &mut String, s: &api::fleet::FleetStatus) {
    if !s.enabled {
        out.push_str("not a member of a fleet (overlayd runs without --fleet-endpoints)\n");
        return;
    }
    let sled = s.sled.as_ref().map_or("-".to_string(), ToString::to_string);
    let endpoint = s.endpoint.as_deref().unwrap_or("-");
    let link = match s.connected {
        true => format!("connected to {endpoint}"),
        false => format!("NOT connected (last tried {endpoint})"),
    };
    let lag = s
        .lag_seconds
        .map_or("never current yet".to_string(), |l| format!("{l:.1} s"));
    let vnis: Vec<String> = s.vnis.iter().map(ToString::to_string).collect();
    let e = &s.entries;
    let _ = writeln!(out, "sled            {sled}");
    let _ = writeln!(out, "store           {link}");
    let _ = writeln!(out, "cluster         {:x}", s.cluster_id);
    let _ = writeln!(
        out,
        "revision        {} applied, {} in the store",
        s.revision, s.store_revision
    );
    let _ = writeln!(out, "lag             {lag}");
    let _ = writeln!(out, "resyncs         {}", s.resyncs);
    let _ = writeln!(out, "alarms          {}", s.alarms);
    let _ = writeln!(
        out,
        "watched VPCs    {}",
        if vnis.is_empty() {
            "-".to_string()
        } else {
            vnis.join(",")
        }
    );
    let _ = writeln!(
        out,
        "entries         {} V2P, {} V2B, {} routing tables, {} rule sets",
        e.v2p, e.v2b, e.routes, e.firewall
    );
    if let Some(h) = &s.held {
        let _ = writeln!(out, "HELD            {h}");
    }
    if let Some(err) = &s.last_error {
        let _ = writeln!(out, "last error      {err}");
    }
    if !s.refused.is_empty() {
        out.push('\n');
        let rows = s
            .refused
            .iter()
            .map(|r| {
                vec![
                    r.key.clone(),
                    r.mod_revision.to_string(),
                    r.reason.clone(),
                    r.message.clone(),
                ]
            })
            .collect();
        table(out, &["REFUSED KEY", "REVISION", "REASON", "WHY"], rows);
    }
}

/// What a writer verb of `fleet` did, in one line (`fleet load` of 10,000
/// entries included): the counts, what was skipped, and the store's revisions
/// before and after (each transaction that changed something is one revision).
/// Keys that were not there (`--if-exists`) follow, one per line.
pub fn render_fleet_write(r: &WriteReport) -> String {
    let counts = |verb: &str, c: &Counts| {
        let n = c.total();
        let noun = if n == 1 { "entry" } else { "entries" };
        let tables = match c.port_tables {
            0 => String::new(),
            t => format!(", {t} port tables"),
        };
        format!("{verb} {n} {noun} ({} v2p, {} v2b{tables})", c.v2p, c.v2b)
    };
    let asked_deletes = r.deleted.total() + r.absent.len() + r.skipped.len();
    let mut parts = Vec::new();
    if r.written.total() > 0 || asked_deletes == 0 {
        parts.push(counts("wrote", &r.written));
    }
    if asked_deletes > 0 {
        parts.push(counts("deleted", &r.deleted));
    }
    if !r.absent.is_empty() {
        parts.push(format!("{} not there", r.absent.len()));
    }
    if !r.skipped.is_empty() {
        parts.push(format!(
            "{} NOT deleted (changed after it was read)",
            r.skipped.len()
        ));
    }
    let mut out = format!(
        "{} at {}, store revision {} (from {})\n",
        parts.join(", "),
        r.endpoint,
        r.revision,
        r.from_revision
    );
    for key in &r.absent {
        let _ = writeln!(out, "not there: {key}");
    }
    out
}

/// One row per port; a port the daemon could not put into the dataplane says why
/// and when it is tried again.
fn render_ports(out: &mut String, ports: &[PortStatus]) {
    let rows = ports
        .iter()
        .map(|s| {
            let p = &s.port;
            let c = &p.config;
            let ips: Vec<String> = c
                .ipv4
                .map(|a| a.to_string())
                .into_iter()
                .chain(c.ipv6.map(|a| a.to_string()))
                .collect();
            vec![
                c.name.clone(),
                c.guest_mac.to_string(),
                ips.join(","),
                c.vni.to_string(),
                c.mtu.to_string(),
                c.external.to_string(),
                c.limits.describe(),
                p.netns.clone().unwrap_or_else(|| "-".into()),
                p.attach.clone().unwrap_or_else(|| "-".into()),
                s.state.map_or("-".into(), |st| st.to_string()),
                match &s.not_applied {
                    None => link_status(s.link.as_ref(), SystemTime::now(), p.vhost_user.is_some()),
                    Some(n) => format!(
                        "NOT APPLIED (try {}, next in {} s): {}",
                        n.attempts,
                        n.retry_in_ms.div_ceil(1000),
                        n.reason
                    ),
                },
            ]
        })
        .collect();
    table(
        out,
        &[
            "NAME", "MAC", "IP", "VNI", "MTU", "EXTERNAL", "LIMITS", "NETNS", "ATTACH", "STATE",
            "STATUS",
        ],
        rows,
    );
    for s in ports {
        if let Some(v) = &s.vhost_negotiated {
            let _ = write!(out, "{}: vhost-user features ", s.port.config.name);
            match v.features.is_empty() {
                true => out.push_str("none acked yet"),
                false => out.push_str(&v.features.join(",")),
            }
            if v.refused > 0 {
                let _ = write!(out, "; {} front ends refused", v.refused);
            }
            out.push('\n');
        }
    }
}

/// A port in the dataplane: whether its tap is served, and since when not. A
/// vhost-user port (`vhost`) has no tap: it is up again once a front end starts
/// its rings.
fn link_status(link: Option<&PortLink>, now: SystemTime, vhost: bool) -> String {
    match link {
        None => "applied".into(),
        Some(PortLink::Up) => "up".into(),
        Some(PortLink::Down {
            since_unix_ms,
            reason,
        }) => {
            let now_ms = now
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
            let secs = now_ms.saturating_sub(*since_unix_ms) / 1000;
            let back = match vhost {
                true => "up when a front end starts the rings",
                false => "re-attached when the tap is back",
            };
            format!("DOWN for {secs} s ({back}): {reason}")
        }
    }
}

/// The rows of `xdeadm workers`' table, from the `workers` reply (a list of
/// the daemon's `WorkerView`s as JSON); `now` for how long each worker has run.
pub fn worker_rows(views: &serde_json::Value, now: SystemTime) -> Vec<Vec<String>> {
    let now_ms = now
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let num = |v: &serde_json::Value| {
        v.as_u64()
            .map_or_else(|| "-".to_string(), |n| n.to_string())
    };
    let list = |v: &serde_json::Value| match v.as_array() {
        Some(a) if !a.is_empty() => a
            .iter()
            .map(|x| match (x.as_str(), x.get("ifindex"), x.get("queue")) {
                (Some(s), _, _) => s.to_string(),
                (None, Some(i), Some(q)) => format!("{}/{}", num(i), num(q)),
                _ => x.to_string(),
            })
            .collect::<Vec<_>>()
            .join(","),
        _ => "-".to_string(),
    };
    views
        .as_array()
        .into_iter()
        .flatten()
        .map(|w| {
            let busy = w["busy_ratio"].as_f64().unwrap_or(0.0) * 100.0;
            let up_s = w["started_unix_ms"]
                .as_u64()
                .map_or(0, |t| now_ms.saturating_sub(t) / 1000);
            vec![
                num(&w["worker"]),
                num(&w["core"]),
                list(&w["ports"]),
                list(&w["queues"]),
                num(&w["rounds"]),
                format!("{busy:.1}%"),
                num(&w["idle_sleeps"]),
                num(&w["handoff_in"]),
                num(&w["handoff_out"]),
                format!("{up_s} s"),
            ]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::fleet::SkippedDelete;

    #[test]
    fn a_fleet_write_is_one_line() {
        let mut r = WriteReport {
            endpoint: "http://127.0.0.1:2379".into(),
            written: Counts {
                v2p: 5000,
                v2b: 2,
                port_tables: 0,
            },
            from_revision: 100,
            revision: 140,
            ..WriteReport::default()
        };
        assert_eq!(
            render_fleet_write(&r),
            "wrote 5002 entries (5000 v2p, 2 v2b) at http://127.0.0.1:2379, store revision \
             140 (from 100)\n"
        );
        r.written = Counts::default();
        r.deleted = Counts {
            v2p: 1,
            ..Counts::default()
        };
        r.absent = vec!["/overlay/v1/v2b/::/0".into()];
        r.skipped = vec![SkippedDelete {
            key: "/overlay/v1/vpc/1/v2p/10.0.0.1".into(),
            expected_mod_revision: 7,
            current_mod_revision: 9,
        }];
        assert_eq!(
            render_fleet_write(&r),
            "deleted 1 entry (1 v2p, 0 v2b), 1 not there, 1 NOT deleted (changed after it \
             was read) at http://127.0.0.1:2379, store revision 140 (from 100)\nnot there: \
             /overlay/v1/v2b/::/0\n"
        );
        let json: serde_json::Value = serde_json::from_str(&to_json(&r).unwrap()).unwrap();
        assert_eq!(json["skipped"][0]["expected_mod_revision"], 7);
        assert_eq!(json["skipped"][0]["current_mod_revision"], 9);
        assert_eq!(json["deleted"]["v2p"], 1);
        assert_eq!(json["revision"], 140);
        // A move also writes and deletes port tables.
        r.written = Counts {
            v2p: 2,
            v2b: 0,
            port_tables: 2,
        };
        r.deleted = Counts {
            port_tables: 2,
            ..Counts::default()
        };
        (r.absent, r.skipped) = (vec![], vec![]);
        assert_eq!(
            render_fleet_write(&r),
            "wrote 4 entries (2 v2p, 0 v2b, 2 port tables), deleted 2 entries (0 v2p, 0 \
             v2b, 2 port tables) at http://127.0.0.1:2379, store revision 140 (from 100)\n"
        );
    }
    use api::{RouteEntry, RouteTarget};

    #[test]
    fn checks_and_paths_render_with_their_fixes() {
        let checks = vec![
            Check {
                name: "xdp-mode".into(),
                status: CheckStatus::Pass,
                detail: "native".into(),
                fix: None,
            },
            Check {
                name: "underlay-mtu".into(),
                status: CheckStatus::Fail,
                detail: "underlay MTU 1500".into(),
                fix: Some("ip link set ul0 mtu 9000".into()),
            },
        ];
        let s = render(&Reply::Doctor(checks.clone()));
        assert_eq!(
            s,
            "pass  xdp-mode                      native\n\
             FAIL  underlay-mtu                  underlay MTU 1500\n\
             \x20     fix: ip link set ul0 mtu 9000\n"
        );
        assert!(reply_fails(&Reply::Doctor(checks.clone())));
        assert!(!reply_fails(&Reply::Doctor(checks[..1].to_vec())));
        let path = |largest| PeerPath {
            peer: "fd00:99::2".parse().unwrap(),
            wanted: 9000,
            largest,
            probes: 3,
            error: None,
        };
        let s = render(&Reply::PathCheck(vec![path(Some(9000)), path(Some(1500))]));
        assert!(s.lines().nth(1).unwrap().ends_with("ok"), "{s}");
        assert!(s.lines().nth(2).unwrap().contains("1500"), "{s}");
        assert!(reply_fails(&Reply::PathCheck(vec![path(Some(1500))])));
        assert!(!reply_fails(&Reply::PathCheck(vec![path(Some(9000))])));
        assert!(!reply_fails(&Reply::Done));
    }

    #[test]
    fn renders_tables_and_values() {
        let s = render(&Reply::Routes(vec![RouteEntry {
            class: Default::default(),
            dest: "0.0.0.0/0".parse().unwrap(),
            target: RouteTarget::Igw,
            mtu: None,
        }]));
        assert_eq!(
            s,
            "DEST       TARGET  CLASS   MTU\n0.0.0.0/0  igw     system  -\n"
        );
        let s = render(&Reply::Inspect(serde_json::json!({
            "port": "opte0",
            "drops": {"bad_vni": 2},
            "warnings": ["a", "b"],
        })));
        assert_eq!(s, "drops:\n  bad_vni: 2\nport: opte0\nwarnings: a, b\n");
        // Empty maps and lists say so rather than print a bare key.
        let s = render(&Reply::Inspect(serde_json::json!({
            "tap_queues": {},
            "warnings": [],
            "workers": [{"ports": []}],
        })));
        assert_eq!(
            s,
            "tap_queues: none\nwarnings: none\nworkers:\n  [0]\n    ports: none\n"
        );
    }

    /// `list-ports` shows a port's external addresses; `dump-v2b` the endpoints of
    /// each prefix on one line.
    #[test]
    fn renders_external_addresses_and_boundary_endpoints() {
        let mut config = api::testing::sample_port("opte0", 5);
        config.external = api::ExternalIps {
            snat: Some(api::SnatRange {
                ip: "198.51.100.1".parse().unwrap(),
                start: 1024,
                end: 2047,
            }),
            ephemeral: None,
            floating: Vec::new(),
            gateways: Default::default(),
        };
        let listed = render(&Reply::Ports(vec![PortStatus {
            port: api::PortInfo {
                config,
                netns: None,
                vhost_user: None,
                attach: None,
            },
            not_applied: None,
            link: None,
            state: None,
            vhost_negotiated: None,
        }]));
        assert!(
            listed.lines().next().unwrap().contains("EXTERNAL"),
            "{listed}"
        );
        assert!(listed.contains("snat 198.51.100.1:1024-2047"), "{listed}");
        let eps = |a: &[&str]| a.iter().map(|e| e.parse().unwrap()).collect::<Vec<_>>();
        let shown = render(&Reply::V2b(vec![api::V2bEntry {
            prefix: "0.0.0.0/0".parse().unwrap(),
            endpoints: eps(&["fd00:99::b1", "fd00:99::b2"]),
        }]));
        assert!(
            shown.contains("0.0.0.0/0") && shown.contains("fd00:99::b1,fd00:99::b2"),
            "{shown}"
        );
    }

    /// A port that is not applied says so on its own line, with the reason.
    #[test]
    fn renders_ports_with_their_status() {
        let port = |name: &str, last: u8, netns: Option<&str>| api::PortInfo {
            config: api::testing::sample_port(name, last),
            netns: netns.map(Into::into),
            vhost_user: None,
            attach: None,
        };
        let attached = api::PortInfo {
            attach: Some("vnet7".into()),
            ..port("opte2", 7, None)
        };
        let vhost = |name: &str, last: u8| api::PortInfo {
            vhost_user: Some(api::VhostUser {
                socket: format!("/run/{name}.sock").into(),
                mode: api::VhostUserMode::Server,
            }),
            ..port(name, last, None)
        };
        let s = render(&Reply::Ports(vec![
            PortStatus {
                port: port("opte0", 5, None),
                not_applied: None,
                link: None,
                state: Some(api::PortState::Paused),
                vhost_negotiated: None,
            },
            PortStatus {
                port: port("opte1", 6, Some("g1")),
                not_applied: Some(api::NotApplied {
                    reason: "network namespace \"g1\" not found".into(),
                    attempts: 2,
                    retry_in_ms: 1500,
                }),
                link: None,
                state: None,
                vhost_negotiated: None,
            },
            PortStatus {
                port: attached,
                not_applied: None,
                link: Some(PortLink::Up),
                state: Some(api::PortState::Running),
                vhost_negotiated: None,
            },
            PortStatus {
                port: vhost("vm0", 8),
                not_applied: None,
                link: Some(PortLink::Up),
                state: Some(api::PortState::Running),
                vhost_negotiated: Some(api::VhostNegotiation {
                    features: vec!["CSUM".into(), "MRG_RXBUF".into(), "VERSION_1".into()],
                    refused: 2,
                }),
            },
            PortStatus {
                port: vhost("vm1", 9),
                not_applied: None,
                link: Some(PortLink::Up),
                state: Some(api::PortState::Running),
                vhost_negotiated: Some(api::VhostNegotiation::default()),
            },
        ]));
        let lines: Vec<&str> = s.lines().collect();
        assert!(lines[0].ends_with("NETNS  ATTACH  STATE    STATUS"), "{s}");
        assert!(
            lines[1].starts_with("opte0") && lines[1].ends_with("-      -       paused   applied"),
            "{s}"
        );
        assert!(
            lines[2].starts_with("opte1")
                && lines[2].ends_with(
                    "g1     -       -        NOT APPLIED (try 2, next in 2 s): network namespace \"g1\" not found"
                ),
            "{s}"
        );
        assert!(
            lines[3].starts_with("opte2") && lines[3].ends_with("-      vnet7   running  up"),
            "{s}"
        );
        // vhost-user ports: what their front ends negotiated, below the table.
        assert_eq!(
            lines[6], "vm0: vhost-user features CSUM,MRG_RXBUF,VERSION_1; 2 front ends refused",
            "{s}"
        );
        assert_eq!(lines[7], "vm1: vhost-user features none acked yet", "{s}");
    }

    /// A port whose tap is gone says so, since when and why; a served one is up.
    #[test]
    fn link_status_says_down_since_when_and_why() {
        let at = UNIX_EPOCH + std::time::Duration::from_secs(1_000);
        let down = PortLink::Down {
            since_unix_ms: 958_500,
            reason: "read: File descriptor in bad state".into(),
        };
        assert_eq!(
            link_status(Some(&down), at, false),
            "DOWN for 41 s (re-attached when the tap is back): read: File descriptor in bad state"
        );
        assert_eq!(
            link_status(Some(&down), at, true),
            "DOWN for 41 s (up when a front end starts the rings): read: File descriptor in bad state"
        );
        assert_eq!(link_status(Some(&PortLink::Up), at, false), "up");
        assert_eq!(
            link_status(None, at, false),
            "applied",
            "a daemon without taps"
        );
    }

    /// The table shows queues as IFINDEX/QUEUE, the ratio in percent, the age.
    #[test]
    fn worker_rows_for_the_table() {
        use overlayd::worker::stats::{QueueRef, WorkerInfo, WorkerStats, WorkerView};
        let st = WorkerStats {
            rounds: 8,
            busy_rounds: 2,
            ..WorkerStats::default()
        };
        let info = WorkerInfo {
            core: Some(3),
            queues: vec![QueueRef {
                ifindex: 4,
                queue: 1,
            }],
            started_unix_ms: 1_000,
        };
        let v = WorkerView::new(1, vec!["a".into(), "b".into()], info, &st);
        let json = serde_json::to_value([v]).unwrap();
        let now = UNIX_EPOCH + std::time::Duration::from_secs(61);
        let rows = worker_rows(&json, now);
        assert_eq!(
            rows,
            vec![vec![
                "1", "3", "a,b", "4/1", "8", "25.0%", "0", "0", "0", "60 s"
            ]]
        );
    }
}
