//! The daemon's underlay edge: for each underlay interface, the link facts, the
//! attached XDP steering program and one AF_XDP socket per receive queue, all on one
//! shared UMEM; plus the kernel-neighbour-backed next-hop cache the engine asks when
//! it encapsulates.

use crate::config::{DaemonConfig, XdpMode};
use dpio::netlink::{NeighbourCache, Netlink};
use dpio::xdp::{AttachMode, SteeringProgram};
use dpio::xsk::{BindMode, TxError, Umem, XskConfig, XskSocket};
use serde::Serialize;
use std::collections::BTreeMap;
use std::net::Ipv6Addr;
use std::time::{Duration, Instant};

/// How long a resolved next hop is trusted before it is re-read from the kernel
/// (MAC and route changes show up within this time).
const NEIGHBOUR_MAX_AGE: Duration = Duration::from_secs(5);

/// Shortest time between two neighbour refreshes.
const NEIGHBOUR_MIN_INTERVAL: Duration = Duration::from_millis(20);

/// Refreshes an unresolved destination is retried for (at least 20 ms apart, so
/// about as long as the kernel's own NDP attempts).
const UNRESOLVED_RETRIES: u32 = 150;

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
    pub neighbours: NeighbourCache,
    /// When a refresh last ran: bounds netlink traffic while a destination stays
    /// unresolved and every batch records a miss for it.
    last_refresh: Option<Instant>,
    /// Destinations being resolved, with how many refreshes have tried them.
    pending: Vec<(Ipv6Addr, u32)>,
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
            neighbours: NeighbourCache::new(NEIGHBOUR_MAX_AGE)
                .map_err(|e| format!("neighbour cache: {e}"))?,
            last_refresh: None,
            pending: Vec::new(),
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

    /// Re-reads stale or missing next hops from the kernel; called between batches.
    /// Destinations still unresolved are retried on later calls until the kernel has
    /// them (or [`UNRESOLVED_RETRIES`] calls later), so the cache learns a neighbour
    /// as soon as NDP completes, not only when the next packet misses again.
    pub fn refresh_neighbours(&mut self, now: Instant) {
        if self
            .last_refresh
            .is_some_and(|t| now.duration_since(t) < NEIGHBOUR_MIN_INTERVAL)
        {
            return;
        }
        if !self.pending.is_empty() {
            self.last_refresh = Some(now);
            let cache = &mut self.neighbours;
            self.pending.retain_mut(|(dst, tries)| {
                *tries += 1;
                !matches!(cache.resolve(*dst), Ok(Some(_))) && *tries < UNRESOLVED_RETRIES
            });
        }
        if self.neighbours.needs_refresh(now) {
            self.last_refresh = Some(now);
            match self.neighbours.refresh(now) {
                Ok(unresolved) => {
                    for dst in unresolved {
                        if !self.pending.iter().any(|(d, _)| *d == dst) {
                            tracing::debug!(%dst, "underlay next hop unresolved; resolving");
                            self.pending.push((dst, 0));
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "neighbour refresh failed"),
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

/// `dpio::xsk::XskStats` in serialisable form, with the queue it belongs to.
#[derive(Debug, Serialize)]
pub struct XskCounters {
    pub queue: u32,
    pub rx_frames: u64,
    pub rx_bytes: u64,
    pub rx_multi_buffer: u64,
    pub rx_oversize: u64,
    pub rx_invalid_desc: u64,
    pub tx_frames: u64,
    pub tx_bytes: u64,
    pub tx_full: u64,
    pub tx_invalid: u64,
    pub tx_kick_errors: u64,
    pub kernel_rx_dropped: u64,
    pub kernel_rx_invalid_descs: u64,
    pub kernel_tx_invalid_descs: u64,
    pub kernel_rx_ring_full: u64,
    pub kernel_rx_fill_ring_empty_descs: u64,
    pub kernel_tx_ring_empty_descs: u64,
    /// Set when the kernel's part could not be read.
    pub error: Option<String>,
}

impl XskCounters {
    fn read(s: &XskSocket) -> XskCounters {
        let (st, error) = match s.stats() {
            Ok(st) => (st, None),
            Err(e) => (Default::default(), Some(e.to_string())),
        };
        XskCounters {
            queue: s.queue(),
            rx_frames: st.rx_frames,
            rx_bytes: st.rx_bytes,
            rx_multi_buffer: st.rx_multi_buffer,
            rx_oversize: st.rx_oversize,
            rx_invalid_desc: st.rx_invalid_desc,
            tx_frames: st.tx_frames,
            tx_bytes: st.tx_bytes,
            tx_full: st.tx_full,
            tx_invalid: st.tx_invalid,
            tx_kick_errors: st.tx_kick_errors,
            kernel_rx_dropped: st.kernel_rx_dropped,
            kernel_rx_invalid_descs: st.kernel_rx_invalid_descs,
            kernel_tx_invalid_descs: st.kernel_tx_invalid_descs,
            kernel_rx_ring_full: st.kernel_rx_ring_full,
            kernel_rx_fill_ring_empty_descs: st.kernel_rx_fill_ring_empty_descs,
            kernel_tx_ring_empty_descs: st.kernel_tx_ring_empty_descs,
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
