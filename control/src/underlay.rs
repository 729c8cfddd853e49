//! The daemon's underlay edge: for each underlay interface, the link facts, the
//! attached XDP steering program and one AF_XDP socket per receive queue, all on one
//! shared UMEM. The sockets are handed out to the workers ([`Underlay::take_queues`]:
//! queue `i` to worker `i % workers`); each worker receives and transmits on its own
//! sockets only ([`UnderlayQueues`]). The links and their programs stay with the
//! daemon's main thread, which reads their counters for `stats`.

use crate::config::{DaemonConfig, XdpMode};
use dpio::netlink::Netlink;
use dpio::xdp::{AttachMode, SteeringProgram};
use dpio::xsk::{BindMode, TxError, TxSlot, Umem, XskConfig, XskMode, XskSocket, XskStats};
use engine::{FrameSpace, LentFrame, TxDest};
use serde::Serialize;
use std::collections::BTreeMap;
use std::net::Ipv6Addr;
use std::os::fd::AsRawFd;
use wire::MacAddr;

/// Room in a frame beyond the link MTU: the Ethernet header and a VLAN tag.
pub const FRAME_OVERHEAD: usize = 18;

/// One underlay interface.
pub struct UnderlayLink {
    pub name: String,
    pub ifindex: u32,
    pub mtu: u32,
    pub mac: Option<MacAddr>,
    /// Kept for its lifetime: dropping it detaches the program.
    program: SteeringProgram,
}

/// All underlay interfaces and what serves them.
pub struct Underlay {
    pub links: Vec<UnderlayLink>,
    /// Every link's sockets, in link then queue order, until handed to workers.
    sockets: Vec<XskSocket>,
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
    /// Reads each interface's facts, gives it at least one rx queue per worker,
    /// attaches the steering program and binds the sockets. Everything attached so
    /// far is released again if a later step fails.
    pub fn open(cfg: &DaemonConfig, workers: usize) -> Result<Underlay, String> {
        let mut nl = Netlink::open().map_err(|e| format!("netlink: {e}"))?;
        let mut links = Vec::new();
        for name in &cfg.underlay {
            let link = nl
                .link_by_name(name)
                .map_err(|e| format!("underlay interface {name:?}: {e}"))?;
            links.push(link);
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
            .map_err(|e| format!("AF_XDP socket sizes for MTU {largest}: {e}"))?;
        let mut plan = Vec::new();
        let mut chunks = 0u32;
        for link in links {
            let name = &link.name;
            let mut queues = rx_queue_count(name)?;
            let need = u32::try_from(workers).unwrap_or(u32::MAX);
            if queues < need {
                crate::channels::ensure_queues(name, need)?;
                queues = rx_queue_count(name)?;
                if queues < need {
                    return Err(format!(
                        "underlay interface {name:?} has {queues} rx queues after asking \
                         for {need} (one per worker)"
                    ));
                }
            }
            chunks = chunks.saturating_add(queues.saturating_mul(per_socket));
            plan.push((link, queues));
        }
        dpio::raise_memlock_limit();
        let umem = Umem::new(chunks).map_err(|e| format!("AF_XDP UMEM of {chunks} chunks: {e}"))?;
        let attach = match cfg.xdp_mode {
            XdpMode::Native => AttachMode::Native,
            XdpMode::Skb => AttachMode::Skb,
        };
        let mut links = Vec::new();
        let mut all_sockets = Vec::new();
        let mut mode = XskMode::Copy;
        for (link, queues) in plan {
            let mut program = SteeringProgram::attach(&link.name, &[cfg.underlay_addr], attach)
                .map_err(|e| e.to_string())?;
            for q in 0..queues {
                let s = XskSocket::new(&umem, link.ifindex, q, xsk_cfg)
                    .map_err(|e| format!("AF_XDP socket on {} queue {q}: {e}", link.name))?;
                program.register_socket(q, &s).map_err(|e| e.to_string())?;
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
                program,
            });
        }
        Ok(Underlay {
            links,
            sockets: all_sockets,
            _umem: umem,
        })
    }

    /// Hands the sockets to `workers` workers: queue `i` of every link to worker
    /// `i % workers`. `open` made every link have at least one queue per worker,
    /// so every worker can transmit on every link.
    pub fn take_queues(&mut self, workers: usize) -> Vec<UnderlayQueues> {
        let workers = workers.max(1);
        let mut out: Vec<UnderlayQueues> = (0..workers)
            .map(|_| UnderlayQueues {
                sockets: Vec::new(),
            })
            .collect();
        for s in self.sockets.drain(..) {
            let w = s.queue() as usize % workers;
            if let Some(q) = out.get_mut(w) {
                q.sockets.push(s);
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
            })
            .collect()
    }
}

/// The underlay sockets one worker owns: it receives on all of them and
/// transmits on the first of each link.
pub struct UnderlayQueues {
    pub sockets: Vec<XskSocket>,
}

impl UnderlayQueues {
    /// Queues a frame on the link `ifindex`; a full ring gets one kick and one retry.
    pub fn send(&mut self, ifindex: u32, frame: &[u8]) -> Result<(), SendError> {
        let sock = self
            .sockets
            .iter_mut()
            .find(|s| s.ifindex() == ifindex)
            .ok_or(SendError::NoSuchLink)?;
        match sock.send(frame) {
            Err(TxError::Full) => {
                sock.kick();
                sock.send(frame).map_err(SendError::Tx)
            }
            r => r.map_err(SendError::Tx),
        }
    }

    /// Tells the kernel about queued frames (and reclaims completions).
    pub fn kick(&mut self) {
        for s in &mut self.sockets {
            s.kick();
        }
    }

    /// Counters of every socket.
    pub fn stats(&self) -> Vec<XskCounters> {
        self.sockets.iter().map(XskCounters::read).collect()
    }

    pub fn fds(&self) -> impl Iterator<Item = i32> + '_ {
        self.sockets.iter().map(|s| s.as_raw_fd())
    }

    /// The engine's view of these sockets' transmit slots for one round: underlay
    /// frames are written where the kernel sends them from.
    pub fn space<'a>(&'a mut self, lent: &'a mut LentSlots) -> UmemSpace<'a> {
        UmemSpace {
            sockets: &mut self.sockets,
            lent,
        }
    }

    /// Queues lent frame `frame`, now `len` bytes long, for transmission.
    pub fn submit(
        &mut self,
        lent: &mut LentSlots,
        frame: LentFrame,
        len: usize,
    ) -> Result<(), SendError> {
        let (s, slot) = lent.take(frame).ok_or(SendError::NotLent)?;
        let sock = self.sockets.get_mut(s).ok_or(SendError::NoSuchLink)?;
        sock.submit(slot, len).map_err(SendError::Tx)
    }

    /// Gives back every slot still lent (frames the round did not submit).
    pub fn give_back_all(&mut self, lent: &mut LentSlots) {
        for (s, slot) in lent.0.drain(..).flatten() {
            if let Some(sock) = self.sockets.get_mut(s) {
                sock.give_back(slot);
            }
        }
    }
}

/// Transmit slots lent to the engine in one round, numbered as the engine knows
/// them ([`LentFrame`]), with the socket each came from. Kept by the worker across
/// rounds (the capacity stays).
#[derive(Default)]
pub struct LentSlots(Vec<Option<(usize, TxSlot)>>);

impl LentSlots {
    fn take(&mut self, frame: LentFrame) -> Option<(usize, TxSlot)> {
        self.0.get_mut(frame.0 as usize)?.take()
    }

    /// Whether every lent slot was submitted or given back.
    pub fn is_settled(&self) -> bool {
        self.0.iter().all(Option::is_none)
    }

    /// Forgets the numbering once every slot is settled, for the next round.
    pub fn reset(&mut self) {
        if self.is_settled() {
            self.0.clear();
        }
    }
}

/// [`FrameSpace`] over one worker's AF_XDP sockets: a frame to an underlay link is
/// written into a transmit slot of the worker's socket on that link.
pub struct UmemSpace<'a> {
    sockets: &'a mut [XskSocket],
    lent: &'a mut LentSlots,
}

impl FrameSpace for UmemSpace<'_> {
    fn lend(&mut self, dest: &TxDest, len: usize) -> Option<(LentFrame, &mut [u8])> {
        let TxDest::Underlay { ifindex } = *dest else {
            return None;
        };
        let s = self.sockets.iter().position(|s| s.ifindex() == ifindex)?;
        let sock = &mut self.sockets[s];
        if len > sock.slot_len() {
            return None;
        }
        let slot = sock.lend()?;
        let n = u32::try_from(self.lent.0.len()).ok()?;
        self.lent.0.push(Some((s, slot)));
        let (_, slot) = self.lent.0.last()?.as_ref()?;
        Some((LentFrame(n), sock.slot_mut(slot)))
    }

    fn give_back(&mut self, frame: LentFrame) {
        if let Some((s, slot)) = self.lent.take(frame) {
            if let Some(sock) = self.sockets.get_mut(s) {
                sock.give_back(slot);
            }
        }
    }
}

/// Why a frame could not be queued for the underlay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendError {
    /// The engine named an interface we do not serve (a route through a link that
    /// is not an underlay link).
    NoSuchLink,
    /// A lent frame that was already submitted or given back (a worker bug).
    NotLent,
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
}

/// One socket's counters with the link and queue it belongs to; the counters are dpio's own
/// type, flattened, so a counter added there shows up here without a copy.
#[derive(Debug, Serialize)]
pub struct XskCounters {
    pub ifindex: u32,
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
            ifindex: s.ifindex(),
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
