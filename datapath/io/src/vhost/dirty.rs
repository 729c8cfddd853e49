//! The dirty-page log of a live migration: while QEMU migrates a VM, every page of
//! guest memory overlayd writes (receive buffers, used rings) must be marked in a
//! bitmap QEMU shares with it (`VHOST_USER_SET_LOG_BASE`, protocol feature
//! `LOG_SHMFD`), one bit per 4 KiB page of guest-physical address, so that QEMU
//! copies those pages again before the VM runs on the other host. A write left
//! unmarked is a page the destination has as it was: a frame the guest finds
//! corrupt, or a used ring that says less than the guest was given.
//!
//! The marks are made where overlayd writes ([`super::fill_rx`], the used ring
//! after [`super::VhostPort::recv`]), not through `vm-memory`'s `Bitmap` on every
//! store: the device's lock is held for each write anyway, so a port that is not
//! being migrated pays one branch per frame for it, and no atomic load per store.

use std::fs::File;
use std::sync::atomic::{AtomicU8, Ordering};

use vhost::vhost_user::message::VhostUserLog;
use virtio_queue::DescriptorChain;
use vm_memory::{FileOffset, GuestMemoryMmap, MmapRegion, VolatileMemory as _};

/// The page size the log counts in (vhost's `VHOST_LOG_PAGE`).
const PAGE: u64 = 0x1000;

/// The bitmap QEMU gave, mapped shared.
pub(super) struct DirtyLog {
    map: MmapRegion,
    /// Pages written beyond the end of the log (QEMU sizes it to cover guest
    /// memory, so none should be): their bits cannot be set, and the migrated VM
    /// may find them stale. Warned about once per log.
    beyond: std::cell::Cell<u64>,
}

impl DirtyLog {
    /// Maps the log the front end sent with `SET_LOG_BASE`: `log.mmap_size`
    /// bytes of `file` from `log.mmap_offset`. A file shorter than that is
    /// refused, as guest memory is (a page missing under the mapping would kill
    /// the daemon with SIGBUS on its first mark).
    pub(super) fn map(log: &VhostUserLog, file: File, port: &str) -> std::io::Result<DirtyLog> {
        let size = usize::try_from(log.mmap_size)
            .ok()
            .filter(|&s| s > 0)
            .ok_or_else(|| {
                std::io::Error::other(format!("dirty log of {} bytes", log.mmap_size))
            })?;
        super::device::check_backing(&file, log.mmap_offset, log.mmap_size, "dirty log", port)?;
        let map = MmapRegion::from_file(FileOffset::new(file, log.mmap_offset), size)
            .map_err(std::io::Error::other)?;
        Ok(DirtyLog {
            map,
            beyond: std::cell::Cell::new(0),
        })
    }

    /// The guest memory the log covers, in bytes.
    pub(super) fn covers(&self) -> u64 {
        self.map.len() as u64 * 8 * PAGE
    }

    /// Marks the pages of the `len` guest bytes from `gpa` written. Called after
    /// the write: QEMU clears a bit before it copies the page, so a mark made
    /// before the write could be cleared with the old contents copied.
    pub(super) fn mark(&self, gpa: u64, len: u64, port: &str) {
        if len == 0 {
            return;
        }
        let last = gpa.saturating_add(len - 1) / PAGE;
        for page in gpa / PAGE..=last {
            let byte = usize::try_from(page / 8).unwrap_or(usize::MAX);
            match self.map.get_atomic_ref::<AtomicU8>(byte) {
                Ok(b) => {
                    b.fetch_or(1 << (page % 8), Ordering::Release);
                }
                Err(_) => {
                    let n = self.beyond.get();
                    self.beyond.set(n + 1);
                    if n == 0 {
                        tracing::warn!(
                            port,
                            gpa = format_args!("{:#x}", page * PAGE),
                            log_covers = self.covers(),
                            "vhost-user dirty log too small for a page overlayd wrote: \
                             the migrated VM may find it stale"
                        );
                    }
                }
            }
        }
    }
}

/// Where the writes to one ring and its buffers are marked while QEMU migrates
/// the VM ([`super::device::Device::ring`]).
#[derive(Clone, Copy)]
pub(super) struct RingLog<'a> {
    pub(super) log: &'a DirtyLog,
    /// The used ring as the log counts it: where, and how long (flags, index,
    /// every element and `avail_event`: a few pages at most).
    pub(super) used_at: u64,
    pub(super) used_len: u64,
    pub(super) port: &'a str,
}

impl RingLog<'_> {
    /// Marks the used ring, after an element or the index was written.
    pub(super) fn used_ring(&self) {
        self.log.mark(self.used_at, self.used_len, self.port);
    }

    /// Marks every buffer of `chain` the device may write (all of each, however
    /// much was written: a page marked needlessly is only copied again). The
    /// chain must have been found in guest memory (its writer made).
    pub(super) fn buffers(&self, chain: DescriptorChain<&GuestMemoryMmap>) {
        for d in chain.writable() {
            self.log.mark(d.addr().0, u64::from(d.len()), self.port);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;
    use std::os::fd::FromRawFd as _;

    fn log_of(bytes: usize) -> (DirtyLog, File) {
        // SAFETY: the name is a NUL-terminated literal; the result is checked.
        let fd = unsafe { libc::memfd_create(c"dirty-test".as_ptr(), 0) };
        assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
        // SAFETY: `fd` was just created and is owned by nothing else.
        let mut f = unsafe { File::from_raw_fd(fd) };
        f.write_all(&vec![0; bytes]).unwrap();
        let log = VhostUserLog {
            mmap_size: bytes as u64,
            mmap_offset: 0,
        };
        (DirtyLog::map(&log, f.try_clone().unwrap(), "p").unwrap(), f)
    }

    fn bits(f: &File, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        std::os::unix::fs::FileExt::read_exact_at(f, &mut v, 0).unwrap();
        v
    }

    #[test]
    fn a_write_marks_every_page_it_touches_in_the_shared_file() {
        let (log, f) = log_of(4);
        assert_eq!(log.covers(), 32 * PAGE);
        log.mark(0x1fff, 2, "p"); // pages 1 and 2
        log.mark(0x9000, 0x1000, "p"); // page 9 only
        log.mark(0x5000, 0, "p"); // nothing
        assert_eq!(bits(&f, 4), [0b0000_0110, 0b0000_0010, 0, 0]);
        assert_eq!(log.beyond.get(), 0);
    }

    #[test]
    fn a_page_beyond_the_log_is_counted_not_marked() {
        let (log, f) = log_of(1);
        log.mark(7 * PAGE, 2 * PAGE, "p"); // page 7 in, page 8 beyond
        log.mark(u64::MAX - 1, 1, "p");
        assert_eq!(bits(&f, 1), [0b1000_0000]);
        assert_eq!(log.beyond.get(), 2);
    }

    #[test]
    fn a_log_its_file_cannot_hold_is_refused() {
        let (_, f) = log_of(8);
        let log = VhostUserLog {
            mmap_size: 16,
            mmap_offset: 0,
        };
        let e = DirtyLog::map(&log, f.try_clone().unwrap(), "p")
            .err()
            .unwrap();
        assert!(e.to_string().contains("beyond its"), "{e}");
        let empty = VhostUserLog {
            mmap_size: 0,
            mmap_offset: 0,
        };
        assert!(DirtyLog::map(&empty, f, "p").is_err());
    }
}
