//! What a worker needs for I/O besides its guests: its epoll set, its underlay
//! queues and next hops, the channels to the other workers, and the inputs of one
//! round held until its batch is drained.

use super::capture::Captures;
use super::guests::{PortTap, TapLink};
use super::handoff::{Handoff, Mesh};
use super::reattach::{Reattacher, ReattacherError};
use super::shaper::IngressShaper;
use super::stats::{UnderlayTx, WorkerStats};
use super::BATCH;
use crate::config::PollMode;
use crate::controller::DataplaneError;
use crate::underlay::neighbours::NextHops;
use crate::underlay::queues::{LentSlots, UnderlayQueues};
use crate::util::Doorbell;
use dpio::guest::GuestPort;
use dpio::poll::Epoll;
use dpio::tap::MAX_TAP_FRAME;
use dpio::xsk::RxHeld;
use engine::{FrameBytes, InputRef};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Why a worker's I/O could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum WorkerIoError {
    /// The worker's epoll set could not be made, or refused its doorbell or an
    /// underlay socket.
    #[error("worker {worker}: {error}")]
    Poll {
        worker: usize,
        error: std::io::Error,
    },
    #[error(transparent)]
    Reattacher(#[from] ReattacherError),
}

/// epoll tokens that are not taps (taps use their engine port id).
pub(crate) const TOKEN_DOORBELL: u64 = u64::MAX;

const TOKEN_UNDERLAY: u64 = u64::MAX - 1;

/// Where the bytes of one input of a round are, so that the references the engine
/// emitted can be resolved when the batch is drained.
#[derive(Clone, Copy, Debug)]
pub(super) enum Input {
    /// Frame `frame` held from socket `sock`.
    Underlay { sock: usize, frame: usize },
    /// Handed-over frame number `index` of the round.
    Handoff { index: usize },
}

/// The inputs of one round, held until its batch is drained.
#[derive(Default)]
pub(super) struct Held {
    /// Per socket: the frames received this round.
    pub(super) rx: Vec<RxHeld>,
    /// Frames other workers handed over this round, with the channel each came on.
    pub(super) handed: Vec<(usize, Handoff)>,
    /// Input number -> where its bytes are.
    pub(super) inputs: Vec<Input>,
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
    pub(super) fn for_each_part<'a>(
        &'a self,
        frame: FrameBytes<'a>,
        mut f: impl FnMut(&'a [u8]),
    ) -> bool {
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
    pub(super) held: Held,
    pub(super) lent: LentSlots,
    /// Taps epoll reported readable this round.
    pub(super) ready: Vec<u64>,
    /// Taps found gone this round (by epoll, a read or a write), with why: their
    /// ports go down at the end of the round.
    pub(super) gone: Vec<(u64, String)>,
    /// Taps of ports over their egress limit (token, when they may send again):
    /// out of the poll set until then, so their frames wait in the guest.
    pub(super) paused: Vec<(Instant, u64)>,
    /// Frames for ports over their ingress limit, held until their tokens are back.
    pub(super) shaper: IngressShaper,
    /// The tap read buffer.
    pub(super) buf: Vec<u8>,
    /// For frames of more pieces than one `writev` takes.
    pub(super) linear: Vec<u8>,
    /// Frames made for a guest that does not take the offloads of the frame
    /// they were made of (`fit.rs`).
    pub(super) remade: engine::TxBatch<'static>,
    /// Frames sent per underlay link.
    pub(super) underlay_tx: UnderlayTx,
    /// The captures of this worker's ports (`xdeadm capture`).
    pub(crate) captures: Captures,
}

/// The vhost-user ports whose transmit rings are looked at every round (they
/// are memory), with their tokens: all but those `paused` for their egress
/// limit.
fn polled_vhost<'a>(
    paused: &'a [(Instant, u64)],
    taps: &'a [Option<PortTap>],
) -> impl Iterator<Item = (u64, &'a dpio::vhost::VhostPort)> + 'a {
    taps.iter().enumerate().filter_map(move |(token, p)| {
        let Some(PortTap {
            link: TapLink::Up(GuestPort::Vhost(v)),
            ..
        }) = p
        else {
            return None;
        };
        let token = token as u64;
        let paused = paused.iter().any(|&(_, t)| t == token);
        (!paused).then_some((token, v))
    })
}

impl WorkerIo {
    pub fn new(
        index: usize,
        queues: UnderlayQueues,
        next_hops: NextHops,
        mesh: Mesh,
        doorbell: Arc<Doorbell>,
        poll: PollMode,
    ) -> Result<WorkerIo, WorkerIoError> {
        let err = |error| WorkerIoError::Poll {
            worker: index,
            error,
        };
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
            remade: engine::TxBatch::new(),
            underlay_tx: UnderlayTx::default(),
            captures: Captures::default(),
        })
    }

    /// Starts watching a port's tap (token: the engine's port id); a vhost-user
    /// port's ring is looked at every round instead.
    pub fn watch_tap(&self, tap: &GuestPort, token: u64) -> Result<(), DataplaneError> {
        let Some(fd) = tap.poll_fd() else {
            return Ok(());
        };
        self.epoll
            .add(fd, token)
            .map_err(|error| DataplaneError::Guest {
                device: "tap",
                port: tap.name().to_string(),
                error,
            })
    }

    /// Puts the paused taps that may send again back in the poll set (a tap with
    /// frames is reported by the next wait). A port deleted or gone down
    /// meanwhile is skipped; a new port in its slot is already watched.
    pub(super) fn resume_taps(&mut self, now: Instant, taps: &[Option<PortTap>]) {
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
    pub(super) fn next_resume(&self) -> Option<Instant> {
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
    pub(crate) fn replace_queues(&mut self, queues: UnderlayQueues) -> Result<(), DataplaneError> {
        for fd in self.queues.fds() {
            if let Err(e) = self.epoll.remove(fd) {
                tracing::debug!(error = %e, "underlay socket not in the poll set");
            }
        }
        self.queues = queues;
        self.held.rx = self.queues.sockets.iter().map(|_| RxHeld::new()).collect();
        let err = |error| DataplaneError::Poll {
            worker: self.index,
            error,
        };
        for fd in self.queues.fds() {
            self.epoll.add_edge(fd, TOKEN_UNDERLAY).map_err(err)?;
        }
        Ok(())
    }

    /// Adds the polled vhost-user ports ([`polled_vhost`]) to this round's ready
    /// ports.
    pub(super) fn ready_vhost(&mut self, taps: &[Option<PortTap>]) {
        self.ready
            .extend(polled_vhost(&self.paused, taps).map(|(token, _)| token));
    }

    /// Before the worker sleeps: asks every polled vhost-user guest to kick
    /// when it sends (they were asked not to while the worker polled). Returns
    /// whether one already has frames waiting: then the worker must not sleep.
    pub(super) fn arm_vhost_kicks(&self, taps: &[Option<PortTap>]) -> bool {
        // Every port is armed, not only those before the first with frames.
        polled_vhost(&self.paused, taps).fold(false, |pending, (_, v)| v.arm_kicks() | pending)
    }

    /// Waits up to `timeout` for readiness and sorts what is ready into `ready`
    /// (taps with frames) and `gone` (taps whose device went away).
    pub(super) fn readiness(&mut self, timeout: Duration) {
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
    pub(super) fn take_inputs(&mut self, st: &mut WorkerStats) -> usize {
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
    pub(super) fn release(&mut self) {
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

/// Takes `tap` out of `epoll` (a vhost-user port was never in it).
pub(super) fn unwatch(epoll: &Epoll, tap: &GuestPort) {
    let Some(fd) = tap.poll_fd() else {
        return;
    };
    if let Err(e) = epoll.remove(fd) {
        tracing::debug!(tap = tap.name(), error = %e, "tap not in the poll set");
    }
}

/// After a round: interrupts the VMs whose rings returned buffers.
pub(super) fn flush_guests(taps: &[Option<PortTap>]) {
    for p in taps.iter().flatten() {
        if let TapLink::Up(g) = &p.link {
            g.flush();
        }
    }
}

pub(super) fn up_tap_mut(taps: &mut [Option<PortTap>], token: u64) -> Option<&mut GuestPort> {
    let port = taps.get_mut(usize::try_from(token).ok()?)?.as_mut()?;
    match &mut port.link {
        TapLink::Up(tap) => Some(tap),
        TapLink::Down { .. } => None,
    }
}
