//! testpmd rows: DPDK's testpmd plays both guests ([`crate::testpmd`]), on
//! vhost-user ports of this datapath (`ours-vhost`) or of OVS with DPDK
//! (`ovs-dpdk`, [`super::ovs`]), so the datapaths are compared where a DPDK
//! switch is at its best: guests that are poll-mode drivers themselves, no
//! kernel stack, no tap.
//!
//! One run (a `pmdN[tso]` test): an interactive testpmd in `rxonly` mode on the
//! server's port (sled 1) and one in `txonly` mode on the client's port (sled 0),
//! sending UDP/IPv4 frames of N bytes as fast as it can, one flow, from the
//! client's address to the server's. After the `--omit` warm-up both clear
//! their port statistics, the CPU is sampled, and after `--seconds` both show
//! their statistics and the CPU is sampled again: delivered = the frames the
//! receiving testpmd counted in that window, sent = those the sender's port took
//! (what its ring accepted; a full ring makes txonly drop the rest, uncounted).
//! Gbit/s counts the frames' N bytes (no FCS, preamble or gap). Each testpmd
//! runs its main and forwarding lcores unpinned over the machine's cores: both
//! poll without pause, as a DPDK guest does.

use super::cpu::{Snapshot, Usage, Watched};
use super::iperf::{Figures, Measurement, Test, Timing, Traffic, UdpFigures};
use super::process::tail;
use super::setup::{
    client_spec, daemons, diagnostics, quiet_logs, rack_with_daemons, server_spec, Guests, Topology,
};
use crate::guest::{GuestSpec, GATEWAY_MAC};
use crate::rack::Rack;
use crate::testpmd::{port_stat, txonly_args, Spec, Testpmd};
use crate::vm::vhost_user_port;
use crate::{Error, Result};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::thread;
use std::time::Duration;

/// How long the first frames may take to arrive.
const DELIVERING: Duration = Duration::from_secs(20);

/// The UDP ports (source and destination) of testpmd's frames.
const UDP_PORT: u16 = 7009;

/// What a guest with offloads asks for: receive TCP_LRO and TCP_CKSUM (it acks
/// GUEST_TSO4/6 and GUEST_CSUM), transmit UDP_CKSUM and TCP_CKSUM (CSUM). Not
/// transmit TSO: OVS offers no HOST_TSO4/6 on a `dpdkvhostuser` port (it turns
/// host segmentation off for want of external buffers), so a testpmd asking for
/// it cannot start there.
const OFFLOADS: [&str; 2] = ["--rx-offloads=0x18", "--tx-offloads=0xc"];

/// One testpmd guest's port.
#[derive(Clone, Debug)]
pub struct PmdPort {
    /// The vhost-user socket; the back end is its server.
    pub socket: PathBuf,
    pub mac: String,
    pub ipv4: Ipv4Addr,
}

impl PmdPort {
    /// The port of guest `spec` at `socket`.
    pub fn of(spec: &GuestSpec, socket: PathBuf) -> Result<PmdPort> {
        let ipv4 = spec
            .ipv4
            .ok_or_else(|| Error::new(format!("guest {} has no IPv4 address", spec.name)))?;
        Ok(PmdPort {
            socket,
            mac: spec.mac.clone(),
            ipv4,
        })
    }
}

/// The two ports a testpmd run uses.
#[derive(Clone, Debug)]
pub struct PmdPorts {
    /// The sender's (sled 0).
    pub tx: PmdPort,
    /// The receiver's (sled 1).
    pub rx: PmdPort,
    /// The destination MAC of the sender's frames: the virtual gateway where the
    /// datapath routes, the receiver's MAC where it bridges.
    pub next_hop: String,
    /// Starts testpmd's DPDK file prefixes (the rack's id: the run's prefix).
    name: String,
    /// For testpmd's logs.
    dir: PathBuf,
}

impl PmdPorts {
    pub fn new(rack: &Rack, tx: PmdPort, rx: PmdPort, next_hop: String) -> PmdPorts {
        PmdPorts {
            tx,
            rx,
            next_hop,
            name: format!("{}-pmd", rack.id),
            dir: rack.dir().to_path_buf(),
        }
    }
}

/// This datapath with default flags, the client's and the server's ports
/// vhost-user ports (the daemon the socket's server), V2P published.
pub struct OursVhost {
    ports: PmdPorts,
    rack: Rack,
}

impl OursVhost {
    pub fn build(prefix: &str, mtu: u16) -> Result<OursVhost> {
        let mut rack = rack_with_daemons(prefix, &[])?;
        let mut ports = Vec::new();
        for spec in [client_spec(mtu), server_spec(mtu)] {
            let socket = vhost_user_port(rack.sled(spec.sled)?, &spec)?;
            rack.publish_v2p_of(&spec)?;
            ports.push(PmdPort::of(&spec, socket)?);
        }
        quiet_logs(&mut rack)?;
        let [tx, rx] = pair(ports)?;
        let ports = PmdPorts::new(&rack, tx, rx, GATEWAY_MAC.to_string());
        Ok(OursVhost { ports, rack })
    }
}

impl Topology for OursVhost {
    fn guests(&self) -> Guests<'_> {
        Guests::Testpmd(&self.ports)
    }

    fn daemons(&self) -> Vec<Watched> {
        daemons(&self.rack)
    }

    fn diagnostics(&self) -> String {
        diagnostics(&self.rack)
    }
}

/// The sender's and the receiver's port, in that order.
pub fn pair(ports: Vec<PmdPort>) -> Result<[PmdPort; 2]> {
    let n = ports.len();
    ports
        .try_into()
        .map_err(|_| Error::new(format!("{n} testpmd ports where two were made")))
}

/// EAL's core options of each testpmd: its two lcores free to run on any core.
fn cores() -> [String; 2] {
    let last = std::thread::available_parallelism().map_or(1, usize::from) - 1;
    ["--lcores".to_string(), format!("(0,1)@(0-{last})")]
}

/// Runs testpmd test `test` between `ports` of `topo` (see the module docs).
pub fn measure(
    ports: &PmdPorts,
    topo: &dyn Topology,
    test: Test,
    timing: Timing,
    hz: f64,
) -> Result<Measurement> {
    let Traffic::Pmd { frame, offloads } = test.traffic else {
        return Err(Error::new(format!("{test} is not a testpmd test")));
    };
    let cores = cores();
    let cores: Vec<&str> = cores.iter().map(String::as_str).collect();
    let start = |role: &str, port: &PmdPort, app: Vec<String>| {
        let mut app: Vec<&str> = app.iter().map(String::as_str).collect();
        if offloads {
            app.extend(OFFLOADS);
        }
        let spec = Spec {
            file_prefix: format!("{}-{role}", ports.name),
            socket: &port.socket,
            mac: &port.mac,
            cores: &cores,
            pcap: None,
            interactive: true,
        };
        Testpmd::start(&ports.dir, &spec, &app)
            .map_err(|e| e.context(format!("starting the {role} testpmd")))
    };
    let mut rx = start("rx", &ports.rx, vec!["--forward-mode=rxonly".into()])?;
    let (src, dst) = (ports.tx.ipv4, ports.rx.ipv4);
    let txonly = txonly_args(frame, &ports.next_hop, src, dst, UDP_PORT);
    let mut tx = start("tx", &ports.tx, txonly)?;
    wait_delivering(&mut rx)?;
    let watched = topo.daemons();
    thread::sleep(Duration::from_secs(u64::from(timing.omit)));
    tx.command("clear port stats all")?;
    rx.command("clear port stats all")?;
    let before = Snapshot::take(&watched)?;
    thread::sleep(Duration::from_secs(u64::from(timing.seconds)));
    rx.command("show port stats all")?;
    tx.command("show port stats all")?;
    let after = Snapshot::take(&watched)?;
    let (rx_out, tx_out) = (rx.stop()?, tx.stop()?);
    let count = |out: &str, field: &str, role: &str| {
        port_stat(out, field).ok_or_else(|| {
            Error::new(format!(
                "no port statistics in the {role} testpmd's output:\n{}",
                tail(out)
            ))
        })
    };
    let received = count(&rx_out, "RX-packets", "rx")?;
    let sent = count(&tx_out, "TX-packets", "tx")?;
    let cpu = Usage::between(&before, &after, hz);
    if received == 0 {
        return Err(Error::new(format!(
            "nothing delivered ({sent} frames sent in the window); the rx testpmd's output:\n{}",
            tail(&rx_out)
        )));
    }
    Ok(Measurement {
        figures: figures(frame, sent, received, cpu.seconds),
        cpu,
    })
}

/// Waits until the receiving testpmd has counted frames: a back end may take a
/// moment after the front ends started to serve their rings (OVS hands a new
/// vhost-user device to its PMD thread), and that moment is no warm-up.
fn wait_delivering(rx: &mut Testpmd) -> Result<()> {
    crate::poll_until("the rx testpmd to receive", DELIVERING, || {
        rx.command("show port stats all")?;
        thread::sleep(Duration::from_millis(100));
        match port_stat(&rx.output()?, "RX-packets") {
            Some(n) if n > 0 => Ok(()),
            n => Err(Error::new(format!("RX-packets {n:?}"))),
        }
    })
}

/// The figures of `received` of `sent` frames of `frame` bytes in `seconds`.
fn figures(frame: u16, sent: u64, received: u64, seconds: f64) -> Figures {
    let seconds = seconds.max(1e-9);
    let delivered_pps = received as f64 / seconds;
    Figures {
        gbps: delivered_pps * f64::from(frame) * 8.0 / 1e9,
        retransmits: None,
        udp: Some(UdpFigures {
            sent_pps: sent as f64 / seconds,
            delivered_pps,
            loss_percent: UdpFigures::loss_percent(sent as f64, received as f64),
        }),
        latency: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_count_delivered_frames_and_their_bytes() {
        let f = figures(1500, 2_000_000, 1_000_000, 2.0);
        assert_eq!(f.gbps, 500_000.0 * 1500.0 * 8.0 / 1e9);
        let u = f.udp.unwrap();
        assert_eq!((u.sent_pps, u.delivered_pps), (1e6, 5e5));
        assert_eq!(u.loss_percent, 50.0);
        assert_eq!(figures(64, 0, 5, 1.0).udp.unwrap().loss_percent, 0.0);
    }

    #[test]
    fn testpmd_lcores_float_over_every_core() {
        let [flag, map] = cores();
        assert_eq!(flag, "--lcores");
        assert!(map.starts_with("(0,1)@(0-"), "{map}");
    }
}
