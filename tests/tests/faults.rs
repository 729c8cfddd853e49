//! The worker's I/O faults, end to end: a guest that vanishes and comes back, an
//! underlay whose MTU is lowered at run time, an underlay link deleted and
//! re-created (and its queue count changed, and taken down and up). The datapath
//! must notice each, count what it cannot deliver, idle while there is nothing to
//! serve, and recover by itself.

use e2e::capture::Capture;
use e2e::rack::{Sled, BRIDGE, UNDERLAY_IF, UNDERLAY_MTU};
use e2e::standard::{self, A1, A2, B1};
use e2e::{poll_until, Cmd, Error, Guest, Result};
use serde_json::Value;
use std::net::IpAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

const FIRST_REPLY: Duration = Duration::from_secs(20);
/// How long the daemon may take to notice a change and act on it.
const NOTICE: Duration = Duration::from_secs(15);

fn xfer_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_e2e-xfer"))
}

/// CPU time (user + system, all threads) of process `pid` so far.
fn cpu_time(pid: u32) -> Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces) start at ") ".
    let rest = stat
        .rsplit_once(") ")
        .map(|(_, r)| r)
        .ok_or_else(|| Error::new(format!("unexpected /proc/{pid}/stat: {stat}")))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let ticks = |i: usize| -> Result<u64> {
        fields
            .get(i)
            .and_then(|f| f.parse().ok())
            .ok_or_else(|| Error::new(format!("field {i} of /proc/{pid}/stat: {stat}")))
    };
    let hz = e2e::bench::cpu::user_hz()?;
    Ok(Duration::from_secs_f64(
        (ticks(11)? + ticks(12)?) as f64 / hz,
    ))
}

/// The share of one core sled `sled`'s daemon used over `span`.
fn daemon_cpu(sled: &Sled, span: Duration) -> Result<f64> {
    let pid = sled
        .daemon()?
        .pid()
        .ok_or_else(|| Error::new("the daemon has no pid"))?;
    let before = cpu_time(pid)?;
    std::thread::sleep(span);
    Ok(cpu_time(pid)?.checked_sub(before).unwrap().as_secs_f64() / span.as_secs_f64())
}

/// The guests of sled 0 vanish while sled 1 sends to one of them: both ports go
/// down (list-ports, `tap_gone`), the frames for them are counted, and the daemon
/// idles. When the guest's namespace is back the daemon puts the port's tap in it
/// again by itself, the port comes up, and traffic flows again.
#[test]
fn vanished_guest_port_goes_down_idles_and_comes_back() -> Result<()> {
    let mut rack = standard::rack("fg", &[])?;
    let target = rack.guest(A2)?.ipv4()?;
    rack.guest(B1)?.ping(target, 56, FIRST_REPLY)?;
    let flood = rack
        .guest(B1)?
        .cmd("ping")
        .args(["-4", "-i", "0.05", "-w", "120", &target.to_string()])
        .spawn_with(Stdio::null(), Stdio::null());
    let mut flood = flood?;
    // Both guests of sled 0 go, as when their VMs are destroyed with their netns.
    let a2_index = rack
        .guests
        .iter()
        .position(|g| g.spec.name == A2)
        .ok_or_else(|| Error::new("no guest a2"))?;
    let a2 = rack.guests.remove(a2_index);
    let (a2_spec, a2_ns) = (a2.spec.clone(), a2.ns.name().to_string());
    drop(a2);
    rack.guests.retain(|g| g.spec.name != A1);
    let sled0 = rack.sled(0)?;
    sled0.wait_for_link(A1, "down", NOTICE)?;
    sled0.wait_for_link(A2, "down", NOTICE)?;
    assert_eq!(sled0.counter(None, "tap_gone")?, 2);
    // Sled 1 keeps sending to a2: counted, not silently lost.
    poll_until(
        "frames for the down port to be counted",
        NOTICE,
        || match sled0.counter(None, "tap_tx_port_down")? {
            0 => Err(Error::new("tap_tx_port_down is 0")),
            n => Ok(n),
        },
    )?;
    let _ = flood.kill();
    let _ = flood.wait();
    // Nothing to serve: the daemon sleeps (its taps out of the poll set, the
    // re-attach retries backed off to seconds).
    std::thread::sleep(Duration::from_secs(3));
    let cpu = daemon_cpu(sled0, Duration::from_secs(5))?;
    eprintln!(
        "sled 0 daemon with every tap gone: {:.2}% of a core",
        cpu * 100.0
    );
    assert!(cpu < 0.01, "daemon uses {:.2}% of a core", cpu * 100.0);
    // a2 is back: its namespace exists again, and the daemon puts the tap in it.
    rack.guests.push(Guest {
        spec: a2_spec,
        ns: Guest::namespace(&a2_ns)?,
    });
    let sled0 = rack.sled(0)?;
    sled0.wait_for_link(A2, "up", NOTICE)?;
    let a2 = rack.guest(A2)?;
    a2.configure_os()?;
    a2.ping(rack.guest(B1)?.ipv4()?, 56, FIRST_REPLY)?;
    assert_eq!(sled0.counter(None, "tap_reattached")?, 1);
    let states = sled0.link_states()?;
    assert!(
        states.contains(&(A1.to_string(), "down".to_string())),
        "a1 stays down while its guest is away: {states:?}"
    );
    Ok(())
}

/// `MTU` on both sleds' underlay links and their switch ports.
fn set_underlay_mtu(rack: &e2e::Rack, mtu: u32) -> Result<()> {
    let mtu = mtu.to_string();
    for sled in &rack.sleds {
        sled.ns.ip(&["link", "set", UNDERLAY_IF, "mtu", &mtu])?;
        rack.switch
            .ip(&["link", "set", &sled.bridge_port, "mtu", &mtu])?;
    }
    Ok(())
}

/// The underlay MTU `xdeadm mtu PORT` reports.
fn budget(sled: &Sled, port: &str) -> Result<Value> {
    let out = sled.admin(&["--json", "mtu", port])?;
    let v: Value = serde_json::from_str(&out)
        .map_err(|e| Error::new(format!("mtu is not JSON ({e}): {out}")))?;
    Ok(v["data"].clone())
}

fn wait_for_underlay_mtu(sled: &Sled, port: &str, mtu: u64) -> Result<Value> {
    poll_until(
        &format!("sled {} to plan with underlay MTU {mtu}", sled.index),
        NOTICE,
        || {
            let b = budget(sled, port)?;
            if b["underlay_mtu"].as_u64() == Some(mtu) {
                Ok(b)
            } else {
                Err(Error::new(format!("budget: {b}")))
            }
        },
    )
}

/// The underlay MTU is lowered to 4000 while the daemons run: they plan with it at
/// once (`xdeadm mtu` shows it and warns that the 8500 port no longer fits), a
/// guest's too-large packet gets Packet Too Big (counted), TCP still arrives intact
/// in segments cut for the smaller underlay, and raising it back restores jumbo
/// frames.
#[test]
fn lowered_underlay_mtu_shrinks_segments_and_sends_packet_too_big() -> Result<()> {
    let rack = standard::rack("fm", &[])?;
    let (a1, b1) = (rack.guest(A1)?, rack.guest(B1)?);
    a1.ping(b1.ipv4()?, 8472, FIRST_REPLY)?;
    set_underlay_mtu(&rack, 4000)?;
    let sled0 = rack.sled(0)?;
    let b = wait_for_underlay_mtu(sled0, A1, 4000)?;
    let warnings = b["warnings"].to_string();
    assert!(
        warnings.contains("exceeds underlay MTU 4000"),
        "no warning for the 8500 port: {b}"
    );
    wait_for_underlay_mtu(rack.sled(1)?, B1, 4000)?;

    let ptb_before = sled0.counter(Some(A1), "packet_too_big")?;
    let o = a1.ping_once(b1.ipv4()?, 8000)?;
    assert!(
        !o.status.success(),
        "an 8000-byte ping crossed a 4000-byte underlay"
    );
    assert!(
        sled0.counter(Some(A1), "packet_too_big")? > ptb_before,
        "the dropped packet was not answered with Packet Too Big"
    );

    let file = rack.dir().join("mtu.pcap");
    let cap = Capture::start(&rack.switch, &sled0.bridge_port, &file, "udp port 6081")?;
    e2e::xfer::transfer(
        xfer_bin(),
        a1,
        b1,
        b1.ipv4()?,
        5301,
        20 << 20,
        Duration::from_secs(120),
    )?;
    let frames = cap.stop()?;
    let biggest = frames
        .iter()
        .filter(|f| f.is_geneve())
        .map(|f| f.len)
        .max()
        .unwrap_or(0);
    assert!(
        biggest <= 14 + 4000,
        "a {biggest}-byte frame on a 4000-byte underlay"
    );
    assert!(
        biggest > 3500,
        "segments do not fill the underlay: {biggest} bytes"
    );

    set_underlay_mtu(&rack, u32::from(UNDERLAY_MTU))?;
    let b = wait_for_underlay_mtu(sled0, A1, u64::from(UNDERLAY_MTU))?;
    assert!(
        !b["warnings"].to_string().contains("exceeds underlay MTU"),
        "{b}"
    );
    wait_for_underlay_mtu(rack.sled(1)?, B1, u64::from(UNDERLAY_MTU))?;
    // a1 learned a smaller path MTU from the Packet Too Big; a2 did not, and its
    // jumbo frames cross again.
    rack.guest(A2)?.ping(b1.ipv4()?, 8472, FIRST_REPLY)?;
    Ok(())
}

/// Re-creates sled `index`'s underlay veth and its switch port as the rack built
/// them (after `ip link del` took both).
fn replug_underlay(rack: &e2e::Rack, sled: &Sled) -> Result<()> {
    let mtu = UNDERLAY_MTU.to_string();
    Cmd::new("ip")
        .args([
            "link",
            "add",
            UNDERLAY_IF,
            "netns",
            sled.ns.name(),
            "mtu",
            &mtu,
        ])
        .args(["type", "veth", "peer", "name", &sled.bridge_port])
        .args(["netns", rack.switch.name(), "mtu", &mtu])
        .run()?;
    rack.switch
        .ip(&["link", "set", &sled.bridge_port, "master", BRIDGE, "up"])?;
    address_underlay(sled)?;
    sled.ns.ip(&["link", "set", UNDERLAY_IF, "up"]).map(drop)
}

/// Gives a sled's underlay link its address, as the rack did.
fn address_underlay(sled: &Sled) -> Result<()> {
    let addr = format!("{}/64", sled.addr);
    sled.ns
        .ip(&["-6", "addr", "add", &addr, "dev", UNDERLAY_IF, "nodad"])
        .map(drop)
}

/// How many AF_XDP sockets a sled's daemon serves.
fn xsk_sockets(sled: &Sled) -> Result<usize> {
    let out = sled.admin(&["--json", "stats"])?;
    let v: Value = serde_json::from_str(&out)
        .map_err(|e| Error::new(format!("stats are not JSON ({e}): {out}")))?;
    Ok(v["data"]["xsk"].as_array().map_or(0, Vec::len))
}

/// Pings until a reply comes, at most [`NOTICE`] plus the first reply's time.
fn ping_resumes(from: &Guest, to: IpAddr, size: usize, what: &str) -> Result<()> {
    let t = Instant::now();
    from.ping(to, size, NOTICE + FIRST_REPLY)
        .map_err(|e| e.context(what))?;
    eprintln!("{what}: traffic resumed after {:.1?}", t.elapsed());
    Ok(())
}

/// The underlay link is deleted and re-created: the daemon re-attaches its XDP
/// program and AF_XDP sockets, and traffic resumes, jumbo frames included. A
/// change of the link's rx queue count gets a socket for the new queue, and a
/// link taken down and up recovers.
#[test]
fn underlay_link_recreated_requeued_and_bounced_recovers() -> Result<()> {
    let rack = standard::rack("fl", &[])?;
    let (a1, b1) = (rack.guest(A1)?, rack.guest(B1)?);
    let sled0 = rack.sled(0)?;
    a1.ping(b1.ipv4()?, 56, FIRST_REPLY)?;
    assert_eq!(xsk_sockets(sled0)?, 1);

    sled0.ns.ip(&["link", "del", UNDERLAY_IF])?;
    poll_until(
        "sled 0 to drop its sockets",
        NOTICE,
        || match xsk_sockets(sled0)? {
            0 => Ok(()),
            n => Err(Error::new(format!("{n} sockets"))),
        },
    )?;
    assert!(
        !a1.ping_once(b1.ipv4()?, 56)?.status.success(),
        "no underlay, no reply"
    );
    replug_underlay(&rack, sled0)?;
    ping_resumes(a1, b1.ipv4()?, 56, "link re-created")?;
    a1.ping(b1.ipv4()?, 8472, FIRST_REPLY)?;
    b1.ping(a1.ipv6()?, 8400, FIRST_REPLY)?;

    sled0
        .ns
        .run("ethtool", &["-L", UNDERLAY_IF, "rx", "2", "tx", "2"])?;
    poll_until(
        "a socket for the second queue",
        NOTICE,
        || match xsk_sockets(sled0)? {
            2 => Ok(()),
            n => Err(Error::new(format!("{n} sockets"))),
        },
    )?;
    ping_resumes(a1, b1.ipv4()?, 56, "queues changed")?;

    // The link loses its carrier (its switch port goes down) and gets it back.
    let port = &sled0.bridge_port;
    rack.switch.ip(&["link", "set", port, "down"])?;
    let o = a1.ping_once(b1.ipv4()?, 56)?;
    assert!(!o.status.success(), "no carrier, no reply");
    rack.switch.ip(&["link", "set", port, "up"])?;
    ping_resumes(a1, b1.ipv4()?, 56, "carrier lost and back")?;
    // The link is set down and up; the kernel drops its IPv6 address when it goes
    // down, which the sled's network configuration puts back.
    sled0.ns.ip(&["link", "set", UNDERLAY_IF, "down"])?;
    let o = a1.ping_once(b1.ipv4()?, 56)?;
    assert!(!o.status.success(), "link down, no reply");
    sled0.ns.ip(&["link", "set", UNDERLAY_IF, "up"])?;
    address_underlay(sled0)?;
    ping_resumes(a1, b1.ipv4()?, 56, "link down and up")?;
    assert_eq!(xsk_sockets(sled0)?, 2);
    Ok(())
}

/// With two workers, and traffic flowing the whole time: the link is re-created
/// and both workers take over their new sockets (one queue each), the daemon
/// keeps running, and traffic resumes both ways.
#[test]
fn two_workers_take_over_new_sockets_under_traffic() -> Result<()> {
    let rack = standard::rack("fw", &["--cores", "0,1"])?;
    let (a1, b1) = (rack.guest(A1)?, rack.guest(B1)?);
    let sled0 = rack.sled(0)?;
    a1.ping(b1.ipv4()?, 56, FIRST_REPLY)?;
    assert_eq!(xsk_sockets(sled0)?, 2, "one socket per worker");
    let flood = b1
        .cmd("ping")
        .args(["-4", "-i", "0.01", "-w", "120", &a1.ipv4()?.to_string()])
        .spawn_with(Stdio::null(), Stdio::null());
    let mut flood = flood?;
    sled0.ns.ip(&["link", "del", UNDERLAY_IF])?;
    std::thread::sleep(Duration::from_millis(500));
    replug_underlay(&rack, sled0)?;
    let resumed = ping_resumes(a1, b1.ipv4()?, 56, "link re-created under traffic");
    let _ = flood.kill();
    let _ = flood.wait();
    resumed?;
    ping_resumes(b1, a1.ipv6()?, 8400, "jumbo frames back to sled 0")?;
    assert_eq!(xsk_sockets(sled0)?, 2);
    sled0.admin(&["list-ports"])?;
    Ok(())
}
