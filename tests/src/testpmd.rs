//! DPDK's `dpdk-testpmd` as a vhost-user guest without a VM: a `net_virtio_user`
//! device connects to a vhost-user socket as a VM's virtio-net driver would (its
//! memory is not hugepages: `--no-huge` backs it with a memfd it can share with
//! the back end). Used by tests/tests/testpmd.rs (what a DPDK guest receives) and
//! by the benchmark's testpmd rows (`e2e::bench::pmd`: packet rates between two
//! such guests).

use crate::cmd::on_path;
use crate::{Cmd, Error, Result};
use std::fs::File;
use std::io::Write;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Stdio};
use std::time::{Duration, Instant};

/// The application arguments of a sending testpmd: one UDP/IPv4 flow of
/// `frame_len`-byte frames from `src` to `dst`, both ports `udp_port`, to the
/// Ethernet address `next_hop` (`--forward-mode=txonly`).
pub fn txonly_args(
    frame_len: u16,
    next_hop: &dyn std::fmt::Display,
    src: Ipv4Addr,
    dst: Ipv4Addr,
    udp_port: u16,
) -> Vec<String> {
    vec![
        "--forward-mode=txonly".into(),
        format!("--txpkts={frame_len}"),
        format!("--eth-peer=0,{next_hop}"),
        format!("--tx-ip={src},{dst}"),
        format!("--tx-udp={udp_port},{udp_port}"),
    ]
}

/// The program (Debian package `dpdk-dev`).
pub const TESTPMD: &str = "dpdk-testpmd";

/// Where a DPDK process run as root keeps its runtime files, in a directory named
/// after its `--file-prefix` that outlives the process.
const RUNTIME_ROOT: &str = "/var/run/dpdk";

/// How long testpmd may take to start forwarding, and to stop.
const START: Duration = Duration::from_secs(20);
const STOP: Duration = Duration::from_secs(10);

/// A DPDK process's runtime directory (`/var/run/dpdk/PREFIX`), removed on drop:
/// DPDK leaves it behind when the process exits.
#[derive(Debug)]
pub struct RuntimeDir {
    path: PathBuf,
}

impl RuntimeDir {
    /// The directory of a process started with `--file-prefix file_prefix`.
    pub fn new(file_prefix: &str) -> RuntimeDir {
        RuntimeDir {
            path: Path::new(RUNTIME_ROOT).join(file_prefix),
        }
    }
}

impl Drop for RuntimeDir {
    fn drop(&mut self) {
        match std::fs::remove_dir_all(&self.path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                eprintln!("removing {}: {e}", self.path.display());
            }
            _ => {}
        }
    }
}

/// How to start one testpmd.
pub struct Spec<'a> {
    /// DPDK's `--file-prefix`, unique among the DPDK processes running at once;
    /// also names the log (`testpmd-PREFIX.log`).
    pub file_prefix: String,
    /// The vhost-user socket (the back end is its server).
    pub socket: &'a Path,
    /// The virtio device's MAC: the port's guest MAC.
    pub mac: &'a str,
    /// EAL's core options, e.g. `-l 0,1` (the first lcore is the main one, the
    /// next forwards).
    pub cores: &'a [&'a str],
    /// A second port (`net_pcap`) writing what it is sent to this file.
    pub pcap: Option<&'a Path>,
    /// Driven by commands on stdin ([`Testpmd::command`]), forwarding from the
    /// start; else it prints its statistics every second.
    pub interactive: bool,
}

/// One running testpmd, killed on drop.
pub struct Testpmd {
    child: Child,
    stdin: Option<ChildStdin>,
    out: PathBuf,
    /// Dropped after the process is reaped.
    _runtime: RuntimeDir,
}

impl Testpmd {
    /// Starts testpmd as `spec` says with the application arguments `app`, its
    /// output in `dir`, and waits until it forwards (its ports started, so its
    /// receive buffers are posted).
    pub fn start(dir: &Path, spec: &Spec, app: &[&str]) -> Result<Testpmd> {
        if !on_path(TESTPMD) {
            return Err(Error::new(format!(
                "{TESTPMD} is not on PATH (Debian package dpdk-dev, scripts/install-deps.sh)"
            )));
        }
        let out = dir.join(format!("testpmd-{}.log", spec.file_prefix));
        let log = File::create(&out)?;
        // Line-buffered: the readiness lines must reach the log when printed.
        let mut cmd = Cmd::new("stdbuf")
            .args(["-oL", TESTPMD, "--no-huge", "-m", "256", "--no-pci"])
            .args(spec.cores.iter().copied())
            .args(["--log-level", "lib.eal:error", "--file-prefix"])
            .arg(&spec.file_prefix)
            .arg("--vdev")
            .arg(format!(
                "net_virtio_user0,path={},queues=1,mac={}",
                spec.socket.display(),
                spec.mac
            ));
        if let Some(p) = spec.pcap {
            cmd = cmd
                .arg("--vdev")
                .arg(format!("net_pcap0,tx_pcap={}", p.display()));
        }
        cmd = cmd.args(["--", "--total-num-mbufs=8192"]);
        cmd = if spec.interactive {
            cmd.args(["-i", "--auto-start"])
        } else {
            cmd.arg("--stats-period=1")
        };
        let stdin = if spec.interactive {
            Stdio::piped()
        } else {
            Stdio::null()
        };
        let mut child = cmd
            .args(app.iter().copied())
            .die_with_parent()
            .spawn_with_stdin(stdin, Stdio::from(log.try_clone()?), Stdio::from(log))?;
        let mut pmd = Testpmd {
            stdin: child.stdin.take(),
            child,
            out,
            _runtime: RuntimeDir::new(&spec.file_prefix),
        };
        pmd.wait_forwarding(spec.interactive)?;
        Ok(pmd)
    }

    /// Waits until testpmd says it forwards and, unless interactive, has printed
    /// its statistics once.
    fn wait_forwarding(&mut self, interactive: bool) -> Result<()> {
        crate::poll_until("testpmd to forward", START, || {
            let out = std::fs::read_to_string(&self.out)?;
            if let Some(status) = self.child.try_wait()? {
                return Err(Error::new(format!("testpmd exited ({status}):\n{out}")));
            }
            match out.contains("packet forwarding - ports=")
                && (interactive || out.contains("Port statistics"))
            {
                true => Ok(()),
                false => Err(Error::new(out)),
            }
        })
    }

    /// Sends one command line to an interactive testpmd.
    pub fn command(&mut self, line: &str) -> Result<()> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| Error::new("testpmd was not started interactive"))?;
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .and_then(|()| stdin.flush())
            .map_err(|e| Error::new(format!("testpmd command {line:?}: {e}")))
    }

    /// Everything testpmd printed so far.
    pub fn output(&self) -> Result<String> {
        Ok(std::fs::read_to_string(&self.out)?)
    }

    /// Stops it (`quit`, or SIGINT when not interactive: either way it prints its
    /// totals and closes its ports) and returns its output.
    pub fn stop(mut self) -> Result<String> {
        if self.stdin.is_some() {
            self.command("quit")?;
        } else {
            Cmd::new("kill")
                .args(["-INT", &self.child.id().to_string()])
                .run()?;
        }
        let end = Instant::now() + STOP;
        while self.child.try_wait()?.is_none() {
            if Instant::now() > end {
                return Err(Error::new(format!(
                    "testpmd did not stop within {STOP:?}; log {}",
                    self.out.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.output()
    }
}

impl Drop for Testpmd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The total of `field` (`TX-packets`, `RX-packets`) in testpmd's last
/// "Accumulated forward statistics" block.
pub fn accumulated(out: &str, field: &str) -> Option<u64> {
    field_after(out, "Accumulated forward statistics", field)
}

/// `field` (`RX-packets`, `TX-packets`) of port 0 in the last `show port stats`
/// output: what the port counted since its statistics were last cleared.
pub fn port_stat(out: &str, field: &str) -> Option<u64> {
    field_after(out, "NIC statistics for port 0 ", field)
}

/// The number after `field:` following the last `heading` in `out`.
fn field_after(out: &str, heading: &str, field: &str) -> Option<u64> {
    let block = &out[out.rfind(heading)?..];
    let at = block.find(&format!("{field}:"))? + field.len() + 1;
    block[at..].split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statistics_are_read_from_the_last_block() {
        let out = "\
  ######################## NIC statistics for port 0  ########################
  RX-packets: 5          RX-missed: 0          RX-bytes:  320
  TX-packets: 11872      TX-errors: 0          TX-bytes:  759808
  ############################################################################
  NIC statistics for port 0 cleared
  ######################## NIC statistics for port 0  ########################
  RX-packets: 7          RX-missed: 0          RX-bytes:  448
  TX-packets: 38912      TX-errors: 0          TX-bytes:  2490368
  ############################################################################
  +++++++++++++++ Accumulated forward statistics for all ports+++++++++++++++
  RX-packets: 0              RX-dropped: 0             RX-total: 0
  TX-packets: 718528         TX-dropped: 10759008      TX-total: 11477536
";
        assert_eq!(port_stat(out, "RX-packets"), Some(7));
        assert_eq!(port_stat(out, "TX-packets"), Some(38912));
        assert_eq!(accumulated(out, "TX-packets"), Some(718528));
        assert_eq!(port_stat("nothing", "RX-packets"), None);
    }
}
