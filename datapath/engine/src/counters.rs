//! Counters: drops by named reason, and the per-port and datapath-wide statistics.
//!
//! Drop reasons are `&'static str` names, the same strings that appear in stats
//! output, logs and docs/engine.md. Reasons come from several modules (this crate's
//! layers, `tso::TsoDrop`, the gateway, `wire::meta::UnderlayDrop`), so the counter
//! set is a small fixed table of (name, count) rather than one struct field per
//! reason. It never allocates: a drop on the fast path costs a short linear search.

use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

/// Distinct reasons one counter set can hold; later ones are counted under
/// [`OVERFLOW`]. Sized well above the number of reasons that exist (about 50).
const SLOTS: usize = 96;

/// Name under which reasons beyond [`SLOTS`] are counted.
pub const OVERFLOW: &str = "other";

/// Counts by reason name.
#[derive(Clone)]
pub struct DropCounters {
    slots: [(&'static str, u64); SLOTS],
    len: usize,
}

impl Default for DropCounters {
    fn default() -> Self {
        DropCounters {
            slots: [("", 0); SLOTS],
            len: 0,
        }
    }
}

impl DropCounters {
    /// A counter set in which `names` appear (with zero) even before they count.
    pub fn with_names(names: impl IntoIterator<Item = &'static str>) -> Self {
        let mut c = DropCounters::default();
        for n in names {
            c.add(n, 0);
        }
        c
    }

    pub fn inc(&mut self, name: &'static str) {
        self.add(name, 1);
    }

    pub fn add(&mut self, name: &'static str, n: u64) {
        if let Some(s) = self.slots[..self.len].iter_mut().find(|s| s.0 == name) {
            s.1 += n;
        } else if self.len < SLOTS - 1 {
            self.slots[self.len] = (name, n);
            self.len += 1;
        } else {
            // The last slot is reserved for the overflow bucket.
            self.slots[SLOTS - 1].0 = OVERFLOW;
            self.slots[SLOTS - 1].1 += n;
            self.len = SLOTS;
        }
    }

    pub fn get(&self, name: &str) -> u64 {
        self.iter().find(|(n, _)| *n == name).map_or(0, |(_, c)| c)
    }

    pub fn total(&self) -> u64 {
        self.iter().map(|(_, c)| c).sum()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        self.slots[..self.len].iter().copied()
    }
}

impl core::fmt::Debug for DropCounters {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_map()
            .entries(self.iter().filter(|(_, c)| *c != 0))
            .finish()
    }
}

impl Serialize for DropCounters {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.len))?;
        for (n, c) in self.iter() {
            m.serialize_entry(n, &c)?;
        }
        m.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_by_name_and_overflows_into_other() {
        let mut c = DropCounters::with_names(["a", "b"]);
        c.inc("b");
        c.inc("b");
        c.inc("c");
        assert_eq!(
            (c.get("a"), c.get("b"), c.get("c"), c.get("zz")),
            (0, 2, 1, 0)
        );
        assert_eq!(c.total(), 3);
        let names: Vec<&'static str> = (0..200)
            .map(|i| &*Box::leak(format!("r{i}").into_boxed_str()))
            .collect();
        for n in &names {
            c.inc(n);
        }
        assert_eq!(c.total(), 203);
        assert_eq!(c.get(OVERFLOW), 203 - (SLOTS as u64 - 1 - 3) - 3);
    }
}
