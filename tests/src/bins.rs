//! Finding the binaries under test.
//!
//! Cargo exposes `CARGO_BIN_EXE_*` only to the package that owns the binary, and the
//! daemon and the admin tool live in crates `overlayd` and `xdeadm`. So, in order:
//! 1. `OVERLAYD_BIN` / `XDEADM_BIN` name the binaries explicitly (used by the demo,
//!    which builds in release mode, and by anyone testing an installed build);
//! 2. otherwise the first call in a test process runs `cargo build -p overlayd -p xdeadm --bins`
//!    into the target directory and profile of the running test executable
//!    (`.../target/<profile>/deps/<test>`), so the tests never run a stale daemon.

use crate::cmd::Cmd;
use crate::{Context, Error, Result};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

/// Paths of the binaries under test.
#[derive(Clone, Debug)]
pub struct Bins {
    pub overlayd: PathBuf,
    pub xdeadm: PathBuf,
}

/// The binaries, building them once per process if needed.
pub fn bins() -> Result<&'static Bins> {
    static BINS: OnceLock<Result<Bins>> = OnceLock::new();
    BINS.get_or_init(locate).as_ref().map_err(Clone::clone)
}

fn locate() -> Result<Bins> {
    let from_env = |var: &str| std::env::var_os(var).map(PathBuf::from);
    if let (Some(overlayd), Some(xdeadm)) = (from_env("OVERLAYD_BIN"), from_env("XDEADM_BIN")) {
        let bins = Bins { overlayd, xdeadm };
        check_exists(&bins)?;
        return Ok(bins);
    }
    let profile_dir = profile_dir()?;
    let release = profile_dir.file_name().is_some_and(|n| n == "release");
    let target_dir = profile_dir
        .parent()
        .ok_or_else(|| Error::new(format!("{} has no parent", profile_dir.display())))?;
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .ok_or_else(|| Error::new("the e2e crate has no parent directory"))?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let mut build = Cmd::new(cargo)
        .args([
            "build",
            "--quiet",
            "-p",
            "overlayd",
            "-p",
            "xdeadm",
            "--bins",
            "--manifest-path",
        ])
        .arg(workspace.join("Cargo.toml").display().to_string())
        .env("CARGO_TARGET_DIR", target_dir.display().to_string())
        // A cold build of the daemon's dependencies on a busy 2-core machine.
        .timeout(Duration::from_secs(1200));
    if release {
        build = build.arg("--release");
    }
    // What cargo set for the running test (`CARGO_PKG_NAME=e2e`, `CARGO_MANIFEST_DIR`,
    // ...) is not for this build: build scripts that declare
    // `rerun-if-env-changed` on such names (ring's does, on `CARGO_PKG_NAME` and
    // `CARGO_MANIFEST_DIR`) would see them change, and ring, rustls and everything
    // above them, the daemon included, would be rebuilt in every test process and
    // again by the next plain `cargo build` (minutes each on a 2-core machine).
    // The user's own settings (`CARGO_HOME`, `CARGO_BUILD_JOBS`, ...) stay.
    const SET_FOR_THE_TEST: [&str; 7] = [
        "CARGO_PKG_",
        "CARGO_MANIFEST_",
        "CARGO_CRATE_",
        "CARGO_BIN_",
        "CARGO_PRIMARY_PACKAGE",
        "CARGO_TARGET_TMPDIR",
        "CARGO_RUSTC_CURRENT_DIR",
    ];
    for (key, _) in std::env::vars_os() {
        if let Some(key) = key.to_str() {
            if SET_FOR_THE_TEST.iter().any(|p| key.starts_with(p)) {
                build = build.env_remove(key);
            }
        }
    }
    build.run().context("building overlayd and xdeadm")?;
    let bins = Bins {
        overlayd: profile_dir.join("overlayd"),
        xdeadm: profile_dir.join("xdeadm"),
    };
    check_exists(&bins)?;
    Ok(bins)
}

/// `.../target/<profile>` of the running test executable (`.../<profile>/deps/<exe>`),
/// or of a binary of this crate (`.../<profile>/<exe>`).
fn profile_dir() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("locating the test executable")?;
    let dir = exe
        .parent()
        .ok_or_else(|| Error::new(format!("{} has no parent", exe.display())))?;
    Ok(if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent().unwrap_or(dir).to_path_buf()
    } else {
        dir.to_path_buf()
    })
}

fn check_exists(bins: &Bins) -> Result<()> {
    for p in [&bins.overlayd, &bins.xdeadm] {
        if !p.is_file() {
            return Err(Error::new(format!("binary {} does not exist", p.display())));
        }
    }
    Ok(())
}
