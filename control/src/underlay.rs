//! The daemon's underlay edge: for each underlay interface, the link facts, the
//! attached XDP steering program and one AF_XDP socket per receive queue, all on one
//! shared UMEM, and with `--underlay-gso` its tunnel tap (`dpio::tunnel_tx`), one
//! queue per worker, for guest TSO buffers as UDP-tunnel GSO super-frames. The
//! sockets are handed out to the workers ([`Underlay::take_queues`]: queue `i` to
//! worker `i % workers`); each worker receives and transmits on its own
//! sockets only ([`UnderlayQueues`]). The links and their programs stay with the
//! daemon's main thread, which reads their counters for `stats`.
//!
//! The links are followed at run time ([`UnderlayWatch`], on the main thread): an
//! MTU change reaches every engine at once (segment sizes, MTU budget, Packet Too
//! Big), and a link deleted and re-created, or whose rx queue count changed, gets
//! its program and sockets attached again, the workers' sockets replaced between
//! their rounds.

use crate::config::{DaemonConfig, UnderlayGso, XdpMode};
use crate::datapath::Datapath;
use crate::worker::Backoff;
use crate::workers::Workers;
use dpio::netlink::{Event, Events, Group, LinkInfo, Netlink};
use dpio::tunnel_tx::{TunnelQueue, TunnelTap};
use dpio::xdp::{AttachMode, SteeringProgram};
use dpio::xsk::{BindMode, TxError, TxSlot, Umem, XskConfig, XskMode, XskSocket, XskStats};
use engine::{FrameSpace, LentFrame, TxDest};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io;
use std::net::Ipv6Addr;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use wire::vnet::TUNNEL_VNET_HDR_LEN;
use wire::MacAddr;

/// Room in a frame beyond the link MTU: the Ethernet header and a VLAN tag.
pub const FRAME_OVERHEAD: usize = 18;

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
    max_tx_frame: usize,
    /// Every link's tunnel tap, in link order, when guest TSO buffers leave as
    /// UDP-tunnel GSO super-frames (`--underlay-gso`); empty otherwise.
    tunnels: Vec<TunnelTap>,
    /// Kept alive while sockets use it (`None` with no link).
    _umem: Option<Umem>,
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

/// Gives link `name` at least one rx queue per worker; returns how many it has.
fn queues_for(name: &str, workers: usize) -> Result<u32, String> {
    let queues = rx_queue_count(name)?;
    let need = u32::try_from(workers).unwrap_or(u32::MAX);
    if queues >= need {
        return Ok(queues);
    }
    dpio::channels::ensure_queues(name, need).map_err(|e| e.to_string())?;
    let queues = rx_queue_count(name)?;
    if queues < need {
        return Err(format!(
            "underlay interface {name:?} has {queues} rx queues after asking \
             for {need} (one per worker)"
        ));
    }
    Ok(queues)
}

impl Underlay {
    /// Reads each interface's facts, gives it at least one rx queue per worker,
    /// attaches the steering program and binds the sockets. Every configured link
    /// must exist. Everything attached so far is released again if a later step
    /// fails.
    pub fn open(cfg: &DaemonConfig, workers: usize) -> Result<Underlay, String> {
        let mut nl = Netlink::open().map_err(|e| format!("netlink: {e}"))?;
        let mut links = Vec::new();
        for name in &cfg.underlay {
            let link = nl
                .link_by_name(name)
                .map_err(|e| format!("underlay interface {name:?}: {e}"))?;
            links.push(link);
        }
        Self::attach(cfg, links, workers)
    }

    /// Nothing attached: what the daemon holds while it re-attaches.
    fn empty() -> Underlay {
        Underlay {
            links: Vec::new(),
            sockets: Vec::new(),
            max_tx_frame: 0,
            tunnels: Vec::new(),
            _umem: None,
        }
    }

    /// Attaches to `links`, sized for the largest MTU among them.
    fn attach(
        cfg: &DaemonConfig,
        links: Vec<LinkInfo>,
        workers: usize,
    ) -> Result<Underlay, String> {
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
            .map_err(|e| format!("AF_XDP socket sizes for MTU {largest}: {e}"))?;
        let mut plan = Vec::new();
        let mut chunks = 0u32;
        for link in links {
            let queues = queues_for(&link.name, workers)?;
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
    fn attached(&self, name: &str) -> Option<LinkFacts> {
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
) -> Result<Vec<TunnelTap>, String> {
    if mode == UnderlayGso::Off {
        return Ok(Vec::new());
    }
    let opened: Result<Vec<TunnelTap>, String> = links
        .iter()
        .map(|l| {
            TunnelTap::open(&l.name, l.ifindex, workers.max(1))
                .map_err(|e| format!("underlay {:?}: {e}", l.name))
        })
        .collect();
    match (opened, mode) {
        (Ok(t), _) => Ok(t),
        (Err(e), UnderlayGso::On) => Err(format!("--underlay-gso on: {e}")),
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

/// What the datapath depends on of one underlay link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct LinkFacts {
    ifindex: u32,
    mtu: u32,
    queues: u32,
}

/// Why the program and sockets must be attached again, if they must: a configured
/// link appeared, went, was re-created (another ifindex) or changed its queue
/// count, or its MTU outgrew the transmit slots. `now` and `attached` hold each
/// configured link (named in `names`) as the kernel has it and as it was attached
/// (`None`: absent). An MTU change within the slots needs no re-attach (the
/// engines are told, [`UnderlayWatch`]).
fn reattach_reason(
    names: &[String],
    now: &[Option<LinkFacts>],
    attached: &[Option<LinkFacts>],
    max_tx_frame: usize,
) -> Option<String> {
    names
        .iter()
        .zip(now.iter().zip(attached))
        .find_map(|(name, (now, attached))| match (now, attached) {
            (None, None) => None,
            (Some(_), None) => Some(format!("{name} is there")),
            (None, Some(_)) => Some(format!("{name} is gone")),
            (Some(n), Some(a)) if n.ifindex != a.ifindex => Some(format!(
                "{name} was re-created (ifindex {} now {})",
                a.ifindex, n.ifindex
            )),
            (Some(n), Some(a)) if n.queues != a.queues => Some(format!(
                "{name} has {} rx queues, {} were attached",
                n.queues, a.queues
            )),
            (Some(n), Some(_)) if n.mtu as usize + FRAME_OVERHEAD > max_tx_frame => Some(format!(
                "{name}'s MTU {} outgrew the {max_tx_frame}-byte transmit slots",
                n.mtu
            )),
            (Some(_), Some(_)) => None,
        })
}

/// How often the links are read again without a notification: drivers do not all
/// announce a change of their channel (queue) count over rtnetlink.
const RECHECK: Duration = Duration::from_secs(5);

/// How soon a failed re-attach is tried again (binding a queue that was just
/// released can fail with EBUSY for ~100 ms), and the longest wait between tries.
const REATTACH_FIRST: Duration = Duration::from_millis(200);
const REATTACH_MAX: Duration = Duration::from_secs(5);

/// Follows the underlay links at run time, on the main thread (between API
/// requests), through rtnetlink link notifications and a re-read every
/// [`RECHECK`].
pub struct UnderlayWatch {
    cfg: DaemonConfig,
    workers: usize,
    /// Shared with the `stats` of the links (also read on the main thread).
    underlay: Arc<Mutex<Underlay>>,
    events: Events,
    nl: Netlink,
    got: Vec<Event>,
    next_check: Instant,
    /// A re-attach that failed: when it is tried again, and the waits after.
    retry: Option<(Instant, Backoff)>,
    /// The MTU last given to the engines.
    engine_mtu: u32,
}

impl UnderlayWatch {
    /// Starts following `underlay` (opened by [`Underlay::open`], its sockets
    /// handed to `workers` workers whose engines plan with `engine_mtu`).
    pub fn start(
        cfg: &DaemonConfig,
        workers: usize,
        underlay: Underlay,
        engine_mtu: u32,
    ) -> Result<UnderlayWatch, String> {
        let err = |e: io::Error| format!("underlay link notifications: {e}");
        // The engines were configured with the transmit path found at start; a
        // re-attach must give them the same, or fail and retry (never a silent
        // switch that would leave super-frames without a tap).
        let mut cfg = cfg.clone();
        cfg.underlay_gso = if underlay.tunnel_gso() {
            UnderlayGso::On
        } else {
            UnderlayGso::Off
        };
        Ok(UnderlayWatch {
            cfg,
            workers,
            underlay: Arc::new(Mutex::new(underlay)),
            events: Events::subscribe(&[Group::Link]).map_err(err)?,
            nl: Netlink::open().map_err(err)?,
            got: Vec::new(),
            next_check: Instant::now() + RECHECK,
            retry: None,
            engine_mtu,
        })
    }

    /// The underlay MTU the engines plan with now.
    pub fn mtu(&self) -> u32 {
        self.engine_mtu
    }

    /// The links' facts and XDP counters, for `stats`.
    pub fn stats(&self) -> impl FnMut() -> serde_json::Value {
        let underlay = self.underlay.clone();
        move || {
            let mut u = underlay.lock().unwrap_or_else(PoisonError::into_inner);
            serde_json::to_value(u.stats()).unwrap_or_default()
        }
    }

    /// Notices link changes since the last call and applies them: the engines
    /// follow the MTU; the program and sockets are attached again when a link
    /// went, came back or changed its queues. Cheap when nothing happened (one
    /// non-blocking read).
    pub fn poll(&mut self, workers: &Workers<Datapath>) {
        let now = Instant::now();
        let due = now >= self.next_check || self.retry.is_some_and(|(at, _)| now >= at);
        if !(self.announced() || due) {
            return;
        }
        self.next_check = now + RECHECK;
        let Some(facts) = self.read_links() else {
            return;
        };
        let why = {
            let u = self.underlay.lock().unwrap_or_else(PoisonError::into_inner);
            let names = &self.cfg.underlay;
            let attached: Vec<_> = names.iter().map(|n| u.attached(n)).collect();
            reattach_reason(names, &facts, &attached, u.max_tx_frame)
                .or_else(|| self.retry.map(|_| "the last re-attach failed".to_string()))
        };
        if let Some(why) = why {
            self.reattach(workers, &why, now);
        }
        self.follow_mtu(workers, &facts);
    }

    /// Whether a notification concerns an underlay link (or some were lost).
    fn announced(&mut self) -> bool {
        self.got.clear();
        if let Err(e) = self.events.drain(&mut self.got) {
            tracing::warn!(error = %e, "underlay link notifications");
            return true;
        }
        let names = &self.cfg.underlay;
        self.got.iter().any(|e| match e {
            Event::Link { info, .. } => names.contains(&info.name),
            _ => true,
        })
    }

    /// The configured links as the kernel has them now (`None`: absent), or
    /// `None` when they cannot be read (tried again at the next notification or
    /// re-check).
    fn read_links(&mut self) -> Option<Vec<Option<LinkFacts>>> {
        let mut out = Vec::new();
        for name in &self.cfg.underlay {
            let link = match self.nl.link_by_name(name) {
                Ok(l) => l,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    out.push(None);
                    continue;
                }
                Err(e) => {
                    tracing::warn!(iface = %name, error = %e, "underlay link not readable");
                    return None;
                }
            };
            // A link being deleted has no queues left to list: as good as absent.
            out.push(rx_queue_count(name).ok().map(|queues| LinkFacts {
                ifindex: link.ifindex,
                mtu: link.mtu,
                queues,
            }));
        }
        Some(out)
    }

    /// Replaces the program and every worker's sockets. The workers close their
    /// sockets first (underlay frames are counted `underlay_tx_no_link` in the
    /// meantime), so the old program is detached and a queue rebound only once
    /// nothing uses it. A failure is retried on a back-off.
    fn reattach(&mut self, workers: &Workers<Datapath>, why: &str, now: Instant) {
        tracing::warn!(why, "underlay changed: re-attaching XDP and AF_XDP sockets");
        for w in 0..workers.count() {
            let r = workers.call(w, |dp: &mut Datapath| {
                dp.replace_underlay(UnderlayQueues::default())
            });
            if let Err(e) = r.and_then(|r| r) {
                tracing::error!(worker = w, error = %e, "underlay sockets not released");
            }
        }
        let underlay = self.underlay.clone();
        let mut u = underlay.lock().unwrap_or_else(PoisonError::into_inner);
        *u = Underlay::empty();
        let opened = self
            .present_links()
            .and_then(|links| Underlay::attach(&self.cfg, links, self.workers));
        let mut new = match opened {
            Ok(new) => new,
            Err(e) => {
                let mut backoff = self
                    .retry
                    .map_or(Backoff::new(REATTACH_FIRST, REATTACH_MAX), |(_, b)| b);
                let wait = backoff.next();
                tracing::warn!(error = %e, retry_in = ?wait, "underlay not re-attached");
                self.retry = Some((now + wait, backoff));
                return;
            }
        };
        self.retry = None;
        for (w, queues) in new.take_queues(self.workers).into_iter().enumerate() {
            let r = workers.call(w, move |dp: &mut Datapath| dp.replace_underlay(queues));
            if let Err(e) = r.and_then(|r| r) {
                tracing::error!(worker = w, error = %e, "underlay sockets not taken over");
            }
        }
        *u = new;
    }

    /// The configured links that exist now (one deleted is left out until it is
    /// back).
    fn present_links(&mut self) -> Result<Vec<LinkInfo>, String> {
        let mut links = Vec::new();
        for name in &self.cfg.underlay {
            match self.nl.link_by_name(name) {
                Ok(l) => links.push(l),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    tracing::warn!(iface = %name, "underlay interface is gone; left out until it is back");
                }
                Err(e) => return Err(format!("underlay interface {name:?}: {e}")),
            }
        }
        Ok(links)
    }

    /// Gives the engines the smallest MTU of the links there are, when it changed,
    /// and names the ports that no longer fit (`xdeadm mtu PORT` shows why).
    fn follow_mtu(&mut self, workers: &Workers<Datapath>, facts: &[Option<LinkFacts>]) {
        let Some(mtu) = facts.iter().flatten().map(|f| f.mtu).min() else {
            return;
        };
        if mtu == self.engine_mtu {
            return;
        }
        tracing::info!(from = self.engine_mtu, to = mtu, "underlay MTU changed");
        self.engine_mtu = mtu;
        let mut too_big = Vec::new();
        for w in 0..workers.count() {
            match workers.call(w, move |dp: &mut Datapath| dp.set_underlay_mtu(mtu)) {
                Ok(Ok(ports)) => too_big.extend(ports),
                Ok(Err(e)) | Err(e) => {
                    tracing::error!(worker = w, error = %e, "underlay MTU not applied");
                }
            }
        }
        if !too_big.is_empty() {
            tracing::warn!(
                underlay_mtu = mtu, ports = ?too_big,
                "ports whose MTU no longer fits the underlay: their large packets get \
                 Packet Too Big (see `xdeadm mtu PORT`)"
            );
        }
    }
}

/// The underlay sockets one worker owns: it receives on all of them and
/// transmits on the first of each link; and its queue of each link's tunnel tap
/// (none without `--underlay-gso`).
#[derive(Default)]
pub struct UnderlayQueues {
    pub sockets: Vec<XskSocket>,
    pub tunnels: Vec<TunnelQueue>,
    /// Frames were queued on a socket since the last kick.
    pending: bool,
}

impl UnderlayQueues {
    /// Queues a frame on the link `ifindex`; a full ring gets one kick and one retry.
    pub fn send(&mut self, ifindex: u32, frame: &[u8]) -> Result<(), SendError> {
        let sock = self
            .sockets
            .iter_mut()
            .find(|s| s.ifindex() == ifindex)
            .ok_or(SendError::NoSuchLink)?;
        let r = match sock.send(frame) {
            Err(TxError::Full) => {
                sock.kick();
                sock.send(frame).map_err(SendError::Tx)
            }
            r => r.map_err(SendError::Tx),
        };
        self.pending |= r.is_ok();
        r
    }

    /// Tells the kernel about queued frames (and reclaims completions).
    pub fn kick(&mut self) {
        for s in &mut self.sockets {
            s.kick();
        }
        self.pending = false;
    }

    /// Writes super-frame `frame` (with its tunnel vnet header `hdr`) to link
    /// `ifindex`'s tunnel tap. Frames queued on the sockets are kicked first, so
    /// that the wire sees a flow's frames in the order the engine made them.
    pub fn send_super(
        &mut self,
        ifindex: u32,
        hdr: &[u8; TUNNEL_VNET_HDR_LEN],
        frame: &[u8],
    ) -> Result<(), SuperError> {
        if self.pending {
            self.kick();
        }
        let q = self
            .tunnels
            .iter()
            .find(|q| q.link_ifindex() == ifindex)
            .ok_or(SuperError::NoSuchLink)?;
        q.write(hdr, frame).map_err(SuperError::Write)
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
        sock.submit(slot, len).map_err(SendError::Tx)?;
        self.pending = true;
        Ok(())
    }

    /// The first `len` bytes of lent frame `frame`, as the engine wrote them and
    /// before they are submitted (what `xdeadm capture --underlay` copies).
    pub(crate) fn lent_bytes(
        &mut self,
        lent: &LentSlots,
        frame: LentFrame,
        len: usize,
    ) -> Option<&[u8]> {
        let (s, slot) = lent.0.get(frame.0 as usize)?.as_ref()?;
        let sock = self.sockets.get_mut(*s)?;
        let bytes: &[u8] = sock.slot_mut(slot);
        bytes.get(..len)
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

/// Why a super-frame was not sent.
#[derive(Debug)]
pub enum SuperError {
    /// No tunnel tap for the interface the engine named (a link re-attached
    /// meanwhile, or not an underlay link).
    NoSuchLink,
    /// The tap refused the write (EAGAIN, ENOBUFS, EINVAL for a header the
    /// kernel rejects, ...).
    Write(io::Error),
}

/// Counters of one underlay link.
#[derive(Debug, Serialize)]
pub struct LinkStats {
    pub name: String,
    pub ifindex: u32,
    pub mtu: u32,
    pub queues: u32,
    /// How guest TSO buffers leave: [`TX_PATH_TUNNEL_GSO`] or [`TX_PATH_AF_XDP`].
    pub tx_path: &'static str,
    /// The link's tunnel tap, when [`LinkStats::tx_path`] is tunnel GSO.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tunnel_tap: Option<String>,
    /// Frames the tunnel tap's redirect program dropped (it had no target).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tunnel_redirect_drops: Option<u64>,
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

#[cfg(test)]
mod tests {
    use super::*;

    const SLOT: usize = 9000 + FRAME_OVERHEAD;

    fn facts(ifindex: u32, mtu: u32, queues: u32) -> Option<LinkFacts> {
        Some(LinkFacts {
            ifindex,
            mtu,
            queues,
        })
    }

    /// Re-attach when a link goes, comes back, is re-created or changes its
    /// queues, or when its MTU outgrows the slots; not for an MTU change that
    /// fits, and not for a link that stays away.
    #[test]
    fn reattach_reason_names_the_change() {
        let names = ["ul0".to_string(), "ul1".to_string()];
        let attached = [facts(2, 9000, 1), None];
        let why = |now: &[Option<LinkFacts>]| reattach_reason(&names, now, &attached, SLOT);
        assert_eq!(why(&[facts(2, 9000, 1), None]), None);
        assert_eq!(why(&[facts(2, 4000, 1), None]), None, "a smaller MTU fits");
        assert_eq!(why(&[None, None]).as_deref(), Some("ul0 is gone"));
        assert_eq!(
            why(&[facts(5, 9000, 1), None]).as_deref(),
            Some("ul0 was re-created (ifindex 2 now 5)")
        );
        assert_eq!(
            why(&[facts(2, 9000, 2), None]).as_deref(),
            Some("ul0 has 2 rx queues, 1 were attached")
        );
        assert_eq!(
            why(&[facts(2, 9100, 1), None]).as_deref(),
            Some("ul0's MTU 9100 outgrew the 9018-byte transmit slots")
        );
        assert_eq!(
            why(&[facts(2, 9000, 1), facts(3, 9000, 1)]).as_deref(),
            Some("ul1 is there")
        );
    }
}
