//! `xdeadm capture`'s sessions: the request checked, the file opened, the capture
//! started on the port's worker ([`crate::worker::capture`]), and the frames it
//! sends written as pcapng until `count` frames or `seconds` have passed.

use super::pcapng::{self, Packet, PcapngWriter};
use crate::server::Answer;
use crate::worker::capture::{self, CaptureError, Captured, Dir, SNAPLEN};
use crate::worker::Datapath;
use crate::workers::Workers;
use api::{CaptureEnd, CaptureReport, CaptureSpec, Outcome, Reply};
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, ErrorKind};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The daemon's side of one capture: receives the frames and writes the file.
struct Session {
    rx: Receiver<Captured>,
    lost: Arc<AtomicU64>,
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
                Err(e) => Outcome::Error(e.into()),
            }
        })),
        Err(e) => Outcome::Error(e.into()).into(),
    }
}

/// Everything `start` does before it answers later.
fn begin(workers: &Workers<Datapath>, spec: &CaptureSpec) -> Result<(Session, File), CaptureError> {
    let seconds = spec.seconds.unwrap_or(CaptureSpec::DEFAULT_SECONDS);
    if !(1..=CaptureSpec::MAX_SECONDS).contains(&seconds) {
        return Err(CaptureError::Seconds(seconds));
    }
    if spec.count == Some(0) {
        return Err(CaptureError::CountZero);
    }
    let worker = workers
        .owner(&spec.port)
        .ok_or_else(|| CaptureError::NoSuchPort(spec.port.clone()))?;
    let file = open_output(&spec.file)?;
    let (feed, rx, lost) = capture::channel();
    let session = Session { rx, lost };
    let port = spec.port.clone();
    let underlay = spec.underlay;
    workers.call(worker, move |dp: &mut Datapath| {
        dp.start_capture(&port, underlay, feed)
    })??;
    Ok((session, file))
}

/// Opens the capture file for writing: created mode 0600, or an existing empty
/// regular file; never through a symlink, never over data.
fn open_output(path: &Path) -> Result<File, CaptureError> {
    if !path.is_absolute() {
        return Err(CaptureError::Relative(path.to_path_buf()));
    }
    let mut opts = OpenOptions::new();
    opts.write(true).custom_flags(libc::O_NOFOLLOW);
    let file = match opts.clone().create_new(true).mode(0o600).open(path) {
        Err(e) if e.kind() == ErrorKind::AlreadyExists => opts.open(path),
        r => r,
    }
    .map_err(|error| CaptureError::Open {
        path: path.to_path_buf(),
        error,
    })?;
    let meta = file.metadata().map_err(|error| CaptureError::Open {
        path: path.to_path_buf(),
        error,
    })?;
    if !meta.is_file() || meta.len() != 0 {
        return Err(CaptureError::NotEmpty(path.to_path_buf()));
    }
    Ok(file)
}

impl Session {
    /// Writes the frames that come until `spec.count` are written, `time` has
    /// passed, or the port is gone.
    fn run(
        self,
        spec: &CaptureSpec,
        file: File,
        time: Duration,
    ) -> Result<CaptureReport, CaptureError> {
        let err = |error| CaptureError::Write {
            path: spec.file.clone(),
            error,
        };
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
    use crate::worker::capture::tests::{at, frame, tap};
    use crate::worker::capture::Captures;
    use crate::worker::stats::WorkerStats;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn output_is_new_0600_or_empty_never_relative_symlinked_or_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let e = open_output(Path::new("rel.pcapng"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("rel.pcapng") && e.contains("absolute"), "{e}");
        let new = dir.path().join("new.pcapng");
        open_output(&new).unwrap();
        let mode = std::fs::metadata(&new).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        // Empty: taken (how xdeadm hands over its own file).
        open_output(&new).unwrap();
        std::fs::write(&new, b"data").unwrap();
        let e = open_output(&new).unwrap_err().to_string();
        assert!(e.contains("not overwritten"), "{e}");
        let link = dir.path().join("link.pcapng");
        let empty = dir.path().join("empty.pcapng");
        std::fs::write(&empty, b"").unwrap();
        std::os::unix::fs::symlink(&empty, &link).unwrap();
        let e = open_output(&link).unwrap_err().to_string();
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
        let (feed, rx, lost) = capture::channel();
        let session = Session { rx, lost };
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
