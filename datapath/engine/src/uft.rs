//! The unified flow table (UFT): per port and direction, the compiled result of all
//! layers for one flow, so that every packet after a flow's first skips the layers.
//!
//! Each entry carries the engine epoch it was computed in. Any change to rules,
//! routes, V2P mappings or ports bumps the epoch, which makes every older entry stale
//! at once without walking the tables: a stale entry is a miss, recomputed and
//! overwritten. Entries idle longer than the TTL are misses too and are swept by
//! `Engine::tick`. The table has a size limit; a full table evicts (counted) a stale
//! or idle entry if it finds one among the first few it inspects, else any entry.
//!
//! A hit costs one hash-map lookup and allocates nothing; inserting (a miss) may grow
//! the map, which is the slow path.

use crate::encap::OuterTemplate;
use crate::firewall::ConnHandle;
use crate::flow::{flow_map, FlowKey, FlowMap};
use crate::port::PortId;
use serde::Serialize;
use std::collections::hash_map::Entry;
use std::net::Ipv6Addr;
use wire::MacAddr;

/// A cached per-flow decision, as `dump-uft` describes it.
pub trait CachedAction {
    fn describe(&self) -> String;
}

/// What to do with every packet of an outbound flow.
#[derive(Clone, Debug)]
pub enum OutAction {
    /// To a guest on this sled: no encapsulation; the inner source MAC becomes that
    /// port's gateway MAC and the destination MAC the guest's.
    Local { port: PortId },
    /// To a guest of another worker of this sled (MAC `mac`): handed to that worker,
    /// which delivers it as `Local`.
    Sibling { worker: u16, mac: MacAddr },
    /// To another sled (or boundary services): encapsulate.
    Encap(Box<EncapAction>),
    /// Drop, counted under this reason.
    Drop(&'static str),
}

/// What to do with every packet of an inbound flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InAction {
    /// Hand to the port's guest.
    Deliver,
    /// Drop, counted under this reason.
    Drop(&'static str),
}

impl CachedAction for OutAction {
    fn describe(&self) -> String {
        match self {
            OutAction::Local { port } => format!("local port {}", port.0),
            OutAction::Sibling { worker, mac } => format!("worker {worker} port {mac}"),
            OutAction::Encap(e) => format!(
                "encap vni {} to {} via ifindex {}{}",
                e.vni,
                e.underlay_dst,
                e.ifindex,
                if e.internal { "" } else { " (external)" }
            ),
            OutAction::Drop(r) => format!("drop {r}"),
        }
    }
}

impl CachedAction for InAction {
    fn describe(&self) -> String {
        match self {
            InAction::Deliver => "deliver".to_string(),
            InAction::Drop(r) => format!("drop {r}"),
        }
    }
}

/// The cached encapsulation of one flow. Boxed in [`OutAction`] so that drop and
/// local entries stay small.
#[derive(Clone, Debug)]
pub struct EncapAction {
    pub outer: OuterTemplate,
    pub ifindex: u32,
    /// The inner destination MAC (the remote guest's).
    pub inner_dst_mac: MacAddr,
    /// VPC-internal: TCP is segmented to fit the underlay, not the guest MSS.
    pub internal: bool,
    /// For dumps.
    pub underlay_dst: Ipv6Addr,
    pub vni: u32,
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
    /// `Firewall::track`, and a flow whose connection is gone is decided again.
    /// False for drops and for rule-only (stateless) decisions, which hold until the
    /// epoch changes.
    pub needs_conn: bool,
    /// The connection to confirm, reached without a second lookup. `None` with
    /// `needs_conn` (a related ICMP error) means the flow is decided on every packet.
    pub conn: Option<ConnHandle>,
    pub created: u64,
    pub last_hit: u64,
    pub hits: u64,
}

/// Counters of one table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct UftStats {
    pub entries: u64,
    pub hits: u64,
    pub misses: u64,
    /// Misses on an entry from an older epoch.
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
    pub hits: u64,
    pub idle_ns: u64,
    pub stale: bool,
}

/// How many entries a full table inspects for a stale or idle victim.
const EVICT_SCAN: usize = 16;

/// One port's table for one direction.
#[derive(Debug)]
pub struct Uft<A> {
    map: FlowMap<UftEntry<A>>,
    limit: usize,
    ttl_ns: u64,
    stats: UftStats,
}

impl<A: CachedAction> Uft<A> {
    /// `limit` entries at most; space for `limit.min(1024)` is reserved now so that a
    /// port's first flows do not grow the map. `hash_seed` keys the table's hash.
    pub fn new(limit: usize, ttl_ns: u64, hash_seed: u64) -> Self {
        let mut map = flow_map(hash_seed);
        map.reserve(limit.min(1024));
        Uft {
            map,
            limit,
            ttl_ns,
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
    /// the hit or miss.
    pub fn lookup(&mut self, key: &FlowKey, epoch: u64, now: u64) -> Option<&mut UftEntry<A>> {
        let stats = &mut self.stats;
        match self.map.get_mut(key) {
            Some(e) => match Self::usable(e, epoch, now, self.ttl_ns) {
                Ok(()) => {
                    e.last_hit = now;
                    e.hits += 1;
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
            let (epoch, now, ttl) = (entry.epoch, entry.last_hit, self.ttl_ns);
            let victim = self
                .map
                .iter()
                .take(EVICT_SCAN)
                .find(|(_, e)| Self::usable(e, epoch, now, ttl).is_err())
                .or_else(|| self.map.iter().next())
                .map(|(k, _)| *k);
            if let Some(k) = victim {
                self.map.remove(&k);
                self.stats.evicted += 1;
            }
        }
        match self.map.entry(key) {
            Entry::Occupied(mut o) => {
                o.insert(entry);
                o.into_mut()
            }
            Entry::Vacant(v) => v.insert(entry),
        }
    }

    pub fn remove(&mut self, key: &FlowKey) {
        self.map.remove(key);
    }

    /// Removes entries from older epochs or idle past the TTL.
    pub fn expire(&mut self, epoch: u64, now: u64) {
        let ttl = self.ttl_ns;
        let mut n = 0;
        self.map.retain(|_, e| {
            let keep = Self::usable(e, epoch, now, ttl).is_ok();
            n += u64::from(!keep);
            keep
        });
        self.stats.expired += n;
    }

    pub fn clear(&mut self) {
        self.map.clear();
    }

    pub fn len(&self) -> usize {
        self.map.len()
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

    pub fn dump(&self, epoch: u64, now: u64) -> Vec<UftDump> {
        let mut v: Vec<UftDump> = self
            .map
            .iter()
            .map(|(k, e)| UftDump {
                key: *k,
                action: e.action.describe(),
                path_mtu: e.path_mtu,
                hits: e.hits,
                idle_ns: now.saturating_sub(e.last_hit),
                stale: e.epoch != epoch,
            })
            .collect();
        v.sort_by_key(|d| (d.key.proto, d.key.src_port, d.key.dst_port, d.key.dst_ip));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(sp: u16) -> FlowKey {
        FlowKey {
            vni: 5,
            proto: 17,
            src_ip: "10.0.0.1".parse().unwrap(),
            dst_ip: "10.0.0.2".parse().unwrap(),
            src_port: sp,
            dst_port: 53,
            icmp_type: 0,
            icmp_code: 0,
        }
    }

    fn entry(epoch: u64, now: u64) -> UftEntry<InAction> {
        UftEntry {
            epoch,
            action: InAction::Deliver,
            path_mtu: 1500,
            needs_conn: true,
            conn: None,
            created: now,
            last_hit: now,
            hits: 0,
        }
    }

    #[test]
    fn epoch_change_makes_entries_stale() {
        let mut t = Uft::new(8, 1000, 1);
        t.insert(key(1), entry(1, 0));
        assert!(t.lookup(&key(1), 1, 10).is_some());
        assert!(t.lookup(&key(1), 2, 11).is_none());
        let s = t.stats();
        assert_eq!((s.hits, s.misses, s.stale), (1, 1, 1));
        // Recomputed in the new epoch: a hit again.
        t.insert(key(1), entry(2, 12));
        assert_eq!(t.lookup(&key(1), 2, 13).unwrap().hits, 1);
        assert!(t.dump(3, 13)[0].stale);
    }

    #[test]
    fn idle_entries_expire() {
        let mut t = Uft::new(8, 1000, 1);
        t.insert(key(1), entry(1, 0));
        t.insert(key(2), entry(1, 0));
        // A hit refreshes the idle clock.
        assert!(t.lookup(&key(1), 1, 900).is_some());
        assert!(t.lookup(&key(2), 1, 1000).is_none());
        assert_eq!(t.stats().expired, 1);
        t.expire(1, 1500);
        assert_eq!(t.len(), 1);
        t.expire(1, 1900);
        assert!(t.is_empty());
        assert_eq!(t.stats().expired, 3);
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
            t.lookup(&key(1), 2, 2).is_none(),
            "the stale entry was the victim"
        );
        assert!(t.lookup(&key(2), 2, 2).is_some());
        // No stale or idle entry: some entry still makes room.
        t.insert(key(5), entry(2, 3));
        assert_eq!((t.len(), t.stats().evicted), (3, 2));
    }
}
