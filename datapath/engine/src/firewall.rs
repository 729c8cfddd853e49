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
//! after TIME-WAIT. Only a full handshake establishes an inbound connection (the
//! peer's SYN, the guest's SYN|ACK, the peer's ACK), and a TCP flow first seen
//! without a SYN (mid-stream, e.g. after a daemon restart) is picked up only from the
//! guest's side: remote peers cannot create long-lived entries on their own.
//!
//! ICMP: only echo requests open connections (their replies are then admitted).
//! Every other ICMP message is decided by the rules alone and tracked by nothing;
//! an ICMP error is also admitted, in either direction, when the packet it quotes
//! belongs to a live connection (a "related" packet; the decision is not cached).
//!
//! The table has a size limit; a full table evicts an expired, half-open (or
//! unanswered) or closed connection if it finds one among the first few it inspects,
//! and otherwise refuses the new flow.
//!
//! Connections live in a slab indexed by a keyed hash map. A decision hands back a
//! [`ConnHandle`] (slot and generation) that the unified flow table keeps, so that a
//! packet of a cached flow reaches its connection with [`Firewall::track_handle`]
//! instead of hashing and probing the key a second time. Removing a connection
//! (expiry, eviction, replacement, `clear_flows`) bumps its slot's generation, which
//! turns every handle to it into a miss: the flow is decided again.

use crate::flow::{flow_map, FlowKey, FlowMap, PROTO_TCP};
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
    /// Inbound TCP without SYN and without a connection: even with an allowing rule,
    /// a remote peer opens a connection only with a SYN (mid-stream flows are picked
    /// up from the guest's side only).
    pub const MIDSTREAM_IN: &str = "fw_midstream_in";
}

/// How [`Firewall::decide`] admitted a flow's first packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// A new connection was created: a decision cached for the other direction (a
    /// deny, taken before the connection existed) is out of date.
    Created,
    /// An existing connection covers the packet.
    Tracked,
    /// A rule allowed it and nothing is tracked (ICMP other than echo requests): the
    /// decision holds until the rules change.
    Stateless,
    /// An ICMP error quoting a packet of a live connection: holds for this packet
    /// only.
    Related,
}

impl Decision {
    /// Whether a cached decision must be confirmed by [`Firewall::track`] on every
    /// later packet (false only for stateless decisions, which hold for the epoch).
    pub fn needs_conn(self) -> bool {
        self != Decision::Stateless
    }
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
    /// ...and answered it with SYN|ACK; the peer's ACK completes the handshake.
    SynAckSent,
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
            // Only the side that did not send the SYN (the guest) moves a passive
            // open on, and only the peer's ACK of that completes it: a remote peer
            // cannot establish a connection with its own ACK.
            (SynRcvd, Out) if ack => SynAckSent,
            (SynAckSent, In) if ack => Established,
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
            Closed | SynSent | SynRcvd | SynAckSent => l.tcp_incipient_ns,
            Established => l.tcp_established_ns,
            TimeWait => l.tcp_time_wait_ns,
            FinWait1 | FinWait2 | CloseWait | LastAck => l.other_ns,
        }
    }

    /// Half-open: the first to go when the table is full.
    fn incipient(self) -> bool {
        matches!(
            self,
            TcpState::SynSent | TcpState::SynRcvd | TcpState::SynAckSent
        )
    }

    /// Closed: the next to go.
    fn closed(self) -> bool {
        matches!(self, TcpState::Closed | TcpState::TimeWait)
    }
}

/// One tracked connection, keyed by its outbound orientation (guest is the source).
#[derive(Clone, Copy, Debug)]
struct Conn {
    tcp: Option<TcpState>,
    /// Who sent the first packet.
    initiator: Direction,
    /// A packet went the other way (for non-TCP flows: answered, not just offered).
    replied: bool,
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

    /// Eviction preference, lowest first; `None` for connections a full table keeps
    /// (established, closing, or answered non-TCP flows). Expired entries go first,
    /// then half-open TCP and unanswered non-TCP flows (what a flood from remote
    /// peers creates), then closed TCP.
    fn eviction_rank(&self, now: u64, l: &FlowLimits) -> Option<u8> {
        if !self.live(now, l) {
            return Some(0);
        }
        match self.tcp {
            Some(s) if s.incipient() => Some(1),
            Some(s) if s.closed() => Some(2),
            Some(_) => None,
            None if !self.replied => Some(1),
            None => None,
        }
    }
}

/// A direct reference to a tracked connection (see the module doc). A handle outliving
/// its connection is refused by [`Firewall::track_handle`], never redirected to the
/// slot's next occupant: generations are 64-bit and never repeat.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnHandle {
    slot: u32,
    gen: u64,
}

/// One slab slot: its generation and, while occupied, the connection's key and state.
#[derive(Clone, Debug)]
struct Slot {
    gen: u64,
    conn: Option<(FlowKey, Conn)>,
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
    /// Connection key (guest as source) -> slot in `slots`.
    index: FlowMap<u32>,
    /// The connections. A freed slot goes on `free` with its generation bumped.
    slots: Vec<Slot>,
    free: Vec<u32>,
    limits: FlowLimits,
    stats: FirewallStats,
}

impl Firewall {
    /// `hash_seed` keys the connection table's hash (see `flow`).
    pub fn new(limits: FlowLimits, hash_seed: u64) -> Self {
        Firewall {
            layer: Layer::new("firewall"),
            index: flow_map(hash_seed),
            slots: Vec::new(),
            free: Vec::new(),
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

    /// The live connection with connection key `ck`, by slot.
    fn find(&self, ck: &FlowKey) -> Option<(u32, &Conn)> {
        let slot = *self.index.get(ck)?;
        let (_, c) = self.slots.get(slot as usize)?.conn.as_ref()?;
        Some((slot, c))
    }

    fn handle(&self, slot: u32) -> Option<ConnHandle> {
        let s = self.slots.get(slot as usize)?;
        s.conn.as_ref().map(|_| ConnHandle { slot, gen: s.gen })
    }

    /// Decides the first packet of a flow (a flow-table miss) and tracks it.
    /// `quoted` is, for an ICMP error, the flow of the packet it quotes (in that
    /// packet's own orientation), if it could be read.
    pub fn decide(
        &mut self,
        dir: Direction,
        f: &MatchFields,
        tcp_flags: u8,
        quoted: Option<&FlowKey>,
        now: u64,
    ) -> Result<Decision, &'static str> {
        self.decide_conn(dir, f, tcp_flags, quoted, now)
            .map(|(d, _)| d)
    }

    /// [`Firewall::decide`], also returning the handle of the connection that admitted
    /// the packet (`Created` and `Tracked` decisions), for the flow table to keep.
    pub fn decide_conn(
        &mut self,
        dir: Direction,
        f: &MatchFields,
        tcp_flags: u8,
        quoted: Option<&FlowKey>,
        now: u64,
    ) -> Result<(Decision, Option<ConnHandle>), &'static str> {
        let ck = Self::conn_key(dir, &f.key);
        if let Some((slot, c)) = self.find(&ck) {
            if c.live(now, &self.limits) {
                let h = self.handle(slot);
                if let Some(h) = h {
                    self.track_handle(h, dir, tcp_flags, now);
                }
                return Ok((Decision::Tracked, h));
            }
        }
        if f.key.is_icmp_error() {
            // The quoted packet went the other way: an error toward the guest quotes
            // something the guest sent.
            let back = match dir {
                Direction::In => Direction::Out,
                Direction::Out => Direction::In,
            };
            let related = quoted.is_some_and(|q| {
                self.find(&Self::conn_key(back, q))
                    .is_some_and(|(_, c)| c.live(now, &self.limits))
            });
            if related {
                return Ok((Decision::Related, None));
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
        if !f.key.opens_connection() {
            return Ok((Decision::Stateless, None));
        }
        let is_tcp = f.key.proto == PROTO_TCP;
        let syn = tcp_flags & SYN != 0;
        if is_tcp && !syn && dir == Direction::In {
            return Err(reason::MIDSTREAM_IN);
        }
        // A dead connection with the same key is replaced by a new one (a new
        // generation: handles to the old one stop working).
        if let Some(&slot) = self.index.get(&ck) {
            self.release(slot);
        } else if self.index.len() >= self.limits.fw_flow_limit {
            self.evict_one(now)?;
        }
        // With a SYN the state machine starts from Closed; a TCP flow the guest sends
        // without one (e.g. after a daemon restart) is picked up as established.
        let tcp = is_tcp.then(|| {
            if syn {
                TcpState::Closed.next(dir, tcp_flags)
            } else {
                TcpState::Established.next(dir, tcp_flags)
            }
        });
        let conn = Conn {
            tcp,
            initiator: dir,
            replied: false,
            created: now,
            last_seen: now,
        };
        let h = self.occupy(ck, conn);
        self.stats.flows_created += 1;
        Ok((Decision::Created, Some(h)))
    }

    /// Puts a connection into a free (or new) slot and indexes it.
    fn occupy(&mut self, ck: FlowKey, conn: Conn) -> ConnHandle {
        let slot = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(Slot { gen: 0, conn: None });
                // The table limit is far below 2^32 connections.
                (self.slots.len() - 1) as u32
            }
        };
        let s = &mut self.slots[slot as usize];
        s.conn = Some((ck, conn));
        self.index.insert(ck, slot);
        ConnHandle { slot, gen: s.gen }
    }

    /// Frees a slot: unindexes its connection and bumps its generation.
    fn release(&mut self, slot: u32) {
        if let Some(s) = self.slots.get_mut(slot as usize) {
            if let Some((k, _)) = s.conn.take() {
                self.index.remove(&k);
                s.gen += 1;
                self.free.push(slot);
            }
        }
    }

    /// Frees one entry of a full table: the best-ranked (see `Conn::eviction_rank`)
    /// of the first [`EVICT_SCAN`] entries, or `TABLE_FULL` if none of them may go.
    fn evict_one(&mut self, now: u64) -> Result<(), &'static str> {
        let limits = &self.limits;
        let slots = &self.slots;
        let victim = self
            .index
            .values()
            .take(EVICT_SCAN)
            .filter_map(|&i| {
                let (_, c) = slots.get(i as usize)?.conn.as_ref()?;
                c.eviction_rank(now, limits).map(|r| (r, i))
            })
            .min_by_key(|(r, _)| *r)
            .map(|(_, i)| i);
        match victim {
            Some(i) => {
                self.release(i);
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
        match self.index.get(&ck).and_then(|&slot| self.handle(slot)) {
            Some(h) => self.track_handle(h, dir, tcp_flags, now),
            None => false,
        }
    }

    /// [`Firewall::track`] by handle (the fast path: no hashing). False if the
    /// handle's connection is gone (its slot was freed, whatever occupies it now) or
    /// idle past its timeout.
    #[inline]
    pub fn track_handle(&mut self, h: ConnHandle, dir: Direction, tcp_flags: u8, now: u64) -> bool {
        let limits = &self.limits;
        match self.slots.get_mut(h.slot as usize) {
            Some(Slot {
                gen,
                conn: Some((_, c)),
            }) if *gen == h.gen && c.live(now, limits) => {
                c.last_seen = now;
                c.replied |= dir != c.initiator;
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
        for slot in 0..self.slots.len() {
            let dead = match &self.slots[slot].conn {
                Some((k, c)) if !c.live(now, &limits) => {
                    gone(k);
                    true
                }
                _ => false,
            };
            if dead {
                self.release(slot as u32);
                n += 1;
            }
        }
        self.stats.flows_expired += n;
    }

    /// Drops every connection (the port is going away or its rules were replaced).
    pub fn clear_flows(&mut self) {
        for slot in 0..self.slots.len() as u32 {
            self.release(slot);
        }
    }

    pub fn tcp_state(&self, conn_key: &FlowKey) -> Option<TcpState> {
        self.find(conn_key).and_then(|(_, c)| c.tcp)
    }

    pub fn stats(&self) -> FirewallStats {
        FirewallStats {
            flows: self.index.len() as u64,
            ..self.stats
        }
    }

    pub fn dump_flows(&self, now: u64) -> Vec<ConnDump> {
        let mut v: Vec<ConnDump> = self
            .slots
            .iter()
            .filter_map(|s| s.conn.as_ref())
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
                icmp_type: 0,
                icmp_code: 0,
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
            (SynRcvd, Direction::Out, SYN | ACK, SynAckSent),
            (SynAckSent, Direction::In, ACK, Established),
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
        let mut fw = Firewall::new(FlowLimits::default(), 1);
        let f = out_fields(40000, 80);
        // Unsolicited inbound is denied by default.
        assert_eq!(
            fw.decide(Direction::In, &reply(&f), SYN | ACK, None, 0),
            Err(reason::DENY_IN)
        );
        assert_eq!(
            fw.decide(Direction::Out, &f, SYN, None, 1),
            Ok(Decision::Created)
        );
        assert_eq!(fw.tcp_state(&f.key), Some(SynSent));
        assert_eq!(
            fw.decide(Direction::In, &reply(&f), SYN | ACK, None, 2),
            Ok(Decision::Tracked)
        );
        assert_eq!(fw.tcp_state(&f.key), Some(Established));
        // A different port on the same host is still denied.
        assert_eq!(
            fw.decide(Direction::In, &reply(&out_fields(40001, 80)), SYN, None, 3),
            Err(reason::DENY_IN)
        );
        assert_eq!(fw.dump().inbound.denied, 2);
    }

    #[test]
    fn inbound_rule_admits_and_outbound_rule_denies() {
        let mut fw = Firewall::new(FlowLimits::default(), 1);
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
        assert_eq!(
            fw.decide(Direction::In, &inbound, SYN, None, 0),
            Ok(Decision::Created)
        );
        // The guest's reply is allowed by the connection despite the deny rule.
        assert_eq!(
            fw.decide(Direction::Out, &reply(&inbound), SYN | ACK, None, 1),
            Ok(Decision::Tracked)
        );
        assert_eq!(fw.tcp_state(&reply(&inbound).key), Some(SynAckSent));
        // A new outbound flow to that host is denied.
        assert_eq!(
            fw.decide(Direction::Out, &out_fields(1, 2), SYN, None, 2),
            Err(reason::DENY_OUT)
        );
    }

    #[test]
    fn timeouts_follow_the_tcp_state() {
        let l = FlowLimits::default();
        let mut fw = Firewall::new(l, 1);
        let f = out_fields(1000, 80);
        fw.decide(Direction::Out, &f, SYN, None, 0).unwrap();
        // Half-open: gone after 5 s.
        assert!(fw.track(Direction::Out, &f.key, SYN, 4 * S));
        let mut gone = vec![];
        fw.expire(9 * S + 1, |k| gone.push(*k));
        assert_eq!(gone, vec![f.key]);
        assert_eq!(fw.stats().flows_expired, 1);
        // Established: survives 5 s and 60 s idle, expires after 8000 s.
        fw.decide(Direction::Out, &f, SYN, None, 10 * S).unwrap();
        fw.decide(Direction::In, &reply(&f), SYN | ACK, None, 10 * S)
            .unwrap();
        fw.expire(100 * S, |_| {});
        assert_eq!(fw.stats().flows, 1);
        assert!(!fw.track(Direction::Out, &f.key, ACK, 8011 * S));
        // Time-wait: 120 s.
        let g = out_fields(1001, 80);
        fw.decide(Direction::Out, &g, SYN, None, 0).unwrap();
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
        let mut fw = Firewall::new(l, 1);
        let a = out_fields(1, 80);
        let b = out_fields(2, 80);
        fw.decide(Direction::Out, &a, SYN, None, 0).unwrap();
        fw.decide(Direction::Out, &b, ACK, None, 0).unwrap(); // picked up established
                                                              // `a` is half-open, so it is evicted for the newcomer.
        fw.decide(Direction::Out, &out_fields(3, 80), ACK, None, 1)
            .unwrap();
        assert_eq!(fw.stats().flows_evicted, 1);
        assert_eq!(fw.tcp_state(&a.key), None);
        // Two established flows: nothing to evict, the new flow is refused.
        assert_eq!(
            fw.decide(Direction::Out, &out_fields(4, 80), ACK, None, 2),
            Err(reason::TABLE_FULL)
        );
        assert_eq!(fw.stats().flows, 2);
    }

    #[test]
    fn a_remote_peer_cannot_complete_its_own_handshake() {
        // Peer SYN then peer ACK, without the guest's SYN|ACK: still half-open.
        assert_eq!(Closed.next(Direction::In, SYN), SynRcvd);
        assert_eq!(SynRcvd.next(Direction::In, ACK), SynRcvd);
        assert_eq!(SynRcvd.next(Direction::In, SYN | ACK), SynRcvd);
        // The guest's SYN|ACK alone does not establish either: the peer must answer.
        assert_eq!(SynRcvd.next(Direction::Out, SYN | ACK), SynAckSent);
        assert_eq!(SynAckSent.next(Direction::Out, ACK), SynAckSent);
        assert_eq!(SynAckSent.next(Direction::In, ACK), Established);
    }

    fn allow_in_443() -> Firewall {
        let l = FlowLimits {
            fw_flow_limit: 64,
            ..FlowLimits::default()
        };
        let mut fw = Firewall::new(l, 0x5eed);
        let r = Rule::new(100, FwAction::Allow)
            .matching(Predicate::Proto(PROTO_TCP))
            .matching(Predicate::DstPort(PortRange::single(443)))
            .finalize()
            .unwrap();
        fw.layer_mut().add(Direction::In, r);
        fw
    }

    #[test]
    fn mid_stream_pickup_is_for_the_guest_side_only() {
        let mut fw = allow_in_443();
        let inbound = reply(&out_fields(443, 5555));
        assert_eq!(
            fw.decide(Direction::In, &inbound, ACK, None, 0),
            Err(reason::MIDSTREAM_IN)
        );
        assert_eq!(fw.stats().flows, 0);
        // The guest's own segment of the same flow picks it up; the peer's then pass.
        let out = reply(&inbound);
        assert_eq!(
            fw.decide(Direction::Out, &out, ACK, None, 1),
            Ok(Decision::Created)
        );
        assert_eq!(fw.tcp_state(&out.key), Some(Established));
        assert_eq!(
            fw.decide(Direction::In, &inbound, ACK, None, 2),
            Ok(Decision::Tracked)
        );
    }

    #[test]
    fn inbound_floods_do_not_fill_the_table_with_established_entries() {
        let mut fw = allow_in_443();
        // One ACK from each of many source ports: nothing is created.
        for sp in 1000..11000u16 {
            let f = reply(&out_fields(443, sp));
            assert_eq!(
                fw.decide(Direction::In, &f, ACK, None, 0),
                Err(reason::MIDSTREAM_IN)
            );
        }
        assert_eq!(fw.stats().flows, 0);
        // SYNs, each followed by the peer's own ACK: the table fills with half-open
        // entries only, which new connections may evict.
        for sp in 1000..11000u16 {
            let f = reply(&out_fields(443, sp));
            fw.decide(Direction::In, &f, SYN, None, 1).unwrap();
            assert!(fw.track(Direction::In, &f.key, ACK, 1));
        }
        assert_eq!(fw.stats().flows, 64);
        assert!(fw
            .dump_flows(1)
            .iter()
            .all(|c| c.tcp_state == Some(SynRcvd)));
        // The guest can still open connections, and a real inbound handshake works.
        assert_eq!(
            fw.decide(Direction::Out, &out_fields(40000, 80), SYN, None, 2),
            Ok(Decision::Created)
        );
        let f = reply(&out_fields(443, 20000));
        fw.decide(Direction::In, &f, SYN, None, 2).unwrap();
        assert!(fw.track(Direction::Out, &f.key.reversed(), SYN | ACK, 2));
        assert!(fw.track(Direction::In, &f.key, ACK, 2));
        assert_eq!(fw.tcp_state(&f.key.reversed()), Some(Established));
    }

    #[test]
    fn eviction_prefers_unanswered_flows() {
        let l = FlowLimits {
            fw_flow_limit: 2,
            ..FlowLimits::default()
        };
        let mut fw = Firewall::new(l, 1);
        let udp = |sp| {
            let mut f = out_fields(sp, 53);
            f.key.proto = crate::flow::PROTO_UDP;
            f
        };
        let (a, b, c) = (udp(1), udp(2), udp(3));
        fw.decide(Direction::Out, &a, 0, None, 0).unwrap();
        fw.decide(Direction::Out, &b, 0, None, 0).unwrap();
        // `a` is answered, `b` is not: `b` goes.
        assert!(fw.track(Direction::In, &a.key.reversed(), 0, 0));
        fw.decide(Direction::Out, &c, 0, None, 1).unwrap();
        let keys: Vec<u16> = fw.dump_flows(1).iter().map(|d| d.key.src_port).collect();
        assert_eq!(keys, vec![1, 3]);
    }

    fn handle_of(
        fw: &mut Firewall,
        dir: Direction,
        f: &MatchFields,
        flags: u8,
        now: u64,
    ) -> ConnHandle {
        match fw.decide_conn(dir, f, flags, None, now) {
            Ok((Decision::Created | Decision::Tracked, Some(h))) => h,
            other => panic!("expected a connection handle, got {other:?}"),
        }
    }

    #[test]
    fn handles_track_their_connection_and_agree_with_keys() {
        let mut fw = Firewall::new(FlowLimits::default(), 1);
        let f = out_fields(40000, 80);
        let h = handle_of(&mut fw, Direction::Out, &f, SYN, 0);
        // The reply direction reaches the same connection, by key or by handle.
        assert_eq!(
            handle_of(&mut fw, Direction::In, &reply(&f), SYN | ACK, 1),
            h
        );
        assert_eq!(fw.tcp_state(&f.key), Some(Established));
        assert!(fw.track_handle(h, Direction::Out, FIN | ACK, 2));
        assert_eq!(fw.tcp_state(&f.key), Some(FinWait1));
        // A second connection gets another slot.
        let g = handle_of(&mut fw, Direction::Out, &out_fields(40001, 80), SYN, 2);
        assert_ne!(g, h);
        // Idle past the timeout: refused by handle as by key, even before a sweep.
        assert!(!fw.track_handle(g, Direction::Out, ACK, 100 * S));
        assert!(!fw.track(Direction::Out, &out_fields(40001, 80).key, ACK, 100 * S));
    }

    #[test]
    fn handles_die_with_their_connection_and_never_reach_a_successor() {
        let l = FlowLimits {
            fw_flow_limit: 1,
            ..FlowLimits::default()
        };
        let mut fw = Firewall::new(l, 1);
        let (a, b) = (out_fields(1, 80), out_fields(2, 80));
        // Expiry frees the slot; the next connection reuses it under a new generation.
        let ha = handle_of(&mut fw, Direction::Out, &a, SYN, 0);
        fw.expire(10 * S, |_| {});
        let hb = handle_of(&mut fw, Direction::Out, &b, SYN, 10 * S);
        assert_eq!(hb.slot, ha.slot, "the freed slot is reused");
        assert!(!fw.track_handle(ha, Direction::Out, ACK, 10 * S));
        assert!(fw.track_handle(hb, Direction::Out, ACK, 10 * S));
        // Eviction (a full table, `b` half-open): `b`'s handle dies, `a`'s new one lives.
        let ha2 = handle_of(&mut fw, Direction::Out, &a, SYN, 11 * S);
        assert_eq!(fw.stats().flows_evicted, 1);
        assert!(!fw.track_handle(hb, Direction::Out, ACK, 11 * S));
        assert!(!fw.track_handle(ha, Direction::Out, ACK, 11 * S));
        assert!(fw.track_handle(ha2, Direction::Out, ACK, 11 * S));
        // Replacing a dead connection under the same key: a new handle, the old dies.
        let ha3 = handle_of(&mut fw, Direction::Out, &a, SYN, 30 * S);
        assert_ne!(ha3, ha2);
        assert!(!fw.track_handle(ha2, Direction::Out, ACK, 30 * S));
        assert!(fw.track_handle(ha3, Direction::Out, ACK, 30 * S));
        assert_eq!(fw.stats().flows, 1);
        // Clearing kills every handle and empties the table.
        fw.clear_flows();
        assert!(!fw.track_handle(ha3, Direction::Out, ACK, 30 * S));
        assert_eq!((fw.stats().flows, fw.tcp_state(&a.key)), (0, None));
        assert!(fw.dump_flows(30 * S).is_empty());
        // A handle from another table's slot space is refused, not a panic.
        let mut other = Firewall::new(FlowLimits::default(), 1);
        for sp in 0..4 {
            handle_of(&mut other, Direction::Out, &out_fields(sp, 80), SYN, 0);
        }
        let far = handle_of(&mut other, Direction::Out, &out_fields(9, 80), SYN, 0);
        assert!(!fw.track_handle(far, Direction::Out, ACK, 30 * S));
    }

    fn icmp(t: u8, code: u8, id: u16) -> MatchFields {
        let mut f = out_fields(0, 0);
        f.key.proto = crate::flow::PROTO_ICMP;
        f.key.icmp_type = t;
        f.key.icmp_code = code;
        f.key.src_port = id;
        f.key.dst_port = id;
        f.icmp_type = Some(t);
        f
    }

    #[test]
    fn icmp_echo_is_tracked_and_other_types_are_decided_alone() {
        let mut fw = Firewall::new(FlowLimits::default(), 1);
        let req = icmp(8, 0, 9);
        let mut rep = req;
        rep.key = req.key.reversed();
        rep.icmp_type = Some(0);
        assert_eq!(
            fw.decide(Direction::Out, &req, 0, None, 0),
            Ok(Decision::Created)
        );
        assert_eq!(
            fw.decide(Direction::In, &rep, 0, None, 0),
            Ok(Decision::Tracked)
        );
        // The echo connection admits no other type from that host.
        let mut unreach = icmp(3, 1, 0);
        unreach.key = unreach.key.reversed();
        assert_eq!(
            fw.decide(Direction::In, &unreach, 0, None, 0),
            Err(reason::DENY_IN)
        );
        // An outbound error is allowed by the default rule but opens nothing, so
        // nothing comes back in on it.
        let err = icmp(3, 3, 0);
        assert_eq!(
            fw.decide(Direction::Out, &err, 0, None, 0),
            Ok(Decision::Stateless)
        );
        assert_eq!(fw.stats().flows, 1);
        let mut back = err;
        back.key = err.key.reversed();
        assert_eq!(
            fw.decide(Direction::In, &back, 0, None, 0),
            Err(reason::DENY_IN)
        );
        // An inbound allow for type 3 admits type 3 only, and tracks nothing.
        let r = Rule::new(100, FwAction::Allow)
            .matching(Predicate::IcmpType(3))
            .finalize()
            .unwrap();
        fw.layer_mut().add(Direction::In, r);
        assert_eq!(
            fw.decide(Direction::In, &unreach, 0, None, 0),
            Ok(Decision::Stateless)
        );
        let mut exceeded = icmp(11, 0, 0);
        exceeded.key = exceeded.key.reversed();
        assert_eq!(
            fw.decide(Direction::In, &exceeded, 0, None, 0),
            Err(reason::DENY_IN)
        );
        assert_eq!(fw.stats().flows, 1);
    }

    #[test]
    fn icmp_errors_about_live_connections_are_related() {
        let mut fw = Firewall::new(FlowLimits::default(), 1);
        let tcp = out_fields(40000, 443);
        fw.decide(Direction::Out, &tcp, SYN, None, 0).unwrap();
        let mut exceeded = icmp(11, 0, 0);
        exceeded.key = exceeded.key.reversed();
        // Quoting the guest's own packet: admitted, nothing created.
        assert_eq!(
            fw.decide(Direction::In, &exceeded, 0, Some(&tcp.key), 1),
            Ok(Decision::Related)
        );
        assert_eq!(fw.stats().flows, 1);
        // Quoting another flow, or nothing: the rules (default deny) decide.
        let other = out_fields(40001, 443).key;
        for q in [Some(&other), None] {
            assert_eq!(
                fw.decide(Direction::In, &exceeded, 0, q, 1),
                Err(reason::DENY_IN)
            );
        }
        // Once the connection has expired, the same quote is no longer related.
        assert_eq!(
            fw.decide(Direction::In, &exceeded, 0, Some(&tcp.key), 10 * S),
            Err(reason::DENY_IN)
        );
        // An outbound error about an inbound-created connection is related too.
        let mut fw = Firewall::new(FlowLimits::default(), 1);
        fw.layer_mut().add(
            Direction::Out,
            Rule::new(1, FwAction::Deny).finalize().unwrap(),
        );
        fw.layer_mut().add(
            Direction::In,
            Rule::new(1, FwAction::Allow).finalize().unwrap(),
        );
        let mut udp_in = reply(&out_fields(53, 3000));
        udp_in.key.proto = crate::flow::PROTO_UDP;
        fw.decide(Direction::In, &udp_in, 0, None, 0).unwrap();
        let unreach = icmp(3, 3, 0);
        assert_eq!(
            fw.decide(Direction::Out, &unreach, 0, Some(&udp_in.key), 0),
            Ok(Decision::Related)
        );
        assert_eq!(
            fw.decide(Direction::Out, &unreach, 0, None, 0),
            Err(reason::DENY_OUT)
        );
    }
}
