//! Drop counters: one `u64` per [`DropReason`], in an array indexed by the reason.
//!
//! A drop on the fast path is one add at a constant index (no name lookup, no
//! allocation). `stats` shows a set as a map from reason name to count; a reason
//! appears once it has counted, or always when the set was made
//! [`with`](DropCounters::with) it (the underlay set lists every
//! `UnderlayDrop`, so a reader finds a zero rather than no key).

use crate::drop::DropReason;
use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

/// Counts by reason.
#[derive(Clone, PartialEq, Eq)]
pub struct DropCounters {
    counts: [u64; DropReason::COUNT],
    /// Reasons shown even while zero.
    listed: [bool; DropReason::COUNT],
}

impl Default for DropCounters {
    fn default() -> Self {
        DropCounters {
            counts: [0; DropReason::COUNT],
            listed: [false; DropReason::COUNT],
        }
    }
}

impl DropCounters {
    /// A counter set in which `reasons` appear (with zero) even before they count.
    pub fn with(reasons: impl IntoIterator<Item = DropReason>) -> Self {
        let mut c = DropCounters::default();
        for r in reasons {
            c.listed[r as usize] = true;
        }
        c
    }

    #[inline]
    pub fn inc(&mut self, r: DropReason) {
        self.add(r, 1);
    }

    #[inline]
    pub fn add(&mut self, r: DropReason, n: u64) {
        let c = &mut self.counts[r as usize];
        *c = c.wrapping_add(n);
    }

    pub fn get(&self, r: DropReason) -> u64 {
        self.counts[r as usize]
    }

    /// The count of the reason named `name` (0 for a name that is no reason), for
    /// readers that have the name rather than the reason (tests, logs).
    pub fn get_named(&self, name: &str) -> u64 {
        DropReason::from_name(name).map_or(0, |r| self.get(r))
    }

    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Adds every count of `other` (counters of another worker's engine).
    pub fn merge(&mut self, other: &DropCounters) {
        for (i, (c, o)) in self.counts.iter_mut().zip(other.counts).enumerate() {
            *c = c.saturating_add(o);
            self.listed[i] |= other.listed[i];
        }
    }

    /// The reasons shown, with their counts: those listed or counted.
    pub fn iter(&self) -> impl Iterator<Item = (DropReason, u64)> + '_ {
        DropReason::ALL
            .iter()
            .map(|&r| (r, self.counts[r as usize]))
            .filter(|&(r, c)| c != 0 || self.listed[r as usize])
    }
}

impl core::fmt::Debug for DropCounters {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_map()
            .entries(
                self.iter()
                    .filter(|(_, c)| *c != 0)
                    .map(|(r, c)| (r.name(), c)),
            )
            .finish()
    }
}

impl Serialize for DropCounters {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        for (r, c) in self.iter() {
            m.serialize_entry(r.name(), &c)?;
        }
        m.end()
    }
}

/// Gives a statistics struct a `merge` that adds another worker's values field by
/// field. Every field must be named (the destructuring does not compile otherwise),
/// so a field added later is placed deliberately: in the list when summing it
/// across workers is right (counters, and gauges of things each worker holds
/// alone, like its own queue's length), and merged by hand otherwise (gauges of
/// what every worker holds alike, like the V2P table).
#[macro_export]
macro_rules! summed_across_workers {
    ($t:ident { $($f:ident),* $(,)? }) => {
        impl $t {
            /// Adds another worker's values, field by field (all summed).
            pub fn merge(&mut self, o: &$t) {
                let $t { $($f),* } = o;
                $(self.$f = self.$f.saturating_add(*$f);)*
            }
        }
    };
}
// `#[macro_export]` puts the macro at the crate root for other crates
// (`engine::summed_across_workers!`); this path is the crate's own, so its users
// here name the module that defines it.
pub(crate) use summed_across_workers;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_by_reason_lists_and_merges() {
        let mut c = DropCounters::with([DropReason::NoRoute]);
        c.inc(DropReason::FwDenyIn);
        c.inc(DropReason::FwDenyIn);
        c.add(DropReason::Hairpin, 3);
        assert_eq!(
            (c.get(DropReason::NoRoute), c.get(DropReason::FwDenyIn)),
            (0, 2)
        );
        assert_eq!(c.total(), 5);
        assert_eq!(
            serde_json::to_value(&c).unwrap(),
            serde_json::json!({"hairpin": 3, "no_route": 0, "fw_deny_in": 2})
        );
        let mut d = DropCounters::default();
        d.inc(DropReason::NoV2p);
        d.merge(&c);
        assert_eq!((d.get(DropReason::FwDenyIn), d.total()), (2, 6));
        assert_eq!(d.iter().count(), 4, "no_route stays listed");
    }
}
