//! Edge I/O for the datapath: the only crate that talks to the kernel about
//! packets.
//!
//! - [`xdp`]: loads and attaches the steering XDP program (`xdp-prog`) with aya.
//! - [`xsk`]: AF_XDP sockets on a shared UMEM (own thin libc layer).
//! - [`tap`]: persistent tap ports with `virtio_net_hdr` offloads for guests.
//! - [`tunnel_tx`]: the underlay's tunnel tap, which takes UDP-tunnel GSO
//!   super-frames for the kernel to segment (Linux 6.17+).
//! - [`vhost`]: vhost-user ports, a VM's virtqueues in shared memory.
//! - [`packet`]: `AF_PACKET` sockets with `PACKET_VNET_HDR` on an interface a
//!   hypervisor owns (`create-xde --attach`).
//! - [`guest`]: either of those, as the worker serves a port.
//! - [`netlink`]: link facts, IPv6 neighbour and route lookups, the fast-path
//!   [`netlink::NeighbourCache`] (slow path: the daemon runs it on its own thread).
//! - [`netns`]: running a closure inside a named network namespace.
//! - [`poll`]: epoll and eventfd, where poll-mode workers learn what is ready and
//!   sleep when nothing is.
//! - [`probe`]: sized, unfragmented ICMPv6 echo probes of the underlay path MTU.
//!
//! Every `unsafe` block is a syscall or a read/write of kernel-shared memory
//! and says why it holds in a `// SAFETY:` comment.

// The one crate that talks to the kernel about packets: its syscalls without a safe
// wrapper are here, each `unsafe` block with its `// SAFETY:` line.
#![allow(unsafe_code)]

pub mod channels;
pub mod cpu;
pub mod guest;
pub mod netlink;
pub mod netns;
pub mod packet;
pub mod poll;
pub mod probe;
pub mod tap;
pub mod tunnel_tx;
pub mod vhost;
pub mod xdp;
pub mod xsk;

#[cfg(test)]
mod testnet;

/// Raises `RLIMIT_MEMLOCK` as far as allowed. UMEM registration and (on
/// kernels without memcg accounting of BPF memory) maps are charged against
/// it, and the default 8 MiB is smaller than one UMEM. Without
/// `CAP_SYS_RESOURCE` (containers) only the soft limit can go up to the hard
/// one; that is not an error, because `CAP_IPC_LOCK` exempts UMEM pages from
/// the limit and kernels >= 5.11 charge BPF maps to the memory cgroup.
pub fn raise_memlock_limit() {
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit reads a valid rlimit struct.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) } == 0 {
        return;
    }
    let mut cur = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes a valid rlimit struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut cur) } == 0 {
        cur.rlim_cur = cur.rlim_max;
        // SAFETY: as above.
        unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &cur) };
        tracing::debug!(
            limit = cur.rlim_max,
            "RLIMIT_MEMLOCK capped by the hard limit"
        );
    }
}
