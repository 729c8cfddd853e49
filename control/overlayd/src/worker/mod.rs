//! One worker: a poll-mode thread with a [`Datapath`] of its own (an engine, its
//! guests' ports and, when I/O is on, its underlay queues), moving frames between
//! them through the engine with no copy the kernel does not force.
//!
//! A round ([`Datapath::poll_once`]):
//! 1. one `epoll_wait` says which taps have frames (zero timeout while there is work;
//!    in adaptive mode, once idle, the worker sleeps in that same call);
//! 2. received underlay frames ([`RxHeld`]) and frames handed over by the other
//!    workers ([`handoff`]) are taken and *held*: their buffers are not given back
//!    yet;
//! 3. the engine processes guest frames (into transmit slots the AF_XDP sockets lend
//!    it, [`UmemSpace`]), held underlay frames and handed-over frames (decapsulated
//!    and coalesced frames refer to the held buffers instead of copying them);
//! 4. the batch is drained ([`transmit`]): lent frames are submitted, tap frames
//!    written with one gathering `writev` each, super-frames (`--underlay-gso`)
//!    written to the underlay's tunnel tap after a kick of what was submitted before
//!    them, frames for other workers handed to them;
//! 5. held buffers go back (AF_XDP fill ring, other workers), and one kick sends
//!    everything submitted.
//!
//! Threading: one worker per configured core, each pinned; every port lives on
//! exactly one worker (see [`crate::workers`], which fans the controller's requests
//! out to them). Requests arrive as [`jobs`] between rounds ([`dataplane`] carries
//! them out), so the fast path takes no lock and a round never sees configuration
//! change half-way. Underlay next hops are resolved by a helper thread per worker
//! ([`crate::underlay::neighbours`]): a worker never waits on netlink. With several
//! workers, every engine learns where the other workers' ports are
//! (`Engine::set_sibling_port`, from [`WorkerPlane::set_port_owner`]); the engine
//! then says when a frame belongs to another worker and the loop hands it over.
//!
//! Faults: a guest port whose device goes away (an error or hang-up, or a read or
//! write failing as [`GuestFault::Gone`]) is taken down at the end of the round: its
//! fd leaves the poll set (a dead fd is reported by every wait, which would keep
//! the worker spinning), and the worker's [`Reattacher`] gets it back on a back-off;
//! the worker picks re-opened taps up on its timer tick. Frames for a down port are
//! counted, not written. The underlay sockets can be replaced between rounds
//! ([`WorkerIo::replace_queues`]) when the daemon re-attaches a link.
//!
//! Without I/O (tests, the headless daemon) the same [`Datapath`] runs with no
//! guests and no underlay: requests are applied to the engine alone.
//!
//! [`RxHeld`]: dpio::xsk::RxHeld
//! [`UmemSpace`]: crate::underlay::queues::UmemSpace
//! [`GuestFault::Gone`]: dpio::guest::GuestFault::Gone
//! [`WorkerPlane::set_port_owner`]: jobs::WorkerPlane::set_port_owner

pub mod capture;
pub mod dataplane;
pub mod fit;
pub mod guests;
pub mod handoff;
pub mod io;
pub mod jobs;
pub mod reattach;
pub mod shaper;
pub mod stats;
pub mod transmit;

use crate::config::PollMode;
use crate::controller::DataplaneError;
use crate::underlay::queues::UnderlayQueues;
use capture::Watch;
use dpio::guest::{GuestFault, GuestPort};
use engine::{Engine, RxFrame, SiblingFrame, TxBatch};
use guests::{PortTap, TapLink};
use io::{flush_guests, unwatch, up_tap_mut, Input, WorkerIo};
use jobs::{serve_jobs, JobRx};
use reattach::Reattached;
use stats::WorkerStats;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};
use transmit::drain;

/// Frames taken from one source before moving to the next, so one busy guest cannot
/// starve the others or the underlay.
pub const BATCH: usize = 64;

/// How often the engine's timers run (unsolicited RAs, flow expiry, held frames)
/// while frames flow.
const TICK: Duration = Duration::from_millis(100);

/// How often they run once the worker has seen no frame and no job for that long:
/// an idle daemon's wake-ups are most of its CPU (each one costs 100-300 us of a
/// core in a VM), and nothing those timers do is urgent without traffic.
/// Traffic or a job brings the worker back to [`TICK`] at once.
const IDLE_TICK: Duration = Duration::from_secs(1);

/// How long an adaptive worker keeps polling after its last frame before it sleeps:
/// long enough to catch the frames that follow within a burst without a wake-up,
/// short enough that a worker gives its core back to the guests it shares it with at
/// once. Measured on a 2-core machine running both guests of an iperf3 test: 0, 10
/// and 50 us gave the same throughput, and 50 us cost 0.15-0.2 busy cores more.
const SPIN: Duration = Duration::from_micros(10);

/// While spinning idle, the taps (which need a syscall to be looked at) are looked at
/// one round in this many; the rings are looked at every round.
const TAP_EVERY: u32 = 8;

/// One worker's engine plus, when I/O is on, its taps and underlay queues.
pub struct Datapath {
    pub(crate) engine: Engine,
    /// Each port's tap, by the engine's port id (`None`: no I/O, or no such port).
    pub(crate) taps: Vec<Option<PortTap>>,
    /// Numbers the ports this worker was given, so that a tap re-attached for a
    /// deleted port never goes to a later port in the same slot.
    next_gen: u64,
    pub(crate) io: Option<WorkerIo>,
    pub(crate) stats: WorkerStats,
    /// The output batch, kept for its capacity.
    pub(crate) batch: TxBatch<'static>,
    /// This worker's index (0 without I/O).
    index: usize,
    /// The core its thread is pinned to, if any, and when it was made.
    core: Option<usize>,
    started: SystemTime,
    /// Monotonic origin of the engine's clock.
    epoch: Instant,
    /// Per port, the firewall rule (its id: position from 1 in the port's rule list)
    /// each engine rule was compiled from, so `dump-layer` shows the ids
    /// `rm-fw-rule` takes next to the engine's rules and their hits.
    fw_rule_ids: HashMap<String, HashMap<u64, u64>>,
}

impl Datapath {
    /// A datapath with no I/O: ports exist only in the engine.
    pub fn without_io(engine: Engine) -> Datapath {
        Datapath {
            engine,
            taps: Vec::new(),
            next_gen: 0,
            io: None,
            stats: WorkerStats::default(),
            batch: TxBatch::new(),
            index: 0,
            core: None,
            started: SystemTime::now(),
            epoch: Instant::now(),
            fw_rule_ids: HashMap::new(),
        }
    }

    /// A worker's datapath serving its underlay queues and creating a tap per port.
    pub fn with_io(engine: Engine, io: WorkerIo) -> Datapath {
        Datapath {
            index: io.index,
            io: Some(io),
            ..Datapath::without_io(engine)
        }
    }

    /// Records the core the worker's thread is pinned to, for `xdeadm workers`.
    pub fn on_core(self, core: Option<usize>) -> Datapath {
        Datapath { core, ..self }
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Plans with an underlay of `mtu` from now on (segment sizes, MTU budget,
    /// Packet Too Big); returns this worker's ports whose MTU no longer fits.
    pub(crate) fn set_underlay_mtu(&mut self, mtu: u16) -> Result<Vec<String>, DataplaneError> {
        Ok(self.engine.set_underlay_mtu(mtu)?)
    }

    /// The engine's clock at `at`: nanoseconds since this datapath started.
    pub(crate) fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    fn now(&self) -> u64 {
        self.nanos(Instant::now())
    }
}

/// Runs the worker until `stop` is set: rounds of frames, controller jobs between
/// rounds, the engine's timers every [`TICK`] ([`IDLE_TICK`] once idle). In
/// adaptive mode the worker sleeps once it has found nothing to do for [`SPIN`]; in
/// busy mode it never sleeps.
pub fn run_worker(dp: &mut Datapath, jobs: &JobRx<Datapath>, stop: &AtomicBool) {
    let mut last_tick = Instant::now();
    let mut idle_since: Option<Instant> = None;
    let mut empty_rounds = 0u32;
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        let mut work = serve_jobs(jobs, dp);
        let idle_for = idle_since.map_or(Duration::ZERO, |t| now.duration_since(t));
        let tick_every = if idle_for >= IDLE_TICK {
            IDLE_TICK
        } else {
            TICK
        };
        let sleep = dp.poll_mode() == PollMode::Adaptive && idle_for >= SPIN;
        let timeout = if sleep {
            dp.announce_sleep();
            // A job or a handed-over frame published before the announcement did
            // not ring the doorbell, nor did a frame a vhost-user guest sent while
            // asked not to kick: look once more before sleeping.
            if serve_jobs(jobs, dp) > 0 || dp.handoffs_pending() || dp.arm_guest_kicks() {
                Duration::ZERO
            } else {
                // Until the next tick, or until a paused tap may send again.
                let tick = tick_every.saturating_sub(now.duration_since(last_tick));
                dp.next_resume()
                    .map_or(tick, |t| t.saturating_duration_since(now).min(tick))
            }
        } else {
            Duration::ZERO
        };
        // Taps need a syscall to be looked at: every round while frames flow, one
        // round in TAP_EVERY while spinning idle (the rings are memory).
        let taps = sleep || empty_rounds.is_multiple_of(TAP_EVERY);
        work += dp.poll_once(timeout, now, taps);
        // After a sleep the clock has moved: the tick the sleep waited for is due
        // now, not one wake-up later.
        let now = if sleep { Instant::now() } else { now };
        if sleep {
            dp.woke(timeout);
            // Perhaps woken by the tap re-opener (an idle worker ticks rarely).
            dp.taps_back();
        }
        if now.duration_since(last_tick) >= tick_every {
            last_tick = now;
            dp.tick();
        }
        if work > 0 {
            idle_since = None;
            empty_rounds = 0;
        } else {
            empty_rounds = empty_rounds.wrapping_add(1);
            if idle_since.is_none() {
                idle_since = Some(now);
            }
        }
    }
}

impl Datapath {
    /// One round (see the module documentation); waits up to `timeout` for
    /// something to be ready. Returns how many frames came in.
    pub(crate) fn poll_once(&mut self, timeout: Duration, now: Instant, taps: bool) -> usize {
        let nanos = self.nanos(now);
        let Some(io) = self.io.as_mut() else {
            std::thread::sleep(timeout);
            return 0;
        };
        let st = &mut self.stats;
        st.rounds += 1;
        io.resume_taps(now, &self.taps);
        let taps_now = &self.taps;
        let remade = &mut io.remade;
        let write = |port: engine::PortId, vnet: &engine::VnetHdr, frame: &[u8]| {
            let pt = taps_now.get(port.0 as usize)?.as_ref()?;
            let TapLink::Up(tap) = &pt.link else {
                return None;
            };
            let mtu = pt.info.config.mtu;
            let guest = fit::Guest { tap, port, mtu };
            let r = guest.write(vnet, frame, remade, st);
            if r.as_ref().is_err_and(fit::Unfit::is) {
                st.vhost_tx_unfit += 1;
            }
            Some(r)
        };
        let (written, failed) = io.shaper.release(&mut self.engine, write, (now, nanos));
        st.tap_tx_frames += written;
        st.tap_tx_errors += failed;
        if taps {
            io.readiness(timeout);
        } else {
            io.ready.clear();
        }
        io.ready_vhost(&self.taps);
        let mut got = io.take_inputs(st);

        let engine = &mut self.engine;
        let routes = &io.next_hops;
        let mut space = io.queues.space(&mut io.lent);
        let mut out = std::mem::take(&mut self.batch).lending(&mut space);
        for &token in &io.ready {
            let Some(tap) = up_tap_mut(&mut self.taps, token) else {
                continue;
            };
            let port = engine::PortId(token as u32);
            for _ in 0..BATCH {
                // Over its egress limit: the tap leaves the poll set until the
                // tokens are back (a tap left there with frames would be reported
                // by every wait and keep the worker from sleeping); the guest's
                // frames wait in its queues.
                if let Some(ns) = engine.egress_wait(port, nanos) {
                    unwatch(&io.epoll, tap);
                    io.paused.push((now + Duration::from_nanos(ns), token));
                    break;
                }
                match tap.read(&mut io.buf) {
                    Ok(Some((vnet, len))) => {
                        got += 1;
                        st.tap_rx_frames += 1;
                        let frame = io.buf.get(..len).unwrap_or(&[]);
                        if io.captures.is_empty() {
                            engine.process_guest(port, vnet, frame, nanos, routes, &mut out);
                        } else {
                            let w = Watch::guest(engine, &io.captures, port, frame, &out);
                            Watch::around(w, engine, &mut out, &mut io.captures, st, |e, out| {
                                e.process_guest(port, vnet, frame, nanos, routes, out);
                            });
                        }
                    }
                    Ok(None) => break,
                    Err(e) if GuestFault::of(&e) == GuestFault::Gone => {
                        io.gone.push((token, format!("read: {e}")));
                        break;
                    }
                    Err(e) => {
                        st.tap_rx_errors += 1;
                        tracing::debug!(port = tap.name(), error = %e, "tap read failed");
                        break;
                    }
                }
            }
        }
        let held = &mut io.held;
        for (sock, rx) in held.rx.iter().enumerate() {
            for (frame, chain) in rx.frames().enumerate() {
                let input = held.inputs.len() as u32;
                held.inputs.push(Input::Underlay { sock, frame });
                let f = RxFrame::new(chain.pieces(), input);
                if io.captures.is_empty() {
                    engine.process_underlay(f, nanos, routes, &mut out);
                } else {
                    let w = Watch::underlay(engine, &io.captures, chain.pieces(), &out);
                    Watch::around(w, engine, &mut out, &mut io.captures, st, |e, out| {
                        e.process_underlay(f, nanos, routes, out);
                    });
                }
            }
        }
        for (index, (_, h)) in held.handed.iter().enumerate() {
            let input = held.inputs.len() as u32;
            held.inputs.push(Input::Handoff { index });
            let pieces = [h.bytes()];
            let f = RxFrame::new(&pieces, input);
            match h.kind {
                SiblingFrame::Guest { vni, vnet } => {
                    engine.process_sibling(vni, vnet, f, nanos, &mut out);
                }
                SiblingFrame::Underlay if io.captures.is_empty() => {
                    engine.process_underlay(f, nanos, routes, &mut out);
                }
                SiblingFrame::Underlay => {
                    let w = Watch::underlay(engine, &io.captures, &pieces, &out);
                    Watch::around(w, engine, &mut out, &mut io.captures, st, |e, out| {
                        e.process_underlay(f, nanos, routes, out);
                    });
                }
            }
        }
        // Frames held for a next hop the last snapshot resolved leave now.
        engine.retry_held(nanos, routes, &mut out);
        engine.end_of_batch(&mut out);
        let mut out = out.unlend();
        drain(&out, io, &self.taps, st, &mut self.engine, (now, nanos));
        flush_guests(&self.taps);
        out.clear();
        self.batch = out;
        io.release();
        if got > 0 {
            st.busy_rounds += 1;
        }
        if io.next_hops.sync(now) {
            tracing::debug!("underlay next hop changed; recompiling flows");
            self.engine.invalidate_next_hops();
        }
        self.ports_down();
        got
    }

    fn poll_mode(&self) -> PollMode {
        self.io.as_ref().map_or(PollMode::Adaptive, |io| io.poll)
    }

    /// When the first tap paused for its port's egress limit may send again.
    fn next_resume(&self) -> Option<Instant> {
        self.io.as_ref().and_then(WorkerIo::next_resume)
    }

    /// Tells the other workers and the controller that this one is about to sleep.
    fn announce_sleep(&self) {
        if let Some(io) = &self.io {
            io.doorbell.going_to_sleep();
        }
    }

    /// Asks the vhost-user guests to kick from now on; whether one has frames
    /// waiting already (see [`WorkerIo::arm_vhost_kicks`]).
    fn arm_guest_kicks(&self) -> bool {
        self.io
            .as_ref()
            .is_some_and(|io| io.arm_vhost_kicks(&self.taps))
    }

    /// Back from a sleep of at most `timeout`.
    fn woke(&mut self, timeout: Duration) {
        if let Some(io) = &self.io {
            io.doorbell.woke();
        }
        if !timeout.is_zero() {
            self.stats.idle_sleeps += 1;
        }
    }

    /// Frames other workers handed to this one and it has not taken yet.
    fn handoffs_pending(&mut self) -> bool {
        self.io.as_mut().is_some_and(|io| io.mesh.pending())
    }

    /// Serves `queues` from now on instead of the current underlay sockets (see
    /// [`WorkerIo::replace_queues`]); a job, so it runs between rounds.
    pub(crate) fn replace_underlay(
        &mut self,
        queues: UnderlayQueues,
    ) -> Result<(), DataplaneError> {
        match self.io.as_mut() {
            Some(io) => io.replace_queues(queues),
            None => Err(DataplaneError::NoIo("underlay I/O")),
        }
    }

    /// The engine's timers: unsolicited RAs, flow expiry; their frames go out at
    /// once. Also where re-opened taps are picked up (and after every sleep).
    fn tick(&mut self) {
        let at = Instant::now();
        let now = self.nanos(at);
        let mut out = std::mem::take(&mut self.batch);
        self.engine.tick(now, &mut out);
        if let Some(io) = self.io.as_mut() {
            let (taps, st) = (&self.taps, &mut self.stats);
            drain(&out, io, taps, st, &mut self.engine, (at, now));
            flush_guests(taps);
            io.release();
        }
        out.clear();
        self.batch = out;
        self.count_port_events();
        self.ports_down();
        self.taps_back();
    }

    /// Adds what the attached ports' sockets dropped since the last tick to
    /// `attached_rx_dropped`, and the vhost-user ports' refused front ends to
    /// `vhost_refused`.
    fn count_port_events(&mut self) {
        for port in self.taps.iter().flatten() {
            let TapLink::Up(dev) = &port.link else {
                continue;
            };
            if let GuestPort::Vhost(v) = dev {
                let c = v.take_counts();
                self.stats.vhost_refused += c.refused;
                self.stats.vhost_rx_not_negotiated += c.rx_not_negotiated;
            }
            match dev.take_drops() {
                Some(Ok(n)) => self.stats.attached_rx_dropped += u64::from(n),
                Some(Err(e)) => {
                    tracing::debug!(port = %port.info.config.name, error = %e, "packet socket drops not read");
                }
                None => {}
            }
        }
    }

    /// Serves the taps the re-opener got back since the last look.
    fn taps_back(&mut self) {
        while let Some(r) = self.io.as_ref().and_then(|io| io.reattach.take()) {
            self.tap_back(r);
        }
    }

    /// Takes down the ports whose tap this round found gone.
    fn ports_down(&mut self) {
        let Some(io) = self.io.as_mut() else {
            return;
        };
        for (token, reason) in std::mem::take(&mut io.gone) {
            let slot = usize::try_from(token).ok();
            let Some(port) = slot.and_then(|i| self.taps.get_mut(i)?.as_mut()) else {
                continue;
            };
            // Already down (found gone twice in one round), or a vhost-user port,
            // whose connection thread follows its front end by itself.
            let TapLink::Up(tap) = &port.link else {
                continue;
            };
            if matches!(tap, GuestPort::Vhost(_)) {
                continue;
            }
            io.unwatch_tap(tap);
            self.stats.tap_gone += 1;
            tracing::warn!(
                port = %port.info.config.name, %reason,
                "tap gone: port down until its tap is back"
            );
            // Closes the old fd: a dead fd in the poll set would be reported forever.
            port.link = TapLink::Down {
                since: SystemTime::now(),
                reason,
            };
            io.reattach.want(token as usize, port.gen, &port.info);
        }
    }

    /// Serves a re-opened tap again, if its port is still the one it was opened
    /// for and still down; otherwise the port was deleted meanwhile, and so is
    /// the tap (unless a port of the same name uses it now).
    fn tap_back(&mut self, r: Reattached) {
        let Some(io) = self.io.as_ref() else {
            return;
        };
        let port = self.taps.get_mut(r.slot).and_then(Option::as_mut);
        let Some(port) = port.filter(|p| p.gen == r.gen && matches!(p.link, TapLink::Down { .. }))
        else {
            let name = r.tap.name();
            if !self
                .taps
                .iter()
                .flatten()
                .any(|p| p.info.config.name == name)
            {
                if let Err(e) = r.tap.release() {
                    tracing::warn!(error = %e, "tap of a deleted port not destroyed");
                }
            }
            return;
        };
        match io.watch_tap(&r.tap, r.slot as u64) {
            Ok(()) => {
                self.stats.tap_reattached += 1;
                tracing::info!(port = %port.info.config.name, "tap back: port up");
                port.link = TapLink::Up(r.tap);
            }
            Err(e) => {
                tracing::warn!(port = %port.info.config.name, error = %e, "re-opened tap not watched");
                io.reattach.want(r.slot, port.gen, &port.info);
            }
        }
    }
}
