//! A state file written by the daemon before the API had types of its own (commit
//! 8181a22, checked in as `fixtures/state-8181a22.json`: three ports — a tap in a
//! namespace with external addresses, limits and an allowed prefix; a hypervisor's
//! interface, paused, with an attached subnet; a vhost-user port — routes of both
//! classes, firewall rules with ids, ranges and ICMP types, V2P and V2B) restores
//! in today's daemon whole, and is written back unchanged.

use api::{PortState, Reply, Request};
use engine::{Engine, EngineConfig};
use overlayd::controller::state::StateStore;
use overlayd::controller::Controller;
use overlayd::worker::Datapath;
use serde_json::Value;
use std::time::Instant;

const FIXTURE: &str = include_str!("fixtures/state-8181a22.json");

#[test]
fn a_state_file_of_the_last_format_restores_whole_and_is_kept_as_written() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("state.json"), FIXTURE).unwrap();
    let store = StateStore::open(dir.path()).unwrap();
    let saved = store.load().expect("the old file reads");
    assert_eq!(saved.ports.len(), 3);

    let mut cfg = EngineConfig::new("fd00:99::1".parse().unwrap());
    cfg.boundary_services = Some("fd00:99::ff".parse().unwrap());
    let mut ctl = Controller::new(
        Datapath::without_io(Engine::new(cfg).unwrap()),
        Some(store.clone()),
    );
    ctl.restore(saved.clone(), Instant::now());
    assert_eq!(ctl.state(), &saved, "nothing of the saved state is lost");

    // Every port is in the dataplane, with its saved state.
    let Reply::Ports(ports) = ok(&mut ctl, Request::ListPorts) else {
        panic!("not a port list")
    };
    let states: Vec<(String, Option<PortState>, bool)> = ports
        .iter()
        .map(|p| (p.port.config.name.clone(), p.state, p.not_applied.is_none()))
        .collect();
    assert_eq!(
        states,
        [
            ("opte0".to_string(), Some(PortState::Ready), true),
            ("vm0".to_string(), Some(PortState::Paused), true),
            ("vm1".to_string(), Some(PortState::Ready), true),
        ]
    );
    // Its tables are the saved ones, in the engine too.
    for port in ["opte0", "vm0", "vm1"] {
        let Reply::Routes(routes) = ok(&mut ctl, Request::DumpRoutes { port: port.into() }) else {
            panic!("no routes")
        };
        assert_eq!(Some(&routes), saved.routes.get(port), "{port}");
        let Reply::FwRules(rules) = ok(&mut ctl, Request::ListFwRules { port: port.into() }) else {
            panic!("no rules")
        };
        assert_eq!(Some(&rules), saved.fw_rules.get(port), "{port}");
    }
    let engine = ctl.dataplane().engine();
    assert_eq!(engine.dump_v2p().len(), 2);
    let opte0 = engine.port_config("opte0").unwrap();
    assert_eq!(
        opte0.external.floating,
        ["192.0.2.5".parse::<std::net::IpAddr>().unwrap()]
    );
    assert_eq!(opte0.limits.egress_mbps, Some(100));
    assert_eq!(
        opte0.cidrs.outbound,
        ["10.9.0.0/16".parse::<ipnet::IpNet>().unwrap()]
    );
    let Reply::V2b(v2b) = ok(&mut ctl, Request::DumpV2b) else {
        panic!("no V2B table")
    };
    // The saved table, plus the `--boundary-services` shorthand the daemon adds.
    let default4 = v2b.iter().find(|e| e.prefix.to_string() == "0.0.0.0/0");
    let endpoints: Vec<String> = default4
        .map(|e| e.endpoints.iter().map(ToString::to_string).collect())
        .unwrap_or_default();
    assert_eq!(endpoints, ["fd00:99::b1", "fd00:99::b2", "fd00:99::ff"]);

    // Written back by the restore: the same document.
    let written: Value =
        serde_json::from_str(&std::fs::read_to_string(store.path()).unwrap()).unwrap();
    let original: Value = serde_json::from_str(FIXTURE).unwrap();
    assert_eq!(written, original);
}

fn ok(ctl: &mut Controller<Datapath>, r: Request) -> Reply {
    match ctl.handle(r) {
        api::Outcome::Ok(reply) => reply,
        api::Outcome::Error(e) => panic!("refused: {e}"),
    }
}
