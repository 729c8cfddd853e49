//! Request handling: checks each API request, applies it to the dataplane, records it
//! in the persisted state, and answers.
//!
//! The rule every verb follows: a refused request changes nothing. Requests are first
//! checked against the current state (unknown port, duplicate entry), then applied to
//! the dataplane (which may refuse too: the engine checks e.g. the port MTU against
//! the underlay), and only then recorded and saved. When saving fails the dataplane
//! change is undone, so the running daemon never holds configuration that would be
//! lost on restart.

use crate::api::{
    CreatePort, Direction, FwAction, FwFilters, FwHost, FwProto, FwRule, Outcome, PortInfo, Reply,
    Request, RouteEntry, V2pEntry,
};
use crate::state::{State, StateStore};
use engine::{PortConfig, Vni};
use ipnet::IpNet;
use std::net::IpAddr;

/// Engine-produced inspection a request can ask for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Inspect {
    Layer { port: String, layer: String },
    Uft { port: String },
    Stats { port: Option<String> },
    Mtu { port: String },
    Ra { port: String },
}

/// What the controller needs from the running datapath (engine, and taps when I/O is
/// on). Tables are handed over whole (routes, firewall rules of one port), so the
/// controller alone decides list semantics and the dataplane replaces atomically.
/// The routing table of a port includes the routes the engine gives a new port, so
/// the persisted table records deletions of those too.
/// Every method either applies completely or refuses with a message naming the bad
/// value and changes nothing.
pub trait Dataplane {
    fn add_port(&mut self, port: &PortInfo) -> Result<(), String>;
    fn remove_port(&mut self, name: &str) -> Result<(), String>;
    fn set_v2p(&mut self, entry: &V2pEntry) -> Result<(), String>;
    fn clear_v2p(&mut self, vpc_ip: IpAddr, vni: Vni) -> Result<(), String>;
    /// Makes the port's routing table exactly `routes`.
    fn set_routes(&mut self, port: &str, routes: &[RouteEntry]) -> Result<(), String>;
    /// The port's routing table, including the routes a new port starts with.
    fn routes(&self, port: &str) -> Result<Vec<RouteEntry>, String>;
    fn set_fw_rules(&mut self, port: &str, rules: &[FwRule]) -> Result<(), String>;
    fn clear_uft(&mut self, port: &str) -> Result<(), String>;
    fn inspect(&mut self, what: &Inspect) -> Result<serde_json::Value, String>;
}

/// The state of the control plane and the dataplane it drives.
pub struct Controller<D: Dataplane> {
    dp: D,
    state: State,
    /// Absent in tests that do not persist.
    store: Option<StateStore>,
}

/// The firewall a new port starts with, like a VPC's default rules: traffic from the
/// port's own VPC subnets may come in (the engine itself denies unsolicited inbound
/// traffic; outbound is allowed and its replies are tracked). Operators replace these
/// with `set-fw-rules` like any other rule.
fn default_vpc_rules(cfg: &PortConfig) -> Vec<FwRule> {
    let subnets = [
        cfg.vpc_subnet4.map(IpNet::V4),
        cfg.vpc_subnet6.map(IpNet::V6),
    ];
    subnets
        .into_iter()
        .flatten()
        .map(|net| FwRule {
            direction: Direction::In,
            priority: DEFAULT_VPC_RULE_PRIORITY,
            action: FwAction::Allow,
            filters: FwFilters {
                host: FwHost::Subnet(net),
                proto: FwProto::Any,
                ports: vec![],
            },
        })
        .collect()
}

/// Priority of the default rules: after anything an operator is likely to add.
const DEFAULT_VPC_RULE_PRIORITY: u16 = 65534;

impl<D: Dataplane> Controller<D> {
    pub fn new(dp: D, store: Option<StateStore>) -> Self {
        Controller {
            dp,
            state: State::default(),
            store,
        }
    }

    pub fn dataplane(&self) -> &D {
        &self.dp
    }

    pub fn dataplane_mut(&mut self) -> &mut D {
        &mut self.dp
    }

    pub fn state(&self) -> &State {
        &self.state
    }

    /// Replays a saved state through the normal request path. Items the dataplane
    /// refuses now (a namespace that is gone, an MTU the underlay no longer carries)
    /// are logged and left out; the rest is restored. Returns the refusals.
    pub fn restore(&mut self, saved: State) -> Vec<String> {
        let mut refused = Vec::new();
        let mut note = |what: &str, r: Result<Reply, String>| {
            if let Err(e) = r {
                tracing::error!(error = %e, "{what} not restored");
                refused.push(e);
            }
        };
        for port in saved.ports {
            let r = self.create_port(CreatePort {
                config: port.config,
                netns: port.netns,
            });
            note("port", r);
        }
        for entry in saved.v2p {
            let r = self.set_v2p(entry);
            note("V2P mapping", r);
        }
        for (port, routes) in saved.routes {
            let r = self
                .port(&port)
                .map(|_| ())
                .and_then(|()| self.replace_routes(&port, routes));
            note("routing table", r);
        }
        for (port, rules) in saved.fw_rules {
            let r = self.set_fw_rules(&port, rules);
            note("firewall rules", r);
        }
        refused
    }

    /// Handles one request.
    pub fn handle(&mut self, req: Request) -> Outcome {
        match self.apply(req) {
            Ok(r) => Outcome::Ok(r),
            Err(e) => Outcome::Error(e),
        }
    }

    fn apply(&mut self, req: Request) -> Result<Reply, String> {
        match req {
            Request::CreatePort(c) => self.create_port(c),
            Request::DeletePort { name } => self.delete_port(&name),
            Request::ListPorts => Ok(Reply::Ports(self.state.ports.clone())),
            Request::SetV2p(e) => self.set_v2p(e),
            Request::ClearV2p { vpc_ip, vni } => self.clear_v2p(vpc_ip, vni),
            Request::DumpV2p => Ok(Reply::V2p(self.state.v2p.clone())),
            Request::AddRouterEntry { port, entry } => self.add_route(&port, entry),
            Request::DelRouterEntry { port, dest } => self.del_route(&port, dest),
            Request::DumpRoutes { port } => {
                self.port(&port)?;
                Ok(Reply::Routes(
                    self.state.routes.get(&port).cloned().unwrap_or_default(),
                ))
            }
            Request::AddFwRule { port, rule } => self.add_fw_rule(&port, rule),
            Request::RmFwRule {
                port,
                direction,
                priority,
                filters,
            } => self.rm_fw_rule(&port, direction, priority, &filters),
            Request::SetFwRules { port, rules } => self.set_fw_rules(&port, rules),
            Request::DumpLayer { port, layer } => self.inspect(Inspect::Layer { port, layer }),
            Request::DumpUft { port } => self.inspect(Inspect::Uft { port }),
            Request::ClearUft { port } => {
                self.port(&port)?;
                self.dp.clear_uft(&port)?;
                Ok(Reply::Done)
            }
            Request::Stats { port } => self.inspect(Inspect::Stats { port }),
            Request::Mtu { port } => self.inspect(Inspect::Mtu { port }),
            Request::Ra { port } => self.inspect(Inspect::Ra { port }),
        }
    }

    fn inspect(&mut self, what: Inspect) -> Result<Reply, String> {
        let port = match &what {
            Inspect::Layer { port, .. }
            | Inspect::Uft { port }
            | Inspect::Mtu { port }
            | Inspect::Ra { port } => Some(port),
            Inspect::Stats { port } => port.as_ref(),
        };
        if let Some(p) = port {
            self.port(p)?;
        }
        self.dp.inspect(&what).map(Reply::Inspect)
    }

    fn port(&self, name: &str) -> Result<&PortInfo, String> {
        self.state
            .ports
            .iter()
            .find(|p| p.config.name == name)
            .ok_or_else(|| format!("no port named {name:?}"))
    }

    /// Saves `next` as the state; on failure runs `undo` on the dataplane and reports.
    fn commit(&mut self, next: State, undo: impl FnOnce(&mut D)) -> Result<Reply, String> {
        if let Some(store) = &self.store {
            if let Err(e) = store.save(&next) {
                undo(&mut self.dp);
                return Err(format!("change undone: {e}"));
            }
        }
        self.state = next;
        Ok(Reply::Done)
    }

    fn create_port(&mut self, c: CreatePort) -> Result<Reply, String> {
        c.config.validate()?;
        check_port_against(&self.state, &c.config)?;
        if let Some(ns) = &c.netns {
            check_netns_name(ns)?;
        }
        let info = PortInfo {
            config: c.config,
            netns: c.netns,
        };
        self.dp.add_port(&info)?;
        let name = info.config.name.clone();
        let routes = match self.dp.routes(&name) {
            Ok(r) => r,
            Err(e) => {
                let _ = self.dp.remove_port(&name);
                return Err(e);
            }
        };
        let rules = default_vpc_rules(&info.config);
        if let Err(e) = self.dp.set_fw_rules(&name, &rules) {
            let _ = self.dp.remove_port(&name);
            return Err(e);
        }
        let mut next = self.state.clone();
        next.ports.push(info);
        if !routes.is_empty() {
            next.routes.insert(name.clone(), routes);
        }
        next.fw_rules.insert(name.clone(), rules);
        self.commit(next, |dp| {
            let _ = dp.remove_port(&name);
        })
    }

    fn delete_port(&mut self, name: &str) -> Result<Reply, String> {
        let info = self.port(name)?.clone();
        let routes = self.state.routes.get(name).cloned().unwrap_or_default();
        let rules = self.state.fw_rules.get(name).cloned().unwrap_or_default();
        self.dp.remove_port(name)?;
        let mut next = self.state.clone();
        next.ports.retain(|p| p.config.name != name);
        next.routes.remove(name);
        next.fw_rules.remove(name);
        self.commit(next, |dp| {
            if dp.add_port(&info).is_ok() {
                let _ = dp.set_routes(name, &routes);
                let _ = dp.set_fw_rules(name, &rules);
            }
        })
    }

    fn set_v2p(&mut self, e: V2pEntry) -> Result<Reply, String> {
        if !e.vpc_mac.is_unicast() {
            return Err(format!("VPC MAC {} is not a unicast address", e.vpc_mac));
        }
        if e.underlay_ip.is_unspecified() || e.underlay_ip.is_multicast() {
            return Err(format!(
                "underlay address {} is not a unicast address",
                e.underlay_ip
            ));
        }
        let old = self
            .state
            .v2p
            .iter()
            .find(|o| o.vpc_ip == e.vpc_ip && o.vni == e.vni)
            .copied();
        self.dp.set_v2p(&e)?;
        let mut next = self.state.clone();
        match next
            .v2p
            .iter_mut()
            .find(|o| o.vpc_ip == e.vpc_ip && o.vni == e.vni)
        {
            Some(slot) => *slot = e,
            None => next.v2p.push(e),
        }
        self.commit(next, |dp| {
            let _ = match old {
                Some(o) => dp.set_v2p(&o),
                None => dp.clear_v2p(e.vpc_ip, e.vni),
            };
        })
    }

    fn clear_v2p(&mut self, vpc_ip: IpAddr, vni: Vni) -> Result<Reply, String> {
        let old = self
            .state
            .v2p
            .iter()
            .find(|o| o.vpc_ip == vpc_ip && o.vni == vni)
            .copied()
            .ok_or_else(|| format!("no V2P mapping for {vpc_ip} in VNI {vni}"))?;
        self.dp.clear_v2p(vpc_ip, vni)?;
        let mut next = self.state.clone();
        next.v2p.retain(|o| !(o.vpc_ip == vpc_ip && o.vni == vni));
        self.commit(next, |dp| {
            let _ = dp.set_v2p(&old);
        })
    }

    fn replace_routes(&mut self, port: &str, routes: Vec<RouteEntry>) -> Result<Reply, String> {
        let old = self.state.routes.get(port).cloned().unwrap_or_default();
        self.dp.set_routes(port, &routes)?;
        let mut next = self.state.clone();
        if routes.is_empty() {
            next.routes.remove(port);
        } else {
            next.routes.insert(port.to_string(), routes);
        }
        self.commit(next, |dp| {
            let _ = dp.set_routes(port, &old);
        })
    }

    fn add_route(&mut self, port: &str, entry: RouteEntry) -> Result<Reply, String> {
        self.port(port)?;
        if let Some(mtu) = entry.mtu {
            if mtu < engine::port::MIN_PORT_MTU {
                return Err(format!(
                    "route MTU {mtu} is below {}",
                    engine::port::MIN_PORT_MTU
                ));
            }
        }
        let mut routes = self.state.routes.get(port).cloned().unwrap_or_default();
        if routes.iter().any(|r| r.dest == entry.dest) {
            return Err(format!(
                "port {port:?} already has a route to {}; delete it first",
                entry.dest
            ));
        }
        routes.push(entry);
        self.replace_routes(port, routes)
    }

    fn del_route(&mut self, port: &str, dest: IpNet) -> Result<Reply, String> {
        self.port(port)?;
        let mut routes = self.state.routes.get(port).cloned().unwrap_or_default();
        let before = routes.len();
        routes.retain(|r| r.dest != dest);
        if routes.len() == before {
            return Err(format!("port {port:?} has no route to {dest}"));
        }
        self.replace_routes(port, routes)
    }

    fn replace_fw_rules(&mut self, port: &str, rules: Vec<FwRule>) -> Result<Reply, String> {
        let old = self.state.fw_rules.get(port).cloned().unwrap_or_default();
        self.dp.set_fw_rules(port, &rules)?;
        let mut next = self.state.clone();
        if rules.is_empty() {
            next.fw_rules.remove(port);
        } else {
            next.fw_rules.insert(port.to_string(), rules);
        }
        self.commit(next, |dp| {
            let _ = dp.set_fw_rules(port, &old);
        })
    }

    fn add_fw_rule(&mut self, port: &str, rule: FwRule) -> Result<Reply, String> {
        self.port(port)?;
        rule.filters.validate()?;
        let mut rules = self.state.fw_rules.get(port).cloned().unwrap_or_default();
        if rules
            .iter()
            .any(|r| r.same_identity(rule.direction, rule.priority, &rule.filters))
        {
            return Err(format!("port {port:?} already has the rule \"{rule}\""));
        }
        rules.push(rule);
        self.replace_fw_rules(port, rules)
    }

    fn rm_fw_rule(
        &mut self,
        port: &str,
        direction: Direction,
        priority: u16,
        filters: &FwFilters,
    ) -> Result<Reply, String> {
        self.port(port)?;
        let mut rules = self.state.fw_rules.get(port).cloned().unwrap_or_default();
        let before = rules.len();
        rules.retain(|r| !r.same_identity(direction, priority, filters));
        if rules.len() == before {
            return Err(format!(
                "port {port:?} has no {direction} rule at priority {priority} with host={} proto={}",
                filters.host, filters.proto
            ));
        }
        self.replace_fw_rules(port, rules)
    }

    fn set_fw_rules(&mut self, port: &str, rules: Vec<FwRule>) -> Result<Reply, String> {
        self.port(port)?;
        for (i, r) in rules.iter().enumerate() {
            r.filters
                .validate()
                .map_err(|e| format!("rule {i} (\"{r}\"): {e}"))?;
            if rules[..i]
                .iter()
                .any(|o| o.same_identity(r.direction, r.priority, &r.filters))
            {
                return Err(format!("rule {i} (\"{r}\") appears twice"));
            }
        }
        self.replace_fw_rules(port, rules)
    }
}

/// Refuses a new port that collides with an existing one: the same name (it names
/// the tap), or the same guest MAC in the same VPC (inbound frames are dispatched by
/// VNI and destination MAC, so two would be ambiguous).
fn check_port_against(state: &State, cfg: &PortConfig) -> Result<(), String> {
    for p in &state.ports {
        if p.config.name == cfg.name {
            return Err(format!("a port named {:?} already exists", cfg.name));
        }
        if p.config.vni == cfg.vni && p.config.guest_mac == cfg.guest_mac {
            return Err(format!(
                "guest MAC {} is already used in VNI {} by port {:?}",
                cfg.guest_mac, cfg.vni, p.config.name
            ));
        }
    }
    Ok(())
}

/// Namespace names end up in a path under /run/netns: refuse anything that could
/// leave that directory.
fn check_netns_name(ns: &str) -> Result<(), String> {
    if ns.is_empty() || ns.len() > 255 || ns.contains('/') || ns == "." || ns == ".." {
        return Err(format!("invalid network namespace name {ns:?}"));
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::api::tests::sample_port;
    use crate::api::{FwAction, FwHost, FwProto, RouteTarget};

    /// A dataplane that records what it was told and refuses on command, to check the
    /// controller's bookkeeping apart from the engine.
    #[derive(Default)]
    struct Recorder {
        ports: Vec<String>,
        v2p: Vec<V2pEntry>,
        routes: std::collections::BTreeMap<String, Vec<RouteEntry>>,
        refuse: Option<&'static str>,
    }

    impl Recorder {
        fn check(&self, op: &str) -> Result<(), String> {
            match self.refuse {
                Some(r) if r == op => Err(format!("dataplane refuses {op}")),
                _ => Ok(()),
            }
        }
    }

    impl Dataplane for Recorder {
        fn add_port(&mut self, p: &PortInfo) -> Result<(), String> {
            self.check("add_port")?;
            self.ports.push(p.config.name.clone());
            // Like the engine, a new port starts with a route to its VPC subnet.
            let subnet = RouteEntry {
                dest: IpNet::V4(p.config.vpc_subnet4.unwrap()),
                target: RouteTarget::Subnet,
                mtu: None,
            };
            self.routes.insert(p.config.name.clone(), vec![subnet]);
            Ok(())
        }
        fn remove_port(&mut self, name: &str) -> Result<(), String> {
            self.check("remove_port")?;
            self.ports.retain(|n| n != name);
            self.routes.remove(name);
            Ok(())
        }
        fn set_v2p(&mut self, e: &V2pEntry) -> Result<(), String> {
            self.check("set_v2p")?;
            self.v2p
                .retain(|o| !(o.vpc_ip == e.vpc_ip && o.vni == e.vni));
            self.v2p.push(*e);
            Ok(())
        }
        fn clear_v2p(&mut self, ip: IpAddr, vni: Vni) -> Result<(), String> {
            self.check("clear_v2p")?;
            self.v2p.retain(|o| !(o.vpc_ip == ip && o.vni == vni));
            Ok(())
        }
        fn set_routes(&mut self, port: &str, r: &[RouteEntry]) -> Result<(), String> {
            self.check("set_routes")?;
            self.routes.insert(port.into(), r.to_vec());
            Ok(())
        }
        fn routes(&self, port: &str) -> Result<Vec<RouteEntry>, String> {
            Ok(self.routes.get(port).cloned().unwrap_or_default())
        }
        fn set_fw_rules(&mut self, _: &str, _: &[FwRule]) -> Result<(), String> {
            self.check("set_fw_rules")
        }
        fn clear_uft(&mut self, _: &str) -> Result<(), String> {
            self.check("clear_uft")
        }
        fn inspect(&mut self, what: &Inspect) -> Result<serde_json::Value, String> {
            Ok(serde_json::Value::String(format!("{what:?}")))
        }
    }

    fn create(name: &str, last: u8) -> Request {
        Request::CreatePort(CreatePort {
            config: sample_port(name, last),
            netns: None,
        })
    }

    fn ok(c: &mut Controller<Recorder>, r: Request) -> Reply {
        match c.handle(r) {
            Outcome::Ok(r) => r,
            Outcome::Error(e) => panic!("refused: {e}"),
        }
    }

    fn err(c: &mut Controller<Recorder>, r: Request) -> String {
        let before = c.state().clone();
        let dp_ports = c.dataplane().ports.clone();
        let dp_routes = c.dataplane().routes.clone();
        match c.handle(r) {
            Outcome::Ok(r) => panic!("accepted: {r:?}"),
            Outcome::Error(e) => {
                assert_eq!(c.state(), &before, "a refused request changed the state");
                assert_eq!(c.dataplane().ports, dp_ports);
                assert_eq!(c.dataplane().routes, dp_routes);
                e
            }
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

    #[test]
    fn refused_requests_change_nothing() {
        let mut c = Controller::new(Recorder::default(), None);
        ok(&mut c, create("opte0", 5));
        assert!(err(&mut c, create("opte0", 6)).contains("opte0"));
        assert!(err(&mut c, create("opte1", 5)).contains("a8:40:25:ff:00:05"));
        let mut bad = sample_port("opte2", 7);
        bad.mtu = 100;
        let e = err(
            &mut c,
            Request::CreatePort(CreatePort {
                config: bad,
                netns: None,
            }),
        );
        assert!(e.contains("MTU 100"), "{e}");
        let e = err(
            &mut c,
            Request::CreatePort(CreatePort {
                config: sample_port("opte3", 8),
                netns: Some("../etc".into()),
            }),
        );
        assert!(e.contains("../etc"), "{e}");
        assert!(err(
            &mut c,
            Request::DeletePort {
                name: "nope".into()
            }
        )
        .contains("nope"));
        let e = err(
            &mut c,
            Request::ClearV2p {
                vpc_ip: "10.9.9.9".parse().unwrap(),
                vni: Vni::new(5).unwrap(),
            },
        );
        assert!(e.contains("10.9.9.9"), "{e}");
        let route = RouteEntry {
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
        assert!(e.contains("0.0.0.0/0"), "{e}");
        let e = err(
            &mut c,
            Request::AddRouterEntry {
                port: "opte0".into(),
                entry: RouteEntry {
                    mtu: Some(576),
                    dest: "10.0.0.0/8".parse().unwrap(),
                    ..route
                },
            },
        );
        assert!(e.contains("576"), "{e}");
        c.dataplane_mut().refuse = Some("set_routes");
        let e = err(
            &mut c,
            Request::DelRouterEntry {
                port: "opte0".into(),
                dest: "0.0.0.0/0".parse().unwrap(),
            },
        );
        assert!(e.contains("set_routes"), "{e}");
        c.dataplane_mut().refuse = Some("add_port");
        err(&mut c, create("opte4", 9));
    }

    #[test]
    fn v2p_set_replace_clear() {
        let mut c = Controller::new(Recorder::default(), None);
        ok(&mut c, Request::SetV2p(v2p("172.30.0.9")));
        let mut moved = v2p("172.30.0.9");
        moved.underlay_ip = "fd00:99::3".parse().unwrap();
        ok(&mut c, Request::SetV2p(moved));
        assert_eq!(ok(&mut c, Request::DumpV2p), Reply::V2p(vec![moved]));
        assert_eq!(c.dataplane().v2p, vec![moved]);
        ok(
            &mut c,
            Request::ClearV2p {
                vpc_ip: moved.vpc_ip,
                vni: moved.vni,
            },
        );
        assert_eq!(ok(&mut c, Request::DumpV2p), Reply::V2p(vec![]));
        let mut bad = v2p("172.30.0.10");
        bad.vpc_mac = wire::MacAddr::BROADCAST;
        assert!(err(&mut c, Request::SetV2p(bad)).contains("ff:ff:ff:ff:ff:ff"));
    }

    #[test]
    fn firewall_rule_bookkeeping() {
        let mut c = Controller::new(Recorder::default(), None);
        ok(&mut c, create("opte0", 5));
        let rule = FwRule {
            direction: Direction::In,
            priority: 10,
            action: FwAction::Allow,
            filters: FwFilters {
                host: FwHost::Any,
                proto: FwProto::Tcp,
                ports: vec![22],
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
        assert!(e.contains("twice"), "{e}");
        let e = err(
            &mut c,
            Request::RmFwRule {
                port: "opte0".into(),
                direction: Direction::Out,
                priority: 10,
                filters: rule.filters.clone(),
            },
        );
        assert!(e.contains("out rule at priority 10"), "{e}");
        ok(
            &mut c,
            Request::RmFwRule {
                port: "opte0".into(),
                direction: Direction::In,
                priority: 10,
                filters: rule.filters.clone(),
            },
        );
        // What is left is what the port started with.
        assert_eq!(
            c.state().fw_rules["opte0"],
            default_vpc_rules(&c.state().ports[0].config)
        );
    }

    #[test]
    fn persistence_and_restore() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open(dir.path()).unwrap();
        let mut c = Controller::new(Recorder::default(), Some(store.clone()));
        ok(&mut c, create("opte0", 5));
        ok(&mut c, create("opte1", 6));
        ok(&mut c, Request::SetV2p(v2p("172.30.0.9")));
        ok(
            &mut c,
            Request::AddRouterEntry {
                port: "opte1".into(),
                entry: RouteEntry {
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
            },
        );
        let saved = store.load().unwrap();
        assert_eq!(&saved, c.state());

        let mut fresh = Controller::new(Recorder::default(), Some(store.clone()));
        assert!(fresh.restore(saved.clone()).is_empty());
        assert_eq!(fresh.state(), &saved);
        assert_eq!(fresh.dataplane().ports, ["opte1"]);
        assert_eq!(fresh.dataplane().routes["opte1"].len(), 2); // default + ::/0

        // A port the dataplane refuses at restore is reported and left out.
        let mut picky = Controller::new(
            Recorder {
                refuse: Some("add_port"),
                ..Recorder::default()
            },
            None,
        );
        let refused = picky.restore(saved);
        assert_eq!(refused.len(), 3, "{refused:?}"); // the port, its routes, its rules
        assert!(picky.state().ports.is_empty());
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
        assert!(e.contains("change undone"), "{e}");
        assert_eq!(c.dataplane().ports, ["opte0"]);
    }
}
