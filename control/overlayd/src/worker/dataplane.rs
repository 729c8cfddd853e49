//! The requests a worker carries out: API requests turned into engine calls (the
//! [`Dataplane`] the controller drives), the tables of a new port, what the
//! worker reports of itself ([`WorkerPlane`]) and of its guests' links, and the
//! start of a capture.

use super::capture::{CaptureError, Feed, Tap};
use super::guests::{not_an_underlay_link, open_guest, unix_ms, PortTap, TapLink};
use super::io::TOKEN_DOORBELL;
use super::jobs::{PortKey, WorkerPlane};
use super::stats::{QueueRef, UnderlayTx, WorkerInfo, WorkerReport, WorkerView};
use super::Datapath;
use crate::controller::{Dataplane, DataplaneError, Inspect, PortTables};
use crate::convert::{ToApi, ToEngine};
use api::{
    Direction, ExternalIps, FwAction, FwHost, FwRule, MacAddr, PortCidrs, PortInfo, PortLimits,
    PortLink, PortState, RouteEntry, V2pEntry, VhostNegotiation, Vni,
};
use engine::{Finalized, PortRange, Predicate, Rule};
use engine::{Imported, LiveState, V2b};
use ipnet::IpNet;
use serde::Serialize;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};

impl Datapath {
    /// Adds and deletes routes until the engine's table equals `want`. Used by
    /// `set_routes`, which undoes a partial change with a second call.
    fn sync_routes(&mut self, port: &str, want: &[RouteEntry]) -> Result<(), DataplaneError> {
        let have = self.routes(port)?;
        for r in have.iter().filter(|r| !want.contains(r)) {
            self.engine
                .del_route_in(port, r.class.to_engine(), r.dest)?;
        }
        for r in want.iter().filter(|r| !have.contains(r)) {
            let (class, target) = (r.class.to_engine(), r.target.to_engine());
            self.engine
                .add_route_in(port, class, r.dest, target, r.mtu)?;
        }
        Ok(())
    }

    /// Gives a new port its routing table (unless it keeps the engine's default
    /// routes) and its firewall rules.
    fn set_tables(&mut self, port: &str, tables: &PortTables) -> Result<(), DataplaneError> {
        if let Some(routes) = &tables.routes {
            self.sync_routes(port, routes)?;
        }
        self.set_fw_rules(port, &tables.fw_rules)?;
        self.set_port_paused(port, tables.paused)
    }
}

/// An inspection result as JSON.
fn json(v: impl Serialize) -> Result<serde_json::Value, DataplaneError> {
    serde_json::to_value(v).map_err(|error| DataplaneError::Encode {
        what: "the result",
        error,
    })
}

impl Dataplane for Datapath {
    fn add_port(&mut self, p: &PortInfo, tables: &PortTables) -> Result<(), DataplaneError> {
        let id = self.engine.add_port(p.config.to_engine())?;
        // The tables are in force before the tap exists: the port's first frame
        // already meets them.
        if let Err(e) = self.set_tables(&p.config.name, tables) {
            let _ = self.engine.remove_port(&p.config.name);
            return Err(e);
        }
        let Some(io) = &self.io else {
            return Ok(());
        };
        // A vhost-user kick wakes the worker like its doorbell.
        let tap = not_an_underlay_link(p, &io.queues)
            .and_then(|()| open_guest(p, &io.epoll, TOKEN_DOORBELL))
            .and_then(|t| io.watch_tap(&t, u64::from(id.0)).map(|()| t));
        let tap = match tap {
            Ok(t) => t,
            Err(e) => {
                let _ = self.engine.remove_port(&p.config.name);
                return Err(e);
            }
        };
        let i = id.0 as usize;
        if self.taps.len() <= i {
            self.taps.resize_with(i + 1, || None);
        }
        self.next_gen += 1;
        self.taps[i] = Some(PortTap {
            info: p.clone(),
            gen: self.next_gen,
            link: TapLink::Up(tap),
        });
        Ok(())
    }

    fn remove_port(&mut self, name: &str) -> Result<(), DataplaneError> {
        let id = self.engine.remove_port(name)?;
        self.fw_rule_ids.remove(name);
        if let Some(io) = self.io.as_mut() {
            io.captures.forget(id);
        }
        let slot = id.0 as usize;
        let (Some(port), Some(io)) = (self.taps.get_mut(slot).and_then(Option::take), &self.io)
        else {
            return Ok(());
        };
        match port.link {
            TapLink::Up(tap) => {
                io.unwatch_tap(&tap);
                // A tap is destroyed; an attached interface stays its owner's; a
                // vhost-user port stops serving its socket.
                if let Err(e) = tap.release() {
                    tracing::warn!(port = name, error = %e, "tap not destroyed");
                }
            }
            TapLink::Down { .. } => io.reattach.forget(slot, port.gen),
        }
        Ok(())
    }

    fn set_v2p(&mut self, e: &V2pEntry) -> Result<(), DataplaneError> {
        let vni = e.vni;
        Ok(self
            .engine
            .set_v2p(vni, e.vpc_ip, e.underlay_ip, e.vpc_mac)?)
    }

    fn clear_v2p(&mut self, vpc_ip: IpAddr, vni: Vni) -> Result<(), DataplaneError> {
        Ok(self.engine.clear_v2p(vni, vpc_ip)?)
    }

    fn set_v2b(&mut self, table: &V2b) -> Result<(), DataplaneError> {
        Ok(self.engine.set_v2b(table)?)
    }

    fn set_routes(&mut self, port: &str, routes: &[RouteEntry]) -> Result<(), DataplaneError> {
        let before = self.routes(port)?;
        if let Err(e) = self.sync_routes(port, routes) {
            // Put back what was there; this only deletes and re-adds known-good routes.
            if let Err(undo) = self.sync_routes(port, &before) {
                tracing::error!(port, error = %undo, "routing table not restored");
            }
            return Err(e);
        }
        Ok(())
    }

    fn routes(&self, port: &str) -> Result<Vec<RouteEntry>, DataplaneError> {
        Ok(self
            .engine
            .dump_routes(port)?
            .into_iter()
            .map(|r| RouteEntry {
                dest: r.dst,
                target: r.target.to_api(),
                mtu: r.mtu,
                class: r.class.to_api(),
            })
            .collect())
    }

    fn set_fw_rules(&mut self, port: &str, rules: &[FwRule]) -> Result<(), DataplaneError> {
        let (mut compiled, mut origin) = (Vec::new(), Vec::new());
        for r in rules {
            let c = engine_fw_rules(r)?;
            origin.extend(std::iter::repeat_n(r.id, c.len()));
            compiled.extend(c);
        }
        let ids = self.engine.set_fw_rules(port, compiled)?;
        self.fw_rule_ids
            .insert(port.to_string(), ids.into_iter().zip(origin).collect());
        Ok(())
    }

    fn set_port_paused(&mut self, port: &str, paused: bool) -> Result<(), DataplaneError> {
        Ok(self.engine.set_port_paused(port, paused)?)
    }

    fn port_state(&self, port: &str) -> Result<PortState, DataplaneError> {
        Ok(self.engine.port_state(port)?.to_api())
    }

    fn clear_uft(&mut self, port: &str) -> Result<(), DataplaneError> {
        Ok(self.engine.clear_uft(port)?)
    }

    fn clear_lft(&mut self, port: &str, layer: &str) -> Result<u64, DataplaneError> {
        Ok(self.engine.clear_lft(port, layer)?)
    }

    fn export_live(&mut self, port: &str) -> Result<LiveState, DataplaneError> {
        Ok(self.engine.export_live(port)?)
    }

    fn import_live(&mut self, port: &str, flows: &LiveState) -> Result<Imported, DataplaneError> {
        Ok(self.engine.import_live(port, flows)?)
    }

    fn relay_departed(
        &mut self,
        vni: Vni,
        mac: MacAddr,
        to: Option<Ipv6Addr>,
    ) -> Result<(), DataplaneError> {
        match to {
            Some(to) => {
                self.engine.relay_departed_to(vni, mac, to)?;
                // Asked for now, the next hop toward the guest's new sled is
                // known by the time the first frame to relay arrives (a miss
                // then drops it: `moved_not_relayed`).
                if let Some(io) = &self.io {
                    let _ = io.next_hops.lookup(to);
                }
            }
            None => self.engine.forget_departed(vni, mac),
        }
        Ok(())
    }

    fn set_external_ips(&mut self, port: &str, ext: &ExternalIps) -> Result<(), DataplaneError> {
        Ok(self.engine.set_external_ips(port, ext.to_engine())?)
    }

    fn set_port_limits(&mut self, port: &str, limits: &PortLimits) -> Result<(), DataplaneError> {
        Ok(self.engine.set_port_limits(port, limits.to_engine())?)
    }

    fn set_port_cidrs(&mut self, port: &str, cidrs: &PortCidrs) -> Result<(), DataplaneError> {
        Ok(self.engine.set_port_cidrs(port, cidrs.to_engine())?)
    }

    fn inspect(&mut self, what: &Inspect) -> Result<serde_json::Value, DataplaneError> {
        match what {
            Inspect::Layer { port, layer } => {
                let mut v = json(self.engine.dump_layer(port, layer)?)?;
                if let Some(ids) = self.fw_rule_ids.get(port).filter(|_| layer == "firewall") {
                    label_fw_rules(&mut v, ids);
                }
                Ok(v)
            }
            Inspect::Layers { port } => json(self.engine.list_layers(port)?),
            Inspect::TcpFlows { port } => json(self.engine.dump_tcp_flows(port)?),
            Inspect::Uft {
                port,
                cursor,
                limit,
            } => {
                // Without a limit, the engine's largest page.
                let limit = limit.unwrap_or(usize::MAX);
                json(self.engine.dump_uft(port, cursor.unwrap_or(0), limit)?)
            }
            Inspect::Mtu { port } => json(self.engine.mtu_budget(port)?),
            Inspect::Ra { port } => {
                let info = self
                    .engine
                    .ra_info(port)?
                    .ok_or_else(|| DataplaneError::NoRa(port.clone()))?;
                let mut v = json(info)?;
                // The engine's clock is ours: say how long ago, not the raw nanoseconds.
                if let Some(sent) = v.get("last_sent_ns").and_then(serde_json::Value::as_u64) {
                    let ago = self.now().saturating_sub(sent) / 1_000_000;
                    v["last_sent_ms_ago"] = ago.into();
                }
                Ok(v)
            }
            Inspect::Stats { port: Some(port) } => {
                let stats = self.engine.stats();
                let p = stats
                    .ports
                    .into_iter()
                    .find(|p| &p.name == port)
                    .ok_or_else(|| DataplaneError::NoSuchPort(port.clone()))?;
                let mut v = json(p)?;
                let vhost = self
                    .taps
                    .iter()
                    .flatten()
                    .find(|t| &t.info.config.name == port)
                    .and_then(|t| t.link.negotiated());
                if let (Some(n), serde_json::Value::Object(m)) = (vhost, &mut v) {
                    m.insert("vhost_user".into(), json(n)?);
                }
                Ok(v)
            }
            Inspect::Stats { port: None } => json(self.report()),
            // A daemon without workers (headless): this datapath is the one worker.
            Inspect::V2b => json(self.engine.dump_v2b()),
            Inspect::Workers => {
                let ports = self.engine.stats().ports.into_iter().map(|p| p.name);
                let view = WorkerView::new(0, ports.collect(), self.info(), &self.stats);
                json([view])
            }
        }
    }
}

impl Datapath {
    /// The link state of each of this worker's ports, and what a vhost-user
    /// port's front end negotiated.
    pub(crate) fn port_links(&self) -> Vec<(String, (PortLink, Option<VhostNegotiation>))> {
        self.taps
            .iter()
            .flatten()
            .map(|p| {
                let name = p.info.config.name.clone();
                (name, (p.link.view(), p.link.negotiated()))
            })
            .collect()
    }

    /// Starts feeding port `port`'s frames (and its underlay frames if
    /// `underlay`) to `feed` (a job on the port's worker).
    pub(crate) fn start_capture(
        &mut self,
        port: &str,
        underlay: bool,
        feed: Feed,
    ) -> Result<(), CaptureError> {
        let no_port = || CaptureError::NoSuchPort(port.to_string());
        let id = self.engine.port_id(port).ok_or_else(no_port)?;
        let cfg = self.engine.port_config(port).map_err(|_| no_port())?;
        let underlay = underlay.then_some((cfg.vni.get(), cfg.guest_mac));
        let io = self.io.as_mut().ok_or(CaptureError::NoIo)?;
        io.captures.add(Tap {
            port: id,
            underlay,
            feed,
        })
    }
}

impl WorkerPlane for Datapath {
    fn report(&mut self) -> WorkerReport {
        let xsk = self.io.as_ref().map(|io| io.queues.stats());
        let next_hops = self.io.as_ref().map(|io| io.next_hops.stats());
        let tx = self
            .io
            .as_ref()
            .map_or_else(UnderlayTx::default, |io| io.underlay_tx.clone());
        WorkerReport::new(self.engine.stats(), self.stats.clone(), xsk, next_hops, tx)
    }

    fn info(&self) -> WorkerInfo {
        let queues = self.io.as_ref().map_or_else(Vec::new, |io| {
            let socks = io.queues.sockets.iter();
            socks
                .map(|s| QueueRef {
                    ifindex: s.ifindex(),
                    queue: s.queue(),
                })
                .collect()
        });
        WorkerInfo {
            core: self.core,
            queues,
            started_unix_ms: unix_ms(self.started),
        }
    }

    fn set_port_owner(&mut self, port: &PortKey, owner: Option<usize>) {
        match owner {
            // This worker's own port: its engine has it already.
            Some(w) if w == self.index => {}
            Some(w) => {
                let worker = u16::try_from(w).unwrap_or(u16::MAX);
                if let Err(e) = self
                    .engine
                    .set_sibling_port(port.vni, port.mac, &port.ips, port.mtu, worker)
                {
                    // The owner's engine refused a port colliding with one of ours
                    // when it was created, so this does not happen.
                    tracing::error!(worker = w, error = %e, "another worker's port not recorded");
                }
            }
            None => self
                .engine
                .clear_sibling_port(port.vni, port.mac, &port.ips),
        }
    }
}

/// Adds to each engine rule of a firewall dump the id of the rule it was compiled
/// from (`fw_rule`), which `rm-fw-rule --dir DIR ID` takes.
fn label_fw_rules(dump: &mut serde_json::Value, ids: &HashMap<u64, u64>) {
    for side in ["inbound", "outbound"] {
        let Some(rules) = dump[side]["rules"].as_array_mut() else {
            continue;
        };
        for r in rules {
            let origin = r["id"].as_u64().and_then(|id| ids.get(&id));
            if let (Some(&o), Some(m)) = (origin, r.as_object_mut()) {
                m.insert("fw_rule".into(), o.into());
            }
        }
    }
}

/// A finalized engine firewall rule with its direction.
type EngineFwRule = (engine::Direction, Rule<Finalized, engine::FwAction>);

/// Compiles an API firewall rule into engine rules: the remote host is the source
/// of inbound traffic and the destination of outbound; several ports become one rule
/// per port (the engine's predicates are all-of).
fn engine_fw_rules(r: &FwRule) -> Result<Vec<EngineFwRule>, DataplaneError> {
    let dir = match r.direction {
        Direction::In => engine::Direction::In,
        Direction::Out => engine::Direction::Out,
    };
    let action = match r.action {
        FwAction::Allow => engine::FwAction::Allow,
        FwAction::Deny => engine::FwAction::Deny,
    };
    // The remote end: the source of inbound traffic, the destination of outbound.
    let remote = |n: IpNet| match dir {
        engine::Direction::In => Predicate::SrcIp(n),
        engine::Direction::Out => Predicate::DstIp(n),
    };
    let host = match r.filters.host {
        FwHost::Any => None,
        FwHost::Ip(ip) => Some(remote(IpNet::from(ip))),
        FwHost::Subnet(n) => Some(remote(n)),
        FwHost::Vni(v) => Some(Predicate::Vni(v.get())),
    };
    let proto = r.filters.proto.number();
    let base = || {
        let mut rule = Rule::new(r.priority, action);
        if let Some(h) = host {
            rule = rule.matching(h);
        }
        if let Some(p) = proto {
            rule = rule.matching(Predicate::Proto(p));
        }
        if let Some(i) = r.filters.icmp {
            rule = rule.matching(Predicate::IcmpType(i.icmp_type));
            if let Some(c) = i.code {
                rule = rule.matching(Predicate::IcmpCode(c));
            }
        }
        rule
    };
    let unfinished = if r.filters.ports.is_empty() {
        vec![base()]
    } else {
        r.filters
            .ports
            .iter()
            .map(|p| {
                let (start, end) = p.bounds();
                base().matching(Predicate::DstPort(PortRange { start, end }))
            })
            .collect()
    };
    unfinished
        .into_iter()
        .map(|u| {
            u.finalize()
                .map(|f| (dir, f))
                .map_err(|e| DataplaneError::FwRule {
                    rule: r.clone(),
                    why: e.to_string(),
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::Controller;
    use api::{FwFilters, FwPorts, FwProto, Outcome, Reply, Request};
    use engine::{Engine, EngineConfig};
    /// `dump-layer PORT firewall` labels each engine rule with the id of the rule it
    /// came from (several ports: several engine rules, one id), and `rm-fw-rule`
    /// by that id removes that rule, checking its direction.
    #[test]
    fn firewall_dump_shows_the_ids_rm_fw_rule_takes() {
        let engine = Engine::new(EngineConfig::new("fd00::1".parse().unwrap())).unwrap();
        let mut c = Controller::new(Datapath::without_io(engine), None);
        let call = |c: &mut Controller<Datapath>, r: Request| match c.handle(r) {
            Outcome::Ok(Reply::Inspect(v)) => v,
            Outcome::Ok(_) => serde_json::Value::Null,
            Outcome::Error(e) => panic!("{e}"),
        };
        let port = || "opte0".to_string();
        call(
            &mut c,
            Request::CreatePort(Box::new(PortInfo {
                config: api::testing::sample_port("opte0", 5),
                netns: None,
                vhost_user: None,
                attach: None,
            })),
        );
        let rule = FwRule {
            id: 0,
            direction: Direction::In,
            priority: 10,
            action: FwAction::Allow,
            filters: FwFilters {
                host: FwHost::Any,
                proto: FwProto::Tcp,
                ports: vec![
                    FwPorts::One(22),
                    FwPorts::Range {
                        start: 8000,
                        end: 8080,
                    },
                ],
                icmp: None,
            },
        };
        call(&mut c, Request::AddFwRule { port: port(), rule });
        let dump = |c: &mut Controller<Datapath>| {
            let v = call(
                c,
                Request::DumpLayer {
                    port: port(),
                    layer: "firewall".into(),
                },
            );
            v["inbound"]["rules"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| {
                    (
                        r["fw_rule"].as_u64().unwrap(),
                        r["priority"].as_u64().unwrap(),
                    )
                })
                .collect::<Vec<_>>()
        };
        // The two default VPC rules (ids 1, 2), then the new one, one engine rule
        // per port.
        assert_eq!(dump(&mut c), [(3, 10), (3, 10), (1, 65534), (2, 65534)]);
        let rm = |c: &mut Controller<Datapath>, direction, id| {
            c.handle(Request::RmFwRuleId {
                port: port(),
                direction,
                id,
            })
        };
        let Outcome::Error(e) = rm(&mut c, Some(Direction::Out), 3) else {
            panic!("removed through the wrong direction")
        };
        assert_eq!(e.code, api::ErrorCode::Conflict);
        assert!(
            e.message.contains("not a out rule") && e.message.contains("prio=10"),
            "{e}"
        );
        let Outcome::Error(e) = rm(&mut c, Some(Direction::In), 4) else {
            panic!("removed a rule that is not there")
        };
        assert_eq!(e.code, api::ErrorCode::NotFound);
        let e = e.message;
        assert!(
            e.contains("no firewall rule 4") && e.contains("1, 2, 3"),
            "{e}"
        );
        assert_eq!(rm(&mut c, Some(Direction::In), 1), Outcome::Ok(Reply::Done));
        // Ids are stable: the others keep theirs.
        assert_eq!(dump(&mut c), [(3, 10), (3, 10), (2, 65534)]);
        // A VPC, ICMP type and code rule compiles to the engine's predicates; it
        // gets the next id (never one removed), and goes by id alone.
        let ptb = FwRule {
            id: 77,
            direction: Direction::In,
            priority: 5,
            action: FwAction::Allow,
            filters: FwFilters {
                host: FwHost::Vni(Vni::new(1701).unwrap()),
                proto: FwProto::Icmp6,
                ports: vec![],
                icmp: Some(api::IcmpMatch {
                    icmp_type: 2,
                    code: Some(0),
                }),
            },
        };
        call(
            &mut c,
            Request::AddFwRule {
                port: port(),
                rule: ptb,
            },
        );
        let v = call(
            &mut c,
            Request::DumpLayer {
                port: port(),
                layer: "firewall".into(),
            },
        );
        let first = &v["inbound"]["rules"][0];
        assert_eq!(first["fw_rule"], 4);
        assert_eq!(
            first["predicates"],
            serde_json::json!([{"vni": 1701}, {"proto": 58}, {"icmp_type": 2}, {"icmp_code": 0}])
        );
        assert_eq!(
            v["inbound"]["rules"][2]["predicates"][1]["dst_port"]["end"],
            8080
        );
        let Outcome::Ok(Reply::FwRules(listed)) = c.handle(Request::ListFwRules { port: port() })
        else {
            panic!("no rule list")
        };
        let ids: Vec<u64> = listed.iter().map(|r| r.id).collect();
        assert_eq!(ids, [2, 3, 4]);
        assert_eq!(
            listed[2].to_string(),
            "id=4 in prio=5 allow host=vni=1701 proto=icmp6:2/0"
        );
        assert_eq!(rm(&mut c, None, 4), Outcome::Ok(Reply::Done));
        assert_eq!(dump(&mut c), [(3, 10), (3, 10), (2, 65534)]);
    }
}
