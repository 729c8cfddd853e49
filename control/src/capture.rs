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

use crate::api::{CaptureEnd, CaptureReport, CaptureSpec, Outcome, Reply};
use crate::datapath::Datapath;
use crate::pcapng::{self, Packet, PcapngWriter};
use crate::server::Answer;
use crate::worker::WorkerStats;
use crate::workers::Workers;
use engine::DropCounters;
use engine::{Engine, MacAddr, PortId, TxBatch, TxDest};
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, ErrorKind};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
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

/// Which way a frame went, from the guest's point of view.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dir {
    /// From the guest (read from its tap).
    Out,
    /// To the guest (written to its tap).
    In,
}

impl Dir {
    fn name(self) -> &'static str {
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
    unix_ns: u64,
    at: Point,
    orig_len: u32,
    bytes: Vec<u8>,
    /// Why the datapath dropped the frame, if it did.
    dropped: Option<&'static str>,
}

/// A capture's sending side, kept by the worker that owns the port.
pub(crate) struct Feed {
    tx: SyncSender<Captured>,
    /// Frames the queue had no room for; shared with the [`Session`], which is
    /// gone once this is the only reference.
    lost: Arc<AtomicU64>,
}

struct Tap {
    port: PortId,
    /// With `--underlay`: the port's VNI and guest MAC, which its inbound Geneve
    /// frames carry.
    underlay: Option<(u32, MacAddr)>,
    feed: Feed,
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
    fn add(&mut self, tap: Tap) -> Result<(), String> {
        self.taps.retain(|t| Arc::strong_count(&t.feed.lost) > 1);
        if self.taps.len() >= MAX_PER_WORKER {
            return Err(format!(
                "this port's worker already runs {MAX_PER_WORKER} captures; wait for one to end"
            ));
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

impl Datapath {
    /// Starts feeding port `port`'s frames (and its underlay frames if
    /// `underlay`) to `feed` (a job on the port's worker).
    fn start_capture(&mut self, port: &str, underlay: bool, feed: Feed) -> Result<(), String> {
        let id = self
            .engine
            .port_id(port)
            .ok_or_else(|| format!("no port named {port:?} on its worker"))?;
        let cfg = self.engine.port_config(port).map_err(|e| e.to_string())?;
        let underlay = underlay.then_some((cfg.vni.get(), cfg.guest_mac));
        let io = self
            .io
            .as_mut()
            .ok_or("this datapath has no I/O: there are no frames to capture")?;
        io.captures.add(Tap {
            port: id,
            underlay,
            feed,
        })
    }
}

/// The daemon's side of one capture: receives the frames and writes the file.
struct Session {
    rx: Receiver<Captured>,
    lost: Arc<AtomicU64>,
}

fn channel() -> (Feed, Session) {
    let (tx, rx) = mpsc::sync_channel(QUEUE);
    let lost = Arc::new(AtomicU64::new(0));
    (
        Feed {
            tx,
            lost: lost.clone(),
        },
        Session { rx, lost },
    )
}

/// `capture`: checks the request, opens the file, starts the capture on the
/// port's worker, and answers later, from a thread of its own, once `count`
/// frames are written or `seconds` have passed (other requests are served
/// meanwhile).
pub fn start(workers: &Workers<Datapath>, spec: CaptureSpec) -> Answer {
    match begin(workers, &spec) {
        Ok((session, file)) => Answer::Later(Box::new(move || {
            match session.run(&spec, file, spec.duration()) {
                Ok(r) => Outcome::Ok(Reply::Capture(r)),
                Err(e) => Outcome::Error(e),
            }
        })),
        Err(e) => Outcome::Error(e).into(),
    }
}

/// Everything `start` does before it answers later.
fn begin(workers: &Workers<Datapath>, spec: &CaptureSpec) -> Result<(Session, File), String> {
    let seconds = spec.seconds.unwrap_or(CaptureSpec::DEFAULT_SECONDS);
    if !(1..=CaptureSpec::MAX_SECONDS).contains(&seconds) {
        let max = CaptureSpec::MAX_SECONDS;
        return Err(format!(
            "capture seconds {seconds} out of range: 1 to {max}"
        ));
    }
    if spec.count == Some(0) {
        return Err("capture count 0: give at least 1 frame".into());
    }
    let worker = workers
        .owner(&spec.port)
        .ok_or_else(|| format!("no port named {:?}", spec.port))?;
    let file = open_output(&spec.file)?;
    let (feed, session) = channel();
    let port = spec.port.clone();
    let underlay = spec.underlay;
    workers.call(worker, move |dp: &mut Datapath| {
        dp.start_capture(&port, underlay, feed)
    })??;
    Ok((session, file))
}

/// Opens the capture file for writing: created mode 0600, or an existing empty
/// regular file; never through a symlink, never over data.
fn open_output(path: &Path) -> Result<File, String> {
    let shown = path.display();
    if !path.is_absolute() {
        return Err(format!(
            "capture file {shown:?} is not an absolute path (the daemon has its own working directory)"
        ));
    }
    let mut opts = OpenOptions::new();
    opts.write(true).custom_flags(libc::O_NOFOLLOW);
    let file = match opts.clone().create_new(true).mode(0o600).open(path) {
        Err(e) if e.kind() == ErrorKind::AlreadyExists => opts.open(path),
        r => r,
    }
    .map_err(|e| format!("cannot open capture file {shown:?}: {e}"))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("capture file {shown:?}: {e}"))?;
    if !meta.is_file() || meta.len() != 0 {
        return Err(format!(
            "capture file {shown:?} exists and is not an empty regular file: not overwritten"
        ));
    }
    Ok(file)
}

impl Session {
    /// Writes the frames that come until `spec.count` are written, `time` has
    /// passed, or the port is gone.
    fn run(self, spec: &CaptureSpec, file: File, time: Duration) -> Result<CaptureReport, String> {
        let err = |e: std::io::Error| format!("capture file {:?}: {e}", spec.file.display());
        let mut w = PcapngWriter::new(BufWriter::new(file), &spec.port, SNAPLEN).map_err(err)?;
        let deadline = Instant::now() + time;
        let mut frames = 0u64;
        let ended = loop {
            if spec.count.is_some_and(|c| frames >= c) {
                break CaptureEnd::Count;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            // Checked here: a queue that is never empty would keep recv_timeout
            // answering past the deadline.
            if left.is_zero() {
                break CaptureEnd::Time;
            }
            let f = match self.rx.recv_timeout(left) {
                Ok(f) => f,
                Err(RecvTimeoutError::Timeout) => break CaptureEnd::Time,
                Err(RecvTimeoutError::Disconnected) => break CaptureEnd::PortGone,
            };
            let mut comment = f.at.dir.name().to_string();
            if f.at.underlay {
                comment.push_str(" underlay");
            }
            if let Some(why) = f.dropped {
                comment.push_str(" dropped: ");
                comment.push_str(why);
            }
            w.packet(&Packet {
                unix_ns: f.unix_ns,
                orig_len: f.orig_len,
                data: &f.bytes,
                direction: match f.at.dir {
                    Dir::Out => pcapng::Direction::Outbound,
                    Dir::In => pcapng::Direction::Inbound,
                },
                comment: Some(&comment),
            })
            .map_err(err)?;
            frames += 1;
        };
        // The worker stops copying at its next frame of the port.
        drop(self.rx);
        w.finish().map_err(err)?;
        Ok(CaptureReport {
            port: spec.port.clone(),
            file: spec.file.clone(),
            frames,
            dropped: self.lost.load(Ordering::Relaxed),
            ended,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine::DropReason;
    use std::os::unix::fs::PermissionsExt;

    fn frame(n: u8) -> Vec<u8> {
        vec![n; 60]
    }

    fn at(port: u32, dir: Dir) -> Point {
        Point {
            port: PortId(port),
            dir,
            underlay: false,
        }
    }

    fn tap(port: u32, underlay: Option<(u32, MacAddr)>, feed: Feed) -> Tap {
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
        let (feed, session) = channel();
        c.add(tap(1, None, feed)).unwrap();
        let mut st = WorkerStats::default();
        offer(&mut c, 2, 9, &mut st);
        for i in 0..QUEUE + 3 {
            offer(&mut c, 1, i as u8, &mut st);
        }
        assert_eq!(st.capture_dropped, 3);
        assert_eq!(session.lost.load(Ordering::Relaxed), 3);
        let got: Vec<Captured> = session.rx.try_iter().collect();
        assert_eq!(got.len(), QUEUE);
        assert_eq!(got[0].bytes, frame(0), "port 2's frame was not copied");
        // The session ends: the next frame of the port ends the capture.
        drop(session);
        offer(&mut c, 1, 0, &mut st);
        assert!(c.is_empty());
    }

    #[test]
    fn ended_sessions_are_let_go_and_captures_per_worker_are_bounded() {
        let mut c = Captures::default();
        let mut sessions = Vec::new();
        for p in 0..MAX_PER_WORKER as u32 {
            let (feed, s) = channel();
            c.add(tap(p, None, feed)).unwrap();
            sessions.push(s);
        }
        let (feed, _s) = channel();
        assert!(c
            .add(tap(9, None, feed))
            .unwrap_err()
            .contains("4 captures"));
        sessions.pop();
        let (feed, _s) = channel();
        c.add(tap(9, None, feed)).unwrap();
        c.forget(PortId(0));
        assert!(!c.wants(PortId(0)));
        assert!(matches!(sessions[0].rx.recv(), Err(mpsc::RecvError),));
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
        let (feed, _plain) = channel();
        c.add(tap(1, None, feed)).unwrap();
        let f = geneve(10, mac.0);
        assert_eq!(
            c.underlay_port(&[&f]),
            None,
            "no capture asked for the underlay"
        );
        let (feed, session) = channel();
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
        let got = session.rx.try_recv().unwrap();
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

    #[test]
    fn output_is_new_0600_or_empty_never_relative_symlinked_or_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let e = open_output(Path::new("rel.pcapng")).unwrap_err();
        assert!(e.contains("rel.pcapng") && e.contains("absolute"), "{e}");
        let new = dir.path().join("new.pcapng");
        open_output(&new).unwrap();
        let mode = std::fs::metadata(&new).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        // Empty: taken (how xdeadm hands over its own file).
        open_output(&new).unwrap();
        std::fs::write(&new, b"data").unwrap();
        let e = open_output(&new).unwrap_err();
        assert!(e.contains("not overwritten"), "{e}");
        let link = dir.path().join("link.pcapng");
        let empty = dir.path().join("empty.pcapng");
        std::fs::write(&empty, b"").unwrap();
        std::os::unix::fs::symlink(&empty, &link).unwrap();
        let e = open_output(&link).unwrap_err();
        assert!(e.contains("link.pcapng"), "{e}");
        assert!(open_output(dir.path()).is_err(), "a directory");
    }

    #[test]
    fn a_session_writes_until_count_and_names_drops() {
        let dir = tempfile::tempdir().unwrap();
        let spec = CaptureSpec {
            port: "p1".into(),
            underlay: false,
            count: Some(2),
            seconds: None,
            file: dir.path().join("s.pcapng"),
        };
        let file = open_output(&spec.file).unwrap();
        let (feed, session) = channel();
        let mut c = Captures::default();
        c.add(tap(0, None, feed)).unwrap();
        let mut st = WorkerStats::default();
        let f = frame(1);
        c.offer(
            at(0, Dir::Out),
            60,
            |v| v.extend_from_slice(&f),
            Some("no_v2p"),
            &mut st,
        );
        c.offer(
            at(0, Dir::In),
            60,
            |v| v.extend_from_slice(&f),
            None,
            &mut st,
        );
        c.offer(
            at(0, Dir::In),
            60,
            |v| v.extend_from_slice(&f),
            None,
            &mut st,
        );
        let r = session.run(&spec, file, Duration::from_secs(5)).unwrap();
        assert_eq!((r.frames, r.dropped, r.ended), (2, 0, CaptureEnd::Count));
        let bytes = std::fs::read(&spec.file).unwrap();
        let text = String::from_utf8_lossy(&bytes);
        assert!(text.contains("out dropped: no_v2p"), "{text}");
        // The session is gone: the worker lets the capture go.
        c.offer(
            at(0, Dir::In),
            60,
            |v| v.extend_from_slice(&f),
            None,
            &mut st,
        );
        assert!(c.is_empty());
    }
}
