//! Stopping cleanly: SIGINT, SIGTERM and SIGHUP only raise a flag, which the runner
//! checks between steps, so the guards that remove namespaces and stop daemons run
//! as the error unwinds instead of the process dying with everything left behind.

use crate::{Error, Result};
use std::sync::atomic::{AtomicBool, Ordering};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_signal: libc::c_int) {
    // An atomic store is async-signal-safe.
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// Installs the handlers, and asks for SIGTERM when the parent (the wrapper script)
/// dies, so a killed script does not leave the benchmark running on its own.
pub fn install() -> Result<()> {
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: a zeroed sigaction is a valid "no flags, empty mask" value; the
        // handler only stores to an atomic, which is async-signal-safe; `action`
        // outlives the call and the old action is not wanted (null).
        let rc = unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(Error::new(format!(
                "installing a handler for signal {signal}: {}",
                std::io::Error::last_os_error()
            )));
        }
    }
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes a signal number and touches no memory.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) } != 0 {
        return Err(Error::new(format!(
            "prctl(PR_SET_PDEATHSIG): {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(())
}

/// Whether a stop was asked for.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
}

/// An error once a stop was asked for: `?` after it unwinds to the guards.
pub fn check() -> Result<()> {
    if interrupted() {
        Err(Error::new("interrupted"))
    } else {
        Ok(())
    }
}
