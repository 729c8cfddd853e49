//! The vhost-user protocol side of a port: what the front end (QEMU) sets up —
//! features, the guest's memory, the two rings and their eventfds — kept in a
//! [`Device`] that the worker reads and writes the rings through.
//!
//! Implemented on the `vhost` crate's request parser (`BackendReqHandler`) rather
//! than on `vhost-user-backend`'s daemon, for two reasons:
//! - QEMU's virtio-net (7.2) sends `SET_VRING_ENABLE` when the guest's driver sets
//!   the device's features, before it acks `VHOST_USER_F_PROTOCOL_FEATURES` with
//!   `SET_FEATURES`. The parser refuses that request (`InactiveFeature`), and the
//!   daemon's loop ends the connection on any refusal; our loop
//!   ([`super::connection`]) logs it and goes on, which is what QEMU expects (the
//!   rings count as enabled: see [`Vring`]).
//! - The daemon runs its own thread to wait on the kick eventfds; here they go into
//!   the worker's own epoll set, so a kick wakes the worker directly.

use std::fs::File;
use std::io::Write as _;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use vhost::vhost_user::message::{
    VhostTransferStateDirection, VhostTransferStatePhase, VhostUserConfigFlags, VhostUserInflight,
    VhostUserLog, VhostUserMemoryRegion, VhostUserProtocolFeatures, VhostUserShMemConfig,
    VhostUserSharedMsg, VhostUserSingleMemoryRegion, VhostUserVirtioFeatures,
    VhostUserVringAddrFlags, VhostUserVringState,
};
use vhost::vhost_user::{Backend, Error, GpuBackend, Result, VhostUserBackendReqHandlerMut};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_net::{
    VIRTIO_NET_F_CSUM, VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_GUEST_TSO4, VIRTIO_NET_F_GUEST_TSO6,
    VIRTIO_NET_F_HOST_TSO4, VIRTIO_NET_F_HOST_TSO6, VIRTIO_NET_F_MAC, VIRTIO_NET_F_MRG_RXBUF,
    VIRTIO_NET_F_MTU,
};
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use virtio_queue::{Queue, QueueT};
use vm_memory::{FileOffset, GuestAddress, GuestMemoryMmap, GuestRegionMmap, MmapRegion};

use super::dirty::{DirtyLog, RingLog};
use super::notify::Notifications;
use crate::poll::EpollWatch;
use vhost::VhostUserMemoryRegionBase;
use wire::vnet::{VnetHdr, GSO_ECN, GSO_NONE, GSO_TCPV4, GSO_TCPV6};

/// The receive queue (toward the guest) and the transmit queue (from it).
pub(super) const RX: usize = 0;
pub(super) const TX: usize = 1;
const QUEUES: usize = 2;
/// The largest ring the guest may set up (QEMU's own limit for virtio-net).
const MAX_QUEUE_SIZE: u16 = 1024;

const fn bit(b: u32) -> u64 {
    1 << b
}

/// Features that the virtio specification (5.1.3.1) lets a driver take only
/// with another: each offload that hands over partial checksums or GSO frames
/// needs the checksum feature of its direction, ECN needs TSO.
const DEPENDENCIES: &[(u32, u32)] = &[
    (VIRTIO_NET_F_GUEST_TSO4, VIRTIO_NET_F_GUEST_CSUM),
    (VIRTIO_NET_F_GUEST_TSO6, VIRTIO_NET_F_GUEST_CSUM),
    (VIRTIO_NET_F_HOST_TSO4, VIRTIO_NET_F_CSUM),
    (VIRTIO_NET_F_HOST_TSO6, VIRTIO_NET_F_CSUM),
];

/// Why a front end's `SET_FEATURES` was refused: its connection is then closed
/// (see [`super::connection`]), never served.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FeatureRefusal {
    #[error("it acked features overlayd did not offer: {}", feature_names(*.0).join(", "))]
    NotOffered(u64),
    /// A legacy (pre-1.0) driver: its header is 10 bytes (12 with MRG_RXBUF) and
    /// its fields in the guest's byte order; only the 1.0 layout is served.
    #[error(
        "it did not ack VERSION_1: legacy (pre-virtio-1.0) drivers are not served, their \
         header layout and byte order differ; use a virtio 1.0 driver (modern or \
         transitional device, disable-modern=off)"
    )]
    Legacy,
    #[error(
        "it acked {} without {}, which the virtio specification requires with it",
        feature_names(bit(*feature)).join(""),
        feature_names(bit(*needs)).join("")
    )]
    Inconsistent { feature: u32, needs: u32 },
}

/// The name of each virtio-net feature bit a front end may ack, as the virtio
/// specification spells it (without `VIRTIO_NET_F_`/`VIRTIO_F_`).
const FEATURE_NAMES: &[(u32, &str)] = &[
    (0, "CSUM"),
    (1, "GUEST_CSUM"),
    (2, "CTRL_GUEST_OFFLOADS"),
    (3, "MTU"),
    (5, "MAC"),
    (7, "GUEST_TSO4"),
    (8, "GUEST_TSO6"),
    (9, "GUEST_ECN"),
    (10, "GUEST_UFO"),
    (11, "HOST_TSO4"),
    (12, "HOST_TSO6"),
    (13, "HOST_ECN"),
    (14, "HOST_UFO"),
    (15, "MRG_RXBUF"),
    (16, "STATUS"),
    (17, "CTRL_VQ"),
    (18, "CTRL_RX"),
    (19, "CTRL_VLAN"),
    (21, "GUEST_ANNOUNCE"),
    (22, "MQ"),
    (23, "CTRL_MAC_ADDR"),
    (26, "LOG_ALL"),
    (28, "INDIRECT_DESC"),
    (29, "EVENT_IDX"),
    (30, "PROTOCOL_FEATURES"),
    (32, "VERSION_1"),
    (33, "ACCESS_PLATFORM"),
    (34, "RING_PACKED"),
    (35, "IN_ORDER"),
];

/// The names of the feature bits set in `bits`, lowest bit first; a bit without a
/// name shows as `bit N`.
pub fn feature_names(bits: u64) -> Vec<String> {
    (0..64u32)
        .filter(|b| bits & (1u64 << b) != 0)
        .map(|b| match FEATURE_NAMES.iter().find(|(n, _)| *n == b) {
            Some((_, name)) => (*name).to_string(),
            None => format!("bit {b}"),
        })
        .collect()
}

/// What a port's front ends negotiated, readable by the worker and the port's
/// status without the device's lock.
#[derive(Debug, Default)]
pub(super) struct Negotiated {
    /// The features the current front end acked (0 while none has).
    pub(super) acked: AtomicU64,
    /// Front ends refused at `SET_FEATURES` since the port was made.
    pub(super) refusals: AtomicU64,
    /// Why the last one was refused; cleared when a front end is accepted.
    pub(super) last_refusal: Mutex<Option<FeatureRefusal>>,
}

impl Negotiated {
    pub(super) fn last_refusal(&self) -> Option<FeatureRefusal> {
        self.last_refusal
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set_last_refusal(&self, why: Option<FeatureRefusal>) {
        *self
            .last_refusal
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = why;
    }
}

/// The virtio feature bits offered: what a Linux guest needs for jumbo frames,
/// TSO and checksum offload in both directions, and mergeable receive buffers;
/// `EVENT_IDX`, with which interrupts and kicks are suppressed by index
/// ([`super::notify`]);
/// and `VHOST_F_LOG_ALL`, which QEMU acks while it migrates the VM (without it,
/// it refuses to migrate one whose NIC is served here: see [`super::dirty`]).
/// QEMU keeps the device's config space itself: the MAC and MTU the guest reads
/// are QEMU's `mac=` and `host_mtu=`, which must be the port's (`xdeadm mtu`);
/// offering `VIRTIO_NET_F_MAC` and `VIRTIO_NET_F_MTU` lets QEMU pass them on.
pub fn offered_features() -> u64 {
    let bits = [
        VIRTIO_F_VERSION_1,
        VIRTIO_NET_F_MTU,
        VIRTIO_NET_F_MAC,
        VIRTIO_NET_F_MRG_RXBUF,
        VIRTIO_NET_F_CSUM,
        VIRTIO_NET_F_GUEST_CSUM,
        VIRTIO_NET_F_HOST_TSO4,
        VIRTIO_NET_F_HOST_TSO6,
        VIRTIO_NET_F_GUEST_TSO4,
        VIRTIO_NET_F_GUEST_TSO6,
        VIRTIO_RING_F_INDIRECT_DESC,
        VIRTIO_RING_F_EVENT_IDX,
    ];
    let vhost = VhostUserVirtioFeatures::PROTOCOL_FEATURES | VhostUserVirtioFeatures::LOG_ALL;
    bits.iter().fold(vhost.bits(), |f, &b| f | (1u64 << b))
}

/// One virtqueue as the front end set it up.
pub(super) struct Vring {
    pub(super) queue: Queue,
    kick: Option<File>,
    pub(super) call: Option<File>,
    /// On unless an (accepted) `SET_VRING_ENABLE` turned it off. The spec has
    /// rings start disabled once protocol features are negotiated, but QEMU 7.2's
    /// virtio-net sends its only `SET_VRING_ENABLE(1)` before `SET_FEATURES`,
    /// when the parser must refuse it (unread by us): a ring waiting for an
    /// enable would never run.
    enabled: bool,
    /// The front end published an available index no ring of this size can have:
    /// the ring is stopped until the device is reset (a new connection), rather
    /// than looked at (and complained about) on every round.
    broken: bool,
    /// Where writes to the used ring are marked in the dirty log: the address
    /// `SET_VRING_ADDR` gave with `VHOST_VRING_F_LOG` (QEMU's is the used ring's
    /// own guest address), else the used ring's.
    log_at: u64,
    /// The guest acked `EVENT_IDX`.
    event_idx: bool,
    /// Interrupts the guest asked not to get, kicks overlayd asked it not to give.
    notify: Notifications,
}

impl Vring {
    fn new() -> std::io::Result<Vring> {
        Ok(Vring {
            queue: Queue::new(MAX_QUEUE_SIZE).map_err(std::io::Error::other)?,
            kick: None,
            call: None,
            enabled: true,
            broken: false,
            log_at: 0,
            event_idx: false,
            notify: Notifications::new(0),
        })
    }

    /// Whether frames may move: started by its kick eventfd, enabled, and not
    /// stopped by `GET_VRING_BASE`.
    pub(super) fn running(&self) -> bool {
        self.enabled && !self.broken && self.kick.is_some() && self.queue.ready()
    }

    /// Whether the ring's available index is one the front end may publish (at
    /// most a ring's worth past what was taken). A guest that writes another one
    /// stops the ring, with one warning: `port` names it.
    pub(super) fn sane(&mut self, mem: &GuestMemoryMmap, port: &str) -> bool {
        let avail = self
            .queue
            .avail_idx(mem, std::sync::atomic::Ordering::Acquire)
            .ok()
            .map(|a| a.0);
        let ahead = avail.map(|a| a.wrapping_sub(self.queue.next_avail()));
        match ahead {
            Some(n) if n <= self.queue.size() => true,
            _ => {
                self.broken = true;
                tracing::warn!(
                    port,
                    available = ?avail,
                    taken = self.queue.next_avail(),
                    "vhost-user ring stopped: the guest published an impossible available index"
                );
                false
            }
        }
    }

    /// Asks the guest to kick when it adds buffers (`on`: a worker is about to
    /// sleep) or not to (a worker polls the ring); the write is marked in `log`.
    /// Returns whether buffers are already waiting (only looked at when `on`).
    pub(super) fn set_kicks(
        &mut self,
        mem: &GuestMemoryMmap,
        on: bool,
        log: Option<RingLog<'_>>,
    ) -> bool {
        let (written, pending) = self.notify.set_kicks(&self.queue, mem, self.event_idx, on);
        if let (true, Some(log)) = (written, log) {
            log.used_ring();
        }
        pending
    }

    /// Interrupts the guest (the call eventfd), unless it asked not to be.
    pub(super) fn signal(&mut self, mem: &GuestMemoryMmap) -> std::io::Result<()> {
        if !self
            .notify
            .wants_interrupt(&self.queue, mem, self.event_idx)
        {
            return Ok(());
        }
        match &mut self.call {
            Some(call) => call.write_all(&1u64.to_ne_bytes()),
            None => Ok(()),
        }
    }
}

/// A guest memory region: where the front end has it mapped (for the ring
/// addresses, which it gives as its own virtual addresses) and in the guest.
struct Mapping {
    vmm_va: u64,
    gpa: u64,
    size: u64,
}

/// One connection's device state.
pub(super) struct Device {
    name: String,
    acked: u64,
    /// Set by a refused `SET_FEATURES`, taken by the connection loop, which then
    /// closes the connection.
    refused: Option<FeatureRefusal>,
    negotiated: Arc<Negotiated>,
    pub(super) mem: GuestMemoryMmap,
    maps: Vec<Mapping>,
    pub(super) vrings: [Vring; QUEUES],
    /// The dirty log QEMU gave (`SET_LOG_BASE`); written only while the front
    /// end acks `LOG_ALL` (it migrates the VM), dropped when it stops.
    log: Option<DirtyLog>,
    /// The worker's epoll set: a ring's kick eventfd goes in, edge-triggered and
    /// never read, under `token`, so a kick wakes a sleeping worker.
    epoll: EpollWatch,
    token: u64,
}

impl Device {
    pub(super) fn new(
        name: String,
        negotiated: Arc<Negotiated>,
        epoll: EpollWatch,
        token: u64,
    ) -> std::io::Result<Device> {
        Ok(Device {
            name,
            acked: 0,
            refused: None,
            negotiated,
            mem: GuestMemoryMmap::new(),
            maps: Vec::new(),
            vrings: [Vring::new()?, Vring::new()?],
            log: None,
            epoll,
            token,
        })
    }

    /// Why the front end's features were refused, once: its connection must end.
    pub(super) fn take_refusal(&mut self) -> Option<FeatureRefusal> {
        self.refused.take()
    }

    /// Whether the guest took mergeable receive buffers.
    pub(super) fn mergeable(&self) -> bool {
        self.acked & (1 << VIRTIO_NET_F_MRG_RXBUF) != 0
    }

    /// The features the current front end acked.
    pub(super) fn acked(&self) -> u64 {
        self.acked
    }

    /// Ring `index` (`RX` or `TX`) with the guest memory it is in and, while
    /// QEMU migrates the VM, where the writes to it are to be marked.
    pub(super) fn ring(
        &mut self,
        index: usize,
    ) -> (&GuestMemoryMmap, &mut Vring, Option<RingLog<'_>>) {
        let logging = self.acked & VhostUserVirtioFeatures::LOG_ALL.bits() != 0;
        let vring = &mut self.vrings[index];
        let log = self.log.as_ref().filter(|_| logging).map(|log| RingLog {
            log,
            used_at: vring.log_at,
            used_len: 6 + 8 * u64::from(vring.queue.size()),
            port: &self.name,
        });
        (&self.mem, vring, log)
    }

    fn vring(&mut self, index: u32) -> Result<&mut Vring> {
        self.vrings
            .get_mut(index as usize)
            .ok_or(Error::InvalidParam)
    }

    /// The guest address of the front end's virtual address `va`.
    fn gpa(&self, va: u64) -> Result<GuestAddress> {
        self.maps
            .iter()
            .find(|m| va >= m.vmm_va && va - m.vmm_va < m.size)
            .map(|m| GuestAddress(m.gpa + (va - m.vmm_va)))
            .ok_or(Error::InvalidParam)
    }

    fn set_kick(&mut self, index: u8, fd: Option<File>) -> Result<()> {
        let v = self
            .vrings
            .get_mut(usize::from(index))
            .ok_or(Error::InvalidParam)?;
        if let Some(old) = v.kick.take() {
            let _ = self.epoll.remove(old.as_raw_fd());
        }
        if let Some(f) = &fd {
            self.epoll
                .add_edge(f.as_raw_fd(), self.token)
                .map_err(Error::ReqHandlerError)?;
        }
        // The ring starts with its kick eventfd (vhost-user: "start ring upon
        // receiving a kick").
        v.queue.set_ready(fd.is_some());
        v.kick = fd;
        Ok(())
    }

    /// Back to the state before any front end (one reset the device, or went
    /// away): no ring runs, no guest memory is mapped.
    pub(super) fn reset(&mut self) {
        for i in 0..QUEUES {
            // Takes the kick eventfd out of the worker's poll set.
            let _ = self.set_kick(i as u8, None);
        }
        for v in &mut self.vrings {
            v.queue.reset();
            v.call = None;
            v.enabled = true;
            v.broken = false;
            v.log_at = 0;
            v.event_idx = false;
            v.notify = Notifications::new(0);
        }
        self.log = None;
        self.acked = 0;
        self.negotiated.acked.store(0, Ordering::Relaxed);
        self.mem = GuestMemoryMmap::new();
        self.maps.clear();
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        self.reset();
    }
}

/// Whether the datapath can serve a front end that acked `features`: only bits
/// offered, in a combination the virtio specification allows, and the 1.0
/// (`VERSION_1`) header. Any offload may be left out: the worker makes what it
/// hands such a guest into frames it takes (segments, complete checksums, one
/// receive buffer each; `worker/fit.rs` in overlayd) and drops what the guest
/// sends with offloads it did not negotiate ([`super::VhostPort::recv`]).
pub(super) fn check_features(features: u64) -> std::result::Result<(), FeatureRefusal> {
    let extra = features & !offered_features();
    if extra != 0 {
        return Err(FeatureRefusal::NotOffered(extra));
    }
    if features & bit(VIRTIO_F_VERSION_1) == 0 {
        return Err(FeatureRefusal::Legacy);
    }
    for &(feature, needs) in DEPENDENCIES {
        if features & bit(feature) != 0 && features & bit(needs) == 0 {
            return Err(FeatureRefusal::Inconsistent { feature, needs });
        }
    }
    Ok(())
}

/// Whether a frame the guest sent under `hdr` uses only offloads it negotiated
/// (`features`): a GSO frame needs HOST_TSO4/6 of its type (and UFO or any other
/// GSO type is never offered), a partial checksum needs CSUM.
pub(super) fn sent_as_negotiated(hdr: &VnetHdr, features: u64) -> bool {
    let gso = match hdr.gso_kind() {
        GSO_NONE => true,
        GSO_TCPV4 => features & bit(VIRTIO_NET_F_HOST_TSO4) != 0,
        GSO_TCPV6 => features & bit(VIRTIO_NET_F_HOST_TSO6) != 0,
        _ => false,
    };
    // HOST_ECN is not offered.
    let ecn = hdr.gso_type & GSO_ECN == 0;
    let csum = !hdr.needs_csum() || features & bit(VIRTIO_NET_F_CSUM) != 0;
    gso && ecn && csum
}

fn unsupported<T>(what: &'static str) -> Result<T> {
    Err(Error::InvalidOperation(what))
}

/// Refuses a guest memory region whose backing file is shorter than the part the
/// front end asks us to map: the first touch of a missing page would kill the
/// daemon, every port with it, with SIGBUS. A file the front end could still
/// shrink (a memfd or shmem file not sealed with `F_SEAL_SHRINK`) is mapped with a
/// warning: truncating it later would do the same, and only the front end can rule
/// that out (QEMU seals its memfd backends unless told `seal=off`; a
/// `memory-backend-file` cannot be sealed).
pub(super) fn check_backing(
    file: &File,
    offset: u64,
    size: u64,
    what: &str,
    port: &str,
) -> std::io::Result<()> {
    let meta = file.metadata()?;
    let end = offset.checked_add(size);
    // Only a regular file (memfd, hugetlbfs, tmpfs) has a length to check.
    if meta.is_file() && end.is_none_or(|end| meta.len() < end) {
        return Err(std::io::Error::other(format!(
            "{what} of {size} bytes at file offset {offset} is beyond its backing \
             file's {} bytes",
            meta.len()
        )));
    }
    // SAFETY: F_GET_SEALS takes no argument and only reads the descriptor's seals;
    // on a file that has none (not shmem or hugetlbfs) it fails with EINVAL.
    let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
    if seals >= 0 && seals & libc::F_SEAL_SHRINK == 0 {
        tracing::warn!(
            port = %port,
            what,
            "the file backing it is not sealed against shrinking (F_SEAL_SHRINK): a \
             truncation by the front end would kill overlayd with SIGBUS"
        );
    }
    Ok(())
}

impl VhostUserBackendReqHandlerMut for Device {
    fn set_owner(&mut self) -> Result<()> {
        Ok(())
    }

    fn reset_owner(&mut self) -> Result<()> {
        self.reset();
        Ok(())
    }

    fn reset_device(&mut self) -> Result<()> {
        self.reset();
        Ok(())
    }

    fn get_features(&mut self) -> Result<u64> {
        Ok(offered_features())
    }

    fn set_features(&mut self, features: u64) -> Result<()> {
        match check_features(features) {
            Ok(()) => {}
            Err(why) => {
                tracing::warn!(
                    port = %self.name,
                    features = format_args!("{features:#x}"),
                    "vhost-user front end refused: {why}; closing its connection"
                );
                self.negotiated.refusals.fetch_add(1, Ordering::Relaxed);
                self.negotiated.set_last_refusal(Some(why.clone()));
                self.refused = Some(why);
                return Err(Error::InvalidParam);
            }
        }
        if features & VhostUserVirtioFeatures::LOG_ALL.bits() == 0 {
            // The migration ended (or was cancelled): QEMU frees the log, and a
            // new one comes with the next `SET_LOG_BASE`.
            self.log = None;
        }
        self.acked = features;
        self.negotiated.acked.store(features, Ordering::Relaxed);
        self.negotiated.set_last_refusal(None);
        for v in &mut self.vrings {
            v.event_idx = features & bit(VIRTIO_RING_F_EVENT_IDX) != 0;
        }
        tracing::info!(
            port = %self.name,
            features = format_args!("{features:#x}"),
            names = %feature_names(features).join(","),
            "vhost-user features acked"
        );
        Ok(())
    }

    fn set_mem_table(
        &mut self,
        ctx: &[VhostUserMemoryRegion],
        files: Vec<File>,
        _postcopy_listening: Option<bool>,
    ) -> Result<Option<Vec<VhostUserMemoryRegionBase>>> {
        let mut regions = Vec::with_capacity(ctx.len());
        let mut maps = Vec::with_capacity(ctx.len());
        for (r, file) in ctx.iter().zip(files) {
            let size = usize::try_from(r.memory_size).map_err(|_| Error::InvalidParam)?;
            check_backing(
                &file,
                r.mmap_offset,
                r.memory_size,
                "guest memory region",
                &self.name,
            )
            .map_err(Error::ReqHandlerError)?;
            let mmap = MmapRegion::from_file(FileOffset::new(file, r.mmap_offset), size)
                .map_err(|e| Error::ReqHandlerError(std::io::Error::other(e)))?;
            let region = GuestRegionMmap::new(mmap, GuestAddress(r.guest_phys_addr))
                .ok_or(Error::InvalidParam)?;
            regions.push(region);
            maps.push(Mapping {
                vmm_va: r.user_addr,
                gpa: r.guest_phys_addr,
                size: r.memory_size,
            });
        }
        self.mem = GuestMemoryMmap::from_regions(regions)
            .map_err(|e| Error::ReqHandlerError(std::io::Error::other(e)))?;
        self.maps = maps;
        Ok(None)
    }

    fn set_vring_num(&mut self, index: u32, num: u32) -> Result<()> {
        let num = u16::try_from(num).map_err(|_| Error::InvalidParam)?;
        let v = self.vring(index)?;
        v.queue.try_set_size(num).map_err(|_| Error::InvalidParam)
    }

    fn set_vring_addr(
        &mut self,
        index: u32,
        flags: VhostUserVringAddrFlags,
        descriptor: u64,
        used: u64,
        available: u64,
        log: u64,
    ) -> Result<()> {
        let (desc, used, avail) = (self.gpa(descriptor)?, self.gpa(used)?, self.gpa(available)?);
        let v = self.vring(index)?;
        v.log_at = if flags.contains(VhostUserVringAddrFlags::VHOST_VRING_F_LOG) {
            log
        } else {
            used.0
        };
        let q = &mut v.queue;
        q.try_set_desc_table_address(desc)
            .and_then(|()| q.try_set_avail_ring_address(avail))
            .and_then(|()| q.try_set_used_ring_address(used))
            .map_err(|_| Error::InvalidParam)
    }

    fn set_vring_base(&mut self, index: u32, base: u32) -> Result<()> {
        let base = u16::try_from(base).map_err(|_| Error::InvalidParam)?;
        let v = self.vring(index)?;
        v.queue.set_next_avail(base);
        v.queue.set_next_used(base);
        v.notify = Notifications::new(base);
        Ok(())
    }

    fn get_vring_base(&mut self, index: u32) -> Result<VhostUserVringState> {
        // Stops the ring (vhost-user: "stop ring upon receiving GET_VRING_BASE").
        self.set_kick(u8::try_from(index).map_err(|_| Error::InvalidParam)?, None)?;
        let v = self.vring(index)?;
        v.call = None;
        Ok(VhostUserVringState::new(
            index,
            u32::from(v.queue.next_avail()),
        ))
    }

    fn set_vring_kick(&mut self, index: u8, fd: Option<File>) -> Result<()> {
        self.set_kick(index, fd)
    }

    fn set_vring_call(&mut self, index: u8, fd: Option<File>) -> Result<()> {
        self.vring(u32::from(index))?.call = fd;
        Ok(())
    }

    fn set_vring_err(&mut self, index: u8, _fd: Option<File>) -> Result<()> {
        // Errors are logged and counted here, not signalled to the front end.
        self.vring(u32::from(index)).map(|_| ())
    }

    fn get_protocol_features(&mut self) -> Result<VhostUserProtocolFeatures> {
        // The dirty log in shared memory, which QEMU requires of a vhost-user
        // back end to migrate the VM. Nothing else is needed: QEMU keeps the
        // config space, and reconnection needs no in-flight tracking for a
        // network device (see the module `vhost`).
        Ok(VhostUserProtocolFeatures::LOG_SHMFD)
    }

    fn set_protocol_features(&mut self, _features: u64) -> Result<()> {
        Ok(())
    }

    fn get_queue_num(&mut self) -> Result<u64> {
        Ok(QUEUES as u64)
    }

    fn set_vring_enable(&mut self, index: u32, enable: bool) -> Result<()> {
        self.vring(index)?.enabled = enable;
        tracing::info!(port = %self.name, ring = index, enable, "vhost-user ring enable");
        Ok(())
    }

    fn get_config(
        &mut self,
        _offset: u32,
        _size: u32,
        _flags: VhostUserConfigFlags,
    ) -> Result<Vec<u8>> {
        unsupported("GET_CONFIG")
    }

    fn set_config(
        &mut self,
        _offset: u32,
        _buf: &[u8],
        _flags: VhostUserConfigFlags,
    ) -> Result<()> {
        unsupported("SET_CONFIG")
    }

    fn set_backend_req_fd(&mut self, _backend: Backend) {}

    fn set_gpu_socket(&mut self, _gpu_backend: GpuBackend) -> Result<()> {
        unsupported("GPU_SET_SOCKET")
    }

    fn get_shared_object(&mut self, _uuid: VhostUserSharedMsg) -> Result<File> {
        unsupported("GET_SHARED_OBJECT")
    }

    fn get_inflight_fd(
        &mut self,
        _inflight: &VhostUserInflight,
    ) -> Result<(VhostUserInflight, File)> {
        unsupported("GET_INFLIGHT_FD")
    }

    fn set_inflight_fd(&mut self, _inflight: &VhostUserInflight, _file: File) -> Result<()> {
        unsupported("SET_INFLIGHT_FD")
    }

    fn get_max_mem_slots(&mut self) -> Result<u64> {
        unsupported("GET_MAX_MEM_SLOTS")
    }

    fn add_mem_region(
        &mut self,
        _region: &VhostUserSingleMemoryRegion,
        _fd: File,
        _postcopy_listening: Option<bool>,
    ) -> Result<Option<VhostUserMemoryRegionBase>> {
        unsupported("ADD_MEM_REG")
    }

    fn remove_mem_region(&mut self, _region: &VhostUserSingleMemoryRegion) -> Result<()> {
        unsupported("REM_MEM_REG")
    }

    fn set_device_state_fd(
        &mut self,
        _direction: VhostTransferStateDirection,
        _phase: VhostTransferStatePhase,
        _fd: File,
    ) -> Result<Option<File>> {
        unsupported("SET_DEVICE_STATE_FD")
    }

    fn check_device_state(&mut self) -> Result<()> {
        unsupported("CHECK_DEVICE_STATE")
    }

    fn get_shmem_config(&mut self) -> Result<VhostUserShMemConfig> {
        unsupported("GET_SHMEM_CONFIG")
    }

    fn set_log_base(&mut self, log: &VhostUserLog, file: File) -> Result<()> {
        let map = DirtyLog::map(log, file, &self.name).map_err(Error::ReqHandlerError)?;
        tracing::info!(
            port = %self.name,
            bytes = log.mmap_size,
            covers_mib = map.covers() >> 20,
            "vhost-user dirty log set: the front end migrates the VM"
        );
        self.log = Some(map);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use std::os::fd::FromRawFd as _;

    /// A memfd of `len` bytes, sealed against shrinking or not.
    fn memfd(len: usize, seal: bool) -> File {
        // SAFETY: the name is a NUL-terminated literal; the result is checked.
        let fd = unsafe { libc::memfd_create(c"vhost-test".as_ptr(), libc::MFD_ALLOW_SEALING) };
        assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
        // SAFETY: `fd` was just created and is owned by nothing else.
        let mut f = unsafe { File::from_raw_fd(fd) };
        f.write_all(&vec![0; len]).unwrap();
        if seal {
            // SAFETY: F_ADD_SEALS takes the seal bits by value on our own memfd.
            let r = unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) };
            assert_eq!(r, 0, "F_ADD_SEALS: {}", std::io::Error::last_os_error());
        }
        f
    }

    #[test]
    fn a_region_beyond_its_backing_file_is_refused_naming_the_sizes() {
        let f = memfd(0x2000, true);
        check_backing(&f, 0, 0x2000, "region", "p").unwrap();
        check_backing(&f, 0x1000, 0x1000, "region", "p").unwrap();
        let e = check_backing(&f, 0x1000, 0x2000, "region", "p")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("8192 bytes at file offset 4096") && e.contains("file's 8192 bytes"),
            "{e}"
        );
        assert!(check_backing(&f, u64::MAX, 2, "region", "p").is_err());
        // Unsealed: mapped (with a warning), the size still checked.
        let f = memfd(0x1000, false);
        check_backing(&f, 0, 0x1000, "region", "p").unwrap();
        assert!(check_backing(&f, 0, 0x1001, "region", "p").is_err());
    }

    /// VERSION_1 is all a front end must take; what it may not ack is named.
    #[test]
    fn features_are_checked_and_named() {
        let v1 = bit(VIRTIO_F_VERSION_1);
        assert_eq!(check_features(v1), Ok(()));
        assert_eq!(check_features(offered_features()), Ok(()));
        assert_eq!(check_features(0), Err(FeatureRefusal::Legacy));
        let tso = v1 | bit(VIRTIO_NET_F_HOST_TSO6);
        let e = check_features(tso).unwrap_err();
        assert_eq!(
            e.to_string(),
            "it acked HOST_TSO6 without CSUM, which the virtio specification requires with it"
        );
        let e = check_features(v1 | bit(22)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "it acked features overlayd did not offer: MQ"
        );
        assert_eq!(
            feature_names(v1 | bit(VIRTIO_NET_F_MRG_RXBUF) | bit(4)),
            ["bit 4", "MRG_RXBUF", "VERSION_1"]
        );
        let e = check_features(bit(VIRTIO_NET_F_MRG_RXBUF)).unwrap_err();
        assert!(e.to_string().contains("legacy"), "{e}");
    }
}
