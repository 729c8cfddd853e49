//! CPU placement of the calling thread.

/// Why the calling thread could not be pinned to `core`.
#[derive(Debug, thiserror::Error)]
#[error("cannot pin worker to core {core}: {os_error}")]
pub struct PinError {
    pub core: usize,
    pub os_error: std::io::Error,
}

/// Pins the calling thread to `core` so the worker keeps its caches and does not
/// compete with the other workers.
pub fn pin_to_core(core: usize) -> Result<(), PinError> {
    // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: CPU_SET writes one bit inside `set`; `core` is below CPU_SETSIZE
    // (checked by the config parser, MAX_CORE).
    unsafe { libc::CPU_SET(core, &mut set) };
    // SAFETY: pid 0 is the calling thread; `set` is a valid cpu_set_t of that size.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if r != 0 {
        return Err(PinError {
            core,
            os_error: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}
