//! What the engine does as time passes ([`Engine::tick`]): the gateway's Router
//! Advertisements, a bounded step of the flow tables' expiry, the sweep of idle
//! connections, and the timeout of frames waiting for their next hop.

use super::ports::{count_drop, Port};
use super::Engine;
use crate::drop::DropReason;
use crate::frames::output::TxBatch;
use crate::vpc::gateway;

/// How often `tick` sweeps idle flows out of the tables: a sweep walks every table,
/// so it runs at most this often however often the caller ticks.
const SWEEP_INTERVAL_NS: u64 = 1_000_000_000;

/// Flow-table slots `tick` inspects for expiry, across all tables, so that a tick
/// costs at most ~100 us whatever the tables hold (removing 2048 entries took
/// 0.2-0.4 ms on the 2-core test machine); each table's sweep resumes where it
/// stopped. Memory never waits for the sweep: full tables evict idle entries first.
const UFT_EXPIRE_PER_TICK: usize = 1024;

impl Engine {
    /// Timers: RAs (periodic, after an MTU change, and answering rate-limited
    /// solicitations), a bounded step of the flow tables' expiry, the timeout of
    /// frames waiting for a next hop, and at most once a second the sweep of idle
    /// connections (and their cached flows).
    pub fn tick(&mut self, now: u64, out: &mut TxBatch) {
        self.now = self.now.max(now);
        let sweep = now.saturating_sub(self.last_sweep) >= SWEEP_INTERVAL_NS;
        self.expire_held(now);
        // Each table's share of the step is its share of the slots, so every table
        // is swept in the same number of ticks.
        let slots: usize = self.ports.iter().flatten().map(Port::uft_slots).sum();
        let step = |t: usize| (UFT_EXPIRE_PER_TICK * t).div_ceil(slots.max(1));
        for p in self.ports.iter_mut().flatten() {
            p.uft_out.expire_step(p.epoch, now, step(p.uft_out.slots()));
            p.uft_in.expire_step(p.epoch, now, step(p.uft_in.slots()));
            if p.mtu_changed {
                gateway::on_mtu_change(&p.cfg, &mut p.gw, p.id, now, out);
                p.mtu_changed = false;
            }
            gateway::tick(&p.cfg, &mut p.gw, p.id, now, out);
            if sweep {
                let Port {
                    fw,
                    uft_out,
                    uft_in,
                    snat,
                    ..
                } = p;
                fw.conns_mut().expire(now, |k| {
                    uft_out.remove(k);
                    uft_in.remove(&k.reversed());
                    snat.forget(k);
                });
            }
        }
        if sweep {
            self.last_sweep = now;
            self.departures.expire(now);
        }
    }

    /// Drops (counted) the held frames that waited `hold::HOLD_TIMEOUT_NS`.
    pub(super) fn expire_held(&mut self, now: u64) {
        let Engine {
            ports, hold, drops, ..
        } = self;
        hold.expire(now, |h| {
            count_drop(ports, drops, h.port, DropReason::UnderlayHoldTimeout);
        });
    }
}
