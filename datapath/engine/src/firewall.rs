//! The stateful firewall layer.
//!
//! Policy: rules decide the *first* packet of a flow; after that the connection
//! table decides. A flow the guest opens (outbound allowed, by rule or by the default
//! allow) permits its replies inbound; a flow a rule lets in permits the guest's
//! replies out. Without a connection entry or an allowing rule, inbound is denied —
//! the reference VPC's defaults (outbound allow all, inbound deny).
//!
//! TCP connections are tracked from the guest's point of view on the flags alone (no
//! sequence-number checks), which is enough to choose the right idle timeout:
//! half-open connections expire in seconds, established ones in hours, closed ones
//! after TIME-WAIT. The table has a size limit; a full table evicts a connection that
//! is closing or half-open if it finds one quickly, and otherwise refuses the new flow.

use crate::flow::{FlowKey, FlowMap, PROTO_TCP};
use crate::layer::{Layer, LayerDump};
use crate::rule::{Direction, MatchFields};
use core::fmt;
use serde::{Deserialize, Serialize};

/// What a firewall rule does with a flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FwAction {
    Allow,
    Deny,
}

impl fmt::Display for FwAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FwAction::Allow => "allow",
            FwAction::Deny => "deny",
        })
    }
}

/// Drop reasons this layer produces (counter names).
pub mod reason {
    /// An outbound rule denied the flow.
    pub const DENY_OUT: &str = "fw_deny_out";
    /// No connection and no inbound rule allowed the flow.
    pub const DENY_IN: &str = "fw_deny_in";
    /// The connection table is full of live connections.
    pub const TABLE_FULL: &str = "fw_table_full";
}

const NS_PER_SEC: u64 = 1_000_000_000;

/// Idle timeouts and table sizes for flows (defaults as in the reference).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowLimits {
    /// TCP connections not yet established (SYN seen), and closed ones.
    pub tcp_incipient_ns: u64,
    pub tcp_established_ns: u64,
    pub tcp_time_wait_ns: u64,
    /// Every other flow (UDP, ICMP, closing TCP) and unified-flow-table entries.
    pub other_ns: u64,
    /// Connections per port.
    pub fw_flow_limit: usize,
    /// Unified flow table entries per port and direction.
    pub uft_limit: usize,
}

impl Default for FlowLimits {
    fn default() -> Self {
        FlowLimits {
            tcp_incipient_ns: 5 * NS_PER_SEC,
            tcp_established_ns: 8000 * NS_PER_SEC,
            tcp_time_wait_ns: 120 * NS_PER_SEC,
            other_ns: 60 * NS_PER_SEC,
            fw_flow_limit: 524_288,
            uft_limit: 65_536,
        }
    }
}

impl FlowLimits {
    /// Refuses zero sizes and zero timeouts, naming the field.
    pub fn validate(&self) -> Result<(), String> {
        for (name, v) in [
            ("tcp_incipient_ns", self.tcp_incipient_ns),
            ("tcp_established_ns", self.tcp_established_ns),
            ("tcp_time_wait_ns", self.tcp_time_wait_ns),
            ("other_ns", self.other_ns),
            ("fw_flow_limit", self.fw_flow_limit as u64),
            ("uft_limit", self.uft_limit as u64),
        ] {
            if v == 0 {
                return Err(format!("flow limit {name} must be above 0"));
            }
        }
        Ok(())
    }
}

/// TCP connection state, seen from the guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TcpState {
    Closed,
    /// The guest sent a SYN.
    SynSent,
    /// The guest received a SYN.
    SynRcvd,
    Established,
    /// The guest sent the first FIN.
    FinWait1,
    /// ...and the peer acknowledged something after it.
    FinWait2,
    /// The peer sent the first FIN.
    CloseWait,
    /// ...and the guest sent its FIN.
    LastAck,
    /// Both sides sent FIN.
    TimeWait,
}

const FIN: u8 = 0x01;
const SYN: u8 = 0x02;
const RST: u8 = 0x04;
const ACK: u8 = 0x10;

impl TcpState {
    /// The state after a segment with `flags` going `dir`.
    pub fn next(self, dir: Direction, flags: u8) -> TcpState {
        use Direction::{In, Out};
        use TcpState::*;
        let syn = flags & SYN != 0;
        let ack = flags & ACK != 0;
        let fin = flags & FIN != 0;
        if flags & RST != 0 {
            return Closed;
        }
        match (self, dir) {
            (Closed | TimeWait, Out) if syn && !ack => SynSent,
            (Closed | TimeWait, In) if syn && !ack => SynRcvd,
            (SynSent, In) if syn && ack => Established,
            // Simultaneous open.
            (SynSent, In) if syn => SynRcvd,
            (SynRcvd, _) if ack && !syn => Established,
            (Established, Out) if fin => FinWait1,
            (Established, In) if fin => CloseWait,
            (FinWait1 | FinWait2, In) if fin => TimeWait,
            (FinWait1, In) if ack => FinWait2,
            (CloseWait, Out) if fin => LastAck,
            (LastAck, In) if ack => Closed,
            (s, _) => s,
        }
    }

    fn timeout(self, l: &FlowLimits) -> u64 {
        use TcpState::*;
        match self {
            Closed | SynSent | SynRcvd => l.tcp_incipient_ns,
            Established => l.tcp_established_ns,
            TimeWait => l.tcp_time_wait_ns,
            FinWait1 | FinWait2 | CloseWait | LastAck => l.other_ns,
        }
    }

    /// Worth keeping less than an established connection when the table is full.
    fn evictable(self) -> bool {
        matches!(
            self,
            TcpState::Closed | TcpState::TimeWait | TcpState::SynSent | TcpState::SynRcvd
        )
    }
}

/// One tracked connection, keyed by its outbound orientation (guest is the source).
#[derive(Clone, Copy, Debug)]
struct Conn {
    tcp: Option<TcpState>,
    /// Who sent the first packet.
    initiator: Direction,
    created: u64,
    last_seen: u64,
}

impl Conn {
    fn timeout(&self, l: &FlowLimits) -> u64 {
        self.tcp.map_or(l.other_ns, |s| s.timeout(l))
    }

    fn live(&self, now: u64, l: &FlowLimits) -> bool {
        now.saturating_sub(self.last_seen) < self.timeout(l)
    }
}

/// A connection in `dump-tcp-flows` / stats output.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ConnDump {
    /// The flow with the guest as source.
    pub key: FlowKey,
    pub initiator: Direction,
    pub tcp_state: Option<TcpState>,
    pub age_ns: u64,
    pub idle_ns: u64,
}

/// Counters of the connection table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FirewallStats {
    pub flows: u64,
    pub flows_created: u64,
    pub flows_expired: u64,
    pub flows_evicted: u64,
}

/// How many entries a full table inspects looking for one to evict: bounded so a
/// table full of established connections costs a new flow little.
const EVICT_SCAN: usize = 16;

/// The firewall of one port: rules plus connection table.
#[derive(Debug)]
pub struct Firewall {
    layer: Layer<FwAction>,
    conns: FlowMap<Conn>,
    limits: FlowLimits,
    stats: FirewallStats,
}

impl Firewall {
    pub fn new(limits: FlowLimits) -> Self {
        Firewall {
            layer: Layer::new("firewall"),
            conns: FlowMap::default(),
            limits,
            stats: FirewallStats::default(),
        }
    }

    pub fn layer(&self) -> &Layer<FwAction> {
        &self.layer
    }

    pub fn layer_mut(&mut self) -> &mut Layer<FwAction> {
        &mut self.layer
    }

    pub fn dump(&self) -> LayerDump {
        self.layer.dump(("deny", "allow"))
    }

    /// The connection key (guest as source) of a packet going `dir` with key `key`.
    fn conn_key(dir: Direction, key: &FlowKey) -> FlowKey {
        match dir {
            Direction::Out => *key,
            Direction::In => key.reversed(),
        }
    }

    /// Decides the first packet of a flow (a flow-table miss) and tracks it. `Ok(true)`
    /// when this created the connection: a decision cached for the other direction
    /// (a deny, taken before the connection existed) is then out of date.
    pub fn decide(
        &mut self,
        dir: Direction,
        f: &MatchFields,
        tcp_flags: u8,
        now: u64,
    ) -> Result<bool, &'static str> {
        let ck = Self::conn_key(dir, &f.key);
        if let Some(c) = self.conns.get(&ck) {
            if c.live(now, &self.limits) {
                self.track(dir, &f.key, tcp_flags, now);
                return Ok(false);
            }
        }
        let allowed = match self.layer.evaluate(dir, f) {
            Some((_, a)) => *a == FwAction::Allow,
            None => dir == Direction::Out,
        };
        if !allowed {
            self.layer.count_deny(dir);
            return Err(match dir {
                Direction::In => reason::DENY_IN,
                Direction::Out => reason::DENY_OUT,
            });
        }
        if !self.conns.contains_key(&ck) && self.conns.len() >= self.limits.fw_flow_limit {
            self.evict_one(now)?;
        }
        let is_tcp = f.key.proto == PROTO_TCP;
        // A TCP flow first seen without a SYN (e.g. after a daemon restart) is
        // picked up as established; with a SYN the state machine starts from Closed.
        let tcp = is_tcp.then(|| {
            if tcp_flags & SYN != 0 {
                TcpState::Closed.next(dir, tcp_flags)
            } else {
                TcpState::Established.next(dir, tcp_flags)
            }
        });
        self.conns.insert(
            ck,
            Conn {
                tcp,
                initiator: dir,
                created: now,
                last_seen: now,
            },
        );
        self.stats.flows_created += 1;
        Ok(true)
    }

    fn evict_one(&mut self, now: u64) -> Result<(), &'static str> {
        let victim = self
            .conns
            .iter()
            .take(EVICT_SCAN)
            .find(|(_, c)| !c.live(now, &self.limits) || c.tcp.is_some_and(TcpState::evictable))
            .map(|(k, _)| *k);
        match victim {
            Some(k) => {
                self.conns.remove(&k);
                self.stats.flows_evicted += 1;
                Ok(())
            }
            None => Err(reason::TABLE_FULL),
        }
    }

    /// Tracks a packet of a known flow (flow-table hit). False if the flow has no
    /// live connection any more: the caller must decide it again.
    pub fn track(&mut self, dir: Direction, key: &FlowKey, tcp_flags: u8, now: u64) -> bool {
        let ck = Self::conn_key(dir, key);
        let limits = &self.limits;
        match self.conns.get_mut(&ck) {
            Some(c) if c.live(now, limits) => {
                c.last_seen = now;
                if let Some(s) = c.tcp.as_mut() {
                    *s = s.next(dir, tcp_flags);
                }
                true
            }
            _ => false,
        }
    }

    /// Removes connections idle past their timeout, calling `gone` with each one's
    /// key (guest as source) so the caller can drop cached flows of it.
    pub fn expire(&mut self, now: u64, mut gone: impl FnMut(&FlowKey)) {
        let limits = self.limits;
        let mut n = 0;
        self.conns.retain(|k, c| {
            let keep = c.live(now, &limits);
            if !keep {
                gone(k);
                n += 1;
            }
            keep
        });
        self.stats.flows_expired += n;
    }

    /// Drops every connection (the port is going away or its rules were replaced).
    pub fn clear_flows(&mut self) {
        self.conns.clear();
    }

    pub fn tcp_state(&self, conn_key: &FlowKey) -> Option<TcpState> {
        self.conns.get(conn_key).and_then(|c| c.tcp)
    }

    pub fn stats(&self) -> FirewallStats {
        FirewallStats {
            flows: self.conns.len() as u64,
            ..self.stats
        }
    }

    pub fn dump_flows(&self, now: u64) -> Vec<ConnDump> {
        let mut v: Vec<ConnDump> = self
            .conns
            .iter()
            .map(|(k, c)| ConnDump {
                key: *k,
                initiator: c.initiator,
                tcp_state: c.tcp,
                age_ns: now.saturating_sub(c.created),
                idle_ns: now.saturating_sub(c.last_seen),
            })
            .collect();
        v.sort_by_key(|d| (d.key.src_port, d.key.dst_port, d.key.dst_ip));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rule::{PortRange, Predicate, Rule};
    use TcpState::*;

    const S: u64 = NS_PER_SEC;

    fn out_fields(sp: u16, dp: u16) -> MatchFields {
        MatchFields {
            key: FlowKey {
                vni: 7,
                proto: PROTO_TCP,
                src_ip: "10.0.0.5".parse().unwrap(),
                dst_ip: "10.0.0.9".parse().unwrap(),
                src_port: sp,
                dst_port: dp,
            },
            icmp_type: None,
        }
    }

    fn reply(f: &MatchFields) -> MatchFields {
        MatchFields {
            key: f.key.reversed(),
            icmp_type: None,
        }
    }

    #[test]
    fn client_handshake_and_close() {
        let seq = [
            (Closed, Direction::Out, SYN, SynSent),
            (SynSent, Direction::In, SYN | ACK, Established),
            (Established, Direction::Out, ACK, Established),
            (Established, Direction::Out, FIN | ACK, FinWait1),
            (FinWait1, Direction::In, ACK, FinWait2),
            (FinWait2, Direction::In, FIN | ACK, TimeWait),
            (TimeWait, Direction::Out, SYN, SynSent),
        ];
        for (from, dir, flags, to) in seq {
            assert_eq!(from.next(dir, flags), to, "{from:?} {dir} {flags:#x}");
        }
    }

    #[test]
    fn server_handshake_passive_close_and_reset() {
        let seq = [
            (Closed, Direction::In, SYN, SynRcvd),
            (SynRcvd, Direction::Out, SYN | ACK, SynRcvd),
            (SynRcvd, Direction::In, ACK, Established),
            (Established, Direction::In, FIN | ACK, CloseWait),
            (CloseWait, Direction::Out, FIN | ACK, LastAck),
            (LastAck, Direction::In, ACK, Closed),
            (Established, Direction::In, RST, Closed),
            (SynSent, Direction::In, SYN, SynRcvd),
            (FinWait1, Direction::In, FIN | ACK, TimeWait),
        ];
        for (from, dir, flags, to) in seq {
            assert_eq!(from.next(dir, flags), to, "{from:?} {dir} {flags:#x}");
        }
    }

    #[test]
    fn outbound_flow_permits_replies_only() {
        let mut fw = Firewall::new(FlowLimits::default());
        let f = out_fields(40000, 80);
        // Unsolicited inbound is denied by default.
        assert_eq!(
            fw.decide(Direction::In, &reply(&f), SYN | ACK, 0),
            Err(reason::DENY_IN)
        );
        assert_eq!(fw.decide(Direction::Out, &f, SYN, 1), Ok(true));
        assert_eq!(fw.tcp_state(&f.key), Some(SynSent));
        assert_eq!(
            fw.decide(Direction::In, &reply(&f), SYN | ACK, 2),
            Ok(false)
        );
        assert_eq!(fw.tcp_state(&f.key), Some(Established));
        // A different port on the same host is still denied.
        assert_eq!(
            fw.decide(Direction::In, &reply(&out_fields(40001, 80)), SYN, 3),
            Err(reason::DENY_IN)
        );
        assert_eq!(fw.dump().inbound.denied, 2);
    }

    #[test]
    fn inbound_rule_admits_and_outbound_rule_denies() {
        let mut fw = Firewall::new(FlowLimits::default());
        let r = Rule::new(100, FwAction::Allow)
            .matching(Predicate::Proto(PROTO_TCP))
            .matching(Predicate::DstPort(PortRange::single(22)))
            .finalize()
            .unwrap();
        fw.layer_mut().add(Direction::In, r);
        let d = Rule::new(100, FwAction::Deny)
            .matching(Predicate::DstIp("10.0.0.9/32".parse().unwrap()))
            .finalize()
            .unwrap();
        fw.layer_mut().add(Direction::Out, d);
        let inbound = reply(&out_fields(22, 5555)); // 10.0.0.9:5555 -> guest:22
        assert_eq!(fw.decide(Direction::In, &inbound, SYN, 0), Ok(true));
        // The guest's reply is allowed by the connection despite the deny rule.
        assert_eq!(
            fw.decide(Direction::Out, &reply(&inbound), SYN | ACK, 1),
            Ok(false)
        );
        assert_eq!(fw.tcp_state(&reply(&inbound).key), Some(SynRcvd));
        // A new outbound flow to that host is denied.
        assert_eq!(
            fw.decide(Direction::Out, &out_fields(1, 2), SYN, 2),
            Err(reason::DENY_OUT)
        );
    }

    #[test]
    fn timeouts_follow_the_tcp_state() {
        let l = FlowLimits::default();
        let mut fw = Firewall::new(l);
        let f = out_fields(1000, 80);
        fw.decide(Direction::Out, &f, SYN, 0).unwrap();
        // Half-open: gone after 5 s.
        assert!(fw.track(Direction::Out, &f.key, SYN, 4 * S));
        let mut gone = vec![];
        fw.expire(9 * S + 1, |k| gone.push(*k));
        assert_eq!(gone, vec![f.key]);
        assert_eq!(fw.stats().flows_expired, 1);
        // Established: survives 5 s and 60 s idle, expires after 8000 s.
        fw.decide(Direction::Out, &f, SYN, 10 * S).unwrap();
        fw.decide(Direction::In, &reply(&f), SYN | ACK, 10 * S)
            .unwrap();
        fw.expire(100 * S, |_| {});
        assert_eq!(fw.stats().flows, 1);
        assert!(!fw.track(Direction::Out, &f.key, ACK, 8011 * S));
        // Time-wait: 120 s.
        let g = out_fields(1001, 80);
        fw.decide(Direction::Out, &g, SYN, 0).unwrap();
        for (dir, fl) in [
            (Direction::In, SYN | ACK),
            (Direction::Out, FIN | ACK),
            (Direction::In, FIN | ACK),
        ] {
            let k = if dir == Direction::Out {
                g.key
            } else {
                g.key.reversed()
            };
            assert!(fw.track(dir, &k, fl, S));
        }
        assert_eq!(fw.tcp_state(&g.key), Some(TimeWait));
        assert!(fw.track(Direction::Out, &g.key, ACK, 120 * S));
        assert!(!fw.track(Direction::Out, &g.key, ACK, 241 * S));
    }

    #[test]
    fn full_table_evicts_closing_flows_then_refuses() {
        let l = FlowLimits {
            fw_flow_limit: 2,
            ..FlowLimits::default()
        };
        let mut fw = Firewall::new(l);
        let a = out_fields(1, 80);
        let b = out_fields(2, 80);
        fw.decide(Direction::Out, &a, SYN, 0).unwrap();
        fw.decide(Direction::Out, &b, ACK, 0).unwrap(); // picked up established
                                                        // `a` is half-open, so it is evicted for the newcomer.
        fw.decide(Direction::Out, &out_fields(3, 80), ACK, 1)
            .unwrap();
        assert_eq!(fw.stats().flows_evicted, 1);
        assert_eq!(fw.tcp_state(&a.key), None);
        // Two established flows: nothing to evict, the new flow is refused.
        assert_eq!(
            fw.decide(Direction::Out, &out_fields(4, 80), ACK, 2),
            Err(reason::TABLE_FULL)
        );
        assert_eq!(fw.stats().flows, 2);
    }
}
