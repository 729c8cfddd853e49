//! The daemon's underlay edge: for each underlay interface, the link facts, the
//! attached XDP steering program and one AF_XDP socket per receive queue, all on one
//! shared UMEM; plus the next hops the engine asks when it encapsulates (resolved
//! off the worker thread, see [`crate::neighbours`]).

use crate::config::{DaemonConfig, XdpMode};
use crate::neighbours::NextHops;
use dpio::netlink::Netlink;
use dpio::xdp::{AttachMode, SteeringProgram};
use dpio::xsk::{BindMode, TxError, Umem, XskConfig, XskSocket, XskStats};
use serde::Serialize;
use std::collections::BTreeMap;
use std::net::Ipv6Addr;

/// One underlay interface.
pub struct UnderlayLink {
    pub name: String,
    pub ifindex: u32,
    pub mtu: u32,
    /// One socket per rx queue, in queue order. Transmission uses the first.
    pub sockets: Vec<XskSocket>,
    /// Kept for its lifetime: dropping it detaches the program.
    program: SteeringProgram,
}

/// All underlay interfaces and what serves them.
pub struct Underlay {
    pub links: Vec<UnderlayLink>,
    pub next_hops: NextHops,
    /// Kept alive while sockets use it.
    _umem: Umem,
}

/// How many rx queues an interface has, from sysfs (`queues/rx-N`). Every queue needs
/// its own AF_XDP socket, or frames hashed to it bypass the datapath.
fn rx_queue_count(ifname: &str) -> Result<u32, String> {
    let dir = format!("/sys/class/net/{ifname}/queues");
    let n = std::fs::read_dir(&dir)
        .map_err(|e| format!("cannot list {dir}: {e}"))?
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("rx-"))
        .count();
    u32::try_from(n.max(1)).map_err(|_| format!("{dir}: {n} rx queues"))
}

impl Underlay {
    /// Reads each interface's facts, attaches the steering program and binds the
    /// sockets. Everything attached so far is released again if a later step fails.
    pub fn open(cfg: &DaemonConfig) -> Result<Underlay, String> {
        let mut nl = Netlink::open().map_err(|e| format!("netlink: {e}"))?;
        let xsk_cfg = XskConfig {
            rx_frames: 2048,
            tx_frames: 2048,
            ring_size: 2048,
            mode: BindMode::Copy,
        };
        let mut plan = Vec::new();
        let mut chunks = 0u32;
        for name in &cfg.underlay {
            let link = nl
                .link_by_name(name)
                .map_err(|e| format!("underlay interface {name:?}: {e}"))?;
            let queues = rx_queue_count(name)?;
            chunks = chunks.saturating_add(queues * (xsk_cfg.rx_frames + xsk_cfg.tx_frames));
            plan.push((link, queues));
        }
        dpio::raise_memlock_limit();
        let umem = Umem::new(chunks).map_err(|e| format!("AF_XDP UMEM of {chunks} chunks: {e}"))?;
        let mode = match cfg.xdp_mode {
            XdpMode::Native => AttachMode::Native,
            XdpMode::Skb => AttachMode::Skb,
        };
        let mut links = Vec::new();
        for (link, queues) in plan {
            let mut program = SteeringProgram::attach(&link.name, &[cfg.underlay_addr], mode)
                .map_err(|e| e.to_string())?;
            let mut sockets = Vec::new();
            for q in 0..queues {
                let s = XskSocket::new(&umem, link.ifindex, q, xsk_cfg)
                    .map_err(|e| format!("AF_XDP socket on {} queue {q}: {e}", link.name))?;
                program.register_socket(q, &s).map_err(|e| e.to_string())?;
                sockets.push(s);
            }
            tracing::info!(
                iface = %link.name, ifindex = link.ifindex, mtu = link.mtu, queues,
                mode = %cfg.xdp_mode, "underlay attached"
            );
            links.push(UnderlayLink {
                name: link.name,
                ifindex: link.ifindex,
                mtu: link.mtu,
                sockets,
                program,
            });
        }
        Ok(Underlay {
            links,
            next_hops: NextHops::start()?,
            _umem: umem,
        })
    }

    /// The MTU the engine plans with: the smallest of the underlay links, since a flow
    /// may leave through any of them.
    pub fn mtu(&self) -> u32 {
        self.links.iter().map(|l| l.mtu).min().unwrap_or(0)
    }

    /// Queues a frame on the link `ifindex`; a full ring gets one kick and one retry.
    pub fn send(&mut self, ifindex: u32, frame: &[u8]) -> Result<(), SendError> {
        let link = self
            .links
            .iter_mut()
            .find(|l| l.ifindex == ifindex)
            .ok_or(SendError::NoSuchLink)?;
        let sock = link.sockets.first_mut().ok_or(SendError::NoSuchLink)?;
        match sock.send(frame) {
            Err(TxError::Full) => {
                sock.kick();
                sock.send(frame).map_err(SendError::Tx)
            }
            r => r.map_err(SendError::Tx),
        }
    }

    /// Tells the kernel about queued frames on every link.
    pub fn kick(&mut self) {
        for l in &mut self.links {
            if let Some(s) = l.sockets.first_mut() {
                s.kick();
            }
        }
    }

    /// XDP and AF_XDP counters of every link, for `stats`.
    pub fn stats(&mut self) -> Vec<LinkStats> {
        self.links
            .iter_mut()
            .map(|l| LinkStats {
                name: l.name.clone(),
                ifindex: l.ifindex,
                mtu: l.mtu,
                xdp: match l.program.counters() {
                    Ok(c) => c
                        .into_iter()
                        .map(|(k, v)| (k.name().to_string(), v))
                        .collect(),
                    Err(e) => BTreeMap::from([(format!("unreadable: {e}"), 0)]),
                },
                xsk: l.sockets.iter().map(XskCounters::read).collect(),
            })
            .collect()
    }
}

/// Why a frame could not be queued for the underlay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendError {
    /// The engine named an interface we do not serve (a route through a link that
    /// is not an underlay link).
    NoSuchLink,
    Tx(TxError),
}

/// Counters of one underlay link.
#[derive(Debug, Serialize)]
pub struct LinkStats {
    pub name: String,
    pub ifindex: u32,
    pub mtu: u32,
    /// XDP program counters by name.
    pub xdp: BTreeMap<String, u64>,
    /// One entry per queue.
    pub xsk: Vec<XskCounters>,
}

/// One socket's counters with the queue it belongs to; the counters are dpio's own
/// type, flattened, so a counter added there shows up here without a copy.
#[derive(Debug, Serialize)]
pub struct XskCounters {
    pub queue: u32,
    #[serde(flatten)]
    pub stats: XskStats,
    /// Set when the kernel's part could not be read (the kernel counters are then 0).
    pub error: Option<String>,
}

impl XskCounters {
    fn read(s: &XskSocket) -> XskCounters {
        let (stats, error) = match s.stats() {
            Ok(st) => (st, None),
            Err(e) => (XskStats::default(), Some(e.to_string())),
        };
        XskCounters {
            queue: s.queue(),
            stats,
            error,
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
    let hex: String = addr.octets().iter().map(|b| format!("{b:02x}")).collect();
    if !text.lines().any(|l| l.starts_with(&hex)) {
        tracing::warn!(%addr, "underlay address is not configured on any interface");
    }
}
