//! Each request carried out: checked against the current state, applied to the
//! dataplane, then recorded and saved (see [`super`] for the rule every verb
//! follows).

use super::checks::{check_external_against, check_port};
use super::dataplane::DataplaneError;
use super::state::State;
use super::{
    put_table, tables_in_force, v2b_table, v2p_key, ControlError, Controller, Dataplane, Inspect,
    PortTables,
};
use crate::convert::ToApi;
use api::fleet::PortTable;
use api::port::{check_network, MIN_PORT_MTU};
use api::{
    CidrDir, Direction, ExternalIps, FwAction, FwFilters, FwHost, FwProto, FwRule, PortConfig,
    PortInfo, PortLimits, Reply, Request, RouteClass, RouteEntry, V2bEntry, V2pEntry, V2pTarget,
    Vni,
};
use engine::vpc::v2b::V2bError;
use engine::V2b;
use ipnet::IpNet;
use std::net::{IpAddr, Ipv6Addr};
use std::time::Instant;

/// The firewall a new port starts with, like a VPC's default rules: traffic from the
/// port's own VPC subnets may come in (the engine itself denies unsolicited inbound
/// traffic; outbound is allowed and its replies are tracked). Operators replace these
/// with `set-fw-rules` like any other rule.
pub(super) fn default_vpc_rules(cfg: &PortConfig) -> Vec<FwRule> {
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

impl<D: Dataplane> Controller<D> {
    pub(super) fn apply(&mut self, req: Request) -> Result<Reply, ControlError> {
        match req {
            Request::CreatePort(c) => self.create_port(*c),
            Request::DeletePort { name, forward_to } => self.delete_port(&name, forward_to),
            Request::ListPorts => Ok(Reply::Ports(self.port_statuses(Instant::now()))),
            Request::SetV2p {
                entry,
                override_fleet,
            } => self.set_v2p(entry, override_fleet),
            Request::ClearV2p {
                vpc_ip,
                vni,
                expect,
            } => self.clear_v2p(vpc_ip, vni, expect),
            Request::DumpV2p => Ok(Reply::V2p(self.v2p_records())),
            Request::SetV2b { prefix, endpoints } => self.change_v2b(|t| t.set(prefix, &endpoints)),
            Request::ClearV2b { prefix, endpoints } => {
                self.change_v2b(|t| t.clear(prefix, &endpoints))
            }
            Request::DumpV2b => {
                let v = self.dp.inspect(&Inspect::V2b)?;
                let table: Vec<V2bEntry> =
                    serde_json::from_value(v).map_err(ControlError::V2bUnreadable)?;
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
            Request::ExportPort { port } => self.export_port(&port),
            Request::ImportPort(import) => self.import_port(&import),
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
            Request::ClearLft { port, layer } => {
                self.applied_port(&port)?;
                let flows = self.dp.clear_lft(&port, &layer)?;
                Ok(Reply::Cleared { flows })
            }
            Request::SetExternalIps { port, external } => self.set_external_ips(&port, external),
            Request::SetPortLimits { port, limits } => self.set_port_limits(&port, limits),
            Request::AllowCidr {
                port,
                prefix,
                dir,
                external,
            } => self.change_cidrs(&port, prefix, dir, CidrChange::Allow { external }),
            Request::RemoveCidr { port, prefix, dir } => {
                self.change_cidrs(&port, prefix, dir, CidrChange::Remove)
            }
            Request::Stats { port } => self.inspect(Inspect::Stats { port }),
            Request::Mtu { port } => self.inspect(Inspect::Mtu { port }),
            Request::Ra { port } => self.inspect(Inspect::Ra { port }),
            // The daemon answers these itself (it has the host and the underlay
            // address); a daemon without I/O cannot.
            Request::Doctor
            | Request::PathCheck { .. }
            | Request::Capture(_)
            | Request::CheckSled(_) => Err(ControlError::NeedsIo),
            Request::Workers => self.inspect(Inspect::Workers),
            Request::FleetStatus => Ok(Reply::Fleet(Box::new(self.fleet_status(Instant::now())))),
            Request::FleetResync => self.fleet_command(false).map(|()| Reply::Done),
            Request::FleetAdopt => self.fleet_command(true).map(|()| Reply::Done),
        }
    }

    fn create_port(&mut self, info: PortInfo) -> Result<Reply, ControlError> {
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
                return Err(e.into());
            }
        };
        next.ports.push(info);
        put_table(&mut next.routes, &name, routes);
        put_table(&mut next.fw_rules, &name, rules);
        let done = self.commit(next, |dp| {
            let _ = dp.remove_port(&name);
        })?;
        // The port's own tables are saved as a new port's; the fleet's, if it
        // manages them, are the ones in force.
        self.push_port_tables(&name);
        Ok(done)
    }

    /// Deletes a port, also one that is not applied (from the state alone).
    fn delete_port(
        &mut self,
        name: &str,
        forward_to: Option<Ipv6Addr>,
    ) -> Result<Reply, ControlError> {
        let info = self.port(name)?.clone();
        let applied = !self.unapplied_ports.contains_key(name);
        let tables = tables_in_force(&self.state, &self.fleet.layer, name);
        let (vni, mac) = (info.config.vni, info.config.guest_mac);
        // The guest moved: its frames follow it for a while, from the moment its
        // port is gone. Asked first, so that a bad address changes nothing (a
        // port that is not applied has no frames to relay).
        let relay = forward_to.filter(|_| applied);
        if let Some(to) = relay {
            self.dp.relay_departed(vni, mac, Some(to))?;
        }
        if applied {
            if let Err(e) = self.dp.remove_port(name) {
                if relay.is_some() {
                    let _ = self.dp.relay_departed(vni, mac, None);
                }
                return Err(e.into());
            }
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
            if relay.is_some() {
                let _ = dp.relay_departed(vni, mac, None);
            }
        })?;
        self.unapplied_ports.remove(name);
        Ok(done)
    }

    /// Sets a mapping; one saved but not applied is replaced and applied. One the
    /// fleet has too is refused unless `override_fleet`.
    fn set_v2p(&mut self, e: V2pEntry, override_fleet: bool) -> Result<Reply, ControlError> {
        e.validate()?;
        self.check_fleet_v2p(e.vni, e.vpc_ip, override_fleet)?;
        let key = v2p_key(&e);
        let slot = self.state.v2p.iter().position(|o| v2p_key(o) == key);
        // What the dataplane holds now, to put back if saving fails: the local
        // mapping replaced, or the fleet's it overrides.
        let held = slot
            .filter(|_| !self.unapplied_v2p.contains_key(&key))
            .map(|i| self.state.v2p[i])
            .or_else(|| self.fleet_v2p(e.vni, e.vpc_ip));
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
        change: impl FnOnce(&mut V2b) -> Result<(), V2bError>,
    ) -> Result<Reply, ControlError> {
        let mut table = v2b_table(&self.state.v2b)?;
        change(&mut table).map_err(ControlError::V2b)?;
        let local = table.dump().to_api();
        // What the dataplane holds is the local table with the fleet's added.
        let old = self.v2b_in_force(&self.state.v2b)?;
        self.dp.set_v2b(&self.v2b_in_force(&local)?)?;
        let mut next = self.state.clone();
        next.v2b = local;
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
    ) -> Result<Reply, ControlError> {
        let key = (vni, vpc_ip);
        let fleet = self.fleet_v2p(vni, vpc_ip);
        let Some(old) = self.state.v2p.iter().find(|o| v2p_key(o) == key).copied() else {
            return Err(match fleet {
                Some(_) => ControlError::FleetOwned {
                    what: format!("the V2P mapping of {vpc_ip} in VNI {vni}"),
                    key: api::fleet::v2p_key(vni, vpc_ip),
                },
                None => ControlError::NoV2p { vpc_ip, vni },
            });
        };
        if let Some(x) =
            expect.filter(|x| (x.vpc_mac, x.underlay_ip) != (old.vpc_mac, old.underlay_ip))
        {
            return Err(ControlError::V2pDiffers {
                vpc_ip,
                vni,
                mac: old.vpc_mac,
                underlay: old.underlay_ip,
                want_mac: x.vpc_mac,
                want_underlay: x.underlay_ip,
            });
        }
        let applied = !self.unapplied_v2p.contains_key(&key);
        if applied {
            // The fleet's mapping of the address, which the local one overrode,
            // is in force again.
            match &fleet {
                Some(f) => self.dp.set_v2p(f)?,
                None => self.dp.clear_v2p(vpc_ip, vni)?,
            }
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

    fn replace_routes(
        &mut self,
        port: &str,
        routes: Vec<RouteEntry>,
    ) -> Result<Reply, ControlError> {
        let old = self.state.routes.get(port).cloned().unwrap_or_default();
        self.dp.set_routes(port, &routes)?;
        let mut next = self.state.clone();
        put_table(&mut next.routes, port, routes);
        self.commit(next, |dp| {
            let _ = dp.set_routes(port, &old);
        })
    }

    fn add_route(&mut self, port: &str, entry: RouteEntry) -> Result<Reply, ControlError> {
        self.applied_port(port)?;
        self.check_fleet_table(port, PortTable::Routes)?;
        let mut routes = self.state.routes.get(port).cloned().unwrap_or_default();
        check_new_route(port, &routes, &entry)?;
        routes.push(entry);
        self.replace_routes(port, routes)
    }

    fn del_route(
        &mut self,
        port: &str,
        dest: IpNet,
        class: RouteClass,
    ) -> Result<Reply, ControlError> {
        self.applied_port(port)?;
        self.check_fleet_table(port, PortTable::Routes)?;
        let mut routes = self.state.routes.get(port).cloned().unwrap_or_default();
        let before = routes.len();
        routes.retain(|r| r.dest != dest || r.class != class);
        if routes.len() == before {
            return Err(ControlError::NoRoute {
                port: port.to_string(),
                class,
                dest,
            });
        }
        self.replace_routes(port, routes)
    }

    /// `set-external-ips`: checked against the port's own addresses (by the
    /// dataplane, as at creation) and against the other ports' SNAT ranges, applied,
    /// then saved with the port's configuration.
    fn set_external_ips(&mut self, port: &str, ext: ExternalIps) -> Result<Reply, ControlError> {
        self.applied_port(port)?;
        let cfg = &self.port(port)?.config;
        ext.validate(cfg.ipv4, cfg.ipv6)?;
        check_external_against(&self.state.ports, port, &ext)?;
        self.replace_port_setting(
            port,
            ext,
            |c| &mut c.external,
            super::dataplane::Dataplane::set_external_ips,
        )
    }

    /// `set-port-limits`: checked, applied, then saved with the port's configuration.
    fn set_port_limits(&mut self, port: &str, limits: PortLimits) -> Result<Reply, ControlError> {
        self.applied_port(port)?;
        limits.validate()?;
        self.replace_port_setting(
            port,
            limits,
            |c| &mut c.limits,
            super::dataplane::Dataplane::set_port_limits,
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
        apply: fn(&mut D, &str, &T) -> Result<(), DataplaneError>,
    ) -> Result<Reply, ControlError> {
        let i = self
            .state
            .ports
            .iter()
            .position(|p| p.config.name == port)
            .ok_or_else(|| ControlError::NoSuchPort(port.to_string()))?;
        let old = field(&mut self.state.ports[i].config).clone();
        apply(&mut self.dp, port, &value)?;
        let mut next = self.state.clone();
        *field(&mut next.ports[i].config) = value;
        self.commit(next, |dp| {
            let _ = apply(dp, port, &old);
        })
    }

    /// `allow-cidr` / `attach-subnet [-e]` and `remove-cidr` /
    /// `detach-subnet`: checked against the port, applied, then saved with the
    /// port's configuration.
    fn change_cidrs(
        &mut self,
        port: &str,
        prefix: IpNet,
        dir: CidrDir,
        change: CidrChange,
    ) -> Result<Reply, ControlError> {
        self.applied_port(port)?;
        let i = self
            .state
            .ports
            .iter()
            .position(|p| p.config.name == port)
            .ok_or_else(|| ControlError::NoSuchPort(port.to_string()))?;
        let cfg = &self.state.ports[i].config;
        let old = cfg.cidrs.clone();
        let mut cidrs = old.clone();
        match change {
            CidrChange::Allow { external: false } => cidrs.allow(prefix, dir, cfg)?,
            CidrChange::Allow { external: true } => cidrs.allow_external(prefix, dir, cfg)?,
            CidrChange::Remove => cidrs.remove(prefix, dir, port)?,
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
    pub(super) fn set_port_paused(
        &mut self,
        port: &str,
        paused: bool,
    ) -> Result<Reply, ControlError> {
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
    ) -> Result<Reply, ControlError> {
        let old = self.state.fw_rules.get(port).cloned().unwrap_or_default();
        self.dp.set_fw_rules(port, &rules)?;
        put_table(&mut next.fw_rules, port, rules);
        self.commit(next, |dp| {
            let _ = dp.set_fw_rules(port, &old);
        })
    }

    /// Adds a rule under the port's next id (an id the request gives is not used).
    fn add_fw_rule(&mut self, port: &str, mut rule: FwRule) -> Result<Reply, ControlError> {
        self.applied_port(port)?;
        self.check_fleet_table(port, PortTable::Firewall)?;
        rule.filters.validate()?;
        let mut rules = self.state.fw_rules.get(port).cloned().unwrap_or_default();
        if let Some(r) = rules
            .iter()
            .find(|r| r.same_identity(rule.direction, rule.priority, &rule.filters))
        {
            return Err(ControlError::RuleExists {
                port: port.to_string(),
                rule: r.clone(),
            });
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
    ) -> Result<Reply, ControlError> {
        self.applied_port(port)?;
        self.check_fleet_table(port, PortTable::Firewall)?;
        let mut rules = self.state.fw_rules.get(port).cloned().unwrap_or_default();
        let before = rules.len();
        rules.retain(|r| !r.same_identity(direction, priority, filters));
        if rules.len() == before {
            return Err(ControlError::NoSuchRule {
                port: port.to_string(),
                direction,
                priority,
                host: filters.host.to_string(),
                proto: filters.proto_text(),
            });
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
    ) -> Result<Reply, ControlError> {
        self.applied_port(port)?;
        self.check_fleet_table(port, PortTable::Firewall)?;
        let mut rules = self.state.fw_rules.get(port).cloned().unwrap_or_default();
        let at = rules.iter().position(|r| r.id == id).ok_or_else(|| {
            let ids: Vec<String> = rules.iter().map(|r| r.id.to_string()).collect();
            ControlError::NoRuleId {
                port: port.to_string(),
                id,
                ids: if ids.is_empty() {
                    "none".to_string()
                } else {
                    ids.join(", ")
                },
            }
        })?;
        if let Some(d) = direction.filter(|d| *d != rules[at].direction) {
            return Err(ControlError::RuleDirection {
                port: port.to_string(),
                id,
                rule: rules[at].clone(),
                direction: d,
            });
        }
        rules.remove(at);
        let next = self.state.clone();
        self.replace_fw_rules(port, rules, next)
    }

    /// Replaces the port's rules; each gets a new id (ids the request gives are not
    /// used).
    fn set_fw_rules(&mut self, port: &str, mut rules: Vec<FwRule>) -> Result<Reply, ControlError> {
        self.applied_port(port)?;
        self.check_fleet_table(port, PortTable::Firewall)?;
        check_rules(&rules)?;
        let mut next = self.state.clone();
        for r in &mut rules {
            r.id = 0;
        }
        next.assign_fw_rule_ids(port, &mut rules);
        self.replace_fw_rules(port, rules, next)
    }
}

/// Refuses a route `routes` (port `port`'s) cannot take: a network with host
/// bits, an MTU below the minimum, or a destination and class it routes already.
pub(super) fn check_new_route(
    port: &str,
    routes: &[RouteEntry],
    entry: &RouteEntry,
) -> Result<(), ControlError> {
    check_network(entry.dest)?;
    if let Some(mtu) = entry.mtu.filter(|&m| m < MIN_PORT_MTU) {
        return Err(ControlError::RouteMtu(mtu));
    }
    if routes
        .iter()
        .any(|r| r.dest == entry.dest && r.class == entry.class)
    {
        return Err(ControlError::RouteExists {
            port: port.to_string(),
            class: entry.class,
            dest: entry.dest,
        });
    }
    Ok(())
}

/// Refuses a firewall whose rules do not validate or name one rule twice.
pub(super) fn check_rules(rules: &[FwRule]) -> Result<(), ControlError> {
    for (i, r) in rules.iter().enumerate() {
        r.filters
            .validate()
            .map_err(|error| ControlError::BadRule {
                index: i,
                rule: Box::new(r.clone()),
                error,
            })?;
        if rules[..i]
            .iter()
            .any(|o| o.same_identity(r.direction, r.priority, &r.filters))
        {
            return Err(ControlError::RuleTwice {
                index: i,
                rule: r.clone(),
            });
        }
    }
    Ok(())
}

/// What [`Controller::change_cidrs`] does to a port's prefixes.
#[derive(Clone, Copy)]
enum CidrChange {
    /// `allow-cidr`, `attach-subnet` (`external`: `attach-subnet -e`, exempt
    /// from NAT).
    Allow { external: bool },
    /// `remove-cidr`, `detach-subnet`.
    Remove,
}
