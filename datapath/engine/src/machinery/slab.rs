//! A flow-keyed map whose entries stay in one slot of a vector for their whole life.
//!
//! The unified flow table is walked a little at a time: expiry looks at a bounded
//! number of entries per tick and resumes where it stopped, eviction rotates through
//! the table, and `dump-uft` hands out pages from a cursor. A hash map cannot be
//! resumed (a rehash between two steps reorders it, so a walk would miss entries or
//! see them twice); slots can: an entry's position changes only when it is removed,
//! so a walk by position sees every entry that stays in the table exactly once.
//!
//! The keyed hash index (see `flow`) maps a key to its slot; a lookup is one probe
//! and one indexed load, and allocates nothing.

use crate::machinery::flow::{flow_map, FlowKey, FlowMap};

/// Flow key -> value, each entry in a stable slot (its position).
#[derive(Debug)]
pub struct FlowSlab<V> {
    index: FlowMap<u32>,
    slots: Vec<Option<(FlowKey, V)>>,
    /// Free positions, reused last-freed first.
    free: Vec<u32>,
}

impl<V> FlowSlab<V> {
    /// An empty map whose index is hashed with `hash_seed`.
    pub fn new(hash_seed: u64) -> Self {
        FlowSlab {
            index: flow_map(hash_seed),
            slots: Vec::new(),
            free: Vec::new(),
        }
    }

    /// Makes room for `n` entries without growing.
    pub fn reserve(&mut self, n: usize) {
        self.index.reserve(n);
        self.slots.reserve(n);
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// How many positions there are (occupied or free): walks go over `0..positions()`.
    pub fn positions(&self) -> usize {
        self.slots.len()
    }

    #[inline]
    pub fn get_mut(&mut self, key: &FlowKey) -> Option<&mut V> {
        let pos = *self.index.get(key)? as usize;
        self.slots.get_mut(pos)?.as_mut().map(|(_, v)| v)
    }

    pub fn contains_key(&self, key: &FlowKey) -> bool {
        self.index.contains_key(key)
    }

    /// Sets the value of `key` (in its slot if it has one, else in a free or new one)
    /// and returns it. Inlined: a flow-table entry is large, and passed to an out of
    /// line insert it is copied once more for every new flow.
    #[inline]
    pub fn insert(&mut self, key: FlowKey, value: V) -> &mut V {
        let pos = match self.index.get(&key) {
            Some(&pos) => pos,
            None => {
                let pos = self.free.pop().unwrap_or_else(|| {
                    self.slots.push(None);
                    // Tables are limited far below 2^32 entries (see `TableBudget`).
                    (self.slots.len() - 1) as u32
                });
                self.index.insert(key, pos);
                pos
            }
        };
        let slot = &mut self.slots[pos as usize];
        &mut slot.insert((key, value)).1
    }

    pub fn remove(&mut self, key: &FlowKey) -> Option<V> {
        let pos = *self.index.get(key)?;
        self.remove_at(pos as usize).map(|(_, v)| v)
    }

    /// The entry at position `pos`, if that slot is occupied.
    pub fn at(&self, pos: usize) -> Option<(&FlowKey, &V)> {
        self.slots.get(pos)?.as_ref().map(|(k, v)| (k, v))
    }

    /// Removes the entry at position `pos`, if that slot is occupied.
    pub fn remove_at(&mut self, pos: usize) -> Option<(FlowKey, V)> {
        let (key, value) = self.slots.get_mut(pos)?.take()?;
        self.index.remove(&key);
        self.free.push(pos as u32);
        Some((key, value))
    }

    pub fn clear(&mut self) {
        self.index.clear();
        self.slots.clear();
        self.free.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::machinery::flow::udp_test_key as key;

    #[test]
    fn entries_keep_their_position_until_removed() {
        let mut s = FlowSlab::new(1);
        for i in 0..4 {
            *s.insert(key(i), i) += 10;
        }
        assert_eq!(s.len(), 4);
        assert_eq!(s.at(2), Some((&key(2), &12)));
        // Replacing keeps the slot.
        s.insert(key(2), 7);
        assert_eq!(s.at(2), Some((&key(2), &7)));
        assert_eq!(s.remove(&key(1)), Some(11));
        assert_eq!(s.remove(&key(1)), None);
        assert_eq!(s.at(1), None);
        assert!(!s.contains_key(&key(1)));
        // The others did not move; the free slot is reused.
        assert_eq!(s.at(3), Some((&key(3), &13)));
        s.insert(key(9), 9);
        assert_eq!(s.at(1), Some((&key(9), &9)));
        assert_eq!(s.positions(), 4);
        assert_eq!(s.remove_at(0), Some((key(0), 10)));
        assert_eq!(s.remove_at(0), None);
        assert_eq!(s.remove_at(99), None);
        assert_eq!(s.get_mut(&key(0)), None);
        assert_eq!(s.get_mut(&key(3)), Some(&mut 13));
        let keys: Vec<u16> = (0..s.positions())
            .filter_map(|p| s.at(p).map(|(k, _)| k.src_port))
            .collect();
        assert_eq!(keys, [9, 2, 3]);
        s.clear();
        assert!(s.is_empty() && s.positions() == 0 && s.at(1).is_none());
    }
}
