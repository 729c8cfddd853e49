//! `xdeadm capture`: copies of the frames passing a port, written by the daemon as
//! pcapng ([`crate::pcapng`]).
//!
//! Capture points are in the worker that owns the port ([`crate::worker`]): a frame
//! read from the port's tap (direction "out", from the guest) and a frame written
//! to it (direction "in", to the guest). Each worker keeps its running captures in
//! a [`Captures`]; when it is empty (no capture on this worker) a frame costs one
//! predictable branch at each capture point and nothing else. When a port is captured, its frames are
//! copied (up to [`SNAPLEN`] bytes) into a bounded channel ([`QUEUE`] frames,
//! `try_send`): a worker never waits for the file, and a frame that does not fit
//! is counted (`capture_dropped` in the worker's stats, and `dropped` in the
//! reply) instead.
//!
//! Drop reasons: while a port is captured, the worker keeps a copy of the port's
//! drop counters from before each guest frame; if a counter grew and the frame
//! sent nothing anywhere but back to the guest (a gateway reply, such as the
//! Packet Too Big of a `packet_too_big` drop), that counter names why the
//! datapath dropped it ("out dropped: no_v2p"). One counter may count another
//! frame: a full hold queue drops the oldest frame waiting for the same next hop
//! (`underlay_hold_overflow`), which the new frame's comment then names. A frame
//! the worker could not write to the tap is recorded with the worker counter that
//! counted it ("in dropped: tap_tx_link_down"). Only captured ports pay for this.
//!
//! A capture runs its whole course once started: if `xdeadm` goes away, the
//! daemon still writes the file until `count` or `seconds` (and `xdeadm`'s own
//! file, without `-w`, is then left in the API socket's directory).
//!
//! Direction: "out" and "in" as in the port counters and OPTE (from and to the
//! guest), recorded as pcapng outbound and inbound (`frame.p2p_dir` 0 and 1 in
//! tshark) and in the packet's comment.
//!
//! Underlay frames (`--underlay`), attributed only while such a capture runs on the
//! worker, so that no port pays for it otherwise: outbound, the underlay frames
//! the engine made of a captured guest frame in the same call (an AF_XDP transmit
//! slot is read before it is submitted; frames that first waited for a next hop
//! are not seen); inbound, the Geneve frames addressed to the port (its VNI and
//! guest MAC), whether the worker received them or another worker handed them
//! over, delivered or dropped (with the reason, as for guest frames: the only way
//! to see an inbound drop such as `fw_deny_in`, which never reaches the tap).
//! Their comments say `underlay` ("in underlay dropped: fw_deny_in").
//!
//! The file: the daemon writes it itself (the guest's frames never leave the daemon
//! other than into it), at an absolute path, created mode 0600, or an existing
//! *empty* regular file (not a symlink): a capture never overwrites data, and
//! `xdeadm` can create the file itself (mode 0600, in the API socket's directory,
//! which overlayd can write even under systemd's `ProtectSystem=strict` and
//! `PrivateTmp=yes`) and copy it to its standard output afterwards.

use super::stats::WorkerStats;
use crate::controller::DataplaneError;
use api::{CaptureSpec, ErrorCode, Refusal};
use engine::DropCounters;
use engine::{Engine, MacAddr, PortId, TxBatch, TxDest};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};
use wire::meta::parse_underlay_head;

/// Frames that may wait between a worker and the file: a burst of about a
/// millisecond at line rate, at most 16 MiB of copies should every frame be a
/// 64 KiB GSO buffer.
pub const QUEUE: usize = 256;

/// Bytes kept of each frame: the largest frame a tap gives or takes (a GSO buffer
/// of 64 KiB and its Ethernet header), so nothing is cut.
pub const SNAPLEN: u32 = dpio::tap::MAX_TAP_FRAME as u32;

/// Captures one worker runs at once: each copies every frame of its port, so a
/// few are plenty for an operator and bound what a worker can be made to copy.
const MAX_PER_WORKER: usize = 4;

/// Why a capture cannot start, or stopped writing its file.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error("capture seconds {0} out of range: 1 to {max}", max = CaptureSpec::MAX_SECONDS)]
    Seconds(u32),
    #[error("capture count 0: give at least 1 frame")]
    CountZero,
    #[error("no port named {0:?}")]
    NoSuchPort(String),
    #[error("this port's worker already runs {MAX_PER_WORKER} captures; wait for one to end")]
    TooMany,
    #[error("this datapath has no I/O: there are no frames to capture")]
    NoIo,
    #[error(
        "capture file {0:?} is not an absolute path (the daemon has its own working directory)"
    )]
    Relative(PathBuf),
    #[error("cannot open capture file {path:?}: {error}")]
    Open {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("capture file {0:?} exists and is not an empty regular file: not overwritten")]
    NotEmpty(PathBuf),
    #[error("capture file {path:?}: {error}")]
    Write {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error(transparent)]
    Dataplane(#[from] DataplaneError),
}

impl CaptureError {
    pub fn code(&self) -> ErrorCode {
        match self {
            CaptureError::Seconds(_)
            | CaptureError::CountZero
            | CaptureError::Relative(_)
            | CaptureError::Open { .. }
            | CaptureError::NotEmpty(_) => ErrorCode::Invalid,
            CaptureError::NoSuchPort(_) => ErrorCode::NotFound,
            CaptureError::TooMany => ErrorCode::Busy,
            CaptureError::NoIo => ErrorCode::Unsupported,
            CaptureError::Write { .. } => ErrorCode::Dataplane,
            CaptureError::Dataplane(e) => e.code(),
        }
    }
}

impl From<CaptureError> for Refusal {
    fn from(e: CaptureError) -> Refusal {
        Refusal::new(e.code(), e.to_string())
    }
}

/// Which way a frame went, from the guest's point of view.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dir {
    /// From the guest (read from its tap).
    Out,
    /// To the guest (written to its tap).
    In,
}

impl Dir {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Dir::Out => "out",
            Dir::In => "in",
        }
    }
}

/// Where a frame was seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Point {
    pub(crate) port: PortId,
    pub(crate) dir: Dir,
    /// On the underlay side (Geneve-encapsulated), not the guest's.
    pub(crate) underlay: bool,
}

/// One captured frame on its way to the file.
#[derive(Clone, Debug)]
pub(crate) struct Captured {
    pub(crate) unix_ns: u64,
    pub(crate) at: Point,
    pub(crate) orig_len: u32,
    pub(crate) bytes: Vec<u8>,
    /// Why the datapath dropped the frame, if it did.
    pub(crate) dropped: Option<&'static str>,
}

/// A capture's sending side, kept by the worker that owns the port.
pub(crate) struct Feed {
    tx: SyncSender<Captured>,
    /// Frames the queue had no room for; shared with the capture's session, which is
    /// gone once this is the only reference.
    lost: Arc<AtomicU64>,
}

pub(crate) struct Tap {
    pub(crate) port: PortId,
    /// With `--underlay`: the port's VNI and guest MAC, which its inbound Geneve
    /// frames carry.
    pub(crate) underlay: Option<(u32, MacAddr)>,
    pub(crate) feed: Feed,
}

/// The captures running on one worker.
#[derive(Default)]
pub(crate) struct Captures {
    taps: Vec<Tap>,
    /// Positions in this round's output batch of underlay frames made of a
    /// captured port's guest frames, with the port: copied when the batch is
    /// drained (see [`Captures::underlay_out`]).
    pending: Vec<(usize, PortId)>,
}

impl Captures {
    /// True when nothing on this worker is captured: the fast path's one check.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.taps.is_empty()
    }

    pub(crate) fn wants(&self, port: PortId) -> bool {
        self.taps.iter().any(|t| t.port == port)
    }

    /// Starts feeding `port`'s frames to `feed`; captures whose session has ended
    /// meanwhile (while no frame of their port came by to notice) are let go first.
    pub(crate) fn add(&mut self, tap: Tap) -> Result<(), CaptureError> {
        self.taps.retain(|t| Arc::strong_count(&t.feed.lost) > 1);
        if self.taps.len() >= MAX_PER_WORKER {
            return Err(CaptureError::TooMany);
        }
        self.taps.push(tap);
        Ok(())
    }

    /// Ends the captures of a port that is being deleted: their sessions see the
    /// channel close and answer at once.
    pub(crate) fn forget(&mut self, port: PortId) {
        self.taps.retain(|t| t.port != port);
    }

    fn wants_underlay(&self, port: PortId) -> bool {
        self.taps
            .iter()
            .any(|t| t.port == port && t.underlay.is_some())
    }

    /// The captured port an underlay frame (in `pieces`) is addressed to, if any
    /// capture of this worker wants underlay frames.
    fn underlay_port(&self, pieces: &[&[u8]]) -> Option<PortId> {
        if self.taps.iter().all(|t| t.underlay.is_none()) {
            return None;
        }
        // The headers, wherever the pieces split them: the outer ones, Geneve
        // options (at most 252 bytes) and the inner destination MAC.
        let mut buf = [0u8; 512];
        let mut n = 0;
        for p in pieces {
            let take = p.len().min(buf.len() - n);
            buf[n..n + take].copy_from_slice(&p[..take]);
            n += take;
        }
        let total = pieces.iter().map(|p| p.len()).sum();
        let meta = parse_underlay_head(&buf[..n], total)?.ok()?;
        let dst = buf.get(meta.inner_off..meta.inner_off + 6)?;
        self.taps
            .iter()
            .find(|t| t.underlay.is_some_and(|(v, m)| v == meta.vni && m.0 == dst))
            .map(|t| t.port)
    }

    /// The captured port whose guest frame became underlay frame number `index`
    /// of the batch being drained, if any.
    pub(crate) fn made_by(&self, index: usize) -> Option<PortId> {
        self.pending
            .iter()
            .find(|(i, _)| *i == index)
            .map(|&(_, port)| port)
    }

    /// The batch is drained: its positions mean nothing any more.
    pub(crate) fn end_of_batch(&mut self) {
        self.pending.clear();
    }

    /// Copies a frame seen at `at` to the captures of its port that want it:
    /// `orig_len` bytes, of which `fill` appends the first [`SNAPLEN`] (at most) to
    /// the buffer it is given.
    pub(crate) fn offer(
        &mut self,
        at: Point,
        orig_len: usize,
        fill: impl FnOnce(&mut Vec<u8>),
        dropped: Option<&'static str>,
        st: &mut WorkerStats,
    ) {
        let wanted = |t: &Tap| t.port == at.port && (!at.underlay || t.underlay.is_some());
        if !self.taps.iter().any(wanted) {
            return;
        }
        let mut bytes = Vec::with_capacity(orig_len.min(SNAPLEN as usize));
        fill(&mut bytes);
        // `fill` should keep to it; a capture never holds more.
        bytes.truncate(SNAPLEN as usize);
        let frame = Captured {
            unix_ns: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
            at,
            orig_len: u32::try_from(orig_len).unwrap_or(u32::MAX),
            bytes,
            dropped,
        };
        self.taps.retain(|t| {
            if !wanted(t) {
                return true;
            }
            match t.feed.tx.try_send(frame.clone()) {
                Ok(()) => true,
                Err(TrySendError::Full(_)) => {
                    t.feed.lost.fetch_add(1, Ordering::Relaxed);
                    st.capture_dropped += 1;
                    true
                }
                // The session ended: this capture is over.
                Err(TrySendError::Disconnected(_)) => false,
            }
        });
    }
}

/// Appends `piece` to a frame being copied, up to [`SNAPLEN`] bytes in all.
pub(crate) fn append(frame: &mut Vec<u8>, piece: &[u8]) {
    let room = (SNAPLEN as usize).saturating_sub(frame.len());
    frame.extend_from_slice(piece.get(..room).unwrap_or(piece));
}

/// One frame going through the engine while its worker captures: what it takes
/// to say afterwards whether the engine dropped it and why.
pub(crate) struct Watch {
    at: Point,
    /// The frame (at most [`SNAPLEN`] bytes) and its length.
    bytes: Vec<u8>,
    orig_len: usize,
    drops: DropCounters,
    /// The batch's length before the frame.
    sent: usize,
}

impl Watch {
    /// A frame from the guest of `port`, if the port is captured.
    pub(crate) fn guest(
        engine: &Engine,
        captures: &Captures,
        port: PortId,
        frame: &[u8],
        out: &TxBatch<'_>,
    ) -> Option<Watch> {
        if !captures.wants(port) {
            return None;
        }
        let at = Point {
            port,
            dir: Dir::Out,
            underlay: false,
        };
        Watch::of(engine, at, &[frame], out)
    }

    /// A frame from the underlay (in `pieces`), if it is for a port captured with
    /// its underlay frames.
    pub(crate) fn underlay(
        engine: &Engine,
        captures: &Captures,
        pieces: &[&[u8]],
        out: &TxBatch<'_>,
    ) -> Option<Watch> {
        let port = captures.underlay_port(pieces)?;
        let at = Point {
            port,
            dir: Dir::In,
            underlay: true,
        };
        Watch::of(engine, at, pieces, out)
    }

    fn of(engine: &Engine, at: Point, pieces: &[&[u8]], out: &TxBatch<'_>) -> Option<Watch> {
        let mut bytes = Vec::new();
        for p in pieces {
            append(&mut bytes, p);
        }
        Some(Watch {
            at,
            bytes,
            orig_len: pieces.iter().map(|p| p.len()).sum(),
            drops: engine.port_drops(at.port)?.clone(),
            sent: out.len(),
        })
    }

    /// Runs `process` (the engine taking the frame) and then [`Watch::done`]; an
    /// unwatched frame (`None`: its port is not captured) is only processed.
    pub(crate) fn around<'t>(
        watch: Option<Watch>,
        engine: &mut Engine,
        out: &mut TxBatch<'t>,
        captures: &mut Captures,
        st: &mut WorkerStats,
        process: impl FnOnce(&mut Engine, &mut TxBatch<'t>),
    ) {
        process(engine, out);
        if let Some(w) = watch {
            w.done(engine, out, captures, st);
        }
    }

    /// The engine is done with the frame: it goes to the captures, with why it was
    /// dropped if a drop counter of the port grew and nothing went where the frame
    /// was going (a guest frame may still get a gateway reply, such as the Packet
    /// Too Big of `packet_too_big`; an underlay frame, nothing for the port). The
    /// underlay frames a guest frame became are marked to be copied at the drain.
    pub(crate) fn done(
        self,
        engine: &Engine,
        out: &TxBatch<'_>,
        captures: &mut Captures,
        st: &mut WorkerStats,
    ) {
        let port = self.at.port;
        let made = || out.iter().enumerate().skip(self.sent);
        let to_port = |d: &TxDest| matches!(d, TxDest::Port { port: p, .. } if *p == port);
        let passed = match self.at.dir {
            Dir::Out => made().any(|(_, (d, _))| !to_port(&d)),
            Dir::In => made().any(|(_, (d, _))| to_port(&d)),
        };
        let dropped = match engine.port_drops(port) {
            Some(after) if !passed => grown(&self.drops, after),
            _ => None,
        };
        if self.at.dir == Dir::Out && captures.wants_underlay(port) {
            let underlay = made().filter(|(_, (d, _))| matches!(d, TxDest::Underlay { .. }));
            captures.pending.extend(underlay.map(|(i, _)| (i, port)));
        }
        let bytes = &self.bytes;
        captures.offer(self.at, self.orig_len, |v| append(v, bytes), dropped, st);
    }
}

/// The first drop counter that is higher in `after` than in `before`: why the
/// frame processed in between was dropped.
pub(crate) fn grown(before: &DropCounters, after: &DropCounters) -> Option<&'static str> {
    after
        .iter()
        .find(|&(r, n)| n > before.get(r))
        .map(|(r, _)| r.name())
}

pub(crate) fn channel() -> (Feed, Receiver<Captured>, Arc<AtomicU64>) {
    let (tx, rx) = mpsc::sync_channel(QUEUE);
    let lost = Arc::new(AtomicU64::new(0));
    (
        Feed {
            tx,
            lost: lost.clone(),
        },
        rx,
        lost,
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use engine::DropReason;
    pub(crate) fn frame(n: u8) -> Vec<u8> {
        vec![n; 60]
    }

    pub(crate) fn at(port: u32, dir: Dir) -> Point {
        Point {
            port: PortId(port),
            dir,
            underlay: false,
        }
    }

    pub(crate) fn tap(port: u32, underlay: Option<(u32, MacAddr)>, feed: Feed) -> Tap {
        Tap {
            port: PortId(port),
            underlay,
            feed,
        }
    }

    fn offer(c: &mut Captures, port: u32, n: u8, st: &mut WorkerStats) {
        let f = frame(n);
        c.offer(
            at(port, Dir::Out),
            f.len(),
            |v| v.extend_from_slice(&f),
            None,
            st,
        );
    }

    #[test]
    fn only_the_captured_port_is_copied_and_a_full_queue_is_counted() {
        let mut c = Captures::default();
        assert!(c.is_empty());
        let (feed, rx, lost) = channel();
        c.add(tap(1, None, feed)).unwrap();
        let mut st = WorkerStats::default();
        offer(&mut c, 2, 9, &mut st);
        for i in 0..QUEUE + 3 {
            offer(&mut c, 1, i as u8, &mut st);
        }
        assert_eq!(st.capture_dropped, 3);
        assert_eq!(lost.load(Ordering::Relaxed), 3);
        let got: Vec<Captured> = rx.try_iter().collect();
        assert_eq!(got.len(), QUEUE);
        assert_eq!(got[0].bytes, frame(0), "port 2's frame was not copied");
        // The session ends: the next frame of the port ends the capture.
        drop(rx);
        offer(&mut c, 1, 0, &mut st);
        assert!(c.is_empty());
    }

    #[test]
    fn ended_sessions_are_let_go_and_captures_per_worker_are_bounded() {
        let mut c = Captures::default();
        let mut sessions = Vec::new();
        for p in 0..MAX_PER_WORKER as u32 {
            let (feed, rx, lost) = channel();
            c.add(tap(p, None, feed)).unwrap();
            sessions.push((rx, lost));
        }
        let (feed, _rx, _lost) = channel();
        assert!(c
            .add(tap(9, None, feed))
            .unwrap_err()
            .to_string()
            .contains("4 captures"));
        sessions.pop();
        let (feed, _rx, _lost) = channel();
        c.add(tap(9, None, feed)).unwrap();
        c.forget(PortId(0));
        assert!(!c.wants(PortId(0)));
        assert!(matches!(sessions[0].0.recv(), Err(mpsc::RecvError),));
    }

    /// A Geneve frame in VNI `vni` for inner destination `dst`, as a peer sends it.
    fn geneve(vni: u32, dst: [u8; 6]) -> Vec<u8> {
        let inner = [&dst[..], &[2, 0, 0, 0, 0, 1], &[0x08, 0x00], &[0u8; 46]].concat();
        let udp_len = (8 + 8 + inner.len()) as u16;
        let mut f = vec![0u8; 14];
        f[12..14].copy_from_slice(&[0x86, 0xdd]);
        let mut ip = vec![0x60, 0, 0, 0];
        ip.extend_from_slice(&udp_len.to_be_bytes());
        ip.extend_from_slice(&[17, 64]);
        ip.extend_from_slice(&[0xfd; 32]);
        f.extend_from_slice(&ip);
        f.extend_from_slice(&[0x30, 0x39, 0x17, 0xc1]);
        f.extend_from_slice(&udp_len.to_be_bytes());
        f.extend_from_slice(&[0, 0]);
        f.extend_from_slice(&[0, 0, 0x65, 0x58]);
        f.extend_from_slice(&(vni << 8).to_be_bytes());
        f.extend_from_slice(&inner);
        f
    }

    #[test]
    fn underlay_frames_are_attributed_by_vni_and_guest_mac_only_when_asked() {
        let mac = MacAddr([2, 8, 0x20, 1, 2, 3]);
        let mut c = Captures::default();
        let (feed, _plain, _plain_lost) = channel();
        c.add(tap(1, None, feed)).unwrap();
        let f = geneve(10, mac.0);
        assert_eq!(
            c.underlay_port(&[&f]),
            None,
            "no capture asked for the underlay"
        );
        let (feed, rx, _lost) = channel();
        c.add(tap(3, Some((10, mac)), feed)).unwrap();
        assert_eq!(c.underlay_port(&[&f]), Some(PortId(3)));
        assert_eq!(c.underlay_port(&[&f[..70], &f[70..]]), Some(PortId(3)));
        assert_eq!(c.underlay_port(&[&geneve(11, mac.0)]), None, "other VNI");
        assert_eq!(c.underlay_port(&[&geneve(10, [2; 6])]), None, "other MAC");
        assert_eq!(c.underlay_port(&[&f[..20]]), None, "not a whole header");
        // Underlay frames go only to the captures that asked for them.
        c.pending.push((4, PortId(3)));
        assert_eq!((c.made_by(4), c.made_by(5)), (Some(PortId(3)), None));
        c.end_of_batch();
        assert_eq!(c.made_by(4), None);
        let mut st = WorkerStats::default();
        let under = Point {
            underlay: true,
            ..at(3, Dir::In)
        };
        c.offer(
            under,
            f.len(),
            |v| v.extend_from_slice(&f),
            Some("fw_deny_in"),
            &mut st,
        );
        let got = rx.try_recv().unwrap();
        assert_eq!((got.at, got.dropped), (under, Some("fw_deny_in")));
        assert_eq!(got.bytes, f);
    }

    #[test]
    fn the_grown_counter_names_the_drop() {
        let mut before = DropCounters::with([DropReason::SpoofedSrcIp, DropReason::FwDenyIn]);
        before.inc(DropReason::SpoofedSrcIp);
        let mut after = before.clone();
        assert_eq!(grown(&before, &after), None);
        after.inc(DropReason::NoV2p);
        assert_eq!(grown(&before, &after), Some("no_v2p"));
    }
}
