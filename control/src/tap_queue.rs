//! What a port's tap queue dropped: frames its guest sent faster than the worker
//! read them. The kernel drops them before the datapath sees them and counts them on
//! the tap (`tx_dropped`, from the guest's side); `stats` reports that count per port
//! so an operator sees where a guest's packets were lost (a 64-byte UDP flood loses
//! most of its packets here, docs/benchmarks.md).
//!
//! Read on the controller's thread when stats are asked for, never on a worker: a
//! tap in a guest's network namespace is reached from a thread that enters it.

use dpio::netlink::Netlink;
use dpio::netns::run_in_netns;

/// The `tx_dropped` of tap `name` in network namespace `netns` (the daemon's own
/// when `None`), or why it cannot be read (the tap or namespace is gone).
pub fn guest_tx_dropped(name: &str, netns: Option<&str>) -> Result<u64, String> {
    let read = {
        let name = name.to_string();
        move || -> Result<u64, String> {
            let mut nl = Netlink::open().map_err(|e| format!("netlink: {e}"))?;
            let link = nl
                .link_by_name(&name)
                .map_err(|e| format!("tap {name:?}: {e}"))?;
            Ok(link.tx_dropped)
        }
    };
    match netns {
        None => read(),
        Some(ns) => run_in_netns(ns, read).map_err(|e| format!("netns {ns:?}: {e}"))?,
    }
}
