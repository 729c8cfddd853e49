//! AF_XDP sockets on a shared UMEM, with multi-buffer (`XDP_USE_SG`) frames.
//!
//! This is a thin layer over the raw `libc` interface rather than a binding
//! to libxdp/libbpf's xsk.c: we need control over multi-buffer descriptor
//! chains (9000-byte underlay frames span three 4 KiB chunks in copy mode) and
//! over how sockets share one UMEM (bind flags, per-socket fill/completion
//! rings), and a C library would have to be built and linked for very little
//! code: four mmap'd rings with acquire/release indices.
//!
//! Memory model: one [`Umem`] is registered once; every [`XskSocket`] on it
//! (one per interface queue) takes a disjoint range of chunks for its own
//! fill ring (rx) and transmit pool, and owns its own fill and completion
//! rings. A socket is therefore used by one thread without locks, and
//! chunks never move between sockets.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Size of one UMEM chunk. 4096 (not 2048) so a 9014-byte frame needs only
/// three descriptors.
pub const CHUNK_SIZE: usize = 4096;
/// The kernel refuses a transmitted packet of more descriptors than this
/// (`MAX_SKB_FRAGS + 1`).
pub const MAX_TX_DESCS: usize = 18;
/// Largest frame [`XskSocket::recv_batch`] assembles; longer chains are
/// dropped and counted as `rx_oversize`.
pub const MAX_RX_FRAME: usize = 65536;

/// How long a bind that fails with EBUSY is retried: the kernel releases a
/// just-closed socket's queue asynchronously (~100 ms observed).
const BIND_BUSY_RETRY: Duration = Duration::from_millis(500);

fn os_err(what: impl std::fmt::Display) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
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

/// A socket's chunk range; returned to the UMEM when dropped. Declared as the
/// socket's last field so it drops after the rings are unmapped and the fd is
/// closed: only then has the kernel released the socket and stopped writing
/// into these chunks.
struct ChunkLease {
    umem: Arc<UmemInner>,
    first: u32,
    count: u32,
    /// The registration socket's fd stays open (and bound) as long as the
    /// UMEM, so the kernel may keep filling its chunks: they are never reused.
    reusable: bool,
}

impl Drop for ChunkLease {
    fn drop(&mut self) {
        if self.reusable {
            let mut st = self.umem.state.lock().unwrap_or_else(|p| p.into_inner());
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
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "UMEM of 0 chunks",
            ));
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
        let st = self.inner.state.lock().unwrap_or_else(|p| p.into_inner());
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

    /// Free slots, re-reading the kernel's consumer index only when the
    /// cached view is not enough.
    fn free(&mut self, want: u32) -> u32 {
        let free = self.size - self.cached_prod.wrapping_sub(self.cached_cons);
        if free >= want {
            return free;
        }
        // Acquire: the kernel finished reading the slots before publishing.
        self.cached_cons = self.consumer().load(Ordering::Acquire);
        self.size - self.cached_prod.wrapping_sub(self.cached_cons)
    }

    /// Writes one descriptor; the caller checked `free()`.
    fn push(&mut self, d: T) {
        // SAFETY: the slot is free (owned by us until submit).
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

    fn available(&mut self) -> u32 {
        // Acquire: the kernel's descriptor writes are visible after this.
        self.cached_prod = self.producer().load(Ordering::Acquire);
        self.cached_prod.wrapping_sub(self.cached_cons)
    }

    fn pop(&mut self) -> T {
        // SAFETY: the caller checked available(); the slot was published by the kernel.
        let d = unsafe { self.slot(self.cached_cons).read() };
        self.cached_cons = self.cached_cons.wrapping_add(1);
        d
    }

    fn release(&self) {
        // Release: our reads of the slots complete before the kernel reuses them.
        self.consumer().store(self.cached_cons, Ordering::Release);
    }
}

/// How the socket moves frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BindMode {
    /// `XDP_COPY`: works on every driver (veth).
    Copy,
    /// `XDP_ZEROCOPY`: the NIC DMAs into the UMEM; fails if unsupported.
    ZeroCopy,
}

/// Sizes of one socket. Ring sizes are powers of two.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XskConfig {
    /// Chunks kept in the fill ring for reception.
    pub rx_frames: u32,
    /// Chunks for transmission (frames in flight until completed).
    pub tx_frames: u32,
    /// Size of the rx and tx rings (descriptors).
    pub ring_size: u32,
    pub mode: BindMode,
}

impl Default for XskConfig {
    fn default() -> Self {
        XskConfig {
            rx_frames: 2048,
            tx_frames: 2048,
            ring_size: 2048,
            mode: BindMode::Copy,
        }
    }
}

/// Why a frame was not queued for transmission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxError {
    /// No free chunk or tx slot right now: kick and retry, or drop and count.
    Full,
    /// The frame needs more than [`MAX_TX_DESCS`] chunks.
    TooLong { len: usize },
    /// A zero-length frame.
    Empty,
}

impl std::fmt::Display for TxError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TxError::Full => write!(f, "AF_XDP tx ring or chunk pool full"),
            TxError::TooLong { len } => {
                write!(
                    f,
                    "frame of {len} bytes exceeds {MAX_TX_DESCS} chunks of {CHUNK_SIZE}"
                )
            }
            TxError::Empty => write!(f, "empty frame"),
        }
    }
}

impl std::error::Error for TxError {}

/// Socket counters: ours and the kernel's (`XDP_STATISTICS`). Serialisable so the
/// daemon's `stats` shows them as they are, without a copy to keep in step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct XskStats {
    pub rx_frames: u64,
    pub rx_bytes: u64,
    /// Frames that arrived as a chain of more than one descriptor.
    pub rx_multi_buffer: u64,
    /// Chains longer than [`MAX_RX_FRAME`]: dropped.
    pub rx_oversize: u64,
    /// Descriptors pointing outside this socket's chunks: dropped (kernel bug guard).
    pub rx_invalid_desc: u64,
    /// Of those, descriptors whose chunk is not one of this socket's rx chunks: not
    /// returned to the fill ring, since the chunk belongs to someone else (or to
    /// nobody) and handing it to the kernel would let it write there.
    pub rx_foreign_chunk: u64,
    pub tx_frames: u64,
    pub tx_bytes: u64,
    /// `send` refused with [`TxError::Full`].
    pub tx_full: u64,
    /// `send` refused with [`TxError::TooLong`] or [`TxError::Empty`].
    pub tx_invalid: u64,
    /// `sendto` kicks that failed with an unexpected error.
    pub tx_kick_errors: u64,
    /// Completion-ring addresses outside this socket's tx chunks: ignored, never put
    /// in the free pool (we would copy the next frame there).
    pub tx_foreign_completion: u64,
    /// Kernel: frames dropped for other reasons (e.g. too long for the chain).
    pub kernel_rx_dropped: u64,
    pub kernel_rx_invalid_descs: u64,
    pub kernel_tx_invalid_descs: u64,
    /// Kernel: rx ring full, frame dropped.
    pub kernel_rx_ring_full: u64,
    /// Kernel: fill ring empty when a frame arrived.
    pub kernel_rx_fill_ring_empty_descs: u64,
    /// Kernel: tx ring empty at a wakeup.
    pub kernel_tx_ring_empty_descs: u64,
}

/// One AF_XDP socket bound to `(ifindex, queue)` on a shared [`Umem`].
pub struct XskSocket {
    umem: Arc<UmemInner>,
    /// `None` for the socket that reuses the UMEM's registration socket.
    own_fd: Option<OwnedFd>,
    rx: Ring<libc::xdp_desc>,
    tx: Ring<libc::xdp_desc>,
    fill: Ring<u64>,
    comp: Ring<u64>,
    /// Transmit chunks not in flight.
    tx_free: Vec<u64>,
    /// Assembly buffer for multi-descriptor frames (kept across calls).
    scratch: Vec<u8>,
    /// The previous batch ended inside a descriptor chain.
    rx_in_chain: bool,
    rx_chain_oversize: bool,
    stats: XskStats,
    ifindex: u32,
    queue: u32,
    /// How many of the lease's chunks (from its start) are rx chunks; the rest are tx.
    rx_chunks: u32,
    /// This socket's chunks; last so it drops after rings and fd (see [`ChunkLease`]).
    lease: ChunkLease,
}

// SAFETY: the rings and chunks a socket touches are its own (see module doc);
// moving it to another thread moves that exclusive ownership with it.
unsafe impl Send for XskSocket {}

impl XskSocket {
    /// Creates a socket on `umem`, binds it to `(ifindex, queue)` and fills its
    /// fill ring. The first socket on a UMEM binds with
    /// `XDP_USE_NEED_WAKEUP | XDP_USE_SG | mode`; later ones with
    /// `XDP_SHARED_UMEM` only (they inherit the first socket's flags).
    pub fn new(umem: &Umem, ifindex: u32, queue: u32, cfg: XskConfig) -> io::Result<XskSocket> {
        let inner = umem.inner.clone();
        for (what, v) in [("ring_size", cfg.ring_size)] {
            if !v.is_power_of_two() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{what} {v} is not a power of two"),
                ));
            }
        }
        let fill_size = cfg.rx_frames.max(1).next_power_of_two();
        let comp_size = cfg.tx_frames.max(1).next_power_of_two();
        if cfg.tx_frames < MAX_TX_DESCS as u32 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "tx_frames {} cannot hold one {MAX_TX_DESCS}-chunk frame",
                    cfg.tx_frames
                ),
            ));
        }
        let mut st = inner.state.lock().unwrap_or_else(|p| p.into_inner());
        let chunks = cfg.rx_frames + cfg.tx_frames;
        let Some(first_chunk) = st.take(chunks) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "socket for ifindex {ifindex} queue {queue} wants {chunks} chunks, UMEM has {} left of {}",
                    st.free_count(),
                    inner.chunk_count
                ),
            ));
        };
        // Claim the registration socket under the lock, then release it: the
        // lease's Drop (on any error below) takes the lock again.
        let first = !st.owner_bound;
        st.owner_bound = true;
        drop(st);
        let lease = ChunkLease {
            umem: inner.clone(),
            first: first_chunk,
            count: chunks,
            reusable: !first,
        };
        let own_fd = if first { None } else { Some(xdp_socket()?) };
        let fd_ref: &OwnedFd = own_fd.as_ref().unwrap_or(&inner.fd);

        setsockopt(fd_ref, libc::XDP_RX_RING, &cfg.ring_size, "XDP_RX_RING")?;
        setsockopt(fd_ref, libc::XDP_TX_RING, &cfg.ring_size, "XDP_TX_RING")?;
        setsockopt(
            fd_ref,
            libc::XDP_UMEM_FILL_RING,
            &fill_size,
            "XDP_UMEM_FILL_RING",
        )?;
        setsockopt(
            fd_ref,
            libc::XDP_UMEM_COMPLETION_RING,
            &comp_size,
            "XDP_UMEM_COMPLETION_RING",
        )?;

        // SAFETY: xdp_mmap_offsets is plain data, filled by getsockopt below.
        let mut off: libc::xdp_mmap_offsets = unsafe { std::mem::zeroed() };
        let mut optlen = std::mem::size_of::<libc::xdp_mmap_offsets>() as libc::socklen_t;
        // SAFETY: off/optlen are valid for writes; the kernel writes at most optlen bytes.
        let rc = unsafe {
            libc::getsockopt(
                fd_ref.as_raw_fd(),
                libc::SOL_XDP,
                libc::XDP_MMAP_OFFSETS,
                (&mut off as *mut libc::xdp_mmap_offsets).cast(),
                &mut optlen,
            )
        };
        if rc < 0 {
            return Err(os_err("XDP_MMAP_OFFSETS"));
        }
        let rx = Ring::map(
            fd_ref,
            &off.rx,
            cfg.ring_size,
            libc::XDP_PGOFF_RX_RING,
            "rx ring",
        )?;
        let tx = Ring::map(
            fd_ref,
            &off.tx,
            cfg.ring_size,
            libc::XDP_PGOFF_TX_RING,
            "tx ring",
        )?;
        let mut fill = Ring::map(
            fd_ref,
            &off.fr,
            fill_size,
            libc::XDP_UMEM_PGOFF_FILL_RING as libc::off_t,
            "fill ring",
        )?;
        let comp = Ring::map(
            fd_ref,
            &off.cr,
            comp_size,
            libc::XDP_UMEM_PGOFF_COMPLETION_RING as libc::off_t,
            "completion ring",
        )?;

        let chunk_addr = |i: u32| (first_chunk + i) as u64 * CHUNK_SIZE as u64;
        for i in 0..cfg.rx_frames {
            fill.push(chunk_addr(i));
        }
        fill.submit();
        let tx_free: Vec<u64> = (cfg.rx_frames..chunks).map(chunk_addr).collect();

        let flags = if first {
            libc::XDP_USE_NEED_WAKEUP
                | libc::XDP_USE_SG
                | match cfg.mode {
                    BindMode::Copy => libc::XDP_COPY,
                    BindMode::ZeroCopy => libc::XDP_ZEROCOPY,
                }
        } else {
            libc::XDP_SHARED_UMEM
        };
        let sa = libc::sockaddr_xdp {
            sxdp_family: libc::AF_XDP as u16,
            sxdp_flags: flags,
            sxdp_ifindex: ifindex,
            sxdp_queue_id: queue,
            sxdp_shared_umem_fd: if first {
                0
            } else {
                inner.fd.as_raw_fd() as u32
            },
        };
        bind_retrying(fd_ref, &sa, ifindex, queue).map_err(|e| {
            if first {
                // The registration socket now has rings configured and cannot
                // be set up again; later sockets would fail to share it.
                io::Error::new(
                    e.kind(),
                    format!("{e}; the UMEM is unusable, create a new one"),
                )
            } else {
                e
            }
        })?;
        Ok(XskSocket {
            umem: inner,
            own_fd,
            rx,
            tx,
            fill,
            comp,
            tx_free,
            scratch: Vec::with_capacity(MAX_RX_FRAME),
            rx_in_chain: false,
            rx_chain_oversize: false,
            stats: XskStats::default(),
            ifindex,
            queue,
            rx_chunks: cfg.rx_frames,
            lease,
        })
    }

    fn fd(&self) -> RawFd {
        self.own_fd.as_ref().unwrap_or(&self.umem.fd).as_raw_fd()
    }

    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    pub fn queue(&self) -> u32 {
        self.queue
    }

    /// Checks that a descriptor lies inside this socket's chunks (and inside
    /// one chunk, as aligned mode guarantees) and returns its byte range.
    fn desc_range(&self, addr: u64, len: u32) -> Option<std::ops::Range<usize>> {
        let start = self.lease.first as u64 * CHUNK_SIZE as u64;
        let end = start + self.lease.count as u64 * CHUNK_SIZE as u64;
        let a_end = addr.checked_add(len as u64)?;
        let same_chunk =
            addr / CHUNK_SIZE as u64 == a_end.saturating_sub(1).max(addr) / CHUNK_SIZE as u64;
        if addr < start || a_end > end || !same_chunk {
            return None;
        }
        Some(addr as usize..a_end as usize)
    }

    /// The chunk holding `addr` if it is one of this socket's rx chunks (the only
    /// addresses that may go to its fill ring).
    fn own_rx_chunk(&self, addr: u64) -> Option<u64> {
        chunk_within(self.lease.first, self.rx_chunks, addr)
    }

    /// The chunk holding `addr` if it is one of this socket's tx chunks (the only
    /// addresses that may enter `tx_free`, where `send` writes without checking).
    fn own_tx_chunk(&self, addr: u64) -> Option<u64> {
        let tx_first = self.lease.first.checked_add(self.rx_chunks)?;
        let tx_count = self.lease.count.checked_sub(self.rx_chunks)?;
        chunk_within(tx_first, tx_count, addr)
    }

    /// Receives up to `max` frames, calling `f` with each whole frame.
    /// A frame in one descriptor is passed straight from the UMEM; a chain
    /// (`XDP_PKT_CONTD`) is assembled in a reusable scratch buffer. Chunks go
    /// back to the fill ring at once. Returns the number of frames delivered.
    pub fn recv_batch(&mut self, max: usize, mut f: impl FnMut(&[u8])) -> usize {
        let avail = self.rx.available();
        let mut delivered = 0;
        let mut consumed = 0;
        while consumed < avail && delivered < max {
            let d = self.rx.pop();
            consumed += 1;
            let more = d.options & libc::XDP_PKT_CONTD != 0;
            let area = &self.umem.area;
            let range = self.desc_range(d.addr, d.len);
            // SAFETY: desc_range checked the range lies inside this socket's
            // part of the UMEM mapping, and the kernel handed the chunk to us
            // through the rx ring: it does not write it until we return it to
            // the fill ring below, after the last use of `bytes`.
            let bytes = range.map(|r| unsafe {
                std::slice::from_raw_parts(area.ptr.as_ptr().add(r.start), r.len())
            });
            match bytes {
                None => {
                    self.stats.rx_invalid_desc += 1;
                    // The rest of the chain cannot form a valid frame.
                    self.rx_chain_oversize |= more || self.rx_in_chain;
                }
                Some(bytes) if !more && !self.rx_in_chain => {
                    self.stats.rx_frames += 1;
                    self.stats.rx_bytes += bytes.len() as u64;
                    f(bytes);
                    delivered += 1;
                }
                Some(bytes) => {
                    if !self.rx_in_chain {
                        self.scratch.clear();
                        self.rx_chain_oversize = false;
                    }
                    if self.scratch.len() + bytes.len() > MAX_RX_FRAME {
                        self.rx_chain_oversize = true;
                    } else if !self.rx_chain_oversize {
                        self.scratch.extend_from_slice(bytes);
                    }
                }
            }
            // The fill ring has room for every rx chunk, and this one just left the ring.
            // A chunk that is not ours is never handed to the kernel for writing.
            match self.own_rx_chunk(d.addr) {
                Some(chunk) => self.fill.push(chunk),
                None => self.stats.rx_foreign_chunk += 1,
            }
            if more {
                self.rx_in_chain = true;
                continue;
            }
            if self.rx_in_chain {
                self.rx_in_chain = false;
                if self.rx_chain_oversize {
                    self.stats.rx_oversize += 1;
                } else {
                    self.stats.rx_frames += 1;
                    self.stats.rx_multi_buffer += 1;
                    self.stats.rx_bytes += self.scratch.len() as u64;
                    f(&self.scratch);
                    delivered += 1;
                }
                self.rx_chain_oversize = false;
            }
        }
        if consumed > 0 {
            self.rx.release();
            self.fill.submit();
            if self.fill.needs_wakeup() {
                self.wake_rx();
            }
        }
        delivered
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

    /// Returns completed transmit chunks to the pool; an address that is not one of
    /// our tx chunks is counted and dropped, which keeps `send`'s write in bounds.
    fn reclaim(&mut self) {
        let n = self.comp.available();
        for _ in 0..n {
            let addr = self.comp.pop();
            match self.own_tx_chunk(addr) {
                Some(chunk) => self.tx_free.push(chunk),
                None => self.stats.tx_foreign_completion += 1,
            }
        }
        if n > 0 {
            self.comp.release();
        }
    }

    /// Queues one frame for transmission, split across chunks with
    /// `XDP_PKT_CONTD` when longer than one. Call [`XskSocket::kick`] after a batch.
    pub fn send(&mut self, frame: &[u8]) -> Result<(), TxError> {
        if frame.is_empty() {
            self.stats.tx_invalid += 1;
            return Err(TxError::Empty);
        }
        let n = frame.len().div_ceil(CHUNK_SIZE);
        if n > MAX_TX_DESCS {
            self.stats.tx_invalid += 1;
            return Err(TxError::TooLong { len: frame.len() });
        }
        if self.tx_free.len() < n {
            self.reclaim();
        }
        if self.tx_free.len() < n || self.tx.free(n as u32) < n as u32 {
            self.stats.tx_full += 1;
            return Err(TxError::Full);
        }
        let pieces = frame.chunks(CHUNK_SIZE);
        let last = n - 1;
        for (i, piece) in pieces.enumerate() {
            let Some(addr) = self.tx_free.pop() else {
                // Checked above; unreachable, but never write a half chain.
                self.stats.tx_full += 1;
                return Err(TxError::Full);
            };
            // SAFETY: addr is the start of one of this socket's tx chunks (tx_free
            // only ever receives addresses checked by own_tx_chunk or built from the
            // lease), not in flight (it is in the free pool), and
            // piece.len() <= CHUNK_SIZE.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    piece.as_ptr(),
                    self.umem.area.ptr.as_ptr().add(addr as usize),
                    piece.len(),
                );
            }
            self.tx.push(libc::xdp_desc {
                addr,
                len: piece.len() as u32,
                options: if i < last { libc::XDP_PKT_CONTD } else { 0 },
            });
        }
        self.tx.submit();
        self.stats.tx_frames += 1;
        self.stats.tx_bytes += frame.len() as u64;
        Ok(())
    }

    /// Makes the kernel process the tx ring (needed in copy mode and when the
    /// ring asks for a wakeup) and reclaims completed chunks. Copy mode sends
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

    /// Our counters plus the kernel's `XDP_STATISTICS`.
    pub fn stats(&self) -> io::Result<XskStats> {
        // SAFETY: xdp_statistics is plain data, filled by getsockopt.
        let mut k: libc::xdp_statistics = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::xdp_statistics>() as libc::socklen_t;
        // SAFETY: k/len are valid for writes of len bytes.
        let rc = unsafe {
            libc::getsockopt(
                self.fd(),
                libc::SOL_XDP,
                libc::XDP_STATISTICS,
                (&mut k as *mut libc::xdp_statistics).cast(),
                &mut len,
            )
        };
        if rc < 0 {
            return Err(os_err("XDP_STATISTICS"));
        }
        let mut s = self.stats;
        s.kernel_rx_dropped = k.rx_dropped;
        s.kernel_rx_invalid_descs = k.rx_invalid_descs;
        s.kernel_tx_invalid_descs = k.tx_invalid_descs;
        s.kernel_rx_ring_full = k.rx_ring_full;
        s.kernel_rx_fill_ring_empty_descs = k.rx_fill_ring_empty_descs;
        s.kernel_tx_ring_empty_descs = k.tx_ring_empty_descs;
        Ok(s)
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

fn bind_retrying(
    fd: &OwnedFd,
    sa: &libc::sockaddr_xdp,
    ifindex: u32,
    queue: u32,
) -> io::Result<()> {
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
                "bind AF_XDP to ifindex {ifindex} queue {queue} (flags {:#x}): {e}",
                sa.sxdp_flags
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

    /// The lease check that guards the fill ring and the tx pool: only addresses of
    /// chunks in `[first, first + count)` pass, aligned down to their chunk.
    #[test]
    fn chunk_within_accepts_only_the_lease() {
        let c = CHUNK_SIZE as u64;
        // Chunks 10..14.
        assert_eq!(chunk_within(10, 4, 10 * c), Some(10 * c));
        assert_eq!(chunk_within(10, 4, 10 * c + 256), Some(10 * c));
        assert_eq!(chunk_within(10, 4, 14 * c - 1), Some(13 * c));
        assert_eq!(chunk_within(10, 4, 14 * c), None);
        assert_eq!(chunk_within(10, 4, 10 * c - 1), None);
        assert_eq!(chunk_within(10, 4, 0), None);
        assert_eq!(chunk_within(10, 0, 10 * c), None);
        assert_eq!(chunk_within(10, 4, u64::MAX), None);
        assert_eq!(chunk_within(u32::MAX, u32::MAX, u64::MAX), None);
    }

    const A: [u8; 16] = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x0a];
    const B: [u8; 16] = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x0b];

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

    fn recv_frames(sock: &mut XskSocket, want: usize) -> Vec<Vec<u8>> {
        let mut got = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(3);
        while got.len() < want && std::time::Instant::now() < deadline {
            sock.wait_rx(Duration::from_millis(100)).expect("poll");
            sock.recv_batch(64, |f| got.push(f.to_vec()));
        }
        got
    }

    /// The XDP program steers Geneve for our address (small and multi-buffer
    /// frames) into the socket, passes everything else to the kernel, and a
    /// 9014-byte frame sent from the socket reaches the peer intact.
    #[test]
    fn veth_steering_rx_tx_multibuffer() {
        let pair = VethPair::new(9000);
        let b_name = pair.b.name.clone();
        pair.a.run(move || {
            let ifindex = crate::netlink::Netlink::open()
                .unwrap()
                .link_by_name("va")
                .unwrap()
                .ifindex;
            let mut prog = SteeringProgram::attach("va", &[Ipv6Addr::from(A)], AttachMode::Native)
                .expect("attach native XDP with frags at MTU 9000");
            let umem = Umem::new(2048).unwrap();
            let cfg = XskConfig {
                rx_frames: 512,
                tx_frames: 512,
                ring_size: 512,
                mode: BindMode::Copy,
            };
            let mut sock = XskSocket::new(&umem, ifindex, 0, cfg).expect("bind AF_XDP");
            assert_eq!(umem.free_chunks(), 1024);
            prog.register_socket(0, &sock).unwrap();

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
            let s = vec![small.clone(), big.clone(), not_ours, not_geneve, tagged];
            crate::netns::run_in_netns(&b_name, move || {
                let ps = PacketSocket::open("vb").unwrap();
                for f in &s {
                    ps.send(f);
                }
            })
            .unwrap();

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
            let mut jumbo = vec![0u8; 9014];
            jumbo[..6].copy_from_slice(&MAC_B);
            jumbo[6..12].copy_from_slice(&MAC_A);
            jumbo[12..14].copy_from_slice(&[0x88, 0xb5]);
            for (i, b) in jumbo[14..].iter_mut().enumerate() {
                *b = (i % 251) as u8;
            }
            let rx = {
                let jumbo = jumbo.clone();
                let b_name2 = b_name.clone();
                std::thread::spawn(move || {
                    crate::netns::run_in_netns(&b_name2, move || {
                        let ps = PacketSocket::open("vb").unwrap();
                        ps.recv_matching(Duration::from_secs(3), |f| {
                            f.len() > 12 && f[12..14] == [0x88, 0xb5]
                        })
                        .map(|f| f == jumbo)
                    })
                    .unwrap()
                })
            };
            std::thread::sleep(Duration::from_millis(200)); // let the receiver bind
            sock.send(&jumbo).expect("queue jumbo frame");
            sock.kick();
            assert_eq!(rx.join().unwrap(), Some(true), "jumbo frame arrived intact");
            assert_eq!(
                sock.send(&vec![0u8; CHUNK_SIZE * MAX_TX_DESCS + 1]),
                Err(TxError::TooLong {
                    len: CHUNK_SIZE * MAX_TX_DESCS + 1
                })
            );
            assert_eq!(sock.send(&[]), Err(TxError::Empty));
            let st = sock.stats().unwrap();
            assert_eq!(st.tx_frames, 1);
            assert_eq!(st.tx_invalid, 2);
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
            let ifindex = crate::netlink::Netlink::open()
                .unwrap()
                .link_by_name("va")
                .unwrap()
                .ifindex;
            let _prog =
                SteeringProgram::attach("va", &[Ipv6Addr::from(A)], AttachMode::Native).unwrap();
            let umem = Umem::new(1024).unwrap();
            let cfg = XskConfig {
                rx_frames: 256,
                tx_frames: 256,
                ring_size: 256,
                mode: BindMode::Copy,
            };
            let mut q0 = XskSocket::new(&umem, ifindex, 0, cfg).unwrap();
            let q1 = XskSocket::new(&umem, ifindex, 1, cfg).expect("second socket shares the UMEM");
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
            // Each socket recycles only its own chunks, rx ones to the fill ring and
            // tx ones to the free pool: never the other socket's, never the other kind.
            let c = CHUNK_SIZE as u64;
            let (f0, f1) = (u64::from(q0.lease.first), u64::from(q1.lease.first));
            assert_eq!(q0.own_rx_chunk(f0 * c + 100), Some(f0 * c));
            assert_eq!(q0.own_rx_chunk((f0 + 256) * c), None, "a tx chunk");
            assert_eq!(q0.own_tx_chunk((f0 + 256) * c), Some((f0 + 256) * c));
            assert_eq!(q0.own_tx_chunk((f0 + 511) * c), Some((f0 + 511) * c));
            assert_eq!(q0.own_tx_chunk(f0 * c), None, "an rx chunk");
            for a in [f1 * c, (f1 + 256) * c, (f1 + 511) * c] {
                assert_eq!(q0.own_rx_chunk(a), None, "q1's chunk {a:#x}");
                assert_eq!(q0.own_tx_chunk(a), None, "q1's chunk {a:#x}");
            }
            assert_eq!(q0.own_tx_chunk(1024 * c), None, "beyond the UMEM");

            let rx = std::thread::spawn(move || {
                crate::netns::run_in_netns(&b_name, move || {
                    let ps = PacketSocket::open("vb").unwrap();
                    let mut seen = Vec::new();
                    while seen.len() < 2 {
                        match ps.recv_matching(Duration::from_secs(3), |f| {
                            f.len() > 14 && f[12..14] == [0x88, 0xb5]
                        }) {
                            Some(f) => seen.push(f[14]),
                            None => break,
                        }
                    }
                    seen.sort();
                    seen
                })
                .unwrap()
            });
            std::thread::sleep(Duration::from_millis(200));
            for (sock, tag) in [(&mut q0, 0u8), (&mut q1, 1u8)] {
                let mut f = vec![0u8; 5000];
                f[..6].copy_from_slice(&MAC_B);
                f[6..12].copy_from_slice(&MAC_A);
                f[12..14].copy_from_slice(&[0x88, 0xb5]);
                f[14] = tag;
                sock.send(&f).unwrap();
                sock.kick();
            }
            assert_eq!(rx.join().unwrap(), vec![0, 1], "both queues transmitted");
        });
    }
}
