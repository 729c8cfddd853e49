//! Request handling: checks each API request, applies it to the dataplane, records it
//! in the persisted state, and answers; and the restore of the saved state at start.
//!
//! The rule every verb follows: a refused request changes nothing. Requests are first
//! checked against the current state (unknown port, duplicate entry), then applied to
//! the dataplane (which may refuse too: the engine checks e.g. the port MTU against
//! the underlay), and only then recorded and saved. When saving fails the dataplane
//! change is undone, so the running daemon never holds configuration that would be
//! lost on restart.
//!
//! Restore goes the other way: the saved state is the truth and is never shortened.
//! It goes into the dataplane without being rewritten item by item; what the
//! dataplane refuses at start (a guest namespace not there yet, an underlay whose
//! MTU is still 1500) stays in the state, is shown as not applied (`list-ports`,
//! `stats`) and is tried again ([`Controller::retry_due`]).

mod unapplied;

use crate::api::{
    CreatePort, Direction, FwAction, FwFilters, FwHost, FwProto, FwRule, Outcome, PortInfo,
    PortStatus, Reply, Request, RouteEntry, V2pEntry, V2pTarget,
};
use crate::server::ApiCounters;
use crate::state::{State, StateStore};
use engine::ExternalIps;
use engine::{CidrDir, PortCidrs, PortConfig, PortLimits, PortState, RouteClass, Vni};
use engine::{V2b, V2bEntry};
use ipnet::IpNet;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;
use unapplied::Retry;

/// Engine-produced inspection a request can ask for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Inspect {
    Layer {
        port: String,
        layer: String,
    },
    Uft {
        port: String,
        cursor: Option<u64>,
        limit: Option<usize>,
    },
    Stats {
        port: Option<String>,
    },
    Mtu {
        port: String,
    },
    Ra {
        port: String,
    },
    Layers {
        port: String,
    },
    TcpFlows {
        port: String,
    },
    /// The workers' view (`xdeadm workers`).
    Workers,
    /// The V2B table in force (`dump-v2b`): the API's table plus the
    /// `--boundary-services` shorthand, which only the dataplane knows.
    V2b,
}

impl Inspect {
    /// The port inspected, if the request names one.
    fn port(&self) -> Option<&str> {
        match self {
            Inspect::Layer { port, .. }
            | Inspect::Uft { port, .. }
            | Inspect::Mtu { port }
            | Inspect::Ra { port }
            | Inspect::Layers { port }
            | Inspect::TcpFlows { port } => Some(port),
            Inspect::Stats { port } => port.as_deref(),
            Inspect::Workers | Inspect::V2b => None,
        }
    }
}

/// The tables a port is created with, in force before it carries its first frame:
/// a restored port must never run, even briefly, with rules looser than the ones
/// saved for it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortTables {
    /// The whole routing table; `None` keeps the routes the engine gives a new port.
    pub routes: Option<Vec<RouteEntry>>,
    pub fw_rules: Vec<FwRule>,
    /// Paused from the start (a port saved paused is restored paused).
    pub paused: bool,
}

/// What the controller needs from the running datapath (engine, and taps when I/O is
/// on). Tables are handed over whole (routes, firewall rules of one port), so the
/// controller alone decides list semantics and the dataplane replaces atomically.
/// The routing table of a port includes the routes the engine gives a new port, so
/// the persisted table records deletions of those too.
/// Every method either applies completely or refuses with a message naming the bad
/// value and changes nothing.
pub trait Dataplane {
    /// Creates a port with `tables` applied before its tap is opened.
    fn add_port(&mut self, port: &PortInfo, tables: &PortTables) -> Result<(), String>;
    fn remove_port(&mut self, name: &str) -> Result<(), String>;
    fn set_v2p(&mut self, entry: &V2pEntry) -> Result<(), String>;
    /// Adds mappings the dataplane does not hold yet (a restore). One call for the
    /// lot, so that a dataplane spread over workers can take 10,000 mappings in one
    /// round trip per worker instead of 10,000.
    fn add_v2p_batch(&mut self, entries: &[V2pEntry]) -> Result<(), String> {
        for (i, e) in entries.iter().enumerate() {
            if let Err(err) = self.set_v2p(e) {
                for done in &entries[..i] {
                    let _ = self.clear_v2p(done.vpc_ip, done.vni);
                }
                return Err(err);
            }
        }
        Ok(())
    }
    fn clear_v2p(&mut self, vpc_ip: IpAddr, vni: Vni) -> Result<(), String>;
    /// Makes the V2B table `table` (the dataplane adds the `--boundary-services`
    /// shorthand to it).
    fn set_v2b(&mut self, table: &V2b) -> Result<(), String>;
    /// Makes the port's routing table exactly `routes`.
    fn set_routes(&mut self, port: &str, routes: &[RouteEntry]) -> Result<(), String>;
    /// The port's routing table, including the routes a new port starts with.
    fn routes(&self, port: &str) -> Result<Vec<RouteEntry>, String>;
    fn set_fw_rules(&mut self, port: &str, rules: &[FwRule]) -> Result<(), String>;
    /// Pauses (every frame of the port dropped, its flows and rules kept) or
    /// resumes the port.
    fn set_port_paused(&mut self, port: &str, paused: bool) -> Result<(), String>;
    /// Whether the port is ready, running or paused.
    fn port_state(&self, port: &str) -> Result<PortState, String>;
    fn clear_uft(&mut self, port: &str) -> Result<(), String>;
    /// Replaces the port's external addresses (its flows are decided again).
    fn set_external_ips(&mut self, port: &str, ext: &ExternalIps) -> Result<(), String>;
    /// Replaces the port's rate limits.
    fn set_port_limits(&mut self, port: &str, limits: &PortLimits) -> Result<(), String>;
    /// Replaces the port's transit IPs and attached subnets.
    fn set_port_cidrs(&mut self, port: &str, cidrs: &PortCidrs) -> Result<(), String>;
    fn inspect(&mut self, what: &Inspect) -> Result<serde_json::Value, String>;
}

/// Says whether a network namespace of that name exists now.
type NetnsProbe = Box<dyn Fn(&str) -> bool + Send>;

/// `ip netns` keeps its namespaces as files under /run/netns.
fn netns_exists(name: &str) -> bool {
    dpio::netns::netns_path(name).is_ok_and(|p| p.exists())
}

/// How many not-applied V2P mappings `stats` lists (it counts them all).
const STATS_V2P_LISTED: usize = 32;

/// The state of the control plane and the dataplane it drives.
pub struct Controller<D: Dataplane> {
    dp: D,
    state: State,
    /// Absent in tests that do not persist.
    store: Option<StateStore>,
    /// Saved ports the dataplane does not hold, by name.
    unapplied_ports: BTreeMap<String, Retry>,
    /// Saved V2P mappings the dataplane does not hold.
    unapplied_v2p: BTreeMap<(Vni, IpAddr), Retry>,
    /// Why the last save failed; cleared by the next one that works.
    save_error: Option<String>,
    netns_exists: NetnsProbe,
    /// Reads the taps in guests' namespaces for `stats`; started on first use (a
    /// controller whose ports have no namespace never needs it).
    netns_visitor: std::sync::OnceLock<Result<dpio::netns::NetnsVisitor, String>>,
    /// The API server's counters, shown by `stats`.
    api: Option<Arc<ApiCounters>>,
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
            id: 0,
            direction: Direction::In,
            priority: DEFAULT_VPC_RULE_PRIORITY,
            action: FwAction::Allow,
            filters: FwFilters {
                host: FwHost::Subnet(net),
                proto: FwProto::Any,
                ports: vec![],
                icmp: None,
            },
        })
        .collect()
}

/// Priority of the default rules: after anything an operator is likely to add.
const DEFAULT_VPC_RULE_PRIORITY: u16 = 65534;

/// A saved port's tables as saved: the whole routing table (no entry means an empty
/// table, the engine's default routes deleted) and the firewall rules.
fn saved_tables(state: &State, port: &str) -> PortTables {
    PortTables {
        routes: Some(state.routes.get(port).cloned().unwrap_or_default()),
        fw_rules: state.fw_rules.get(port).cloned().unwrap_or_default(),
        paused: state.paused.contains(port),
    }
}

/// Records a port's table in `tables`, or forgets it when empty (the file keeps no
/// empty lists).
fn put_table<T>(tables: &mut BTreeMap<String, Vec<T>>, port: &str, table: Vec<T>) {
    if table.is_empty() {
        tables.remove(port);
    } else {
        tables.insert(port.to_string(), table);
    }
}

fn v2p_key(e: &V2pEntry) -> (Vni, IpAddr) {
    (e.vni, e.vpc_ip)
}

impl<D: Dataplane> Controller<D> {
    pub fn new(dp: D, store: Option<StateStore>) -> Self {
        Controller {
            dp,
            state: State::default(),
            store,
            unapplied_ports: BTreeMap::new(),
            unapplied_v2p: BTreeMap::new(),
            save_error: None,
            netns_exists: Box::new(netns_exists),
            netns_visitor: std::sync::OnceLock::new(),
            api: None,
        }
    }

    /// Tests decide which namespaces exist.
    #[cfg(test)]
    fn with_netns_probe(mut self, probe: impl Fn(&str) -> bool + Send + 'static) -> Self {
        self.netns_exists = Box::new(probe);
        self
    }

    /// Shows the API server's counters in `stats`.
    pub fn set_api_counters(&mut self, counters: Arc<ApiCounters>) {
        self.api = Some(counters);
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

    /// Puts a saved state into the dataplane and keeps all of it: each port with
    /// its saved routes and firewall rules in one step, then the V2P mappings in one
    /// batch. What the dataplane refuses stays in the state, marked not applied, and
    /// is retried by [`Controller::retry_due`]. Nothing is written on the way; the
    /// state is saved once at the end, and should that fail (a read-only state
    /// directory) the error is logged and shown by `stats` while the restored
    /// dataplane keeps running.
    pub fn restore(&mut self, saved: State, now: Instant) {
        self.state = saved;
        // Rules saved before rules had ids get them: their positions, the ids
        // rm-fw-rule took then.
        self.state.assign_missing_fw_rule_ids();
        let names: Vec<String> = self
            .state
            .ports
            .iter()
            .map(|p| p.config.name.clone())
            .collect();
        for name in &names {
            self.try_port(name, now);
        }
        self.try_v2p(now, |_| true);
        // A fresh dataplane holds the shorthand alone: only a saved table is news.
        // Refused only for a hand-edited file: kept in the state and logged, never
        // half applied.
        if !self.state.v2b.is_empty() {
            if let Err(e) = V2b::from_entries(&self.state.v2b)
                .map_err(|e| e.to_string())
                .and_then(|t| self.dp.set_v2b(&t))
            {
                tracing::error!(error = %e, "the saved V2B table is not applied");
            }
        }
        tracing::info!(
            ports = self.state.ports.len(),
            ports_not_applied = self.unapplied_ports.len(),
            v2p = self.state.v2p.len(),
            v2p_not_applied = self.unapplied_v2p.len(),
            "state restored"
        );
        let state = self.state.clone();
        if let Err(e) = self.save(&state) {
            tracing::error!(
                error = %e,
                "the restored state cannot be saved: the dataplane runs as restored, \
                 and every change will be refused until the state directory is writable"
            );
        }
    }

    /// Tries again the saved items whose back-off has run out, and at once a port
    /// whose network namespace has appeared since its last attempt. Cheap when
    /// nothing waits: the daemon calls it every time round its main loop.
    pub fn retry_due(&mut self, now: Instant) {
        let ports: Vec<String> = self
            .unapplied_ports
            .iter()
            .filter(|(name, r)| r.is_due(now) || r.netns_appeared(self.netns_present(name)))
            .map(|(name, _)| name.clone())
            .collect();
        for name in &ports {
            self.try_port(name, now);
        }
        let due: BTreeSet<(Vni, IpAddr)> = self
            .unapplied_v2p
            .iter()
            .filter(|(_, r)| r.is_due(now))
            .map(|(k, _)| *k)
            .collect();
        if !due.is_empty() {
            self.try_v2p(now, |e| due.contains(&v2p_key(e)));
        }
    }

    /// Whether saved port `name` goes into a namespace that exists now.
    fn netns_present(&self, name: &str) -> bool {
        self.port(name)
            .ok()
            .and_then(|p| p.netns.as_deref())
            .is_some_and(|ns| (self.netns_exists)(ns))
    }

    /// Puts saved port `name` into the dataplane with its saved tables, and records
    /// whether that worked. Its name and MAC are checked against the ports saved
    /// before it only, so of two colliding entries in a hand-edited file the first
    /// one still comes up.
    fn try_port(&mut self, name: &str, now: Instant) {
        let Some(i) = self.state.ports.iter().position(|p| p.config.name == name) else {
            self.unapplied_ports.remove(name);
            return;
        };
        let port = &self.state.ports[i];
        let result = check_port(&self.state.ports[..i], port)
            .and_then(|()| self.dp.add_port(port, &saved_tables(&self.state, name)));
        match result {
            Ok(()) => {
                if let Some(r) = self.unapplied_ports.remove(name) {
                    tracing::info!(port = name, after = r.reason(), "port applied on retry");
                }
            }
            Err(e) => {
                tracing::warn!(port = name, error = %e, "port not applied; it will be retried");
                let seen = self.netns_present(name);
                let previous = self.unapplied_ports.get(name);
                let retry = Retry::after(previous, e, now, seen);
                self.unapplied_ports.insert(name.to_string(), retry);
            }
        }
    }

    /// Puts the saved V2P mappings that `select` picks into the dataplane in one
    /// batch, and records which are not applied.
    fn try_v2p(&mut self, now: Instant, select: impl Fn(&V2pEntry) -> bool) {
        let mut batch = Vec::new();
        for e in self.state.v2p.iter().filter(|e| select(e)) {
            match validate_v2p(e) {
                Ok(()) => batch.push(*e),
                Err(reason) => {
                    let key = v2p_key(e);
                    let retry = Retry::after(self.unapplied_v2p.get(&key), reason, now, false);
                    self.unapplied_v2p.insert(key, retry);
                }
            }
        }
        if batch.is_empty() {
            return;
        }
        match self.dp.add_v2p_batch(&batch) {
            Ok(()) => {
                for e in &batch {
                    self.unapplied_v2p.remove(&v2p_key(e));
                }
            }
            Err(reason) => {
                tracing::warn!(mappings = batch.len(), error = %reason, "V2P mappings not applied; they will be retried");
                for e in &batch {
                    let key = v2p_key(e);
                    let retry =
                        Retry::after(self.unapplied_v2p.get(&key), reason.clone(), now, false);
                    self.unapplied_v2p.insert(key, retry);
                }
            }
        }
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
            Request::CreatePort(c) => self.create_port(*c),
            Request::DeletePort { name } => self.delete_port(&name),
            Request::ListPorts => Ok(Reply::Ports(self.port_statuses(Instant::now()))),
            Request::SetV2p(e) => self.set_v2p(e),
            Request::ClearV2p {
                vpc_ip,
                vni,
                expect,
            } => self.clear_v2p(vpc_ip, vni, expect),
            Request::DumpV2p => Ok(Reply::V2p(self.state.v2p.clone())),
            Request::SetV2b { prefix, endpoints } => {
                self.change_v2b(|t| t.set(prefix, &endpoints).map_err(|e| e.to_string()))
            }
            Request::ClearV2b { prefix, endpoints } => {
                self.change_v2b(|t| t.clear(prefix, &endpoints).map_err(|e| e.to_string()))
            }
            Request::DumpV2b => {
                let v = self.dp.inspect(&Inspect::V2b)?;
                let table: Vec<V2bEntry> = serde_json::from_value(v)
                    .map_err(|e| format!("the dataplane's V2B table is unreadable: {e}"))?;
                Ok(Reply::V2b(table))
            }
            Request::AddRouterEntry { port, entry } => self.add_route(&port, entry),
            Request::DelRouterEntry { port, dest, class } => self.del_route(&port, dest, class),
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
            Request::RmFwRuleId {
                port,
                direction,
                id,
            } => self.rm_fw_rule_id(&port, direction, id),
            Request::SetFwRules { port, rules } => self.set_fw_rules(&port, rules),
            Request::PausePort { port } => self.set_port_paused(&port, true),
            Request::ResumePort { port } => self.set_port_paused(&port, false),
            Request::ListFwRules { port } => {
                self.port(&port)?;
                Ok(Reply::FwRules(
                    self.state.fw_rules.get(&port).cloned().unwrap_or_default(),
                ))
            }
            Request::DumpLayer { port, layer } => self.inspect(Inspect::Layer { port, layer }),
            Request::ListLayers { port } => self.inspect(Inspect::Layers { port }),
            Request::DumpTcpFlows { port } => self.inspect(Inspect::TcpFlows { port }),
            Request::DumpUft {
                port,
                cursor,
                limit,
            } => self.inspect(Inspect::Uft {
                port,
                cursor,
                limit,
            }),
            Request::ClearUft { port } => {
                self.applied_port(&port)?;
                self.dp.clear_uft(&port)?;
                Ok(Reply::Done)
            }
            Request::SetExternalIps { port, external } => self.set_external_ips(&port, external),
            Request::SetPortLimits { port, limits } => self.set_port_limits(&port, limits),
            Request::AllowCidr { port, prefix, dir } => self.change_cidrs(&port, prefix, dir, true),
            Request::RemoveCidr { port, prefix, dir } => {
                self.change_cidrs(&port, prefix, dir, false)
            }
            Request::Stats { port } => self.inspect(Inspect::Stats { port }),
            Request::Mtu { port } => self.inspect(Inspect::Mtu { port }),
            Request::Ra { port } => self.inspect(Inspect::Ra { port }),
            // The daemon answers these itself (it has the host and the underlay
            // address); a daemon without I/O cannot.
            Request::Doctor | Request::PathCheck { .. } | Request::Capture(_) => {
                Err("doctor, path-check and capture need overlayd with an underlay (this daemon runs without I/O)".into())
            }
            Request::Workers => self.inspect(Inspect::Workers),
        }
    }

    fn port_statuses(&self, now: Instant) -> Vec<PortStatus> {
        self.state
            .ports
            .iter()
            .map(|p| PortStatus {
                port: p.clone(),
                not_applied: self
                    .unapplied_ports
                    .get(&p.config.name)
                    .map(|r| r.view(now)),
                // Filled in by the daemon, which asks the workers serving the taps.
                link: None,
                state: if self.unapplied_ports.contains_key(&p.config.name) {
                    None
                } else {
                    self.dp.port_state(&p.config.name).ok()
                },
            })
            .collect()
    }

    /// Inspection of a port the dataplane does not hold answers with why (for
    /// `stats PORT`) or refuses naming the reason; `stats` adds the control plane's
    /// own figures to the dataplane's.
    fn inspect(&mut self, what: Inspect) -> Result<Reply, String> {
        let now = Instant::now();
        if let Some(port) = what.port() {
            self.port(port)?;
            if let (Inspect::Stats { .. }, Some(r)) = (&what, self.unapplied_ports.get(port)) {
                return Ok(Reply::Inspect(
                    json!({ "name": port, "not_applied": r.view(now) }),
                ));
            }
            self.applied_port(port)?;
        }
        let mut v = self.dp.inspect(&what)?;
        if let (Inspect::Stats { port }, Value::Object(m)) = (&what, &mut v) {
            if port.is_none() {
                m.insert("control".into(), self.control_stats(now));
            }
            m.insert("tap_queues".into(), self.tap_queues(port.as_deref()));
        }
        Ok(Reply::Inspect(v))
    }

    /// Per applied port with a tap (or the one asked for): what its tap's queue
    /// dropped of what the guest sent (`guest_tx_dropped`), or why that cannot be
    /// read. An attached port's loss is its packet socket's, counted by the worker
    /// (`attached_rx_dropped`).
    fn tap_queues(&self, only: Option<&str>) -> Value {
        let m: serde_json::Map<String, Value> = self
            .state
            .ports
            .iter()
            .filter(|p| only.is_none_or(|o| o == p.config.name))
            .filter(|p| !self.unapplied_ports.contains_key(&p.config.name))
            .filter(|p| p.attach.is_none())
            .map(|p| {
                let name = &p.config.name;
                let read = crate::tap_queue::guest_tx_dropped(
                    &self.netns_visitor,
                    name,
                    p.netns.as_deref(),
                );
                let v = match read {
                    Ok(n) => json!({ "guest_tx_dropped": n }),
                    Err(e) => json!({ "error": e }),
                };
                (name.clone(), v)
            })
            .collect();
        Value::Object(m)
    }

    /// What is saved but not applied, the state file and whether saving works, and
    /// the API server's counters.
    fn control_stats(&self, now: Instant) -> Value {
        let ports: Vec<Value> = self
            .unapplied_ports
            .iter()
            .map(|(name, r)| json!({ "name": name, "not_applied": r.view(now) }))
            .collect();
        let v2p: Vec<Value> = self
            .unapplied_v2p
            .iter()
            .take(STATS_V2P_LISTED)
            .map(|((vni, ip), r)| json!({ "vni": vni, "vpc_ip": ip, "not_applied": r.view(now) }))
            .collect();
        json!({
            "not_applied": {
                "ports": ports,
                "v2p_count": self.unapplied_v2p.len(),
                "v2p": v2p,
            },
            "state": {
                "file": self.store.as_ref().map(|s| s.path()),
                "save_error": self.save_error,
            },
            "api": self.api.as_deref(),
        })
    }

    fn port(&self, name: &str) -> Result<&PortInfo, String> {
        self.state
            .ports
            .iter()
            .find(|p| p.config.name == name)
            .ok_or_else(|| format!("no port named {name:?}"))
    }

    /// A port that is in the dataplane: the only kind whose tables can change or
    /// whose engine state can be inspected.
    fn applied_port(&self, name: &str) -> Result<&PortInfo, String> {
        let p = self.port(name)?;
        match self.unapplied_ports.get(name) {
            None => Ok(p),
            Some(r) => Err(format!(
                "port {name:?} is not applied ({}); it is retried, and delete-xde removes it",
                r.reason()
            )),
        }
    }

    /// Writes `state`, remembering the outcome for `stats`.
    fn save(&mut self, state: &State) -> Result<(), String> {
        let Some(store) = &self.store else {
            return Ok(());
        };
        let r = store.save(state);
        self.save_error = r.as_ref().err().cloned();
        r
    }

    /// Saves `next` as the state; on failure runs `undo` on the dataplane and reports.
    fn commit(&mut self, next: State, undo: impl FnOnce(&mut D)) -> Result<Reply, String> {
        if let Err(e) = self.save(&next) {
            undo(&mut self.dp);
            return Err(format!("change undone: {e}"));
        }
        self.state = next;
        Ok(Reply::Done)
    }

    fn create_port(&mut self, c: CreatePort) -> Result<Reply, String> {
        let info = PortInfo {
            config: c.config,
            netns: c.netns,
            vhost_user: c.vhost_user,
            attach: c.attach,
        };
        check_port(&self.state.ports, &info)?;
        let name = info.config.name.clone();
        let mut rules = default_vpc_rules(&info.config);
        let mut next = self.state.clone();
        next.fw_next_id.remove(&name);
        next.paused.remove(&name);
        next.assign_fw_rule_ids(&name, &mut rules);
        let tables = PortTables {
            routes: None,
            fw_rules: rules.clone(),
            paused: false,
        };
        self.dp.add_port(&info, &tables)?;
        let routes = match self.dp.routes(&name) {
            Ok(r) => r,
            Err(e) => {
                let _ = self.dp.remove_port(&name);
                return Err(e);
            }
        };
        next.ports.push(info);
        put_table(&mut next.routes, &name, routes);
        put_table(&mut next.fw_rules, &name, rules);
        self.commit(next, |dp| {
            let _ = dp.remove_port(&name);
        })
    }

    /// Deletes a port, also one that is not applied (from the state alone).
    fn delete_port(&mut self, name: &str) -> Result<Reply, String> {
        let info = self.port(name)?.clone();
        let applied = !self.unapplied_ports.contains_key(name);
        let tables = saved_tables(&self.state, name);
        if applied {
            self.dp.remove_port(name)?;
        }
        let mut next = self.state.clone();
        next.ports.retain(|p| p.config.name != name);
        next.routes.remove(name);
        next.fw_rules.remove(name);
        next.fw_next_id.remove(name);
        next.paused.remove(name);
        let done = self.commit(next, |dp| {
            if applied {
                let _ = dp.add_port(&info, &tables);
            }
        })?;
        self.unapplied_ports.remove(name);
        Ok(done)
    }

    /// Sets a mapping; one saved but not applied is replaced and applied.
    fn set_v2p(&mut self, e: V2pEntry) -> Result<Reply, String> {
        validate_v2p(&e)?;
        let key = v2p_key(&e);
        let slot = self.state.v2p.iter().position(|o| v2p_key(o) == key);
        // What the dataplane holds now, to put back if saving fails.
        let held = slot
            .filter(|_| !self.unapplied_v2p.contains_key(&key))
            .map(|i| self.state.v2p[i]);
        self.dp.set_v2p(&e)?;
        let mut next = self.state.clone();
        match slot {
            Some(i) => next.v2p[i] = e,
            None => next.v2p.push(e),
        }
        let done = self.commit(next, |dp| {
            let _ = match held {
                Some(o) => dp.set_v2p(&o),
                None => dp.clear_v2p(e.vpc_ip, e.vni),
            };
        })?;
        self.unapplied_v2p.remove(&key);
        Ok(done)
    }

    /// Applies `change` (`V2b::set` or `clear`, opteadm's semantics) to the saved
    /// table and hands the result to the dataplane whole.
    fn change_v2b(
        &mut self,
        change: impl FnOnce(&mut V2b) -> Result<(), String>,
    ) -> Result<Reply, String> {
        let old = V2b::from_entries(&self.state.v2b).map_err(|e| e.to_string())?;
        let mut table = old.clone();
        change(&mut table)?;
        self.dp.set_v2b(&table)?;
        let mut next = self.state.clone();
        next.v2b = table.dump();
        self.commit(next, |dp| {
            let _ = dp.set_v2b(&old);
        })
    }

    /// Clears a mapping, also one that is not applied (from the state alone).
    fn clear_v2p(
        &mut self,
        vpc_ip: IpAddr,
        vni: Vni,
        expect: Option<V2pTarget>,
    ) -> Result<Reply, String> {
        let key = (vni, vpc_ip);
        let old = self
            .state
            .v2p
            .iter()
            .find(|o| v2p_key(o) == key)
            .copied()
            .ok_or_else(|| format!("no V2P mapping for {vpc_ip} in VNI {vni}"))?;
        if let Some(x) =
            expect.filter(|x| (x.vpc_mac, x.underlay_ip) != (old.vpc_mac, old.underlay_ip))
        {
            return Err(format!(
                "the V2P mapping for {vpc_ip} in VNI {vni} is {} on {}, not {} on {}: left as it is",
                old.vpc_mac, old.underlay_ip, x.vpc_mac, x.underlay_ip
            ));
        }
        let applied = !self.unapplied_v2p.contains_key(&key);
        if applied {
            self.dp.clear_v2p(vpc_ip, vni)?;
        }
        let mut next = self.state.clone();
        next.v2p.retain(|o| v2p_key(o) != key);
        let done = self.commit(next, |dp| {
            if applied {
                let _ = dp.set_v2p(&old);
            }
        })?;
        self.unapplied_v2p.remove(&key);
        Ok(done)
    }

    fn replace_routes(&mut self, port: &str, routes: Vec<RouteEntry>) -> Result<Reply, String> {
        let old = self.state.routes.get(port).cloned().unwrap_or_default();
        self.dp.set_routes(port, &routes)?;
        let mut next = self.state.clone();
        put_table(&mut next.routes, port, routes);
        self.commit(next, |dp| {
            let _ = dp.set_routes(port, &old);
        })
    }

    fn add_route(&mut self, port: &str, entry: RouteEntry) -> Result<Reply, String> {
        self.applied_port(port)?;
        engine::check_network(entry.dest).map_err(|e| e.to_string())?;
        if let Some(mtu) = entry.mtu {
            if mtu < engine::MIN_PORT_MTU {
                return Err(format!("route MTU {mtu} is below {}", engine::MIN_PORT_MTU));
            }
        }
        let mut routes = self.state.routes.get(port).cloned().unwrap_or_default();
        if routes
            .iter()
            .any(|r| r.dest == entry.dest && r.class == entry.class)
        {
            return Err(format!(
                "port {port:?} already has a {} route to {}; delete it first",
                entry.class, entry.dest
            ));
        }
        routes.push(entry);
        self.replace_routes(port, routes)
    }

    fn del_route(&mut self, port: &str, dest: IpNet, class: RouteClass) -> Result<Reply, String> {
        self.applied_port(port)?;
        let mut routes = self.state.routes.get(port).cloned().unwrap_or_default();
        let before = routes.len();
        routes.retain(|r| r.dest != dest || r.class != class);
        if routes.len() == before {
            return Err(format!("port {port:?} has no {class} route to {dest}"));
        }
        self.replace_routes(port, routes)
    }

    /// `set-external-ips`: checked against the port's own addresses (by the
    /// dataplane, as at creation) and against the other ports' SNAT ranges, applied,
    /// then saved with the port's configuration.
    fn set_external_ips(&mut self, port: &str, ext: ExternalIps) -> Result<Reply, String> {
        self.applied_port(port)?;
        let cfg = &self.port(port)?.config;
        ext.validate(cfg.ipv4, cfg.ipv6)
            .map_err(|e| e.to_string())?;
        check_external_against(&self.state.ports, port, &ext)?;
        self.replace_port_setting(
            port,
            ext,
            |c| &mut c.external,
            |dp, p, e| dp.set_external_ips(p, e),
        )
    }

    /// `set-port-limits`: checked, applied, then saved with the port's configuration.
    fn set_port_limits(&mut self, port: &str, limits: PortLimits) -> Result<Reply, String> {
        self.applied_port(port)?;
        limits.validate().map_err(|e| e.to_string())?;
        self.replace_port_setting(
            port,
            limits,
            |c| &mut c.limits,
            |dp, p, l| dp.set_port_limits(p, l),
        )
    }

    /// Makes `value` the setting `field` of saved port `port`'s configuration:
    /// applied to the dataplane (`apply`), then saved; if saving fails, the old
    /// value is applied again.
    fn replace_port_setting<T: Clone>(
        &mut self,
        port: &str,
        value: T,
        field: fn(&mut PortConfig) -> &mut T,
        apply: fn(&mut D, &str, &T) -> Result<(), String>,
    ) -> Result<Reply, String> {
        let i = self
            .state
            .ports
            .iter()
            .position(|p| p.config.name == port)
            .ok_or_else(|| format!("no port {port:?}"))?;
        let old = field(&mut self.state.ports[i].config).clone();
        apply(&mut self.dp, port, &value)?;
        let mut next = self.state.clone();
        *field(&mut next.ports[i].config) = value;
        self.commit(next, |dp| {
            let _ = apply(dp, port, &old);
        })
    }

    /// `allow-cidr` / `attach-subnet` (`allow`) and `remove-cidr` /
    /// `detach-subnet`: checked against the port, applied, then saved with the
    /// port's configuration.
    fn change_cidrs(
        &mut self,
        port: &str,
        prefix: IpNet,
        dir: CidrDir,
        allow: bool,
    ) -> Result<Reply, String> {
        self.applied_port(port)?;
        let i = self
            .state
            .ports
            .iter()
            .position(|p| p.config.name == port)
            .ok_or_else(|| format!("no port {port:?}"))?;
        let cfg = &self.state.ports[i].config;
        let old = cfg.cidrs.clone();
        let mut cidrs = old.clone();
        if allow {
            cidrs.allow(prefix, dir, cfg).map_err(|e| e.to_string())?;
        } else {
            cidrs.remove(prefix, dir, port).map_err(|e| e.to_string())?;
        }
        self.dp.set_port_cidrs(port, &cidrs)?;
        let mut next = self.state.clone();
        next.ports[i].config.cidrs = cidrs;
        self.commit(next, |dp| {
            let _ = dp.set_port_cidrs(port, &old);
        })
    }

    /// `pause-port` / `resume-port`: the port's frames are dropped (or carried
    /// again), its flows, connections and rules kept; saved, so a restart brings
    /// the port back paused. Pausing a paused port (resuming a running one) changes
    /// nothing and is not an error.
    fn set_port_paused(&mut self, port: &str, paused: bool) -> Result<Reply, String> {
        self.applied_port(port)?;
        let was = self.state.paused.contains(port);
        self.dp.set_port_paused(port, paused)?;
        let mut next = self.state.clone();
        if paused {
            next.paused.insert(port.to_string());
        } else {
            next.paused.remove(port);
        }
        self.commit(next, |dp| {
            let _ = dp.set_port_paused(port, was);
        })
    }

    /// Makes `rules` the port's firewall (their ids assigned already) in the
    /// dataplane and the state `next` (the current state with the port's next id
    /// moved on).
    fn replace_fw_rules(
        &mut self,
        port: &str,
        rules: Vec<FwRule>,
        mut next: State,
    ) -> Result<Reply, String> {
        let old = self.state.fw_rules.get(port).cloned().unwrap_or_default();
        self.dp.set_fw_rules(port, &rules)?;
        put_table(&mut next.fw_rules, port, rules);
        self.commit(next, |dp| {
            let _ = dp.set_fw_rules(port, &old);
        })
    }

    /// Adds a rule under the port's next id (an id the request gives is not used).
    fn add_fw_rule(&mut self, port: &str, mut rule: FwRule) -> Result<Reply, String> {
        self.applied_port(port)?;
        rule.filters.validate()?;
        let mut rules = self.state.fw_rules.get(port).cloned().unwrap_or_default();
        if let Some(r) = rules
            .iter()
            .find(|r| r.same_identity(rule.direction, rule.priority, &rule.filters))
        {
            return Err(format!("port {port:?} already has the rule \"{r}\""));
        }
        let mut next = self.state.clone();
        rule.id = 0;
        rules.push(rule);
        next.assign_fw_rule_ids(port, &mut rules);
        self.replace_fw_rules(port, rules, next)
    }

    fn rm_fw_rule(
        &mut self,
        port: &str,
        direction: Direction,
        priority: u16,
        filters: &FwFilters,
    ) -> Result<Reply, String> {
        self.applied_port(port)?;
        let mut rules = self.state.fw_rules.get(port).cloned().unwrap_or_default();
        let before = rules.len();
        rules.retain(|r| !r.same_identity(direction, priority, filters));
        if rules.len() == before {
            return Err(format!(
                "port {port:?} has no {direction} rule at priority {priority} with host={} proto={}",
                filters.host,
                filters.proto_text()
            ));
        }
        let next = self.state.clone();
        self.replace_fw_rules(port, rules, next)
    }

    /// Removes the rule with id `id` (as `list-fw-rules` and `dump-layer PORT
    /// firewall` show it); with `direction` (opteadm's `rm-fw-rule --dir DIR ID`),
    /// only if the rule looks that way.
    fn rm_fw_rule_id(
        &mut self,
        port: &str,
        direction: Option<Direction>,
        id: u64,
    ) -> Result<Reply, String> {
        self.applied_port(port)?;
        let mut rules = self.state.fw_rules.get(port).cloned().unwrap_or_default();
        let at = rules.iter().position(|r| r.id == id).ok_or_else(|| {
            let ids: Vec<String> = rules.iter().map(|r| r.id.to_string()).collect();
            format!(
                "port {port:?} has no firewall rule {id} (its rules: {}; list-fw-rules {port})",
                if ids.is_empty() {
                    "none".to_string()
                } else {
                    ids.join(", ")
                }
            )
        })?;
        if let Some(d) = direction.filter(|d| *d != rules[at].direction) {
            return Err(format!(
                "firewall rule {id} of port {port:?} is \"{}\", not a {d} rule",
                rules[at]
            ));
        }
        rules.remove(at);
        let next = self.state.clone();
        self.replace_fw_rules(port, rules, next)
    }

    /// Replaces the port's rules; each gets a new id (ids the request gives are not
    /// used).
    fn set_fw_rules(&mut self, port: &str, mut rules: Vec<FwRule>) -> Result<Reply, String> {
        self.applied_port(port)?;
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
        let mut next = self.state.clone();
        for r in &mut rules {
            r.id = 0;
        }
        next.assign_fw_rule_ids(port, &mut rules);
        self.replace_fw_rules(port, rules, next)
    }
}

/// Refuses a port that is invalid in itself (configuration, namespace name) or
/// collides with one of `others`.
fn check_port(others: &[PortInfo], p: &PortInfo) -> Result<(), String> {
    p.config.validate().map_err(|e| e.to_string())?;
    if let Some(ns) = &p.netns {
        check_netns_name(ns)?;
    }
    match &p.attach {
        Some(iface) => check_attach(others, p, iface)?,
        None => {
            let name = &p.config.name;
            if let Some(o) = others.iter().find(|o| o.attach.as_ref() == Some(name)) {
                return Err(format!(
                    "port {:?} is attached to interface {name:?}: a tap cannot have its name",
                    o.config.name
                ));
            }
        }
    }
    if let Some(v) = &p.vhost_user {
        if p.netns.is_some() || p.attach.is_some() {
            return Err(format!(
                "port {:?}: a vhost-user port has no tap or interface (drop --netns and --attach)",
                p.config.name
            ));
        }
        if !v.socket.is_absolute() {
            return Err(format!(
                "vhost-user socket {:?} must be an absolute path",
                v.socket.display()
            ));
        }
        let theirs = |o: &&PortInfo| o.config.name != p.config.name;
        if let Some(o) = others
            .iter()
            .filter(theirs)
            .find(|o| o.vhost_user.as_ref().is_some_and(|w| w.socket == v.socket))
        {
            return Err(format!(
                "vhost-user socket {:?} is port {:?}'s",
                v.socket.display(),
                o.config.name
            ));
        }
    }
    check_port_against(others, &p.config)
}

/// Refuses an attachment that cannot be: with a namespace (an attached interface
/// stays where its hypervisor made it, in the daemon's namespace), to a name no
/// interface can have, or to an interface another port already uses (as its
/// attachment, or as its tap: the daemon would read its own frames).
fn check_attach(others: &[PortInfo], p: &PortInfo, iface: &str) -> Result<(), String> {
    if let Some(ns) = &p.netns {
        return Err(format!(
            "port {:?}: --attach {iface:?} and --netns {ns:?} exclude each other (an attached interface stays in the daemon's namespace)",
            p.config.name
        ));
    }
    let b = iface.as_bytes();
    if b.is_empty()
        || b.len() >= libc::IFNAMSIZ
        || b.iter()
            .any(|&c| c == b'/' || c == b':' || c.is_ascii_whitespace() || c == 0)
    {
        return Err(format!(
            "invalid interface name {iface:?} (1..{} bytes, no '/', ':' or white space)",
            libc::IFNAMSIZ - 1
        ));
    }
    for o in others.iter().filter(|o| o.config.name != p.config.name) {
        if o.attach.as_deref() == Some(iface) {
            return Err(format!(
                "interface {iface:?} is already attached to port {:?}",
                o.config.name
            ));
        }
        if o.attach.is_none() && o.config.name == iface {
            return Err(format!(
                "interface {iface:?} is the tap of port {iface:?}, not a hypervisor's"
            ));
        }
    }
    Ok(())
}

/// Refuses a port that collides with one of `others`: the same name (it names the
/// tap), or the same guest MAC in the same VPC (inbound frames are dispatched by VNI
/// and destination MAC, so two would be ambiguous).
fn check_port_against(others: &[PortInfo], cfg: &PortConfig) -> Result<(), String> {
    for p in others {
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
    check_external_against(others, &cfg.name, &cfg.external)
}

/// Refuses external addresses port `name` cannot have next to the other ports of
/// this sled: a SNAT range sharing a port with another port's on the same address
/// (replies could not be told apart), or a floating or ephemeral address another
/// port uses in any role (a 1:1 address is one guest's alone).
fn check_external_against(
    others: &[PortInfo],
    name: &str,
    ext: &ExternalIps,
) -> Result<(), String> {
    let one_to_one = || ext.ephemeral.iter().chain(&ext.floating);
    for p in others.iter().filter(|p| p.config.name != name) {
        let theirs = &p.config.external;
        if let (Some(a), Some(b)) = (&ext.snat, &theirs.snat) {
            if a.overlaps(b) {
                return Err(format!(
                    "SNAT range {}:{}-{} overlaps port {:?}'s {}:{}-{}",
                    a.ip, a.start, a.end, p.config.name, b.ip, b.start, b.end
                ));
            }
        }
        let their_ips: Vec<IpAddr> = theirs
            .snat
            .map(|s| s.ip)
            .into_iter()
            .chain(theirs.ephemeral)
            .chain(theirs.floating.iter().copied())
            .collect();
        let ours_used = one_to_one().find(|ip| their_ips.contains(ip));
        let theirs_used = ext
            .snat
            .map(|s| s.ip)
            .filter(|ip| theirs.ephemeral == Some(*ip) || theirs.floating.contains(ip));
        if let Some(ip) = ours_used.copied().or(theirs_used) {
            return Err(format!(
                "external IP {ip} is already used by port {:?}",
                p.config.name
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

/// The checks the engine makes on a mapping, made here first: at restore a mapping
/// that would be refused is set aside by itself instead of failing the whole batch.
fn validate_v2p(e: &V2pEntry) -> Result<(), String> {
    if !e.vpc_mac.is_unicast() {
        return Err(format!("VPC MAC {} is not a unicast address", e.vpc_mac));
    }
    if e.underlay_ip.is_unspecified() || e.underlay_ip.is_multicast() {
        return Err(format!(
            "underlay address {} is not a unicast address",
            e.underlay_ip
        ));
    }
    if e.vpc_ip.is_unspecified() || e.vpc_ip.is_multicast() {
        return Err(format!("VPC address {} is not a unicast address", e.vpc_ip));
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::api::tests::sample_port;
    use crate::api::{FwAction, FwHost, FwPorts, FwProto, NotApplied, RouteTarget};
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
        /// Every change asked for, in order ("op port").
        log: Vec<String>,
        refuse: Option<&'static str>,
        /// A port to be moved into one of these is refused, as the tap would be.
        missing_netns: Missing,
    }

    impl Recorder {
        fn check(&mut self, op: &str, target: &str) -> Result<(), String> {
            self.log.push(format!("{op} {target}"));
            match self.refuse {
                Some(r) if r == op => Err(format!("dataplane refuses {op}")),
                _ => Ok(()),
            }
        }
    }

    impl Dataplane for Recorder {
        fn add_port(&mut self, p: &PortInfo, tables: &PortTables) -> Result<(), String> {
            let name = p.config.name.clone();
            self.check("add_port", &name)?;
            if let Some(ns) = &p.netns {
                if self.missing_netns.lock().unwrap().contains(ns) {
                    return Err(format!("network namespace {ns:?} not found"));
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
        fn remove_port(&mut self, name: &str) -> Result<(), String> {
            self.check("remove_port", name)?;
            self.ports.retain(|n| n != name);
            self.routes.remove(name);
            self.rules.remove(name);
            self.paused.remove(name);
            Ok(())
        }
        fn set_v2p(&mut self, e: &V2pEntry) -> Result<(), String> {
            self.check("set_v2p", &e.vpc_ip.to_string())?;
            self.v2p
                .retain(|o| !(o.vpc_ip == e.vpc_ip && o.vni == e.vni));
            self.v2p.push(*e);
            Ok(())
        }
        fn clear_v2p(&mut self, ip: IpAddr, vni: Vni) -> Result<(), String> {
            self.check("clear_v2p", &ip.to_string())?;
            self.v2p.retain(|o| !(o.vpc_ip == ip && o.vni == vni));
            Ok(())
        }
        fn set_v2b(&mut self, table: &V2b) -> Result<(), String> {
            self.check("set_v2b", &format!("{} prefixes", table.dump().len()))?;
            self.v2b = table.clone();
            Ok(())
        }
        fn set_routes(&mut self, port: &str, r: &[RouteEntry]) -> Result<(), String> {
            self.check("set_routes", port)?;
            self.routes.insert(port.into(), r.to_vec());
            Ok(())
        }
        fn routes(&self, port: &str) -> Result<Vec<RouteEntry>, String> {
            Ok(self.routes.get(port).cloned().unwrap_or_default())
        }
        fn set_fw_rules(&mut self, port: &str, rules: &[FwRule]) -> Result<(), String> {
            self.check("set_fw_rules", port)?;
            self.rules.insert(port.into(), rules.to_vec());
            Ok(())
        }
        fn set_port_paused(&mut self, port: &str, paused: bool) -> Result<(), String> {
            self.check(if paused { "pause" } else { "resume" }, port)?;
            if paused {
                self.paused.insert(port.into());
            } else {
                self.paused.remove(port);
            }
            Ok(())
        }
        fn port_state(&self, port: &str) -> Result<PortState, String> {
            if !self.ports.iter().any(|p| p == port) {
                return Err(format!("no port named {port:?}"));
            }
            Ok(if self.paused.contains(port) {
                PortState::Paused
            } else {
                PortState::Ready
            })
        }
        fn clear_uft(&mut self, port: &str) -> Result<(), String> {
            self.check("clear_uft", port)
        }
        fn set_external_ips(&mut self, port: &str, _: &ExternalIps) -> Result<(), String> {
            self.check("set_external_ips", port)
        }
        fn set_port_limits(&mut self, port: &str, _: &PortLimits) -> Result<(), String> {
            self.check("set_port_limits", port)
        }
        fn set_port_cidrs(&mut self, port: &str, _: &PortCidrs) -> Result<(), String> {
            self.check("set_port_cidrs", port)
        }
        fn inspect(&mut self, what: &Inspect) -> Result<serde_json::Value, String> {
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
        Request::CreatePort(Box::new(CreatePort {
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

    fn err(c: &mut Controller<Recorder>, r: Request) -> String {
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
            Request::CreatePort(Box::new(CreatePort {
                config: sample_port(name, last),
                netns: netns.map(Into::into),
                attach: Some(iface.into()),
                vhost_user: None,
            }))
        };
        let e = err(&mut c, attach("vm0", 5, "vnet0", Some("g0")));
        assert!(
            e.contains("\"vnet0\"") && e.contains("\"g0\"") && e.contains("exclude"),
            "{e}"
        );
        for bad in ["", "a-name-far-too-long", "eth0:1", "a/b", "a b"] {
            let e = err(&mut c, attach("vm0", 5, bad, None));
            assert!(
                e.contains(&format!("invalid interface name {bad:?}")),
                "{e}"
            );
        }
        ok(&mut c, attach("vm0", 5, "vnet0", None));
        let e = err(&mut c, attach("vm1", 6, "vnet0", None));
        assert!(
            e.contains("\"vnet0\" is already attached to port \"vm0\""),
            "{e}"
        );
        ok(&mut c, create("opte1", 7));
        let e = err(&mut c, attach("vm2", 8, "opte1", None));
        assert!(e.contains("\"opte1\" is the tap of port"), "{e}");
        let e = err(&mut c, create("vnet0", 9));
        assert!(
            e.contains("port \"vm0\" is attached to interface \"vnet0\""),
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
        assert!(err(&mut c, create("opte0", 6)).contains("opte0"));
        assert!(err(&mut c, create("opte1", 5)).contains("a8:40:25:ff:00:05"));
        let mut bad = sample_port("opte2", 7);
        bad.mtu = 100;
        let e = err(
            &mut c,
            Request::CreatePort(Box::new(CreatePort {
                config: bad,
                netns: None,
                vhost_user: None,
                attach: None,
            })),
        );
        assert!(e.contains("MTU 100"), "{e}");
        let e = err(
            &mut c,
            Request::CreatePort(Box::new(CreatePort {
                config: sample_port("opte3", 8),
                netns: Some("../etc".into()),
                vhost_user: None,
                attach: None,
            })),
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
                expect: None,
            },
        );
        assert!(e.contains("10.9.9.9"), "{e}");
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
        assert!(e.contains("0.0.0.0/0"), "{e}");
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
        assert!(e.contains("576"), "{e}");
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
        assert!(e.contains("10.9.0.1/6") && e.contains("8.0.0.0/6"), "{e}");
        c.dataplane_mut().refuse = Some("set_routes");
        let e = err(
            &mut c,
            Request::DelRouterEntry {
                class: Default::default(),
                port: "opte0".into(),
                dest: "0.0.0.0/0".parse().unwrap(),
            },
        );
        assert!(e.contains("set_routes"), "{e}");
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
        assert!(err(&mut c, clear("0.0.0.0/0", &["fd00:99::b9"])).contains("fd00:99::b9"));
        assert!(err(&mut c, set("10.0.0.0/8", &["ff02::1"])).contains("ff02::1"));
        assert!(err(&mut c, clear("10.0.0.0/8", &["fd00:99::b1"])).contains("10.0.0.0/8"));
        assert_eq!(c.state().v2b, table);
        ok(&mut c, clear("0.0.0.0/0", &["fd00:99::b1", "fd00:99::b2"]));
        assert_eq!(c.state().v2b.len(), 1);
        assert_eq!(c.dataplane().v2b.dump(), c.state().v2b);
        // The dataplane refuses: the saved table stays what it was.
        c.dataplane_mut().refuse = Some("set_v2b");
        assert!(err(&mut c, set("0.0.0.0/0", &["fd00:99::b3"])).contains("refuses"));
        assert_eq!(c.state().v2b.len(), 1);
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
                expect: None,
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
        // What is left is what the port started with, under the ids it got then;
        // the rule added had 3, so the next one gets 4.
        let mut defaults = default_vpc_rules(&c.state().ports[0].config);
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
            e.contains("no firewall rule 3") && e.contains("1, 2, 4"),
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
        assert!(e.contains("nope"), "{e}");
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
        ok(&mut c, Request::SetV2p(v2p("172.30.0.9")));
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
        assert_eq!(fresh.dataplane().v2b.dump(), saved.v2b);
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
            snat: Some(engine::SnatRange {
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
        assert!(e.contains("2000") && e.contains("opte0"), "{e}");
        let e = err(&mut c, set_external("opte1", snat(80, 100)));
        assert!(e.contains("80"), "{e}");
        let e = err(&mut c, set_external("opte1", snat(3000, 2048)));
        assert!(e.contains("3000-2048"), "{e}");
        let taken = ExternalIps {
            ephemeral: Some("192.0.2.5".parse().unwrap()),
            ..ExternalIps::default()
        };
        let e = err(&mut c, set_external("opte1", taken));
        assert!(e.contains("192.0.2.5") && e.contains("opte0"), "{e}");
        let e = err(&mut c, set_external("nope", snat(2048, 4095)));
        assert!(e.contains("nope"), "{e}");
        // So is a new port's overlapping range.
        let mut clash = sample_port("opte2", 7);
        clash.external = snat(1500, 1600);
        let e = err(
            &mut c,
            Request::CreatePort(Box::new(CreatePort {
                config: clash,
                netns: None,
                vhost_user: None,
                attach: None,
            })),
        );
        assert!(e.contains("1500") && e.contains("opte0"), "{e}");
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
        assert!(e.contains("custom") && e.contains("10.8.0.0/16"), "{e}");
        let del = |class| Request::DelRouterEntry {
            port: "opte0".into(),
            dest: "10.8.0.0/16".parse().unwrap(),
            class,
        };
        ok(&mut c, del(RouteClass::Custom));
        let e = err(&mut c, del(RouteClass::Custom));
        assert!(e.contains("no custom route to 10.8.0.0/16"), "{e}");
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
            Request::AllowCidr { port, prefix, dir }
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
        for (r, named) in [
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
            assert!(e.contains(named), "{e}");
        }
        ok(&mut c, cidr(false, "opte0", "192.168.50.0/24", CidrDir::In));
        assert!(c
            .dataplane()
            .log
            .contains(&"set_port_cidrs opte0".to_string()));
        let want = engine::PortCidrs {
            inbound: vec![],
            outbound: vec![
                "192.168.50.0/24".parse().unwrap(),
                "10.9.0.0/16".parse().unwrap(),
            ],
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
            Request::CreatePort(Box::new(CreatePort {
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
        ok(&mut c, Request::SetV2p(v2p("172.30.0.9")));
        ok(&mut c, Request::SetV2p(v2p("172.30.0.10")));
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
        assert_eq!(na.reason, "dataplane refuses add_port");
        assert_eq!(na.attempts, 1);
        assert!(na.retry_in_ms <= 1000, "{na:?}");
        let stats = control_stats(&mut c);
        assert_eq!(stats["not_applied"]["ports"][1]["name"], "opte1");
        assert_eq!(
            stats["not_applied"]["ports"][0]["not_applied"]["reason"],
            "dataplane refuses add_port"
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
            e.contains("not applied") && e.contains("refuses add_port"),
            "{e}"
        );
        let e = err(
            &mut c,
            Request::AddFwRule {
                port: "opte0".into(),
                rule: fw_rule(20, FwProto::Udp, vec![53]),
            },
        );
        assert!(e.contains("opte0") && e.contains("not applied"), "{e}");
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
        assert!(na.reason.contains("\"g0\" not found"), "{na:?}");
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
        assert_eq!(ok(&mut c, Request::DumpV2p), Reply::V2p(saved.v2p.clone()));

        // Setting one by hand applies it (and it is no longer marked).
        c.dataplane_mut().refuse = None;
        ok(&mut c, Request::SetV2p(v2p("172.30.0.9")));
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
        assert!(e.contains("change undone"), "{e}");
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
        assert!(e.contains("change undone"), "{e}");
        assert_eq!(c.dataplane().ports, ["opte0"]);
    }
}
