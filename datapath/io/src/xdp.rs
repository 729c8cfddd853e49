//! Loading and attaching the steering XDP program (`xdp-prog`) with aya.
//!
//! No bpffs is involved: the program and maps live as long as the
//! [`SteeringProgram`] value, and dropping it detaches the program. (`ip netns
//! exec` remounts /sys, so a pinned program would not be reachable from the
//! namespaces the tests and the daemon run in anyway.)

use std::io;
use std::net::Ipv6Addr;
use std::os::fd::AsRawFd;

use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuArray, XskMap};
use aya::programs::xdp::XdpLinkId;
use aya::programs::{Xdp, XdpFlags};
use aya::Ebpf;

pub use xdp_prog::Counter;

/// Where the program runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachMode {
    /// In the driver (`XDP_FLAGS_DRV_MODE`): the default, and the only mode
    /// in which AF_XDP gets segments rather than whole GSO packets.
    Native,
    /// Generic/skb mode, for drivers without XDP support; only when asked.
    Skb,
}

/// The attached steering program and its maps.
pub struct SteeringProgram {
    ebpf: Ebpf,
    link: Option<XdpLinkId>,
    ifname: String,
}

fn err(ifname: &str, what: &str, e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("XDP steering on {ifname:?}: {what}: {e}"))
}

impl SteeringProgram {
    /// Loads the program, fills `underlay_addrs` and attaches to `ifname` in the
    /// calling thread's network namespace.
    pub fn attach(
        ifname: &str,
        underlay_addrs: &[Ipv6Addr],
        mode: AttachMode,
    ) -> io::Result<SteeringProgram> {
        if underlay_addrs.len() > xdp_prog::UNDERLAY_ADDRS_MAX_ENTRIES as usize {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} underlay addresses for {ifname:?}, the program holds at most {}",
                    underlay_addrs.len(),
                    xdp_prog::UNDERLAY_ADDRS_MAX_ENTRIES
                ),
            ));
        }
        crate::raise_memlock_limit();
        let ebpf = Ebpf::load(xdp_prog::STEER_OBJECT).map_err(|e| err(ifname, "load object", e))?;
        let mut prog = SteeringProgram {
            ebpf,
            link: None,
            ifname: ifname.to_string(),
        };
        for addr in underlay_addrs {
            prog.add_underlay_addr(*addr)?;
        }
        let flags = match mode {
            AttachMode::Native => XdpFlags::DRV_MODE,
            AttachMode::Skb => XdpFlags::SKB_MODE,
        };
        let xdp: &mut Xdp = prog
            .ebpf
            .program_mut(xdp_prog::PROGRAM_NAME)
            .ok_or_else(|| err(ifname, "object", "program `steer` missing"))?
            .try_into()
            .map_err(|e| err(ifname, "program type", e))?;
        xdp.load().map_err(|e| err(ifname, "verifier", e))?;
        let link = xdp
            .attach(ifname, flags)
            .map_err(|e| err(ifname, &format!("attach ({mode:?})"), e))?;
        prog.link = Some(link);
        Ok(prog)
    }

    fn map_mut(&mut self, name: &str) -> io::Result<&mut aya::maps::Map> {
        let ifname = self.ifname.clone();
        self.ebpf
            .map_mut(name)
            .ok_or_else(|| err(&ifname, "object", format!("map {name} missing")))
    }

    /// Steers Geneve for `addr` to AF_XDP from now on.
    pub fn add_underlay_addr(&mut self, addr: Ipv6Addr) -> io::Result<()> {
        let ifname = self.ifname.clone();
        let mut map: BpfHashMap<&mut MapData, [u8; 16], u8> =
            BpfHashMap::try_from(self.map_mut(xdp_prog::UNDERLAY_ADDRS_MAP)?)
                .map_err(|e| err(&ifname, "underlay_addrs", e))?;
        map.insert(addr.octets(), 1, 0)
            .map_err(|e| err(&ifname, &format!("add underlay address {addr}"), e))
    }

    /// Stops steering Geneve for `addr` (it goes to the kernel again).
    pub fn remove_underlay_addr(&mut self, addr: Ipv6Addr) -> io::Result<()> {
        let ifname = self.ifname.clone();
        let mut map: BpfHashMap<&mut MapData, [u8; 16], u8> =
            BpfHashMap::try_from(self.map_mut(xdp_prog::UNDERLAY_ADDRS_MAP)?)
                .map_err(|e| err(&ifname, "underlay_addrs", e))?;
        map.remove(&addr.octets())
            .map_err(|e| err(&ifname, &format!("remove underlay address {addr}"), e))
    }

    /// Directs frames arriving on rx queue `queue` to AF_XDP socket `socket`.
    pub fn register_socket(&mut self, queue: u32, socket: &impl AsRawFd) -> io::Result<()> {
        let ifname = self.ifname.clone();
        if queue >= xdp_prog::XSKS_MAX_ENTRIES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "queue {queue} on {ifname:?}: the program steers queues 0..{}",
                    xdp_prog::XSKS_MAX_ENTRIES
                ),
            ));
        }
        let mut map: XskMap<&mut MapData> = XskMap::try_from(self.map_mut(xdp_prog::XSKS_MAP)?)
            .map_err(|e| err(&ifname, "xsks", e))?;
        map.set(queue, socket.as_raw_fd(), 0)
            .map_err(|e| err(&ifname, &format!("register socket for queue {queue}"), e))
    }

    /// Sums the per-CPU counters.
    pub fn counters(&mut self) -> io::Result<Vec<(Counter, u64)>> {
        let ifname = self.ifname.clone();
        let map: PerCpuArray<&mut MapData, u64> =
            PerCpuArray::try_from(self.map_mut(xdp_prog::COUNTERS_MAP)?)
                .map_err(|e| err(&ifname, "counters", e))?;
        Counter::ALL
            .iter()
            .map(|c| {
                let per_cpu = map
                    .get(&(*c as u32), 0)
                    .map_err(|e| err(&ifname, c.name(), e))?;
                Ok((*c, per_cpu.iter().sum()))
            })
            .collect()
    }

    /// The value of one counter.
    pub fn counter(&mut self, which: Counter) -> io::Result<u64> {
        Ok(self
            .counters()?
            .into_iter()
            .find(|(c, _)| *c == which)
            .map_or(0, |(_, v)| v))
    }

    pub fn ifname(&self) -> &str {
        &self.ifname
    }
}

impl Drop for SteeringProgram {
    fn drop(&mut self) {
        let Some(link) = self.link.take() else { return };
        let Some(prog) = self.ebpf.program_mut(xdp_prog::PROGRAM_NAME) else {
            return;
        };
        let detached = <&mut Xdp>::try_from(prog)
            .map_err(|e| e.to_string())
            .and_then(|x| x.detach(link).map_err(|e| e.to_string()));
        if let Err(e) = detached {
            tracing::warn!(ifname = %self.ifname, error = %e, "XDP detach failed");
        }
    }
}
