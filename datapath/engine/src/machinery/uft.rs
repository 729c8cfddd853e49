//! The unified flow table (UFT): per port and direction, the compiled result of all
//! layers for one flow, so that every packet after a flow's first skips the layers.
//!
//! Each entry carries its port's epoch when it was computed. A change to the port's
//! rules, routes or external addresses, or an engine-wide change (V2P, V2B, ports,
//! the underlay), moves the epoch (see `pipeline`), which makes every older entry of
//! the port stale at once without walking the tables: a stale entry is a miss
//! (counted as `stale`), recomputed and overwritten. Entries idle longer than the TTL are misses too. `Engine::tick`
//! removes stale and idle entries a bounded number at a time ([`Uft::expire_step`],
//! resuming where the last step stopped), so no tick walks a whole table. The table
//! has a size limit (from the sled's table budget); a full table evicts (counted) a
//! stale or idle entry among the next few it inspects, else the next entry, going
//! round the table so that the same entries are not the victims every time.
//! `dump-uft` reads a table in pages ([`Uft::dump_page`]).
//!
//! Entries live in a [`FlowSlab`], so walks and pages resume by position. A hit costs
//! one hash probe and one indexed load and allocates nothing; inserting (a miss) may
//! grow the table, which is the slow path.
//!
//! The table is generic over what an entry does with its packets (any
//! [`CachedAction`]): the pipeline's actions (local delivery, encapsulation, drops,
//! NAT) are the pipeline's (`pipeline::action`).

use crate::machinery::conntrack::{ConnHandle, ConnTable, TcpSegment};
use crate::machinery::flow::FlowKey;
use crate::machinery::rule::Direction;
use crate::machinery::slab::FlowSlab;
use serde::Serialize;

/// A cached per-flow decision, as `dump-uft` describes it.
pub trait CachedAction {
    fn describe(&self) -> String;
}

/// One cached flow.
#[derive(Clone, Debug)]
pub struct UftEntry<A> {
    pub epoch: u64,
    pub action: A,
    /// Largest IP packet (inner L3 header onward) the flow's path carries.
    pub path_mtu: u16,
    /// The firewall admitted the flow because of a connection (or, for an ICMP
    /// error, a related connection): every hit must confirm it with
    /// `ConnTable::track_handle`, and a flow whose connection is gone is decided again.
    /// False for drops and for rule-only (stateless) decisions, which hold until the
    /// epoch changes.
    pub needs_conn: bool,
    /// The connection to confirm, reached without a second lookup. `None` with
    /// `needs_conn` (a related ICMP error) means the flow is decided on every packet.
    pub conn: Option<ConnHandle>,
    pub created: u64,
    pub last_hit: u64,
    /// Packets and IP bytes served from this entry (not the packet that compiled it).
    pub hits: u64,
    pub bytes: u64,
}

impl<A> UftEntry<A> {
    /// Whether the cached flow still holds for this packet: stateless decisions
    /// always do; the others only while their connection is live (tracked here, by
    /// handle, in `conns`) and takes the packet. A TCP segment outside the window is
    /// not taken: the flow is decided again, and the firewall names the drop
    /// (`tcp_out_of_window`), which is not cached.
    #[inline]
    pub fn confirm(
        &self,
        conns: &mut ConnTable,
        dir: Direction,
        seg: Option<TcpSegment>,
        bytes: u32,
        now: u64,
    ) -> bool {
        if !self.needs_conn {
            return true;
        }
        self.conn
            .is_some_and(|h| conns.track_handle(h, dir, seg, bytes, now) == Ok(true))
    }
}

/// Counters of one table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct UftStats {
    pub entries: u64,
    pub hits: u64,
    pub misses: u64,
    /// Misses on an entry from an older epoch of its port: flows recompiled because
    /// the port's configuration or an engine-wide table changed.
    pub stale: u64,
    /// Entries that went idle past the TTL (swept or found on lookup).
    pub expired: u64,
    pub evicted: u64,
}

/// One entry in `dump_uft`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct UftDump {
    pub key: FlowKey,
    pub action: String,
    pub path_mtu: u16,
    /// Packets and IP bytes the entry served.
    pub hits: u64,
    pub bytes: u64,
    pub idle_ns: u64,
    pub stale: bool,
}

/// How many entries a full table inspects for a stale or idle victim.
const EVICT_SCAN: usize = 16;

/// One port's table for one direction.
#[derive(Debug)]
pub struct Uft<A> {
    map: FlowSlab<UftEntry<A>>,
    limit: usize,
    ttl_ns: u64,
    /// Where the next expiry step and the next eviction look first.
    sweep_at: usize,
    evict_at: usize,
    stats: UftStats,
}

impl<A: CachedAction> Uft<A> {
    /// `limit` entries at most; space for `limit.min(1024)` is reserved now so that a
    /// port's first flows do not grow the map. `hash_seed` keys the table's hash.
    pub fn new(limit: usize, ttl_ns: u64, hash_seed: u64) -> Self {
        let mut map = FlowSlab::new(hash_seed);
        map.reserve(limit.min(1024));
        Uft {
            map,
            limit,
            ttl_ns,
            sweep_at: 0,
            evict_at: 0,
            stats: UftStats::default(),
        }
    }

    fn usable(e: &UftEntry<A>, epoch: u64, now: u64, ttl: u64) -> Result<(), bool> {
        if e.epoch != epoch {
            Err(true)
        } else if now.saturating_sub(e.last_hit) >= ttl {
            Err(false)
        } else {
            Ok(())
        }
    }

    /// The entry for `key` if it is from `epoch` and not idle past the TTL; counts
    /// the hit (and the packet's `bytes` on the entry) or miss.
    pub fn lookup(
        &mut self,
        key: &FlowKey,
        epoch: u64,
        now: u64,
        bytes: u32,
    ) -> Option<&mut UftEntry<A>> {
        let stats = &mut self.stats;
        match self.map.get_mut(key) {
            Some(e) => match Self::usable(e, epoch, now, self.ttl_ns) {
                Ok(()) => {
                    e.last_hit = now;
                    e.hits += 1;
                    e.bytes += u64::from(bytes);
                    stats.hits += 1;
                    Some(e)
                }
                Err(stale) => {
                    if stale {
                        stats.stale += 1;
                    } else {
                        stats.expired += 1;
                    }
                    stats.misses += 1;
                    None
                }
            },
            None => {
                stats.misses += 1;
                None
            }
        }
    }

    /// Installs (or replaces) the entry for `key`, evicting one if the table is full.
    pub fn insert(&mut self, key: FlowKey, entry: UftEntry<A>) -> &mut UftEntry<A> {
        if !self.map.contains_key(&key) && self.map.len() >= self.limit {
            self.evict_one(entry.epoch, entry.last_hit);
        }
        self.map.insert(key, entry)
    }

    /// Makes room in a full table: the first stale or idle entry among the next
    /// [`EVICT_SCAN`] from the eviction cursor, else the first entry found there.
    /// The cursor moves past the victim, so a table of busy flows gives up its
    /// entries in turn rather than the same slot every time.
    fn evict_one(&mut self, epoch: u64, now: u64) {
        let positions = self.map.positions();
        let mut first = None;
        let mut victim = None;
        let mut seen = 0;
        for i in 0..positions {
            let pos = (self.evict_at + i) % positions;
            let Some((_, e)) = self.map.at(pos) else {
                continue;
            };
            if Self::usable(e, epoch, now, self.ttl_ns).is_err() {
                victim = Some(pos);
                break;
            }
            first.get_or_insert(pos);
            seen += 1;
            if seen == EVICT_SCAN {
                break;
            }
        }
        if let Some(pos) = victim.or(first) {
            self.map.remove_at(pos);
            self.evict_at = pos + 1;
            self.stats.evicted += 1;
        }
    }

    pub fn remove(&mut self, key: &FlowKey) {
        self.map.remove(key);
    }

    /// Removes entries from older epochs or idle past the TTL among the next `max`
    /// positions from where the previous step stopped (wrapping around), so that one
    /// step costs at most `max` slot reads however large the table is.
    pub fn expire_step(&mut self, epoch: u64, now: u64, max: usize) {
        let positions = self.map.positions();
        for _ in 0..max.min(positions) {
            let pos = self.sweep_at % positions;
            self.sweep_at = pos + 1;
            let dead = self
                .map
                .at(pos)
                .is_some_and(|(_, e)| Self::usable(e, epoch, now, self.ttl_ns).is_err());
            if dead {
                self.map.remove_at(pos);
                self.stats.expired += 1;
            }
        }
    }

    pub fn clear(&mut self) {
        self.map.clear();
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Slots, occupied or free: what [`Uft::expire_step`] walks.
    pub fn slots(&self) -> usize {
        self.map.positions()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn stats(&self) -> UftStats {
        UftStats {
            entries: self.map.len() as u64,
            ..self.stats
        }
    }

    /// Up to `max` entries from position `from` on, sorted for reading, and the
    /// position to continue from (`None`: the walk reached the end). Positions only
    /// change when an entry is removed, so pages read one after the other return every
    /// entry that stayed in the table exactly once.
    pub fn dump_page(
        &self,
        from: usize,
        max: usize,
        epoch: u64,
        now: u64,
    ) -> (Vec<UftDump>, Option<usize>) {
        let positions = self.map.positions();
        let mut page = Vec::new();
        let mut pos = from;
        while pos < positions && page.len() < max {
            if let Some((k, e)) = self.map.at(pos) {
                page.push(UftDump {
                    key: *k,
                    action: e.action.describe(),
                    path_mtu: e.path_mtu,
                    hits: e.hits,
                    bytes: e.bytes,
                    idle_ns: now.saturating_sub(e.last_hit),
                    stale: e.epoch != epoch,
                });
            }
            pos += 1;
        }
        page.sort_by_key(|d| (d.key.proto, d.key.src_port, d.key.dst_port, d.key.dst_ip));
        (page, (pos < positions).then_some(pos))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::machinery::flow::udp_test_key as key;

    /// An action that is only a name: these tests are about the table.
    struct Deliver;

    impl CachedAction for Deliver {
        fn describe(&self) -> String {
            "deliver".into()
        }
    }

    fn entry(epoch: u64, now: u64) -> UftEntry<Deliver> {
        UftEntry {
            epoch,
            action: Deliver,
            path_mtu: 1500,
            needs_conn: true,
            conn: None,
            created: now,
            last_hit: now,
            hits: 0,
            bytes: 0,
        }
    }

    #[test]
    fn epoch_change_makes_entries_stale() {
        let mut t = Uft::new(8, 1000, 1);
        t.insert(key(1), entry(1, 0));
        assert!(t.lookup(&key(1), 1, 10, 100).is_some());
        assert!(t.lookup(&key(1), 2, 11, 100).is_none());
        let s = t.stats();
        assert_eq!((s.hits, s.misses, s.stale), (1, 1, 1));
        // Recomputed in the new epoch: a hit again.
        t.insert(key(1), entry(2, 12));
        assert_eq!(t.lookup(&key(1), 2, 13, 100).unwrap().hits, 1);
        assert!(t.dump_page(0, 10, 3, 13).0[0].stale);
    }

    #[test]
    fn idle_entries_expire() {
        let mut t = Uft::new(8, 1000, 1);
        t.insert(key(1), entry(1, 0));
        t.insert(key(2), entry(1, 0));
        // A hit refreshes the idle clock.
        assert!(t.lookup(&key(1), 1, 900, 100).is_some());
        assert!(t.lookup(&key(2), 1, 1000, 100).is_none());
        assert_eq!(t.stats().expired, 1);
        t.expire_step(1, 1500, 8);
        assert_eq!(t.len(), 1);
        t.expire_step(1, 1900, 8);
        assert!(t.is_empty());
        assert_eq!(t.stats().expired, 3);
    }

    #[test]
    fn expiry_visits_a_bounded_number_of_entries_per_step_and_resumes() {
        let mut t = Uft::new(1000, 1000, 1);
        for i in 0..100 {
            // Every other entry goes idle.
            t.insert(key(i), entry(1, if i % 2 == 0 { 0 } else { 5000 }));
        }
        let mut removed = Vec::new();
        for _ in 0..10 {
            let before = t.len();
            t.expire_step(1, 5500, 10);
            removed.push(before - t.len());
        }
        // Each step of 10 positions finds 5 idle entries; ten steps cover the table.
        assert_eq!(removed, vec![5; 10]);
        assert_eq!(t.len(), 50);
        assert!((0..100)
            .step_by(2)
            .all(|i| t.lookup(&key(i), 1, 5500, 100).is_none()));
        // The next step wraps around to the start.
        t.expire_step(2, 5500, 10);
        assert_eq!(t.len(), 45);
    }

    #[test]
    fn pages_return_every_entry_exactly_once() {
        let mut t = Uft::new(1000, 1000, 1);
        for i in 0..250 {
            t.insert(key(i), entry(1, 0));
        }
        let mut seen = Vec::new();
        let mut cursor = Some(0);
        let mut pages = 0;
        while let Some(from) = cursor {
            let (page, next) = t.dump_page(from, 64, 1, 0);
            assert!(page.len() <= 64);
            seen.extend(page.iter().map(|d| d.key.src_port));
            cursor = next;
            pages += 1;
            // The table changes between pages: a removed entry and a new one.
            if pages == 2 {
                t.remove(&key(249));
                t.remove(&key(3));
                t.insert(key(1000), entry(1, 0));
            }
        }
        seen.sort_unstable();
        let len = seen.len();
        seen.dedup();
        assert_eq!(seen.len(), len, "no entry twice");
        // Entries present throughout: all of them (key 3 was already read, key 249
        // was removed before its page; key 1000 took key 3's slot, already read).
        let want: Vec<u16> = (0..249).collect();
        assert_eq!(seen, want);
        assert_eq!(pages, 4);
        let (all, next) = t.dump_page(0, usize::MAX, 1, 0);
        assert_eq!((all.len(), next), (249, None));
    }

    #[test]
    fn full_table_evicts_stale_first() {
        let mut t = Uft::new(3, 1000, 1);
        t.insert(key(1), entry(1, 0));
        t.insert(key(2), entry(2, 0));
        t.insert(key(3), entry(2, 0));
        // Replacing an existing key never evicts.
        t.insert(key(3), entry(2, 0));
        assert_eq!(t.stats().evicted, 0);
        t.insert(key(4), entry(2, 1));
        assert_eq!(t.stats().evicted, 1);
        assert_eq!(t.len(), 3);
        assert!(
            t.lookup(&key(1), 2, 2, 100).is_none(),
            "the stale entry was the victim"
        );
        assert!(t.lookup(&key(2), 2, 2, 100).is_some());
        // No stale or idle entry: some entry still makes room.
        t.insert(key(5), entry(2, 3));
        assert_eq!((t.len(), t.stats().evicted), (3, 2));
    }

    #[test]
    fn evictions_go_round_the_table() {
        let mut t = Uft::new(4, 1000, 1);
        for i in 0..4 {
            t.insert(key(i), entry(1, 0));
        }
        // All busy: each new flow evicts the next one in turn, not the same slot.
        for i in 10..14 {
            t.insert(key(i), entry(1, 1));
        }
        assert_eq!(t.stats().evicted, 4);
        assert!((10..14).all(|i| t.lookup(&key(i), 1, 2, 100).is_some()));
    }
}
