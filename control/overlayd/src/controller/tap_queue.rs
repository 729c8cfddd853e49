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
use std::sync::OnceLock;

/// The `tx_dropped` of tap `name` in network namespace `netns` (the daemon's own
/// when `None`; another one visited by `visitor`, started on first use), or why it
/// cannot be read (the tap or namespace is gone).
pub fn guest_tx_dropped(
    visitor: &OnceLock<Result<NetnsVisitor, String>>,
    name: &str,
    netns: Option<&str>,
) -> Result<u64, String> {
    let Some(ns) = netns else {
        return read(name);
    };
    let v = visitor
        .get_or_init(|| {
            NetnsVisitor::start().map_err(|e| format!("cannot start the netns visitor: {e}"))
        })
        .as_ref()
        .map_err(String::clone)?;
    let name = name.to_string();
    v.run(ns, move || read(&name))
        .map_err(|e| format!("netns {ns:?}: {e}"))?
}

/// `tx_dropped` of tap `name` in the calling thread's namespace.
fn read(name: &str) -> Result<u64, String> {
    let mut nl = Netlink::open().map_err(|e| format!("netlink: {e}"))?;
    let link = nl
        .link_by_name(name)
        .map_err(|e| format!("tap {name:?}: {e}"))?;
    Ok(link.tx_dropped)
}
