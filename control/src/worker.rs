//! One worker's poll-mode loop: frames between its taps, its underlay queues and the
//! other workers, through its engine, with no copy the kernel does not force.
//!
//! A round ([`Datapath::poll_once`]):
//! 1. one `epoll_wait` says which taps have frames (zero timeout while there is work;
//!    in adaptive mode, once idle, the worker sleeps in that same call);
//! 2. received underlay frames ([`RxHeld`]) and frames handed over by the other
//!    workers are taken and *held*: their buffers are not given back yet;
//! 3. the engine processes tap frames (into transmit slots the AF_XDP sockets lend it,
//!    [`UmemSpace`]), held underlay frames and handed-over frames (decapsulated and
//!    coalesced frames refer to the held buffers instead of copying them);
//! 4. the batch is drained: lent frames are submitted, tap frames written with one
//!    gathering `writev` each, super-frames (`--underlay-gso`) written to the
//!    underlay's tunnel tap after a kick of what was submitted before them, frames
//!    for other workers handed to them;
//! 5. held buffers go back (AF_XDP fill ring, other workers), and one kick sends
//!    everything submitted.
//!
//! Threading: one worker per configured core, each pinned and each owning a
//! [`Datapath`]; requests from the controller arrive as jobs between rounds, so the
//! fast path takes no lock.
//!
//! Faults: a tap that reports an error or hang-up, or whose read or write fails in
//! a way that means its device is gone ([`GuestFault::Gone`]), takes its port down
//! at the end of the round: its fd leaves the poll set (a dead fd is reported by
//! every wait, which would keep the worker spinning), and the worker's
//! [`crate::datapath::Reattacher`] gets the tap back on a back-off; the worker picks
//! re-opened taps up on its timer tick. Frames for a down port are counted, not
//! written. The underlay sockets can be replaced between rounds
//! ([`WorkerIo::replace_queues`]) when the daemon re-attaches a link.

use crate::capture::{self, Captures, Dir, Point, Watch};
use crate::config::PollMode;
use crate::datapath::{Datapath, PortTap, Reattached, Reattacher, TapLink};
use crate::handoff::{handoff_ring, Doorbell, Handoff, HandoffRx, HandoffTx, PushError};
use crate::neighbours::NextHops;
use crate::shaper::{IngressShaper, Offer};
use crate::underlay::{LentSlots, SendError, SuperError, UnderlayQueues};
use crate::workers::{serve_jobs, JobRx};
use dpio::guest::{GuestFault, GuestPort};
use dpio::poll::Epoll;
use dpio::tap::{MAX_GATHER, MAX_TAP_FRAME};
use dpio::xsk::{RxHeld, TxError};
use engine::{Engine, FrameBytes, InputRef, RxFrame, SiblingFrame, TunnelGso, TxBatch, TxDest};
use serde::Serialize;
use std::io::IoSlice;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

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

/// How many frames may wait in one worker-to-worker channel.
pub const HANDOFF_SLOTS: usize = 256;

/// Waits between attempts at something that failed and may work later (a tap
/// coming back, a next hop resolving, an underlay link re-attaching): short at
/// first, doubling up to a ceiling, so a fault that lasts costs almost nothing and
/// one that clears is noticed soon.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Backoff {
    wait: Duration,
    max: Duration,
}

impl Backoff {
    pub(crate) const fn new(first: Duration, max: Duration) -> Backoff {
        Backoff { wait: first, max }
    }

    /// The wait before the next attempt; the one after is twice as long, at most
    /// the ceiling.
    pub(crate) fn next(&mut self) -> Duration {
        let w = self.wait;
        self.wait = (w * 2).min(self.max);
        w
    }
}

/// epoll tokens that are not taps (taps use their engine port id).
pub(crate) const TOKEN_DOORBELL: u64 = u64::MAX;
const TOKEN_UNDERLAY: u64 = u64::MAX - 1;

/// Worker counters: what happened at the I/O edge that the engine cannot see.
#[derive(Clone, Debug, Default, Serialize)]
pub struct WorkerStats {
    /// Rounds run, and those that moved at least one frame.
    pub rounds: u64,
    pub busy_rounds: u64,
    /// Times an adaptive worker went to sleep for lack of work.
    pub idle_sleeps: u64,
    pub tap_rx_frames: u64,
    /// Tap reads refused for one frame (the tap itself is fine).
    pub tap_rx_errors: u64,
    /// Ports whose tap went away (an error or hang-up from epoll, or a read or
    /// write failing as [`GuestFault::Gone`]): taken down until the tap is back.
    pub tap_gone: u64,
    /// Down ports whose tap was opened again: up and served again.
    pub tap_reattached: u64,
    pub tap_tx_frames: u64,
    /// Frames for a guest whose link is down (EIO from the tap): dropped.
    pub tap_tx_link_down: u64,
    /// Frames the kernel refused to write to a tap (one frame, the tap is fine).
    pub tap_tx_errors: u64,
    /// Frames for a port whose tap is gone (the port is down): dropped.
    pub tap_tx_port_down: u64,
    /// Frames for a port that does not exist (deleted meanwhile): dropped.
    pub tap_tx_no_port: u64,
    /// Frames of more pieces than one `writev` takes, copied into one buffer first.
    pub tap_tx_linearized: u64,
    /// Frames from the VM of an attached port (`--attach`) that the kernel dropped
    /// because the port's packet socket was full (the worker read too slowly);
    /// read every tick. A tap's queue counts the same loss on the device instead
    /// (`stats`' `tap_queues`).
    pub attached_rx_dropped: u64,
    pub underlay_rx_frames: u64,
    pub underlay_tx_frames: u64,
    /// Underlay frames built outside the sockets' lent slots (none was free) and
    /// copied into one to be sent.
    pub underlay_tx_copied: u64,
    /// No transmit slot or ring space, even after a kick: dropped.
    pub underlay_tx_full: u64,
    /// Frame longer than a transmit slot, or not a frame the socket lent: dropped.
    pub underlay_tx_invalid: u64,
    /// The engine named an interface that is not an underlay link: dropped.
    pub underlay_tx_no_link: u64,
    /// UDP-tunnel GSO super-frames written to the underlay's tunnel taps
    /// (`--underlay-gso`), each cut into wire frames by the kernel.
    pub underlay_gso_tx_frames: u64,
    /// Super-frames a tunnel tap refused (EAGAIN, ENOBUFS, ...): dropped.
    pub underlay_gso_tx_errors: u64,
    /// Frames handed to other workers (for their ports), and taken from them.
    pub handoff_out: u64,
    pub handoff_in: u64,
    /// The channel to the owning worker was full: dropped.
    pub handoff_full: u64,
    /// A frame longer than any frame may be: dropped.
    pub handoff_too_long: u64,
    /// The engine named a worker that does not exist: dropped.
    pub handoff_no_worker: u64,
    /// Frames a capture (`xdeadm capture`) had no room for: not captured.
    pub capture_dropped: u64,
}

engine::summed_across_workers!(WorkerStats {
    rounds,
    busy_rounds,
    idle_sleeps,
    tap_rx_frames,
    tap_rx_errors,
    tap_gone,
    tap_reattached,
    tap_tx_frames,
    tap_tx_link_down,
    tap_tx_errors,
    tap_tx_port_down,
    tap_tx_no_port,
    tap_tx_linearized,
    attached_rx_dropped,
    underlay_rx_frames,
    underlay_tx_frames,
    underlay_tx_copied,
    underlay_tx_full,
    underlay_tx_invalid,
    underlay_tx_no_link,
    underlay_gso_tx_frames,
    underlay_gso_tx_errors,
    handoff_out,
    handoff_in,
    handoff_full,
    handoff_too_long,
    handoff_no_worker,
    capture_dropped,
});

/// The channels between one worker and each of the others.
pub struct Mesh {
    /// Indexed by worker; `None` for this worker itself.
    to: Vec<Option<HandoffTx>>,
    /// The other workers' doorbells, by worker (`None` for this one).
    wake: Vec<Option<Arc<Doorbell>>>,
    /// Which of `to` got frames since they were last woken.
    pushed: Vec<bool>,
    from: Vec<HandoffRx>,
}

impl Mesh {
    /// Hands a `len`-byte frame that `fill` writes to worker `w`, counting the
    /// outcome.
    fn push(
        &mut self,
        w: usize,
        kind: SiblingFrame,
        len: usize,
        fill: impl FnOnce(&mut [u8]),
        st: &mut WorkerStats,
    ) {
        let Some(Some(tx)) = self.to.get_mut(w) else {
            st.handoff_no_worker += 1;
            return;
        };
        match tx.push(kind, len, fill) {
            Ok(()) => {
                st.handoff_out += 1;
                if let Some(p) = self.pushed.get_mut(w) {
                    *p = true;
                }
            }
            Err(PushError::Full) => st.handoff_full += 1,
            Err(PushError::TooLong { .. }) => st.handoff_too_long += 1,
        }
    }

    /// Wakes the workers that were handed frames (if they sleep).
    fn wake(&mut self) {
        for (w, p) in self.pushed.iter_mut().enumerate() {
            if std::mem::take(p) {
                if let Some(Some(d)) = self.wake.get(w) {
                    d.ring();
                }
            }
        }
    }

    fn pending(&mut self) -> bool {
        self.from.iter_mut().any(|r| !r.is_empty())
    }
}

/// The channels between `doorbells.len()` workers, for frames of at most `max_len`
/// bytes (buffers first sized `initial_len`): one [`Mesh`] per worker, in worker
/// order.
pub fn mesh(doorbells: &[Arc<Doorbell>], initial_len: usize, max_len: usize) -> Vec<Mesh> {
    let n = doorbells.len();
    let mut meshes: Vec<Mesh> = (0..n)
        .map(|_| Mesh {
            to: (0..n).map(|_| None).collect(),
            wake: vec![None; n],
            pushed: vec![false; n],
            from: Vec::new(),
        })
        .collect();
    for src in 0..n {
        for dst in (0..n).filter(|&d| d != src) {
            let (tx, rx) = handoff_ring(HANDOFF_SLOTS, initial_len, max_len);
            meshes[src].to[dst] = Some(tx);
            meshes[src].wake[dst] = Some(doorbells[dst].clone());
            meshes[dst].from.push(rx);
        }
    }
    meshes
}

/// Where the bytes of one input of a round are, so that the references the engine
/// emitted can be resolved when the batch is drained.
#[derive(Clone, Copy, Debug)]
enum Input {
    /// Frame `frame` held from socket `sock`.
    Underlay { sock: usize, frame: usize },
    /// Handed-over frame number `index` of the round.
    Handoff { index: usize },
}

/// The inputs of one round, held until its batch is drained.
#[derive(Default)]
struct Held {
    /// Per socket: the frames received this round.
    rx: Vec<RxHeld>,
    /// Frames other workers handed over this round, with the channel each came on.
    handed: Vec<(usize, Handoff)>,
    /// Input number -> where its bytes are.
    inputs: Vec<Input>,
}

impl Held {
    /// Calls `f` with each piece of memory holding the bytes `r` refers to, in
    /// order; false when `r` does not lie within its input.
    fn resolve<'a>(&'a self, r: &InputRef, f: &mut impl FnMut(&'a [u8])) -> bool {
        let visit = |pieces: &[&'a [u8]], f: &mut dyn FnMut(&'a [u8])| -> bool {
            let mut skip = r.start as usize;
            let mut left = r.len as usize;
            for p in pieces {
                if left == 0 {
                    break;
                }
                if skip >= p.len() {
                    skip -= p.len();
                    continue;
                }
                let take = (p.len() - skip).min(left);
                f(&p[skip..skip + take]);
                left -= take;
                skip = 0;
            }
            left == 0
        };
        match self.inputs.get(r.input as usize) {
            Some(Input::Underlay { sock, frame }) => self
                .rx
                .get(*sock)
                .and_then(|h| h.frame(*frame))
                .is_some_and(|chain| visit(chain.pieces(), f)),
            Some(Input::Handoff { index }) => self
                .handed
                .get(*index)
                .is_some_and(|(_, h)| visit(&[h.bytes()], f)),
            None => false,
        }
    }

    /// Calls `f` with each piece of memory that makes up `frame`, in order; false
    /// when a reference does not resolve or the frame is in lent space.
    fn for_each_part<'a>(&'a self, frame: FrameBytes<'a>, mut f: impl FnMut(&'a [u8])) -> bool {
        match frame {
            FrameBytes::Own(b) => {
                f(b);
                true
            }
            FrameBytes::Lent { .. } => false,
            FrameBytes::Gather { head, refs } => {
                if !head.is_empty() {
                    f(head);
                }
                refs.iter().all(|r| self.resolve(r, &mut f))
            }
        }
    }
}

/// What a worker needs for I/O besides its taps, and the buffers one round reuses.
pub struct WorkerIo {
    /// This worker's index.
    pub index: usize,
    pub queues: UnderlayQueues,
    pub next_hops: NextHops,
    pub mesh: Mesh,
    pub doorbell: Arc<Doorbell>,
    pub poll: PollMode,
    /// Re-opens the taps of ports that went down.
    pub(crate) reattach: Reattacher,
    pub(crate) epoll: Epoll,
    held: Held,
    lent: LentSlots,
    /// Taps epoll reported readable this round.
    ready: Vec<u64>,
    /// Taps found gone this round (by epoll, a read or a write), with why: their
    /// ports go down at the end of the round.
    gone: Vec<(u64, String)>,
    /// Taps of ports over their egress limit (token, when they may send again):
    /// out of the poll set until then, so their frames wait in the guest.
    paused: Vec<(Instant, u64)>,
    /// Frames for ports over their ingress limit, held until their tokens are back.
    shaper: IngressShaper,
    /// The tap read buffer.
    buf: Vec<u8>,
    /// For frames of more pieces than one `writev` takes.
    linear: Vec<u8>,
    /// The captures of this worker's ports (`xdeadm capture`).
    pub(crate) captures: Captures,
}

impl WorkerIo {
    pub fn new(
        index: usize,
        queues: UnderlayQueues,
        next_hops: NextHops,
        mesh: Mesh,
        doorbell: Arc<Doorbell>,
        poll: PollMode,
    ) -> Result<WorkerIo, String> {
        let err = |e: std::io::Error| format!("worker {index}: {e}");
        let epoll = Epoll::new().map_err(err)?;
        // Both only wake a sleeping worker: the doorbell is cleared when it wakes,
        // and the sockets' rings are read every round without a syscall.
        epoll.add_edge(doorbell.fd(), TOKEN_DOORBELL).map_err(err)?;
        for fd in queues.fds() {
            epoll.add_edge(fd, TOKEN_UNDERLAY).map_err(err)?;
        }
        let held = Held {
            rx: queues.sockets.iter().map(|_| RxHeld::new()).collect(),
            ..Held::default()
        };
        let bell = doorbell.clone();
        let reattach = Reattacher::start(index, move || bell.ring())?;
        Ok(WorkerIo {
            index,
            queues,
            next_hops,
            mesh,
            doorbell,
            poll,
            reattach,
            epoll,
            held,
            lent: LentSlots::default(),
            ready: Vec::new(),
            gone: Vec::new(),
            paused: Vec::new(),
            shaper: IngressShaper::default(),
            buf: vec![0u8; MAX_TAP_FRAME],
            linear: Vec::new(),
            captures: Captures::default(),
        })
    }

    /// Starts watching a port's tap (token: the engine's port id); a vhost-user
    /// port's ring is looked at every round instead.
    pub fn watch_tap(&self, tap: &GuestPort, token: u64) -> Result<(), String> {
        let Some(fd) = tap.poll_fd() else {
            return Ok(());
        };
        self.epoll
            .add(fd, token)
            .map_err(|e| format!("tap {:?}: {e}", tap.name()))
    }

    /// Puts the paused taps that may send again back in the poll set (a tap with
    /// frames is reported by the next wait). A port deleted or gone down
    /// meanwhile is skipped; a new port in its slot is already watched.
    fn resume_taps(&mut self, now: Instant, taps: &[Option<PortTap>]) {
        if self.paused.is_empty() {
            return;
        }
        let epoll = &self.epoll;
        self.paused.retain(|&(until, token)| {
            if until > now {
                return true;
            }
            let port = usize::try_from(token).ok().and_then(|i| taps.get(i)?.as_ref());
            if let Some(TapLink::Up(tap)) = port.map(|p| &p.link) {
                let Some(fd) = tap.poll_fd() else {
                    return false;
                };
                if let Err(e) = epoll.add(fd, token) {
                    if e.raw_os_error() != Some(libc::EEXIST) {
                        tracing::warn!(tap = tap.name(), error = %e, "paused tap not watched again");
                    }
                }
            }
            false
        });
    }

    /// When the first paused tap may send again, or the first held frame may be
    /// delivered.
    fn next_resume(&self) -> Option<Instant> {
        let paused = self.paused.iter().map(|p| p.0).min();
        match (paused, self.shaper.next_due()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Stops watching a tap (before it is closed).
    pub fn unwatch_tap(&self, tap: &GuestPort) {
        unwatch(&self.epoll, tap);
    }

    /// Serves `queues` from now on; the current sockets are closed. Called between
    /// rounds, when no frame of theirs is held and no slot of theirs lent, so
    /// nothing refers to them any more: a worker never uses a closed socket.
    pub(crate) fn replace_queues(&mut self, queues: UnderlayQueues) -> Result<(), String> {
        for fd in self.queues.fds() {
            if let Err(e) = self.epoll.remove(fd) {
                tracing::debug!(error = %e, "underlay socket not in the poll set");
            }
        }
        self.queues = queues;
        self.held.rx = self.queues.sockets.iter().map(|_| RxHeld::new()).collect();
        let err = |e: std::io::Error| format!("worker {}: {e}", self.index);
        for fd in self.queues.fds() {
            self.epoll.add_edge(fd, TOKEN_UNDERLAY).map_err(err)?;
        }
        Ok(())
    }

    /// Adds the vhost-user ports to this round's ready ports (their transmit
    /// rings are memory, looked at every round), but not those paused for their
    /// egress limit.
    fn ready_vhost(&mut self, taps: &[Option<PortTap>]) {
        for (token, p) in taps.iter().enumerate() {
            let Some(PortTap {
                link: TapLink::Up(GuestPort::Vhost(_)),
                ..
            }) = p
            else {
                continue;
            };
            let token = token as u64;
            if !self.paused.iter().any(|&(_, t)| t == token) {
                self.ready.push(token);
            }
        }
    }

    /// Waits up to `timeout` for readiness and sorts what is ready into `ready`
    /// (taps with frames) and `gone` (taps whose device went away).
    fn readiness(&mut self, timeout: Duration) {
        self.ready.clear();
        match self.epoll.wait(timeout) {
            Ok(events) => {
                for r in events {
                    if r.token == TOKEN_DOORBELL || r.token == TOKEN_UNDERLAY {
                        continue;
                    }
                    if r.gone {
                        let why = "epoll reported an error or hang-up (the device was deleted)";
                        self.gone.push((r.token, why.to_string()));
                    } else if r.input {
                        self.ready.push(r.token);
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "epoll_wait failed"),
        }
    }

    /// Takes this round's underlay frames and handed-over frames, held until
    /// [`WorkerIo::release`]. Returns how many.
    fn take_inputs(&mut self, st: &mut WorkerStats) -> usize {
        let mut n = 0;
        for (sock, held) in self.queues.sockets.iter_mut().zip(self.held.rx.iter_mut()) {
            n += sock.recv_held(held, BATCH);
        }
        st.underlay_rx_frames += n as u64;
        let before = self.held.handed.len();
        for (ring, rx) in self.mesh.from.iter_mut().enumerate() {
            for _ in 0..BATCH {
                let Some(h) = rx.pop() else { break };
                self.held.handed.push((ring, h));
            }
        }
        let handed = self.held.handed.len() - before;
        st.handoff_in += handed as u64;
        n + handed
    }

    /// Gives every held input back (nothing refers to them once the batch is
    /// drained), settles the transmit slots and sends what was submitted.
    fn release(&mut self) {
        for (sock, held) in self.queues.sockets.iter_mut().zip(self.held.rx.iter_mut()) {
            sock.release(held);
        }
        for (ring, h) in self.held.handed.drain(..) {
            if let Some(rx) = self.mesh.from.get_mut(ring) {
                rx.give_back(h);
            }
        }
        self.held.inputs.clear();
        self.queues.give_back_all(&mut self.lent);
        self.lent.reset();
        self.queues.kick();
        self.mesh.wake();
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
            // not ring the doorbell: look once more before sleeping.
            if serve_jobs(jobs, dp) > 0 || dp.handoffs_pending() {
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
        let taps = sleep || empty_rounds % TAP_EVERY == 0;
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
        let (written, failed) =
            io.shaper
                .release(&mut self.engine, |p| up_tap(taps_now, p), (now, nanos));
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
                                e.process_guest(port, vnet, frame, nanos, routes, out)
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
                        e.process_underlay(f, nanos, routes, out)
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
                    engine.process_sibling(vni, vnet, f, nanos, &mut out)
                }
                SiblingFrame::Underlay if io.captures.is_empty() => {
                    engine.process_underlay(f, nanos, routes, &mut out)
                }
                SiblingFrame::Underlay => {
                    let w = Watch::underlay(engine, &io.captures, &pieces, &out);
                    Watch::around(w, engine, &mut out, &mut io.captures, st, |e, out| {
                        e.process_underlay(f, nanos, routes, out)
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
    pub(crate) fn replace_underlay(&mut self, queues: UnderlayQueues) -> Result<(), String> {
        match self.io.as_mut() {
            Some(io) => io.replace_queues(queues),
            None => Err("this datapath has no underlay I/O".into()),
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
        self.count_attached_drops();
        self.ports_down();
        self.taps_back();
    }

    /// Adds what the attached ports' sockets dropped since the last tick to
    /// `attached_rx_dropped`.
    fn count_attached_drops(&mut self) {
        for port in self.taps.iter().flatten() {
            let TapLink::Up(dev) = &port.link else {
                continue;
            };
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

/// Takes `tap` out of `epoll` (a vhost-user port was never in it).
fn unwatch(epoll: &Epoll, tap: &GuestPort) {
    let Some(fd) = tap.poll_fd() else {
        return;
    };
    if let Err(e) = epoll.remove(fd) {
        tracing::debug!(tap = tap.name(), error = %e, "tap not in the poll set");
    }
}

/// After a round: interrupts the VMs whose rings returned buffers.
fn flush_guests(taps: &[Option<PortTap>]) {
    for p in taps.iter().flatten() {
        if let TapLink::Up(g) = &p.link {
            g.flush();
        }
    }
}

/// The tap of port `token` if it is up.
fn up_tap(taps: &[Option<PortTap>], port: engine::PortId) -> Option<&GuestPort> {
    match &taps.get(port.0 as usize)?.as_ref()?.link {
        TapLink::Up(tap) => Some(tap),
        TapLink::Down { .. } => None,
    }
}

fn up_tap_mut(taps: &mut [Option<PortTap>], token: u64) -> Option<&mut GuestPort> {
    let port = taps.get_mut(usize::try_from(token).ok()?)?.as_mut()?;
    match &mut port.link {
        TapLink::Up(tap) => Some(tap),
        TapLink::Down { .. } => None,
    }
}

/// Sends every frame of the batch where the engine said.
/// Frames for a port over its ingress limit are held (`shaper.rs`) rather than
/// written; `clock` is now as an instant and as the engine's nanoseconds.
fn drain(
    out: &TxBatch,
    io: &mut WorkerIo,
    taps: &[Option<PortTap>],
    st: &mut WorkerStats,
    engine: &mut Engine,
    clock: (Instant, u64),
) {
    for (index, (dest, frame)) in out.iter().enumerate() {
        match dest {
            TxDest::Underlay { ifindex } => {
                if !io.captures.is_empty() {
                    capture_underlay_out(io, index, frame, st);
                }
                to_underlay(io, ifindex, frame, st)
            }
            TxDest::UnderlayGso { ifindex, gso } => {
                if !io.captures.is_empty() {
                    capture_underlay_out(io, index, frame, st);
                }
                to_tunnel(io, ifindex, &gso, frame, st)
            }
            TxDest::Port { port, vnet } => {
                let tap = match taps.get(port.0 as usize).and_then(Option::as_ref) {
                    Some(PortTap {
                        link: TapLink::Up(tap),
                        ..
                    }) => tap,
                    Some(_) => {
                        st.tap_tx_port_down += 1;
                        continue;
                    }
                    None => {
                        st.tap_tx_no_port += 1;
                        continue;
                    }
                };
                let held = &io.held;
                let fill = |v: &mut Vec<u8>| {
                    held.for_each_part(frame, |p| v.extend_from_slice(p));
                };
                let offer = io
                    .shaper
                    .offer(engine, port, vnet, frame.len(), fill, clock);
                let dropped = match offer {
                    // Captured as offered: written later, or dropped (counted).
                    Offer::Held => None,
                    Offer::Full => Some("rate_limited"),
                    Offer::Now => {
                        match to_tap(tap, &vnet.to_bytes(), frame, &io.held, &mut io.linear) {
                            Ok(linearized) => {
                                st.tap_tx_frames += 1;
                                st.tap_tx_linearized += u64::from(linearized);
                                None
                            }
                            Err(e) => match GuestFault::of(&e) {
                                GuestFault::LinkDown => {
                                    st.tap_tx_link_down += 1;
                                    Some("tap_tx_link_down")
                                }
                                GuestFault::Gone => {
                                    st.tap_tx_port_down += 1;
                                    io.gone.push((u64::from(port.0), format!("write: {e}")));
                                    Some("tap_tx_port_down")
                                }
                                GuestFault::Frame => {
                                    st.tap_tx_errors += 1;
                                    tracing::debug!(tap = tap.name(), error = %e, "tap write failed");
                                    Some("tap_tx_errors")
                                }
                            },
                        }
                    }
                };
                if !io.captures.is_empty() {
                    let held = &io.held;
                    let fill = |v: &mut Vec<u8>| {
                        held.for_each_part(frame, |p| capture::append(v, p));
                    };
                    let at = Point {
                        port,
                        dir: Dir::In,
                        underlay: false,
                    };
                    io.captures.offer(at, frame.len(), fill, dropped, st);
                }
            }
            TxDest::Sibling {
                worker,
                frame: kind,
            } => {
                let held = &io.held;
                let mut whole = true;
                io.mesh.push(
                    usize::from(worker),
                    kind,
                    frame.len(),
                    |buf| {
                        let mut at = 0;
                        whole = held.for_each_part(frame, |p| {
                            if let Some(dst) = buf.get_mut(at..at + p.len()) {
                                dst.copy_from_slice(p);
                            }
                            at += p.len();
                        });
                    },
                    st,
                );
                if !whole {
                    tracing::warn!(worker, "a frame for another worker did not resolve");
                }
            }
        }
    }
    io.captures.end_of_batch();
}

/// Copies frame number `index` of the batch, on its way to the underlay, to the
/// captures of the port whose guest frame it was made of, if any (see
/// [`crate::capture::Watch::done`]); a lent frame is read from its transmit slot.
fn capture_underlay_out(
    io: &mut WorkerIo,
    index: usize,
    frame: FrameBytes<'_>,
    st: &mut WorkerStats,
) {
    let Some(port) = io.captures.made_by(index) else {
        return;
    };
    let bytes = match frame {
        FrameBytes::Own(b) => Some(b),
        FrameBytes::Lent { frame, len } => io.queues.lent_bytes(&io.lent, frame, len),
        FrameBytes::Gather { .. } => None,
    };
    if let Some(b) = bytes {
        let at = Point {
            port,
            dir: Dir::Out,
            underlay: true,
        };
        io.captures
            .offer(at, b.len(), |v| capture::append(v, b), None, st);
    }
}

/// One frame to the underlay: a lent one is submitted, one the engine built in
/// the batch's arena is copied into a transmit slot.
fn to_underlay(io: &mut WorkerIo, ifindex: u32, frame: FrameBytes<'_>, st: &mut WorkerStats) {
    let r = match frame {
        FrameBytes::Lent { frame, len } => io.queues.submit(&mut io.lent, frame, len),
        FrameBytes::Own(bytes) => {
            st.underlay_tx_copied += 1;
            io.queues.send(ifindex, bytes)
        }
        // The engine gathers only toward guests and other workers.
        FrameBytes::Gather { .. } => Err(SendError::NotLent),
    };
    match r {
        Ok(()) => st.underlay_tx_frames += 1,
        Err(SendError::NoSuchLink) => st.underlay_tx_no_link += 1,
        Err(SendError::Tx(TxError::Full)) => st.underlay_tx_full += 1,
        Err(SendError::Tx(_) | SendError::NotLent) => st.underlay_tx_invalid += 1,
    }
}

/// One super-frame to the underlay link's tunnel tap (`--underlay-gso`), behind
/// its tunnel vnet header. A refused write is a counted drop, never a wait: TCP
/// sends the data again.
fn to_tunnel(
    io: &mut WorkerIo,
    ifindex: u32,
    gso: &TunnelGso,
    frame: FrameBytes<'_>,
    st: &mut WorkerStats,
) {
    // The engine builds super-frames in the batch's arena.
    let FrameBytes::Own(bytes) = frame else {
        st.underlay_tx_invalid += 1;
        return;
    };
    match io
        .queues
        .send_super(ifindex, &gso.header().to_bytes(), bytes)
    {
        Ok(()) => st.underlay_gso_tx_frames += 1,
        Err(SuperError::NoSuchLink) => st.underlay_tx_no_link += 1,
        Err(SuperError::Write(e)) => {
            st.underlay_gso_tx_errors += 1;
            tracing::debug!(ifindex, error = %e, "tunnel tap write failed");
        }
    }
}

/// Parts one gathered tap write starts with room for; a frame of more pieces (a
/// coalesced frame of many segments) takes the [`MAX_GATHER`] path.
const FEW_PARTS: usize = 16;

/// One frame to a tap, its vnet header first: one gathering `writev` of its
/// pieces, or of one copy of them when there are more than a `writev` takes.
/// Returns whether the frame was copied.
fn to_tap(
    tap: &GuestPort,
    hdr: &[u8],
    frame: FrameBytes<'_>,
    held: &Held,
    linear: &mut Vec<u8>,
) -> std::io::Result<bool> {
    if let Some(r) = write_gathered::<FEW_PARTS>(tap, hdr, frame, held) {
        return r.map(|()| false);
    }
    if let Some(r) = write_gathered::<MAX_GATHER>(tap, hdr, frame, held) {
        return r.map(|()| false);
    }
    linear.clear();
    if !held.for_each_part(frame, |p| linear.extend_from_slice(p)) {
        return Err(unresolved());
    }
    tap.write_gather(&[IoSlice::new(hdr), IoSlice::new(linear)])
        .map(|()| true)
}

/// [`GuestPort::write_gather`] of the header and the frame's pieces, or `None` when
/// they are more than `N` (so the array stays small for the common frame).
fn write_gathered<const N: usize>(
    tap: &GuestPort,
    hdr: &[u8],
    frame: FrameBytes<'_>,
    held: &Held,
) -> Option<std::io::Result<()>> {
    let mut iov = [IoSlice::new(&[]); N];
    iov[0] = IoSlice::new(hdr);
    let mut n = 1;
    let whole = held.for_each_part(frame, |p| {
        if let Some(slot) = iov.get_mut(n) {
            *slot = IoSlice::new(p);
        }
        n += 1;
    });
    if !whole {
        return Some(Err(unresolved()));
    }
    (n <= N).then(|| tap.write_gather(&iov[..n]))
}

fn unresolved() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        "a frame refers to bytes outside its input",
    )
}
