//! Notification suppression both ways (virtio 1.1, 2.7.7 and 2.7.10): the
//! guest asks not to be interrupted while its driver polls, and overlayd asks the
//! guest not to kick while a worker polls the ring anyway.
//!
//! - Interrupts (overlayd → guest, the call eventfd): without `EVENT_IDX` the
//!   driver sets `VRING_AVAIL_F_NO_INTERRUPT` in the available ring's flags while
//!   it does not want them (Linux in NAPI polling, a DPDK guest always); with it,
//!   it writes `used_event`, the used index after which it wants the next one.
//!   Each interrupt skipped is an eventfd write saved here and an interrupt the
//!   guest does not take.
//! - Kicks (guest → overlayd, the kick eventfd): a worker that spins looks at the
//!   transmit ring every round, so a kick only costs the guest an exit (a VM) or
//!   a syscall (a DPDK guest) and wakes nothing. While the worker is awake the
//!   used ring's flags carry `VRING_USED_F_NO_NOTIFY` (without `EVENT_IDX`), or
//!   `avail_event` is left where it was (with it: the driver kicks only when its
//!   index passes it, about once per 65,536 frames); before the worker sleeps it
//!   asks for kicks again ([`Notifications::set_kicks`]) and looks at the ring
//!   once more, so a frame sent in between is not left waiting for the next one.
//!
//! Written by hand: `virtio-queue` 0.18 does not honour `NO_INTERRUPT`, and its
//! `EVENT_IDX` test counts only entries added through its own `add_used`, which the
//! receive path's batched publication ([`super::publish_used`]) does not use.

use std::num::Wrapping;
use std::sync::atomic::{fence, Ordering};

use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// `VRING_AVAIL_F_NO_INTERRUPT`.
const NO_INTERRUPT: u16 = 1;
/// `VRING_USED_F_NO_NOTIFY`.
const NO_NOTIFY: u16 = 1;

/// Where a split ring's notification fields are.
fn used_event(q: &Queue) -> GuestAddress {
    GuestAddress(q.avail_ring() + 4 + 2 * u64::from(q.size()))
}

fn avail_event(q: &Queue) -> GuestAddress {
    GuestAddress(q.used_ring() + 4 + 8 * u64::from(q.size()))
}

/// One ring's notifications as overlayd last left them.
#[derive(Debug)]
pub(super) struct Notifications {
    /// The used index when the guest was last considered for an interrupt:
    /// with `EVENT_IDX`, it wants one if its `used_event` lies between this and
    /// the used index now.
    considered: Wrapping<u16>,
    /// Whether overlayd last asked the guest to kick (a ring starts so: the
    /// driver kicks until told otherwise).
    kicks: bool,
}

impl Notifications {
    /// A ring starting at used index `base`.
    pub(super) fn new(base: u16) -> Notifications {
        Notifications {
            considered: Wrapping(base),
            kicks: true,
        }
    }

    /// Whether the guest wants an interrupt for what was added to the used ring
    /// since the last call. Reads guest memory only; any error (a ring the guest
    /// moved out of its memory) interrupts, as the default behaviour does.
    pub(super) fn wants_interrupt(
        &mut self,
        q: &Queue,
        mem: &GuestMemoryMmap,
        event_idx: bool,
    ) -> bool {
        let now = Wrapping(q.next_used());
        let before = std::mem::replace(&mut self.considered, now);
        // The used index was stored before the driver's field is read.
        fence(Ordering::SeqCst);
        if event_idx {
            match mem.read_obj::<u16>(used_event(q)) {
                // vring_need_event(): the driver's index in (before, now].
                Ok(e) => now - Wrapping(u16::from_le(e)) - Wrapping(1) < now - before,
                Err(_) => true,
            }
        } else {
            match mem.read_obj::<u16>(GuestAddress(q.avail_ring())) {
                Ok(flags) => u16::from_le(flags) & NO_INTERRUPT == 0,
                Err(_) => true,
            }
        }
    }

    /// Asks the guest to kick (`on`) or not. Asking not to is written only when
    /// the last request was to kick; asking to kick is always written (a ring
    /// taken over from an earlier back end may carry its request). Returns
    /// whether guest memory was written (for the dirty log) and, when `on`,
    /// whether the guest had already made frames available that were not taken:
    /// then the caller must not wait for a kick.
    pub(super) fn set_kicks(
        &mut self,
        q: &Queue,
        mem: &GuestMemoryMmap,
        event_idx: bool,
        on: bool,
    ) -> (bool, bool) {
        if !on && !self.kicks {
            return (false, false);
        }
        self.kicks = on;
        let written = if event_idx {
            // Off: `avail_event` is left where it is (see the module's doc).
            on && mem
                .write_obj(q.next_avail().to_le(), avail_event(q))
                .is_ok()
        } else {
            let flags: u16 = if on { 0 } else { NO_NOTIFY };
            mem.write_obj(flags.to_le(), GuestAddress(q.used_ring()))
                .is_ok()
        };
        if !on {
            return (written, false);
        }
        // The request is visible before the available index is read again: a
        // frame the driver added after this read sees the request and kicks.
        fence(Ordering::SeqCst);
        let pending = q
            .avail_idx(mem, Ordering::Acquire)
            .is_ok_and(|a| a.0 != q.next_avail());
        (written, pending)
    }
}
