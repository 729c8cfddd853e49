//! The checks behind the `api` fuzz target, shared with the replay of its corpus in
//! `control/overlayd/tests/api_corpus.rs`.
//!
//! A fresh controller over an engine without I/O (the daemon's own pieces, as the
//! headless daemon runs them) is fed the input as request lines. Whatever arrives,
//! nothing panics; every answer survives the wire; a refused request changes
//! nothing the daemon keeps (the state, the engine's ports, routes, firewall rules
//! and V2P and V2B mappings); and after an accepted change the state and the engine agree.

use api::protocol;
use api::{Outcome, Request};
use engine::V2b;
use engine::{Engine, EngineConfig};
use overlayd::controller::{Controller, Dataplane};
use overlayd::convert::ToEngine;
use overlayd::worker::Datapath;
use serde_json::Value;

/// The engine's `--boundary-services` shorthand.
const BOUNDARY: &str = "fd00:99::ff";

/// Requests looked at per input: enough for any sequence the seeds start from.
const MAX_REQUESTS: usize = 64;

/// Runs one input; returns how many of its requests were accepted.
pub fn run(data: &[u8]) -> usize {
    run_requests(
        data.split(|&b| b == b'\n')
            .take(MAX_REQUESTS)
            .filter_map(|line| protocol::decode_request(line).ok()),
    )
}

/// Runs `requests` through a fresh controller with the checks above; returns how
/// many were accepted.
pub fn run_requests(requests: impl IntoIterator<Item = Request>) -> usize {
    let mut cfg = EngineConfig::new("fd00:99::1".parse().unwrap());
    cfg.boundary_services = Some(BOUNDARY.parse().unwrap());
    let engine = Engine::new(cfg).expect("a valid engine configuration");
    let mut ctl = Controller::new(Datapath::without_io(engine), None);
    let mut accepted = 0;
    for request in requests {
        let before = snapshot(&ctl);
        let outcome = ctl.handle(request.clone());
        let wire = protocol::encode_response(outcome.clone());
        assert_eq!(
            protocol::decode_response(&wire).as_ref(),
            Ok(&outcome),
            "answer does not survive the wire"
        );
        match outcome {
            Outcome::Error(e) => assert!(
                snapshot(&ctl) == before,
                "refused ({e}) but changed something: {request:?}"
            ),
            Outcome::Ok(_) => {
                accepted += 1;
                if request.is_mutation() {
                    check_agreement(&ctl, &request);
                }
            }
        }
    }
    accepted
}

/// Everything a request may change, each list sorted (the engine's tables have no
/// order of their own), hit counters and epochs left out.
fn snapshot(ctl: &Controller<Datapath>) -> Value {
    let engine = ctl.dataplane().engine();
    let sorted = |items: Vec<Value>| {
        let mut s: Vec<String> = items.iter().map(Value::to_string).collect();
        s.sort();
        s
    };
    let ports: Vec<Value> = engine
        .list_ports()
        .into_iter()
        .map(|(_, cfg)| {
            let routes = ctl.dataplane().routes(&cfg.name).unwrap_or_default();
            let firewall = engine
                .dump_layer(&cfg.name, "firewall")
                .ok()
                .map(|d| json_of(&d));
            serde_json::json!({
                "config": json_of(&cfg),
                "routes": sorted(routes.iter().map(json_of).collect()),
                "firewall": firewall.map(without_counters),
            })
        })
        .collect();
    serde_json::json!({
        "state": json_of(ctl.state()),
        "ports": sorted(ports),
        "v2p": sorted(engine.dump_v2p().iter().map(json_of).collect()),
        "v2b": json_of(&engine.dump_v2b()),
    })
}

fn json_of<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).expect("dumps serialise")
}

/// A dump with its hit counters removed (lookups count, they do not configure).
fn without_counters(mut v: Value) -> Value {
    match &mut v {
        Value::Object(m) => {
            m.retain(|k, _| k != "hits" && k != "epoch");
            for x in m.values_mut() {
                *x = without_counters(x.take());
            }
        }
        Value::Array(a) => {
            for x in a.iter_mut() {
                *x = without_counters(x.take());
            }
        }
        _ => {}
    }
    v
}

/// After an accepted change the state and the engine hold the same ports, routing
/// tables, external addresses and number of V2P mappings, and the engine's V2B table
/// is the saved one plus the shorthand.
fn check_agreement(ctl: &Controller<Datapath>, request: &Request) {
    let state = ctl.state();
    let engine = ctl.dataplane().engine();
    let mut in_engine: Vec<String> = engine
        .list_ports()
        .into_iter()
        .map(|(_, c)| c.name)
        .collect();
    let mut in_state: Vec<String> = state.ports.iter().map(|p| p.config.name.clone()).collect();
    in_engine.sort();
    in_state.sort();
    assert_eq!(in_engine, in_state, "after {request:?}");
    for name in &in_state {
        let mut saved = state.routes.get(name).cloned().unwrap_or_default();
        let mut held = ctl.dataplane().routes(name).expect("a port's routes");
        saved.sort_by_key(|r| (r.dest.to_string(), r.class.to_string()));
        held.sort_by_key(|r| (r.dest.to_string(), r.class.to_string()));
        assert_eq!(saved, held, "routes of {name} after {request:?}");
        let held = engine.port_config(name).expect("a port");
        let external = &held.external;
        let saved = state.ports.iter().find(|p| &p.config.name == name);
        assert_eq!(
            saved.map(|p| p.config.cidrs.to_engine()),
            Some(held.cidrs.clone()),
            "allowed prefixes of {name} after {request:?}"
        );
        assert_eq!(
            saved.map(|p| p.config.external.to_engine()),
            Some(external.clone()),
            "external IPs of {name} after {request:?}"
        );
    }
    assert_eq!(
        engine.dump_v2p().len(),
        state.v2p.len(),
        "after {request:?}"
    );
    let mut v2b = V2b::default();
    for net in ["0.0.0.0/0", "::/0"] {
        let boundary = [BOUNDARY.parse().expect("an address")];
        v2b.set(net.parse().expect("a prefix"), &boundary)
            .expect("a valid endpoint");
    }
    v2b.merge(&V2b::from_entries(&state.v2b.to_engine()).expect("the saved table is valid"));
    assert_eq!(engine.dump_v2b(), v2b.dump(), "after {request:?}");
}
