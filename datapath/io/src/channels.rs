//! An interface's queue (channel) count, read and set with the ethtool ioctl
//! (`ETHTOOL_GCHANNELS`/`ETHTOOL_SCHANNELS`, what `ethtool -l`/`ethtool -L` do).
//!
//! Why: each underlay rx queue has one AF_XDP socket, and each socket belongs to
//! one worker, which also transmits on it. With fewer queues than workers some
//! worker would have no socket to send on, so the daemon raises the queue count
//! to the number of workers at startup (before attaching XDP: a veth with XDP
//! attached refuses some changes).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const ETHTOOL_GCHANNELS: u32 = 0x3c;
const ETHTOOL_SCHANNELS: u32 = 0x3d;

/// `struct ethtool_channels` (linux/ethtool.h).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Channels {
    cmd: u32,
    pub max_rx: u32,
    pub max_tx: u32,
    pub max_other: u32,
    pub max_combined: u32,
    pub rx_count: u32,
    pub tx_count: u32,
    pub other_count: u32,
    pub combined_count: u32,
}

/// `struct ifreq` with the `ifr_data` member of its union, padded to the
/// kernel's size (16-byte name + 24-byte union on 64-bit).
#[repr(C)]
struct IfReqData {
    name: [libc::c_char; libc::IFNAMSIZ],
    data: *mut libc::c_void,
    _pad: [u8; 16],
}

/// A `repr(C)` struct of `linux/ethtool.h` whose first field is the `cmd` word,
/// which `SIOCETHTOOL` reads and writes whole for the commands it is used with.
///
/// # Safety
///
/// The implementing type must have exactly the layout the kernel expects for
/// every command it is sent with.
pub(crate) unsafe trait EthtoolStruct {}

// SAFETY: `Channels` is `struct ethtool_channels`, sent with G/SCHANNELS only.
unsafe impl EthtoolStruct for Channels {}

/// `SIOCETHTOOL` on `ifname` with `arg` (its `cmd` set by the caller).
pub(crate) fn ethtool<T: EthtoolStruct>(ifname: &str, arg: &mut T) -> io::Result<()> {
    let mut name = [0 as libc::c_char; libc::IFNAMSIZ];
    if ifname.len() >= name.len() || ifname.bytes().any(|b| b == 0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("invalid interface name {ifname:?}"),
        ));
    }
    for (d, s) in name.iter_mut().zip(ifname.bytes()) {
        *d = s as libc::c_char;
    }
    // SAFETY: plain socket(2); the result is checked before use.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by socket(2) and is owned by nothing else.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut req = IfReqData {
        name,
        data: (arg as *mut T).cast(),
        _pad: [0; 16],
    };
    // SAFETY: SIOCETHTOOL reads the ifreq (a NUL-terminated name and a pointer
    // to `arg`), and reads/writes one struct of `arg`'s command through that
    // pointer (`EthtoolStruct`'s contract); both live until the call returns.
    let rc = unsafe {
        libc::ioctl(
            sock.as_raw_fd(),
            libc::SIOCETHTOOL as _,
            &mut req as *mut IfReqData,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The interface's current and maximum channel counts.
pub fn get(ifname: &str) -> io::Result<Channels> {
    let mut ch = Channels {
        cmd: ETHTOOL_GCHANNELS,
        ..Channels::default()
    };
    ethtool(ifname, &mut ch)?;
    Ok(ch)
}

/// Why an interface cannot be given the rx queues asked for, naming its limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("it supports at most {max} combined channels")]
    Combined { max: u32 },
    #[error("it supports at most {rx} rx and {tx} tx queues")]
    RxTx { rx: u32, tx: u32 },
}

/// What failed while giving an interface its queues: reading its channels, their
/// limits, or setting them.
#[derive(Debug, thiserror::Error)]
pub enum QueuesFailure {
    #[error("ETHTOOL_GCHANNELS: {0}")]
    Get(io::Error),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error("ETHTOOL_SCHANNELS: {0}")]
    Set(io::Error),
}

/// Why [`ensure_queues`] could not give `ifname` its `queues`, and what the
/// operator can do about it.
#[derive(Debug, thiserror::Error)]
#[error(
    "underlay interface {ifname:?} cannot be given {queues} queues (one per worker): \
     {why}; set them with `ethtool -L {ifname} ...` or configure fewer cores"
)]
pub struct QueuesError {
    pub ifname: String,
    pub queues: u32,
    pub why: QueuesFailure,
}

/// The settings that give at least `queues` rx queues, or why none can: NICs
/// with combined channels get at least `queues` combined; the others (veth) separate
/// rx and tx counts, both raised to `queues` (never lowered).
pub fn plan(now: &Channels, queues: u32) -> Result<Channels, PlanError> {
    let mut want = *now;
    want.cmd = ETHTOOL_SCHANNELS;
    if now.combined_count > 0 || (now.rx_count == 0 && now.max_combined > 0) {
        if now.max_combined < queues {
            return Err(PlanError::Combined {
                max: now.max_combined,
            });
        }
        want.combined_count = now.combined_count.max(queues);
    } else {
        if now.max_rx < queues || now.max_tx < queues {
            return Err(PlanError::RxTx {
                rx: now.max_rx,
                tx: now.max_tx,
            });
        }
        want.rx_count = now.rx_count.max(queues);
        want.tx_count = now.tx_count.max(queues);
    }
    Ok(want)
}

/// Gives `ifname` at least `queues` rx queues (like `ethtool -L`).
pub fn ensure_queues(ifname: &str, queues: u32) -> Result<(), QueuesError> {
    let fail = |why: QueuesFailure| QueuesError {
        ifname: ifname.to_string(),
        queues,
        why,
    };
    let now = get(ifname).map_err(|e| fail(QueuesFailure::Get(e)))?;
    let mut want = plan(&now, queues).map_err(|e| fail(e.into()))?;
    let unchanged = Channels {
        cmd: ETHTOOL_SCHANNELS,
        ..now
    };
    if want == unchanged {
        return Ok(());
    }
    ethtool(ifname, &mut want).map_err(|e| fail(QueuesFailure::Set(e)))?;
    tracing::info!(
        iface = ifname,
        rx = want.rx_count,
        tx = want.tx_count,
        combined = want.combined_count,
        "underlay queues raised for the workers"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn veth(rx: u32, tx: u32) -> Channels {
        Channels {
            max_rx: 2,
            max_tx: 2,
            rx_count: rx,
            tx_count: tx,
            ..Channels::default()
        }
    }

    #[test]
    fn plan_raises_rx_and_tx_on_veth_and_combined_on_nics() {
        let w = plan(&veth(1, 1), 2).unwrap();
        assert_eq!((w.rx_count, w.tx_count, w.cmd), (2, 2, ETHTOOL_SCHANNELS));
        let e = plan(&veth(1, 1), 3).unwrap_err().to_string();
        assert!(e.contains("at most 2 rx and 2 tx"), "{e}");
        let nic = Channels {
            max_combined: 8,
            combined_count: 2,
            ..Channels::default()
        };
        let w = plan(&nic, 4).unwrap();
        assert_eq!((w.combined_count, w.rx_count), (4, 0));
        assert_eq!(plan(&nic, 1).unwrap().combined_count, 2, "never lowered");
        assert_eq!(
            plan(&veth(2, 2), 1).unwrap(),
            Channels {
                cmd: ETHTOOL_SCHANNELS,
                ..veth(2, 2)
            }
        );
        assert!(plan(&nic, 9)
            .unwrap_err()
            .to_string()
            .contains("at most 8 combined"));
    }

    /// The loopback interface has no channels: a clear error naming it.
    #[test]
    fn loopback_refuses_with_the_interface_named() {
        let e = ensure_queues("lo", 2).unwrap_err().to_string();
        assert!(e.contains("\"lo\"") && e.contains("2 queues"), "{e}");
        assert!(ensure_queues("this-name-is-too-long", 2)
            .unwrap_err()
            .to_string()
            .contains("invalid interface name"));
    }
}
