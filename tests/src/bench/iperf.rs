//! One measured run between namespace guests: a server in the server guest, a
//! client in the client guest, and CPU snapshots around the middle of the run.
//! The tool is iperf3 (`--json`) for the throughput tests and sockperf's UDP
//! ping-pong ([`super::sockperf`]) for the latency tests; both runs have the
//! same shape.
//!
//! The client runs warm-up seconds that the tool leaves out of its figures
//! (iperf3: `--omit`, for TCP slow start and the first flow set-up; sockperf: its
//! own [`sockperf::WARM_UP`]), then the measured seconds (sockperf's a little
//! fewer than `--seconds`, [`sockperf::measured`]). The CPU window is the
//! measured seconds less a small margin at each end, so the throughput (or
//! latency) and the CPU figures describe the same steady state.

use super::cpu::{Snapshot, Usage, Watched};
use super::process::{tail, Background};
use super::setup::{server_addr, Topology};
use super::sockperf::{self, Latency};
use crate::cmd::{Cmd, Outcome};
use crate::netns::Netns;
use crate::poll::poll_until;
use crate::{Error, Result};
use serde_json::Value;
use std::fmt;
use std::path::Path;
use std::thread::{self, ScopedJoinHandle};
use std::time::{Duration, Instant};

/// The iperf3 port (control and data); one run at a time, so one port.
const PORT: &str = "5201";

/// Where the CPU window starts after the warm-up: past the exchanges that precede
/// the tool's own timer (iperf3's control connection, sockperf's warm-up messages).
const WINDOW_LEAD: Duration = Duration::from_millis(200);
/// Where it ends before the run's end: before the client stops sending.
const WINDOW_TAIL: Duration = Duration::from_millis(100);

/// Datagram size of the small-packet test (a per-packet cost test) and message
/// size of the latency test.
pub const UDP_PAYLOAD: u32 = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Family {
    V4,
    V6,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Traffic {
    /// Bulk TCP with this many parallel streams (`-P`).
    Tcp { streams: u8 },
    /// UDP datagrams of [`UDP_PAYLOAD`] bytes, unlimited rate (`-u -l 64 -b 0`).
    Udp64,
    /// UDP messages of [`UDP_PAYLOAD`] bytes in ping-pong, one in flight at a time
    /// (sockperf): round-trip latency.
    Lat64,
    /// UDP/IPv4 frames of `frame` bytes (no FCS) from one testpmd guest to another,
    /// as fast as the sender can (`txonly` to `rxonly`, [`crate::bench::pmd`]);
    /// `offloads`: both guests ack checksum and TSO offloads (id suffix `tso`).
    Pmd { frame: u16, offloads: bool },
}

/// What plays the guests of a test, and so which setups run it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuestKind {
    /// Namespaces with a kernel stack: iperf3 and sockperf.
    Netns,
    /// A QEMU VM as the client ([`crate::bench::vm`]).
    Vm,
    /// testpmd on vhost-user ports ([`crate::bench::pmd`]).
    Testpmd,
}

/// The frame sizes testpmd sends: one mbuf (2048 bytes) holds the frame, and its
/// UDP/IPv4 headers need 42 bytes.
const PMD_FRAMES: std::ops::RangeInclusive<u16> = 64..=1514;

/// What one run measures; the guest MTU decides which topology it runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Test {
    pub mtu: u16,
    pub traffic: Traffic,
    pub family: Family,
    /// Sent by a VM with busybox `nc` (one TCP stream; id prefix `vm-`), measured
    /// by [`crate::bench::vm`] on the VM setups only; else iperf3 or sockperf
    /// between guest namespaces on every other setup.
    pub from_vm: bool,
}

/// The guest MTUs the tests use: the datapath's jumbo port MTU and Ethernet's.
pub const GUEST_MTUS: [u16; 2] = [8500, 1500];

impl Test {
    /// Every TCP test (1 and 4 streams, IPv4 and IPv6, both guest MTUs), then the
    /// small-UDP test over both families and the latency test over IPv4 (all
    /// sockperf 3.7 speaks) at MTU 8500 (their packets are the same at either MTU,
    /// so once is enough), then testpmd's.
    pub fn default_list() -> Vec<Test> {
        let mut tests = Vec::new();
        for mtu in GUEST_MTUS {
            for streams in [1, 4] {
                for family in [Family::V4, Family::V6] {
                    tests.push(Test {
                        mtu,
                        traffic: Traffic::Tcp { streams },
                        family,
                        from_vm: false,
                    });
                }
            }
        }
        for family in [Family::V4, Family::V6] {
            tests.push(Test {
                mtu: GUEST_MTUS[0],
                traffic: Traffic::Udp64,
                family,
                from_vm: false,
            });
        }
        tests.push(Test::latency());
        for offloads in [false, true] {
            for frame in [64, 1500] {
                tests.push(Test::pmd(frame, offloads));
            }
        }
        tests
    }

    /// A testpmd test: IPv4 (testpmd's `txonly` sends nothing else) between ports
    /// at MTU 1500, a DPDK guest's default.
    fn pmd(frame: u16, offloads: bool) -> Test {
        Test {
            mtu: GUEST_MTUS[1],
            traffic: Traffic::Pmd { frame, offloads },
            family: Family::V4,
            from_vm: false,
        }
    }

    /// The latency test: 64-byte ping-pong over IPv4 between guests at MTU 8500.
    fn latency() -> Test {
        Test {
            mtu: GUEST_MTUS[0],
            traffic: Traffic::Lat64,
            family: Family::V4,
            from_vm: false,
        }
    }

    /// Which guests run this test.
    pub fn guest_kind(&self) -> GuestKind {
        match self.traffic {
            _ if self.from_vm => GuestKind::Vm,
            Traffic::Pmd { .. } => GuestKind::Testpmd,
            _ => GuestKind::Netns,
        }
    }

    /// The VM setups' tests: one TCP stream from the VM over each family at the
    /// jumbo guest MTU (`vm-tcp1-v4-8500`, `vm-tcp1-v6-8500`).
    pub fn vm_list() -> Vec<Test> {
        [Family::V4, Family::V6]
            .map(|family| Test {
                mtu: GUEST_MTUS[0],
                traffic: Traffic::Tcp { streams: 1 },
                family,
                from_vm: true,
            })
            .to_vec()
    }

    /// The smoke test's: one TCP stream over IPv6 and small UDP over IPv6, MTU
    /// 8500, the latency test; testpmd's 64-byte frames without offloads and
    /// 1500-byte frames with.
    pub fn smoke_list() -> Vec<Test> {
        let test = |traffic| Test {
            mtu: GUEST_MTUS[0],
            traffic,
            family: Family::V6,
            from_vm: false,
        };
        vec![
            test(Traffic::Tcp { streams: 1 }),
            test(Traffic::Udp64),
            Test::latency(),
            Test::pmd(64, false),
            Test::pmd(1500, true),
        ]
    }

    /// Parses an id as printed by `Display`: `tcp1-v6-8500`, `udp64-v4-1500`,
    /// `lat64-v4-8500`, `vm-tcp1-v4-8500`, `pmd64-v4-1500`, `pmd1500tso-v4-1500`.
    pub fn parse(id: &str) -> Result<Test> {
        let bad = |why: &str| {
            Error::new(format!(
                "invalid test {id:?}: {why} (expected e.g. tcp1-v6-8500, udp64-v4-8500, \
                 lat64-v4-8500, vm-tcp1-v4-8500 or pmd64-v4-1500)"
            ))
        };
        let (from_vm, rest) = match id.strip_prefix("vm-") {
            Some(rest) => (true, rest),
            None => (false, id),
        };
        let [traffic, family, mtu] = rest.split('-').collect::<Vec<_>>()[..] else {
            return Err(bad("not three parts joined by '-'"));
        };
        let traffic = match traffic {
            "udp64" => Traffic::Udp64,
            "lat64" => Traffic::Lat64,
            t if t.starts_with("pmd") => pmd_traffic(t).ok_or_else(|| {
                bad(&format!(
                    "{t:?} is not pmdN or pmdNtso with a frame size N in {}..={}",
                    PMD_FRAMES.start(),
                    PMD_FRAMES.end()
                ))
            })?,
            t => match t.strip_prefix("tcp").map(str::parse::<u8>) {
                Some(Ok(streams)) if streams > 0 => Traffic::Tcp { streams },
                _ => return Err(bad(&format!("unknown traffic {t:?}"))),
            },
        };
        let family = match family {
            "v4" => Family::V4,
            "v6" => Family::V6,
            f => return Err(bad(&format!("unknown family {f:?}"))),
        };
        let mtu = mtu
            .parse::<u16>()
            .ok()
            .filter(|m| (1280..=8500).contains(m))
            .ok_or_else(|| bad(&format!("guest MTU {mtu:?} is not in 1280..=8500")))?;
        if from_vm && traffic != (Traffic::Tcp { streams: 1 }) {
            return Err(bad("a VM sends one TCP stream only (busybox nc): vm-tcp1"));
        }
        if traffic == Traffic::Lat64 && family != Family::V4 {
            return Err(bad(
                "sockperf 3.7 (Debian 12's) takes IPv4 addresses only: -v4-",
            ));
        }
        if let Traffic::Pmd { frame, .. } = traffic {
            if family != Family::V4 {
                return Err(bad("testpmd sends UDP over IPv4 only: -v4-"));
            }
            if usize::from(frame) > usize::from(mtu) + 14 {
                return Err(bad(&format!(
                    "a {frame}-byte frame exceeds guest MTU {mtu}"
                )));
            }
        }
        Ok(Test {
            mtu,
            traffic,
            family,
            from_vm,
        })
    }

    pub fn is_udp(&self) -> bool {
        self.traffic == Traffic::Udp64
    }

    pub fn is_latency(&self) -> bool {
        self.traffic == Traffic::Lat64
    }

    /// iperf3 client flags of this test (besides address, port and timing).
    fn client_flags(&self) -> Result<Vec<String>> {
        Ok(match self.traffic {
            Traffic::Tcp { streams: 1 } => Vec::new(),
            Traffic::Tcp { streams } => vec!["-P".into(), streams.to_string()],
            Traffic::Udp64 => ["-u", "-l", &UDP_PAYLOAD.to_string(), "-b", "0"]
                .map(String::from)
                .to_vec(),
            Traffic::Lat64 | Traffic::Pmd { .. } => {
                return Err(Error::new(format!("{self} is not iperf3's")))
            }
        })
    }
}

/// `pmdN` or `pmdNtso` of a test id.
fn pmd_traffic(t: &str) -> Option<Traffic> {
    let rest = t.strip_prefix("pmd")?;
    let (digits, offloads) = match rest.strip_suffix("tso") {
        Some(d) => (d, true),
        None => (rest, false),
    };
    let frame = digits.parse().ok().filter(|f| PMD_FRAMES.contains(f))?;
    Some(Traffic::Pmd { frame, offloads })
}

impl fmt::Display for Test {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.from_vm {
            write!(f, "vm-")?;
        }
        match self.traffic {
            Traffic::Tcp { streams } => write!(f, "tcp{streams}")?,
            Traffic::Udp64 => write!(f, "udp{UDP_PAYLOAD}")?,
            Traffic::Lat64 => write!(f, "lat{UDP_PAYLOAD}")?,
            Traffic::Pmd { frame, offloads } => {
                write!(f, "pmd{frame}{}", if offloads { "tso" } else { "" })?;
            }
        }
        let family = match self.family {
            Family::V4 => "v4",
            Family::V6 => "v6",
        };
        write!(f, "-{family}-{}", self.mtu)
    }
}

/// How long each run lasts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// Measured seconds (`-t`).
    pub seconds: u32,
    /// Warm-up seconds left out of the figures (`-O`).
    pub omit: u32,
}

/// What the receiver saw of the small-UDP test.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct UdpFigures {
    pub sent_pps: f64,
    /// Datagrams the server received per second (received bytes / payload size).
    pub delivered_pps: f64,
    /// Datagrams sent but not delivered, in percent of those sent.
    pub loss_percent: f64,
}

impl UdpFigures {
    /// Datagrams sent but not delivered, in percent of `sent` (0 when none were
    /// sent; never negative, should more arrive than were counted as sent).
    pub fn loss_percent(sent: f64, delivered: f64) -> f64 {
        if sent > 0.0 {
            ((sent - delivered) / sent * 100.0).max(0.0)
        } else {
            0.0
        }
    }
}

/// The figures of one run (iperf3's, sockperf's, testpmd's or a VM's stream).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Figures {
    /// Received by the server (for a latency test: its messages' payload).
    pub gbps: f64,
    /// TCP retransmissions counted by the client.
    pub retransmits: Option<u64>,
    pub udp: Option<UdpFigures>,
    /// The round trips of a latency test.
    pub latency: Option<Latency>,
}

/// One successful run.
#[derive(Clone, Debug, PartialEq)]
pub struct Measurement {
    pub figures: Figures,
    pub cpu: Usage,
}

/// The program a namespace test runs in both guests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tool {
    Iperf3,
    Sockperf,
}

impl Tool {
    fn of(test: &Test) -> Tool {
        if test.is_latency() {
            Tool::Sockperf
        } else {
            Tool::Iperf3
        }
    }

    fn name(self) -> &'static str {
        match self {
            Tool::Iperf3 => "iperf3",
            Tool::Sockperf => "sockperf",
        }
    }

    fn port(self) -> &'static str {
        match self {
            Tool::Iperf3 => PORT,
            Tool::Sockperf => sockperf::PORT,
        }
    }

    /// The `ss` filter flags that show the server's socket: iperf3's listens on
    /// TCP, sockperf's is an unconnected UDP socket.
    fn ss_flags(self) -> &'static str {
        match self {
            Tool::Iperf3 => "-Hltn",
            Tool::Sockperf => "-Hlun",
        }
    }

    /// The server in `ns` bound to `addr`: a one-off iperf3 server (`-1`), which
    /// exits after its test; a sockperf server, which echoes until stopped.
    fn server(self, ns: &Netns, addr: &str) -> Cmd {
        match self {
            Tool::Iperf3 => ns.cmd("iperf3").args(["-s", "-1", "-B", addr, "-p", PORT]),
            Tool::Sockperf => ns.cmd("sockperf").args(sockperf::server_args(addr)),
        }
    }

    /// When the client's figures start after it does, and how long they last:
    /// iperf3's `--omit` and `--seconds`; sockperf's `-t` (`--seconds`) less what
    /// it leaves out at either end.
    fn window(self, timing: Timing) -> (Duration, Duration) {
        match self {
            Tool::Iperf3 => (
                Duration::from_secs(u64::from(timing.omit)),
                Duration::from_secs(u64::from(timing.seconds)),
            ),
            Tool::Sockperf => (sockperf::WARM_UP, sockperf::measured(timing.seconds)),
        }
    }

    /// The client in `ns` running `test` against `addr` for `timing`.
    fn client(self, ns: &Netns, addr: &str, test: &Test, timing: Timing) -> Result<Cmd> {
        let cmd = match self {
            Tool::Iperf3 => ns
                .cmd("iperf3")
                .args(["-c", addr, "-p", PORT, "-J", "--connect-timeout", "5000"])
                .args(["-t".to_string(), timing.seconds.to_string()])
                .args(["-O".to_string(), timing.omit.to_string()])
                .args(test.client_flags()?),
            Tool::Sockperf => {
                ns.cmd("sockperf")
                    .args(sockperf::client_args(addr, UDP_PAYLOAD, timing.seconds))
            }
        };
        let (warm_up, measured) = self.window(timing);
        Ok(cmd.timeout(warm_up + measured + Duration::from_secs(30)))
    }

    fn figures(self, out: &Outcome) -> Result<Figures> {
        match self {
            Tool::Iperf3 => parse_client_output(out),
            Tool::Sockperf => sockperf_figures(out),
        }
    }
}

/// Runs `test` on `topo` whose guests are the namespaces `client` and `server`:
/// starts the server, runs the client, samples CPU of the machine and of the
/// topology's daemons during the measured seconds.
pub fn measure(
    (client, server): (&Netns, &Netns),
    topo: &dyn Topology,
    test: Test,
    timing: Timing,
    dir: &Path,
    hz: f64,
) -> Result<Measurement> {
    let tool = Tool::of(&test);
    let addr = server_addr(test.family).to_string();
    let client = tool.client(client, &addr, &test, timing)?;
    let mut server = start_server(tool, server, &addr, dir)?;
    let (warm_up, measured) = tool.window(timing);
    let watched = topo.daemons();
    let (outcome, usage) = thread::scope(|s| {
        let handle = s.spawn(|| client.output());
        let usage = cpu_window(&handle, warm_up, measured, &watched, hz);
        let outcome = handle.join().unwrap_or_else(|_| {
            Err(Error::new(format!(
                "the {} client thread panicked",
                tool.name()
            )))
        });
        (outcome, usage)
    });
    let outcome = outcome?;
    let figures = tool
        .figures(&outcome)
        .map_err(|e| e.context(format!("`{}`", client.display())))?;
    let cpu = usage?;
    // A one-off iperf3 server exits once its test is over; a sockperf server, or an
    // iperf3 server that did not, is stopped by the guard.
    if tool == Tool::Iperf3 {
        server.wait_exit(Duration::from_secs(5))?;
    }
    Ok(Measurement { figures, cpu })
}

/// Starts `tool`'s server in `ns` bound to `addr` and waits until its socket is
/// there.
fn start_server(tool: Tool, ns: &Netns, addr: &str, dir: &Path) -> Result<Background> {
    let (name, port) = (tool.name(), tool.port());
    let mut server = Background::start(
        tool.server(ns, addr),
        &dir.join(format!("{name}-server.log")),
        &format!("{name} server"),
    )?;
    poll_until(
        &format!(
            "{name} server to listen on [{addr}]:{port} in {}",
            ns.name()
        ),
        Duration::from_secs(10),
        || {
            server.check_running()?;
            let out = ns.run("ss", &[tool.ss_flags(), &format!("sport = :{port}")])?;
            if out.trim().is_empty() {
                Err(Error::new("not listening yet"))
            } else {
                Ok(())
            }
        },
    )?;
    Ok(server)
}

/// Snapshots CPU at the start and end of the window (see the module docs) of a
/// client whose `measured` seconds start `warm_up` after it does; fails if the
/// client ends before the window does (it failed, or timing went wrong).
fn cpu_window(
    client: &ScopedJoinHandle<'_, Result<Outcome>>,
    warm_up: Duration,
    measured: Duration,
    watched: &[Watched],
    hz: f64,
) -> Result<Usage> {
    let t0 = Instant::now();
    let end = (t0 + warm_up + measured).checked_sub(WINDOW_TAIL).unwrap();
    sleep_while_running(client, t0 + warm_up + WINDOW_LEAD)?;
    let before = Snapshot::take(watched)?;
    sleep_while_running(client, end)?;
    let after = Snapshot::take(watched)?;
    Ok(Usage::between(&before, &after, hz))
}

fn sleep_while_running(
    client: &ScopedJoinHandle<'_, Result<Outcome>>,
    until: Instant,
) -> Result<()> {
    loop {
        if client.is_finished() {
            return Err(Error::new(
                "the client ended before the CPU measurement window did",
            ));
        }
        let now = Instant::now();
        if now >= until {
            return Ok(());
        }
        thread::sleep((until - now).min(Duration::from_millis(50)));
    }
}

/// sockperf's summary, or why there is none: a failed client's own words (on
/// either stream) rather than the summary's absence.
fn sockperf_figures(out: &Outcome) -> Result<Figures> {
    let latency = sockperf::parse_summary(&out.stdout).map_err(|e| {
        if out.status.success() {
            e
        } else {
            Error::new(format!(
                "sockperf failed ({}): {}\n{}",
                out.status,
                out.stderr.trim(),
                tail(&out.stdout)
            ))
        }
    })?;
    Ok(Figures {
        gbps: latency.round_trips_per_s * f64::from(UDP_PAYLOAD) * 8.0 / 1e9,
        retransmits: None,
        udp: None,
        latency: Some(latency),
    })
}

/// iperf3's JSON, or why there is none: with `-J` iperf3 reports its own errors as
/// `{"error": ...}` on stdout.
fn parse_client_output(out: &Outcome) -> Result<Figures> {
    match serde_json::from_str::<Value>(&out.stdout) {
        Ok(v) => parse_report(&v),
        Err(_) if !out.status.success() => Err(Error::new(format!(
            "iperf3 failed ({}): {}",
            out.status,
            out.stderr.trim()
        ))),
        Err(e) => Err(Error::new(format!("iperf3 printed no JSON ({e})"))),
    }
}

/// The figures of a client's `-J` report (which carries the server's side too).
pub fn parse_report(v: &Value) -> Result<Figures> {
    if let Some(e) = v.get("error").and_then(Value::as_str) {
        return Err(Error::new(format!("iperf3: {e}")));
    }
    let end = &v["end"];
    let received = &end["sum_received"];
    let gbps = number(received, "end.sum_received", "bits_per_second")? / 1e9;
    let protocol = v["start"]["test_start"]["protocol"].as_str().unwrap_or("");
    if protocol != "UDP" {
        let retransmits = end["sum_sent"]["retransmits"].as_u64();
        return Ok(Figures {
            gbps,
            retransmits,
            udp: None,
            latency: None,
        });
    }
    // iperf3's own loss count is off when --omit is used (it mixes the omitted
    // seconds in); received bytes and sent datagrams are counted cleanly.
    let blksize = number(&v["start"]["test_start"], "start.test_start", "blksize")?;
    let delivered = number(received, "end.sum_received", "bytes")? / blksize.max(1.0);
    let seconds = number(received, "end.sum_received", "seconds")?;
    let sent = number(&end["sum_sent"], "end.sum_sent", "packets")?;
    let sent_seconds = number(&end["sum_sent"], "end.sum_sent", "seconds")?;
    Ok(Figures {
        gbps,
        retransmits: None,
        udp: Some(UdpFigures {
            sent_pps: sent / sent_seconds.max(1e-9),
            delivered_pps: delivered / seconds.max(1e-9),
            loss_percent: UdpFigures::loss_percent(sent, delivered),
        }),
        latency: None,
    })
}

fn number(v: &Value, at: &str, key: &str) -> Result<f64> {
    v[key]
        .as_f64()
        .ok_or_else(|| Error::new(format!("iperf3 JSON has no number {at}.{key}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ids_round_trip() {
        let all = [Test::default_list(), Test::smoke_list(), Test::vm_list()].concat();
        assert!(all.iter().any(|t| t.guest_kind() == GuestKind::Testpmd));
        for t in all {
            assert_eq!(Test::parse(&t.to_string()).unwrap(), t);
        }
        assert_eq!(
            Test::default_list()
                .iter()
                .map(Test::to_string)
                .collect::<Vec<_>>(),
            [
                "tcp1-v4-8500",
                "tcp1-v6-8500",
                "tcp4-v4-8500",
                "tcp4-v6-8500",
                "tcp1-v4-1500",
                "tcp1-v6-1500",
                "tcp4-v4-1500",
                "tcp4-v6-1500",
                "udp64-v4-8500",
                "udp64-v6-8500",
                "lat64-v4-8500",
                "pmd64-v4-1500",
                "pmd1500-v4-1500",
                "pmd64tso-v4-1500",
                "pmd1500tso-v4-1500"
            ]
        );
        for bad in [
            "tcp0-v4-8500",
            "tcp1-v5-8500",
            "tcp1-v4-9000",
            "udp-v4-8500",
            "tcp1",
            "vm-tcp4-v4-8500",
            "vm-udp64-v6-8500",
            "vm-tcp1-v4",
            "pmd64-v6-1500",
            "pmd-v4-1500",
            "pmd32-v4-1500",
            "pmd1515-v4-8500",
            "pmd1500-v4-1280",
            "pmd64offload-v4-1500",
            "vm-pmd64-v4-1500",
            "lat64-v6-8500",
            "lat32-v4-8500",
            "vm-lat64-v4-8500",
        ] {
            assert!(Test::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn vm_tests_carry_their_prefix() {
        assert_eq!(
            Test::vm_list()
                .iter()
                .map(Test::to_string)
                .collect::<Vec<_>>(),
            ["vm-tcp1-v4-8500", "vm-tcp1-v6-8500"]
        );
        let t = Test::parse("vm-tcp1-v6-1500").unwrap();
        assert!(t.from_vm);
        assert_eq!((t.mtu, t.family), (1500, Family::V6));
        assert!(!Test::parse("tcp1-v6-1500").unwrap().from_vm);
        let e = Test::parse("vm-tcp4-v4-8500").unwrap_err();
        assert!(e.0.contains("one TCP stream"), "{e}");
    }

    #[test]
    fn client_flags_per_traffic() {
        let mut t = Test::parse("tcp4-v4-1500").unwrap();
        assert_eq!(t.client_flags().unwrap(), ["-P", "4"]);
        t.traffic = Traffic::Tcp { streams: 1 };
        assert!(t.client_flags().unwrap().is_empty());
        t.traffic = Traffic::Udp64;
        assert_eq!(t.client_flags().unwrap(), ["-u", "-l", "64", "-b", "0"]);
        assert!(Test::pmd(64, false).client_flags().is_err());
        assert!(Test::latency().client_flags().is_err());
    }

    #[test]
    fn latency_tests_run_sockperf_over_ipv4() {
        let t = Test::parse("lat64-v4-1500").unwrap();
        assert_eq!(t.traffic, Traffic::Lat64);
        assert_eq!((t.mtu, t.family), (1500, Family::V4));
        assert!(t.is_latency() && !t.is_udp());
        assert_eq!(t.guest_kind(), GuestKind::Netns);
        assert_eq!(Tool::of(&t), Tool::Sockperf);
        assert_eq!(
            Tool::of(&Test::parse("udp64-v4-8500").unwrap()),
            Tool::Iperf3
        );
        let e = Test::parse("lat64-v6-8500").unwrap_err();
        assert!(e.0.contains("IPv4 addresses only"), "{e}");
        assert!(Test::smoke_list().contains(&Test::latency()));
        let timing = Timing {
            seconds: 5,
            omit: 3,
        };
        assert_eq!(
            Tool::Sockperf.window(timing),
            (sockperf::WARM_UP, Duration::from_millis(4550))
        );
        assert_eq!(
            Tool::Iperf3.window(timing),
            (Duration::from_secs(3), Duration::from_secs(5))
        );
    }

    #[test]
    fn sockperf_output_becomes_figures() {
        use std::os::unix::process::ExitStatusExt;
        let out = |code: i32, stdout: &str, stderr: &str| Outcome {
            status: std::process::ExitStatus::from_raw(code << 8),
            stdout: stdout.into(),
            stderr: stderr.into(),
        };
        let f = sockperf_figures(&out(0, sockperf::tests::SAMPLE, "")).unwrap();
        let l = f.latency.unwrap();
        assert_eq!(f.gbps, l.round_trips_per_s * 64.0 * 8.0 / 1e9);
        assert!(f.udp.is_none() && f.retransmits.is_none());
        let e = sockperf_figures(&out(1, "", "sockperf: ERROR: Message received was larger"))
            .unwrap_err();
        assert!(
            e.0.contains("sockperf failed") && e.0.contains("larger"),
            "{e}"
        );
    }

    #[test]
    fn testpmd_tests_parse_frame_and_offloads() {
        let t = Test::parse("pmd1500tso-v4-1500").unwrap();
        assert_eq!(
            t.traffic,
            Traffic::Pmd {
                frame: 1500,
                offloads: true
            }
        );
        assert_eq!(t.guest_kind(), GuestKind::Testpmd);
        assert_eq!(Test::parse("pmd64-v4-8500").unwrap().mtu, 8500);
        assert_eq!(
            Test::parse("vm-tcp1-v4-8500").unwrap().guest_kind(),
            GuestKind::Vm
        );
        assert_eq!(
            Test::parse("udp64-v4-8500").unwrap().guest_kind(),
            GuestKind::Netns
        );
        let e = Test::parse("pmd64-v6-1500").unwrap_err();
        assert!(e.0.contains("IPv4 only"), "{e}");
        let e = Test::parse("pmd1514-v4-1400").unwrap_err();
        assert!(e.0.contains("exceeds guest MTU 1400"), "{e}");
    }

    #[test]
    fn tcp_report() {
        let v = json!({
            "start": {"test_start": {"protocol": "TCP", "blksize": 131072}},
            "end": {
                "sum_sent": {"bits_per_second": 7.1e9, "retransmits": 12, "seconds": 5.0},
                "sum_received": {"bits_per_second": 7.0e9, "seconds": 5.0}
            }
        });
        let f = parse_report(&v).unwrap();
        assert_eq!(f.gbps, 7.0);
        assert_eq!(f.retransmits, Some(12));
        assert!(f.udp.is_none());
    }

    #[test]
    fn udp_report_counts_delivered_from_bytes() {
        let v = json!({
            "start": {"test_start": {"protocol": "UDP", "blksize": 64}},
            "end": {
                "sum_sent": {"bits_per_second": 5.12e8, "packets": 2_000_000, "seconds": 2.0},
                "sum_received": {"bits_per_second": 2.56e8, "bytes": 64_000_000,
                                 "seconds": 2.0, "packets": 2_000_000, "lost_packets": 5}
            }
        });
        let u = parse_report(&v).unwrap().udp.unwrap();
        assert_eq!(u.sent_pps, 1e6);
        assert_eq!(u.delivered_pps, 5e5);
        assert_eq!(u.loss_percent, 50.0);
    }

    #[test]
    fn iperf_errors_are_reported() {
        let e = parse_report(&json!({"error": "unable to connect to server"})).unwrap_err();
        assert!(e.0.contains("unable to connect"), "{e}");
        let e = parse_report(&json!({"start": {}, "end": {}})).unwrap_err();
        assert!(e.0.contains("end.sum_received.bits_per_second"), "{e}");
    }
}
