//! VM rows (`--vm`): this datapath with a real VM ([`crate::vm`]) as the client
//! guest on sled 0, attached to its port one way or another, and a namespace guest
//! as the server on sled 1.
//!
//! The guest image is busybox only, so the VM cannot run iperf3: it streams zeros
//! with `dd | nc`, and a receiver in the server's namespace counts what arrives
//! over the same window iperf3 would measure (`--omit` warm-up seconds left out,
//! then `--seconds`), CPU sampled at the window's ends, QEMU watched as a process
//! so its cost shows. The VM's CPU may be emulated (TCG where KVM does not work),
//! so absolute figures say little; the report gives each VM row as a ratio to the
//! first attachment way of the same run ([`crate::bench::report`]).

use super::cpu::{Snapshot, Usage, Watched, VM_LABEL};
use super::iperf::{Figures, Measurement, Test, Timing};
use super::setup::{
    client_spec, daemons, diagnostics, quiet_logs, rack_with_daemons, server_addr, server_spec,
    Guests, Topology,
};
use crate::netns::Netns;
use crate::poll::poll_until;
use crate::rack::Rack;
use crate::vm::{Vm, VmSpec, Way, FRAGMENTATION_COUNTERS};
use crate::xfer::{accept_within, any_addr};
use crate::{Error, Result};
use std::cell::RefCell;
use std::io::Read;
use std::net::{IpAddr, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

/// How long one command in the VM may take (TCG on a loaded, shared machine).
pub const VM_COMMAND: Duration = Duration::from_secs(60);

/// The receiver's port in the server guest.
const PORT: u16 = 5202;

/// `dd`'s block size in the VM: large writes, so the stream costs busybox little.
const BLOCK: u32 = 256 * 1024;

/// How long the receiver waits for the VM's connection, and for any data once
/// connected, before it gives up.
const CONNECT_WAIT: Duration = Duration::from_secs(30);
const STALL: Duration = Duration::from_secs(20);

/// The guest's memory: the initramfs and a socket's buffers.
const MEMORY_MIB: u32 = 256;

/// A VM on sled 0 and a namespace guest on sled 1 of the harness's rack.
pub struct VmPair {
    /// Dropped first: QEMU holds the tap the rack's port is bridged to.
    vm: RefCell<Vm>,
    rack: Rack,
}

impl VmPair {
    /// Builds the rack, the server guest, the VM's port and the VM at guest MTU
    /// `mtu`, and waits for the router advertisement to have raised the VM's IPv6
    /// MTU to `mtu` (it starts at 1280).
    pub fn build(prefix: &str, mtu: u16, way: Way) -> Result<VmPair> {
        let mut rack = rack_with_daemons(prefix, &[])?;
        rack.add_guest(server_spec(mtu))?;
        let spec = client_spec(mtu);
        let attach = way.port(rack.sled(0)?, &spec)?;
        rack.publish_v2p()?;
        rack.publish_v2p_of(&spec)?;
        quiet_logs(&mut rack)?;
        let vm_spec = VmSpec {
            name: spec.name.clone(),
            mac: spec.mac.clone(),
            host_mtu: mtu,
            ipv6: spec.ipv6,
            memory_mib: MEMORY_MIB,
        };
        let mut vm = Vm::boot(&rack.sled(0)?.ns, vm_spec, &attach, rack.dir())?;
        println!(
            "  {}: VM booted under {:?} in {:.1?}",
            way.name(),
            vm.accel,
            vm.boot_time
        );
        poll_until("the RA's MTU in the VM", VM_COMMAND, || {
            match vm.read_number("/proc/sys/net/ipv6/conf/eth0/mtu")? {
                m if m == u64::from(mtu) => Ok(()),
                m => Err(Error::new(format!("IPv6 MTU {m}"))),
            }
        })?;
        Ok(VmPair {
            vm: RefCell::new(vm),
            rack,
        })
    }
}

impl Topology for VmPair {
    fn guests(&self) -> Guests<'_> {
        Guests::Vm {
            client: &self.vm,
            server: &self.rack.guests[0].ns,
        }
    }

    /// The daemons and QEMU: under TCG, QEMU is where the VM's own sending costs.
    fn daemons(&self) -> Vec<Watched> {
        let mut watched = daemons(&self.rack);
        watched.push(Watched {
            label: VM_LABEL.to_string(),
            pid: self.vm.borrow().pid(),
        });
        watched
    }

    fn diagnostics(&self) -> String {
        let vm = self.vm.borrow();
        let console = std::fs::read_to_string(vm.console_log()).unwrap_or_default();
        format!(
            "{}\nVM console ({}), last lines:\n{}",
            diagnostics(&self.rack),
            vm.console_log().display(),
            super::process::tail(&console)
        )
    }
}

/// The VM's kernel fragmented nothing and reassembled nothing: busybox ping cannot
/// forbid fragmentation, so this is how a full-size ping proves the path's MTU.
pub fn require_unfragmented(vm: &mut Vm) -> Result<()> {
    let snmp = vm.snmp()?;
    for counter in FRAGMENTATION_COUNTERS {
        match snmp.get(counter) {
            Some(0) => {}
            Some(n) => {
                return Err(Error::new(format!(
                    "the VM's {counter} is {n}: a full-size ping was fragmented"
                )))
            }
            None => return Err(Error::new(format!("no {counter} in the VM's counters"))),
        }
    }
    Ok(())
}

/// Runs VM test `test` on `topo` (whose client is `vm`): the receiver listens in
/// the server guest `server`, the VM streams to it until the receiver has its
/// window and closes the connection (the VM's `nc` then fails on its next write,
/// as meant).
pub fn measure(
    (vm, server): (&RefCell<Vm>, &Netns),
    topo: &dyn Topology,
    test: Test,
    timing: Timing,
    hz: f64,
) -> Result<Measurement> {
    let target = server_addr(test.family);
    let listener = server.within(|| Ok(TcpListener::bind(any_addr(target, PORT))?))?;
    let watched = topo.daemons();
    let command = stream_command(target);
    let whole = Duration::from_secs(u64::from(timing.omit + timing.seconds));
    let (sent, received) = thread::scope(|s| {
        let receiver = s.spawn(|| receive(&listener, timing, &watched, hz));
        let sent = vm
            .borrow_mut()
            .output(&command, whole + CONNECT_WAIT + VM_COMMAND);
        let received = receiver
            .join()
            .unwrap_or_else(|_| Err(Error::new("the receiving thread panicked")));
        (sent, received)
    });
    // The VM's status is not a verdict (its nc ends on the closed connection),
    // but its output says why no connection came.
    let (bytes, cpu) = received.map_err(|e| match &sent {
        Ok((status, out)) => e.context(format!(
            "`{command}` in the VM exited {status}: {}",
            out.trim()
        )),
        Err(sent) => e.context(sent.to_string()),
    })?;
    sent?;
    Ok(Measurement {
        figures: Figures {
            gbps: bytes as f64 * 8.0 / cpu.seconds.max(1e-9) / 1e9,
            retransmits: None,
            udp: None,
            latency: None,
        },
        cpu,
    })
}

/// The VM's side: zeros to the receiver, until the connection closes.
fn stream_command(target: IpAddr) -> String {
    format!("dd if=/dev/zero bs={BLOCK} 2>/dev/null | nc {target} {PORT}")
}

/// Accepts the VM's connection, discards the warm-up seconds, then counts the
/// bytes of the measured seconds between two CPU snapshots. Returns the bytes and
/// the CPU use of that window.
fn receive(
    listener: &TcpListener,
    timing: Timing,
    watched: &[Watched],
    hz: f64,
) -> Result<(u64, Usage)> {
    let mut stream = accept_within(listener, CONNECT_WAIT)
        .map_err(|e| e.context("waiting for the VM's stream"))?;
    stream.set_read_timeout(Some(STALL))?;
    let mut buf = vec![0u8; 1 << 20];
    let warm_up = Duration::from_secs(u64::from(timing.omit));
    drain_until(&mut stream, &mut buf, Instant::now() + warm_up)
        .map_err(|e| e.context("warm-up"))?;
    let before = Snapshot::take(watched)?;
    let seconds = Duration::from_secs(u64::from(timing.seconds));
    let bytes = drain_until(&mut stream, &mut buf, Instant::now() + seconds)?;
    let after = Snapshot::take(watched)?;
    Ok((bytes, Usage::between(&before, &after, hz)))
}

/// Reads and counts until `until`; the stream ending early is an error.
fn drain_until(stream: &mut TcpStream, buf: &mut [u8], until: Instant) -> Result<u64> {
    let mut bytes = 0u64;
    while Instant::now() < until {
        match stream.read(buf) {
            Ok(0) => {
                return Err(Error::new(format!(
                    "the VM's stream ended early, after {bytes} bytes"
                )))
            }
            Ok(n) => bytes += n as u64,
            Err(e) => {
                return Err(Error::new(format!(
                    "receiving the VM's stream, after {bytes} bytes: {e}"
                )))
            }
        }
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::Ipv6Addr;

    #[test]
    fn ways_are_named_vm_and_unique() {
        let setups = super::super::setup::Setup::vms();
        let names: Vec<&str> = setups.iter().map(|s| s.name.as_str()).collect();
        assert!(names.iter().all(|n| n.starts_with("vm-")), "{names:?}");
        let mut unique = names.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "{names:?}");
    }

    #[test]
    fn the_vm_streams_to_the_servers_address_and_port() {
        assert_eq!(
            stream_command(Ipv6Addr::LOCALHOST.into()),
            format!("dd if=/dev/zero bs=262144 2>/dev/null | nc ::1 {PORT}")
        );
    }

    #[test]
    fn the_receiver_counts_and_a_short_stream_fails() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut tx = TcpStream::connect(addr).unwrap();
        let mut rx = accept_within(&listener, CONNECT_WAIT).unwrap();
        tx.write_all(&[0u8; 1000]).unwrap();
        drop(tx);
        let mut buf = [0u8; 64];
        let e = drain_until(&mut rx, &mut buf, Instant::now() + STALL).unwrap_err();
        assert!(e.0.contains("after 1000 bytes"), "{e}");
        assert_eq!(
            drain_until(&mut rx, &mut buf, Instant::now()).unwrap(),
            0,
            "an empty window counts nothing"
        );
    }
}
