//! What a port's tap queue dropped: frames its guest sent faster than the worker
//! read them. The kernel drops them before the datapath sees them and counts them on
//! the tap (`tx_dropped`, from the guest's side); `stats` reports that count per port
//! so an operator sees where a guest's packets were lost (a 64-byte UDP flood loses
//! most of its packets here, docs/benchmarks.md).
//!
//! Read when stats are asked for, never on a worker: a tap in a guest's network
//! namespace is reached by a [`NetnsVisitor`], one thread that enters it and comes
//! back (a thread per request would cost a spawn and may grow the allocator's
//! arenas every time).

use dpio::netlink::Netlink;
use dpio::netns::NetnsVisitor;
use std::io;
use std::sync::{Arc, OnceLock};

/// The visitor, started on first use; a failed start is kept (and shared by every
/// later read) rather than tried again on every `stats`.
pub(super) type VisitorCell = OnceLock<Result<NetnsVisitor, Arc<io::Error>>>;

/// Why a tap's `tx_dropped` cannot be read (the tap or namespace is gone).
#[derive(Debug, thiserror::Error)]
pub enum TapQueueError {
    #[error("cannot start the netns visitor: {0}")]
    Visitor(Arc<io::Error>),
    #[error("netns {netns:?}: {error}")]
    Netns { netns: String, error: io::Error },
    #[error("netlink: {0}")]
    Netlink(io::Error),
    #[error("tap {name:?}: {error}")]
    Tap { name: String, error: io::Error },
}

/// The `tx_dropped` of tap `name` in network namespace `netns` (the daemon's own
/// when `None`; another one visited by `visitor`, started on first use), or why it
/// cannot be read.
pub fn guest_tx_dropped(
    visitor: &VisitorCell,
    name: &str,
    netns: Option<&str>,
) -> Result<u64, TapQueueError> {
    let Some(ns) = netns else {
        return read(name);
    };
    let v = visitor
        .get_or_init(|| NetnsVisitor::start().map_err(Arc::new))
        .as_ref()
        .map_err(|e| TapQueueError::Visitor(e.clone()))?;
    let name = name.to_string();
    v.run(ns, move || read(&name))
        .map_err(|error| TapQueueError::Netns {
            netns: ns.to_string(),
            error,
        })?
}

/// `tx_dropped` of tap `name` in the calling thread's namespace.
fn read(name: &str) -> Result<u64, TapQueueError> {
    let mut nl = Netlink::open().map_err(TapQueueError::Netlink)?;
    let link = nl.link_by_name(name).map_err(|error| TapQueueError::Tap {
        name: name.to_string(),
        error,
    })?;
    Ok(link.tx_dropped)
}
