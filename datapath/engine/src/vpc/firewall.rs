//! The stateful firewall layer.
//!
//! Policy: rules decide the *first* packet of a flow; after that the connection
//! table decides. A flow the guest opens (outbound allowed, by rule or by the default
//! allow) permits its replies inbound; a flow a rule lets in permits the guest's
//! replies out. Without a connection entry or an allowing rule, inbound is denied —
//! the reference VPC's defaults (outbound allow all, inbound deny).
//!
//! Deciding and opening are two steps ([`Firewall::decide`], [`Firewall::commit`]):
//! the outbound path opens a connection only once the router and the overlay have
//! accepted the flow, so a guest cannot fill the table with flows that go nowhere.
//!
//! The connections themselves (TCP state and sequence checks, timeouts, eviction,
//! expiry, the handles the flow table keeps) are the generic machinery's
//! (`machinery::conntrack`); this layer says which flows may open one. Only a full
//! handshake establishes an inbound connection (the peer's SYN, the guest's
//! SYN|ACK, the peer's ACK), and a TCP flow first seen without a SYN (mid-stream,
//! e.g. after a daemon restart) is picked up only from the guest's side: remote
//! peers cannot create long-lived entries on their own, and neither can a guest
//! sending into the void.
//!
//! ICMP: only echo requests open connections (their replies are then admitted).
//! Every other ICMP message is decided by the rules alone and tracked by nothing;
//! an ICMP error is also admitted, in either direction, when the packet it quotes
//! belongs to a live connection (a "related" packet; the decision is not cached).

use crate::drop::DropReason;
use crate::machinery::conntrack::{ConnHandle, ConnTable, FlowLimits, Opening, TcpSegment, SYN};
use crate::machinery::flow::{FlowKey, PROTO_TCP};
use crate::machinery::layer::{Layer, LayerDump};
use crate::machinery::rule::{Direction, MatchFields};
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

/// How [`Firewall::decide`] admitted a flow's first packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// A live connection covers the packet (and has tracked it).
    Tracked(ConnHandle),
    /// A rule allowed it and nothing is tracked (ICMP other than echo requests): the
    /// decision holds until the rules change.
    Stateless,
    /// An ICMP error quoting a packet of a live connection: holds for this packet
    /// only.
    Related,
    /// Allowed, and the packet opens a connection, which [`Firewall::commit`] creates
    /// once the rest of the pipeline has accepted the flow.
    Open(Opening),
}

impl Decision {
    /// Whether a cached decision must be confirmed by [`ConnTable::track_handle`] on
    /// every later packet (false only for stateless decisions, which hold for the
    /// epoch).
    pub fn needs_conn(&self) -> bool {
        !matches!(self, Decision::Stateless)
    }
}

/// What [`Firewall::commit`] made of a decision, for the flow table to cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Admission {
    /// The connection that admits the flow.
    pub conn: Option<ConnHandle>,
    /// See [`Decision::needs_conn`].
    pub needs_conn: bool,
    /// A connection was created: a decision cached for the other direction (a deny,
    /// taken before the connection existed) is out of date.
    pub created: bool,
}

/// The firewall of one port: rules plus connection table.
#[derive(Debug)]
pub struct Firewall {
    layer: Layer<FwAction>,
    conns: ConnTable,
}

impl Firewall {
    /// `hash_seed` keys the connection table's hash (see `flow`).
    pub fn new(limits: FlowLimits, hash_seed: u64) -> Self {
        Firewall {
            layer: Layer::new("firewall"),
            conns: ConnTable::new(limits, hash_seed),
        }
    }

    pub fn layer(&self) -> &Layer<FwAction> {
        &self.layer
    }

    pub fn layer_mut(&mut self) -> &mut Layer<FwAction> {
        &mut self.layer
    }

    /// The port's connections.
    #[inline]
    pub fn conns(&self) -> &ConnTable {
        &self.conns
    }

    /// The port's connections, to track a cached flow's packet on or to expire.
    #[inline]
    pub fn conns_mut(&mut self) -> &mut ConnTable {
        &mut self.conns
    }

    pub fn dump(&self) -> LayerDump {
        self.layer.dump(("deny", "allow"))
    }

    /// Decides the first packet of a flow (a flow-table miss), tracking it on its
    /// connection if it has a live one. `seg` is the packet's TCP segment
    /// ([`TcpSegment::read`]); `bytes` its IP length, counted on its connection;
    /// `quoted` is, for an ICMP error, the flow of the
    /// packet it quotes (in that packet's own orientation), if it could be read.
    /// Nothing is created: an [`Decision::Open`] goes to [`Firewall::commit`].
    pub fn decide(
        &mut self,
        dir: Direction,
        f: &MatchFields,
        seg: Option<TcpSegment>,
        bytes: u32,
        quoted: Option<&FlowKey>,
        now: u64,
    ) -> Result<Decision, DropReason> {
        let ck = ConnTable::conn_key(dir, &f.key);
        if let Some(h) = self.conns.live_handle(&ck, now) {
            if self.conns.track_handle(h, dir, seg, bytes, now)? {
                return Ok(Decision::Tracked(h));
            }
        }
        if f.key.is_icmp_error() && self.related(dir, quoted, now) {
            return Ok(Decision::Related);
        }
        let allowed = match self.layer.evaluate(dir, f) {
            Some((_, a)) => *a == FwAction::Allow,
            None => dir == Direction::Out,
        };
        if !allowed {
            self.layer.count_deny(dir);
            return Err(match dir {
                Direction::In => DropReason::FwDenyIn,
                Direction::Out => DropReason::FwDenyOut,
            });
        }
        if !f.key.opens_connection() {
            return Ok(Decision::Stateless);
        }
        let tcp = f.key.proto == PROTO_TCP;
        let syn = seg.is_some_and(|s| s.flags & SYN != 0);
        if tcp && !syn && dir == Direction::In {
            return Err(DropReason::FwMidstreamIn);
        }
        Ok(Decision::Open(Opening {
            key: ck,
            initiator: dir,
            tcp,
            seg,
            bytes,
        }))
    }

    /// Whether an ICMP error going `dir` quotes (`quoted`) a packet of a live
    /// connection. The quoted packet went the other way: an error toward the guest
    /// quotes something the guest sent.
    fn related(&self, dir: Direction, quoted: Option<&FlowKey>, now: u64) -> bool {
        let back = match dir {
            Direction::In => Direction::Out,
            Direction::Out => Direction::In,
        };
        quoted.is_some_and(|q| {
            self.conns
                .live_handle(&ConnTable::conn_key(back, q), now)
                .is_some()
        })
    }

    /// Carries out a decision: opens the connection an [`Decision::Open`] asks for
    /// (refused with `fw_table_full` when the table is full of connections it may not
    /// evict). Call it once the flow is known to go somewhere.
    pub fn commit(&mut self, d: Decision, now: u64) -> Result<Admission, DropReason> {
        let conn = match d {
            Decision::Open(o) => Some(self.conns.open(&o, now)?),
            Decision::Tracked(h) => Some(h),
            Decision::Stateless | Decision::Related => None,
        };
        Ok(Admission {
            conn,
            needs_conn: d.needs_conn(),
            created: matches!(d, Decision::Open(_)),
        })
    }

    /// [`Firewall::decide`] and [`Firewall::commit`] in one, for a packet that has
    /// nothing else to pass (inbound: the port is known).
    pub fn admit(
        &mut self,
        dir: Direction,
        f: &MatchFields,
        seg: Option<TcpSegment>,
        bytes: u32,
        quoted: Option<&FlowKey>,
        now: u64,
    ) -> Result<Admission, DropReason> {
        let d = self.decide(dir, f, seg, bytes, quoted, now)?;
        self.commit(d, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machinery::conntrack::{TcpState, ACK, EXPIRE_SCAN, FIN, RST};
    use crate::machinery::rule::{PortRange, Predicate, Rule};
    use TcpState::*;

    /// A segment with these flags and all-zero numbers, which every window accepts:
    /// these tests are about flags, policy and the table (`tcp` tests the numbers).
    fn flags(fl: u8) -> TcpSegment {
        TcpSegment {
            flags: fl,
            ..TcpSegment::default()
        }
    }

    /// How a packet was admitted, for assertions.
    #[derive(Debug, PartialEq, Eq)]
    enum Got {
        Created,
        Tracked,
        Stateless,
        Related,
    }

    fn admit(
        fw: &mut Firewall,
        dir: Direction,
        f: &MatchFields,
        fl: u8,
        quoted: Option<&FlowKey>,
        now: u64,
    ) -> Result<Got, DropReason> {
        let a = fw.admit(dir, f, Some(flags(fl)), 40, quoted, now)?;
        Ok(match (a.created, a.conn, a.needs_conn) {
            (true, _, _) => Got::Created,
            (false, Some(_), _) => Got::Tracked,
            (false, None, true) => Got::Related,
            (false, None, false) => Got::Stateless,
        })
    }

    /// Tracks a packet of a known flow by its key; false if it has no live connection.
    fn track(fw: &mut Firewall, dir: Direction, key: &FlowKey, fl: u8, now: u64) -> bool {
        match fw.conns().live_handle(&ConnTable::conn_key(dir, key), now) {
            Some(h) => {
                fw.conns_mut()
                    .track_handle(h, dir, Some(flags(fl)), 40, now)
                    == Ok(true)
            }
            None => false,
        }
    }

    const S: u64 = 1_000_000_000;

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
            vpc_vni: None,
        }
    }

    fn reply(f: &MatchFields) -> MatchFields {
        MatchFields {
            key: f.key.reversed(),
            icmp_type: None,
            vpc_vni: f.vpc_vni,
        }
    }

    #[test]
    fn outbound_flow_permits_replies_only() {
        let mut fw = Firewall::new(FlowLimits::default(), 1);
        let f = out_fields(40000, 80);
        // Unsolicited inbound is denied by default.
        assert_eq!(
            admit(&mut fw, Direction::In, &reply(&f), SYN | ACK, None, 0),
            Err(DropReason::FwDenyIn)
        );
        assert_eq!(
            admit(&mut fw, Direction::Out, &f, SYN, None, 1),
            Ok(Got::Created)
        );
        assert_eq!(fw.conns().tcp_state(&f.key), Some(SynSent));
        assert_eq!(
            admit(&mut fw, Direction::In, &reply(&f), SYN | ACK, None, 2),
            Ok(Got::Tracked)
        );
        assert_eq!(fw.conns().tcp_state(&f.key), Some(Established));
        // A different port on the same host is still denied.
        assert_eq!(
            admit(
                &mut fw,
                Direction::In,
                &reply(&out_fields(40001, 80)),
                SYN,
                None,
                3
            ),
            Err(DropReason::FwDenyIn)
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
            admit(&mut fw, Direction::In, &inbound, SYN, None, 0),
            Ok(Got::Created)
        );
        // The guest's reply is allowed by the connection despite the deny rule.
        assert_eq!(
            admit(
                &mut fw,
                Direction::Out,
                &reply(&inbound),
                SYN | ACK,
                None,
                1
            ),
            Ok(Got::Tracked)
        );
        assert_eq!(fw.conns().tcp_state(&reply(&inbound).key), Some(SynAckSent));
        // A new outbound flow to that host is denied.
        assert_eq!(
            admit(&mut fw, Direction::Out, &out_fields(1, 2), SYN, None, 2),
            Err(DropReason::FwDenyOut)
        );
    }

    #[test]
    fn timeouts_follow_the_tcp_state() {
        let l = FlowLimits::default();
        let mut fw = Firewall::new(l, 1);
        let f = out_fields(1000, 80);
        admit(&mut fw, Direction::Out, &f, SYN, None, 0).unwrap();
        // Half-open: gone after 5 s.
        assert!(track(&mut fw, Direction::Out, &f.key, SYN, 4 * S));
        let mut gone = vec![];
        fw.conns_mut().expire(9 * S + 1, |k| gone.push(*k));
        assert_eq!(gone, vec![f.key]);
        assert_eq!(fw.conns().stats().flows_expired, 1);
        // Established: survives 5 s and 60 s idle, expires after 8000 s.
        admit(&mut fw, Direction::Out, &f, SYN, None, 10 * S).unwrap();
        admit(&mut fw, Direction::In, &reply(&f), SYN | ACK, None, 10 * S).unwrap();
        fw.conns_mut().expire(100 * S, |_| {});
        assert_eq!(fw.conns().stats().flows, 1);
        assert!(!track(&mut fw, Direction::Out, &f.key, ACK, 8011 * S));
        // Time-wait: 120 s.
        let g = out_fields(1001, 80);
        admit(&mut fw, Direction::Out, &g, SYN, None, 0).unwrap();
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
            assert!(track(&mut fw, dir, &k, fl, S));
        }
        assert_eq!(fw.conns().tcp_state(&g.key), Some(TimeWait));
        assert!(track(&mut fw, Direction::Out, &g.key, ACK, 120 * S));
        assert!(!track(&mut fw, Direction::Out, &g.key, ACK, 241 * S));
        // A SYN on the same ports during time-wait (the client reusing its port)
        // opens the connection again in place: counted, though not created.
        let h = out_fields(1002, 80);
        admit(&mut fw, Direction::Out, &h, SYN, None, 300 * S).unwrap();
        for (dir, fl) in [(Direction::In, SYN | ACK), (Direction::Out, FIN | ACK)] {
            let k = if dir == Direction::Out {
                h.key
            } else {
                h.key.reversed()
            };
            assert!(track(&mut fw, dir, &k, fl, 300 * S));
        }
        assert!(track(
            &mut fw,
            Direction::In,
            &h.key.reversed(),
            FIN | ACK,
            300 * S
        ));
        let created = fw.conns().stats().flows_created;
        assert!(track(&mut fw, Direction::Out, &h.key, SYN, 310 * S));
        assert_eq!(fw.conns().tcp_state(&h.key), Some(SynSent));
        assert_eq!(fw.conns().stats().flows_reopened, 1);
        assert_eq!(fw.conns().stats().flows_created, created);
    }

    #[test]
    fn full_table_evicts_closing_flows_then_refuses() {
        let l = FlowLimits {
            fw_flow_limit: 2,
            ..FlowLimits::default()
        };
        let mut fw = Firewall::new(l, 1);
        let (a, b, c) = (out_fields(1, 80), out_fields(2, 80), out_fields(3, 80));
        admit(&mut fw, Direction::Out, &a, SYN, None, 0).unwrap();
        // Picked up established, and answered.
        admit(&mut fw, Direction::Out, &b, ACK, None, 0).unwrap();
        assert!(track(&mut fw, Direction::In, &b.key.reversed(), ACK, 0));
        // `a` is half-open, so it is evicted for the newcomer.
        admit(&mut fw, Direction::Out, &c, ACK, None, 1).unwrap();
        assert_eq!(fw.conns().stats().flows_evicted, 1);
        assert_eq!(fw.conns().tcp_state(&a.key), None);
        // An unanswered pick-up may go too: `c` makes room for `d`.
        let d = out_fields(4, 80);
        admit(&mut fw, Direction::Out, &d, ACK, None, 2).unwrap();
        assert_eq!(fw.conns().stats().flows_evicted, 2);
        assert_eq!(fw.conns().tcp_state(&c.key), None);
        // Two established, answered flows: nothing to evict, the new flow is refused.
        assert!(track(&mut fw, Direction::In, &d.key.reversed(), ACK, 2));
        assert_eq!(
            admit(&mut fw, Direction::Out, &out_fields(5, 80), ACK, None, 2),
            Err(DropReason::FwTableFull)
        );
        assert_eq!(fw.conns().stats().flows, 2);
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
            admit(&mut fw, Direction::In, &inbound, ACK, None, 0),
            Err(DropReason::FwMidstreamIn)
        );
        assert_eq!(fw.conns().stats().flows, 0);
        // The guest's own segment of the same flow picks it up; the peer's then pass.
        let out = reply(&inbound);
        assert_eq!(
            admit(&mut fw, Direction::Out, &out, ACK, None, 1),
            Ok(Got::Created)
        );
        assert_eq!(fw.conns().tcp_state(&out.key), Some(Established));
        assert_eq!(
            admit(&mut fw, Direction::In, &inbound, ACK, None, 2),
            Ok(Got::Tracked)
        );
    }

    #[test]
    fn inbound_floods_do_not_fill_the_table_with_established_entries() {
        let mut fw = allow_in_443();
        // One ACK from each of many source ports: nothing is created.
        for sp in 1000..11000u16 {
            let f = reply(&out_fields(443, sp));
            assert_eq!(
                admit(&mut fw, Direction::In, &f, ACK, None, 0),
                Err(DropReason::FwMidstreamIn)
            );
        }
        assert_eq!(fw.conns().stats().flows, 0);
        // SYNs, each followed by the peer's own ACK: the table fills with half-open
        // entries only, which new connections may evict.
        for sp in 1000..11000u16 {
            let f = reply(&out_fields(443, sp));
            admit(&mut fw, Direction::In, &f, SYN, None, 1).unwrap();
            assert!(track(&mut fw, Direction::In, &f.key, ACK, 1));
        }
        assert_eq!(fw.conns().stats().flows, 64);
        assert!(fw
            .conns()
            .dump_flows(1)
            .iter()
            .all(|c| c.tcp_state == Some(SynRcvd)));
        // The guest can still open connections, and a real inbound handshake works.
        assert_eq!(
            admit(
                &mut fw,
                Direction::Out,
                &out_fields(40000, 80),
                SYN,
                None,
                2
            ),
            Ok(Got::Created)
        );
        let f = reply(&out_fields(443, 20000));
        admit(&mut fw, Direction::In, &f, SYN, None, 2).unwrap();
        assert!(track(
            &mut fw,
            Direction::Out,
            &f.key.reversed(),
            SYN | ACK,
            2
        ));
        assert!(track(&mut fw, Direction::In, &f.key, ACK, 2));
        assert_eq!(fw.conns().tcp_state(&f.key.reversed()), Some(Established));
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
            f.key.proto = crate::machinery::flow::PROTO_UDP;
            f
        };
        let (a, b, c) = (udp(1), udp(2), udp(3));
        admit(&mut fw, Direction::Out, &a, 0, None, 0).unwrap();
        admit(&mut fw, Direction::Out, &b, 0, None, 0).unwrap();
        // `a` is answered, `b` is not: `b` goes.
        assert!(track(&mut fw, Direction::In, &a.key.reversed(), 0, 0));
        admit(&mut fw, Direction::Out, &c, 0, None, 1).unwrap();
        let keys: Vec<u16> = fw
            .conns()
            .dump_flows(1)
            .iter()
            .map(|d| d.key.src_port)
            .collect();
        assert_eq!(keys, vec![1, 3]);
    }

    fn handle_of(
        fw: &mut Firewall,
        dir: Direction,
        f: &MatchFields,
        fl: u8,
        now: u64,
    ) -> ConnHandle {
        match fw.admit(dir, f, Some(flags(fl)), 40, None, now) {
            Ok(Admission { conn: Some(h), .. }) => h,
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
        assert_eq!(fw.conns().tcp_state(&f.key), Some(Established));
        assert_eq!(
            fw.conns_mut()
                .track_handle(h, Direction::Out, Some(flags(FIN | ACK)), 40, 2),
            Ok(true)
        );
        assert_eq!(fw.conns().tcp_state(&f.key), Some(FinWait1));
        // A second connection gets another slot.
        let g = handle_of(&mut fw, Direction::Out, &out_fields(40001, 80), SYN, 2);
        assert_ne!(g, h);
        // Idle past the timeout: refused by handle as by key, even before a sweep.
        assert_eq!(
            fw.conns_mut()
                .track_handle(g, Direction::Out, Some(flags(ACK)), 40, 100 * S),
            Ok(false)
        );
        assert!(!track(
            &mut fw,
            Direction::Out,
            &out_fields(40001, 80).key,
            ACK,
            100 * S
        ));
    }

    fn icmp(t: u8, code: u8, id: u16) -> MatchFields {
        let mut f = out_fields(0, 0);
        f.key.proto = crate::machinery::flow::PROTO_ICMP;
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
            admit(&mut fw, Direction::Out, &req, 0, None, 0),
            Ok(Got::Created)
        );
        assert_eq!(
            admit(&mut fw, Direction::In, &rep, 0, None, 0),
            Ok(Got::Tracked)
        );
        // The echo connection admits no other type from that host.
        let mut unreach = icmp(3, 1, 0);
        unreach.key = unreach.key.reversed();
        assert_eq!(
            admit(&mut fw, Direction::In, &unreach, 0, None, 0),
            Err(DropReason::FwDenyIn)
        );
        // An outbound error is allowed by the default rule but opens nothing, so
        // nothing comes back in on it.
        let err = icmp(3, 3, 0);
        assert_eq!(
            admit(&mut fw, Direction::Out, &err, 0, None, 0),
            Ok(Got::Stateless)
        );
        assert_eq!(fw.conns().stats().flows, 1);
        let mut back = err;
        back.key = err.key.reversed();
        assert_eq!(
            admit(&mut fw, Direction::In, &back, 0, None, 0),
            Err(DropReason::FwDenyIn)
        );
        // An inbound allow for type 3 admits type 3 only, and tracks nothing.
        let r = Rule::new(100, FwAction::Allow)
            .matching(Predicate::IcmpType(3))
            .finalize()
            .unwrap();
        fw.layer_mut().add(Direction::In, r);
        assert_eq!(
            admit(&mut fw, Direction::In, &unreach, 0, None, 0),
            Ok(Got::Stateless)
        );
        let mut exceeded = icmp(11, 0, 0);
        exceeded.key = exceeded.key.reversed();
        assert_eq!(
            admit(&mut fw, Direction::In, &exceeded, 0, None, 0),
            Err(DropReason::FwDenyIn)
        );
        assert_eq!(fw.conns().stats().flows, 1);
    }

    #[test]
    fn icmp_errors_about_live_connections_are_related() {
        let mut fw = Firewall::new(FlowLimits::default(), 1);
        let tcp = out_fields(40000, 443);
        admit(&mut fw, Direction::Out, &tcp, SYN, None, 0).unwrap();
        let mut exceeded = icmp(11, 0, 0);
        exceeded.key = exceeded.key.reversed();
        // Quoting the guest's own packet: admitted, nothing created.
        assert_eq!(
            admit(&mut fw, Direction::In, &exceeded, 0, Some(&tcp.key), 1),
            Ok(Got::Related)
        );
        assert_eq!(fw.conns().stats().flows, 1);
        // Quoting another flow, or nothing: the rules (default deny) decide.
        let other = out_fields(40001, 443).key;
        for q in [Some(&other), None] {
            assert_eq!(
                admit(&mut fw, Direction::In, &exceeded, 0, q, 1),
                Err(DropReason::FwDenyIn)
            );
        }
        // Once the connection has expired, the same quote is no longer related.
        assert_eq!(
            admit(&mut fw, Direction::In, &exceeded, 0, Some(&tcp.key), 10 * S),
            Err(DropReason::FwDenyIn)
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
        udp_in.key.proto = crate::machinery::flow::PROTO_UDP;
        admit(&mut fw, Direction::In, &udp_in, 0, None, 0).unwrap();
        let unreach = icmp(3, 3, 0);
        assert_eq!(
            admit(&mut fw, Direction::Out, &unreach, 0, Some(&udp_in.key), 0),
            Ok(Got::Related)
        );
        assert_eq!(
            admit(&mut fw, Direction::Out, &unreach, 0, None, 0),
            Err(DropReason::FwDenyOut)
        );
    }

    #[test]
    fn deciding_opens_nothing_until_committed() {
        let mut fw = Firewall::new(FlowLimits::default(), 1);
        let f = out_fields(40000, 80);
        let d = fw
            .decide(Direction::Out, &f, Some(flags(SYN)), 40, None, 0)
            .unwrap();
        assert!(matches!(d, Decision::Open(_)));
        // Decided but not committed (the router dropped the flow): nothing exists,
        // and the reply is not admitted.
        assert_eq!(
            (fw.conns().stats().flows, fw.conns().stats().flows_created),
            (0, 0)
        );
        assert_eq!(
            admit(&mut fw, Direction::In, &reply(&f), SYN | ACK, None, 1),
            Err(DropReason::FwDenyIn)
        );
        let a = fw.commit(d, 2).unwrap();
        assert!(a.created && a.needs_conn && a.conn.is_some());
        assert_eq!(fw.conns().tcp_state(&f.key), Some(SynSent));
        assert_eq!(
            admit(&mut fw, Direction::In, &reply(&f), SYN | ACK, None, 3),
            Ok(Got::Tracked)
        );
    }

    #[test]
    fn a_mid_stream_pickup_keeps_the_short_timeout_until_answered() {
        let mut fw = Firewall::new(FlowLimits::default(), 1);
        let (lone, answered) = (out_fields(1, 80), out_fields(2, 80));
        for f in [&lone, &answered] {
            admit(&mut fw, Direction::Out, f, ACK, None, 0).unwrap();
            assert_eq!(fw.conns().tcp_state(&f.key), Some(Established));
        }
        // The guest keeps sending into the void: the idle clock restarts, the
        // timeout stays the half-open one.
        assert!(track(&mut fw, Direction::Out, &lone.key, ACK, 4 * S));
        assert!(track(
            &mut fw,
            Direction::In,
            &answered.key.reversed(),
            ACK,
            4 * S
        ));
        fw.conns_mut().expire(9 * S + 1, |_| {});
        assert_eq!(
            fw.conns().tcp_state(&lone.key),
            None,
            "expired after 5 s idle"
        );
        assert_eq!(fw.conns().tcp_state(&answered.key), Some(Established));
        fw.conns_mut().expire(1000 * S, |_| {});
        assert_eq!(
            fw.conns().stats().flows,
            1,
            "answered: the established timeout"
        );
    }

    #[test]
    fn expiry_visits_a_bounded_number_of_slots_per_call() {
        let n = 3 * EXPIRE_SCAN + 100;
        let l = FlowLimits {
            fw_flow_limit: n,
            ..FlowLimits::default()
        };
        let mut fw = Firewall::new(l, 1);
        for i in 0..n {
            let mut f = out_fields(0, 80);
            f.key.proto = crate::machinery::flow::PROTO_UDP;
            f.key.src_port = i as u16;
            f.key.src_ip = std::net::Ipv4Addr::from(0x0a00_0000 + (i as u32 >> 16)).into();
            admit(&mut fw, Direction::Out, &f, 0, None, 0).unwrap();
        }
        assert_eq!(fw.conns().stats().flows, n as u64);
        // Every connection is idle past 60 s; each call takes the next EXPIRE_SCAN
        // slots, resuming where the last one stopped, and tells `gone` of each.
        let mut gone = 0;
        for step in 1..=4 {
            fw.conns_mut().expire(61 * S, |_| gone += 1);
            let want = (step * EXPIRE_SCAN).min(n);
            assert_eq!(
                (fw.conns().stats().flows_expired, gone),
                (want as u64, want)
            );
        }
        assert_eq!(fw.conns().stats().flows, 0);
        // Round again: new connections in the freed slots are found as well.
        let f = out_fields(7, 80);
        admit(&mut fw, Direction::Out, &f, SYN, None, 100 * S).unwrap();
        for _ in 0..4 {
            fw.conns_mut().expire(200 * S, |_| {});
        }
        assert_eq!(fw.conns().stats().flows, 0);
    }

    #[test]
    fn segments_outside_the_window_are_refused_and_change_nothing() {
        let mut fw = Firewall::new(FlowLimits::default(), 1);
        let f = out_fields(40000, 80);
        let seg = |flags, seq, ack| TcpSegment {
            flags,
            seq,
            ack,
            win: 1000,
            len: u32::from(flags & SYN != 0),
            wscale: None,
        };
        let h = match fw.admit(Direction::Out, &f, Some(seg(SYN, 100, 0)), 40, None, 0) {
            Ok(Admission { conn: Some(h), .. }) => h,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            fw.conns_mut()
                .track_handle(h, Direction::In, Some(seg(SYN | ACK, 500, 101)), 40, 1),
            Ok(true)
        );
        assert_eq!(
            fw.conns_mut()
                .track_handle(h, Direction::Out, Some(seg(ACK, 101, 501)), 40, 2),
            Ok(true)
        );
        // A reset far from the guest's window (501..=1501): refused by handle and
        // when decided afresh, a refusal no cache may keep.
        let bad = seg(RST, 90_000, 0);
        assert_eq!(
            fw.conns_mut()
                .track_handle(h, Direction::In, Some(bad), 40, 3 * S),
            Err(DropReason::TcpOutOfWindow)
        );
        assert_eq!(
            fw.decide(Direction::In, &reply(&f), Some(bad), 40, None, 3 * S),
            Err(DropReason::TcpOutOfWindow)
        );
        assert!(DropReason::TcpOutOfWindow.per_packet());
        // Nothing changed, and a reset in the window still closes.
        assert_eq!(fw.conns().tcp_state(&f.key), Some(Established));
        assert_eq!(
            fw.conns_mut()
                .track_handle(h, Direction::In, Some(seg(RST, 501, 0)), 40, 4 * S),
            Ok(true)
        );
        assert_eq!(fw.conns().tcp_state(&f.key), Some(Closed));
        let g = out_fields(40001, 80);
        let hg = match fw.admit(Direction::Out, &g, Some(flags(ACK)), 40, None, 0) {
            Ok(Admission { conn: Some(h), .. }) => h,
            other => panic!("{other:?}"),
        };
        fw.conns_mut()
            .track_handle(hg, Direction::In, Some(flags(ACK)), 40, 1)
            .unwrap();
        // Refused packets do not keep a connection alive: idle since 1 ns, it is
        // gone 8000 s later however many were refused meanwhile.
        let refused = fw.conns_mut().track_handle(
            hg,
            Direction::In,
            Some(seg(RST, 1 << 31, 0)),
            40,
            7000 * S,
        );
        assert_eq!(refused, Err(DropReason::TcpOutOfWindow));
        assert_eq!(
            fw.conns_mut()
                .track_handle(hg, Direction::In, Some(flags(ACK)), 40, 8001 * S),
            Ok(false)
        );
    }
}
