//! One worker's share of the underlay: its AF_XDP sockets and tunnel tap queues,
//! the transmit slots it lends the engine, and their counters.

use dpio::tunnel_tx::TunnelQueue;
use dpio::xsk::{TxError, TxSlot, XskSocket, XskStats};
use engine::{FrameSpace, LentFrame, TxDest};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io;
use wire::vnet::TUNNEL_VNET_HDR_LEN;

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
        self.sockets.iter().map(std::os::fd::AsRawFd::as_raw_fd)
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
