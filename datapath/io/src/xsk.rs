//! AF_XDP sockets on a shared UMEM, with multi-buffer (`XDP_USE_SG`) frames.
//!
//! This is a thin layer over the raw `libc` interface rather than a binding
//! to libxdp/libbpf's xsk.c: we need control over multi-buffer descriptor
//! chains (9000-byte underlay frames span three 4 KiB chunks) and over how
//! sockets share one UMEM (bind flags, per-socket fill/completion rings), and
//! a C library would have to be built and linked for very little code: four
//! mmap'd rings with acquire/release indices.
//!
//! Memory model: one [`Umem`] is registered once; every [`XskSocket`] on it
//! (one per interface queue) takes a disjoint range of chunks for its own
//! fill ring (rx) and transmit slots, and owns its own fill and completion
//! rings. A socket is therefore used by one thread without locks, and
//! chunks never move between sockets.
//!
//! Nothing is copied between our buffers and the UMEM on the fast path:
//! transmit slots ([`TxSlot`]) are lent to the caller, who writes a frame
//! straight into the UMEM and submits it; received frames are held
//! ([`RxHeld`]) as slices of the UMEM until the caller has written them out
//! and releases them to the fill ring in one go.

use std::io;
use std::ops::Range;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Size of one UMEM chunk. 4096 (the largest the kernel accepts in aligned
/// mode) so a 9014-byte frame needs only three descriptors.
pub const CHUNK_SIZE: usize = 4096;
/// The kernel refuses a transmitted packet of more descriptors than this
/// (`MAX_SKB_FRAGS + 1`).
pub const MAX_TX_DESCS: usize = 18;
/// Largest frame [`XskSocket::recv_held`] accepts; longer chains are dropped
/// and counted as `rx_oversize`.
pub const MAX_RX_FRAME: usize = 65536;
/// Most descriptors one received frame may span (the kernel builds at most
/// `MAX_SKB_FRAGS + 1`); a longer chain is dropped and counted as
/// `rx_oversize`. 18 chunks of 3840 bytes (copy mode's headroom taken) still
/// hold [`MAX_RX_FRAME`].
pub const MAX_RX_PIECES: usize = 18;

/// How long a bind that fails with EBUSY is retried: the kernel releases a
/// just-closed socket's queue asynchronously (~100 ms observed).
const BIND_BUSY_RETRY: Duration = Duration::from_millis(500);

/// Source of [`XskSocket`] identities, which tie a [`TxSlot`] to the socket
/// that lent it. Never reused, unlike addresses.
static NEXT_SOCKET_ID: AtomicU64 = AtomicU64::new(0);

fn os_err(what: impl std::fmt::Display) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

fn invalid_config(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

/// An anonymous private mapping, unmapped on drop.
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

impl Mapping {
    fn map(fd: RawFd, len: usize, offset: libc::off_t, what: &str) -> io::Result<Mapping> {
        let (flags, fd) = if fd < 0 {
            (
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
            )
        } else {
            (libc::MAP_SHARED | libc::MAP_POPULATE, fd)
        };
        // SAFETY: a fresh mapping chosen by the kernel (addr NULL); no
        // existing memory is affected.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                offset,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(os_err(format!("mmap {what} ({len} bytes)")));
        }
        let ptr = NonNull::new(ptr.cast()).ok_or_else(|| io::Error::other("mmap returned NULL"))?;
        Ok(Mapping { ptr, len })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: ptr/len are exactly what mmap returned; nothing references
        // the mapping once its owner is dropped.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

// SAFETY: a Mapping is plain memory; access discipline is enforced by its owners
// (Umem: disjoint chunk ranges per socket; Ring: one owning socket).
unsafe impl Send for Mapping {}
// SAFETY: as above; shared references never write through the mapping.
unsafe impl Sync for Mapping {}

struct UmemInner {
    area: Mapping,
    /// The socket the UMEM is registered on; the first [`XskSocket`] binds it,
    /// later ones pass it as `sxdp_shared_umem_fd`.
    fd: OwnedFd,
    chunk_count: u32,
    state: Mutex<UmemState>,
}

struct UmemState {
    /// Unallocated chunk ranges `(first, count)`.
    free: Vec<(u32, u32)>,
    owner_bound: bool,
}

impl UmemState {
    /// First-fit allocation of `count` contiguous chunks.
    fn take(&mut self, count: u32) -> Option<u32> {
        let i = self.free.iter().position(|&(_, n)| n >= count)?;
        let (first, n) = self.free[i];
        if n == count {
            self.free.remove(i);
        } else {
            self.free[i] = (first + count, n - count);
        }
        Some(first)
    }

    fn free_count(&self) -> u32 {
        self.free.iter().map(|&(_, n)| n).sum()
    }
}

/// The start of the chunk holding `addr` if that chunk is one of the `count`
/// chunks from chunk index `first`; `None` for anything else (including ranges
/// that would overflow).
fn chunk_within(first: u32, count: u32, addr: u64) -> Option<u64> {
    let index = addr / CHUNK_SIZE as u64;
    let first = u64::from(first);
    (index >= first && index < first.checked_add(u64::from(count))?)
        .then_some(index * CHUNK_SIZE as u64)
}

/// A socket's chunk range; returned to the UMEM when the last reference is
/// dropped. The socket declares it as its last field so it drops after the
/// rings are unmapped and the fd is closed (only then has the kernel released
/// the socket and stopped writing into these chunks); an [`RxHeld`] holding
/// received frames keeps it alive too, so held chunks are never reused (and
/// the mapping never unmapped) while their slices can still be read.
struct ChunkLease {
    umem: Arc<UmemInner>,
    first: u32,
    count: u32,
    /// The registration socket's fd stays open (and bound) as long as the
    /// UMEM, so the kernel may keep filling its chunks: they are never reused.
    reusable: bool,
}

impl ChunkLease {
    /// Leases `count` contiguous chunks of `umem`. The first lease on a UMEM
    /// is the registration socket's (`reusable == false`).
    fn take(umem: &Arc<UmemInner>, count: u32, ifindex: u32, queue: u32) -> io::Result<ChunkLease> {
        let mut st = umem
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(first) = st.take(count) else {
            return Err(invalid_config(format!(
                "socket for ifindex {ifindex} queue {queue} wants {count} chunks, UMEM has {} left of {}",
                st.free_count(),
                umem.chunk_count
            )));
        };
        let owner = !st.owner_bound;
        st.owner_bound = true;
        Ok(ChunkLease {
            umem: umem.clone(),
            first,
            count,
            reusable: !owner,
        })
    }
}

impl Drop for ChunkLease {
    fn drop(&mut self) {
        if self.reusable {
            let mut st = self
                .umem
                .state
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            st.free.push((self.first, self.count));
        }
    }
}

/// A registered UMEM of `chunk_count` 4 KiB chunks, shareable by several sockets.
#[derive(Clone)]
pub struct Umem {
    inner: Arc<UmemInner>,
}

impl Umem {
    /// Maps and registers (`XDP_UMEM_REG`) a UMEM of `chunk_count` chunks.
    pub fn new(chunk_count: u32) -> io::Result<Umem> {
        if chunk_count == 0 {
            return Err(invalid_config("UMEM of 0 chunks".into()));
        }
        crate::raise_memlock_limit();
        let len = chunk_count as usize * CHUNK_SIZE;
        let area = Mapping::map(-1, len, 0, "UMEM")?;
        let fd = xdp_socket()?;
        let reg = libc::xdp_umem_reg {
            addr: area.ptr.as_ptr() as u64,
            len: len as u64,
            chunk_size: CHUNK_SIZE as u32,
            headroom: 0,
            flags: 0,
            tx_metadata_len: 0,
        };
        setsockopt(&fd, libc::XDP_UMEM_REG, &reg, "XDP_UMEM_REG")?;
        Ok(Umem {
            inner: Arc::new(UmemInner {
                area,
                fd,
                chunk_count,
                state: Mutex::new(UmemState {
                    free: vec![(0, chunk_count)],
                    owner_bound: false,
                }),
            }),
        })
    }

    /// Chunks not yet handed to a socket.
    pub fn free_chunks(&self) -> u32 {
        let st = self
            .inner
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        st.free_count()
    }
}

fn xdp_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2) call; the result is checked before use.
    let fd = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(os_err("socket(AF_XDP)"));
    }
    // SAFETY: fd is a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn setsockopt<T>(fd: &OwnedFd, opt: libc::c_int, val: &T, what: &str) -> io::Result<()> {
    // SAFETY: val points to a live T and the length passed is its size.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_XDP,
            opt,
            (val as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(os_err(what));
    }
    Ok(())
}

/// `getsockopt(SOL_XDP, opt)` into a plain-data `T`.
fn getsockopt<T>(fd: RawFd, opt: libc::c_int, what: &str) -> io::Result<T> {
    // SAFETY: T is a plain-data kernel struct (all-zero is a valid value),
    // filled by getsockopt below.
    let mut val: T = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: val/len are valid for writes; the kernel writes at most len bytes.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_XDP,
            opt,
            (&mut val as *mut T).cast(),
            &mut len,
        )
    };
    if rc < 0 {
        return Err(os_err(what));
    }
    Ok(val)
}

/// One ring's mapping and cached indices. `T` is the descriptor type:
/// `u64` addresses for fill/completion, `xdp_desc` for rx/tx.
struct Ring<T> {
    _map: Mapping,
    producer: NonNull<AtomicU32>,
    consumer: NonNull<AtomicU32>,
    flags: NonNull<AtomicU32>,
    descs: NonNull<T>,
    size: u32,
    /// Producer rings: next slot we write. Consumer rings: last producer index seen.
    cached_prod: u32,
    /// Producer rings: last consumer index seen. Consumer rings: next slot we read.
    cached_cons: u32,
}

impl<T: Copy> Ring<T> {
    fn map(
        fd: &OwnedFd,
        off: &libc::xdp_ring_offset,
        size: u32,
        pgoff: libc::off_t,
        what: &str,
    ) -> io::Result<Ring<T>> {
        let len = off.desc as usize + size as usize * std::mem::size_of::<T>();
        let map = Mapping::map(fd.as_raw_fd(), len, pgoff, what)?;
        let at = |o: u64| -> io::Result<NonNull<u8>> {
            if o as usize + 4 > len {
                return Err(io::Error::other(format!(
                    "{what}: offset {o} beyond mapping of {len}"
                )));
            }
            // SAFETY: o is within the mapping (checked above).
            Ok(unsafe { map.ptr.add(o as usize) })
        };
        let producer = at(off.producer)?.cast();
        let consumer = at(off.consumer)?.cast();
        let flags = at(off.flags)?.cast();
        let descs = at(off.desc)?.cast();
        Ok(Ring {
            _map: map,
            producer,
            consumer,
            flags,
            descs,
            size,
            cached_prod: 0,
            cached_cons: 0,
        })
    }

    fn producer(&self) -> &AtomicU32 {
        // SAFETY: points into our live mapping, 4-byte aligned by the kernel ABI.
        unsafe { self.producer.as_ref() }
    }

    fn consumer(&self) -> &AtomicU32 {
        // SAFETY: as for producer().
        unsafe { self.consumer.as_ref() }
    }

    fn needs_wakeup(&self) -> bool {
        // SAFETY: as for producer().
        unsafe { self.flags.as_ref() }.load(Ordering::Relaxed) & libc::XDP_RING_NEED_WAKEUP != 0
    }

    fn slot(&self, idx: u32) -> *mut T {
        // SAFETY: size is a power of two and the mapping holds `size` descriptors.
        unsafe { self.descs.as_ptr().add((idx & (self.size - 1)) as usize) }
    }

    // ---- producer side (fill, tx) ----

    /// Writes one descriptor. Callers keep at most `size` descriptors
    /// outstanding (see the fill and tx ring invariants on [`XskSocket`]), so
    /// the slot is one the kernel has consumed.
    fn push(&mut self, d: T) {
        // SAFETY: the slot is inside the ring (masked index) and not yet
        // published, so the kernel does not read it.
        unsafe { self.slot(self.cached_prod).write(d) };
        self.cached_prod = self.cached_prod.wrapping_add(1);
    }

    fn submit(&self) {
        // Release: descriptor writes happen-before the kernel sees the index.
        self.producer().store(self.cached_prod, Ordering::Release);
    }

    /// Descriptors submitted but not yet consumed by the kernel.
    fn outstanding(&mut self) -> u32 {
        self.cached_cons = self.consumer().load(Ordering::Acquire);
        self.cached_prod.wrapping_sub(self.cached_cons)
    }

    // ---- consumer side (rx, completion) ----

    /// Descriptors published by the kernel and not yet consumed; never more
    /// than the ring holds, whatever index the kernel shows.
    fn available(&mut self) -> u32 {
        // Acquire: the kernel's descriptor writes are visible after this.
        self.cached_prod = self.producer().load(Ordering::Acquire);
        self.cached_prod
            .wrapping_sub(self.cached_cons)
            .min(self.size)
    }

    /// The descriptor `ahead` places after the next one to consume, without
    /// consuming it; the caller checked `ahead < available()`.
    fn peek(&self, ahead: u32) -> T {
        // SAFETY: the slot is inside the ring (masked index) and published by
        // the kernel, which does not rewrite it until we release it.
        unsafe { self.slot(self.cached_cons.wrapping_add(ahead)).read() }
    }

    fn pop(&mut self) -> T {
        let d = self.peek(0);
        self.cached_cons = self.cached_cons.wrapping_add(1);
        d
    }

    fn release(&self) {
        // Release: our reads of the slots complete before the kernel reuses them.
        self.consumer().store(self.cached_cons, Ordering::Release);
    }
}

/// A socket's four rings.
struct Rings {
    rx: Ring<libc::xdp_desc>,
    tx: Ring<libc::xdp_desc>,
    fill: Ring<u64>,
    comp: Ring<u64>,
}

impl Rings {
    /// Sizes the rings on `fd` (before bind) and maps them.
    fn new(fd: &OwnedFd, ring_size: u32, layout: &Layout) -> io::Result<Rings> {
        for (opt, size, what) in [
            (libc::XDP_RX_RING, ring_size, "XDP_RX_RING"),
            (libc::XDP_TX_RING, ring_size, "XDP_TX_RING"),
            (
                libc::XDP_UMEM_FILL_RING,
                layout.fill_size,
                "XDP_UMEM_FILL_RING",
            ),
            (
                libc::XDP_UMEM_COMPLETION_RING,
                layout.comp_size,
                "XDP_UMEM_COMPLETION_RING",
            ),
        ] {
            setsockopt(fd, opt, &size, what)?;
        }
        let off: libc::xdp_mmap_offsets =
            getsockopt(fd.as_raw_fd(), libc::XDP_MMAP_OFFSETS, "XDP_MMAP_OFFSETS")?;
        Ok(Rings {
            rx: Ring::map(fd, &off.rx, ring_size, libc::XDP_PGOFF_RX_RING, "rx ring")?,
            tx: Ring::map(fd, &off.tx, ring_size, libc::XDP_PGOFF_TX_RING, "tx ring")?,
            fill: Ring::map(
                fd,
                &off.fr,
                layout.fill_size,
                libc::XDP_UMEM_PGOFF_FILL_RING as libc::off_t,
                "fill ring",
            )?,
            comp: Ring::map(
                fd,
                &off.cr,
                layout.comp_size,
                libc::XDP_UMEM_PGOFF_COMPLETION_RING as libc::off_t,
                "completion ring",
            )?,
        })
    }
}

/// How the first socket on a UMEM asks to move frames (later sockets inherit
/// what it got).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BindMode {
    /// Zero-copy if the driver supports it (with multi-buffer frames), else
    /// copy. See [`XskSocket::mode`] for what was obtained.
    #[default]
    Auto,
    /// `XDP_COPY`: works on every driver (veth).
    Copy,
    /// `XDP_ZEROCOPY`: the NIC DMAs into the UMEM; bind fails if unsupported.
    ZeroCopy,
}

/// How a bound socket moves frames, as the kernel reports it (`XDP_OPTIONS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum XskMode {
    /// The kernel copies frames between its buffers and the UMEM.
    #[default]
    Copy,
    /// The driver reads and writes the UMEM directly.
    ZeroCopy,
}

impl XskMode {
    pub fn as_str(self) -> &'static str {
        match self {
            XskMode::Copy => "copy",
            XskMode::ZeroCopy => "zero_copy",
        }
    }
}

impl std::fmt::Display for XskMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Sizes of one socket. The socket leases `rx_frames + tx_slots *
/// ceil(max_tx_frame / CHUNK_SIZE)` chunks ([`XskConfig::chunks`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XskConfig {
    /// Chunks kept in the fill ring for reception (a 9014-byte frame takes
    /// three in copy mode).
    pub rx_frames: u32,
    /// Transmit slots: frames lent, queued or in flight at once.
    pub tx_slots: u32,
    /// The longest frame the caller will transmit; each slot is this rounded
    /// up to whole chunks, at most [`MAX_TX_DESCS`] of them.
    pub max_tx_frame: usize,
    /// Size of the rx and tx rings (descriptors); a power of two that holds
    /// every descriptor of every slot.
    pub ring_size: u32,
    /// Ignored by sockets after the first on a UMEM (they inherit its mode).
    pub mode: BindMode,
}

impl Default for XskConfig {
    /// Underlay MTU 9000: slots of 9000 + 14 (Ethernet) + 4 (spare) bytes, i.e.
    /// three chunks.
    fn default() -> Self {
        XskConfig {
            rx_frames: 2048,
            tx_slots: 512,
            max_tx_frame: 9018,
            ring_size: 2048,
            mode: BindMode::Auto,
        }
    }
}

/// What a valid [`XskConfig`] works out to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    slot_chunks: u32,
    /// Chunks of the whole lease: rx chunks, then the tx slots.
    chunks: u32,
    fill_size: u32,
    comp_size: u32,
}

impl XskConfig {
    /// Chunks a socket with this configuration leases from the UMEM, or why
    /// the configuration is invalid.
    pub fn chunks(&self) -> io::Result<u32> {
        Ok(self.layout()?.chunks)
    }

    fn layout(&self) -> io::Result<Layout> {
        if !self.ring_size.is_power_of_two() {
            return Err(invalid_config(format!(
                "ring_size {} is not a power of two",
                self.ring_size
            )));
        }
        let slot_chunks = self.max_tx_frame.div_ceil(CHUNK_SIZE);
        if slot_chunks == 0 || slot_chunks > MAX_TX_DESCS {
            return Err(invalid_config(format!(
                "max_tx_frame {} must be 1..={} bytes ({MAX_TX_DESCS} chunks of {CHUNK_SIZE}, \
                 the most descriptors the kernel takes per frame)",
                self.max_tx_frame,
                MAX_TX_DESCS * CHUNK_SIZE
            )));
        }
        let slot_chunks = slot_chunks as u32;
        let tx_chunks = u64::from(self.tx_slots) * u64::from(slot_chunks);
        if self.tx_slots == 0 || tx_chunks > u64::from(self.ring_size) {
            return Err(invalid_config(format!(
                "tx_slots {} of {slot_chunks} chunks need {tx_chunks} tx descriptors: must be \
                 at least one slot and fit the tx ring (ring_size {})",
                self.tx_slots, self.ring_size
            )));
        }
        let tx_chunks = tx_chunks as u32;
        let fill_size = self.rx_frames.max(1).checked_next_power_of_two();
        let chunks = self.rx_frames.checked_add(tx_chunks);
        let (Some(fill_size), Some(chunks)) = (fill_size, chunks) else {
            return Err(invalid_config(format!(
                "rx_frames {} is too large",
                self.rx_frames
            )));
        };
        Ok(Layout {
            slot_chunks,
            chunks,
            fill_size,
            comp_size: tx_chunks.next_power_of_two(),
        })
    }
}

/// Why a frame was not queued for transmission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxError {
    /// No free transmit slot right now: kick and retry, or drop and count.
    Full,
    /// The frame (`len` bytes) is longer than a slot (`max`, i.e.
    /// [`XskSocket::slot_len`]).
    TooLong { len: usize, max: usize },
    /// A zero-length frame.
    Empty,
}

impl std::fmt::Display for TxError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TxError::Full => write!(f, "no free AF_XDP transmit slot"),
            TxError::TooLong { len, max } => {
                write!(
                    f,
                    "frame of {len} bytes exceeds the {max}-byte transmit slot"
                )
            }
            TxError::Empty => write!(f, "empty frame"),
        }
    }
}

impl std::error::Error for TxError {}

/// Socket counters: ours and the kernel's (`XDP_STATISTICS`). Serialisable so the
/// daemon's `stats` shows them as they are, without a copy to keep in step.
/// Gauges (current values, not totals) are marked as such.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct XskStats {
    /// How the socket moves frames (`copy` or `zero_copy`).
    pub mode: XskMode,
    /// Frames handed to the caller (held or passed to `recv_batch`'s callback).
    pub rx_frames: u64,
    pub rx_bytes: u64,
    /// Of those, frames that arrived as a chain of more than one descriptor.
    pub rx_multi_buffer: u64,
    /// Chains longer than [`MAX_RX_FRAME`] bytes or [`MAX_RX_PIECES`]
    /// descriptors: dropped.
    pub rx_oversize: u64,
    /// Descriptors not inside one of this socket's rx chunks, or for a chunk
    /// already held: their frame is dropped (kernel bug guard).
    pub rx_invalid_desc: u64,
    /// Of those, descriptors whose chunk is not one of this socket's rx chunks: not
    /// returned to the fill ring, since the chunk belongs to someone else (or to
    /// nobody) and handing it to the kernel would let it write there.
    pub rx_foreign_chunk: u64,
    /// Gauge: rx chunks taken off the rx ring and not yet released. While
    /// held they are not in the fill ring; a count near `rx_frames` of the
    /// config starves reception (`kernel_rx_fill_ring_empty_descs` grows).
    pub rx_chunks_held: u64,
    /// Frames submitted for transmission.
    pub tx_frames: u64,
    pub tx_bytes: u64,
    /// Frames whose every descriptor the kernel completed (slot free again).
    pub tx_completed: u64,
    /// `lend` (or `send`) found no free slot even after reclaiming completions.
    pub tx_full: u64,
    /// `submit` (or `send`) refused with [`TxError::TooLong`] or [`TxError::Empty`].
    pub tx_invalid: u64,
    /// `sendto` kicks that failed with an unexpected error.
    pub tx_kick_errors: u64,
    /// Completion-ring addresses that are not a submitted, uncompleted
    /// descriptor of one of this socket's slots: ignored, never free a slot
    /// (we would let the next frame be written where the kernel may read).
    pub tx_foreign_completion: u64,
    /// Gauge: slots lent to the caller and not yet submitted or given back.
    /// Growing without bound means lent slots are being dropped (leaked).
    pub tx_slots_lent: u64,
    /// Gauge: slots submitted whose descriptors have not all completed.
    pub tx_slots_in_flight: u64,
    /// Kernel: frames dropped, mostly for want of a fill-ring chunk (then
    /// `kernel_rx_fill_ring_empty_descs` grows too: release held frames
    /// sooner or give the socket more `rx_frames`).
    pub kernel_rx_dropped: u64,
    pub kernel_rx_invalid_descs: u64,
    /// Kernel: transmit descriptors it refused (their slot never completes).
    pub kernel_tx_invalid_descs: u64,
    /// Kernel: rx ring full, frame dropped.
    pub kernel_rx_ring_full: u64,
    /// Kernel: fill ring empty when a frame arrived.
    pub kernel_rx_fill_ring_empty_descs: u64,
    /// Kernel: tx ring empty at a wakeup.
    pub kernel_tx_ring_empty_descs: u64,
}

/// A transmit slot lent by [`XskSocket::lend`]: `slot_len()` contiguous bytes
/// of the UMEM the caller writes a frame into ([`XskSocket::slot_mut`]). Not
/// `Clone`: a slot goes back exactly once, by [`XskSocket::submit`] or
/// [`XskSocket::give_back`]; dropping it instead leaks the slot for the
/// socket's lifetime (counted in `tx_slots_lent`).
#[derive(Debug)]
#[must_use = "a lent slot must be submitted or given back"]
pub struct TxSlot {
    socket: u64,
    index: u32,
}

/// Where one transmit slot is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState {
    Free,
    Lent,
    /// Submitted; bit `k` is set while the descriptor of the slot's chunk `k`
    /// awaits its completion.
    InFlight {
        pending: u32,
    },
}

/// What a completion-ring address did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Completion {
    /// Completed one descriptor of a slot that still has others in flight.
    Partial,
    /// Completed a slot's last descriptor: the slot is free.
    SlotFree,
    /// Not a pending descriptor of ours: nothing changes.
    Foreign,
}

/// Transmit slot bookkeeping, apart from the rings so the completion rules are
/// tested without a kernel. Slot `i` is the `slot_chunks` chunks from chunk
/// index `first + i * slot_chunks`.
struct TxSlots {
    first: u32,
    slot_chunks: u32,
    state: Vec<SlotState>,
    /// Free slots, most recently completed last (reused first: warm in cache).
    free: Vec<u32>,
    lent: u32,
    in_flight: u32,
}

impl TxSlots {
    fn new(first: u32, slot_chunks: u32, slots: u32) -> TxSlots {
        TxSlots {
            first,
            slot_chunks,
            state: vec![SlotState::Free; slots as usize],
            free: (0..slots).rev().collect(),
            lent: 0,
            in_flight: 0,
        }
    }

    fn has_free(&self) -> bool {
        !self.free.is_empty()
    }

    fn lend(&mut self) -> Option<u32> {
        let i = self.free.pop()?;
        self.set(i, SlotState::Free, SlotState::Lent);
        self.lent += 1;
        Some(i)
    }

    fn give_back(&mut self, i: u32) {
        self.set(i, SlotState::Lent, SlotState::Free);
        self.lent -= 1;
        self.free.push(i);
    }

    /// Slot `i` was submitted as its first `descs` chunks.
    fn submitted(&mut self, i: u32, descs: u32) {
        let pending = u32::MAX >> (32 - descs);
        self.set(i, SlotState::Lent, SlotState::InFlight { pending });
        self.lent -= 1;
        self.in_flight += 1;
    }

    /// Accounts one completion-ring address. Only the exact address of a
    /// descriptor still pending counts, whatever order the kernel completes
    /// in; a slot is free once all of its descriptors have completed.
    fn complete(&mut self, addr: u64) -> Completion {
        let Some((i, bit)) = self.locate(addr) else {
            return Completion::Foreign;
        };
        let Some(SlotState::InFlight { pending }) = self.state.get_mut(i as usize) else {
            return Completion::Foreign;
        };
        if *pending & bit == 0 {
            return Completion::Foreign;
        }
        *pending &= !bit;
        if *pending != 0 {
            return Completion::Partial;
        }
        self.state[i as usize] = SlotState::Free;
        self.in_flight -= 1;
        self.free.push(i);
        Completion::SlotFree
    }

    /// The slot and chunk bit of a chunk-aligned address inside the slots.
    fn locate(&self, addr: u64) -> Option<(u32, u32)> {
        if !addr.is_multiple_of(CHUNK_SIZE as u64) {
            return None;
        }
        let count = u32::try_from(self.state.len())
            .ok()?
            .checked_mul(self.slot_chunks)?;
        let chunk = chunk_within(self.first, count, addr)? / CHUNK_SIZE as u64;
        let rel = (chunk - u64::from(self.first)) as u32;
        Some((rel / self.slot_chunks, 1 << (rel % self.slot_chunks)))
    }

    /// Byte offset of slot `i` in the UMEM.
    fn base(&self, i: u32) -> usize {
        (self.first as usize + i as usize * self.slot_chunks as usize) * CHUNK_SIZE
    }

    /// Moves slot `i` from `from` to `to`. Tokens are unique and checked
    /// against their socket, so `from` always holds.
    fn set(&mut self, i: u32, from: SlotState, to: SlotState) {
        let s = &mut self.state[i as usize];
        debug_assert_eq!(*s, from, "slot {i}");
        *s = to;
    }
}

/// Which of a socket's rx chunks are held (taken off the rx ring, not yet
/// released). A chunk goes back to the fill ring only if held and only once,
/// so the fill ring, which has room for every rx chunk, never overflows and
/// never holds a chunk twice, even if the kernel hands one out twice.
struct HeldChunks {
    first: u32,
    bits: Vec<u64>,
    held: u32,
}

impl HeldChunks {
    fn new(first: u32, count: u32) -> HeldChunks {
        HeldChunks {
            first,
            bits: vec![0; (count as usize).div_ceil(64)],
            held: 0,
        }
    }

    /// The bitmap word index and bit of `chunk`, an rx chunk address checked
    /// by `own_rx_chunk`.
    fn bit(&self, chunk: u64) -> Option<(usize, u64)> {
        let rel = (chunk / CHUNK_SIZE as u64).checked_sub(u64::from(self.first))?;
        let word = usize::try_from(rel / 64).ok()?;
        (word < self.bits.len()).then_some((word, 1 << (rel % 64)))
    }

    /// Marks `chunk` held; false if it already was.
    fn take(&mut self, chunk: u64) -> bool {
        let Some((word, bit)) = self.bit(chunk) else {
            return false;
        };
        let fresh = self.bits[word] & bit == 0;
        self.bits[word] |= bit;
        self.held += u32::from(fresh);
        fresh
    }

    /// Marks a held `chunk` returned.
    fn put_back(&mut self, chunk: u64) {
        if let Some((word, bit)) = self.bit(chunk) {
            self.held -= u32::from(self.bits[word] & bit != 0);
            self.bits[word] &= !bit;
        }
    }
}

/// Received frames held by the caller: their chunks stay out of the fill ring
/// until [`XskSocket::release`], so the frames can be read (or gathered by a
/// `writev`) straight from the UMEM. Owned by the caller and reused across
/// rounds: once its vectors have grown to a round's size it allocates nothing.
#[derive(Default)]
pub struct RxHeld {
    /// The lease of the socket the held chunks belong to. Keeps the mapping
    /// alive and the chunks from being reused by another socket while the
    /// frames can be read, and identifies the socket that must release them.
    lease: Option<Arc<ChunkLease>>,
    /// Every rx chunk taken since the last release, valid frame or not.
    chunks: Vec<u64>,
    /// Byte ranges in the UMEM of the valid frames' pieces.
    pieces: Vec<Range<usize>>,
    frames: Vec<HeldFrame>,
}

struct HeldFrame {
    /// Indices into `RxHeld::pieces`.
    pieces: Range<usize>,
    len: usize,
}

impl RxHeld {
    pub fn new() -> RxHeld {
        RxHeld::default()
    }

    /// Frames held.
    pub fn len(&self) -> usize {
        self.frames.len()
    }

    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// Frame `i`'s pieces. They borrow `self`, and [`XskSocket::release`]
    /// takes `&mut self`, so no piece is readable once its chunk may be
    /// written again.
    pub fn frame(&self, i: usize) -> Option<RxChain<'_>> {
        let f = self.frames.get(i)?;
        let base = self.lease.as_ref()?.umem.area.ptr;
        let mut chain = RxChain {
            pieces: [&[]; MAX_RX_PIECES],
            count: f.pieces.len(),
            len: f.len,
        };
        for (piece, r) in chain
            .pieces
            .iter_mut()
            .zip(self.pieces.get(f.pieces.clone())?)
        {
            // SAFETY: recv_held checked that `r` lies inside one rx chunk of
            // the socket whose lease we hold, hence inside the UMEM mapping,
            // which the lease keeps alive. The chunk is held: it is not in the
            // fill ring, so the kernel does not write it, and it is never
            // lent for transmission, so no `&mut` to it exists. The slice
            // borrows `self`, which release() needs mutably.
            *piece = unsafe { std::slice::from_raw_parts(base.as_ptr().add(r.start), r.len()) };
        }
        Some(chain)
    }

    /// All held frames, in arrival order.
    pub fn frames(&self) -> impl Iterator<Item = RxChain<'_>> + '_ {
        (0..self.len()).filter_map(|i| self.frame(i))
    }

    fn clear(&mut self) {
        self.lease = None;
        self.chunks.clear();
        self.pieces.clear();
        self.frames.clear();
    }
}

/// One held frame: its pieces (one per descriptor) in order, as slices of the
/// UMEM. No allocation: the pieces sit in a fixed array.
#[derive(Debug, Clone, Copy)]
pub struct RxChain<'a> {
    pieces: [&'a [u8]; MAX_RX_PIECES],
    count: usize,
    len: usize,
}

impl<'a> RxChain<'a> {
    pub fn pieces(&self) -> &[&'a [u8]] {
        &self.pieces[..self.count]
    }

    /// Total bytes over all pieces.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// How the next frame sits in the rx ring.
enum NextFrame {
    /// Its last descriptor is in the ring: it is this many descriptors.
    Whole(u32),
    /// More than [`MAX_RX_PIECES`] descriptors: dropped.
    TooLong,
    /// Its last descriptor is not published yet: leave it for the next call.
    Incomplete,
}

/// One AF_XDP socket bound to `(ifindex, queue)` on a shared [`Umem`].
///
/// Ring invariants that make unchecked pushes safe: the fill ring has room for
/// every rx chunk and a chunk goes back only once ([`HeldChunks`]); the tx
/// ring holds every descriptor of every slot and a slot is submitted only when
/// its previous descriptors have all completed.
pub struct XskSocket {
    /// `None` for the socket that reuses the UMEM's registration socket.
    own_fd: Option<OwnedFd>,
    rx: Ring<libc::xdp_desc>,
    tx: Ring<libc::xdp_desc>,
    fill: Ring<u64>,
    comp: Ring<u64>,
    slots: TxSlots,
    held: HeldChunks,
    /// `recv_batch`'s own hold, kept across calls.
    batch: RxHeld,
    /// Assembly buffer for `recv_batch`'s multi-descriptor frames (kept across calls).
    scratch: Vec<u8>,
    /// The rx ring holds the rest of a chain of more than [`MAX_RX_PIECES`]
    /// descriptors, being dropped.
    rx_discarding: bool,
    stats: XskStats,
    /// Ties lent [`TxSlot`]s to this socket.
    id: u64,
    ifindex: u32,
    queue: u32,
    /// How many of the lease's chunks (from its start) are rx chunks; the rest are tx.
    rx_chunks: u32,
    /// This socket's chunks; last so it drops after rings and fd (see [`ChunkLease`]).
    lease: Arc<ChunkLease>,
}

// SAFETY: the rings and chunks a socket touches are its own (see module doc);
// moving it to another thread moves that exclusive ownership with it.
unsafe impl Send for XskSocket {}

impl XskSocket {
    /// Creates a socket on `umem`, binds it to `(ifindex, queue)` and fills its
    /// fill ring. The first socket on a UMEM binds with
    /// `XDP_USE_NEED_WAKEUP | XDP_USE_SG` and the mode of `cfg.mode` (for
    /// [`BindMode::Auto`]: zero-copy, or copy if the driver refuses it); later
    /// ones with `XDP_SHARED_UMEM` only (they inherit the first socket's flags).
    pub fn new(umem: &Umem, ifindex: u32, queue: u32, cfg: XskConfig) -> io::Result<XskSocket> {
        let layout = cfg.layout()?;
        let lease = ChunkLease::take(&umem.inner, layout.chunks, ifindex, queue)?;
        let first = !lease.reusable;
        let own_fd = if first { None } else { Some(xdp_socket()?) };
        let fd = own_fd.as_ref().unwrap_or(&umem.inner.fd);
        let Rings {
            rx,
            tx,
            mut fill,
            comp,
        } = Rings::new(fd, cfg.ring_size, &layout)?;

        let rx_first = u64::from(lease.first);
        for i in 0..u64::from(cfg.rx_frames) {
            fill.push((rx_first + i) * CHUNK_SIZE as u64);
        }
        fill.submit();

        if first {
            bind_first(fd, ifindex, queue, cfg.mode).map_err(|e| {
                // The registration socket now has rings configured and cannot
                // be set up again; later sockets would fail to share it.
                io::Error::new(
                    e.kind(),
                    format!("{e}; the UMEM is unusable, create a new one"),
                )
            })?;
        } else {
            let sa = sockaddr(ifindex, queue, libc::XDP_SHARED_UMEM, &umem.inner.fd);
            bind_retrying(fd, &sa)?;
        }
        let mode = bound_mode(fd.as_raw_fd())?;
        let tx_first = lease.first + cfg.rx_frames;
        Ok(XskSocket {
            own_fd,
            rx,
            tx,
            fill,
            comp,
            slots: TxSlots::new(tx_first, layout.slot_chunks, cfg.tx_slots),
            held: HeldChunks::new(lease.first, cfg.rx_frames),
            batch: RxHeld::new(),
            scratch: Vec::with_capacity(MAX_RX_FRAME),
            rx_discarding: false,
            stats: XskStats {
                mode,
                ..XskStats::default()
            },
            id: NEXT_SOCKET_ID.fetch_add(1, Ordering::Relaxed),
            ifindex,
            queue,
            rx_chunks: cfg.rx_frames,
            lease: Arc::new(lease),
        })
    }

    fn fd(&self) -> RawFd {
        self.own_fd
            .as_ref()
            .unwrap_or(&self.lease.umem.fd)
            .as_raw_fd()
    }

    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    pub fn queue(&self) -> u32 {
        self.queue
    }

    /// How the socket moves frames, as the kernel reports it after bind.
    pub fn mode(&self) -> XskMode {
        self.stats.mode
    }

    /// The chunk holding `addr` if it is one of this socket's rx chunks (the only
    /// addresses that may go to its fill ring or be read as received frames).
    fn own_rx_chunk(&self, addr: u64) -> Option<u64> {
        chunk_within(self.lease.first, self.rx_chunks, addr)
    }

    // ---- receive ----

    /// Takes the descriptors of up to `max_frames` whole frames off the rx
    /// ring into `held`, without returning their chunks to the fill ring.
    /// Returns how many valid frames were added (`held.frame(i)`, after any
    /// frames already held). A frame whose last descriptor is not in the ring
    /// yet stays there for the next call.
    ///
    /// Invalid and oversize frames are counted and not added, but their
    /// chunks are held too: always [`release`](XskSocket::release) `held`,
    /// even when this returns 0. Holding too long starves the fill ring.
    ///
    /// # Panics
    /// If `held` holds chunks of another socket.
    pub fn recv_held(&mut self, held: &mut RxHeld, max_frames: usize) -> usize {
        let avail = self.rx.available();
        if avail == 0 || max_frames == 0 {
            return 0;
        }
        self.adopt(held);
        let (mut taken, mut frames) = (0, 0);
        while taken < avail && frames < max_frames {
            if self.rx_discarding {
                taken += self.discard_chain(held, avail - taken);
                continue;
            }
            match self.next_frame(avail - taken) {
                NextFrame::Whole(n) => {
                    frames += usize::from(self.take_frame(held, n));
                    taken += n;
                }
                NextFrame::TooLong => {
                    self.stats.rx_oversize += 1;
                    self.rx_discarding = true;
                }
                NextFrame::Incomplete => break,
            }
        }
        if taken > 0 {
            self.rx.release();
        }
        frames
    }

    /// Returns every chunk `held` holds to the fill ring (waking the kernel if
    /// it asks) and empties `held`. Only this socket's rx chunks are there:
    /// `recv_held` never holds anything else.
    ///
    /// # Panics
    /// If `held` holds chunks of another socket.
    pub fn release(&mut self, held: &mut RxHeld) {
        if !held.chunks.is_empty() {
            assert!(
                self.owns(held),
                "RxHeld released on a socket other than the one it was received on"
            );
            for &chunk in &held.chunks {
                self.held.put_back(chunk);
                self.fill.push(chunk);
            }
            self.fill.submit();
            if self.fill.needs_wakeup() {
                self.wake_rx();
            }
        }
        held.clear();
    }

    /// Receives up to `max` frames, calling `f` with each whole frame, then
    /// releases them. A frame in one descriptor is passed straight from the
    /// UMEM; a chain is assembled in a reusable scratch buffer. Returns the
    /// number of frames delivered.
    pub fn recv_batch(&mut self, max: usize, mut f: impl FnMut(&[u8])) -> usize {
        let mut held = std::mem::take(&mut self.batch);
        let n = self.recv_held(&mut held, max);
        for frame in held.frames() {
            match frame.pieces() {
                [one] => f(one),
                pieces => {
                    self.scratch.clear();
                    for p in pieces {
                        self.scratch.extend_from_slice(p);
                    }
                    f(&self.scratch);
                }
            }
        }
        self.release(&mut held);
        self.batch = held;
        n
    }

    fn owns(&self, held: &RxHeld) -> bool {
        held.lease
            .as_ref()
            .is_some_and(|l| Arc::ptr_eq(l, &self.lease))
    }

    /// Ties `held` to this socket before chunks go into it.
    fn adopt(&self, held: &mut RxHeld) {
        if self.owns(held) {
            return;
        }
        assert!(
            held.chunks.is_empty(),
            "RxHeld holds another socket's frames: release them there first"
        );
        held.lease = Some(self.lease.clone());
    }

    /// Where the next frame ends, looking at most [`MAX_RX_PIECES`]
    /// descriptors ahead among the `avail` not yet taken.
    fn next_frame(&self, avail: u32) -> NextFrame {
        let window = avail.min(MAX_RX_PIECES as u32);
        match (0..window).find(|&i| self.rx.peek(i).options & libc::XDP_PKT_CONTD == 0) {
            Some(last) => NextFrame::Whole(last + 1),
            None if window == MAX_RX_PIECES as u32 => NextFrame::TooLong,
            None => NextFrame::Incomplete,
        }
    }

    /// Takes the `n` descriptors of one frame into `held`; true if it is a
    /// valid frame (added to `held.frames`).
    fn take_frame(&mut self, held: &mut RxHeld, n: u32) -> bool {
        let start = held.pieces.len();
        let mut valid = true;
        let mut len = 0;
        for _ in 0..n {
            match self.take_desc(held).0 {
                Some(piece) if valid => {
                    len += piece.len();
                    held.pieces.push(piece);
                }
                _ => valid = false,
            }
        }
        if !valid || len > MAX_RX_FRAME {
            held.pieces.truncate(start);
            self.stats.rx_oversize += u64::from(valid);
            return false;
        }
        held.frames.push(HeldFrame {
            pieces: start..held.pieces.len(),
            len,
        });
        self.stats.rx_frames += 1;
        self.stats.rx_bytes += len as u64;
        self.stats.rx_multi_buffer += u64::from(n > 1);
        true
    }

    /// Drops what is left of an overlong chain, up to `avail` descriptors;
    /// its chunks are held like any other. Returns the descriptors taken.
    fn discard_chain(&mut self, held: &mut RxHeld, avail: u32) -> u32 {
        let mut taken = 0;
        while taken < avail && self.rx_discarding {
            self.rx_discarding = self.take_desc(held).1;
            taken += 1;
        }
        taken
    }

    /// Pops one rx descriptor. Its chunk goes into `held` if it is one of our
    /// rx chunks not already held; its byte range is returned if, in
    /// addition, it lies inside that chunk. Anything else is counted and
    /// gives `None`. The second value is `XDP_PKT_CONTD`.
    fn take_desc(&mut self, held: &mut RxHeld) -> (Option<Range<usize>>, bool) {
        let d = self.rx.pop();
        let more = d.options & libc::XDP_PKT_CONTD != 0;
        let Some(chunk) = self.own_rx_chunk(d.addr) else {
            self.stats.rx_invalid_desc += 1;
            self.stats.rx_foreign_chunk += 1;
            return (None, more);
        };
        if !self.held.take(chunk) {
            self.stats.rx_invalid_desc += 1;
            return (None, more);
        }
        held.chunks.push(chunk);
        let end = d.addr.checked_add(u64::from(d.len));
        match end.filter(|&end| end <= chunk + CHUNK_SIZE as u64) {
            Some(end) => (Some(d.addr as usize..end as usize), more),
            None => {
                self.stats.rx_invalid_desc += 1;
                (None, more)
            }
        }
    }

    /// Tells the driver fresh fill-ring chunks are there (need-wakeup protocol).
    fn wake_rx(&self) {
        // SAFETY: a zero-length recvfrom with NULL buffers is the documented
        // AF_XDP wakeup; no memory is written.
        unsafe {
            libc::recvfrom(
                self.fd(),
                std::ptr::null_mut(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
    }

    // ---- transmit ----

    /// Bytes a slot holds: `max_tx_frame` rounded up to whole chunks.
    pub fn slot_len(&self) -> usize {
        self.slots.slot_chunks as usize * CHUNK_SIZE
    }

    /// Lends a free transmit slot, reclaiming completions first if none is
    /// free. `None` (counted `tx_full`) while every slot is lent or in
    /// flight: kick and retry, or drop.
    pub fn lend(&mut self) -> Option<TxSlot> {
        if !self.slots.has_free() {
            self.reclaim();
        }
        let Some(index) = self.slots.lend() else {
            self.stats.tx_full += 1;
            return None;
        };
        Some(TxSlot {
            socket: self.id,
            index,
        })
    }

    /// The whole of a lent slot's bytes in the UMEM ([`slot_len`](Self::slot_len),
    /// one contiguous range) for the caller to write a frame into.
    ///
    /// # Panics
    /// If `slot` was lent by another socket.
    pub fn slot_mut(&mut self, slot: &TxSlot) -> &mut [u8] {
        let base = self.slots.base(self.own_slot(slot));
        let len = self.slot_len();
        // SAFETY: the slot is one of this socket's tx chunk runs, inside the
        // UMEM mapping (which the lease keeps alive). It is lent, so the
        // kernel is not reading it: a slot is lent only once every descriptor
        // it was last submitted with has completed. Rx pieces never cover tx
        // chunks, other sockets use other chunks, and the borrow of `self`
        // keeps this the only reference into the slot.
        unsafe { std::slice::from_raw_parts_mut(self.lease.umem.area.ptr.as_ptr().add(base), len) }
    }

    /// Queues the first `len` bytes of a lent slot as one frame: one
    /// descriptor per chunk, `XDP_PKT_CONTD` on all but the last. Call
    /// [`kick`](Self::kick) after a batch. An invalid `len` gives the slot
    /// back (counted `tx_invalid`).
    ///
    /// # Panics
    /// If `slot` was lent by another socket.
    pub fn submit(&mut self, slot: TxSlot, len: usize) -> Result<(), TxError> {
        let i = self.own_slot(&slot);
        if let Err(e) = self.check_len(len) {
            self.slots.give_back(i);
            return Err(e);
        }
        let base = self.slots.base(i) as u64;
        let descs = len.div_ceil(CHUNK_SIZE);
        for k in 0..descs {
            let offset = k * CHUNK_SIZE;
            self.tx.push(libc::xdp_desc {
                addr: base + offset as u64,
                len: (len - offset).min(CHUNK_SIZE) as u32,
                options: if k + 1 < descs {
                    libc::XDP_PKT_CONTD
                } else {
                    0
                },
            });
        }
        self.tx.submit();
        self.slots.submitted(i, descs as u32);
        self.stats.tx_frames += 1;
        self.stats.tx_bytes += len as u64;
        Ok(())
    }

    /// Returns a lent slot unused.
    ///
    /// # Panics
    /// If `slot` was lent by another socket.
    pub fn give_back(&mut self, slot: TxSlot) {
        let i = self.own_slot(&slot);
        self.slots.give_back(i);
    }

    /// Queues a copy of `frame` (lend, copy into the slot, submit). Call
    /// [`kick`](Self::kick) after a batch.
    pub fn send(&mut self, frame: &[u8]) -> Result<(), TxError> {
        self.check_len(frame.len())?;
        let slot = self.lend().ok_or(TxError::Full)?;
        self.slot_mut(&slot)[..frame.len()].copy_from_slice(frame);
        self.submit(slot, frame.len())
    }

    /// A frame of `len` bytes fits a slot; otherwise counted `tx_invalid`.
    fn check_len(&mut self, len: usize) -> Result<(), TxError> {
        let max = self.slot_len();
        let err = match len {
            0 => TxError::Empty,
            len if len > max => TxError::TooLong { len, max },
            _ => return Ok(()),
        };
        self.stats.tx_invalid += 1;
        Err(err)
    }

    fn own_slot(&self, slot: &TxSlot) -> u32 {
        assert_eq!(
            slot.socket, self.id,
            "TxSlot used on a socket that did not lend it"
        );
        slot.index
    }

    /// Frees the slots whose descriptors have all completed. Any other
    /// address is counted and changes nothing, which keeps `slot_mut` away
    /// from chunks the kernel may still read.
    fn reclaim(&mut self) {
        let n = self.comp.available();
        for _ in 0..n {
            match self.slots.complete(self.comp.pop()) {
                Completion::Partial => {}
                Completion::SlotFree => self.stats.tx_completed += 1,
                Completion::Foreign => self.stats.tx_foreign_completion += 1,
            }
        }
        if n > 0 {
            self.comp.release();
        }
    }

    /// Makes the kernel process the tx ring (needed in copy mode and when the
    /// ring asks for a wakeup) and reclaims completed slots. Copy mode sends
    /// a bounded batch per call, so this repeats while descriptors remain.
    pub fn kick(&mut self) {
        for _ in 0..64 {
            if self.tx.outstanding() == 0 || !self.tx.needs_wakeup() {
                break;
            }
            // SAFETY: a zero-length sendto with NULL buffers is the documented
            // AF_XDP transmit wakeup; no memory is read.
            let rc = unsafe {
                libc::sendto(
                    self.fd(),
                    std::ptr::null(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null(),
                    0,
                )
            };
            if rc < 0 {
                match io::Error::last_os_error().raw_os_error() {
                    // Busy/backpressure: the remaining descriptors go on the next kick.
                    Some(libc::EAGAIN) | Some(libc::EBUSY) | Some(libc::ENOBUFS) => continue,
                    _ => {
                        self.stats.tx_kick_errors += 1;
                        break;
                    }
                }
            }
        }
        self.reclaim();
    }

    // ---- state ----

    /// Our counters plus the kernel's `XDP_STATISTICS`.
    pub fn stats(&self) -> io::Result<XskStats> {
        let k: libc::xdp_statistics =
            getsockopt(self.fd(), libc::XDP_STATISTICS, "XDP_STATISTICS")?;
        Ok(XskStats {
            rx_chunks_held: u64::from(self.held.held),
            tx_slots_lent: u64::from(self.slots.lent),
            tx_slots_in_flight: u64::from(self.slots.in_flight),
            kernel_rx_dropped: k.rx_dropped,
            kernel_rx_invalid_descs: k.rx_invalid_descs,
            kernel_tx_invalid_descs: k.tx_invalid_descs,
            kernel_rx_ring_full: k.rx_ring_full,
            kernel_rx_fill_ring_empty_descs: k.rx_fill_ring_empty_descs,
            kernel_tx_ring_empty_descs: k.tx_ring_empty_descs,
            ..self.stats
        })
    }

    /// Waits up to `timeout` for received frames (poll POLLIN).
    pub fn wait_rx(&self, timeout: Duration) -> io::Result<bool> {
        let mut pfd = libc::pollfd {
            fd: self.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let rc = unsafe {
            libc::poll(
                &mut pfd,
                1,
                timeout.as_millis().min(i32::MAX as u128) as i32,
            )
        };
        if rc < 0 {
            return Err(os_err("poll AF_XDP socket"));
        }
        Ok(rc > 0)
    }
}

impl AsRawFd for XskSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd()
    }
}

fn sockaddr(ifindex: u32, queue: u32, flags: u16, shared: &OwnedFd) -> libc::sockaddr_xdp {
    let shared_umem = flags & libc::XDP_SHARED_UMEM != 0;
    libc::sockaddr_xdp {
        sxdp_family: libc::AF_XDP as u16,
        sxdp_flags: flags,
        sxdp_ifindex: ifindex,
        sxdp_queue_id: queue,
        sxdp_shared_umem_fd: if shared_umem {
            shared.as_raw_fd() as u32
        } else {
            0
        },
    }
}

/// Binds the UMEM's registration socket `fd`, the first on the UMEM.
/// [`BindMode::Auto`] tries zero-copy and, if the driver refuses it, binds
/// the same socket again in copy mode: a failed bind leaves the socket's
/// rings (and the fill ring's chunks) as they were.
fn bind_first(fd: &OwnedFd, ifindex: u32, queue: u32, mode: BindMode) -> io::Result<()> {
    let bind = |m: u16| {
        let flags = libc::XDP_USE_NEED_WAKEUP | libc::XDP_USE_SG | m;
        bind_retrying(fd, &sockaddr(ifindex, queue, flags, fd))
    };
    match mode {
        BindMode::Copy => bind(libc::XDP_COPY),
        BindMode::ZeroCopy => bind(libc::XDP_ZEROCOPY),
        BindMode::Auto => match bind(libc::XDP_ZEROCOPY) {
            Err(zc) if zero_copy_refused(&zc) => {
                tracing::info!(ifindex, queue, error = %zc, "AF_XDP zero-copy refused, binding in copy mode");
                bind(libc::XDP_COPY)
                    .map_err(|e| io::Error::new(e.kind(), format!("{e} (after zero-copy: {zc})")))
            }
            r => r,
        },
    }
}

/// The errors a driver gives when it cannot do zero-copy (with multi-buffer
/// frames): EOPNOTSUPP (no AF_XDP zero-copy support, as on veth, or no
/// zero-copy multi-buffer) or EINVAL (a driver refusing this UMEM's layout).
fn zero_copy_refused(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::Unsupported | io::ErrorKind::InvalidInput
    )
}

/// The mode the kernel bound `fd` in.
fn bound_mode(fd: RawFd) -> io::Result<XskMode> {
    let o: libc::xdp_options = getsockopt(fd, libc::XDP_OPTIONS, "XDP_OPTIONS")?;
    Ok(if o.flags & libc::XDP_OPTIONS_ZEROCOPY != 0 {
        XskMode::ZeroCopy
    } else {
        XskMode::Copy
    })
}

fn bind_retrying(fd: &OwnedFd, sa: &libc::sockaddr_xdp) -> io::Result<()> {
    let deadline = std::time::Instant::now() + BIND_BUSY_RETRY;
    loop {
        // SAFETY: sa is a valid sockaddr_xdp and the length matches it.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (sa as *const libc::sockaddr_xdp).cast(),
                std::mem::size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EBUSY) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        return Err(io::Error::new(
            e.kind(),
            format!(
                "bind AF_XDP to ifindex {} queue {} (flags {:#x}): {e}",
                sa.sxdp_ifindex, sa.sxdp_queue_id, sa.sxdp_flags
            ),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testnet::{PacketSocket, VethPair, MAC_A, MAC_B};
    use crate::xdp::{AttachMode, Counter, SteeringProgram};
    use etherparse::PacketBuilder;
    use std::net::Ipv6Addr;
    use std::thread::JoinHandle;
    use std::time::Instant;

    const C: u64 = CHUNK_SIZE as u64;

    /// The lease check that guards the fill ring and the tx slots: only addresses of
    /// chunks in `[first, first + count)` pass, aligned down to their chunk.
    #[test]
    fn chunk_within_accepts_only_the_lease() {
        // Chunks 10..14.
        assert_eq!(chunk_within(10, 4, 10 * C), Some(10 * C));
        assert_eq!(chunk_within(10, 4, 10 * C + 256), Some(10 * C));
        assert_eq!(chunk_within(10, 4, 14 * C - 1), Some(13 * C));
        assert_eq!(chunk_within(10, 4, 14 * C), None);
        assert_eq!(chunk_within(10, 4, 10 * C - 1), None);
        assert_eq!(chunk_within(10, 4, 0), None);
        assert_eq!(chunk_within(10, 0, 10 * C), None);
        assert_eq!(chunk_within(10, 4, u64::MAX), None);
        assert_eq!(chunk_within(u32::MAX, u32::MAX, u64::MAX), None);
    }

    /// A slot is free again only when every descriptor it was submitted with
    /// has completed, in any order; anything else is foreign and frees nothing.
    #[test]
    fn tx_slot_completions() {
        // Slot 0: chunks 100..103, slot 1: chunks 103..106.
        let mut s = TxSlots::new(100, 3, 2);
        assert_eq!(s.base(1), 103 * CHUNK_SIZE);
        assert_eq!((s.lend(), s.lend(), s.lend()), (Some(0), Some(1), None));
        s.submitted(0, 3);
        s.submitted(1, 1);
        assert_eq!((s.lent, s.in_flight), (0, 2));
        for foreign in [
            99 * C,        // before the slots
            106 * C,       // after them
            u64::MAX,      // nowhere
            100 * C + 256, // not a descriptor address we submitted
            104 * C,       // slot 1's second chunk: slot 1 was one descriptor
        ] {
            assert_eq!(s.complete(foreign), Completion::Foreign, "{foreign:#x}");
        }
        // Out of order; a repeated completion does not count twice.
        assert_eq!(s.complete(102 * C), Completion::Partial);
        assert_eq!(s.complete(102 * C), Completion::Foreign);
        assert_eq!(s.complete(100 * C), Completion::Partial);
        assert!(!s.has_free(), "slot 0 still has chunk 101 in flight");
        assert_eq!(s.complete(101 * C), Completion::SlotFree);
        assert_eq!(s.complete(100 * C), Completion::Foreign, "slot 0 is free");
        // A lent slot has nothing in flight either.
        assert_eq!(s.lend(), Some(0));
        assert_eq!(s.complete(100 * C), Completion::Foreign, "slot 0 is lent");
        assert_eq!(s.complete(103 * C), Completion::SlotFree);
        s.give_back(0);
        assert_eq!((s.lent, s.in_flight, s.free.len()), (0, 0, 2));
    }

    /// An rx chunk is held at most once, so it goes back to the fill ring once.
    #[test]
    fn held_chunks_are_taken_once() {
        let mut h = HeldChunks::new(10, 70);
        assert!(h.take(10 * C));
        assert!(!h.take(10 * C), "already held");
        assert!(h.take(79 * C), "the last chunk, in the second bitmap word");
        assert_eq!(h.held, 2);
        h.put_back(10 * C);
        assert_eq!(h.held, 1);
        assert!(h.take(10 * C));
    }

    #[test]
    fn config_layout_and_errors() {
        let d = XskConfig::default();
        assert_eq!(
            d.layout().unwrap(),
            Layout {
                slot_chunks: 3,
                chunks: 2048 + 512 * 3,
                fill_size: 2048,
                comp_size: 2048,
            }
        );
        let bad = |cfg: XskConfig, want: &str| {
            let e = cfg.chunks().expect_err(want).to_string();
            assert!(e.contains(want), "{e:?} should name {want:?}");
        };
        bad(
            XskConfig {
                ring_size: 1000,
                ..d
            },
            "ring_size 1000",
        );
        bad(
            XskConfig {
                max_tx_frame: 0,
                ..d
            },
            "max_tx_frame 0",
        );
        bad(
            XskConfig {
                max_tx_frame: MAX_TX_DESCS * CHUNK_SIZE + 1,
                ..d
            },
            "max_tx_frame 73729",
        );
        bad(XskConfig { tx_slots: 0, ..d }, "tx_slots 0");
        bad(
            XskConfig { tx_slots: 683, ..d },
            "tx_slots 683 of 3 chunks need 2049 tx descriptors",
        );
        bad(
            XskConfig {
                rx_frames: u32::MAX,
                ..d
            },
            "rx_frames 4294967295",
        );
    }

    const A: [u8; 16] = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x0a];
    const B: [u8; 16] = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x0b];
    /// EtherType of the raw frames the socket transmits (local experimental).
    const TEST_ETHERTYPE: [u8; 2] = [0x88, 0xb5];

    /// An Ethernet/IPv6/UDP frame of exactly `total` bytes from B to `dst`.
    fn udp_frame(dst: [u8; 16], dport: u16, total: usize, seed: u8) -> Vec<u8> {
        let payload: Vec<u8> = (0..total - 14 - 40 - 8)
            .map(|i| (i as u8).wrapping_mul(7) ^ seed)
            .collect();
        let mut out = Vec::new();
        PacketBuilder::ethernet2(MAC_B, MAC_A)
            .ipv6(B, dst, 64)
            .udp(40000, dport)
            .write(&mut out, &payload)
            .expect("build frame");
        assert_eq!(out.len(), total);
        out
    }

    /// A frame of `len` bytes from A to B with [`TEST_ETHERTYPE`]; byte 14 is `tag`.
    fn raw_frame(len: usize, tag: u8) -> Vec<u8> {
        let mut f = vec![0u8; len];
        f[..6].copy_from_slice(&MAC_B);
        f[6..12].copy_from_slice(&MAC_A);
        f[12..14].copy_from_slice(&TEST_ETHERTYPE);
        for (i, b) in f[14..].iter_mut().enumerate() {
            *b = (i % 251) as u8 ^ tag;
        }
        f[14] = tag;
        f
    }

    fn ifindex(name: &str) -> u32 {
        crate::netlink::Netlink::open()
            .unwrap()
            .link_by_name(name)
            .unwrap()
            .ifindex
    }

    /// Native XDP on `va` steering Geneve for A into a socket on queue 0 of a
    /// UMEM of `umem_chunks`.
    fn steered_socket(umem_chunks: u32, cfg: XskConfig) -> (SteeringProgram, Umem, XskSocket) {
        let mut prog = SteeringProgram::attach("va", &[Ipv6Addr::from(A)], AttachMode::Native)
            .expect("attach native XDP with frags at MTU 9000");
        let umem = Umem::new(umem_chunks).unwrap();
        let sock = XskSocket::new(&umem, ifindex("va"), 0, cfg).expect("bind AF_XDP");
        prog.register_socket(0, &sock).unwrap();
        (prog, umem, sock)
    }

    /// Sends `frames` from the peer `vb` in namespace `ns`.
    fn peer_send(ns: &str, frames: Vec<Vec<u8>>) {
        crate::netns::run_in_netns(ns, move || {
            let ps = PacketSocket::open("vb").unwrap();
            for f in &frames {
                ps.send(f);
            }
        })
        .unwrap();
    }

    /// Receives up to `want` [`TEST_ETHERTYPE`] frames on the peer `vb` in
    /// namespace `ns` (3 s at most), on a thread bound before this returns.
    fn peer_capture(ns: &str, want: usize) -> JoinHandle<Vec<Vec<u8>>> {
        let ns = ns.to_string();
        let rx = std::thread::spawn(move || {
            crate::netns::run_in_netns(&ns, move || {
                let ps = PacketSocket::open("vb").unwrap();
                let mut seen = Vec::new();
                while seen.len() < want {
                    match ps.recv_matching(Duration::from_secs(3), |f| {
                        f.len() > 14 && f[12..14] == TEST_ETHERTYPE
                    }) {
                        Some(f) => seen.push(f),
                        None => break,
                    }
                }
                seen
            })
            .unwrap()
        });
        std::thread::sleep(Duration::from_millis(200)); // let the receiver bind
        rx
    }

    fn recv_frames(sock: &mut XskSocket, want: usize) -> Vec<Vec<u8>> {
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(3);
        while got.len() < want && Instant::now() < deadline {
            sock.wait_rx(Duration::from_millis(100)).expect("poll");
            sock.recv_batch(64, |f| got.push(f.to_vec()));
        }
        got
    }

    /// Holds frames until `held` has `want` (3 s at most); returns how many it has.
    fn hold_frames(sock: &mut XskSocket, held: &mut RxHeld, want: usize) -> usize {
        let deadline = Instant::now() + Duration::from_secs(3);
        while held.len() < want && Instant::now() < deadline {
            sock.wait_rx(Duration::from_millis(100)).expect("poll");
            sock.recv_held(held, want - held.len());
        }
        held.len()
    }

    fn concat(chain: &RxChain<'_>) -> Vec<u8> {
        chain.pieces().concat()
    }

    /// The XDP program steers Geneve for our address (small and multi-buffer
    /// frames) into the socket, passes everything else to the kernel, and a
    /// 9014-byte frame sent from the socket reaches the peer intact.
    #[test]
    fn veth_steering_rx_tx_multibuffer() {
        let pair = VethPair::new(9000);
        let b_name = pair.b.name.clone();
        pair.a.run(move || {
            let cfg = XskConfig {
                rx_frames: 512,
                tx_slots: 128,
                max_tx_frame: 4 * CHUNK_SIZE,
                ring_size: 512,
                mode: BindMode::Copy,
            };
            let (mut prog, umem, mut sock) = steered_socket(2048, cfg);
            assert_eq!(umem.free_chunks(), 1024);

            let small = udp_frame(A, 6081, 120, 1);
            let big = udp_frame(A, 6081, 8900, 2);
            let not_ours = udp_frame(
                [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x99],
                6081,
                100,
                3,
            );
            let not_geneve = udp_frame(A, 9999, 100, 4);
            let mut tagged = Vec::new();
            PacketBuilder::ethernet2(MAC_B, MAC_A)
                .single_vlan(etherparse::VlanId::try_new(7).unwrap())
                .ipv6(B, A, 64)
                .udp(40000, 6081)
                .write(&mut tagged, &[0xab; 64])
                .unwrap();
            peer_send(
                &b_name,
                vec![small.clone(), big.clone(), not_ours, not_geneve, tagged],
            );

            let got = recv_frames(&mut sock, 2);
            assert_eq!(got.len(), 2, "steered frames received");
            assert_eq!(got[0], small);
            assert_eq!(
                got[1], big,
                "8900-byte frame reassembled from its descriptor chain"
            );
            let st = sock.stats().unwrap();
            assert_eq!(st.rx_frames, 2);
            assert_eq!(st.rx_multi_buffer, 1);
            assert_eq!(st.rx_chunks_held, 0, "recv_batch releases what it received");
            assert_eq!(st.kernel_rx_dropped + st.kernel_rx_ring_full, 0);
            assert_eq!(prog.counter(Counter::Redirected).unwrap(), 2);
            // The engine takes untagged underlay frames only: tagged Geneve, even
            // to our address, is the kernel's.
            assert_eq!(prog.counter(Counter::PassedVlanTagged).unwrap(), 1);
            assert_eq!(prog.counter(Counter::PassedNotOurs).unwrap(), 1);
            assert_eq!(prog.counter(Counter::PassedNotGeneve).unwrap(), 1);

            // The kernel still gets NDP and ICMPv6: ping from the peer works.
            let ping = std::process::Command::new("ip")
                .args([
                    "netns", "exec", &b_name, "ping", "-6", "-q", "-c", "1", "-W", "3", "fd00::a",
                ])
                .stdout(std::process::Stdio::null())
                .status()
                .unwrap();
            assert!(ping.success(), "ping through the XDP program");
            assert!(
                prog.counter(Counter::PassedNotUdp).unwrap() >= 2,
                "NDP + echo passed"
            );
            let mut nothing = 0;
            sock.recv_batch(64, |_| nothing += 1);
            assert_eq!(nothing, 0, "kernel traffic must not reach the socket");

            // Transmit a full-MTU frame (three chunks) and see it on the peer.
            let jumbo = raw_frame(9014, 0);
            let rx = peer_capture(&b_name, 1);
            sock.send(&jumbo).expect("queue jumbo frame");
            sock.kick();
            assert_eq!(
                rx.join().unwrap(),
                vec![jumbo],
                "jumbo frame arrived intact"
            );
            let too_long = 4 * CHUNK_SIZE + 1;
            assert_eq!(
                sock.send(&vec![0u8; too_long]),
                Err(TxError::TooLong {
                    len: too_long,
                    max: 4 * CHUNK_SIZE
                })
            );
            assert_eq!(sock.send(&[]), Err(TxError::Empty));
            let st = sock.stats().unwrap();
            assert_eq!(st.tx_frames, 1);
            assert_eq!(st.tx_invalid, 2);
            assert_eq!(st.tx_slots_lent, 0, "refused frames take no slot");
        });
    }

    /// Frames written straight into lent slots arrive byte for byte; slots
    /// given back, refused or completed are lendable again, and none is lent
    /// while all are out.
    #[test]
    fn tx_slots_lend_submit_complete() {
        let pair = VethPair::new(9000);
        let b_name = pair.b.name.clone();
        pair.a.run(move || {
            let cfg = XskConfig {
                rx_frames: 64,
                tx_slots: 4,
                max_tx_frame: 9018,
                ring_size: 16,
                mode: BindMode::Copy,
            };
            let umem = Umem::new(cfg.chunks().unwrap()).unwrap();
            let mut sock = XskSocket::new(&umem, ifindex("va"), 0, cfg).unwrap();
            assert_eq!(sock.slot_len(), 3 * CHUNK_SIZE);

            let frames = [raw_frame(9014, 1), raw_frame(100, 2)];
            let rx = peer_capture(&b_name, 2);
            for f in &frames {
                let slot = sock.lend().expect("a free slot");
                sock.slot_mut(&slot)[..f.len()].copy_from_slice(f);
                sock.submit(slot, f.len()).unwrap();
            }
            sock.kick();
            assert_eq!(rx.join().unwrap(), frames, "both frames arrived intact");

            // Given back, refused: the slot is free again.
            let slot = sock.lend().unwrap();
            sock.give_back(slot);
            let slot = sock.lend().unwrap();
            assert_eq!(sock.submit(slot, 0), Err(TxError::Empty));
            let slot = sock.lend().unwrap();
            assert_eq!(
                sock.submit(slot, 3 * CHUNK_SIZE + 1),
                Err(TxError::TooLong {
                    len: 3 * CHUNK_SIZE + 1,
                    max: 3 * CHUNK_SIZE
                })
            );
            let st = sock.stats().unwrap();
            assert_eq!((st.tx_invalid, st.tx_slots_lent), (2, 0));

            // Exhaust the slots: nothing more until the kernel completes them.
            let lent: Vec<TxSlot> = (0..4).map(|_| sock.lend().expect("slot")).collect();
            assert!(sock.lend().is_none(), "all four slots are lent");
            assert_eq!(sock.stats().unwrap().tx_slots_lent, 4);
            for (i, slot) in lent.into_iter().enumerate() {
                let f = raw_frame(5000, 10 + i as u8);
                sock.slot_mut(&slot)[..f.len()].copy_from_slice(&f);
                sock.submit(slot, f.len()).unwrap();
            }
            assert!(sock.lend().is_none(), "all four slots are in flight");
            let st = sock.stats().unwrap();
            assert_eq!((st.tx_full, st.tx_slots_in_flight), (2, 4));
            sock.kick();
            let deadline = Instant::now() + Duration::from_secs(2);
            while sock.stats().unwrap().tx_slots_in_flight > 0 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
                sock.kick();
            }
            let back: Vec<TxSlot> = (0..4).filter_map(|_| sock.lend()).collect();
            assert_eq!(back.len(), 4, "completed slots come back");
            back.into_iter().for_each(|s| sock.give_back(s));
            let st = sock.stats().unwrap();
            assert_eq!((st.tx_frames, st.tx_completed), (6, 6));
            assert_eq!(st.tx_foreign_completion, 0);
        });
    }

    /// BindMode::Auto on veth (no zero-copy) ends in copy mode and says so;
    /// held frames come as their descriptor chains, straight from the UMEM.
    #[test]
    fn auto_mode_falls_back_to_copy_and_holds_chains() {
        let pair = VethPair::new(9000);
        let b_name = pair.b.name.clone();
        pair.a.run(move || {
            let cfg = XskConfig {
                rx_frames: 256,
                tx_slots: 64,
                max_tx_frame: 9018,
                ring_size: 256,
                mode: BindMode::ZeroCopy,
            };
            let zc = XskSocket::new(&Umem::new(1024).unwrap(), ifindex("va"), 0, cfg)
                .err()
                .expect("veth has no AF_XDP zero-copy");
            assert_eq!(zc.kind(), io::ErrorKind::Unsupported, "{zc}");

            let cfg = XskConfig {
                mode: BindMode::Auto,
                ..cfg
            };
            assert_eq!(XskConfig::default().mode, BindMode::Auto);
            let (_prog, _umem, mut sock) = steered_socket(1024, cfg);
            assert_eq!(sock.mode(), XskMode::Copy);
            assert_eq!(sock.stats().unwrap().mode.as_str(), "copy");

            let big = udp_frame(A, 6081, 8900, 1);
            let small = udp_frame(A, 6081, 120, 2);
            peer_send(&b_name, vec![big.clone(), small.clone()]);
            let mut held = RxHeld::new();
            assert_eq!(hold_frames(&mut sock, &mut held, 2), 2);
            let chain = held.frame(0).unwrap();
            let sizes: Vec<usize> = chain.pieces().iter().map(|p| p.len()).collect();
            assert_eq!(
                sizes,
                [3840, 3840, 1220],
                "copy mode keeps 256 bytes of headroom"
            );
            assert_eq!(chain.len(), 8900);
            assert_eq!(concat(&chain), big);
            let chain = held.frame(1).unwrap();
            assert_eq!(chain.pieces(), [&small[..]]);
            assert!(held.frame(2).is_none());
            let st = sock.stats().unwrap();
            assert_eq!(
                (st.rx_frames, st.rx_multi_buffer, st.rx_chunks_held),
                (2, 1, 4)
            );
            sock.release(&mut held);
            assert!(held.is_empty());
            assert_eq!(sock.stats().unwrap().rx_chunks_held, 0);
        });
    }

    /// Held chunks stay out of the fill ring: with every rx chunk held the
    /// kernel has nowhere to put frames (and does not touch the held ones);
    /// after release reception resumes.
    #[test]
    fn held_chunks_return_only_on_release() {
        let pair = VethPair::new(9000);
        let b_name = pair.b.name.clone();
        pair.a.run(move || {
            let cfg = XskConfig {
                rx_frames: 4,
                tx_slots: 1,
                max_tx_frame: CHUNK_SIZE,
                ring_size: 8,
                mode: BindMode::Copy,
            };
            let (_prog, _umem, mut sock) = steered_socket(8, cfg);
            let frames = |seeds: std::ops::Range<u8>| -> Vec<Vec<u8>> {
                seeds.map(|s| udp_frame(A, 6081, 120, s)).collect()
            };
            let first = frames(1..5);
            peer_send(&b_name, first.clone());
            let mut held = RxHeld::new();
            assert_eq!(hold_frames(&mut sock, &mut held, 4), 4);
            let st = sock.stats().unwrap();
            assert_eq!(st.rx_chunks_held, 4);

            peer_send(&b_name, frames(5..8));
            sock.wait_rx(Duration::from_millis(300)).unwrap();
            let mut more = RxHeld::new();
            assert_eq!(sock.recv_held(&mut more, 64), 0, "no chunk to receive into");
            let st2 = sock.stats().unwrap();
            assert!(
                st2.kernel_rx_fill_ring_empty_descs > st.kernel_rx_fill_ring_empty_descs,
                "{st2:?}"
            );
            assert_eq!(st2.kernel_rx_dropped - st.kernel_rx_dropped, 3, "{st2:?}");
            let still: Vec<Vec<u8>> = held.frames().map(|c| concat(&c)).collect();
            assert_eq!(still, first, "held frames are not overwritten");

            sock.release(&mut held);
            let last = frames(8..10);
            peer_send(&b_name, last.clone());
            assert_eq!(hold_frames(&mut sock, &mut held, 2), 2);
            let got: Vec<Vec<u8>> = held.frames().map(|c| concat(&c)).collect();
            assert_eq!(got, last, "reception resumes after release");
            sock.release(&mut held);
        });
    }

    /// Sockets on two queues share one UMEM (the second binds with
    /// XDP_SHARED_UMEM), each transmits, and a socket dropped and created
    /// again on the same queue binds (EBUSY retry) and gets its chunks back.
    #[test]
    fn shared_umem_two_queues() {
        let pair = VethPair::with_queues(9000, 2);
        let b_name = pair.b.name.clone();
        pair.a.run(move || {
            let ifindex = ifindex("va");
            let _prog =
                SteeringProgram::attach("va", &[Ipv6Addr::from(A)], AttachMode::Native).unwrap();
            let umem = Umem::new(1024).unwrap();
            let cfg = XskConfig {
                rx_frames: 256,
                tx_slots: 64,
                max_tx_frame: 4 * CHUNK_SIZE,
                ring_size: 256,
                mode: BindMode::Copy,
            };
            let mut q0 = XskSocket::new(&umem, ifindex, 0, cfg).unwrap();
            let q1 = XskSocket::new(&umem, ifindex, 1, cfg).expect("second socket shares the UMEM");
            assert_eq!(q1.mode(), XskMode::Copy, "inherited from the first socket");
            assert_eq!(umem.free_chunks(), 0);
            let e = XskSocket::new(&umem, ifindex, 1, cfg)
                .err()
                .expect("UMEM exhausted");
            assert!(
                e.to_string()
                    .contains("wants 512 chunks, UMEM has 0 left of 1024"),
                "{e}"
            );
            drop(q1);
            assert_eq!(
                umem.free_chunks(),
                512,
                "a shared socket's chunks come back"
            );
            let mut q1 = XskSocket::new(&umem, ifindex, 1, cfg).expect("rebind queue 1");
            assert_eq!(q1.queue(), 1);
            // Each socket recycles only its own rx chunks to its fill ring and
            // only its own slots: never the other socket's, never the other kind.
            let (f0, f1) = (u64::from(q0.lease.first), u64::from(q1.lease.first));
            assert_eq!(q0.own_rx_chunk(f0 * C + 100), Some(f0 * C));
            assert_eq!(q0.own_rx_chunk((f0 + 256) * C), None, "a tx chunk");
            assert_eq!(q0.slots.locate((f0 + 256) * C), Some((0, 1)));
            assert_eq!(q0.slots.locate((f0 + 511) * C), Some((63, 8)));
            assert_eq!(q0.slots.locate(f0 * C), None, "an rx chunk");
            for a in [f1 * C, (f1 + 256) * C, (f1 + 511) * C] {
                assert_eq!(q0.own_rx_chunk(a), None, "q1's chunk {a:#x}");
                assert_eq!(q0.slots.locate(a), None, "q1's chunk {a:#x}");
            }
            assert_eq!(q0.slots.locate(1024 * C), None, "beyond the UMEM");

            let rx = peer_capture(&b_name, 2);
            for (sock, tag) in [(&mut q0, 0u8), (&mut q1, 1u8)] {
                sock.send(&raw_frame(5000, tag)).unwrap();
                sock.kick();
            }
            let mut tags: Vec<u8> = rx.join().unwrap().iter().map(|f| f[14]).collect();
            tags.sort();
            assert_eq!(tags, vec![0, 1], "both queues transmitted");
        });
    }
}
