//! The tap re-opener: a thread per worker that gets a port's tap back, on a
//! back-off, once it can be had again (its guest's namespace is back), so the worker
//! itself never waits for a tap to be opened.

use super::guests::open_port;
use crate::util::Backoff;
use api::PortInfo;
use dpio::guest::GuestPort;
use std::collections::HashMap;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::thread;
use std::time::{Duration, Instant};

/// How soon a port whose tap went away is first tried again, and the longest wait
/// between tries: a guest back within a second gets its link back at once, one
/// that stays away costs one failed open every few seconds.
const REATTACH_FIRST: Duration = Duration::from_millis(100);

const REATTACH_MAX: Duration = Duration::from_secs(5);

/// The re-opener's thread did not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot start worker {worker}'s tap re-opener: {error}")]
pub struct ReattacherError {
    worker: usize,
    error: std::io::Error,
}

/// What a worker asks of its [`Reattacher`].
enum Want {
    /// Get the tap of port `slot` number `gen` back.
    Tap {
        slot: usize,
        gen: u64,
        port: Box<PortInfo>,
    },
    /// That port was deleted: stop trying.
    Forget { slot: usize, gen: u64 },
}

/// A tap opened again for port `slot` number `gen`.
pub(crate) struct Reattached {
    pub(crate) slot: usize,
    pub(crate) gen: u64,
    pub(crate) tap: GuestPort,
}

/// One worker's tap re-opener: a thread that tries to open the taps of the
/// worker's down ports, each on its own back-off, and hands back those it got.
/// On a thread because opening a tap in a guest's namespace takes a thread of its
/// own and several netlink round trips, which the worker must not wait for.
pub struct Reattacher {
    /// `None` once dropped, which ends the thread.
    wants: Option<Sender<Want>>,
    back: Receiver<Reattached>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Reattacher {
    /// Starts worker `index`'s re-opener (it opens taps in the caller's network
    /// namespace, like the worker's own ports). `wake` is called after a tap is
    /// handed back, so a sleeping worker serves the port at once.
    pub fn start(
        index: usize,
        wake: impl Fn() + Send + 'static,
    ) -> Result<Reattacher, ReattacherError> {
        let (wants, wants_rx) = mpsc::channel();
        let (back_tx, back) = mpsc::channel();
        let thread = thread::Builder::new()
            .name(format!("taps{index}"))
            .spawn(move || reattach_loop(&wants_rx, &back_tx, &wake))
            .map_err(|error| ReattacherError {
                worker: index,
                error,
            })?;
        Ok(Reattacher {
            wants: Some(wants),
            back,
            thread: Some(thread),
        })
    }

    fn send(&self, w: Want) {
        if let Some(tx) = &self.wants {
            if tx.send(w).is_err() {
                tracing::error!("tap re-opener has stopped");
            }
        }
    }

    /// Starts getting the tap of port `slot` number `gen` back.
    pub(crate) fn want(&self, slot: usize, gen: u64, port: &PortInfo) {
        self.send(Want::Tap {
            slot,
            gen,
            port: Box::new(port.clone()),
        });
    }

    /// Stops trying for a port that was deleted.
    pub(crate) fn forget(&self, slot: usize, gen: u64) {
        self.send(Want::Forget { slot, gen });
    }

    /// A tap opened again, if one is waiting (never blocks).
    pub(crate) fn take(&self) -> Option<Reattached> {
        self.back.try_recv().ok()
    }
}

impl Drop for Reattacher {
    fn drop(&mut self) {
        self.wants.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A down port's tap being tried for.
struct Waiting {
    port: Box<PortInfo>,
    due: Instant,
    backoff: Backoff,
}

/// The re-opener's loop: sleeps until a request or the next try, tries the ports
/// that are due. Returns once the worker's side is dropped.
fn reattach_loop(wants: &Receiver<Want>, back: &Sender<Reattached>, wake: &dyn Fn()) {
    let mut waiting: HashMap<(usize, u64), Waiting> = HashMap::new();
    loop {
        let first = match waiting.values().map(|w| w.due).min() {
            None => wants.recv().map_err(|_| RecvTimeoutError::Disconnected),
            Some(due) => wants.recv_timeout(due.saturating_duration_since(Instant::now())),
        };
        match first {
            Ok(w) => note(&mut waiting, w),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        let now = Instant::now();
        let due: Vec<(usize, u64)> = waiting
            .iter()
            .filter(|(_, w)| w.due <= now)
            .map(|(k, _)| *k)
            .collect();
        for key in due {
            if !try_reattach(key, &mut waiting, wants, back, wake) {
                return;
            }
        }
    }
}

/// Records one request.
fn note(waiting: &mut HashMap<(usize, u64), Waiting>, w: Want) {
    match w {
        Want::Tap { slot, gen, port } => {
            let mut backoff = Backoff::new(REATTACH_FIRST, REATTACH_MAX);
            let due = Instant::now() + backoff.next_wait();
            waiting.insert((slot, gen), Waiting { port, due, backoff });
        }
        Want::Forget { slot, gen } => {
            waiting.remove(&(slot, gen));
        }
    }
}

/// Records every request waiting; false once the worker's side is gone.
fn note_all(waiting: &mut HashMap<(usize, u64), Waiting>, wants: &Receiver<Want>) -> bool {
    loop {
        match wants.try_recv() {
            Ok(w) => note(waiting, w),
            Err(TryRecvError::Empty) => return true,
            Err(TryRecvError::Disconnected) => return false,
        }
    }
}

/// One try at port `key`'s tap: handed back when opened (unless the port was
/// deleted meanwhile: then the new tap is destroyed), else tried again after the
/// port's next back-off. False once the worker's side is gone.
fn try_reattach(
    key: (usize, u64),
    waiting: &mut HashMap<(usize, u64), Waiting>,
    wants: &Receiver<Want>,
    back: &Sender<Reattached>,
    wake: &dyn Fn(),
) -> bool {
    let Some(w) = waiting.get_mut(&key) else {
        return true;
    };
    let tap = match open_port(&w.port) {
        Ok(tap) => tap,
        Err(e) => {
            w.due = Instant::now() + w.backoff.next_wait();
            tracing::debug!(port = %w.port.config.name, error = %e, "tap not back yet");
            return true;
        }
    };
    if !note_all(waiting, wants) {
        // Shutting down: the tap (persistent) stays for the next start.
        return false;
    }
    if waiting.remove(&key).is_none() {
        if let Err(e) = tap.release() {
            tracing::warn!(error = %e, "tap of a deleted port not destroyed");
        }
        return true;
    }
    let (slot, gen) = key;
    let sent = back.send(Reattached { slot, gen, tap }).is_ok();
    wake();
    sent
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    /// `ip ARGS...`, which must succeed.
    pub(crate) fn ip(args: &[&str]) {
        let ok = std::process::Command::new("ip")
            .args(args)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "ip {args:?} failed (this test needs root)");
    }

    /// A network namespace deleted on drop.
    pub(crate) struct Netns(pub(crate) String);

    impl Netns {
        /// `ctl-TAG-PID`, created.
        pub(crate) fn new(tag: &str) -> Netns {
            let name = format!("ctl-{tag}-{}", std::process::id());
            ip(&["netns", "add", &name]);
            Netns(name)
        }
    }

    impl Drop for Netns {
        fn drop(&mut self) {
            let _ = std::process::Command::new("ip")
                .args(["netns", "del", &self.0])
                .status();
        }
    }

    /// A down port's tap is not made while its guest's namespace is missing, and
    /// comes back (made in the namespace) once it exists; a port deleted while it
    /// waited gets no tap.
    #[test]
    fn reattacher_waits_for_the_namespace_and_skips_deleted_ports() {
        let ns = format!("ctl-reattach-{}", std::process::id());
        // Created below, once the ports wait for it.
        let port = |name: &str, last: u8| PortInfo {
            config: api::testing::sample_port(name, last),
            netns: Some(ns.clone()),
            vhost_user: None,
            attach: None,
        };
        let r = Reattacher::start(0, || {}).unwrap();
        r.want(3, 1, &port("rat0", 1));
        r.want(4, 2, &port("rat1", 2));
        r.forget(4, 2);
        std::thread::sleep(REATTACH_FIRST * 3);
        assert!(r.take().is_none(), "no namespace, no tap");
        ip(&["netns", "add", &ns]);
        let _guard = Netns(ns.clone());
        let deadline = Instant::now() + Duration::from_secs(10);
        let back = loop {
            if let Some(b) = r.take() {
                break b;
            }
            assert!(Instant::now() < deadline, "the tap did not come back");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!((back.slot, back.gen, back.tap.name()), (3, 1, "rat0"));
        ip(&["-n", &ns, "link", "show", "rat0"]);
        let forgotten = std::process::Command::new("ip")
            .args(["-n", &ns, "link", "show", "rat1"])
            .output()
            .unwrap();
        assert!(!forgotten.status.success(), "a deleted port's tap was made");
        assert!(r.take().is_none());
        back.tap.release().unwrap();
    }
}
