//! Connection tracking: the table of a port's connections, each keyed with the
//! guest as source, with its TCP state and sequence space (`tcp`), its idle
//! timeout and its traffic counters.
//!
//! What opens a connection is the policy's to say (the firewall, `vpc::firewall`,
//! decides a flow's first packet and asks for an [`Opening`]); this table keeps
//! the connections, tells whether a packet of one is taken, and forgets them.
//!
//! TCP connections are tracked from the guest's point of view (`tcp`): the flags
//! choose the idle timeout (half-open connections expire in seconds, established ones
//! in hours, closed ones after TIME-WAIT), and each side's sequence numbers and window
//! bound what the other may send (`tcp_out_of_window`). A TCP flow first seen without
//! a SYN keeps the half-open timeout until the peer answers.
//!
//! The table has a size limit; a full table evicts an expired, half-open (or
//! unanswered) or closed connection if it finds one among the first few it inspects,
//! and otherwise refuses the new flow. Expired connections are swept a bounded number
//! of slots at a time ([`ConnTable::expire`]), so no sweep holds a worker up.
//!
//! Connections live in a slab indexed by a keyed hash map. Opening one hands back a
//! [`ConnHandle`] (slot and generation) that the unified flow table keeps, so that a
//! packet of a cached flow reaches its connection with [`ConnTable::track_handle`]
//! instead of hashing and probing the key a second time. Removing a connection
//! (expiry, eviction, replacement, [`ConnTable::clear`]) bumps its slot's
//! generation, which turns every handle to it into a miss: the flow is decided
//! again.

mod carry;
mod tcp;

pub use carry::{ConnImportError, ConnRecord};
pub(crate) use tcp::SYN;
pub use tcp::{TcpConn, TcpSegment, TcpState};
#[cfg(test)]
pub(crate) use tcp::{ACK, FIN, RST};

use crate::drop::DropReason;
use crate::machinery::flow::{flow_map, FlowKey, FlowMap};
use crate::machinery::rule::Direction;
use serde::{Deserialize, Serialize};

/// A connection to open: what the first packet of a flow said (the firewall's
/// decision asks for one, [`ConnTable::open`] makes it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Opening {
    /// The connection key (guest as source).
    pub key: FlowKey,
    pub initiator: Direction,
    pub tcp: bool,
    /// The first packet's TCP segment.
    pub seg: Option<TcpSegment>,
    /// The first packet's IP bytes (counted on the new connection).
    pub bytes: u32,
}

const NS_PER_SEC: u64 = 1_000_000_000;

/// Idle timeouts and table sizes for flows (defaults as in the reference).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowLimits {
    /// TCP connections not yet established (SYN seen), closed ones, and ones picked
    /// up mid-stream from the guest until the peer answers.
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
    pub fn validate(&self) -> Result<(), FlowLimitError> {
        for (name, v) in [
            ("tcp_incipient_ns", self.tcp_incipient_ns),
            ("tcp_established_ns", self.tcp_established_ns),
            ("tcp_time_wait_ns", self.tcp_time_wait_ns),
            ("other_ns", self.other_ns),
            ("fw_flow_limit", self.fw_flow_limit as u64),
            ("uft_limit", self.uft_limit as u64),
        ] {
            if v == 0 {
                return Err(FlowLimitError { field: name });
            }
        }
        Ok(())
    }
}

/// A flow limit of zero: no flow could ever be kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("flow limit {field} must be above 0")]
pub struct FlowLimitError {
    /// The field of [`FlowLimits`], as configured.
    pub field: &'static str,
}

/// One tracked connection, keyed by its outbound orientation (guest is the source).
#[derive(Clone, Copy, Debug)]
struct Conn {
    tcp: Option<TcpConn>,
    /// Who sent the first packet.
    initiator: Direction,
    /// A packet went the other way (answered, not just offered).
    replied: bool,
    created: u64,
    last_seen: u64,
    /// Packets and IP bytes each way (`dump-tcp-flows`), counted where the packet is
    /// tracked anyway, so the counters cost two adds on a line already written.
    out: Traffic,
    inb: Traffic,
}

/// Packets and IP bytes (inner L3 header onward; a guest's TSO buffer is one packet
/// with all its bytes) one way of a connection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Traffic {
    pub packets: u64,
    pub bytes: u64,
}

impl Traffic {
    /// Wrapping: the counters of a connection imported from another sled may
    /// start anywhere (docs/engine.md "Port states"), and no value of them may
    /// stop a packet.
    #[inline]
    fn add(&mut self, bytes: u32) {
        self.packets = self.packets.wrapping_add(1);
        self.bytes = self.bytes.wrapping_add(u64::from(bytes));
    }
}

impl Conn {
    fn new(o: &Opening, now: u64) -> Conn {
        let mut c = Conn {
            tcp: o.tcp.then(|| TcpConn::open(o.initiator, o.seg)),
            initiator: o.initiator,
            replied: false,
            created: now,
            last_seen: now,
            out: Traffic::default(),
            inb: Traffic::default(),
        };
        c.count(o.initiator, o.bytes);
        c
    }

    #[inline]
    fn count(&mut self, dir: Direction, bytes: u32) {
        match dir {
            Direction::Out => self.out.add(bytes),
            Direction::In => self.inb.add(bytes),
        }
    }

    fn state(&self) -> Option<TcpState> {
        self.tcp.map(|t| t.state)
    }

    /// Open but never answered: a half-open TCP connection, a TCP flow picked up
    /// mid-stream that the peer has not answered yet, or a non-TCP flow only one side
    /// has spoken in. What a flood (or a guest sending into the void) creates.
    fn unanswered(&self) -> bool {
        match self.state() {
            Some(s) => s.incipient() || (s == TcpState::Established && !self.replied),
            None => !self.replied,
        }
    }

    fn timeout(&self, l: &FlowLimits) -> u64 {
        use TcpState::*;
        match self.state() {
            None => l.other_ns,
            Some(Established) if !self.replied => l.tcp_incipient_ns,
            Some(Closed | SynSent | SynRcvd | SynAckSent) => l.tcp_incipient_ns,
            Some(Established) => l.tcp_established_ns,
            Some(TimeWait) => l.tcp_time_wait_ns,
            Some(FinWait1 | FinWait2 | CloseWait | LastAck) => l.other_ns,
        }
    }

    fn live(&self, now: u64, l: &FlowLimits) -> bool {
        now.saturating_sub(self.last_seen) < self.timeout(l)
    }

    /// Eviction preference, lowest first; `None` for connections a full table keeps
    /// (answered ones that are not closed). Expired entries go first, then unanswered
    /// ones, then closed TCP.
    fn eviction_rank(&self, now: u64, l: &FlowLimits) -> Option<u8> {
        if !self.live(now, l) {
            Some(0)
        } else if self.unanswered() {
            Some(1)
        } else if self.state().is_some_and(TcpState::closed) {
            Some(2)
        } else {
            None
        }
    }

    /// Takes in a packet of this (live) connection going `dir` (`bytes` of IP);
    /// refuses a TCP segment outside the window, changing nothing (not even the idle
    /// clock or the counters). `Ok(true)` when the segment reopened a closed
    /// connection (see `TcpConn::reopened_by`). Inlined with
    /// [`ConnTable::track_handle`].
    #[inline(always)]
    fn track(
        &mut self,
        dir: Direction,
        seg: Option<TcpSegment>,
        bytes: u32,
        now: u64,
    ) -> Result<bool, DropReason> {
        let mut reopened = false;
        if let (Some(t), Some(s)) = (self.tcp.as_mut(), seg) {
            reopened = t.reopened_by(&s);
            t.track(dir, s)?;
        }
        self.count(dir, bytes);
        self.last_seen = now;
        self.replied |= dir != self.initiator;
        Ok(reopened)
    }
}

/// A direct reference to a tracked connection (see the module doc). A handle outliving
/// its connection is refused by [`ConnTable::track_handle`], never redirected to the
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

/// Bytes of one slot of the connection slab (what a connection costs besides its
/// index entry), for the table budget.
pub const CONN_SLOT_BYTES: usize = core::mem::size_of::<Slot>();

// TCP tracking and the per-connection counters made connections bigger; a slot
// stays within 160 bytes (the hot fields, state and counters, share its first two
// cache lines with the key).
const _: () = assert!(CONN_SLOT_BYTES <= 160);

/// A connection in `dump-tcp-flows` / stats output.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ConnDump {
    /// The flow with the guest as source.
    pub key: FlowKey,
    pub initiator: Direction,
    pub tcp_state: Option<TcpState>,
    pub age_ns: u64,
    pub idle_ns: u64,
    /// What the guest sent on it.
    pub out: Traffic,
    /// What the guest received on it.
    #[serde(rename = "in")]
    pub inb: Traffic,
}

/// Counters of the connection table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ConnStats {
    pub flows: u64,
    pub flows_created: u64,
    /// Closed connections a new SYN opened again in place (port reuse after
    /// TIME-WAIT): new connections that `flows_created` does not count.
    pub flows_reopened: u64,
    pub flows_expired: u64,
    pub flows_evicted: u64,
}

/// How many entries a full table inspects looking for one to evict: bounded so a
/// table full of established connections costs a new flow little.
const EVICT_SCAN: usize = 16;

/// How many slots one [`ConnTable::expire`] call visits. A full table (524288
/// connections per port) swept in one go would hold the worker up for milliseconds;
/// in steps of this size a sweep costs tens of microseconds and covers the table in
/// `slots / EXPIRE_SCAN` calls. A connection idle past its timeout is refused, and is
/// the first to be evicted, before the sweep reaches it: the sweep only gives its
/// memory back.
pub const EXPIRE_SCAN: usize = 4096;

/// One port's connections (see the module doc).
#[derive(Debug)]
pub struct ConnTable {
    /// Connection key (guest as source) -> slot in `slots`.
    index: FlowMap<u32>,
    /// The connections. A freed slot goes on `free` with its generation bumped.
    slots: Vec<Slot>,
    free: Vec<u32>,
    /// The slot the next [`ConnTable::expire`] call starts from.
    sweep_at: usize,
    limits: FlowLimits,
    stats: ConnStats,
}

impl ConnTable {
    /// `hash_seed` keys the table's hash (see `flow`).
    pub fn new(limits: FlowLimits, hash_seed: u64) -> Self {
        ConnTable {
            index: flow_map(hash_seed),
            slots: Vec::new(),
            free: Vec::new(),
            sweep_at: 0,
            limits,
            stats: ConnStats::default(),
        }
    }

    /// The connection key (guest as source) of a packet going `dir` with key `key`.
    pub fn conn_key(dir: Direction, key: &FlowKey) -> FlowKey {
        match dir {
            Direction::Out => *key,
            Direction::In => key.reversed(),
        }
    }

    /// The connection with connection key `ck`, live or not, by slot.
    fn find(&self, ck: &FlowKey) -> Option<(u32, &Conn)> {
        let slot = *self.index.get(ck)?;
        let (_, c) = self.slots.get(slot as usize)?.conn.as_ref()?;
        Some((slot, c))
    }

    /// The handle of the live connection with connection key `ck`.
    pub fn live_handle(&self, ck: &FlowKey, now: u64) -> Option<ConnHandle> {
        let (slot, c) = self.find(ck)?;
        if !c.live(now, &self.limits) {
            return None;
        }
        let gen = self.slots.get(slot as usize)?.gen;
        Some(ConnHandle { slot, gen })
    }

    /// Creates a connection, replacing a dead one with the same key (a new
    /// generation: handles to the old one stop working) or evicting one from a full
    /// table (refused with `fw_table_full` when none of those inspected may go).
    pub fn open(&mut self, o: &Opening, now: u64) -> Result<ConnHandle, DropReason> {
        if let Some(&slot) = self.index.get(&o.key) {
            self.release(slot);
        } else if self.index.len() >= self.limits.fw_flow_limit {
            self.evict_one(now)?;
        }
        let h = self.occupy(o.key, Conn::new(o, now));
        self.stats.flows_created += 1;
        Ok(h)
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
    fn evict_one(&mut self, now: u64) -> Result<(), DropReason> {
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
            None => Err(DropReason::FwTableFull),
        }
    }

    /// Tracks a packet of a cached flow (`bytes` of IP, counted on the connection)
    /// by its connection's handle (the fast path: no hashing). `Ok(false)` if the connection is gone (its slot was freed, whatever
    /// occupies it now) or idle past its timeout: the flow must be decided again.
    /// `Err(tcp_out_of_window)` for a TCP segment its receiver would not accept; the
    /// connection is left as it was.
    ///
    /// Always inlined, with the tracking it calls (`Conn::track`, `TcpConn::track`
    /// and what that calls), wherever a cached flow is confirmed: it is most of what
    /// a flow-table hit costs, and left to the inliner it was called out of line from
    /// some paths (tens of instructions a packet, docs/benchmarks.md).
    #[inline(always)]
    pub fn track_handle(
        &mut self,
        h: ConnHandle,
        dir: Direction,
        seg: Option<TcpSegment>,
        bytes: u32,
        now: u64,
    ) -> Result<bool, DropReason> {
        let limits = &self.limits;
        match self.slots.get_mut(h.slot as usize) {
            Some(Slot {
                gen,
                conn: Some((_, c)),
            }) if *gen == h.gen && c.live(now, limits) => {
                let reopened = c.track(dir, seg, bytes, now)?;
                self.stats.flows_reopened += u64::from(reopened);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Whether the connection `h` refers to is still there and not idle past its
    /// timeout (NAT state lives as long as its flow's connection).
    pub fn is_live(&self, h: ConnHandle, now: u64) -> bool {
        matches!(
            self.slots.get(h.slot as usize),
            Some(Slot { gen, conn: Some((_, c)) }) if *gen == h.gen && c.live(now, &self.limits)
        )
    }

    /// Removes connections idle past their timeout among the next [`EXPIRE_SCAN`]
    /// slots (resuming where the previous call stopped, wrapping round), calling
    /// `gone` with each one's key (guest as source) so the caller can drop cached
    /// flows of it.
    pub fn expire(&mut self, now: u64, mut gone: impl FnMut(&FlowKey)) {
        let n = self.slots.len();
        let limits = self.limits;
        for _ in 0..n.min(EXPIRE_SCAN) {
            let slot = self.sweep_at % n;
            self.sweep_at = slot + 1;
            let dead = match &self.slots[slot].conn {
                Some((k, c)) if !c.live(now, &limits) => {
                    gone(k);
                    true
                }
                _ => false,
            };
            if dead {
                self.release(slot as u32);
                self.stats.flows_expired += 1;
            }
        }
    }

    /// Drops every connection (the port is going away or its rules were replaced).
    pub fn clear(&mut self) {
        for slot in 0..self.slots.len() as u32 {
            self.release(slot);
        }
    }

    pub fn tcp_state(&self, conn_key: &FlowKey) -> Option<TcpState> {
        self.find(conn_key).and_then(|(_, c)| c.state())
    }

    pub fn stats(&self) -> ConnStats {
        ConnStats {
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
                tcp_state: c.state(),
                age_ns: now.saturating_sub(c.created),
                idle_ns: now.saturating_sub(c.last_seen),
                out: c.out,
                inb: c.inb,
            })
            .collect();
        v.sort_by_key(|d| (d.key.src_port, d.key.dst_port, d.key.dst_ip));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machinery::flow::{udp_test_key, PROTO_TCP};

    const S: u64 = 1_000_000_000;

    /// The guest's TCP connection from port `sp` to 10.0.0.2:80, opened by a SYN.
    fn opening(sp: u16) -> Opening {
        Opening {
            key: FlowKey {
                proto: PROTO_TCP,
                dst_port: 80,
                ..udp_test_key(sp)
            },
            initiator: Direction::Out,
            tcp: true,
            seg: Some(segment(SYN)),
            bytes: 40,
        }
    }

    /// A segment with these flags and all-zero numbers, which every window accepts.
    fn segment(flags: u8) -> TcpSegment {
        TcpSegment {
            flags,
            ..TcpSegment::default()
        }
    }

    /// Whether the guest's ACK on connection `h` is taken at `now`.
    fn ack(t: &mut ConnTable, h: ConnHandle, now: u64) -> Result<bool, DropReason> {
        t.track_handle(h, Direction::Out, Some(segment(ACK)), 40, now)
    }

    #[test]
    fn handles_die_with_their_connection_and_never_reach_a_successor() {
        let l = FlowLimits {
            fw_flow_limit: 1,
            ..FlowLimits::default()
        };
        let mut t = ConnTable::new(l, 1);
        let (a, b) = (opening(1), opening(2));
        // Expiry frees the slot; the next connection reuses it under a new generation.
        let ha = t.open(&a, 0).unwrap();
        t.expire(10 * S, |_| {});
        let hb = t.open(&b, 10 * S).unwrap();
        assert_eq!(hb.slot, ha.slot, "the freed slot is reused");
        assert_eq!(ack(&mut t, ha, 10 * S), Ok(false));
        assert_eq!(ack(&mut t, hb, 10 * S), Ok(true));
        // Eviction (a full table, `b` half-open): `b`'s handle dies, `a`'s new one lives.
        let ha2 = t.open(&a, 11 * S).unwrap();
        assert_eq!(t.stats().flows_evicted, 1);
        assert_eq!(ack(&mut t, hb, 11 * S), Ok(false));
        assert_eq!(ack(&mut t, ha, 11 * S), Ok(false));
        assert_eq!(ack(&mut t, ha2, 11 * S), Ok(true));
        // Replacing a dead connection under the same key: a new handle, the old dies.
        let ha3 = t.open(&a, 30 * S).unwrap();
        assert_ne!(ha3, ha2);
        assert_eq!(ack(&mut t, ha2, 30 * S), Ok(false));
        assert_eq!(ack(&mut t, ha3, 30 * S), Ok(true));
        assert_eq!(t.stats().flows, 1);
        // Clearing kills every handle and empties the table.
        t.clear();
        assert_eq!(ack(&mut t, ha3, 30 * S), Ok(false));
        assert_eq!((t.stats().flows, t.tcp_state(&a.key)), (0, None));
        assert!(t.dump_flows(30 * S).is_empty());
        // A handle from another table's slot space is refused, not a panic.
        let mut other = ConnTable::new(FlowLimits::default(), 1);
        for sp in 0..4 {
            other.open(&opening(sp), 0).unwrap();
        }
        let far = other.open(&opening(9), 0).unwrap();
        assert_eq!(ack(&mut t, far, 30 * S), Ok(false));
    }
}
