//! The management API: ports, sibling workers' ports, V2P and V2B, routes, firewall
//! rules, external addresses, limits and allowed prefixes, and the inspection calls.
//! Every call that changes what the paths decide moves the epochs of the flows it
//! may invalidate (see the module doc of `pipeline`); a refused call changes
//! nothing.
//!
//! A call refuses what conflicts with the engine's state or exceeds its own bounds
//! ([`EngineError`]); it does not check a port's configuration on its own (the
//! API does, `api::PortConfig::validate`), and none of its values can make the
//! engine panic (`tests/unchecked.rs`).

use super::config::EngineConfig;
use super::dispatch::{LocalDest, Owner};
use super::error::EngineError;
use super::ports::{slot_mut, Port, PortCounters};
use super::Engine;
use crate::ids::{PortId, Vni};
use crate::machinery::conntrack::{ConnDump, FlowLimits};
use crate::machinery::layer::RuleId;
use crate::machinery::ratelimit::{PortLimits, PortPolicer};
use crate::machinery::rule::{Direction, Finalized, Rule};
use crate::machinery::uft::Uft;
use crate::vpc::firewall::{Firewall, FwAction};
use crate::vpc::gateway::{self, GatewayState, MtuBudget, RaInfo};
use crate::vpc::nat::{ExternalIps, SnatTable};
use crate::vpc::overlay::{V2pDump, V2pEntry};
use crate::vpc::port::{PortCidrs, PortConfig, PortState, MAX_PORT_CIDRS, MIN_PORT_MTU};
use crate::vpc::router::{RouteClass, RouteDump, RouteTarget, Router};
use crate::vpc::v2b::{V2b, V2bEntry};
use ipnet::IpNet;
use std::net::{IpAddr, Ipv6Addr};
use wire::MacAddr;

impl Engine {
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// The engine-wide epoch: how many changes so far invalidated every port's
    /// cached flows.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The epoch port `name`'s cached flows are checked against (see
    /// `Engine::bump_port`).
    pub fn port_epoch(&self, name: &str) -> Result<u64, EngineError> {
        self.port_by_name(name).map(|p| p.epoch)
    }

    /// Invalidates every port's cached flows: for changes to what any port's flows
    /// may have used (ports, sibling ports, V2P, V2B, the underlay). Walks the
    /// ports (tens), so that a hit still compares one epoch.
    pub(super) fn bump(&mut self) {
        self.epoch += 1;
        for p in self.ports.iter_mut().flatten() {
            p.epoch += 1;
        }
    }

    /// Invalidates the cached flows of the ports of VPC `vni` only: for a change to
    /// a port that other ports' flows know of only through its VPC's local delivery
    /// (`by_ip`, keyed by VNI), such as its MTU.
    pub(super) fn bump_vni(&mut self, vni: Vni) {
        for p in self.ports.iter_mut().flatten() {
            if p.cfg.vni == vni {
                p.epoch += 1;
            }
        }
    }

    /// Makes every cached flow recompile on its next packet, which asks
    /// [`UnderlayRoutes::next_hops`](super::config::UnderlayRoutes::next_hops) again and rebuilds the outer header (interface,
    /// source and destination MAC). The daemon calls this when its neighbour cache
    /// changes or drops an entry: a busy flow never goes idle long enough to be
    /// recompiled otherwise. Connections are kept; only cached decisions go.
    pub fn invalidate_next_hops(&mut self) {
        // Engine-wide: every port's encapsulated flows hold an outer header.
        self.bump();
    }

    /// Follows a change of the underlay links' MTU: segment sizes and path MTUs are
    /// taken from it (every cached flow is recompiled). Refused below what a
    /// minimum-MTU port needs, naming the value. Returns the ports whose MTU the
    /// underlay no longer carries whole: their large packets now get Packet Too Big
    /// (or are fragmented, IPv4 without DF), and the operator should lower their MTU
    /// or restore the underlay's.
    pub fn set_underlay_mtu(&mut self, mtu: u16) -> Result<Vec<String>, EngineError> {
        if mtu < MIN_PORT_MTU + gateway::ENCAP_BUDGET {
            return Err(EngineError::UnderlayMtuTooSmall { mtu });
        }
        self.cfg.underlay_mtu = mtu;
        // Engine-wide: every port's path MTUs and segment sizes derive from it.
        self.bump();
        let max = self.max_inner_mtu();
        Ok(self
            .ports
            .iter()
            .flatten()
            .filter(|p| p.cfg.mtu > max)
            .map(|p| p.cfg.name.clone())
            .collect())
    }

    pub(super) fn port_by_name(&self, name: &str) -> Result<&Port, EngineError> {
        self.by_name
            .get(name)
            .and_then(|id| self.ports.get(id.0 as usize))
            .and_then(Option::as_ref)
            .ok_or_else(|| no_such_port(name))
    }

    pub(super) fn port_by_name_mut(&mut self, name: &str) -> Result<&mut Port, EngineError> {
        let id = *self.by_name.get(name).ok_or_else(|| no_such_port(name))?;
        slot_mut(&mut self.ports, id).ok_or_else(|| no_such_port(name))
    }

    pub(super) fn check_port_mtu(&self, mtu: u16) -> Result<(), EngineError> {
        let max = self.max_inner_mtu();
        if mtu < MIN_PORT_MTU || mtu > max {
            return Err(EngineError::PortMtuOutOfRange {
                mtu,
                max,
                underlay_mtu: self.cfg.underlay_mtu,
            });
        }
        Ok(())
    }

    /// Refuses a port beyond the number the table budget is shared by.
    pub(super) fn check_port_room(&self, name: &str) -> Result<(), EngineError> {
        let ports = self.ports.iter().flatten().count();
        if ports >= self.cfg.tables.ports {
            return Err(EngineError::TooManyPorts {
                name: name.to_string(),
                ports,
                limit: self.cfg.tables.ports,
            });
        }
        Ok(())
    }

    /// Largest guest IP packet the underlay carries once encapsulated (`new` checked
    /// that the underlay MTU exceeds the encapsulation).
    pub(super) fn max_inner_mtu(&self) -> u16 {
        self.cfg.underlay_mtu.saturating_sub(gateway::ENCAP_BUDGET)
    }

    /// Refuses more prefixes in one list than the per-frame checks scan.
    fn check_port_cidrs(name: &str, cidrs: &PortCidrs) -> Result<(), EngineError> {
        let lists = [
            ("in", &cidrs.inbound),
            ("out", &cidrs.outbound),
            ("exempt from NAT", &cidrs.external),
        ];
        match lists.into_iter().find(|(_, l)| l.len() > MAX_PORT_CIDRS) {
            Some((dir, l)) => Err(EngineError::TooManyPrefixes {
                port: name.to_string(),
                dir,
                count: l.len(),
            }),
            None => Ok(()),
        }
    }

    // ---- Ports ----

    /// Creates a port with the default routes (its VPC subnets -> VPC, and the
    /// default routes -> internet gateway if boundary services are configured) and
    /// the default firewall (outbound allow, inbound deny unless established).
    /// Refuses what conflicts with the engine's state: an MTU outside what the
    /// underlay carries, a port beyond the table budget's, a name, guest MAC or
    /// address taken, too many allowed prefixes. Whether the configuration makes
    /// sense on its own is the API's check (docs/engine.md, "Who checks what").
    pub fn add_port(&mut self, cfg: PortConfig) -> Result<PortId, EngineError> {
        self.check_port_mtu(cfg.mtu)?;
        Self::check_port_cidrs(&cfg.name, &cfg.cidrs)?;
        self.check_port_room(&cfg.name)?;
        if self.by_name.contains_key(&cfg.name) {
            return Err(EngineError::PortExists {
                name: cfg.name.clone(),
            });
        }
        let vni = cfg.vni.get();
        if self.by_mac.get(vni, cfg.guest_mac).is_some() {
            return Err(EngineError::MacInUse {
                mac: cfg.guest_mac,
                vni: cfg.vni,
            });
        }
        let ips: Vec<IpAddr> = cfg
            .ipv4
            .map(IpAddr::V4)
            .into_iter()
            .chain(cfg.ipv6.map(IpAddr::V6))
            .collect();
        for ip in &ips {
            if self.by_ip.contains_key(&(vni, *ip)) {
                return Err(EngineError::AddressInUse {
                    ip: *ip,
                    vni: cfg.vni,
                });
            }
        }
        let mut router = Router::default();
        let subnets = [
            cfg.vpc_subnet4.map(IpNet::V4),
            cfg.vpc_subnet6.map(IpNet::V6),
        ];
        for net in subnets.into_iter().flatten() {
            router.add(net, RouteTarget::VpcSubnet, None)?;
        }
        if self.cfg.boundary_services.is_some() {
            // 0.0.0.0/0 and ::/0.
            for net in [IpNet::V4(Default::default()), IpNet::V6(Default::default())] {
                if router.dump_routes().iter().all(|r| r.dst != net) {
                    router.add(net, RouteTarget::InternetGateway(None), None)?;
                }
            }
        }
        let id = PortId(
            self.ports
                .iter()
                .position(Option::is_none)
                .unwrap_or(self.ports.len()) as u32,
        );
        let limits = self.cfg.tables.port_limits(&self.cfg.flow);
        let lim = FlowLimits {
            fw_flow_limit: limits.conns,
            uft_limit: limits.uft,
            ..self.cfg.flow
        };
        let port = Port {
            id,
            gw: GatewayState::new(self.now),
            fw: Firewall::new(lim, self.cfg.hash_seed),
            router,
            uft_out: Uft::new(lim.uft_limit, lim.other_ns, self.cfg.hash_seed),
            uft_in: Uft::new(lim.uft_limit, lim.other_ns, self.cfg.hash_seed),
            snat: SnatTable::new(self.cfg.hash_seed),
            limits,
            policer: PortPolicer::new(&cfg.limits, self.now),
            c: PortCounters::default(),
            // Any start will do: the tables are new. The bump below moves it.
            epoch: 1,
            mtu_changed: false,
            paused: false,
            arrival: None,
            cfg,
        };
        for ip in ips {
            self.by_ip.insert(
                (vni, ip),
                LocalDest {
                    owner: Owner::Port(id),
                    mac: port.cfg.guest_mac,
                    mtu: port.cfg.mtu,
                },
            );
        }
        self.by_mac.insert(vni, port.cfg.guest_mac, Owner::Port(id));
        // A guest back on this sled within a move's grace period is not relayed.
        self.departures.remove(vni, port.cfg.guest_mac);
        self.by_name.insert(port.cfg.name.clone(), id);
        match self.ports.get_mut(id.0 as usize) {
            Some(slot) => *slot = Some(port),
            None => self.ports.push(Some(port)),
        }
        // Engine-wide: other ports' flows to its addresses were encapsulated or dropped.
        self.bump();
        Ok(id)
    }

    /// Deletes a port and everything it owns; its id may be reused.
    pub fn remove_port(&mut self, name: &str) -> Result<PortId, EngineError> {
        let id = self.port_by_name(name)?.id;
        let Some(p) = self.ports.get_mut(id.0 as usize).and_then(Option::take) else {
            return Err(no_such_port(name));
        };
        let vni = p.cfg.vni.get();
        self.by_name.remove(name);
        self.by_mac.remove(vni, p.cfg.guest_mac);
        for ip in [p.cfg.ipv4.map(IpAddr::V4), p.cfg.ipv6.map(IpAddr::V6)]
            .into_iter()
            .flatten()
        {
            self.by_ip.remove(&(vni, ip));
        }
        // Its id may be reused: nothing it sent may leave as another port's.
        self.hold.purge(|h| h.port == id);
        // Engine-wide: other ports' flows were delivered to it (its id may be reused).
        self.bump();
        Ok(id)
    }

    /// Pauses or resumes a port. Pausing keeps the port's flows, connections, rules
    /// and held frames; its frames are dropped (`port_paused`) until it is resumed.
    /// Connections age meanwhile: one idle past its timeout when the port resumes
    /// is gone, as after any silence.
    pub fn set_port_paused(&mut self, name: &str, paused: bool) -> Result<(), EngineError> {
        self.port_by_name_mut(name)?.paused = paused;
        Ok(())
    }

    /// Whether the port is paused, or has carried a frame yet.
    pub fn port_state(&self, name: &str) -> Result<PortState, EngineError> {
        let p = self.port_by_name(name)?;
        Ok(if p.paused {
            PortState::Paused
        } else if p.c.in_packets == 0 && p.c.out_packets == 0 {
            PortState::Ready
        } else {
            PortState::Running
        })
    }

    pub fn port_id(&self, name: &str) -> Option<PortId> {
        self.by_name.get(name).copied()
    }

    pub fn port_config(&self, name: &str) -> Result<&PortConfig, EngineError> {
        self.port_by_name(name).map(|p| &p.cfg)
    }

    /// Every port, by id.
    pub fn list_ports(&self) -> Vec<(PortId, PortConfig)> {
        self.ports
            .iter()
            .flatten()
            .map(|p| (p.id, p.cfg.clone()))
            .collect()
    }

    /// Changes a port's MTU. The guest hears of it through an RA at the next `tick`.
    pub fn set_port_mtu(&mut self, name: &str, mtu: u16) -> Result<(), EngineError> {
        self.check_port_mtu(mtu)?;
        let p = self.port_by_name_mut(name)?;
        if p.cfg.mtu == mtu {
            return Ok(());
        }
        p.cfg.mtu = mtu;
        p.mtu_changed = true;
        let port_vni = p.cfg.vni;
        let vni = port_vni.get();
        for ip in [p.cfg.ipv4.map(IpAddr::V4), p.cfg.ipv6.map(IpAddr::V6)]
            .into_iter()
            .flatten()
        {
            if let Some(d) = self.by_ip.get_mut(&(vni, ip)) {
                d.mtu = mtu;
            }
        }
        // The port's own flows, and the flows of its VPC's other ports delivered to
        // it here (their path MTU is the smaller of the two ports'): no other port
        // can reach it without encapsulation.
        self.bump_vni(port_vni);
        Ok(())
    }

    /// Replaces port `name`'s external addresses. Every flow of the port is decided
    /// again (its epoch moves): a flow keeps no address the port no longer has. A
    /// changed SNAT range forgets the SNAT ports (they may lie outside it); the
    /// connections stay, and their next packets get new ports.
    pub fn set_external_ips(&mut self, name: &str, ext: ExternalIps) -> Result<(), EngineError> {
        let p = self.port_by_name_mut(name)?;
        if p.cfg.external.snat != ext.snat {
            p.snat.clear();
        }
        p.cfg.external = ext;
        p.epoch += 1;
        Ok(())
    }

    /// Replaces port `name`'s rate limits. The buckets start full; flows are
    /// untouched.
    pub fn set_port_limits(&mut self, name: &str, limits: PortLimits) -> Result<(), EngineError> {
        let now = self.now;
        let p = self.port_by_name_mut(name)?;
        p.cfg.limits = limits;
        p.policer = PortPolicer::new(&limits, now);
        Ok(())
    }

    /// Replaces port `name`'s allowed prefixes (transit IPs and attached subnets;
    /// refused beyond [`MAX_PORT_CIDRS`] a direction). Checked per packet, ahead
    /// of the flow tables, so a removed prefix stops traffic at once; the port's
    /// epoch moves anyway (its flows only: the prefixes are the port's alone).
    pub fn set_port_cidrs(&mut self, name: &str, cidrs: PortCidrs) -> Result<(), EngineError> {
        self.bump_port(name, |p| {
            Self::check_port_cidrs(name, &cidrs)?;
            p.cfg.cidrs = cidrs;
            Ok(())
        })
    }

    // ---- Ports of sibling workers ----

    /// Records that another worker of this sled (`worker`) owns the port with MAC
    /// `mac` and addresses `ips` in VPC `vni`, at MTU `mtu`: frames to it are handed
    /// to that worker ([`TxDest::Sibling`](crate::frames::output::TxDest::Sibling)) rather than encapsulated toward this sled.
    /// Refused when one of this engine's own ports has the MAC or an address.
    pub fn set_sibling_port(
        &mut self,
        vni: Vni,
        mac: MacAddr,
        ips: &[IpAddr],
        mtu: u16,
        worker: u16,
    ) -> Result<(), EngineError> {
        let v = vni.get();
        if let Some(Owner::Port(_)) = self.by_mac.get(v, mac) {
            return Err(EngineError::SiblingMacInUse { mac, vni });
        }
        if let Some(&ip) = ips.iter().find(|ip| {
            matches!(
                self.by_ip.get(&(v, **ip)),
                Some(LocalDest {
                    owner: Owner::Port(_),
                    ..
                })
            )
        }) {
            return Err(EngineError::SiblingAddressInUse { ip, vni });
        }
        let owner = Owner::Sibling(worker);
        self.by_mac.insert(v, mac, owner);
        // The guest is on this sled again: its frames are not relayed.
        self.departures.remove(v, mac);
        for ip in ips {
            self.by_ip.insert((v, *ip), LocalDest { owner, mac, mtu });
        }
        // Engine-wide: other ports' flows to its addresses change delivery.
        self.bump();
        Ok(())
    }

    /// Forgets a port [`Engine::set_sibling_port`] recorded; this engine's own ports
    /// are left alone.
    pub fn clear_sibling_port(&mut self, vni: Vni, mac: MacAddr, ips: &[IpAddr]) {
        let v = vni.get();
        if let Some(Owner::Sibling(_)) = self.by_mac.get(v, mac) {
            self.by_mac.remove(v, mac);
        }
        for ip in ips {
            if let Some(LocalDest {
                owner: Owner::Sibling(_),
                ..
            }) = self.by_ip.get(&(v, *ip))
            {
                self.by_ip.remove(&(v, *ip));
            }
        }
        // Engine-wide, as `set_sibling_port`.
        self.bump();
    }

    // ---- V2P ----

    /// Maps a guest address of VPC `vni` to the sled hosting it and the guest's MAC.
    pub fn set_v2p(
        &mut self,
        vni: Vni,
        ip: IpAddr,
        underlay: Ipv6Addr,
        mac: MacAddr,
    ) -> Result<(), EngineError> {
        self.v2p.set(vni, ip, V2pEntry { underlay, mac })?;
        // Engine-wide: outbound encapsulation and inbound sender checks use V2P.
        self.bump();
        Ok(())
    }

    pub fn clear_v2p(&mut self, vni: Vni, ip: IpAddr) -> Result<(), EngineError> {
        self.v2p.clear(vni, ip)?;
        // Engine-wide, as `set_v2p`.
        self.bump();
        Ok(())
    }

    pub fn dump_v2p(&self) -> Vec<V2pDump> {
        self.v2p.dump()
    }

    // ---- V2B ----

    /// Makes the V2B table `table` plus the `--boundary-services` shorthand: the
    /// daemon owns the table's semantics (`V2b::set`/`clear`) and hands it over
    /// whole, so every worker's engine holds the same one.
    pub fn set_v2b(&mut self, table: &V2b) -> Result<(), EngineError> {
        let mut v2b = V2b::shorthand(self.cfg.boundary_services)?;
        v2b.merge(table);
        self.v2b = v2b;
        // Engine-wide: every flow to the internet gateway chose its endpoint here.
        self.bump();
        Ok(())
    }

    /// The V2B table in force, the shorthand's entries included.
    pub fn dump_v2b(&self) -> Vec<V2bEntry> {
        self.v2b.dump()
    }

    // ---- Routes ----

    /// Adds a route to a port. A route MTU can only lower a flow's path MTU (the
    /// flow gets the smaller of it and the MTU its path has anyway), and may not
    /// exceed what the underlay carries after encapsulation.
    pub fn add_route(
        &mut self,
        port: &str,
        dst: IpNet,
        target: RouteTarget,
        mtu: Option<u16>,
    ) -> Result<(), EngineError> {
        self.add_route_in(port, RouteClass::System, dst, target, mtu)
    }

    /// [`Engine::add_route`] of a route of `class` (a `custom` route wins a tie
    /// with a `system` route of the same prefix).
    pub fn add_route_in(
        &mut self,
        port: &str,
        class: RouteClass,
        dst: IpNet,
        target: RouteTarget,
        mtu: Option<u16>,
    ) -> Result<(), EngineError> {
        let max = self.max_inner_mtu();
        if let Some(mtu) = mtu.filter(|m| *m > max) {
            return Err(EngineError::RouteMtuTooBig {
                mtu,
                dst,
                max,
                underlay_mtu: self.cfg.underlay_mtu,
            });
        }
        let p = self.port_by_name_mut(port)?;
        p.router.add_in(class, dst, target, mtu)?;
        p.epoch += 1;
        Ok(())
    }

    pub fn del_route(&mut self, port: &str, dst: IpNet) -> Result<(), EngineError> {
        self.del_route_in(port, RouteClass::System, dst)
    }

    /// Removes the route of `class` for exactly `dst` (that port's flows are
    /// recompiled).
    pub fn del_route_in(
        &mut self,
        port: &str,
        class: RouteClass,
        dst: IpNet,
    ) -> Result<(), EngineError> {
        self.bump_port(port, |p| Ok(p.router.del_in(class, dst)?))
    }

    pub fn dump_routes(&self, port: &str) -> Result<Vec<RouteDump>, EngineError> {
        Ok(self.port_by_name(port)?.router.dump_routes())
    }

    // ---- Firewall ----

    /// Applies `change` to port `name` and, if it succeeds, invalidates that port's
    /// cached flows only: for changes to what no other port's flows use (its rules,
    /// routes, external addresses). Another port's flow delivered to this one here
    /// is decided again by this port's inbound table, checked against this port's
    /// epoch, so it meets the change too.
    pub(super) fn bump_port<T>(
        &mut self,
        name: &str,
        change: impl FnOnce(&mut Port) -> Result<T, EngineError>,
    ) -> Result<T, EngineError> {
        let p = self.port_by_name_mut(name)?;
        let r = change(p)?;
        p.epoch += 1;
        Ok(r)
    }

    pub fn add_fw_rule(
        &mut self,
        port: &str,
        dir: Direction,
        rule: Rule<Finalized, FwAction>,
    ) -> Result<RuleId, EngineError> {
        self.bump_port(port, |p| Ok(p.fw.layer_mut().add(dir, rule)))
    }

    pub fn rm_fw_rule(
        &mut self,
        port: &str,
        dir: Direction,
        id: RuleId,
    ) -> Result<(), EngineError> {
        self.bump_port(port, |p| match p.fw.layer_mut().remove(dir, id) {
            true => Ok(()),
            false => Err(EngineError::NoSuchRule {
                port: port.to_string(),
                dir,
                id,
            }),
        })
    }

    /// Replaces every firewall rule of the port. Established connections stay (the
    /// firewall is stateful); new flows meet the new rules.
    pub fn set_fw_rules(
        &mut self,
        port: &str,
        rules: Vec<(Direction, Rule<Finalized, FwAction>)>,
    ) -> Result<Vec<RuleId>, EngineError> {
        self.bump_port(port, |p| {
            let layer = p.fw.layer_mut();
            layer.clear();
            Ok(rules.into_iter().map(|(d, r)| layer.add(d, r)).collect())
        })
    }

    // ---- Inspection ----

    /// Forgets the port's cached flows (they are recompiled on their next packet).
    pub fn clear_uft(&mut self, port: &str) -> Result<(), EngineError> {
        let p = self.port_by_name_mut(port)?;
        p.uft_in.clear();
        p.uft_out.clear();
        Ok(())
    }

    /// The port's tracked connections (`dump-tcp-flows`, UDP and ICMP included).
    pub fn dump_tcp_flows(&self, port: &str) -> Result<Vec<ConnDump>, EngineError> {
        Ok(self.port_by_name(port)?.fw.conns().dump_flows(self.now))
    }

    pub fn mtu_budget(&self, port: &str) -> Result<MtuBudget, EngineError> {
        let p = self.port_by_name(port)?;
        Ok(gateway::mtu_budget(
            &p.cfg,
            self.cfg.underlay_mtu,
            self.cfg.external_jumbo,
        ))
    }

    pub fn ra_info(&self, port: &str) -> Result<Option<RaInfo>, EngineError> {
        let p = self.port_by_name(port)?;
        Ok(gateway::ra_info(&p.cfg, &p.gw))
    }
}

/// The refusal of a name no port has.
fn no_such_port(name: &str) -> EngineError {
    EngineError::NoSuchPort {
        name: name.to_string(),
    }
}
