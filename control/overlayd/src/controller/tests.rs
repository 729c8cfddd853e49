//! The controller's bookkeeping, checked against a dataplane that records what it
//! is told and refuses on command.

use super::*;
use crate::convert::ToApi;
use crate::fleet::channel::{FleetBatch, FleetCommand, SharedView};
use ::fleet::{Change, Positions};
use api::testing::sample_port;
use api::{
    CidrDir, Direction, ErrorCode, ExternalIps, FwAction, FwFilters, FwHost, FwPorts, FwProto,
    FwRule, MacAddr, NotApplied, PortCidrs, PortLimits, PortState, Refusal, RouteClass, RouteEntry,
    RouteTarget,
};
use engine::{Imported, LiveState};
use ipnet::IpNet;
use serde_json::{json, Value};
use std::net::Ipv6Addr;
use std::sync::Mutex;
use std::time::Duration;

/// Namespaces a test pretends are missing, seen by the dataplane and the probe.
type Missing = Arc<Mutex<BTreeSet<String>>>;

/// A dataplane that records what it was told and refuses on command, to check the
/// controller's bookkeeping apart from the engine.
#[derive(Default)]
struct Recorder {
    ports: Vec<String>,
    v2p: Vec<V2pEntry>,
    v2b: V2b,
    routes: BTreeMap<String, Vec<RouteEntry>>,
    rules: BTreeMap<String, Vec<FwRule>>,
    paused: BTreeSet<String>,
    /// Live state imported into each port (and exported from it).
    live: BTreeMap<String, LiveState>,
    /// Guests whose frames are relayed to the sled they moved to.
    departed: BTreeMap<(u32, MacAddr), Ipv6Addr>,
    /// Every change asked for, in order ("op port").
    log: Vec<String>,
    refuse: Option<&'static str>,
    /// A port to be moved into one of these is refused, as the tap would be.
    missing_netns: Missing,
}

impl Recorder {
    fn check(&mut self, op: &str, target: &str) -> Result<(), DataplaneError> {
        self.log.push(format!("{op} {target}"));
        match self.refuse {
            Some(r) if r == op => Err(DataplaneError::Guest {
                device: "recorder",
                port: target.to_string(),
                error: std::io::Error::other(format!("dataplane refuses {op}")),
            }),
            _ => Ok(()),
        }
    }
}

impl Dataplane for Recorder {
    fn add_port(&mut self, p: &PortInfo, tables: &PortTables) -> Result<(), DataplaneError> {
        let name = p.config.name.clone();
        self.check("add_port", &name)?;
        if let Some(ns) = &p.netns {
            if self.missing_netns.lock().unwrap().contains(ns) {
                return Err(DataplaneError::NoNetns {
                    port: name,
                    netns: ns.clone(),
                    path: format!("/run/netns/{ns}").into(),
                });
            }
        }
        self.ports.push(name.clone());
        // Like the engine, a new port starts with a route to its VPC subnet.
        let subnet = RouteEntry {
            class: Default::default(),
            dest: IpNet::V4(p.config.vpc_subnet4.unwrap()),
            target: RouteTarget::Subnet,
            mtu: None,
        };
        let routes = tables.routes.clone().unwrap_or_else(|| vec![subnet]);
        self.routes.insert(name.clone(), routes);
        self.rules.insert(name.clone(), tables.fw_rules.clone());
        if tables.paused {
            self.paused.insert(name);
        }
        Ok(())
    }
    fn remove_port(&mut self, name: &str) -> Result<(), DataplaneError> {
        self.check("remove_port", name)?;
        self.ports.retain(|n| n != name);
        self.routes.remove(name);
        self.rules.remove(name);
        self.paused.remove(name);
        Ok(())
    }
    fn set_v2p(&mut self, e: &V2pEntry) -> Result<(), DataplaneError> {
        self.check("set_v2p", &e.vpc_ip.to_string())?;
        self.v2p
            .retain(|o| !(o.vpc_ip == e.vpc_ip && o.vni == e.vni));
        self.v2p.push(*e);
        Ok(())
    }
    fn clear_v2p(&mut self, ip: IpAddr, vni: Vni) -> Result<(), DataplaneError> {
        self.check("clear_v2p", &ip.to_string())?;
        self.v2p.retain(|o| !(o.vpc_ip == ip && o.vni == vni));
        Ok(())
    }
    fn set_v2b(&mut self, table: &V2b) -> Result<(), DataplaneError> {
        self.check("set_v2b", &format!("{} prefixes", table.dump().len()))?;
        self.v2b = table.clone();
        Ok(())
    }
    fn set_routes(&mut self, port: &str, r: &[RouteEntry]) -> Result<(), DataplaneError> {
        self.check("set_routes", port)?;
        self.routes.insert(port.into(), r.to_vec());
        Ok(())
    }
    fn routes(&self, port: &str) -> Result<Vec<RouteEntry>, DataplaneError> {
        Ok(self.routes.get(port).cloned().unwrap_or_default())
    }
    fn set_fw_rules(&mut self, port: &str, rules: &[FwRule]) -> Result<(), DataplaneError> {
        self.check("set_fw_rules", port)?;
        self.rules.insert(port.into(), rules.to_vec());
        Ok(())
    }
    fn set_port_paused(&mut self, port: &str, paused: bool) -> Result<(), DataplaneError> {
        self.check(if paused { "pause" } else { "resume" }, port)?;
        if paused {
            self.paused.insert(port.into());
        } else {
            self.paused.remove(port);
        }
        Ok(())
    }
    fn port_state(&self, port: &str) -> Result<PortState, DataplaneError> {
        if !self.ports.iter().any(|p| p == port) {
            return Err(DataplaneError::NoSuchPort(port.to_string()));
        }
        Ok(if self.paused.contains(port) {
            PortState::Paused
        } else {
            PortState::Ready
        })
    }
    fn clear_uft(&mut self, port: &str) -> Result<(), DataplaneError> {
        self.check("clear_uft", port)
    }
    fn clear_lft(&mut self, port: &str, _: &str) -> Result<u64, DataplaneError> {
        self.check("clear_lft", port).map(|()| 0)
    }
    fn export_live(&mut self, port: &str) -> Result<LiveState, DataplaneError> {
        self.check("export_live", port)?;
        Ok(self.live.get(port).cloned().unwrap_or_default())
    }
    fn import_live(&mut self, port: &str, f: &LiveState) -> Result<Imported, DataplaneError> {
        self.check("import_live", port)?;
        self.live.insert(port.into(), f.clone());
        Ok(Imported {
            connections: f.connections.len(),
            snat_ports: f.nat.snat.len(),
        })
    }
    fn relay_departed(
        &mut self,
        vni: Vni,
        mac: MacAddr,
        to: Option<Ipv6Addr>,
    ) -> Result<(), DataplaneError> {
        self.check("relay_departed", &mac.to_string())?;
        match to {
            Some(to) => self.departed.insert((vni.get(), mac), to),
            None => self.departed.remove(&(vni.get(), mac)),
        };
        Ok(())
    }
    fn set_external_ips(&mut self, port: &str, _: &ExternalIps) -> Result<(), DataplaneError> {
        self.check("set_external_ips", port)
    }
    fn set_port_limits(&mut self, port: &str, _: &PortLimits) -> Result<(), DataplaneError> {
        self.check("set_port_limits", port)
    }
    fn set_port_cidrs(&mut self, port: &str, _: &PortCidrs) -> Result<(), DataplaneError> {
        self.check("set_port_cidrs", port)
    }
    fn inspect(&mut self, what: &Inspect) -> Result<serde_json::Value, DataplaneError> {
        if let Inspect::V2b = what {
            return Ok(json!(self.v2b.dump()));
        }
        // Shaped like the real stats, so the control plane's part can be added.
        Ok(json!({ "asked": format!("{what:?}") }))
    }
}

/// A controller over a [`Recorder`] whose namespace probe sees `missing` too.
fn with_missing(missing: &Missing, store: Option<StateStore>) -> Controller<Recorder> {
    let dp = Recorder {
        missing_netns: missing.clone(),
        ..Recorder::default()
    };
    let probe = missing.clone();
    Controller::new(dp, store).with_netns_probe(move |ns| !probe.lock().unwrap().contains(ns))
}

fn create(name: &str, last: u8) -> Request {
    Request::CreatePort(Box::new(PortInfo {
        config: sample_port(name, last),
        netns: None,
        vhost_user: None,
        attach: None,
    }))
}

fn ok(c: &mut Controller<Recorder>, r: Request) -> Reply {
    match c.handle(r) {
        Outcome::Ok(r) => r,
        Outcome::Error(e) => panic!("refused: {e}"),
    }
}

fn err(c: &mut Controller<Recorder>, r: Request) -> Refusal {
    let before = c.state().clone();
    let dp_ports = c.dataplane().ports.clone();
    let dp_routes = c.dataplane().routes.clone();
    let dp_rules = c.dataplane().rules.clone();
    let dp_v2p = c.dataplane().v2p.clone();
    let listed = ok(c, Request::ListPorts);
    match c.handle(r) {
        Outcome::Ok(r) => panic!("accepted: {r:?}"),
        Outcome::Error(e) => {
            assert_eq!(c.state(), &before, "a refused request changed the state");
            assert_eq!(c.dataplane().ports, dp_ports);
            assert_eq!(c.dataplane().routes, dp_routes);
            assert_eq!(c.dataplane().rules, dp_rules);
            assert_eq!(c.dataplane().v2p, dp_v2p);
            assert_eq!(
                ports_applied(ok(c, Request::ListPorts)),
                ports_applied(listed)
            );
            e
        }
    }
}

/// (name, applied?) of every port `list-ports` shows.
fn ports_applied(r: Reply) -> Vec<(String, bool)> {
    let Reply::Ports(ports) = r else {
        panic!("{r:?}")
    };
    ports
        .into_iter()
        .map(|p| (p.port.config.name, p.not_applied.is_none()))
        .collect()
}

/// The `not_applied` record `list-ports` shows for `port`.
fn not_applied(c: &mut Controller<Recorder>, port: &str) -> Option<NotApplied> {
    let Reply::Ports(ports) = ok(c, Request::ListPorts) else {
        panic!()
    };
    ports
        .into_iter()
        .find(|p| p.port.config.name == port)
        .unwrap_or_else(|| panic!("{port} not listed"))
        .not_applied
}

/// The control plane's part of `stats`.
fn control_stats(c: &mut Controller<Recorder>) -> Value {
    let Reply::Inspect(v) = ok(c, Request::Stats { port: None }) else {
        panic!()
    };
    v["control"].clone()
}

/// A local mapping as `dump-v2p` shows it.
fn local(entry: V2pEntry) -> api::V2pRecord {
    api::V2pRecord {
        entry,
        source: api::Source::Local,
        overridden: false,
    }
}

fn v2p(ip: &str) -> V2pEntry {
    V2pEntry {
        vpc_ip: ip.parse().unwrap(),
        vpc_mac: "a8:40:25:ff:00:09".parse().unwrap(),
        underlay_ip: "fd00:99::2".parse().unwrap(),
        vni: Vni::new(1701).unwrap(),
    }
}

/// `--attach` is refused with a namespace, with a name no interface can have,
/// on an interface another port is attached to or that is another port's tap,
/// and a tap may not take an attached interface's name; each error names the
/// bad value. Nothing refused is kept.
#[test]
fn attachments_are_checked() {
    let mut c = Controller::new(Recorder::default(), None);
    let attach = |name: &str, last: u8, iface: &str, netns: Option<&str>| {
        Request::CreatePort(Box::new(PortInfo {
            config: sample_port(name, last),
            netns: netns.map(Into::into),
            attach: Some(iface.into()),
            vhost_user: None,
        }))
    };
    let e = err(&mut c, attach("vm0", 5, "vnet0", Some("g0")));
    assert!(
        e.message.contains("\"vnet0\"")
            && e.message.contains("\"g0\"")
            && e.message.contains("exclude"),
        "{e}"
    );
    for bad in ["", "a-name-far-too-long", "eth0:1", "a/b", "a b"] {
        let e = err(&mut c, attach("vm0", 5, bad, None));
        assert!(
            e.message
                .contains(&format!("invalid interface name {bad:?}")),
            "{e}"
        );
    }
    ok(&mut c, attach("vm0", 5, "vnet0", None));
    let e = err(&mut c, attach("vm1", 6, "vnet0", None));
    assert!(
        e.message
            .contains("\"vnet0\" is already attached to port \"vm0\""),
        "{e}"
    );
    ok(&mut c, create("opte1", 7));
    let e = err(&mut c, attach("vm2", 8, "opte1", None));
    assert!(e.message.contains("\"opte1\" is the tap of port"), "{e}");
    let e = err(&mut c, create("vnet0", 9));
    assert!(
        e.message
            .contains("port \"vm0\" is attached to interface \"vnet0\""),
        "{e}"
    );
    let Outcome::Ok(Reply::Ports(ports)) = c.handle(Request::ListPorts) else {
        panic!("no port list")
    };
    let kept: Vec<_> = ports
        .iter()
        .map(|p| (p.port.config.name.as_str(), p.port.attach.as_deref()))
        .collect();
    assert_eq!(kept, [("vm0", Some("vnet0")), ("opte1", None)]);
}

#[test]
fn refused_requests_change_nothing() {
    let mut c = Controller::new(Recorder::default(), None);
    ok(&mut c, create("opte0", 5));
    let e = err(&mut c, create("opte0", 6));
    assert_eq!(e.code, ErrorCode::Conflict);
    assert!(e.message.contains("opte0"));
    assert!(err(&mut c, create("opte1", 5))
        .message
        .contains("a8:40:25:ff:00:05"));
    let mut bad = sample_port("opte2", 7);
    bad.mtu = 100;
    let e = err(
        &mut c,
        Request::CreatePort(Box::new(PortInfo {
            config: bad,
            netns: None,
            vhost_user: None,
            attach: None,
        })),
    );
    assert!(e.message.contains("MTU 100"), "{e}");
    let e = err(
        &mut c,
        Request::CreatePort(Box::new(PortInfo {
            config: sample_port("opte3", 8),
            netns: Some("../etc".into()),
            vhost_user: None,
            attach: None,
        })),
    );
    assert!(e.message.contains("../etc"), "{e}");
    assert!(err(
        &mut c,
        Request::DeletePort {
            name: "nope".into(),
            forward_to: None,
        }
    )
    .message
    .contains("nope"));
    let e = err(
        &mut c,
        Request::Mtu {
            port: "nope".into(),
        },
    );
    assert_eq!(e.code, ErrorCode::NotFound);
    let e = err(
        &mut c,
        Request::ClearV2p {
            vpc_ip: "10.9.9.9".parse().unwrap(),
            vni: Vni::new(5).unwrap(),
            expect: None,
        },
    );
    assert!(e.message.contains("10.9.9.9"), "{e}");
    let route = RouteEntry {
        class: Default::default(),
        dest: "0.0.0.0/0".parse().unwrap(),
        target: RouteTarget::Igw,
        mtu: None,
    };
    ok(
        &mut c,
        Request::AddRouterEntry {
            port: "opte0".into(),
            entry: route,
        },
    );
    let e = err(
        &mut c,
        Request::AddRouterEntry {
            port: "opte0".into(),
            entry: route,
        },
    );
    assert!(e.message.contains("0.0.0.0/0"), "{e}");
    let e = err(
        &mut c,
        Request::AddRouterEntry {
            port: "opte0".into(),
            entry: RouteEntry {
                class: Default::default(),
                mtu: Some(576),
                dest: "10.0.0.0/8".parse().unwrap(),
                ..route
            },
        },
    );
    assert!(e.message.contains("576"), "{e}");
    // A destination with host bits set, as `ip route` refuses it (the engine
    // would match the network, the saved route would say otherwise).
    let e = err(
        &mut c,
        Request::AddRouterEntry {
            port: "opte0".into(),
            entry: RouteEntry {
                dest: "10.9.0.1/6".parse().unwrap(),
                ..route
            },
        },
    );
    assert!(
        e.message.contains("10.9.0.1/6") && e.message.contains("8.0.0.0/6"),
        "{e}"
    );
    c.dataplane_mut().refuse = Some("set_routes");
    let e = err(
        &mut c,
        Request::DelRouterEntry {
            class: Default::default(),
            port: "opte0".into(),
            dest: "0.0.0.0/0".parse().unwrap(),
        },
    );
    assert!(e.message.contains("set_routes"), "{e}");
    c.dataplane_mut().refuse = Some("add_port");
    err(&mut c, create("opte4", 9));
}

#[test]
fn v2b_set_adds_clear_removes_and_a_refusal_changes_nothing() {
    let mut c = Controller::new(Recorder::default(), None);
    let set = |prefix: &str, eps: &[&str]| Request::SetV2b {
        prefix: prefix.parse().unwrap(),
        endpoints: eps.iter().map(|e| e.parse().unwrap()).collect(),
    };
    let clear = |prefix: &str, eps: &[&str]| Request::ClearV2b {
        prefix: prefix.parse().unwrap(),
        endpoints: eps.iter().map(|e| e.parse().unwrap()).collect(),
    };
    ok(&mut c, set("0.0.0.0/0", &["fd00:99::b1"]));
    ok(&mut c, set("0.0.0.0/0", &["fd00:99::b2"]));
    ok(&mut c, set("::/0", &["fd00:99::b1"]));
    let Reply::V2b(table) = ok(&mut c, Request::DumpV2b) else {
        panic!("not a V2B table")
    };
    assert_eq!(table.len(), 2);
    assert_eq!(table[0].endpoints.len(), 2);
    assert_eq!(c.state().v2b, table);
    assert!(err(&mut c, clear("0.0.0.0/0", &["fd00:99::b9"]))
        .message
        .contains("fd00:99::b9"));
    assert!(err(&mut c, set("10.0.0.0/8", &["ff02::1"]))
        .message
        .contains("ff02::1"));
    assert!(err(&mut c, clear("10.0.0.0/8", &["fd00:99::b1"]))
        .message
        .contains("10.0.0.0/8"));
    assert_eq!(c.state().v2b, table);
    ok(&mut c, clear("0.0.0.0/0", &["fd00:99::b1", "fd00:99::b2"]));
    assert_eq!(c.state().v2b.len(), 1);
    assert_eq!(c.dataplane().v2b.dump().to_api(), c.state().v2b);
    // The dataplane refuses: the saved table stays what it was.
    c.dataplane_mut().refuse = Some("set_v2b");
    assert!(err(&mut c, set("0.0.0.0/0", &["fd00:99::b3"]))
        .message
        .contains("refuses"));
    assert_eq!(c.state().v2b.len(), 1);
}

#[test]
fn v2p_set_replace_clear() {
    let mut c = Controller::new(Recorder::default(), None);
    ok(&mut c, Request::set_v2p(v2p("172.30.0.9")));
    let mut moved = v2p("172.30.0.9");
    moved.underlay_ip = "fd00:99::3".parse().unwrap();
    ok(&mut c, Request::set_v2p(moved));
    assert_eq!(ok(&mut c, Request::DumpV2p), Reply::V2p(vec![local(moved)]));
    assert_eq!(c.dataplane().v2p, vec![moved]);
    ok(
        &mut c,
        Request::ClearV2p {
            vpc_ip: moved.vpc_ip,
            vni: moved.vni,
            expect: None,
        },
    );
    assert_eq!(ok(&mut c, Request::DumpV2p), Reply::V2p(vec![]));
    let mut bad = v2p("172.30.0.10");
    bad.vpc_mac = wire::MacAddr::BROADCAST;
    assert!(err(&mut c, Request::set_v2p(bad))
        .message
        .contains("ff:ff:ff:ff:ff:ff"));
}

#[test]
fn firewall_rule_bookkeeping() {
    let mut c = Controller::new(Recorder::default(), None);
    ok(&mut c, create("opte0", 5));
    let rule = FwRule {
        id: 0,
        direction: Direction::In,
        priority: 10,
        action: FwAction::Allow,
        filters: FwFilters {
            host: FwHost::Any,
            proto: FwProto::Tcp,
            ports: vec![FwPorts::One(22)],
            icmp: None,
        },
    };
    ok(
        &mut c,
        Request::AddFwRule {
            port: "opte0".into(),
            rule: rule.clone(),
        },
    );
    err(
        &mut c,
        Request::AddFwRule {
            port: "opte0".into(),
            rule: rule.clone(),
        },
    );
    let e = err(
        &mut c,
        Request::SetFwRules {
            port: "opte0".into(),
            rules: vec![rule.clone(), rule.clone()],
        },
    );
    assert!(e.message.contains("twice"), "{e}");
    let e = err(
        &mut c,
        Request::RmFwRule {
            port: "opte0".into(),
            direction: Direction::Out,
            priority: 10,
            filters: rule.filters.clone(),
        },
    );
    assert!(e.message.contains("out rule at priority 10"), "{e}");
    ok(
        &mut c,
        Request::RmFwRule {
            port: "opte0".into(),
            direction: Direction::In,
            priority: 10,
            filters: rule.filters.clone(),
        },
    );
    // What is left is what the port started with, under the ids it got then;
    // the rule added had 3, so the next one gets 4.
    let mut defaults = super::dispatch::default_vpc_rules(&c.state().ports[0].config);
    defaults[0].id = 1;
    defaults[1].id = 2;
    assert_eq!(c.state().fw_rules["opte0"], defaults);
    assert_eq!(c.state().fw_next_id["opte0"], 4);
    ok(
        &mut c,
        Request::AddFwRule {
            port: "opte0".into(),
            rule: rule.clone(),
        },
    );
    assert_eq!(c.state().fw_rules["opte0"][2].id, 4);
    // Removing by id, with or without a direction.
    let e = err(
        &mut c,
        Request::RmFwRuleId {
            port: "opte0".into(),
            direction: None,
            id: 3,
        },
    );
    assert!(
        e.message.contains("no firewall rule 3") && e.message.contains("1, 2, 4"),
        "{e}"
    );
    ok(
        &mut c,
        Request::RmFwRuleId {
            port: "opte0".into(),
            direction: None,
            id: 4,
        },
    );
    // A new port of the same name starts again from 1.
    ok(
        &mut c,
        Request::DeletePort {
            name: "opte0".into(),
            forward_to: None,
        },
    );
    assert!(!c.state().fw_next_id.contains_key("opte0"));
    ok(&mut c, create("opte0", 5));
    let ids: Vec<u64> = c.state().fw_rules["opte0"].iter().map(|r| r.id).collect();
    assert_eq!(ids, [1, 2]);
}

/// `pause-port` is saved and a restored port comes back paused (paused before
/// it carries a frame); `resume-port` and `delete-xde` forget it; both name an
/// unknown port.
#[test]
fn paused_ports_are_saved_and_restored_paused() {
    let dir = tempfile::tempdir().unwrap();
    let store = StateStore::open(dir.path()).unwrap();
    let mut c = Controller::new(Recorder::default(), Some(store.clone()));
    ok(&mut c, create("opte0", 5));
    ok(&mut c, create("opte1", 6));
    let state_of = |c: &mut Controller<Recorder>, name: &str| {
        let Reply::Ports(ports) = ok(c, Request::ListPorts) else {
            panic!("no port list")
        };
        ports
            .into_iter()
            .find(|p| p.port.config.name == name)
            .and_then(|p| p.state)
    };
    assert_eq!(state_of(&mut c, "opte0"), Some(PortState::Ready));
    ok(
        &mut c,
        Request::PausePort {
            port: "opte0".into(),
        },
    );
    // Pausing again changes nothing and is no error.
    ok(
        &mut c,
        Request::PausePort {
            port: "opte0".into(),
        },
    );
    assert_eq!(state_of(&mut c, "opte0"), Some(PortState::Paused));
    assert_eq!(state_of(&mut c, "opte1"), Some(PortState::Ready));
    let e = err(
        &mut c,
        Request::PausePort {
            port: "nope".into(),
        },
    );
    assert!(e.message.contains("nope"), "{e}");
    let saved = store.load().unwrap();
    assert!(saved.paused.contains("opte0") && !saved.paused.contains("opte1"));

    let mut fresh = Controller::new(Recorder::default(), Some(store.clone()));
    fresh.restore(saved.clone(), Instant::now());
    assert!(fresh.dataplane().paused.contains("opte0"));
    assert_eq!(state_of(&mut fresh, "opte0"), Some(PortState::Paused));
    ok(
        &mut fresh,
        Request::ResumePort {
            port: "opte0".into(),
        },
    );
    assert_eq!(state_of(&mut fresh, "opte0"), Some(PortState::Ready));
    assert!(store.load().unwrap().paused.is_empty());
    ok(
        &mut fresh,
        Request::PausePort {
            port: "opte1".into(),
        },
    );
    ok(
        &mut fresh,
        Request::DeletePort {
            name: "opte1".into(),
            forward_to: None,
        },
    );
    assert!(fresh.state().paused.is_empty());
    // A dataplane that refuses leaves the state as it was.
    fresh.dataplane_mut().refuse = Some("pause");
    err(
        &mut fresh,
        Request::PausePort {
            port: "opte0".into(),
        },
    );
    assert!(fresh.state().paused.is_empty());
}

#[test]
fn persistence_and_restore() {
    let dir = tempfile::tempdir().unwrap();
    let store = StateStore::open(dir.path()).unwrap();
    let mut c = Controller::new(Recorder::default(), Some(store.clone()));
    ok(&mut c, create("opte0", 5));
    ok(&mut c, create("opte1", 6));
    ok(&mut c, Request::set_v2p(v2p("172.30.0.9")));
    ok(
        &mut c,
        Request::SetV2b {
            prefix: "0.0.0.0/0".parse().unwrap(),
            endpoints: vec!["fd00:99::b1".parse().unwrap()],
        },
    );
    ok(
        &mut c,
        Request::AddRouterEntry {
            port: "opte1".into(),
            entry: RouteEntry {
                class: Default::default(),
                dest: "::/0".parse().unwrap(),
                target: RouteTarget::Drop,
                mtu: None,
            },
        },
    );
    ok(
        &mut c,
        Request::DeletePort {
            name: "opte0".into(),
            forward_to: None,
        },
    );
    let saved = store.load().unwrap();
    assert_eq!(&saved, c.state());

    let mut fresh = Controller::new(Recorder::default(), Some(store.clone()));
    fresh.restore(saved.clone(), Instant::now());
    assert_eq!(fresh.state(), &saved);
    assert_eq!(store.load().unwrap(), saved);
    assert_eq!(fresh.dataplane().ports, ["opte1"]);
    assert_eq!(fresh.dataplane().routes["opte1"].len(), 2); // default + ::/0
    assert_eq!(fresh.dataplane().v2p, saved.v2p);
    assert_eq!(fresh.dataplane().v2b.dump().to_api(), saved.v2b);
    assert_eq!(saved.v2b.len(), 1);
    assert_eq!(
        ports_applied(ok(&mut fresh, Request::ListPorts)),
        [("opte1".to_string(), true)]
    );
}

fn set_external(port: &str, external: ExternalIps) -> Request {
    Request::SetExternalIps {
        port: port.into(),
        external,
    }
}

fn snat(start: u16, end: u16) -> ExternalIps {
    ExternalIps {
        snat: Some(api::SnatRange {
            ip: "198.51.100.1".parse().unwrap(),
            start,
            end,
        }),
        ..ExternalIps::default()
    }
}

#[test]
fn external_ips_are_checked_applied_saved_and_restored() {
    let dir = tempfile::tempdir().unwrap();
    let store = StateStore::open(dir.path()).unwrap();
    let mut c = Controller::new(Recorder::default(), Some(store.clone()));
    ok(&mut c, create("opte0", 5));
    ok(&mut c, create("opte1", 6));
    let mine = ExternalIps {
        floating: vec!["192.0.2.5".parse().unwrap()],
        ..snat(1024, 2047)
    };
    ok(&mut c, set_external("opte0", mine.clone()));
    // Ranges on the same SNAT IP may not share a port; other values are named.
    let e = err(&mut c, set_external("opte1", snat(2000, 3000)));
    assert!(
        e.message.contains("2000") && e.message.contains("opte0"),
        "{e}"
    );
    let e = err(&mut c, set_external("opte1", snat(80, 100)));
    assert!(e.message.contains("80"), "{e}");
    let e = err(&mut c, set_external("opte1", snat(3000, 2048)));
    assert!(e.message.contains("3000-2048"), "{e}");
    let taken = ExternalIps {
        ephemeral: Some("192.0.2.5".parse().unwrap()),
        ..ExternalIps::default()
    };
    let e = err(&mut c, set_external("opte1", taken));
    assert!(
        e.message.contains("192.0.2.5") && e.message.contains("opte0"),
        "{e}"
    );
    let e = err(&mut c, set_external("nope", snat(2048, 4095)));
    assert!(e.message.contains("nope"), "{e}");
    // So is a new port's overlapping range.
    let mut clash = sample_port("opte2", 7);
    clash.external = snat(1500, 1600);
    let e = err(
        &mut c,
        Request::CreatePort(Box::new(PortInfo {
            config: clash,
            netns: None,
            vhost_user: None,
            attach: None,
        })),
    );
    assert!(
        e.message.contains("1500") && e.message.contains("opte0"),
        "{e}"
    );
    ok(&mut c, set_external("opte1", snat(2048, 4095)));
    assert!(c
        .dataplane()
        .log
        .contains(&"set_external_ips opte1".to_string()));
    // Saved with the port, and back after a restart.
    let saved = store.load().unwrap();
    assert_eq!(saved.ports[0].config.external, mine);
    assert_eq!(saved.ports[1].config.external, snat(2048, 4095));
    let mut fresh = Controller::new(Recorder::default(), Some(store));
    fresh.restore(saved.clone(), Instant::now());
    assert_eq!(fresh.state(), &saved);
}

#[test]
fn route_classes_are_separate_tables_of_one_port() {
    let mut c = Controller::new(Recorder::default(), None);
    ok(&mut c, create("opte0", 5));
    let route = |class| Request::AddRouterEntry {
        port: "opte0".into(),
        entry: RouteEntry {
            dest: "10.8.0.0/16".parse().unwrap(),
            target: RouteTarget::Drop,
            mtu: None,
            class,
        },
    };
    ok(&mut c, route(RouteClass::System));
    ok(&mut c, route(RouteClass::Custom));
    let e = err(&mut c, route(RouteClass::Custom));
    assert!(
        e.message.contains("custom") && e.message.contains("10.8.0.0/16"),
        "{e}"
    );
    let del = |class| Request::DelRouterEntry {
        port: "opte0".into(),
        dest: "10.8.0.0/16".parse().unwrap(),
        class,
    };
    ok(&mut c, del(RouteClass::Custom));
    let e = err(&mut c, del(RouteClass::Custom));
    assert!(e.message.contains("no custom route to 10.8.0.0/16"), "{e}");
    let left: Vec<RouteClass> = c.state().routes["opte0"]
        .iter()
        .filter(|r| r.dest.to_string() == "10.8.0.0/16")
        .map(|r| r.class)
        .collect();
    assert_eq!(left, [RouteClass::System]);
}

fn cidr(allow: bool, port: &str, prefix: &str, dir: CidrDir) -> Request {
    let (port, prefix) = (port.to_string(), prefix.parse().unwrap());
    if allow {
        Request::AllowCidr {
            port,
            prefix,
            dir,
            external: false,
        }
    } else {
        Request::RemoveCidr { port, prefix, dir }
    }
}

#[test]
fn allowed_prefixes_are_checked_applied_saved_and_restored() {
    let dir = tempfile::tempdir().unwrap();
    let store = StateStore::open(dir.path()).unwrap();
    let mut c = Controller::new(Recorder::default(), Some(store.clone()));
    ok(&mut c, create("opte0", 5));
    ok(
        &mut c,
        cidr(true, "opte0", "192.168.50.0/24", CidrDir::Both),
    );
    ok(&mut c, cidr(true, "opte0", "10.9.0.0/16", CidrDir::Out));
    let external = |dir| Request::AllowCidr {
        port: "opte0".into(),
        prefix: "203.0.113.0/24".parse().unwrap(),
        dir,
        external: true,
    };
    ok(&mut c, external(CidrDir::Both));
    for (r, named) in [
        (external(CidrDir::Both), "203.0.113.0/24"),
        (external(CidrDir::In), "203.0.113.0/24"),
        (
            cidr(false, "opte0", "203.0.113.0/24", CidrDir::In),
            "203.0.113.0/24",
        ),
        (
            cidr(true, "opte0", "192.168.50.0/24", CidrDir::In),
            "192.168.50.0/24",
        ),
        (
            cidr(true, "opte0", "10.9.0.1/16", CidrDir::In),
            "10.9.0.1/16",
        ),
        (
            cidr(false, "opte0", "10.9.0.0/16", CidrDir::Both),
            "10.9.0.0/16",
        ),
        (
            cidr(false, "opte0", "10.8.0.0/16", CidrDir::Out),
            "10.8.0.0/16",
        ),
        (cidr(true, "nope", "10.7.0.0/16", CidrDir::Out), "nope"),
    ] {
        let e = err(&mut c, r);
        assert!(e.message.contains(named), "{e}");
    }
    ok(&mut c, cidr(false, "opte0", "192.168.50.0/24", CidrDir::In));
    assert!(c
        .dataplane()
        .log
        .contains(&"set_port_cidrs opte0".to_string()));
    let exempt: IpNet = "203.0.113.0/24".parse().unwrap();
    let want = PortCidrs {
        inbound: vec![exempt],
        outbound: vec![
            "192.168.50.0/24".parse().unwrap(),
            "10.9.0.0/16".parse().unwrap(),
            exempt,
        ],
        external: vec![exempt],
    };
    let saved = store.load().unwrap();
    assert_eq!(saved.ports[0].config.cidrs, want);
    let mut fresh = Controller::new(Recorder::default(), Some(store));
    fresh.restore(saved.clone(), Instant::now());
    assert_eq!(fresh.state(), &saved);
}

fn fw_rule(priority: u16, proto: FwProto, ports: Vec<u16>) -> FwRule {
    FwRule {
        id: 0,
        direction: Direction::In,
        priority,
        action: FwAction::Allow,
        filters: FwFilters {
            host: FwHost::Any,
            proto,
            ports: ports.into_iter().map(FwPorts::One).collect(),
            icmp: None,
        },
    }
}

/// A saved state of two ports: opte0 in namespace g0 with only an internet
/// route (its subnet route deleted) and one rule (the defaults removed), opte1
/// with the defaults; and two V2P mappings.
fn saved_state() -> State {
    let mut c = Controller::new(Recorder::default(), None);
    ok(
        &mut c,
        Request::CreatePort(Box::new(PortInfo {
            config: sample_port("opte0", 5),
            netns: Some("g0".into()),
            vhost_user: None,
            attach: None,
        })),
    );
    ok(&mut c, create("opte1", 6));
    let igw = RouteEntry {
        class: Default::default(),
        dest: "0.0.0.0/0".parse().unwrap(),
        target: RouteTarget::Igw,
        mtu: None,
    };
    ok(
        &mut c,
        Request::AddRouterEntry {
            port: "opte0".into(),
            entry: igw,
        },
    );
    ok(
        &mut c,
        Request::DelRouterEntry {
            class: Default::default(),
            port: "opte0".into(),
            dest: "172.30.0.0/22".parse().unwrap(),
        },
    );
    ok(
        &mut c,
        Request::SetFwRules {
            port: "opte0".into(),
            rules: vec![fw_rule(10, FwProto::Tcp, vec![22])],
        },
    );
    ok(&mut c, Request::set_v2p(v2p("172.30.0.9")));
    ok(&mut c, Request::set_v2p(v2p("172.30.0.10")));
    c.state().clone()
}

/// A restored port is created with its saved routes and rules in the same
/// dataplane call: no moment with the defaults (or no rules) in between, and
/// no save until the end.
#[test]
fn restored_port_carries_its_tables_from_the_start() {
    let saved = saved_state();
    let mut c = Controller::new(Recorder::default(), None);
    c.restore(saved.clone(), Instant::now());
    assert_eq!(
        c.dataplane().log,
        [
            "add_port opte0",
            "add_port opte1",
            "set_v2p 172.30.0.9",
            "set_v2p 172.30.0.10"
        ]
    );
    let dp = c.dataplane();
    assert_eq!(dp.routes["opte0"], saved.routes["opte0"]);
    // Under the id it got when it was set (the defaults had 1 and 2).
    let rule = FwRule {
        id: 3,
        ..fw_rule(10, FwProto::Tcp, vec![22])
    };
    assert_eq!(dp.rules["opte0"], [rule]);
    assert_eq!(dp.rules["opte1"], saved.fw_rules["opte1"]);
    assert_eq!(c.state(), &saved);
}

/// A port refused at restore stays in the state, is listed with the reason,
/// refuses changes and inspection by name, is not retried before its back-off
/// and comes up with its saved tables once the dataplane takes it.
#[test]
fn refused_port_is_kept_and_applied_on_retry() {
    let saved = saved_state();
    let mut c = Controller::new(
        Recorder {
            refuse: Some("add_port"),
            ..Recorder::default()
        },
        None,
    );
    let t0 = Instant::now();
    c.restore(saved.clone(), t0);
    assert_eq!(c.state(), &saved, "nothing lost");
    assert!(c.dataplane().ports.is_empty());
    let na = not_applied(&mut c, "opte0").expect("marked");
    assert!(na.reason.ends_with("dataplane refuses add_port"), "{na:?}");
    assert_eq!(na.attempts, 1);
    assert!(na.retry_in_ms <= 1000, "{na:?}");
    let stats = control_stats(&mut c);
    assert_eq!(stats["not_applied"]["ports"][1]["name"], "opte1");
    assert_eq!(
        stats["not_applied"]["ports"][0]["not_applied"]["reason"],
        na.reason.as_str()
    );
    let Reply::Inspect(one) = ok(
        &mut c,
        Request::Stats {
            port: Some("opte0".into()),
        },
    ) else {
        panic!()
    };
    assert_eq!(one["not_applied"]["attempts"], 1);
    let e = err(
        &mut c,
        Request::Mtu {
            port: "opte0".into(),
        },
    );
    assert!(
        e.message.contains("not applied") && e.message.contains("refuses add_port"),
        "{e}"
    );
    let e = err(
        &mut c,
        Request::AddFwRule {
            port: "opte0".into(),
            rule: fw_rule(20, FwProto::Udp, vec![53]),
        },
    );
    assert!(
        e.message.contains("opte0") && e.message.contains("not applied"),
        "{e}"
    );
    // Saved tables can still be read.
    assert_eq!(
        ok(
            &mut c,
            Request::DumpRoutes {
                port: "opte0".into()
            }
        ),
        Reply::Routes(saved.routes["opte0"].clone())
    );

    let tries = |c: &Controller<Recorder>| {
        c.dataplane()
            .log
            .iter()
            .filter(|l| l.starts_with("add_port"))
            .count()
    };
    assert_eq!(tries(&c), 2);
    c.retry_due(t0 + Duration::from_millis(900));
    assert_eq!(tries(&c), 2, "retried before its back-off");
    c.retry_due(t0 + Duration::from_secs(1));
    assert_eq!(tries(&c), 4);
    assert_eq!(not_applied(&mut c, "opte0").unwrap().attempts, 2);

    c.dataplane_mut().refuse = None;
    let t1 = t0 + Duration::from_secs(3);
    c.retry_due(t1);
    assert_eq!(c.dataplane().ports, ["opte0", "opte1"]);
    assert_eq!(not_applied(&mut c, "opte0"), None);
    assert_eq!(c.dataplane().rules["opte0"], saved.fw_rules["opte0"]);
    assert_eq!(c.dataplane().routes["opte0"], saved.routes["opte0"]);
    assert_eq!(control_stats(&mut c)["not_applied"]["ports"], json!([]));
    ok(
        &mut c,
        Request::Mtu {
            port: "opte0".into(),
        },
    );
    // Nothing left to do: later rounds try nothing.
    c.retry_due(t1 + Duration::from_secs(120));
    assert_eq!(tries(&c), 6);
}

/// A port refused because its namespace was missing is tried again as soon as
/// the namespace exists, long before its back-off runs out.
#[test]
fn port_is_retried_when_its_netns_appears() {
    let missing = Missing::default();
    missing.lock().unwrap().insert("g0".into());
    let mut c = with_missing(&missing, None);
    let t0 = Instant::now();
    c.restore(saved_state(), t0);
    assert_eq!(c.dataplane().ports, ["opte1"]);
    let na = not_applied(&mut c, "opte0").unwrap();
    assert!(na.reason.contains("network namespace \"g0\""), "{na:?}");
    c.retry_due(t0 + Duration::from_millis(100));
    assert_eq!(c.dataplane().ports, ["opte1"], "namespace still missing");
    missing.lock().unwrap().clear();
    c.retry_due(t0 + Duration::from_millis(200));
    assert_eq!(c.dataplane().ports, ["opte1", "opte0"]);
    assert_eq!(not_applied(&mut c, "opte0"), None);
}

/// A port that is not applied can be deleted: it leaves the state without the
/// dataplane being asked, and its name is free again.
#[test]
fn unapplied_port_can_be_deleted() {
    let missing = Missing::default();
    missing.lock().unwrap().insert("g0".into());
    let mut c = with_missing(&missing, None);
    c.restore(saved_state(), Instant::now());
    ok(
        &mut c,
        Request::DeletePort {
            name: "opte0".into(),
            forward_to: None,
        },
    );
    assert!(!c
        .dataplane()
        .log
        .iter()
        .any(|l| l.starts_with("remove_port")));
    assert_eq!(
        ports_applied(ok(&mut c, Request::ListPorts)),
        [("opte1".to_string(), true)]
    );
    assert!(!c.state().fw_rules.contains_key("opte0"));
    assert!(!c.state().routes.contains_key("opte0"));
    ok(&mut c, create("opte0", 5));
    c.retry_due(Instant::now() + Duration::from_secs(3600));
    assert_eq!(c.dataplane().ports, ["opte1", "opte0"]);
}

/// V2P mappings the dataplane refuses at restore are kept, counted in stats
/// and applied later; one that could never be applied is set aside alone
/// instead of failing the batch.
#[test]
fn refused_v2p_is_kept_and_retried() {
    let mut saved = saved_state();
    let mut bad = v2p("224.0.0.9");
    bad.vni = Vni::new(7).unwrap();
    saved.v2p.push(bad);
    let mut c = Controller::new(
        Recorder {
            refuse: Some("set_v2p"),
            ..Recorder::default()
        },
        None,
    );
    let t0 = Instant::now();
    c.restore(saved.clone(), t0);
    assert_eq!(c.state(), &saved);
    assert_eq!(control_stats(&mut c)["not_applied"]["v2p_count"], 3);
    assert_eq!(
        ok(&mut c, Request::DumpV2p),
        Reply::V2p(saved.v2p.iter().copied().map(local).collect())
    );

    // Setting one by hand applies it (and it is no longer marked).
    c.dataplane_mut().refuse = None;
    ok(&mut c, Request::set_v2p(v2p("172.30.0.9")));
    assert_eq!(control_stats(&mut c)["not_applied"]["v2p_count"], 2);
    c.retry_due(t0 + Duration::from_secs(1));
    assert_eq!(c.dataplane().v2p, [v2p("172.30.0.9"), v2p("172.30.0.10")]);
    let stats = control_stats(&mut c);
    assert_eq!(stats["not_applied"]["v2p_count"], 1);
    let reason = stats["not_applied"]["v2p"][0]["not_applied"]["reason"]
        .as_str()
        .unwrap();
    assert!(reason.contains("224.0.0.9"), "{reason}");
    // Clearing the one that cannot be applied touches only the state.
    ok(
        &mut c,
        Request::ClearV2p {
            vpc_ip: bad.vpc_ip,
            vni: bad.vni,
            expect: None,
        },
    );
    assert!(!c.dataplane().log.iter().any(|l| l.starts_with("clear_v2p")));
    assert_eq!(control_stats(&mut c)["not_applied"]["v2p_count"], 0);
}

/// When the state cannot be written at start, the restored dataplane stays as
/// restored (nothing undone), the failure is shown by stats, and changes are
/// refused without changing anything.
#[test]
fn unwritable_state_dir_does_not_undo_the_restore() {
    let dir = tempfile::tempdir().unwrap();
    let store = StateStore::open(dir.path()).unwrap();
    let saved = saved_state();
    store.save(&saved).unwrap();
    // The temporary file's name taken by a directory: every save fails.
    std::fs::create_dir(dir.path().join("state.json.tmp")).unwrap();
    let mut c = Controller::new(Recorder::default(), Some(store.clone()));
    c.restore(store.load().unwrap(), Instant::now());
    assert_eq!(c.dataplane().ports, ["opte0", "opte1"]);
    assert_eq!(c.state(), &saved);
    let e = control_stats(&mut c)["state"]["save_error"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(e.contains("state.json"), "{e}");
    let e = err(&mut c, create("opte2", 7));
    assert!(e.message.contains("change undone"), "{e}");
    assert_eq!(store.load().unwrap(), saved, "file untouched");
    // Writable again: the next change goes through and the error clears.
    std::fs::remove_dir(dir.path().join("state.json.tmp")).unwrap();
    ok(&mut c, create("opte2", 7));
    assert!(control_stats(&mut c)["state"]["save_error"].is_null());
}

#[test]
fn failed_save_undoes_the_change() {
    let dir = tempfile::tempdir().unwrap();
    let store = StateStore::open(&dir.path().join("s")).unwrap();
    let mut c = Controller::new(Recorder::default(), Some(store));
    ok(&mut c, create("opte0", 5));
    // Make the state directory unwritable by replacing it with a file.
    std::fs::remove_dir_all(dir.path().join("s")).unwrap();
    std::fs::write(dir.path().join("s"), b"").unwrap();
    let e = err(&mut c, create("opte1", 6));
    assert!(e.message.contains("change undone"), "{e}");
    assert_eq!(c.dataplane().ports, ["opte0"]);
}

/// A controller of sled `sled1` in a fleet, its watcher's commands kept.
fn in_fleet(
    store: Option<StateStore>,
) -> (
    Controller<Recorder>,
    tokio::sync::mpsc::UnboundedReceiver<FleetCommand>,
) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let mut c = Controller::new(Recorder::default(), store);
    c.join_fleet(
        "sled1".parse().unwrap(),
        FleetLayer::default(),
        tx,
        SharedView::default(),
    );
    (c, rx)
}

fn put(key: &str, value: &str, mod_revision: i64) -> Change {
    Change {
        key: key.into(),
        value: Some(value.as_bytes().to_vec()),
        mod_revision,
    }
}

fn del(key: &str, mod_revision: i64) -> Change {
    Change {
        key: key.into(),
        value: None,
        mod_revision,
    }
}

/// VPC 1701's prefix, where the tests' mappings live.
fn vpc1701() -> String {
    api::fleet::vpc_prefix(Vni::new(1701).unwrap())
}

/// Events of VPC 1701's prefix that leave it at `revision`.
fn events(revision: i64, changes: Vec<Change>) -> FleetBatch {
    FleetBatch {
        cluster_id: 7,
        changes,
        positions: Positions::from([(vpc1701(), revision)]),
        full_read: false,
    }
}

const K9: &str = "/overlay/v1/vpc/1701/v2p/172.30.0.9";
const K10: &str = "/overlay/v1/vpc/1701/v2p/172.30.0.10";
const AT_B: &str = r#"{"mac":"a8:40:25:ff:00:09","underlay":"fd00:99::2"}"#;
const AT_C: &str = r#"{"mac":"a8:40:25:ff:00:09","underlay":"fd00:99::3"}"#;

fn fleet_of(c: &mut Controller<Recorder>) -> api::fleet::FleetStatus {
    let Reply::Fleet(s) = ok(c, Request::FleetStatus) else {
        panic!("no fleet status")
    };
    *s
}

/// Mappings from the store reach the dataplane, deletes take them out, a bad value
/// is refused alone, once per revision, and named.
#[test]
fn fleet_mappings_apply_and_bad_values_are_refused_by_key() {
    let (mut c, mut watcher) = in_fleet(None);
    ok(&mut c, create("opte0", 5));
    assert_eq!(
        watcher.try_recv(),
        Ok(FleetCommand::Vnis([Vni::new(1701).unwrap()].into()))
    );
    let bad = r#"{"mac":"a8:40:25:ff:00:0a","underlay":"ff02::1"}"#;
    c.apply_fleet(events(5, vec![put(K9, AT_B, 4), put(K10, bad, 5)]));
    assert_eq!(c.dataplane().v2p, [v2p("172.30.0.9")]);
    let s = fleet_of(&mut c);
    assert_eq!((s.revision, s.entries.v2p), (5, 1));
    assert_eq!(s.refused.len(), 1);
    assert_eq!(s.refused[0].key, K10);
    assert_eq!(s.refused[0].reason, "underlay_address");
    assert!(s.refused[0].message.contains("ff02::1"), "{:?}", s.refused);
    // The same revision again (a replay after a reconnect) is not tried again.
    c.dataplane_mut().log.clear();
    c.apply_fleet(events(5, vec![put(K10, bad, 5)]));
    let stats = control_stats(&mut c);
    assert_eq!(stats["fleet"]["refused"]["underlay_address"], 1);
    // A good value of the key later applies and clears the refusal.
    c.apply_fleet(events(7, vec![put(K10, AT_C, 7), del(K9, 6)]));
    let held: Vec<String> = c
        .dataplane()
        .v2p
        .iter()
        .map(|e| e.vpc_ip.to_string())
        .collect();
    assert_eq!(held, ["172.30.0.10"]);
    assert!(fleet_of(&mut c).refused.is_empty());
    // dump-v2p shows where each mapping comes from.
    let Reply::V2p(records) = ok(&mut c, Request::DumpV2p) else {
        panic!()
    };
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].source, api::Source::Fleet);
}

/// A local mapping of an address the fleet maps needs --override-fleet, wins while
/// it exists, and uncovers the fleet's when cleared; the fleet's alone cannot be
/// cleared locally.
#[test]
fn local_mappings_override_the_fleet_only_when_asked() {
    let (mut c, _w) = in_fleet(None);
    ok(&mut c, create("opte0", 5));
    c.apply_fleet(events(3, vec![put(K9, AT_B, 3)]));
    let local = V2pEntry {
        underlay_ip: "fd00:99::4".parse().unwrap(),
        ..v2p("172.30.0.9")
    };
    let e = err(&mut c, Request::set_v2p(local));
    assert_eq!(e.code, ErrorCode::Conflict);
    assert!(e.message.contains(K9), "{e}");
    ok(
        &mut c,
        Request::SetV2p {
            entry: local,
            override_fleet: true,
        },
    );
    assert_eq!(c.dataplane().v2p, [local]);
    // A change from the store meanwhile is kept, not applied over the local one.
    c.apply_fleet(events(4, vec![put(K9, AT_C, 4)]));
    assert_eq!(c.dataplane().v2p, [local]);
    let Reply::V2p(records) = ok(&mut c, Request::DumpV2p) else {
        panic!()
    };
    assert!(records
        .iter()
        .any(|r| r.source == api::Source::Fleet && r.overridden));
    ok(
        &mut c,
        Request::ClearV2p {
            vpc_ip: local.vpc_ip,
            vni: local.vni,
            expect: None,
        },
    );
    let fleets = V2pEntry {
        underlay_ip: "fd00:99::3".parse().unwrap(),
        ..v2p("172.30.0.9")
    };
    assert_eq!(c.dataplane().v2p, [fleets]);
    let e = err(
        &mut c,
        Request::ClearV2p {
            vpc_ip: local.vpc_ip,
            vni: local.vni,
            expect: None,
        },
    );
    assert_eq!(e.code, ErrorCode::Conflict);
}

/// A full read deletes what it lacks under the prefixes it covers, and only
/// there; an empty store of another cluster is not obeyed until adopted.
#[test]
fn full_reads_delete_what_is_gone_and_an_empty_new_cluster_waits_for_adopt() {
    let (mut c, mut watcher) = in_fleet(None);
    ok(&mut c, create("opte0", 5));
    let v2b = "/overlay/v1/v2b/0.0.0.0/0";
    c.apply_fleet(events(
        3,
        vec![
            put(K9, AT_B, 2),
            put(K10, AT_B, 3),
            put(v2b, r#"{"endpoints":["fd00:99::b1"]}"#, 3),
        ],
    ));
    let vpc = vpc1701();
    c.apply_fleet(FleetBatch {
        cluster_id: 7,
        changes: vec![put(K10, AT_B, 3)],
        positions: Positions::from([(vpc.clone(), 9)]),
        full_read: true,
    });
    let s = fleet_of(&mut c);
    assert_eq!((s.revision, s.entries.v2p, s.entries.v2b), (9, 1, 1));
    assert_eq!(c.dataplane().v2p, [v2p("172.30.0.10")]);
    // A wiped store (another cluster, nothing in it): held, counted, shown.
    let wiped = |cluster_id| FleetBatch {
        cluster_id,
        changes: vec![],
        positions: Positions::from([(vpc.clone(), 1), (api::fleet::V2B_PREFIX.to_string(), 1)]),
        full_read: true,
    };
    c.apply_fleet(wiped(8));
    let s = fleet_of(&mut c);
    assert_eq!((s.alarms, s.entries.v2p, s.revision), (1, 1, 9));
    assert!(
        s.held.as_deref().unwrap_or("").contains("fleet adopt"),
        "{s:?}"
    );
    // Events meanwhile change nothing.
    c.apply_fleet(events(10, vec![del(K10, 10)]));
    assert_eq!(c.dataplane().v2p.len(), 1);
    // The operator adopts: a resync is asked, and the next full read is obeyed.
    while watcher.try_recv().is_ok() {}
    ok(&mut c, Request::FleetAdopt);
    assert_eq!(watcher.try_recv(), Ok(FleetCommand::Resync));
    c.apply_fleet(wiped(8));
    let s = fleet_of(&mut c);
    assert_eq!((s.entries.v2p, s.entries.v2b, s.held), (0, 0, None));
    assert!(c.dataplane().v2p.is_empty());
}

/// A port's tables from the fleet are in force while the keys exist, local edits
/// of them are refused, and the port's own come back when the keys go.
#[test]
fn fleet_managed_tables_replace_the_ports_own() {
    let (mut c, _w) = in_fleet(None);
    ok(&mut c, create("opte0", 5));
    let own = c.dataplane().routes["opte0"].clone();
    let routes_key = "/overlay/v1/sled/sled1/port/opte0/routes";
    c.apply_fleet(events(
        2,
        vec![put(
            routes_key,
            r#"[{"dest":"0.0.0.0/0","target":"igw"}]"#,
            2,
        )],
    ));
    let routes = &c.dataplane().routes["opte0"];
    assert_eq!(routes.len(), 1);
    assert_eq!(routes[0].target, RouteTarget::Igw);
    let e = err(
        &mut c,
        Request::AddRouterEntry {
            port: "opte0".into(),
            entry: RouteEntry {
                dest: "10.9.0.0/16".parse().unwrap(),
                target: RouteTarget::Drop,
                mtu: None,
                class: RouteClass::System,
            },
        },
    );
    assert_eq!(e.code, ErrorCode::Conflict);
    assert!(e.message.contains(routes_key), "{e}");
    c.apply_fleet(events(3, vec![del(routes_key, 3)]));
    assert_eq!(c.dataplane().routes["opte0"], own);
}

/// The fleet layer is saved with its positions and restored before anything is
/// asked of the store: a restart forwards on it at once, and resumes each prefix
/// from where it was.
#[test]
fn the_fleet_layer_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let store = StateStore::open(dir.path()).unwrap();
    let (mut c, _w) = in_fleet(Some(store.clone()));
    ok(&mut c, create("opte0", 5));
    c.apply_fleet(events(12, vec![put(K9, AT_B, 12)]));
    let saved = store.load().unwrap();
    let layer = store.load_fleet().unwrap();
    assert_eq!(layer.position(), (Positions::from([(vpc1701(), 12)]), 7));
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let mut fresh = Controller::new(Recorder::default(), Some(store));
    fresh.join_fleet("sled1".parse().unwrap(), layer, tx, SharedView::default());
    fresh.restore(saved, Instant::now());
    let s = fleet_of(&mut fresh);
    assert_eq!((s.revision, s.cluster_id), (12, 7));
    assert_eq!(fresh.dataplane().v2p, [v2p("172.30.0.9")]);
}

/// Saving the whole layer is not done for every batch: changed entries wait up to
/// a second, moved positions alone up to a minute, and a clean stop saves what is
/// left.
#[test]
fn the_fleet_layer_is_saved_at_a_bounded_rate() {
    let dir = tempfile::tempdir().unwrap();
    let store = StateStore::open(dir.path()).unwrap();
    let (mut c, _w) = in_fleet(Some(store.clone()));
    ok(&mut c, create("opte0", 5));
    let saved_at = |store: &StateStore| store.load_fleet().unwrap().revision();
    c.apply_fleet(events(3, vec![put(K9, AT_B, 3)]));
    assert_eq!(saved_at(&store), 3, "the first batch is saved at once");
    c.apply_fleet(events(4, vec![put(K10, AT_B, 4)]));
    assert_eq!(saved_at(&store), 3);
    let now = Instant::now();
    c.save_fleet_due(now + Duration::from_millis(1100));
    assert_eq!(saved_at(&store), 4);
    // Progress alone: a minute.
    c.apply_fleet(events(9, vec![]));
    c.save_fleet_due(now + Duration::from_secs(30));
    assert_eq!(saved_at(&store), 4);
    c.save_fleet_due(now + Duration::from_secs(62));
    assert_eq!(saved_at(&store), 9);
    c.apply_fleet(events(11, vec![]));
    c.flush_fleet();
    assert_eq!(saved_at(&store), 11);
}

fn export_of(c: &mut Controller<Recorder>, port: &str) -> api::PortExport {
    match ok(c, Request::ExportPort { port: port.into() }) {
        Reply::PortExport(e) => *e,
        other => panic!("not an export: {other:?}"),
    }
}

fn import(export: api::PortExport) -> Request {
    Request::ImportPort(Box::new(api::PortImport {
        export,
        netns: Some("g9".into()),
        attach: None,
        vhost_user: None,
    }))
}

/// One UDP connection of port opte0 (sample_port's address 5), as the engine
/// exports it.
fn one_connection() -> LiveState {
    serde_json::from_value(json!({
        "connections": [{
            "key": {"vni": 1701, "proto": 17, "src_ip": "172.30.0.5", "dst_ip": "172.30.0.6",
                    "src_port": 5000, "dst_port": 53, "icmp_type": 0, "icmp_code": 0},
            "initiator": "out", "replied": true, "age_ns": 9, "idle_ns": 1,
            "out": {"packets": 1, "bytes": 60}, "in": {"packets": 1, "bytes": 80}
        }]
    }))
    .unwrap()
}

/// A port exported by one controller (paused there) is made by another with its
/// tables, rule ids and flows, paused and attached where the import says.
#[test]
fn a_port_moves_with_its_tables_and_flows_and_arrives_paused() {
    let mut a = Controller::new(Recorder::default(), None);
    ok(&mut a, create("opte0", 5));
    let rule = fw_rule(10, FwProto::Tcp, vec![22]);
    ok(
        &mut a,
        Request::AddFwRule {
            port: "opte0".into(),
            rule,
        },
    );
    let drop = RouteEntry {
        class: RouteClass::System,
        dest: "10.9.0.0/16".parse().unwrap(),
        target: RouteTarget::Drop,
        mtu: None,
    };
    ok(
        &mut a,
        Request::AddRouterEntry {
            port: "opte0".into(),
            entry: drop,
        },
    );
    a.dataplane_mut()
        .live
        .insert("opte0".into(), one_connection());
    let e = export_of(&mut a, "opte0");
    assert!(
        a.state().paused.contains("opte0"),
        "the exporting sled pauses it"
    );
    assert_eq!(e.fw_rules, a.state().fw_rules["opte0"]);
    assert_eq!(e.routes, a.state().routes["opte0"]);

    let mut b = Controller::new(Recorder::default(), None);
    ok(&mut b, create("opte1", 6));
    let r = ok(&mut b, import(e.clone()));
    assert_eq!(
        r,
        Reply::Imported {
            connections: 1,
            snat_ports: 0
        }
    );
    let s = b.state();
    assert!(s.paused.contains("opte0"));
    assert_eq!(s.fw_rules["opte0"], e.fw_rules, "rules keep their ids");
    assert_eq!(s.routes["opte0"], e.routes);
    assert_eq!(s.fw_next_id["opte0"], e.fw_next_id);
    let port = s.ports.iter().find(|p| p.config.name == "opte0").unwrap();
    assert_eq!(
        (port.netns.as_deref(), &port.config),
        (Some("g9"), &e.port.config)
    );
    assert_eq!(b.dataplane().live["opte0"], one_connection());
    assert!(b.dataplane().paused.contains("opte0"));
    // A second time, the name (and the MAC and addresses) are taken.
    let r = err(&mut b, import(e));
    assert!(r.message.contains("opte0"), "{r}");
}

/// An import that cannot be the port's, or that the dataplane refuses, changes
/// nothing and says why; so does an export the dataplane cannot make (the port
/// is not left paused).
#[test]
fn a_refused_move_changes_nothing_and_says_why() {
    let mut a = Controller::new(Recorder::default(), None);
    ok(&mut a, create("opte0", 5));
    let e = export_of(&mut a, "opte0");
    let mut b = Controller::new(Recorder::default(), None);
    let refused = |b: &mut Controller<Recorder>, change: &dyn Fn(&mut api::PortExport)| {
        let mut x = e.clone();
        change(&mut x);
        err(b, import(x)).message
    };
    let m = refused(&mut b, &|x| x.format = 2);
    assert!(m.contains("format 2") && m.contains("format 1"), "{m}");
    let m = refused(&mut b, &|x| x.kind = "pcap".into());
    assert!(m.contains("\"pcap\""), "{m}");
    let m = refused(&mut b, &|x| x.live = json!({"connections": "none"}));
    assert!(m.contains("live state is unreadable"), "{m}");
    let m = refused(&mut b, &|x| {
        let mut twice = x.fw_rules[0].clone();
        twice.priority += 1;
        x.fw_rules.push(twice);
    });
    assert!(m.contains("given twice"), "{m}");
    let m = refused(&mut b, &|x| x.fw_next_id = u64::MAX);
    assert!(m.contains("out of range"), "{m}");
    let m = refused(&mut b, &|x| x.routes.push(x.routes[0]));
    assert!(m.contains("already has"), "{m}");
    let mut b = Controller::new(
        Recorder {
            refuse: Some("import_live"),
            ..Recorder::default()
        },
        None,
    );
    let m = err(&mut b, import(e.clone())).message;
    assert!(m.contains("import_live"), "{m}");
    assert!(b.dataplane().ports.is_empty());

    let mut c = Controller::new(
        Recorder {
            refuse: Some("export_live"),
            ..Recorder::default()
        },
        None,
    );
    ok(&mut c, create("opte0", 5));
    err(
        &mut c,
        Request::ExportPort {
            port: "opte0".into(),
        },
    );
    assert!(!c.dataplane().paused.contains("opte0"));
}

/// `delete-xde --forward-to`: the port goes and its guest's frames are relayed
/// to the named sled; a refused relay leaves the port as it was, untouched.
#[test]
fn a_port_deleted_for_a_move_has_its_guest_relayed() {
    let mut c = Controller::new(Recorder::default(), None);
    ok(&mut c, create("opte0", 5));
    c.dataplane_mut().refuse = Some("relay_departed");
    let to: Ipv6Addr = "fd00:99::3".parse().unwrap();
    let delete = Request::DeletePort {
        name: "opte0".into(),
        forward_to: Some(to),
    };
    let e = err(&mut c, delete.clone());
    assert!(e.message.contains("relay_departed"), "{e}");
    assert!(c.dataplane().departed.is_empty());
    assert!(
        !c.dataplane()
            .log
            .iter()
            .any(|l| l.starts_with("remove_port")),
        "the port was not touched: {:?}",
        c.dataplane().log
    );
    c.dataplane_mut().refuse = None;
    ok(&mut c, delete);
    assert!(c.state().ports.is_empty());
    let port = sample_port("opte0", 5);
    assert_eq!(
        c.dataplane()
            .departed
            .get(&(port.vni.get(), port.guest_mac)),
        Some(&to)
    );
}
