//! The daemon's underlay edge: for each underlay interface, the link facts, the
//! attached XDP steering program and one AF_XDP socket per receive queue, all on one
//! shared UMEM, and with `--underlay-gso` its tunnel tap (`dpio::tunnel_tx`), one
//! queue per worker, for guest TSO buffers as UDP-tunnel GSO super-frames. The
//! sockets are handed out to the workers ([`Underlay::take_queues`]: queue `i` to
//! worker `i % workers`); each worker receives and transmits on its own
//! sockets only ([`UnderlayQueues`]). The links and their programs stay with the
//! daemon's main thread, which reads their counters for `stats`.
//!
//! The links are followed at run time by the daemon ([`crate::daemon::watch`]).
//!
//! Also here: the next hops on the underlay ([`neighbours`]) and the probe of the
//! path to every peer sled ([`pathcheck`]).

pub mod neighbours;
pub mod pathcheck;
pub mod paths_down;
pub mod pathwatch;
pub mod queues;

use crate::config::{DaemonConfig, UnderlayGso, XdpMode};
use dpio::netlink::{LinkInfo, Netlink};
use dpio::tunnel_tx::TunnelTap;
use dpio::xdp::{AttachMode, SteeringProgram};
use dpio::xsk::{BindMode, Umem, XskConfig, XskMode, XskSocket};
use queues::{LinkStats, UnderlayQueues};
use std::collections::BTreeMap;
use std::io;
use std::net::Ipv6Addr;
use wire::MacAddr;

/// Room in a frame beyond the link MTU: the Ethernet header and a VLAN tag.
pub const FRAME_OVERHEAD: usize = 18;

/// Why the underlay links could not be attached (or followed): each names the
/// interface, and the queue or size that failed.
#[derive(Debug, thiserror::Error)]
pub enum UnderlayError {
    #[error("cannot list /sys/class/net/{iface}/queues: {error}")]
    ListQueues { iface: String, error: io::Error },
    #[error("/sys/class/net/{iface}/queues: {count} rx queues")]
    QueueCount { iface: String, count: usize },
    /// `ethtool -L` refused (dpio's error names the interface and the fix).
    #[error("{error}")]
    Channels {
        iface: String,
        error: dpio::channels::QueuesError,
    },
    #[error(
        "underlay interface {iface:?} has {queues} rx queues after asking for {need} (one per worker)"
    )]
    TooFewQueues {
        iface: String,
        queues: u32,
        need: u32,
    },
    #[error("netlink: {0}")]
    Netlink(io::Error),
    #[error("underlay link notifications: {0}")]
    Notifications(io::Error),
    #[error("underlay interface {iface:?}: {error}")]
    Link { iface: String, error: io::Error },
    #[error("AF_XDP socket sizes for MTU {mtu}: {error}")]
    SocketSizes { mtu: usize, error: io::Error },
    #[error("AF_XDP UMEM of {chunks} chunks: {error}")]
    Umem { chunks: u32, error: io::Error },
    /// The steering program would not load, attach or take a socket (dpio's
    /// error names the interface).
    #[error("{error}")]
    Program { iface: String, error: io::Error },
    #[error("AF_XDP socket on {iface} queue {queue}: {error}")]
    Socket {
        iface: String,
        queue: u32,
        error: io::Error,
    },
    #[error("--underlay-gso on: {0}")]
    TunnelGso(TunnelTapError),
}

/// A link's tunnel tap that would not open: fatal with `--underlay-gso on`, a
/// warning with `auto`.
#[derive(Debug, thiserror::Error)]
#[error("underlay {iface:?}: {error}")]
pub struct TunnelTapError {
    iface: String,
    error: io::Error,
}

/// One underlay interface.
pub struct UnderlayLink {
    pub name: String,
    pub ifindex: u32,
    pub mtu: u32,
    pub mac: Option<MacAddr>,
    /// Receive queues, one AF_XDP socket each.
    pub queues: u32,
    /// Kept for its lifetime: dropping it detaches the program.
    program: SteeringProgram,
}

/// All underlay interfaces and what serves them.
pub struct Underlay {
    pub links: Vec<UnderlayLink>,
    /// Every link's sockets, in link then queue order, until handed to workers.
    sockets: Vec<XskSocket>,
    /// The longest frame a transmit slot holds: a link MTU beyond it needs new
    /// sockets.
    pub(crate) max_tx_frame: usize,
    /// Every link's tunnel tap, in link order, when guest TSO buffers leave as
    /// UDP-tunnel GSO super-frames (`--underlay-gso`); empty otherwise.
    tunnels: Vec<TunnelTap>,
    /// Kept alive while sockets use it (`None` with no link).
    _umem: Option<Umem>,
}

/// How many rx queues an interface has, from sysfs (`queues/rx-N`). Every queue needs
/// its own AF_XDP socket, or frames hashed to it bypass the datapath.
pub(crate) fn rx_queue_count(ifname: &str) -> Result<u32, UnderlayError> {
    let n = std::fs::read_dir(format!("/sys/class/net/{ifname}/queues"))
        .map_err(|error| UnderlayError::ListQueues {
            iface: ifname.to_string(),
            error,
        })?
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("rx-"))
        .count();
    u32::try_from(n.max(1)).map_err(|_| UnderlayError::QueueCount {
        iface: ifname.to_string(),
        count: n,
    })
}

/// Gives link `name` at least one rx queue per worker; returns how many it has.
fn queues_for(name: &str, workers: usize) -> Result<u32, UnderlayError> {
    let queues = rx_queue_count(name)?;
    let need = u32::try_from(workers).unwrap_or(u32::MAX);
    if queues >= need {
        return Ok(queues);
    }
    dpio::channels::ensure_queues(name, need).map_err(|error| UnderlayError::Channels {
        iface: name.to_string(),
        error,
    })?;
    let queues = rx_queue_count(name)?;
    if queues < need {
        return Err(UnderlayError::TooFewQueues {
            iface: name.to_string(),
            queues,
            need,
        });
    }
    Ok(queues)
}

impl Underlay {
    /// Reads each interface's facts, gives it at least one rx queue per worker,
    /// attaches the steering program and binds the sockets. Every configured link
    /// must exist. Everything attached so far is released again if a later step
    /// fails.
    pub fn open(cfg: &DaemonConfig, workers: usize) -> Result<Underlay, UnderlayError> {
        let mut nl = Netlink::open().map_err(UnderlayError::Netlink)?;
        let mut links = Vec::new();
        for name in &cfg.underlay {
            let link = nl.link_by_name(name).map_err(|error| UnderlayError::Link {
                iface: name.clone(),
                error,
            })?;
            links.push(link);
        }
        Self::attach(cfg, links, workers)
    }

    /// Nothing attached: what the daemon holds while it re-attaches.
    pub(crate) fn empty() -> Underlay {
        Underlay {
            links: Vec::new(),
            sockets: Vec::new(),
            max_tx_frame: 0,
            tunnels: Vec::new(),
            _umem: None,
        }
    }

    /// Attaches to `links`, sized for the largest MTU among them.
    pub(crate) fn attach(
        cfg: &DaemonConfig,
        links: Vec<LinkInfo>,
        workers: usize,
    ) -> Result<Underlay, UnderlayError> {
        if links.is_empty() {
            return Ok(Underlay::empty());
        }
        // Transmit slots hold the longest frame any link carries: its MTU, the
        // Ethernet header and room for a VLAN tag.
        let largest = links.iter().map(|l| l.mtu as usize).max().unwrap_or(0);
        let xsk_cfg = XskConfig {
            rx_frames: 2048,
            tx_slots: 1024,
            max_tx_frame: largest + FRAME_OVERHEAD,
            ring_size: 4096,
            mode: BindMode::Auto,
        };
        let per_socket = xsk_cfg
            .chunks()
            .map_err(|error| UnderlayError::SocketSizes {
                mtu: largest,
                error,
            })?;
        let mut plan = Vec::new();
        let mut chunks = 0u32;
        for link in links {
            let queues = queues_for(&link.name, workers)?;
            chunks = chunks.saturating_add(queues.saturating_mul(per_socket));
            plan.push((link, queues));
        }
        dpio::raise_memlock_limit();
        let umem = Umem::new(chunks).map_err(|error| UnderlayError::Umem { chunks, error })?;
        let attach = match cfg.xdp_mode {
            XdpMode::Native => AttachMode::Native,
            XdpMode::Skb => AttachMode::Skb,
        };
        let mut links = Vec::new();
        let mut all_sockets = Vec::new();
        let mut mode = XskMode::Copy;
        for (link, queues) in plan {
            let program_error = |error| UnderlayError::Program {
                iface: link.name.clone(),
                error,
            };
            let mut program = SteeringProgram::attach(&link.name, &[cfg.underlay_addr], attach)
                .map_err(program_error)?;
            for q in 0..queues {
                let s = XskSocket::new(&umem, link.ifindex, q, xsk_cfg).map_err(|error| {
                    UnderlayError::Socket {
                        iface: link.name.clone(),
                        queue: q,
                        error,
                    }
                })?;
                program.register_socket(q, &s).map_err(program_error)?;
                mode = s.mode();
                all_sockets.push(s);
            }
            tracing::info!(
                iface = %link.name, ifindex = link.ifindex, mtu = link.mtu, queues,
                xdp = %cfg.xdp_mode, af_xdp = %mode, "underlay attached"
            );
            links.push(UnderlayLink {
                name: link.name,
                ifindex: link.ifindex,
                mtu: link.mtu,
                mac: link.mac,
                queues,
                program,
            });
        }
        let tunnels = open_tunnels(cfg.underlay_gso, &links, workers)?;
        Ok(Underlay {
            links,
            sockets: all_sockets,
            max_tx_frame: xsk_cfg.max_tx_frame,
            tunnels,
            _umem: Some(umem),
        })
    }

    /// Whether guest TSO buffers leave as UDP-tunnel GSO super-frames through the
    /// links' tunnel taps (what the engines are configured with).
    pub fn tunnel_gso(&self) -> bool {
        !self.tunnels.is_empty()
    }

    /// Hands the sockets to `workers` workers: queue `i` of every link to worker
    /// `i % workers`. `open` made every link have at least one queue per worker,
    /// so every worker can transmit on every link.
    pub fn take_queues(&mut self, workers: usize) -> Vec<UnderlayQueues> {
        let workers = workers.max(1);
        let mut out: Vec<UnderlayQueues> =
            (0..workers).map(|_| UnderlayQueues::default()).collect();
        for s in self.sockets.drain(..) {
            let w = s.queue() as usize % workers;
            if let Some(q) = out.get_mut(w) {
                q.sockets.push(s);
            }
        }
        // `open_tunnels` gave every tap one queue per worker.
        for tap in &mut self.tunnels {
            for (q, t) in out.iter_mut().zip(tap.take_queues()) {
                q.tunnels.push(t);
            }
        }
        out
    }

    /// The MTU the engine plans with: the smallest of the underlay links, since a flow
    /// may leave through any of them.
    pub fn mtu(&self) -> u32 {
        self.links.iter().map(|l| l.mtu).min().unwrap_or(0)
    }

    /// Link facts and XDP program counters of every link, for `stats` (the
    /// sockets' counters come from the workers that own them).
    pub fn stats(&mut self) -> Vec<LinkStats> {
        let tx_path = if self.tunnels.is_empty() {
            TX_PATH_AF_XDP
        } else {
            TX_PATH_TUNNEL_GSO
        };
        let tunnels = &mut self.tunnels;
        self.links
            .iter_mut()
            .map(|l| {
                let tunnel = tunnels.iter_mut().find(|t| t.link() == l.name);
                LinkStats {
                    name: l.name.clone(),
                    ifindex: l.ifindex,
                    mtu: l.mtu,
                    queues: l.queues,
                    tx_path,
                    tunnel_tap: tunnel.as_ref().map(|t| t.name().to_string()),
                    tunnel_redirect_drops: tunnel.and_then(|t| match t.redirect_drops() {
                        Ok(n) => Some(n),
                        Err(e) => {
                            tracing::debug!(error = %e, "tunnel redirect drops unreadable");
                            None
                        }
                    }),
                    xdp: match l.program.counters() {
                        Ok(c) => c
                            .into_iter()
                            .map(|(k, v)| (k.name().to_string(), v))
                            .collect(),
                        Err(e) => BTreeMap::from([(format!("unreadable: {e}"), 0)]),
                    },
                }
            })
            .collect()
    }

    /// What is attached to the link named `name`.
    pub(crate) fn attached(&self, name: &str) -> Option<LinkFacts> {
        self.links
            .iter()
            .find(|l| l.name == name)
            .map(|l| LinkFacts {
                ifindex: l.ifindex,
                mtu: l.mtu,
                queues: l.queues,
            })
    }
}

/// What the datapath depends on of one underlay link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LinkFacts {
    pub(crate) ifindex: u32,
    pub(crate) mtu: u32,
    pub(crate) queues: u32,
}

/// `stats`' `tx_path` of a link whose guest TSO buffers leave as super-frames
/// through its tunnel tap.
pub const TX_PATH_TUNNEL_GSO: &str = "tunnel-gso";

/// `stats`' `tx_path` of a link where the datapath segments and AF_XDP sends all.
pub const TX_PATH_AF_XDP: &str = "af-xdp";

/// Opens every link's tunnel tap with one queue per worker, as `mode` asks: none
/// for `off`; all or an error naming the reason for `on`; for `auto` all, or none
/// with one warning saying why (the kernel predates tunnel GSO on taps, or a step
/// failed).
fn open_tunnels(
    mode: UnderlayGso,
    links: &[UnderlayLink],
    workers: usize,
) -> Result<Vec<TunnelTap>, UnderlayError> {
    if mode == UnderlayGso::Off {
        return Ok(Vec::new());
    }
    let opened: Result<Vec<TunnelTap>, TunnelTapError> = links
        .iter()
        .map(|l| {
            TunnelTap::open(&l.name, l.ifindex, workers.max(1)).map_err(|error| TunnelTapError {
                iface: l.name.clone(),
                error,
            })
        })
        .collect();
    match (opened, mode) {
        (Ok(t), _) => Ok(t),
        (Err(e), UnderlayGso::On) => Err(UnderlayError::TunnelGso(e)),
        (Err(e), _) => {
            tracing::warn!(
                reason = %e,
                "underlay tunnel GSO not used (--underlay-gso auto): the datapath \
                 segments guest TSO buffers and AF_XDP sends the frames"
            );
            Ok(Vec::new())
        }
    }
}

/// The underlay address the sled uses must be configured on an underlay link, or the
/// kernel will not answer NDP for it and peers cannot reach us. A warning, not an
/// error: the address may be added after the daemon starts.
pub fn warn_if_address_missing(addr: Ipv6Addr) {
    let Ok(text) = std::fs::read_to_string("/proc/net/if_inet6") else {
        return;
    };
    let hex = format!("{:032x}", u128::from(addr));
    if !text.lines().any(|l| l.starts_with(&hex)) {
        tracing::warn!(%addr, "underlay address is not configured on any interface");
    }
}
