//! The memory budget of the flow and connection tables.
//!
//! Every port has a connection table (the firewall's) and two unified flow tables,
//! and a remote peer or a guest can fill them (a SYN flood, a port scan). Per-port
//! limits alone let the sum grow with the number of ports; the budget bounds the
//! sled's total. It is split evenly and statically: each of [`TableBudget::ports`]
//! ports gets `bytes / ports`, whether or not the other ports exist, and a port's
//! tables are capped at what its share pays for. So one guest's flood can never take
//! another guest's share, adding a port never shrinks a table in use, and the engine
//! refuses ports beyond `ports`. A table at its cap evicts (counted: `evicted`,
//! `flows_evicted`) or refuses new flows (`fw_table_full`).

use super::action::{EncapAction, InAction, OutAction};
use crate::machinery::conntrack::{FlowLimits, CONN_SLOT_BYTES};
use crate::machinery::flow::FlowKey;
use crate::machinery::uft::UftEntry;
use core::mem::size_of;
use serde::Serialize;

/// A hash table entry's cost at the table's emptiest: just after it grew it is 7/16
/// full, plus one control byte per bucket.
const fn hashed(entry: usize) -> usize {
    (entry + 1) * 16 / 7
}

/// Estimated bytes of one outbound flow-table entry: its index entry (key + slot
/// number), its slot (key + entry, the slot vector up to twice its length), and the
/// boxed encapsulation with the allocator's header.
pub const UFT_OUT_ENTRY_BYTES: usize = hashed(size_of::<(FlowKey, u32)>())
    + 2 * size_of::<Option<(FlowKey, UftEntry<OutAction>)>>()
    + size_of::<EncapAction>()
    + 16;

/// Estimated bytes of one inbound flow-table entry (as outbound, nothing boxed).
pub const UFT_IN_ENTRY_BYTES: usize =
    hashed(size_of::<(FlowKey, u32)>()) + 2 * size_of::<Option<(FlowKey, UftEntry<InAction>)>>();

/// Estimated bytes of one connection: its index entry (key + slot number) and its
/// slab slot, the slab up to twice its length, plus its free-list entry.
pub const CONN_BYTES: usize = hashed(size_of::<(FlowKey, u32)>()) + 2 * CONN_SLOT_BYTES + 2 * 4;

/// What one port's tables may cost at their configured limits.
fn port_cost(flow: &FlowLimits) -> u128 {
    flow.fw_flow_limit as u128 * CONN_BYTES as u128
        + flow.uft_limit as u128 * (UFT_OUT_ENTRY_BYTES + UFT_IN_ENTRY_BYTES) as u128
}

/// Memory for the flow and connection tables of all ports, and how many ports share
/// it (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct TableBudget {
    pub bytes: usize,
    pub ports: usize,
}

impl Default for TableBudget {
    /// 16 GiB for up to 256 ports: 64 MiB a port, which at the default flow limits'
    /// proportions holds about 135,000 connections and 17,000 cached flows each way.
    /// A sled (1 TiB) gives the datapath this without noticing; an idle port uses
    /// almost none of it (the tables grow with their flows).
    fn default() -> Self {
        TableBudget {
            bytes: 16 << 30,
            ports: 256,
        }
    }
}

/// The table sizes of one port, from its share of the budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct PortTableLimits {
    /// Connections (the firewall's table).
    pub conns: usize,
    /// Unified flow table entries, each direction.
    pub uft: usize,
    /// The port's share of the budget.
    pub share_bytes: usize,
}

/// Why a table budget was refused; the message names the values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BudgetError {
    #[error("table budget: ports must be above 0")]
    NoPorts,
    /// A port's share would not hold one connection and one flow each way.
    #[error(
        "table budget of {bytes} bytes for {ports} ports leaves {share} bytes a port, below the \
         {min} one connection and one flow each way need"
    )]
    TooSmall {
        bytes: usize,
        ports: usize,
        share: usize,
        min: usize,
    },
}

impl TableBudget {
    /// One port's share.
    pub fn share(&self) -> usize {
        self.bytes / self.ports.max(1)
    }

    /// Refuses a budget that does not give each port room for one connection and
    /// one flow each way, naming the values.
    pub fn validate(&self) -> Result<(), BudgetError> {
        if self.ports == 0 {
            return Err(BudgetError::NoPorts);
        }
        let min = CONN_BYTES + UFT_OUT_ENTRY_BYTES + UFT_IN_ENTRY_BYTES;
        if self.share() < min {
            return Err(BudgetError::TooSmall {
                bytes: self.bytes,
                ports: self.ports,
                share: self.share(),
                min,
            });
        }
        Ok(())
    }

    /// The budget of one of `engines` engines that share this one (the daemon runs
    /// one engine per worker): bytes and ports divided, at least one port each.
    pub fn split(self, engines: usize) -> TableBudget {
        let n = engines.max(1);
        TableBudget {
            bytes: self.bytes / n,
            ports: (self.ports / n).max(1),
        }
    }

    /// A port's table sizes: the configured per-port limits, scaled down together
    /// (keeping their proportions) until they fit the port's share; at least one
    /// entry each.
    pub fn port_limits(&self, flow: &FlowLimits) -> PortTableLimits {
        let share = self.share();
        let cost = port_cost(flow);
        let scale = |limit: usize| -> usize {
            if cost <= share as u128 {
                return limit;
            }
            let scaled = limit as u128 * share as u128 / cost;
            usize::try_from(scaled).unwrap_or(limit).max(1)
        };
        PortTableLimits {
            conns: scale(flow.fw_flow_limit),
            uft: scale(flow.uft_limit),
            share_bytes: share,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_fit_the_share_and_keep_their_proportions() {
        let flow = FlowLimits::default();
        let b = TableBudget::default();
        let l = b.port_limits(&flow);
        let cost = l.conns * CONN_BYTES + l.uft * (UFT_OUT_ENTRY_BYTES + UFT_IN_ENTRY_BYTES);
        assert!(cost <= b.share(), "{cost} > {}", b.share());
        assert!(cost > b.share() * 99 / 100, "the share is used: {cost}");
        assert_eq!(l.conns / l.uft, flow.fw_flow_limit / flow.uft_limit);
        // The documented sizes.
        assert!((120_000..200_000).contains(&l.conns), "{l:?}");
        assert!((15_000..25_000).contains(&l.uft), "{l:?}");
        // A budget above what the limits cost leaves them alone.
        let big = TableBudget {
            bytes: 1 << 40,
            ports: 2,
        };
        let l = big.port_limits(&flow);
        assert_eq!((l.conns, l.uft), (flow.fw_flow_limit, flow.uft_limit));
    }

    #[test]
    fn bad_budgets_are_refused_by_value() {
        let e = TableBudget {
            bytes: 1000,
            ports: 4,
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(e.contains("1000") && e.contains("250"), "{e}");
        let e = TableBudget {
            bytes: 1 << 30,
            ports: 0,
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(e.contains("ports"), "{e}");
        assert!(TableBudget::default().validate().is_ok());
    }

    #[test]
    fn split_divides_bytes_and_ports() {
        let s = TableBudget::default().split(2);
        assert_eq!((s.bytes, s.ports), (8 << 30, 128));
        assert_eq!(s.share(), TableBudget::default().share());
        assert_eq!(TableBudget::default().split(0), TableBudget::default());
        assert_eq!(
            TableBudget {
                bytes: 100,
                ports: 1
            }
            .split(3)
            .ports,
            1
        );
    }
}
