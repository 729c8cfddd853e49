//! A front end for tests (the `vhost` crate's `Frontend`, driving a port as
//! QEMU would): guest memory in a memfd both sides map, both rings set up, the
//! features acked chosen by the test. Built for this crate's tests and, with
//! the `test-frontend` feature, for other crates' (the worker's).

use std::fs::File;
use std::os::fd::{AsRawFd as _, FromRawFd as _};
use std::time::{Duration, Instant};

use vhost::vhost_user::Frontend;
use vhost::{VhostBackend as _, VhostUserMemoryRegionInfo, VringConfigData};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_net::{
    VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_GUEST_TSO4, VIRTIO_NET_F_GUEST_TSO6,
    VIRTIO_NET_F_MRG_RXBUF,
};
use virtio_bindings::virtio_ring::VRING_DESC_F_WRITE;
use virtio_queue::desc::split::Descriptor as SplitDescriptor;
use virtio_queue::desc::RawDescriptor;
use virtio_queue::mock::MockSplitQueue;
use vm_memory::{
    Bytes as _, FileOffset, GuestAddress, GuestMemoryMmap, GuestRegionMmap, MmapRegion,
};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use wire::vnet::VnetHdr;

use super::{DeviceConfig, Mode, VhostPort};
use crate::poll::Epoll;

/// The guest's memory: 4 MiB at guest address 0.
const MEM: u64 = 0x40_0000;
/// Where the front end says it has guest address 0 mapped (any address will do:
/// the port only translates ring addresses with it).
const VA: u64 = 0x7f00_0000_0000;
/// The rings: receive at 0, transmit at 0x1000; receive buffers from 0x4_0000
/// (one a ring entry, 64 KiB apart), transmit buffers from 0x20_0000.
const RING: [u64; 2] = [0, 0x1000];
pub const QUEUE: u16 = 16;
const RX_BUFFERS: u64 = 0x4_0000;
const TX_BUFFERS: u64 = 0x20_0000;

/// The feature bits `b` as a mask.
pub fn bits(b: &[u32]) -> u64 {
    b.iter().fold(0, |f, &b| f | 1u64 << b)
}

/// What a guest that takes no offload acks (a DPDK guest by default).
pub fn plain_features() -> u64 {
    bits(&[VIRTIO_F_VERSION_1])
}

/// What a Linux guest with QEMU's defaults acks (bar the ones that need a config
/// space, which QEMU keeps).
pub fn linux_features() -> u64 {
    bits(&[
        VIRTIO_F_VERSION_1,
        VIRTIO_NET_F_GUEST_CSUM,
        VIRTIO_NET_F_GUEST_TSO4,
        VIRTIO_NET_F_GUEST_TSO6,
        VIRTIO_NET_F_MRG_RXBUF,
    ])
}

/// The guest's side: the front end's connection and the guest memory.
pub struct Guest {
    pub frontend: Frontend,
    pub mem: GuestMemoryMmap,
    /// The features acked.
    features: u64,
    /// Each ring's descriptors, used and available ring (guest addresses).
    rings: [[u64; 3]; 2],
    /// Transmit chains posted.
    sent: std::cell::Cell<u16>,
    _epoll: Epoll,
    /// Each ring's call and kick eventfds, in ring order.
    fds: Vec<EventFd>,
    _dir: TempDir,
}

/// A directory removed when dropped.
struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn memfd(len: u64) -> File {
    // SAFETY: the name is a NUL-terminated literal; the result is checked.
    let fd = unsafe { libc::memfd_create(c"vhost-guest".as_ptr(), libc::MFD_ALLOW_SEALING) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: `fd` was just created and is owned by nothing else.
    let f = unsafe { File::from_raw_fd(fd) };
    f.set_len(len).unwrap();
    // SAFETY: F_ADD_SEALS takes the seal bits by value on our own memfd.
    let r = unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) };
    assert_eq!(r, 0, "F_ADD_SEALS: {}", std::io::Error::last_os_error());
    f
}

/// Starts a server-mode port and connects a front end to it that sets the device
/// up as QEMU does, acking `features`; requests the port no longer reads (it
/// closed the connection) are not errors here. Receive buffers of `rx_len`
/// bytes are posted first.
pub fn connect(name: &str, features: u64, rx_len: u32) -> (VhostPort, Guest) {
    let dir = std::env::temp_dir().join(format!("vhost-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("sock");
    let epoll = Epoll::new().unwrap();
    let cfg = DeviceConfig {
        name: name.into(),
        socket: socket.clone(),
        mode: Mode::Server,
    };
    let port = VhostPort::start(cfg, epoll.watcher().unwrap(), 1).unwrap();

    let file = memfd(MEM);
    let region =
        MmapRegion::from_file(FileOffset::new(file.try_clone().unwrap(), 0), MEM as usize).unwrap();
    let mem =
        GuestMemoryMmap::from_regions(vec![GuestRegionMmap::new(region, GuestAddress(0)).unwrap()])
            .unwrap();
    // Laid out as a driver lays out a split ring: the descriptors, the
    // available ring (flags, index, entries, used_event), the used ring aligned
    // to 4. (The mock ring puts its used ring over the end of its available
    // ring; it is only used to post the receive buffers.)
    let q = u64::from(QUEUE);
    let rings = RING.map(|at| {
        let avail = at + 16 * q;
        [at, (avail + 6 + 2 * q + 3) & !3, avail]
    });
    let rx = MockSplitQueue::create(&mem, GuestAddress(RING[0]), QUEUE);
    let descs: Vec<RawDescriptor> = (0..u64::from(QUEUE))
        .map(|i| {
            let addr = RX_BUFFERS + 0x1_0000 * i;
            RawDescriptor::from(SplitDescriptor::new(
                addr,
                rx_len,
                VRING_DESC_F_WRITE as u16,
                0,
            ))
        })
        .collect();
    rx.add_desc_chains(&descs, 0).unwrap();

    let frontend = Frontend::connect(&socket, 2).unwrap();
    let mut fds = Vec::new();
    // Errors are what a closed connection gives; the tests look at the outcome.
    let _ = (|| -> vhost::Result<()> {
        frontend.set_owner()?;
        frontend.get_features()?;
        frontend.set_features(features)?;
        frontend.set_mem_table(&[VhostUserMemoryRegionInfo {
            guest_phys_addr: 0,
            memory_size: MEM,
            userspace_addr: VA,
            mmap_offset: 0,
            mmap_handle: file.as_raw_fd(),
        }])?;
        for (q, ring) in rings.into_iter().enumerate() {
            frontend.set_vring_num(q, QUEUE)?;
            frontend.set_vring_addr(q, &ring_config(ring, None))?;
            frontend.set_vring_base(q, 0)?;
            let (call, kick) = (
                EventFd::new(EFD_NONBLOCK).unwrap(),
                EventFd::new(EFD_NONBLOCK).unwrap(),
            );
            frontend.set_vring_call(q, &call)?;
            frontend.set_vring_kick(q, &kick)?;
            fds.extend([call, kick]);
        }
        Ok(())
    })();
    let guest = Guest {
        frontend,
        features,
        rings,
        sent: std::cell::Cell::new(0),
        mem,
        _epoll: epoll,
        fds,
        _dir: TempDir(dir),
    };
    (port, guest)
}

/// Ring `[desc, used, avail]` as `SET_VRING_ADDR` gives it, the used ring's
/// writes logged at `log` if given (as QEMU does while it migrates the VM).
fn ring_config([desc, used, avail]: [u64; 3], log: Option<u64>) -> VringConfigData {
    VringConfigData {
        queue_max_size: QUEUE,
        queue_size: QUEUE,
        flags: if log.is_some() { VHOST_VRING_F_LOG } else { 0 },
        desc_table_addr: VA + desc,
        used_ring_addr: VA + used,
        avail_ring_addr: VA + avail,
        log_addr: log,
    }
}

/// `VhostUserVringAddrFlags::VHOST_VRING_F_LOG`.
const VHOST_VRING_F_LOG: u32 = 1;

impl Guest {
    /// The receive ring's used index: how many buffers the port filled.
    pub fn rx_used(&self) -> u16 {
        self.mem
            .read_obj(GuestAddress(self.rings[0][1] + 2))
            .unwrap()
    }

    /// What the port wrote to receive buffer `i`: its v1 header and frame, of
    /// the length the used ring gives.
    pub fn received(&self, i: u64) -> Vec<u8> {
        let used_elem = GuestAddress(self.rings[0][1] + 4 + 8 * i);
        let len: u32 = self.mem.read_obj(GuestAddress(used_elem.0 + 4)).unwrap();
        let mut b = vec![0u8; len as usize];
        self.mem
            .read_slice(&mut b, GuestAddress(RX_BUFFERS + 0x1_0000 * i))
            .unwrap();
        b
    }

    /// Posts one frame on the transmit ring behind the v1 header `hdr`.
    pub fn send(&self, hdr: &VnetHdr, frame: &[u8]) {
        let i = self.sent.get();
        let [desc, _, avail] = self.rings[1];
        let at = TX_BUFFERS + 0x1_0000 * u64::from(i);
        let mut chain = hdr.to_bytes().to_vec();
        chain.extend_from_slice(&[1, 0]); // num_buffers
        chain.extend_from_slice(frame);
        self.mem.write_slice(&chain, GuestAddress(at)).unwrap();
        let d = desc + 16 * u64::from(i % QUEUE);
        self.mem.write_obj(at, GuestAddress(d)).unwrap();
        self.mem
            .write_obj(chain.len() as u32, GuestAddress(d + 8))
            .unwrap();
        self.mem.write_obj(0u32, GuestAddress(d + 12)).unwrap();
        let slot = avail + 4 + 2 * u64::from(i % QUEUE);
        self.mem.write_obj(i % QUEUE, GuestAddress(slot)).unwrap();
        self.sent.set(i + 1);
        self.mem.write_obj(i + 1, GuestAddress(avail + 2)).unwrap();
    }
}

/// The dirty log a migrating front end shares with the port: one bit per page
/// of the guest's memory.
pub struct Log(File);

impl Log {
    /// The guest pages whose bits are set.
    pub fn pages(&self) -> std::collections::BTreeSet<u64> {
        let mut bytes = vec![0u8; (MEM / 0x1000 / 8) as usize];
        std::os::unix::fs::FileExt::read_exact_at(&self.0, &mut bytes, 0).unwrap();
        (0..MEM / 0x1000)
            .filter(|p| bytes[(p / 8) as usize] & (1 << (p % 8)) != 0)
            .collect()
    }

    /// Clears every bit, as QEMU does when it syncs the log.
    pub fn clear(&self) {
        let zero = vec![0u8; (MEM / 0x1000 / 8) as usize];
        std::os::unix::fs::FileExt::write_all_at(&self.0, &zero, 0).unwrap();
    }
}

impl Guest {
    /// Starts dirty logging as QEMU does when a migration starts: the log in
    /// shared memory (`SET_LOG_BASE`, protocol feature `LOG_SHMFD`),
    /// `LOG_ALL` acked, and each ring's used ring logged at its own address.
    pub fn start_logging(&mut self) -> vhost::Result<Log> {
        use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
        use vhost::vhost_user::VhostUserFrontend as _;
        let with_protocol = self.features | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
        self.frontend.set_features(with_protocol)?;
        let offered = self.frontend.get_protocol_features()?;
        self.frontend
            .set_protocol_features(offered & VhostUserProtocolFeatures::LOG_SHMFD)?;
        let file = memfd(MEM / 0x1000 / 8);
        self.frontend.set_log_base(
            0,
            Some(vhost::VhostUserDirtyLogRegion {
                mmap_size: MEM / 0x1000 / 8,
                mmap_offset: 0,
                mmap_handle: file.as_raw_fd(),
            }),
        )?;
        self.frontend
            .set_features(with_protocol | VhostUserVirtioFeatures::LOG_ALL.bits())?;
        for (q, ring) in self.rings.into_iter().enumerate() {
            self.frontend
                .set_vring_addr(q, &ring_config(ring, Some(ring[1])))?;
        }
        // A request with a reply: the port has applied those before it.
        self.frontend.get_features()?;
        Ok(Log(file))
    }

    /// Ends dirty logging as QEMU does when a migration ends or is cancelled.
    pub fn stop_logging(&self) -> vhost::Result<()> {
        use vhost::vhost_user::message::VhostUserVirtioFeatures;
        self.frontend
            .set_features(self.features | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits())?;
        self.frontend.get_features().map(|_| ())
    }

    /// A copy of the guest's memory, to compare with what the port wrote.
    pub fn snapshot(&self) -> Vec<u8> {
        let mut m = vec![0u8; MEM as usize];
        self.mem.read_slice(&mut m, GuestAddress(0)).unwrap();
        m
    }

    /// The pages that differ from `before`.
    pub fn pages_changed_since(&self, before: &[u8]) -> std::collections::BTreeSet<u64> {
        let now = self.snapshot();
        (0..MEM / 0x1000)
            .filter(|&p| {
                let r = (p * 0x1000) as usize..((p + 1) * 0x1000) as usize;
                now[r.clone()] != before[r]
            })
            .collect()
    }
}

/// The guest's side of notifications (virtio 1.1, 2.7.7 and 2.7.10).
impl Guest {
    /// Whether ring `q` (0 receive, 1 transmit) interrupted the guest since the
    /// last call.
    pub fn interrupted(&self, q: usize) -> bool {
        self.fds[2 * q].read().is_ok()
    }

    /// Sets ring `q`'s available ring flags (`VRING_AVAIL_F_NO_INTERRUPT`: 1).
    pub fn set_avail_flags(&self, q: usize, flags: u16) {
        self.mem
            .write_obj(flags, GuestAddress(self.rings[q][2]))
            .unwrap();
    }

    /// Sets ring `q`'s `used_event` (with `EVENT_IDX`).
    pub fn set_used_event(&self, q: usize, at: u16) {
        let [_, _, avail] = self.rings[q];
        self.mem
            .write_obj(at, GuestAddress(avail + 4 + 2 * u64::from(QUEUE)))
            .unwrap();
    }

    /// Ring `q`'s used ring flags (`VRING_USED_F_NO_NOTIFY`: 1).
    pub fn used_flags(&self, q: usize) -> u16 {
        self.mem.read_obj(GuestAddress(self.rings[q][1])).unwrap()
    }

    /// Ring `q`'s `avail_event` (with `EVENT_IDX`).
    pub fn avail_event(&self, q: usize) -> u16 {
        let at = self.rings[q][1] + 4 + 8 * u64::from(QUEUE);
        self.mem.read_obj(GuestAddress(at)).unwrap()
    }
}

/// Waits up to 2 s for `cond`.
pub fn wait_for(mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + Duration::from_secs(2);
    while Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    cond()
}

/// One frame to the guest, behind a header without offloads.
pub fn write(port: &VhostPort, frame: &[u8]) -> std::io::Result<()> {
    let hdr = VnetHdr::default().to_bytes();
    port.write_gather(&[std::io::IoSlice::new(&hdr), std::io::IoSlice::new(frame)])
}

/// A 60-byte Ethernet frame.
pub fn frame() -> Vec<u8> {
    let mut f = vec![0u8; 60];
    f[..6].copy_from_slice(&[0xa8, 0x40, 0x25, 0xff, 0, 1]);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    f
}
