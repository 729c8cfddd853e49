//! A port driven by a front end written here (the `vhost` crate's `Frontend`, as
//! QEMU would drive it): guest memory in a memfd both sides map, both rings set
//! up, the features acked chosen by each test.

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

/// The guest's memory: 1 MiB at guest address 0.
const MEM: u64 = 0x10_0000;
/// Where the front end says it has guest address 0 mapped (any address will do:
/// the port only translates ring addresses with it).
const VA: u64 = 0x7f00_0000_0000;
/// The rings: receive at 0, transmit at 0x1000; receive buffers from 0x4_0000.
const RING: [u64; 2] = [0, 0x1000];
const QUEUE: u16 = 16;
const RX_BUFFERS: u64 = 0x4_0000;

fn bits(b: &[u32]) -> u64 {
    b.iter().fold(0, |f, &b| f | 1u64 << b)
}

/// What a Linux guest with QEMU's defaults acks (bar the ones that need a config
/// space, which QEMU keeps).
fn linux_features() -> u64 {
    bits(&[
        VIRTIO_F_VERSION_1,
        VIRTIO_NET_F_GUEST_CSUM,
        VIRTIO_NET_F_GUEST_TSO4,
        VIRTIO_NET_F_GUEST_TSO6,
        VIRTIO_NET_F_MRG_RXBUF,
    ])
}

/// The test's side: the port, the front end's connection and the guest memory.
pub(super) struct Guest {
    pub(super) port: VhostPort,
    pub(super) frontend: Frontend,
    pub(super) mem: GuestMemoryMmap,
    /// The receive ring's used index.
    rx_used_at: GuestAddress,
    _epoll: Epoll,
    _fds: Vec<EventFd>,
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
pub(super) fn connect(name: &str, features: u64, rx_len: u32) -> Guest {
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
    // Laid out once (a mock ring zeroes its indexes when made); the guest posts
    // its receive buffers, each a chain of its own.
    let rings = RING.map(|at| {
        let r = MockSplitQueue::create(&mem, GuestAddress(at), QUEUE);
        [r.desc_table_addr().0, r.used_addr().0, r.avail_addr().0]
    });
    let rx = MockSplitQueue::create(&mem, GuestAddress(RING[0]), QUEUE);
    let descs: Vec<RawDescriptor> = (0..4u64)
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
        for (q, [desc, used, avail]) in rings.into_iter().enumerate() {
            frontend.set_vring_num(q, QUEUE)?;
            frontend.set_vring_addr(
                q,
                &VringConfigData {
                    queue_max_size: QUEUE,
                    queue_size: QUEUE,
                    flags: 0,
                    desc_table_addr: VA + desc,
                    used_ring_addr: VA + used,
                    avail_ring_addr: VA + avail,
                    log_addr: None,
                },
            )?;
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
    Guest {
        port,
        frontend,
        rx_used_at: GuestAddress(rings[0][1] + 2),
        mem,
        _epoll: epoll,
        _fds: fds,
        _dir: TempDir(dir),
    }
}

impl Guest {
    /// The receive ring's used index: how many buffers the port filled.
    pub(super) fn rx_used(&self) -> u16 {
        self.mem.read_obj(self.rx_used_at).unwrap()
    }
}

/// Waits up to 2 s for `cond`.
pub(super) fn wait_for(mut cond: impl FnMut() -> bool) -> bool {
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
fn write(port: &VhostPort, frame: &[u8]) -> std::io::Result<()> {
    let hdr = VnetHdr::default().to_bytes();
    port.write_gather(&[std::io::IoSlice::new(&hdr), std::io::IoSlice::new(frame)])
}

/// A 60-byte Ethernet frame.
fn frame() -> Vec<u8> {
    let mut f = vec![0u8; 60];
    f[..6].copy_from_slice(&[0xa8, 0x40, 0x25, 0xff, 0, 1]);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    f
}

#[test]
fn a_front_end_with_accepted_features_is_served() {
    let g = connect("ok", linux_features(), 2048);
    assert!(wait_for(|| g.port.is_up()), "the rings started");
    write(&g.port, &frame()).unwrap();
    assert_eq!(g.rx_used(), 1, "the frame reached the guest");
    let n = g.port.negotiation();
    assert_eq!(n.features, linux_features());
    assert_eq!((n.refusals, n.last_refusal), (0, None));
    assert!(g.frontend.get_features().is_ok(), "the connection is open");
}

/// The front end is disconnected: no ring starts, no frame reaches it, and the
/// refusal is counted and kept for `list-ports`.
fn assert_refused(g: &Guest, why: &str) {
    assert!(
        wait_for(|| g.frontend.get_features().is_err()),
        "the connection was closed"
    );
    assert!(!g.port.is_up(), "no ring runs");
    let e = write(&g.port, &frame()).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "the link is down");
    assert_eq!(g.rx_used(), 0, "no frame reached the guest");
    let n = g.port.negotiation();
    assert_eq!(n.features, 0);
    assert_eq!(n.refusals, 1);
    let last = n.last_refusal.map(|r| r.to_string()).unwrap_or_default();
    assert!(last.contains(why), "{last:?} names {why:?}");
    let counts = g.port.take_counts();
    assert_eq!(counts.refused, 1);
    assert_eq!(g.port.take_counts().refused, 0, "counted once");
}

#[test]
fn a_legacy_front_end_is_disconnected_and_never_served() {
    let legacy = linux_features() & !bits(&[VIRTIO_F_VERSION_1]);
    let g = connect("legacy", legacy, 2048);
    assert_refused(&g, "VERSION_1");
}

#[test]
fn a_front_end_with_guest_tso_but_no_guest_csum_is_disconnected() {
    let impossible = bits(&[VIRTIO_F_VERSION_1, VIRTIO_NET_F_GUEST_TSO4]);
    let g = connect("nocsum", impossible, 2048);
    assert_refused(&g, "GUEST_CSUM");
}
