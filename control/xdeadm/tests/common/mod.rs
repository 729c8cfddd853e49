//! What several of xdeadm's integration tests share: a daemon without I/O to
//! talk to.

use engine::EngineConfig;
use overlayd::daemon::headless::Headless;
use std::path::Path;

/// A daemon without I/O on `sock` (its directory made as the real daemon makes
/// it), with no state file: the engine and controller of a fresh sled.
pub fn headless(sock: &Path) -> Headless {
    Headless::start(EngineConfig::new("fd00:99::1".parse().unwrap()), sock, None).unwrap()
}
