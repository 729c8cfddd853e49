//! What several of xdeadm's integration tests share: a daemon without I/O to
//! talk to, and the built tool run against it.

use engine::EngineConfig;
use overlayd::daemon::headless::Headless;
use std::path::Path;
use std::process::{Command, Output};

/// A daemon without I/O on `sock` (its directory made as the real daemon makes
/// it), with no state file: the engine and controller of a fresh sled.
pub fn headless(sock: &Path) -> Headless {
    Headless::start(EngineConfig::new("fd00:99::1".parse().unwrap()), sock, None).unwrap()
}

/// The built `xdeadm` run with `args` against the daemon on `socket`.
pub fn xdeadm(socket: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xdeadm"))
        .arg("--socket")
        .arg(socket)
        .args(args)
        .output()
        .expect("xdeadm runs")
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}
