//! End-to-end test harness: a rack of sleds built from network namespaces on this
//! machine, one `overlayd` per sled, guests behind the daemons' tap ports.
//!
//! Layout (mirrors a real rack, see `/docs/design.md`):
//! - a "switch" namespace holding a Linux bridge (MTU 9000) — the top-of-rack switch;
//! - one namespace per sled whose underlay interface `ul0` is a veth (MTU 9000) with its
//!   peer on the bridge, addressed `fd00:99::N/64`;
//! - one namespace per guest holding the tap port that the sled's daemon created and
//!   moved there (`xdeadm create-xde ... --netns`).
//!
//! Every namespace, process and temporary file is owned by a guard that removes it on
//! drop, also when a test panics, and every name carries the test process id and a
//! counter so tests can run in parallel and after a crashed run.
//!
//! Modules: [`rack`] (switch, sleds, daemons), [`guest`] (ports and guest OS
//! configuration), [`standard`] (the two-sled, four-guest rack of the tests and the
//! demo), [`capture`] (underlay captures decoded by tshark), [`xfer`] (checked TCP
//! transfers), [`stats`] (reading `xdeadm --json` output), [`cmd`], [`netns`],
//! [`poll`], [`daemon`], [`bins`], [`boundary`] (the boundary-services switch and the
//! internet behind it), [`vm`] (QEMU virtual machines as guests, with a real guest
//! kernel), [`testpmd`] (DPDK's testpmd as a vhost-user guest without a VM); [`bench`] is the side-by-side benchmark against
//! kernel VXLAN, OVS and plain veth built on the same topology (`bench-e2e`).
//!
//! Hostile input and reliability (docs/reliability.md): [`inject`] (raw frames
//! through AF_PACKET, the rogue host on the switch), [`frames`] (frames built byte by
//! byte, the XDP program's model), [`hostile`] (the catalogue of bad frames and the
//! counter each must hit), [`watch`] (captures proving where they went), [`pcap`],
//! [`counters`] (stats snapshots and their differences), [`soak`] (the long run
//! under mixed traffic, `soak`).
//!
//! The fleet (docs/fleet.md): [`etcd`] (a TLS etcd cluster on the rack, with a
//! role per sled, and the faults the fleet tests inflict on it), [`fleet`] (a rack
//! whose daemons follow that cluster, its writer, and the sleds' view of it).
//!
//! Binaries: `overlayd` and `xdeadm` are found through `OVERLAYD_BIN`/`XDEADM_BIN`,
//! or else built once per test process with `cargo build -p overlayd -p xdeadm` into the same
//! target directory and profile as the running test (see [`bins`]).

// The test harness makes raw syscalls (namespaces, signals, sockets) the tests
// need and std does not wrap; each `unsafe` block carries its `// SAFETY:` line.
#![allow(unsafe_code)]

pub mod bench;
pub mod bins;
pub mod boundary;
pub mod capture;
pub mod cmd;
pub mod counters;
pub mod daemon;
pub mod etcd;
pub mod fleet;
pub mod frames;
pub mod guest;
pub mod hostile;
pub mod inject;
pub mod netns;
pub mod pcap;
pub mod poll;
pub mod rack;
pub mod soak;
pub mod standard;
pub mod stats;
pub mod testpmd;
pub mod vm;
pub mod watch;
pub mod xfer;

pub use cmd::Cmd;
pub use guest::{Guest, GuestSpec};
pub use netns::Netns;
pub use poll::poll_until;
pub use rack::{Rack, RackSpec, Sled};

use std::fmt;

/// A harness failure: a message that names what was attempted and why it failed
/// (for commands: the command line, exit status and stderr).
#[derive(Clone, PartialEq, Eq)]
pub struct Error(pub String);

impl Error {
    pub fn new(msg: impl Into<String>) -> Error {
        Error(msg.into())
    }

    /// Prefixes the message with what the caller was doing.
    pub fn context(self, what: impl fmt::Display) -> Error {
        Error(format!("{what}: {}", self.0))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// `Debug` prints the plain message: a test returning `Err` shows it readably.
impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Error {
        Error(e.to_string())
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Adds context to any `Result` whose error converts into [`Error`].
pub trait Context<T> {
    fn context(self, what: impl fmt::Display) -> Result<T>;
    fn with_context<D: fmt::Display>(self, what: impl FnOnce() -> D) -> Result<T>;
}

impl<T, E: Into<Error>> Context<T> for std::result::Result<T, E> {
    fn context(self, what: impl fmt::Display) -> Result<T> {
        self.map_err(|e| e.into().context(what))
    }
    fn with_context<D: fmt::Display>(self, what: impl FnOnce() -> D) -> Result<T> {
        self.map_err(|e| e.into().context(what()))
    }
}

/// Fails unless running as root: every test here creates namespaces and devices.
pub fn require_root() -> Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if euid == 0 {
        Ok(())
    } else {
        Err(Error::new(format!(
            "end-to-end tests need root (network namespaces, taps, XDP); euid is {euid}"
        )))
    }
}
