//! Tables for the flow and layer inspection verbs (`list-layers`, `dump-layer`,
//! `dump-tcp-flows`, `dump-uft`). Their replies are the engine's JSON as it is
//! (what `--json` prints); these read it by field name and print one row per
//! layer, rule or flow, the way operators read opteadm's output.

use super::layout::{render_value, scalar, table};
use api::{Reply, Request};
use serde_json::Value;
use std::fmt::Write as _;

/// The table for `request`'s reply if it is one of these verbs, else `None`.
pub(super) fn render(request: &Request, reply: &Reply) -> Option<String> {
    let Reply::Inspect(v) = reply else {
        return None;
    };
    let mut out = String::new();
    match request {
        Request::ListLayers { .. } => list_layers(&mut out, v),
        Request::DumpLayer { .. } => dump_layer(&mut out, v),
        Request::DumpTcpFlows { .. } => tcp_flows(&mut out, v),
        Request::DumpUft { .. } => uft(&mut out, v),
        _ => return None,
    }
    Some(out)
}

fn text(v: &Value) -> String {
    scalar(v)
}

fn list_layers(out: &mut String, v: &Value) {
    let rows = rows(v)
        .map(|l| {
            [
                "name",
                "rules_in",
                "rules_out",
                "default_in",
                "default_out",
                "flows",
            ]
            .iter()
            .map(|k| text(&l[*k]))
            .collect()
        })
        .collect();
    table(
        out,
        &[
            "NAME",
            "RULES IN",
            "RULES OUT",
            "DEFAULT IN",
            "DEFAULT OUT",
            "FLOWS",
        ],
        rows,
    );
}

fn rows(v: &Value) -> impl Iterator<Item = &Value> {
    v.as_array().into_iter().flatten()
}

/// A rule's predicates as `dst_ip=10.0.0.0/8 proto=6`, `any` for none.
fn predicates(v: &Value) -> String {
    let words: Vec<String> = rows(v)
        .map(|p| match p.as_object().and_then(|m| m.iter().next()) {
            Some((k, x)) if x.is_object() => {
                format!("{k}={}-{}", text(&x["start"]), text(&x["end"]))
            }
            Some((k, x)) => format!("{k}={}", text(x)),
            None => text(p),
        })
        .collect();
    if words.is_empty() {
        "any".into()
    } else {
        words.join(" ")
    }
}

fn dump_layer(out: &mut String, v: &Value) {
    let _ = writeln!(
        out,
        "Layer {}  flows: {}",
        text(&v["name"]),
        text(&v["flows"])
    );
    for side in ["inbound", "outbound"] {
        let t = &v[side];
        let _ = writeln!(
            out,
            "\n{}: default {}; flows no rule matched {}, denied {}",
            side.to_uppercase(),
            text(&t["default_action"]),
            text(&t["no_match"]),
            text(&t["denied"])
        );
        let rules: Vec<&Value> = rows(&t["rules"]).collect();
        if rules.is_empty() {
            continue;
        }
        let rows = rules
            .iter()
            .map(|r| {
                vec![
                    // The id rm-fw-rule takes (firewall), else the engine's.
                    text(r.get("fw_rule").unwrap_or(&r["id"])),
                    text(&r["priority"]),
                    text(&r["action"]),
                    predicates(&r["predicates"]),
                    text(&r["hits"]),
                ]
            })
            .collect();
        table(out, &["ID", "PRIO", "ACTION", "MATCH", "HITS"], rows);
    }
    if v["state"].is_object() {
        let _ = writeln!(out, "\nSTATE:");
        render_value(out, &v["state"], 1);
    }
}

/// The 5-tuple columns of a flow key.
fn key_cells(k: &Value) -> Vec<String> {
    let proto = match k["proto"].as_u64() {
        Some(6) => "tcp".into(),
        Some(17) => "udp".into(),
        Some(1) => "icmp".into(),
        Some(58) => "icmp6".into(),
        _ => text(&k["proto"]),
    };
    vec![
        proto,
        text(&k["src_ip"]),
        text(&k["src_port"]),
        text(&k["dst_ip"]),
        text(&k["dst_port"]),
    ]
}

/// Nanoseconds as seconds with one decimal.
fn secs(v: &Value) -> String {
    v.as_u64()
        .map_or_else(|| text(v), |ns| format!("{:.1}s", ns as f64 / 1e9))
}

fn tcp_flows(out: &mut String, v: &Value) {
    let rows = rows(v)
        .map(|f| {
            let mut r = key_cells(&f["key"]);
            r.extend([
                text(&f["tcp_state"]),
                text(&f["initiator"]),
                text(&f["out"]["packets"]),
                text(&f["out"]["bytes"]),
                text(&f["in"]["packets"]),
                text(&f["in"]["bytes"]),
                secs(&f["age_ns"]),
                secs(&f["idle_ns"]),
            ]);
            r
        })
        .collect();
    table(
        out,
        &[
            "PROTO",
            "SRC",
            "SPORT",
            "DST",
            "DPORT",
            "STATE",
            "OPENED",
            "PKTS OUT",
            "BYTES OUT",
            "PKTS IN",
            "BYTES IN",
            "AGE",
            "IDLE",
        ],
        rows,
    );
}

fn uft(out: &mut String, v: &Value) {
    let mut all = Vec::new();
    for (dir, side) in [("in", "inbound"), ("out", "outbound")] {
        for e in rows(&v[side]) {
            let mut r = vec![dir.to_string()];
            r.extend(key_cells(&e["key"]));
            r.extend([
                text(&e["action"]),
                text(&e["hits"]),
                text(&e["bytes"]),
                secs(&e["idle_ns"]),
                if e["stale"].as_bool() == Some(true) {
                    "stale".into()
                } else {
                    "-".into()
                },
            ]);
            all.push(r);
        }
    }
    table(
        out,
        &[
            "DIR", "PROTO", "SRC", "SPORT", "DST", "DPORT", "ACTION", "HITS", "BYTES", "IDLE",
            "EPOCH",
        ],
        all,
    );
    if let Some(next) = v.get("next").filter(|n| !n.is_null()) {
        let _ = writeln!(out, "next page: --cursor {}", text(next));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::{Outcome, PortInfo};
    use engine::{Engine, EngineConfig};
    use overlayd::controller::Controller;
    use overlayd::worker::Datapath;

    /// The tables read the engine's JSON by field name: rendered from a real
    /// engine's answers, every column is filled.
    #[test]
    fn tables_from_the_engines_answers() {
        let engine = Engine::new(EngineConfig::new("fd00::1".parse().unwrap())).unwrap();
        let mut c = Controller::new(Datapath::without_io(engine), None);
        let create = Request::CreatePort(Box::new(PortInfo {
            config: api::testing::sample_port("opte0", 5),
            netns: None,
            vhost_user: None,
            attach: None,
        }));
        assert_eq!(c.handle(create), Outcome::Ok(Reply::Done));
        let show = |c: &mut Controller<Datapath>, r: Request| match c.handle(r.clone()) {
            Outcome::Ok(reply) => render(&r, &reply).unwrap(),
            Outcome::Error(e) => panic!("{e}"),
        };
        let port = || "opte0".to_string();
        let s = show(&mut c, Request::ListLayers { port: port() });
        let lines: Vec<&str> = s.lines().collect();
        assert!(
            lines[0].starts_with("NAME") && lines[0].ends_with("FLOWS"),
            "{s}"
        );
        assert!(lines[1].starts_with("gateway   0         0"), "{s}");
        assert!(
            lines[2].starts_with("firewall  2         0") && lines[2].ends_with("0"),
            "{s}"
        );
        assert!(lines[3].starts_with("router    0         2"), "{s}");
        assert!(
            lines[4].starts_with("overlay") && lines[4].ends_with("-"),
            "{s}"
        );
        let s = show(
            &mut c,
            Request::DumpLayer {
                port: port(),
                layer: "firewall".into(),
            },
        );
        assert!(s.starts_with("Layer firewall  flows: 0\n"), "{s}");
        assert!(
            s.contains("INBOUND: default deny; flows no rule matched 0, denied 0"),
            "{s}"
        );
        assert!(
            s.contains("\n1   65534  allow   src_ip=172.30.0.0/22 "),
            "{s}"
        );
        assert!(s.contains("STATE:\n  firewall:\n    flows: 0"), "{s}");
        let s = show(
            &mut c,
            Request::DumpLayer {
                port: port(),
                layer: "router".into(),
            },
        );
        assert!(s.contains("dst_ip=172.30.0.0/22"), "{s}");
        let s = show(&mut c, Request::DumpTcpFlows { port: port() });
        assert!(
            s.starts_with("PROTO  SRC  SPORT") && s.ends_with("IDLE\n"),
            "{s}"
        );
        let s = show(
            &mut c,
            Request::DumpUft {
                port: port(),
                cursor: None,
                limit: None,
            },
        );
        assert!(s.starts_with("DIR  PROTO") && s.ends_with("EPOCH\n"), "{s}");
        // Other replies are left to the generic renderer.
        assert_eq!(render(&Request::ListPorts, &Reply::Done), None);
    }
}
