//! The underlay's tunnel tap: transmit of UDP-tunnel GSO super-frames (Linux 6.17+).
//!
//! AF_XDP has no GSO, so a guest TSO buffer sent through it is cut in user space into
//! ~8.9 KB frames, each an skb and a kernel copy in copy mode. A tap whose vnet
//! header is the 24-byte `virtio_net_hdr_v1_hash_tunnel` takes one encapsulated
//! super-frame of up to 64 KiB instead and has the kernel segment it as late as it
//! can: software GSO at the first device without UDP-tunnel TSO, or the NIC
//! (docs/tunnel-gso.md). AF_PACKET and macvtap refuse that header.
//!
//! One multi-queue tap per underlay link, named after it ([`tap_name`]), with a queue
//! per worker ([`TunnelQueue`]). It has no address, and IPv6 is off on it. Frames
//! written to it are complete (outer Ethernet with the next hop's MAC, as AF_XDP
//! frames are) and enter the tap's ingress, where a tc program (tcx, from
//! `xdp-prog/src/tunnel_redirect.bpf.c`) redirects each to the underlay link's
//! egress: no route, bridge or neighbour entry is involved. The tap is not
//! persistent: the kernel deletes it with its last queue, so a daemon that exits or
//! crashes leaves nothing behind. A leftover tap of that name (made persistent by
//! something else) is taken over: made non-persistent and joined.
//!
//! A veth never completes a partial checksum: a segment it carries keeps the
//! checksum offload request, and an XDP program on the far end (another sled's
//! datapath) reads the unfinished checksum. So on a veth underlay the tunnel path
//! turns the link's transmit checksum offload off ([`complete_checksums_on_veth`]):
//! the kernel then segments and checksums in software at the link, as for a NIC
//! without UDP-tunnel TSO. A NIC keeps its offloads and completes them on the wire.
//!
//! Support is probed with `TUNSETOFFLOAD` including `TUN_F_UDP_TUNNEL_GSO`, which
//! kernels without tunnel GSO refuse with EINVAL (`TUNSETVNETHDRSZ` 24 alone is
//! accepted by older kernels too). The offloads it turns on govern only what the
//! kernel may hand a reader of the tap, and nobody reads it.

use std::fs::File;
use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, RawFd};

use aya::maps::{Array, MapData, PerCpuArray};
use aya::programs::{tc::TcAttachType, SchedClassifier};
use aya::Ebpf;
use wire::vnet::TUNNEL_VNET_HDR_LEN;

use crate::channels::{ethtool, EthtoolStruct};
use crate::netlink::Netlink;
use crate::tap::{open_tun, writev_all};

/// `TUN_F_UDP_TUNNEL_GSO` (include/uapi/linux/if_tun.h, Linux 6.17+).
const TUN_F_UDP_TUNNEL_GSO: libc::c_uint = 0x080;
/// `TUN_F_UDP_TUNNEL_GSO_CSUM` (Linux 6.17+).
const TUN_F_UDP_TUNNEL_GSO_CSUM: libc::c_uint = 0x100;

/// The name of link `link`'s tunnel tap: `gso-` and the link's name, or, when that
/// is longer than an interface name may be (15 bytes), `gso-` and its index.
pub fn tap_name(link: &str, ifindex: u32) -> String {
    let name = format!("gso-{link}");
    if name.len() < libc::IFNAMSIZ {
        name
    } else {
        format!("gso-{ifindex}")
    }
}

/// One queue of a tunnel tap: a worker writes its super-frames here.
#[derive(Debug)]
pub struct TunnelQueue {
    file: File,
    /// The underlay link the tap's frames leave by.
    link_ifindex: u32,
}

impl TunnelQueue {
    /// Attaches a new queue to tunnel tap `name` (creating the tap if absent),
    /// non-blocking, with the 24-byte tunnel vnet header.
    fn open(name: &str, link_ifindex: u32) -> io::Result<TunnelQueue> {
        let flags = libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR | libc::IFF_MULTI_QUEUE;
        let file = open_tun(name, flags)?;
        let hdr_len = TUNNEL_VNET_HDR_LEN as libc::c_int;
        // SAFETY: TUNSETVNETHDRSZ reads an int through the pointer, which points
        // to a live local.
        if unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETVNETHDRSZ, &hdr_len) } < 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!("TUNSETVNETHDRSZ {hdr_len} on tap {name:?}: {e}"),
            ));
        }
        Ok(TunnelQueue { file, link_ifindex })
    }

    /// The underlay link this queue's frames leave by.
    pub fn link_ifindex(&self) -> u32 {
        self.link_ifindex
    }

    /// Writes one super-frame: the tunnel vnet header followed by `frame`, in one
    /// `writev`. A refusal comes back as an error: the caller counts the frame as
    /// dropped rather than wait (TCP sends the data again).
    pub fn write(&self, hdr: &[u8; TUNNEL_VNET_HDR_LEN], frame: &[u8]) -> io::Result<()> {
        writev_all(
            self.file.as_raw_fd(),
            &[IoSlice::new(hdr), IoSlice::new(frame)],
        )
    }
}

impl AsRawFd for TunnelQueue {
    fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

/// A tunnel tap for one underlay link: its redirect program, and the queues not
/// yet handed to workers. Dropping it and every queue deletes the tap.
pub struct TunnelTap {
    name: String,
    link: String,
    queues: Vec<TunnelQueue>,
    /// Kept for its lifetime: the tcx link goes with it, and with the tap.
    ebpf: Ebpf,
    /// The link is a veth whose transmit checksum offload this tap turned off:
    /// turned on again when the tap goes.
    restore_tx_csum: bool,
}

impl Drop for TunnelTap {
    fn drop(&mut self) {
        if !self.restore_tx_csum {
            return;
        }
        match set_tx_csum(&self.link, true) {
            Ok(()) => tracing::info!(
                iface = %self.link,
                "transmit checksum offload of the veth underlay turned on again"
            ),
            // The link may be gone (deleted, or re-created under its name).
            Err(e) => tracing::warn!(
                iface = %self.link,
                error = %e,
                "transmit checksum offload of the veth underlay not turned on again"
            ),
        }
    }
}

impl std::fmt::Debug for TunnelTap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TunnelTap")
            .field("name", &self.name)
            .field("link", &self.link)
            .field("queues", &self.queues.len())
            .finish()
    }
}

impl TunnelTap {
    /// Creates link `link`'s (index `link_ifindex`) tunnel tap in the calling
    /// thread's network namespace with `queues` queues, probes tunnel GSO, brings
    /// the tap up and attaches the redirect to `link_ifindex`. An error of kind
    /// [`io::ErrorKind::Unsupported`] means the kernel has no UDP-tunnel GSO on
    /// taps (before 6.17); the message says why in either case.
    pub fn open(link: &str, link_ifindex: u32, queues: usize) -> io::Result<TunnelTap> {
        let name = tap_name(link, link_ifindex);
        let first = match TunnelQueue::open(&name, link_ifindex) {
            Ok(q) => q,
            // A tap of that name made by something else (single-queue: EINVAL,
            // or in use: EBUSY): take it over.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::InvalidInput | io::ErrorKind::ResourceBusy
                ) =>
            {
                release_leftover(&name).map_err(|r| {
                    io::Error::new(e.kind(), format!("{e}; taking the tap over: {r}"))
                })?;
                TunnelQueue::open(&name, link_ifindex)?
            }
            Err(e) => return Err(e),
        };
        probe(&first, &name)?;
        // A leftover persistent multi-queue tap was joined without complaint: it
        // too must go with the daemon.
        not_persistent(&first)
            .map_err(|e| io::Error::new(e.kind(), format!("TUNSETPERSIST 0 on {name:?}: {e}")))?;
        let mut all = vec![first];
        for _ in 1..queues.max(1) {
            all.push(TunnelQueue::open(&name, link_ifindex)?);
        }
        disable_ipv6(&name);
        let mut nl = Netlink::open()?;
        let tap = nl.link_by_name(&name)?;
        nl.set_up(tap.ifindex, true)
            .map_err(|e| io::Error::new(e.kind(), format!("bring tap {name:?} up: {e}")))?;
        let ebpf = attach_redirect(&name, link_ifindex)?;
        // Last, so that a failure above (and the fallback it brings) leaves the
        // link as it was.
        let restore_tx_csum = complete_checksums_on_veth(link)?;
        tracing::info!(tap = %name, link, queues = all.len(), "underlay tunnel GSO tap ready");
        Ok(TunnelTap {
            name,
            link: link.to_string(),
            queues: all,
            ebpf,
            restore_tx_csum,
        })
    }

    /// The tap's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The underlay link it sends out of.
    pub fn link(&self) -> &str {
        &self.link
    }

    /// The queues, for the workers (one each); the tap lives until the last is
    /// dropped.
    pub fn take_queues(&mut self) -> Vec<TunnelQueue> {
        std::mem::take(&mut self.queues)
    }

    /// Frames the redirect program dropped for want of a target (0 unless the
    /// loader is broken).
    pub fn redirect_drops(&mut self) -> io::Result<u64> {
        let map = self
            .ebpf
            .map_mut(xdp_prog::REDIRECT_DROPS_MAP)
            .ok_or_else(|| io::Error::other("redirect program has no drop counter"))?;
        let map: PerCpuArray<&mut MapData, u64> =
            PerCpuArray::try_from(map).map_err(io::Error::other)?;
        Ok(map.get(&0, 0).map_err(io::Error::other)?.iter().sum())
    }
}

/// Whether the kernel takes UDP-tunnel GSO on `q`'s tap: `TUNSETOFFLOAD` with
/// `TUN_F_UDP_TUNNEL_GSO` (valid only with `TUN_F_CSUM` and a TSO bit).
fn probe(q: &TunnelQueue, name: &str) -> io::Result<()> {
    let offloads = libc::TUN_F_CSUM
        | libc::TUN_F_TSO4
        | libc::TUN_F_TSO6
        | TUN_F_UDP_TUNNEL_GSO
        | TUN_F_UDP_TUNNEL_GSO_CSUM;
    // SAFETY: TUNSETOFFLOAD takes its flag word by value.
    if unsafe {
        libc::ioctl(
            q.as_raw_fd(),
            libc::TUNSETOFFLOAD,
            libc::c_ulong::from(offloads),
        )
    } == 0
    {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EINVAL) {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "the kernel refuses TUNSETOFFLOAD with TUN_F_UDP_TUNNEL_GSO on tap {name:?} \
                 ({e}): UDP-tunnel GSO on taps needs Linux 6.17 or later"
            ),
        ));
    }
    Err(io::Error::new(
        e.kind(),
        format!("TUNSETOFFLOAD on tap {name:?}: {e}"),
    ))
}

/// Makes a leftover tap `name` non-persistent, so that it goes when its last user
/// closes it (now, when nobody else has it open). It is opened with the flags it
/// has (`TUNSETIFF` refuses others), tried in turn.
fn release_leftover(name: &str) -> io::Result<()> {
    let mut last = io::Error::other("no flags fit");
    for flags in [
        libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR,
        libc::IFF_TAP | libc::IFF_NO_PI,
        libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR | libc::IFF_MULTI_QUEUE,
        libc::IFF_TAP,
    ] {
        match open_tun(name, flags) {
            Ok(file) => {
                not_persistent(&file)?;
                tracing::warn!(tap = name, "took over a leftover tunnel tap");
                return Ok(());
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Makes the tap `fd` is attached to non-persistent: it goes when its last queue
/// is closed.
fn not_persistent(fd: &impl AsRawFd) -> io::Result<()> {
    // SAFETY: TUNSETPERSIST takes its flag by value.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETPERSIST, 0 as libc::c_ulong) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Turns IPv6 off on the tap before it comes up: no link-local address, no
/// router solicitations or DAD probes queued for a reader that never reads.
/// Best effort: without it the tap works the same.
fn disable_ipv6(name: &str) {
    let path = format!("/proc/sys/net/ipv6/conf/{name}/disable_ipv6");
    if let Err(e) = std::fs::write(&path, "1") {
        tracing::debug!(tap = name, error = %e, "IPv6 left on for the tunnel tap");
    }
}

/// Loads the redirect program, points it at `link_ifindex` and attaches it to the
/// ingress of tap `name` (tcx on Linux 6.6+, which every kernel with tunnel GSO
/// is).
fn attach_redirect(name: &str, link_ifindex: u32) -> io::Result<Ebpf> {
    let err = |what: &str, e: &dyn std::fmt::Display| {
        io::Error::other(format!("tunnel tap {name:?} redirect: {what}: {e}"))
    };
    crate::raise_memlock_limit();
    let mut ebpf =
        Ebpf::load(xdp_prog::TUNNEL_REDIRECT_OBJECT).map_err(|e| err("load object", &e))?;
    {
        let map = ebpf
            .map_mut(xdp_prog::REDIRECT_TO_MAP)
            .ok_or_else(|| err("object", &"map redirect_to missing"))?;
        let mut to: Array<&mut MapData, u32> =
            Array::try_from(map).map_err(|e| err("redirect_to", &e))?;
        to.set(0, link_ifindex, 0)
            .map_err(|e| err("set target", &e))?;
    }
    let prog: &mut SchedClassifier = ebpf
        .program_mut(xdp_prog::TUNNEL_REDIRECT_PROGRAM)
        .ok_or_else(|| err("object", &"program tunnel_redirect missing"))?
        .try_into()
        .map_err(|e| err("program type", &e))?;
    prog.load().map_err(|e| err("verifier", &e))?;
    prog.attach(name, TcAttachType::Ingress)
        .map_err(|e| err("attach to ingress", &e))?;
    Ok(ebpf)
}

const ETHTOOL_GDRVINFO: u32 = 0x03;
const ETHTOOL_GTXCSUM: u32 = 0x16;
const ETHTOOL_STXCSUM: u32 = 0x17;

/// `struct ethtool_drvinfo` (linux/ethtool.h).
#[repr(C)]
struct DrvInfo {
    cmd: u32,
    driver: [u8; 32],
    version: [u8; 32],
    fw_version: [u8; 32],
    bus_info: [u8; 32],
    erom_version: [u8; 32],
    reserved2: [u8; 12],
    n_priv_flags: u32,
    n_stats: u32,
    testinfo_len: u32,
    eedump_len: u32,
    regdump_len: u32,
}

// SAFETY: `DrvInfo` is `struct ethtool_drvinfo`, sent with GDRVINFO only.
unsafe impl EthtoolStruct for DrvInfo {}

/// `struct ethtool_value` (linux/ethtool.h).
#[repr(C)]
struct EthtoolValue {
    cmd: u32,
    data: u32,
}

// SAFETY: `EthtoolValue` is `struct ethtool_value`, sent with G/STXCSUM only.
unsafe impl EthtoolStruct for EthtoolValue {}

/// The name of `ifname`'s driver (`ethtool -i`).
fn driver(ifname: &str) -> io::Result<String> {
    let mut info = DrvInfo {
        cmd: ETHTOOL_GDRVINFO,
        driver: [0; 32],
        version: [0; 32],
        fw_version: [0; 32],
        bus_info: [0; 32],
        erom_version: [0; 32],
        reserved2: [0; 12],
        n_priv_flags: 0,
        n_stats: 0,
        testinfo_len: 0,
        eedump_len: 0,
        regdump_len: 0,
    };
    ethtool(ifname, &mut info)?;
    let end = info.driver.iter().position(|&b| b == 0).unwrap_or(32);
    Ok(String::from_utf8_lossy(&info.driver[..end]).into_owned())
}

/// On a veth, turns transmit checksum offload off (`ethtool -K IF tx off`), so that
/// the kernel completes every checksum of the segments it cuts from super-frames
/// (see the module documentation); returns whether it was on. Other links are left
/// alone.
pub fn complete_checksums_on_veth(ifname: &str) -> io::Result<bool> {
    let fail =
        |what: &str, e: io::Error| io::Error::new(e.kind(), format!("{what} on {ifname:?}: {e}"));
    if driver(ifname).map_err(|e| fail("ETHTOOL_GDRVINFO", e))? != "veth" {
        return Ok(false);
    }
    if !tx_csum(ifname).map_err(|e| fail("ETHTOOL_GTXCSUM", e))? {
        return Ok(false);
    }
    set_tx_csum(ifname, false)?;
    tracing::info!(
        iface = ifname,
        "transmit checksum offload turned off on the veth underlay (and with it TSO of \
         the host's own traffic on it): the kernel completes the checksums of \
         segmented super-frames"
    );
    Ok(true)
}

/// Whether `ifname`'s transmit checksum offload is on (`ethtool -k IF`'s `tx`).
fn tx_csum(ifname: &str) -> io::Result<bool> {
    let mut v = EthtoolValue {
        cmd: ETHTOOL_GTXCSUM,
        data: 0,
    };
    ethtool(ifname, &mut v)?;
    Ok(v.data != 0)
}

/// `ethtool -K IF tx on|off`.
fn set_tx_csum(ifname: &str, on: bool) -> io::Result<()> {
    let mut v = EthtoolValue {
        cmd: ETHTOOL_STXCSUM,
        data: u32::from(on),
    };
    ethtool(ifname, &mut v)
        .map_err(|e| io::Error::new(e.kind(), format!("ETHTOOL_STXCSUM on {ifname:?}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testnet::{PacketSocket, VethPair, MAC_A, MAC_B};
    use std::time::Duration;
    use wire::vnet::{
        TunnelVnetHdr, VnetHdr, F_NEEDS_CSUM, F_UDP_TUNNEL_CSUM, GSO_TCPV4, GSO_UDP_TUNNEL_IPV6,
    };

    #[test]
    fn tap_names_fit_an_interface_name() {
        assert_eq!(tap_name("eth0", 2), "gso-eth0");
        assert_eq!(tap_name("underlay01", 7), "gso-underlay01");
        assert_eq!(tap_name("enp129s0f0np0", 12), "gso-12");
        assert!(tap_name("enp129s0f0np0", u32::MAX).len() < libc::IFNAMSIZ);
    }

    /// Naive one's-complement sum of big-endian 16-bit words, folded.
    fn sum(data: &[u8]) -> u16 {
        let mut acc: u32 = 0;
        for c in data.chunks(2) {
            acc += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
            acc = (acc & 0xffff) + (acc >> 16);
        }
        acc as u16
    }

    const MSS: usize = 1000;
    const SEGMENTS: usize = 3;
    /// Outer Ethernet + IPv6 + UDP + Geneve, inner Ethernet, IPv4, TCP.
    const INNER_NH: usize = 14 + 40 + 8 + 8 + 14;
    const INNER_TH: usize = INNER_NH + 20;
    const HDRS: usize = INNER_TH + 20;

    /// A super-frame from MAC_A/fd00::a to MAC_B/fd00::b of `SEGMENTS` * `MSS`
    /// payload bytes, seeded as the kernel wants: the inner TCP checksum field
    /// with the pseudo-header sum, and with `outer_csum` the outer UDP checksum
    /// field with the IPv6 pseudo-header sum (32-bit length) and
    /// `F_UDP_TUNNEL_CSUM`; zero without.
    fn super_frame(outer_csum: bool) -> (TunnelVnetHdr, Vec<u8>) {
        let payload: Vec<u8> = (0..SEGMENTS * MSS).map(|i| (i * 7 + 3) as u8).collect();
        let mut f = Vec::new();
        f.extend_from_slice(&MAC_B);
        f.extend_from_slice(&MAC_A);
        f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0]);
        let udp_len = (HDRS - 54 + payload.len()) as u16;
        f.extend_from_slice(&udp_len.to_be_bytes());
        f.extend_from_slice(&[17, 64]);
        f.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x0a]);
        f.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x0b]);
        f.extend_from_slice(&[0x30, 0x39, 0x17, 0xc1]); // 12345 -> 6081
        f.extend_from_slice(&udp_len.to_be_bytes());
        f.extend_from_slice(&[0, 0]);
        f.extend_from_slice(&[0, 0, 0x65, 0x58, 0, 0, 0x0a, 0]); // Geneve, VNI 10
        f.extend_from_slice(&[0xa8, 0x40, 0x25, 0xff, 0, 2, 0xa8, 0x40, 0x25, 0xff, 0, 1]);
        f.extend_from_slice(&[0x08, 0x00]);
        let ip_len = (HDRS - INNER_NH + payload.len()) as u16;
        f.extend_from_slice(&[0x45, 0]);
        f.extend_from_slice(&ip_len.to_be_bytes());
        f.extend_from_slice(&[0, 7, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 5, 10, 0, 0, 6]);
        let c = !sum(&f[INNER_NH..INNER_TH]);
        f[INNER_NH + 10..INNER_NH + 12].copy_from_slice(&c.to_be_bytes());
        f.extend_from_slice(&[0x9c, 0x40, 0x14, 0x51, 0, 0, 0x10, 0, 0, 0, 0, 1]);
        f.extend_from_slice(&[0x50, 0x18, 0xff, 0xff, 0, 0, 0, 0]);
        let tcp_len = (HDRS - INNER_TH + payload.len()) as u16;
        let mut pseudo = f[INNER_NH + 12..INNER_TH].to_vec();
        pseudo.extend_from_slice(&[0, 6]);
        pseudo.extend_from_slice(&tcp_len.to_be_bytes());
        let seed = sum(&pseudo);
        f[INNER_TH + 16..INNER_TH + 18].copy_from_slice(&seed.to_be_bytes());
        f.extend_from_slice(&payload);
        let mut flags = F_NEEDS_CSUM;
        if outer_csum {
            let mut pseudo = f[22..54].to_vec();
            pseudo.extend_from_slice(&u32::from(udp_len).to_be_bytes());
            pseudo.extend_from_slice(&[0, 0, 0, 17]);
            f[60..62].copy_from_slice(&sum(&pseudo).to_be_bytes());
            flags |= F_UDP_TUNNEL_CSUM;
        }
        let hdr = TunnelVnetHdr {
            vnet: VnetHdr {
                flags,
                gso_type: GSO_TCPV4 | GSO_UDP_TUNNEL_IPV6,
                hdr_len: HDRS as u16,
                gso_size: MSS as u16,
                csum_start: INNER_TH as u16,
                csum_offset: 16,
            },
            outer_th: 54,
            inner_nh: INNER_NH as u16,
        };
        (hdr, f)
    }

    /// Checks one wire segment: its length, the outer UDP length and checksum (0,
    /// or valid when `outer_csum`), the inner IPv4 and TCP checksums.
    fn check_segment(seg: &[u8], outer_csum: bool) {
        assert_eq!(seg.len(), HDRS + MSS);
        let udp_len = seg.len() - 54;
        assert_eq!(usize::from(u16::from_be_bytes([seg[58], seg[59]])), udp_len);
        if outer_csum {
            let mut v = seg[22..54].to_vec();
            v.extend_from_slice(&(udp_len as u32).to_be_bytes());
            v.extend_from_slice(&[0, 0, 0, 17]);
            v.extend_from_slice(&seg[54..]);
            assert_eq!(sum(&v), 0xffff, "outer UDP checksum");
        } else {
            assert_eq!(seg[60..62], [0, 0], "outer UDP checksum left zero");
        }
        assert_eq!(sum(&seg[INNER_NH..INNER_TH]), 0xffff, "inner IPv4 checksum");
        let mut v = seg[INNER_NH + 12..INNER_TH].to_vec();
        v.extend_from_slice(&[0, 6]);
        v.extend_from_slice(&((seg.len() - INNER_TH) as u16).to_be_bytes());
        v.extend_from_slice(&seg[INNER_TH..]);
        assert_eq!(sum(&v), 0xffff, "inner TCP checksum");
    }

    /// A super-frame written to va's tunnel tap leaves va as `SEGMENTS` Geneve
    /// frames with complete inner checksums and a continuous sequence space, its
    /// outer UDP checksum zero or, seeded with `F_UDP_TUNNEL_CSUM`, completed (va
    /// is a veth: its checksum offload is turned off); the tap is made up, named
    /// for the link, taken over when left over, and gone once closed.
    #[test]
    fn a_super_frame_leaves_the_link_segmented_and_checksummed() {
        let pair = VethPair::new(9000);
        let tx_csum_va = || pair.a.run(|| tx_csum("va").unwrap());
        assert!(tx_csum_va(), "a veth starts with checksum offload on");
        let mut tap = pair.a.run(|| {
            let va = Netlink::open().unwrap().link_by_name("va").unwrap();
            // A leftover persistent single-queue tap of that name is taken over.
            let leftover = open_tun("gso-va", libc::IFF_TAP | libc::IFF_NO_PI).unwrap();
            // SAFETY: TUNSETPERSIST takes its flag by value.
            let persist = unsafe {
                libc::ioctl(
                    leftover.as_raw_fd(),
                    libc::TUNSETPERSIST,
                    1 as libc::c_ulong,
                )
            };
            assert_eq!(persist, 0, "{}", io::Error::last_os_error());
            drop(leftover);
            TunnelTap::open("va", va.ifindex, 2).expect("tunnel tap")
        });
        assert_eq!(tap.name(), "gso-va");
        assert!(
            !tx_csum_va(),
            "the veth completes checksums while the tap is there"
        );
        let queues = tap.take_queues();
        assert_eq!(queues.len(), 2);
        let up = pair
            .a
            .run(|| Netlink::open().unwrap().link_by_name("gso-va").unwrap().up);
        assert!(up, "tunnel tap up");
        let b = pair.b.name.clone();
        let sock = crate::netns::run_in_netns(&b, || PacketSocket::open("vb"))
            .unwrap()
            .unwrap();
        for outer_csum in [false, true] {
            let (hdr, frame) = super_frame(outer_csum);
            queues[1].write(&hdr.to_bytes(), &frame).expect("write");
            let mut seqs = Vec::new();
            for _ in 0..SEGMENTS {
                let seg = sock
                    .recv_matching(Duration::from_secs(5), |f| {
                        f.len() > HDRS && f[12..14] == [0x86, 0xdd] && f[56..58] == [0x17, 0xc1]
                    })
                    .expect("a segment arrives");
                check_segment(&seg, outer_csum);
                assert_eq!(seg[HDRS..], frame[HDRS + seqs.len() * MSS..][..MSS]);
                seqs.push(u32::from_be_bytes(
                    seg[INNER_TH + 4..INNER_TH + 8].try_into().unwrap(),
                ));
            }
            assert_eq!(seqs, [0x1000, 0x1000 + MSS as u32, 0x1000 + 2 * MSS as u32]);
        }
        assert_eq!(tap.redirect_drops().unwrap(), 0);
        drop(queues);
        // In the namespace of the link, as the daemon runs.
        pair.a.run(move || drop(tap));
        assert!(tx_csum_va(), "the veth's checksum offload is back");
        let gone = pair
            .a
            .run(|| Netlink::open().unwrap().link_by_name("gso-va").map(|_| ()));
        assert_eq!(gone.unwrap_err().kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn a_leftover_persistent_multi_queue_tap_goes_with_the_daemon() {
        let pair = VethPair::new(9000);
        let tap = pair.a.run(|| {
            let va = Netlink::open().unwrap().link_by_name("va").unwrap();
            // Opens with the very flags of a tunnel queue: joined, not refused.
            let flags =
                libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR | libc::IFF_MULTI_QUEUE;
            let leftover = open_tun("gso-va", flags).unwrap();
            // SAFETY: TUNSETPERSIST takes its flag by value.
            let persist = unsafe {
                libc::ioctl(
                    leftover.as_raw_fd(),
                    libc::TUNSETPERSIST,
                    1 as libc::c_ulong,
                )
            };
            assert_eq!(persist, 0);
            drop(leftover);
            TunnelTap::open("va", va.ifindex, 1).expect("tunnel tap")
        });
        pair.a.run(move || drop(tap));
        let gone = pair
            .a
            .run(|| Netlink::open().unwrap().link_by_name("gso-va").map(|_| ()));
        assert_eq!(gone.unwrap_err().kind(), io::ErrorKind::NotFound);
    }
}
