//! vhost-user guest ports: overlayd as the vhost-user backend of a VM's
//! virtio-net device, the VM's virtqueues in shared memory.
//!
//! Threads: a port's connection thread ([`connection`]) reads the front end's
//! requests and keeps the [`device::Device`] — features, guest memory, rings,
//! eventfds — up to date. The worker that owns the port moves the frames
//! ([`VhostPort::recv`], [`VhostPort::write_gather`], [`VhostPort::flush`]): it
//! reads and writes the rings in guest memory under the device's mutex, which is
//! uncontended except while a request is applied, so a frame costs no syscall.
//! The rings' kick eventfds are in the worker's epoll set (edge-triggered, never
//! read): a kick wakes a sleeping worker, and a busy one finds the frames by
//! looking at the transmit ring every round. The worker writes a call eventfd
//! (one syscall) after a round that returned buffers to a guest that asked to be
//! interrupted.
//!
//! Frames carry a 12-byte `virtio_net_hdr_v1` (VERSION_1 and MRG_RXBUF): the same
//! offload metadata as a tap's header ([`wire::vnet::VnetHdr`]) plus
//! `num_buffers`, so the tap path's tunneled TSO and coalescing serve VMs as they
//! are.
//!
//! Reconnection: with `--vhost-user-mode client` QEMU owns the socket and keeps
//! the VM running while overlayd is away; a restarted overlayd connects again and
//! QEMU replays the whole set-up, each ring's base being the used index it last
//! saw (a dead backend could not answer its `GET_VRING_BASE`). A buffer the old
//! overlayd had taken but not yet returned is offered again: a transmitted frame
//! may be sent twice (TCP drops the duplicate) and no receive buffer is lost.
//! `VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD` is not offered: a network device needs
//! no more than that.

mod connection;
mod device;
mod dirty;
mod notify;

use std::io::{self, IoSlice, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::SystemTime;

use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use wire::vnet::{VnetHdr, VNET_HDR_LEN};

use crate::poll::EpollWatch;
use device::{Device, Negotiated, RX, TX};
use dirty::RingLog;

pub use device::{feature_names, offered_features, FeatureRefusal};

/// `sizeof(struct virtio_net_hdr_v1)`: the legacy header and `num_buffers`.
pub const VNET_HDR_V1_LEN: usize = VNET_HDR_LEN + 2;

/// The most receive buffers one frame may be spread over: a 64 KiB frame in the
/// guest's smallest mergeable buffers (Linux posts at least 1,536 bytes each).
const MAX_RX_BUFFERS: usize = 64;

/// Who connects: overlayd (`Client`: QEMU listens, `server=on`) or QEMU
/// (`Server`: overlayd listens, QEMU connects with `reconnect=1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Server,
    Client,
}

/// Where a port's front end is found.
#[derive(Clone, Debug)]
pub struct DeviceConfig {
    /// The port's name, for threads and logs.
    pub name: String,
    pub socket: PathBuf,
    pub mode: Mode,
}

/// What the connection thread and the worker share.
struct Shared {
    cfg: DeviceConfig,
    /// The device as the current front end set it up (reset when one goes away).
    device: Arc<Mutex<Device>>,
    /// A handle on the current connection, to end it when the port is deleted.
    conn: Mutex<Option<std::os::unix::net::UnixStream>>,
    stop: AtomicBool,
    /// When a front end last connected or went away.
    changed: Mutex<SystemTime>,
    /// What the front ends negotiated, and those refused.
    negotiated: Arc<Negotiated>,
}

impl Shared {
    fn device(&self) -> MutexGuard<'_, Device> {
        self.device
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn mark_changed(&self) {
        *self
            .changed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = SystemTime::now();
    }
}

/// A guest port served over vhost-user. The worker that owns it moves its frames;
/// a thread of its own keeps the front end connected.
pub struct VhostPort {
    shared: Arc<Shared>,
    thread: Option<thread::JoinHandle<()>>,
    /// Rings with used buffers not yet signalled to the guest.
    dirty: [std::cell::Cell<bool>; 2],
    /// Refusals already counted by [`VhostPort::take_counts`].
    refusals_taken: std::cell::Cell<u64>,
    /// Frames dropped for offloads the guest did not negotiate, since the last
    /// [`VhostPort::take_counts`].
    rx_not_negotiated: std::cell::Cell<u64>,
}

/// A vhost-user port's negotiation as `list-ports` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Negotiation {
    /// The features the current front end acked (0 while none has).
    pub features: u64,
    /// Front ends refused since the port was made (their connections closed).
    pub refusals: u64,
    /// Why the last one was refused, until a front end is accepted.
    pub last_refusal: Option<FeatureRefusal>,
}

/// What a guest takes of the offloads the datapath hands out
/// ([`VhostPort::guest_takes`]): the worker makes anything else into frames it
/// takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuestTakes {
    /// Partial checksums and `DATA_VALID` (`GUEST_CSUM`).
    pub csum: bool,
    /// TCP GSO frames (`GUEST_TSO4`, `GUEST_TSO6`).
    pub tso4: bool,
    pub tso6: bool,
    /// GSO frames with the ECN bit (`GUEST_ECN`, not offered).
    pub ecn: bool,
}

impl GuestTakes {
    fn of(features: u64) -> GuestTakes {
        use virtio_bindings::virtio_net::{
            VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_GUEST_ECN, VIRTIO_NET_F_GUEST_TSO4,
            VIRTIO_NET_F_GUEST_TSO6,
        };
        let has = |b: u32| features & (1u64 << b) != 0;
        GuestTakes {
            csum: has(VIRTIO_NET_F_GUEST_CSUM),
            tso4: has(VIRTIO_NET_F_GUEST_TSO4),
            tso6: has(VIRTIO_NET_F_GUEST_TSO6),
            ecn: has(VIRTIO_NET_F_GUEST_ECN),
        }
    }
}

/// What happened on a port since the worker last asked ([`VhostPort::take_counts`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VhostCounts {
    /// Front ends whose features were refused (their connections closed).
    pub refused: u64,
    /// Frames the guest sent with offloads it did not negotiate (a GSO frame
    /// without HOST_TSO4/6, a partial checksum without CSUM): dropped.
    pub rx_not_negotiated: u64,
}

impl VhostPort {
    /// Starts serving `cfg.socket`: listens there (server mode; an old socket
    /// file is replaced) or connects to it (client mode, again and again until
    /// QEMU is there). The rings' kick eventfds are added to `epoll`
    /// (edge-triggered) under `token`.
    pub fn start(cfg: DeviceConfig, epoll: EpollWatch, token: u64) -> io::Result<Self> {
        let listener = connection::listen(&cfg)?;
        let negotiated = Arc::new(Negotiated::default());
        let device = Device::new(cfg.name.clone(), negotiated.clone(), epoll, token)?;
        let shared = Arc::new(Shared {
            cfg,
            device: Arc::new(Mutex::new(device)),
            conn: Mutex::new(None),
            stop: AtomicBool::new(false),
            changed: Mutex::new(SystemTime::now()),
            negotiated,
        });
        let s = shared.clone();
        let thread = thread::Builder::new()
            .name(format!("vhost-{}", shared.cfg.name))
            .spawn(move || connection::serve(&s, listener))?;
        Ok(VhostPort {
            shared,
            thread: Some(thread),
            dirty: Default::default(),
            refusals_taken: std::cell::Cell::new(0),
            rx_not_negotiated: std::cell::Cell::new(0),
        })
    }

    /// What the guest takes of the offloads the datapath hands out, from the
    /// features its front end acked (nothing while none has).
    pub fn guest_takes(&self) -> GuestTakes {
        GuestTakes::of(self.shared.negotiated.acked.load(Ordering::Relaxed))
    }

    /// What the current front end negotiated, and the refused ones.
    pub fn negotiation(&self) -> Negotiation {
        let n = &self.shared.negotiated;
        Negotiation {
            features: n.acked.load(Ordering::Relaxed),
            refusals: n.refusals.load(Ordering::Relaxed),
            last_refusal: n.last_refusal(),
        }
    }

    /// What happened since the last call, for the worker's counters.
    pub fn take_counts(&self) -> VhostCounts {
        let refusals = self.shared.negotiated.refusals.load(Ordering::Relaxed);
        VhostCounts {
            refused: refusals.saturating_sub(self.refusals_taken.replace(refusals)),
            rx_not_negotiated: self.rx_not_negotiated.replace(0),
        }
    }

    pub fn name(&self) -> &str {
        &self.shared.cfg.name
    }

    pub fn socket(&self) -> &Path {
        &self.shared.cfg.socket
    }

    /// When a front end last connected or went away.
    pub fn changed(&self) -> SystemTime {
        *self
            .shared
            .changed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether a front end is connected and runs both rings.
    pub fn is_up(&self) -> bool {
        self.shared
            .device()
            .vrings
            .iter()
            .all(device::Vring::running)
    }

    /// Takes the next frame the guest sent, its header decoded, copied into
    /// `buf`; `None` when the transmit ring is empty or not running. A chain
    /// shorter than the header or longer than `buf` is returned to the guest
    /// and refused with `InvalidData` (the worker counts it in `tap_rx_errors`).
    /// A frame with offloads the guest did not negotiate (a GSO frame without
    /// HOST_TSO4/6, a partial checksum without CSUM) is returned to it unread
    /// by the datapath and counted ([`VhostCounts::rx_not_negotiated`]): a
    /// driver may not send one, and the datapath would otherwise act on it.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<Option<(VnetHdr, usize)>> {
        let mut guard = self.shared.device();
        let features = guard.acked();
        let (mem, vring, log) = guard.ring(TX);
        if !vring.running() || !vring.sane(mem, &self.shared.cfg.name) {
            return Ok(None);
        }
        // The worker is awake and looks at the ring every round.
        vring.set_kicks(mem, false, log);
        loop {
            let Some(chain) = vring.queue.pop_descriptor_chain(mem) else {
                return Ok(None);
            };
            let head = chain.head_index();
            let read = chain
                .reader(mem)
                .map_err(|e| {
                    io::Error::new(io::ErrorKind::InvalidData, format!("transmit chain: {e}"))
                })
                .and_then(|r| read_frame(r, buf));
            vring
                .queue
                .add_used(mem, head, 0)
                .map_err(|e| io::Error::other(format!("transmit ring: {e}")))?;
            if let Some(log) = log {
                log.used_ring();
            }
            self.dirty[TX].set(true);
            match read {
                Ok((hdr, _)) if !device::sent_as_negotiated(&hdr, features) => {
                    self.rx_not_negotiated.set(self.rx_not_negotiated.get() + 1);
                }
                r => return r.map(Some),
            }
        }
    }

    /// Writes one frame to the guest: `parts[0]` is its legacy vnet header
    /// ([`VnetHdr::to_bytes`]), the rest the frame in order, like
    /// [`crate::tap::TapPort::write_gather`]. The frame is published in one step
    /// however many receive buffers it fills. Errors: `EIO` while no front end
    /// runs the ring (the link is down), `ENOBUFS` when the guest posted too few
    /// buffers (the frame is dropped, as a full tap queue drops it; the worker
    /// counts it in `tap_tx_errors`).
    pub fn write_gather(&self, parts: &[IoSlice<'_>]) -> io::Result<()> {
        let (hdr, frame) = match parts {
            [hdr, frame @ ..] if hdr.len() == VNET_HDR_LEN => (hdr, frame),
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "the first part must be the vnet header",
                ))
            }
        };
        let mut guard = self.shared.device();
        let max_buffers = if guard.mergeable() { MAX_RX_BUFFERS } else { 1 };
        let (mem, vring, log) = guard.ring(RX);
        if !vring.running() || !vring.sane(mem, &self.shared.cfg.name) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        // Buffers the guest posts are found when a frame comes: a kick for
        // them would wake a worker for nothing.
        vring.set_kicks(mem, false, log);
        let total = VNET_HDR_V1_LEN + frame.iter().map(|p| p.len()).sum::<usize>();
        fill_rx(&mut vring.queue, mem, hdr, frame, total, max_buffers, log)?;
        self.dirty[RX].set(true);
        Ok(())
    }

    /// Before the worker sleeps: asks the guest to kick when it sends. Returns
    /// whether it already made frames available (then the worker must not
    /// sleep: that frame's kick may have been suppressed).
    pub fn arm_kicks(&self) -> bool {
        let mut guard = self.shared.device();
        let (mem, vring, log) = guard.ring(TX);
        vring.running() && vring.set_kicks(mem, true, log)
    }

    /// Interrupts the guest for the rings that returned buffers since the last
    /// flush, where it asked to be (one eventfd write per ring and round).
    pub fn flush(&self) {
        if !self.dirty.iter().any(std::cell::Cell::get) {
            return;
        }
        let mut guard = self.shared.device();
        let dev = &mut *guard;
        let mem = &dev.mem;
        for (vring, dirty) in dev.vrings.iter_mut().zip(&self.dirty) {
            if dirty.replace(false) {
                if let Err(e) = vring.signal(mem) {
                    tracing::debug!(port = %self.shared.cfg.name, error = %e, "guest not interrupted");
                }
            }
        }
    }
}

impl std::fmt::Debug for VhostPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VhostPort")
            .field("name", &self.shared.cfg.name)
            .field("socket", &self.shared.cfg.socket)
            .field("mode", &self.shared.cfg.mode)
            .finish()
    }
}

impl Drop for VhostPort {
    fn drop(&mut self) {
        connection::stop(&self.shared);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // Our listener is closed with the thread: a socket still listened on at
        // the path is someone else's, and stays.
        let socket = &self.shared.cfg.socket;
        if self.shared.cfg.mode == Mode::Server && connection::is_stale_socket(socket) {
            let _ = std::fs::remove_file(socket);
        }
    }
}

/// Reads one transmitted chain: the v1 header, then the frame into `buf`.
fn read_frame(mut r: virtio_queue::Reader<'_, ()>, buf: &mut [u8]) -> io::Result<(VnetHdr, usize)> {
    let avail = r.available_bytes();
    let len = avail.checked_sub(VNET_HDR_V1_LEN).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("transmit chain of {avail} bytes, shorter than the vnet header"),
        )
    })?;
    let dst = buf.get_mut(..len).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("transmit chain of {len} bytes, larger than a frame"),
        )
    })?;
    let mut hdr = [0u8; VNET_HDR_V1_LEN];
    io::Read::read_exact(&mut r, &mut hdr)?;
    io::Read::read_exact(&mut r, dst)?;
    let vnet = VnetHdr::from_bytes(&hdr).ok_or_else(|| io::Error::other("vnet header"))?;
    Ok((vnet, len))
}

/// What [`fill_rx`] wrote while QEMU migrates the VM: marked in the dirty log
/// when it returns, whichever way (a frame refused for want of buffers has
/// written some already).
struct Written<'a> {
    log: Option<RingLog<'a>>,
    chains: Vec<virtio_queue::DescriptorChain<&'a GuestMemoryMmap>>,
}

impl Drop for Written<'_> {
    fn drop(&mut self) {
        if let Some(log) = self.log {
            for chain in self.chains.drain(..) {
                log.buffers(chain);
            }
            log.used_ring();
        }
    }
}

/// Copies a frame into as many receive buffers as it takes (at most
/// `max_buffers`) and publishes them to the guest in one store of the used
/// index, with `num_buffers` already set: a guest never sees part of a frame.
/// With `log` (QEMU migrates the VM), the buffers and the used ring are marked
/// in its dirty log once written.
fn fill_rx<'m>(
    q: &mut Queue,
    mem: &'m GuestMemoryMmap,
    hdr: &[u8],
    frame: &[IoSlice<'_>],
    total: usize,
    max_buffers: usize,
    log: Option<RingLog<'m>>,
) -> io::Result<()> {
    let mut written = Written {
        log,
        chains: Vec::new(),
    };
    let mut used = [(0u16, 0u32); MAX_RX_BUFFERS];
    let mut n = 0;
    let mut header = None;
    let mut parts = frame.iter().map(|p| &p[..]).filter(|p| !p.is_empty());
    let mut part: &[u8] = &[];
    let mut left = total - VNET_HDR_V1_LEN;
    let undo = |q: &mut Queue, n: usize| {
        for _ in 0..n {
            q.go_to_previous_position();
        }
    };
    while left > 0 || header.is_none() {
        let chain = match q.pop_descriptor_chain(mem) {
            Some(c) if n < max_buffers => c,
            popped => {
                undo(q, n + usize::from(popped.is_some()));
                return Err(io::Error::from_raw_os_error(libc::ENOBUFS));
            }
        };
        let head = chain.head_index();
        let copy = written.log.map(|_| chain.clone());
        let mut w = match chain.writer(mem) {
            Ok(w) => w,
            Err(e) => {
                undo(q, n + 1);
                return Err(io::Error::other(format!("receive buffer: {e}")));
            }
        };
        written.chains.extend(copy);
        let mut written = 0;
        if header.is_none() {
            if w.available_bytes() < VNET_HDR_V1_LEN {
                undo(q, n + 1);
                return Err(io::Error::other("receive buffer smaller than the header"));
            }
            let rest = w.split_at(VNET_HDR_V1_LEN).map_err(io::Error::other)?;
            header = Some(w);
            w = rest;
            written = VNET_HDR_V1_LEN;
        }
        while left > 0 && w.available_bytes() > 0 {
            if part.is_empty() {
                part = parts.next().unwrap_or(&[]);
            }
            let k = w.write(part)?;
            part = &part[k..];
            left -= k;
            written += k;
        }
        used[n] = (head, written as u32);
        n += 1;
    }
    let mut h = [0u8; VNET_HDR_V1_LEN];
    h[..VNET_HDR_LEN].copy_from_slice(hdr);
    h[VNET_HDR_LEN..].copy_from_slice(&(n as u16).to_le_bytes());
    if let Some(mut w) = header {
        w.write_all(&h)?;
    }
    publish_used(q, mem, &used[..n])
}

/// Adds `used` to the used ring and then stores the used index once (release
/// order), so the guest sees all of a frame's buffers or none.
fn publish_used(q: &mut Queue, mem: &GuestMemoryMmap, used: &[(u16, u32)]) -> io::Result<()> {
    let err = |e: vm_memory::GuestMemoryError| io::Error::other(format!("used ring: {e}"));
    let ring = GuestAddress(q.used_ring());
    let size = q.size();
    let mut next = q.next_used();
    for &(head, len) in used {
        let at = ring.0 + 4 + 8 * u64::from(next % size);
        mem.write_obj(u32::from(head).to_le(), GuestAddress(at))
            .map_err(err)?;
        mem.write_obj(len.to_le(), GuestAddress(at + 4))
            .map_err(err)?;
        next = next.wrapping_add(1);
    }
    q.set_next_used(next);
    mem.store(next.to_le(), GuestAddress(ring.0 + 2), Ordering::Release)
        .map_err(err)
}

#[cfg(test)]
mod frontend_tests;
#[cfg(any(test, feature = "test-frontend"))]
pub mod test_frontend;

#[cfg(test)]
mod tests {
    use super::*;
    use virtio_bindings::virtio_ring::VRING_DESC_F_WRITE;
    use virtio_queue::desc::split::Descriptor as SplitDescriptor;
    use virtio_queue::desc::RawDescriptor;
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::Address as _;

    fn memory() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap()
    }

    /// `n` receive buffers of `len` bytes, each a chain of its own, at 0x4_0000,
    /// 0x4_1000 and so on.
    fn rx_queue(mem: &GuestMemoryMmap, n: u16, len: u32) -> Queue {
        let mock = MockSplitQueue::new(mem, 16);
        let descs: Vec<RawDescriptor> = (0..n)
            .map(|i| {
                let addr = 0x4_0000 + 0x1000 * u64::from(i);
                RawDescriptor::from(SplitDescriptor::new(
                    addr,
                    len,
                    VRING_DESC_F_WRITE as u16,
                    0,
                ))
            })
            .collect();
        mock.add_desc_chains(&descs, 0).unwrap();
        mock.create_queue::<Queue>().unwrap()
    }

    fn used(mem: &GuestMemoryMmap, q: &Queue, i: u64) -> (u32, u32) {
        let at = GuestAddress(q.used_ring() + 4 + 8 * i);
        let id: u32 = mem.read_obj(at).unwrap();
        let len: u32 = mem.read_obj(at.unchecked_add(4)).unwrap();
        (id, len)
    }

    fn used_idx(mem: &GuestMemoryMmap, q: &Queue) -> u16 {
        mem.read_obj(GuestAddress(q.used_ring() + 2)).unwrap()
    }

    #[test]
    fn a_frame_spreads_over_mergeable_buffers_published_at_once_with_num_buffers() {
        let mem = memory();
        let mut q = rx_queue(&mem, 3, 1024);
        let hdr = VnetHdr {
            flags: 1,
            gso_type: 1,
            hdr_len: 54,
            gso_size: 1448,
            csum_start: 34,
            csum_offset: 16,
        }
        .to_bytes();
        let frame: Vec<u8> = (0..2500u32).map(|i| i as u8).collect();
        let (a, b) = frame.split_at(100);
        let parts = [IoSlice::new(a), IoSlice::new(b)];
        fill_rx(&mut q, &mem, &hdr, &parts, VNET_HDR_V1_LEN + 2500, 64, None).unwrap();

        assert_eq!(
            used_idx(&mem, &q),
            3,
            "three buffers, one store of the index"
        );
        assert_eq!(used(&mem, &q, 0), (0, 1024));
        assert_eq!(used(&mem, &q, 1), (1, 1024));
        assert_eq!(
            used(&mem, &q, 2),
            (2, (VNET_HDR_V1_LEN + 2500 - 2048) as u32)
        );
        let mut got = vec![0u8; 3 * 1024];
        for i in 0..3u64 {
            let at = GuestAddress(0x4_0000 + 0x1000 * i);
            mem.read_slice(&mut got[i as usize * 1024..][..1024], at)
                .unwrap();
        }
        assert_eq!(&got[..VNET_HDR_LEN], &hdr);
        assert_eq!(u16::from_le_bytes([got[10], got[11]]), 3, "num_buffers");
        assert_eq!(&got[VNET_HDR_V1_LEN..VNET_HDR_V1_LEN + 2500], &frame[..]);
    }

    #[test]
    fn a_frame_without_enough_buffers_is_refused_and_leaves_the_ring_as_it_was() {
        let mem = memory();
        let mut q = rx_queue(&mem, 2, 1024);
        let hdr = VnetHdr::default().to_bytes();
        let frame = [7u8; 2500];
        let err = fill_rx(&mut q, &mem, &hdr, &[IoSlice::new(&frame)], 2512, 64, None).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOBUFS));
        assert_eq!(used_idx(&mem, &q), 0);
        assert_eq!(q.next_avail(), 0, "the buffers taken were given back");
        // Without mergeable buffers one buffer must hold the whole frame.
        let err = fill_rx(
            &mut q,
            &mem,
            &hdr,
            &[IoSlice::new(&frame[..1000])],
            1012,
            1,
            None,
        )
        .map(|()| used_idx(&mem, &q));
        assert_eq!(err.unwrap(), 1, "a frame that fits one buffer still goes");
    }

    #[test]
    fn a_transmitted_chain_gives_its_header_and_frame() {
        let mem = memory();
        let mock = MockSplitQueue::new(&mem, 16);
        let hdr = VnetHdr {
            flags: 1,
            gso_type: 4,
            hdr_len: 74,
            gso_size: 1428,
            csum_start: 54,
            csum_offset: 16,
        };
        let mut v1 = [0u8; VNET_HDR_V1_LEN];
        v1[..VNET_HDR_LEN].copy_from_slice(&hdr.to_bytes());
        mem.write_slice(&v1, GuestAddress(0x4_0000)).unwrap();
        mem.write_slice(&[0xabu8; 300], GuestAddress(0x5_0000))
            .unwrap();
        let chain = mock
            .build_desc_chain(&[
                RawDescriptor::from(SplitDescriptor::new(0x4_0000, VNET_HDR_V1_LEN as u32, 0, 0)),
                RawDescriptor::from(SplitDescriptor::new(0x5_0000, 300, 0, 0)),
            ])
            .unwrap();
        let mut buf = vec![0u8; 1000];
        let (got, len) = read_frame(chain.reader(&mem).unwrap(), &mut buf).unwrap();
        assert_eq!((got, len), (hdr, 300));
        assert!(buf[..300].iter().all(|&b| b == 0xab));
        // A frame longer than the buffer is refused, not cut.
        let chain = mock
            .build_desc_chain(&[RawDescriptor::from(SplitDescriptor::new(
                0x5_0000, 300, 0, 0,
            ))])
            .unwrap();
        let e = read_frame(chain.reader(&mem).unwrap(), &mut buf[..100]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }
}
