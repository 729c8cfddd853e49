//! demo: builds the standard rack (two sleds, two guests each, ports at MTU 8500),
//! shows what the guests learn about their MTU, pings and measures throughput across
//! sleds, shows the datapath's counters; then a guest reaching the internet through
//! the boundary switch (V2B, SNAT and a floating IP); and tears everything down on
//! exit.
//!
//! Run through `scripts/demo.sh`, which installs the tools and builds in release mode.
//! Every command is printed before its output, so the run reads as a walkthrough.

use e2e::boundary::{nat_rack, Internet, Outside};
use e2e::counters::Snapshot;
use e2e::standard::{self, A1, B1, B2};
use e2e::xfer::{fetch, transfer_between};
use e2e::{poll_until, Cmd, Guest, GuestSpec, Rack, Result};
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::{ExitCode, Stdio};
use std::time::Duration;

fn section(title: &str) {
    println!("\n=== {title} ===");
}

/// Prints the command, runs it, prints its output.
fn show(cmd: Cmd) -> Result<String> {
    println!("$ {}", cmd.display());
    let out = cmd.run()?;
    print!("{out}");
    if !out.ends_with('\n') {
        println!();
    }
    Ok(out)
}

fn xdeadm(rack: &Rack, sled: usize, args: &[&str]) -> Result<String> {
    show(rack.sled(sled)?.xdeadm(args)?)
}

fn in_guest(g: &Guest, program: &str, args: &[&str]) -> Result<String> {
    show(g.cmd(program).args(args.iter().copied()))
}

/// iperf3 from `client` to `server` for 5 s; prints iperf3's summary.
fn iperf(client: &Guest, server: &Guest, ip: std::net::IpAddr) -> Result<()> {
    let ip = ip.to_string();
    let mut srv = server
        .cmd("iperf3")
        .args(["-s", "-1", "-B", &ip])
        .spawn_with(Stdio::null(), Stdio::null())?;
    // The server needs a moment to listen: retry the client until it connects.
    let result = poll_until("iperf3 to connect", Duration::from_secs(15), || {
        client
            .cmd("iperf3")
            .args(["-c", &ip, "-t", "5", "-f", "g"])
            .timeout(Duration::from_secs(60))
            .run()
    });
    let _ = srv.kill();
    let _ = srv.wait();
    let out = result?;
    println!(
        "$ iperf3 -c {ip} -t 5 -f g   (in guest {})",
        client.spec.name
    );
    for line in out
        .lines()
        .filter(|l| l.contains("sender") || l.contains("receiver"))
    {
        println!("{line}");
    }
    Ok(())
}

fn run() -> Result<()> {
    section("building the rack: 2 sleds on a 9000-byte IPv6 underlay, 4 guests at MTU 8500");
    let prefix = std::env::var("DEMO_PREFIX").unwrap_or_else(|_| "demo".to_string());
    let rack = standard::rack(&prefix, &[])?;
    for s in &rack.sleds {
        println!(
            "sled {}: namespace {}, underlay {} {} (bridge port {})",
            s.index,
            s.ns.name(),
            s.underlay_if,
            s.addr,
            s.bridge_port
        );
    }
    for g in &rack.guests {
        let addresses: Vec<String> = g.spec.addresses().iter().map(ToString::to_string).collect();
        println!(
            "guest {}: namespace {}, sled {}, MAC {}, addresses {}, VNI {}",
            g.spec.name,
            g.ns.name(),
            g.spec.sled,
            g.spec.mac,
            addresses.join(" "),
            g.spec.vni
        );
    }

    section("ports and V2P on sled 0");
    xdeadm(&rack, 0, &["list-ports"])?;
    xdeadm(&rack, 0, &["dump-v2p"])?;

    section("what guest a1 is told about its MTU");
    xdeadm(&rack, 0, &["mtu", A1])?;
    xdeadm(&rack, 0, &["ra", A1])?;
    let a1 = rack.guest(A1)?;
    let xdeadm_bin = e2e::bins::bins()?.xdeadm.display().to_string();
    in_guest(a1, &xdeadm_bin, &["ra", "listen", A1])?;
    in_guest(a1, "sysctl", &[&format!("net.ipv6.conf.{A1}.mtu")])?;

    section("ping across sleds (a1 on sled 0 -> b1 on sled 1), full 8500-byte packets");
    let b1 = rack.guest(B1)?;
    b1.ping(b1.spec.gateway_ipv4.into(), 56, Duration::from_secs(10))?;
    a1.ping(b1.ipv4()?, 56, Duration::from_secs(20))?;
    a1.ping(b1.ipv6()?, 56, Duration::from_secs(20))?;
    in_guest(
        a1,
        "ping",
        &[
            "-c",
            "3",
            "-i",
            "0.2",
            "-M",
            "do",
            "-s",
            "8472",
            &b1.ipv4()?.to_string(),
        ],
    )?;
    in_guest(
        a1,
        "ping",
        &[
            "-6",
            "-c",
            "3",
            "-i",
            "0.2",
            "-M",
            "do",
            "-s",
            "8452",
            &b1.ipv6()?.to_string(),
        ],
    )?;
    println!("{TTL_255}");

    section("TCP throughput across sleds (iperf3, 5 s each)");
    iperf(a1, b1, b1.ipv4()?)?;
    let b2 = rack.guest(B2)?;
    iperf(b2, a1, a1.ipv6()?)?;

    section("counters of port a1 on sled 0 (tunneled TSO: buffers in, segments out)");
    let cmd = rack.sled(0)?.xdeadm(&["stats", A1])?;
    println!("$ {}   (zero counters omitted)", cmd.display());
    let stats = cmd.run()?;
    print!("{}", without_zeros(&stats));
    for note in healthy_drops(&stats) {
        println!("{note}");
    }

    section("tearing down");
    rack.teardown_quietly();
    println!("done: all namespaces, ports and daemons removed");

    internet(&prefix)?;
    Ok(())
}

/// `stats` text (indented `key: value` lines under `key:` headings) without its
/// zero counters, nor the headings left with nothing under them.
fn without_zeros(stats: &str) -> String {
    let indent = |l: &str| l.len() - l.trim_start().len();
    // From the end, so that a heading is judged by what is kept below it: it stays
    // when the next line kept is under it.
    let mut kept: Vec<&str> = Vec::new();
    for line in stats.lines().rev().filter(|l| !l.ends_with(": 0")) {
        let heading = line.ends_with(':');
        if !heading || kept.last().is_some_and(|next| indent(next) > indent(line)) {
            kept.push(line);
        }
    }
    kept.reverse();
    let mut out = kept.join("\n");
    if !out.is_empty() {
        out.push('\n');
    }
    out
}

/// Why IPv6 pings between guests show ttl=255 (IPv4: 64).
const TTL_255: &str = "(ttl=255 on the IPv6 replies: the gateway's Router Advertisements carry \
     cur hop limit 255, as OPTE's do, and the guests' kernels start every IPv6 packet they send \
     with it; nothing decrements it between guests of one VPC. IPv4 starts at the guest's own 64.)";

/// The drops every healthy run has, with what they are, for those `stats` shows
/// (a line `name: N` with N > 0).
fn healthy_drops(stats: &str) -> Vec<String> {
    const EXPLAINED: [(&str, &str); 2] = [
        (
            "link_local_only",
            "link-scoped frames the gateway does not answer and nothing forwards: the \
             guest's MLD reports and duplicate address detection at link-up",
        ),
        (
            "rs_rate_limited",
            "Router Solicitations within 3 s of the last RA (RFC 4861): the guest's \
             kernel sends up to 3 at link-up and `ra listen` one more; each is answered by \
             the RA that goes out when the 3 s are over",
        ),
    ];
    EXPLAINED
        .iter()
        .filter(|(name, _)| {
            stats.lines().any(|l| {
                l.trim()
                    .strip_prefix(name)
                    .and_then(|rest| rest.strip_prefix(": "))
                    .is_some_and(|n| n.trim() != "0")
            })
        })
        .map(|(name, what)| format!("({name} is normal: {what}.)"))
        .collect()
}

fn addr(s: &str) -> Result<IpAddr> {
    s.parse()
        .map_err(|e| e2e::Error::new(format!("address {s:?}: {e}")))
}

/// A binary built next to this one (`scripts/demo.sh` builds them all).
fn sibling(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    Ok(exe.with_file_name(name))
}

/// The way out of the rack: a sled with one guest, the boundary switch on a second
/// sled (V2B sends everything to it), and the internet behind it (a server behind an
/// MTU-1400 router link). The guest leaves from SNAT 203.0.113.9 (ports 2000-2099)
/// over IPv4 and from its floating IP 2001:db8:7::7 over IPv6.
fn internet(prefix: &str) -> Result<()> {
    section("reaching the internet through the boundary switch (V2B and NAT)");
    let spec = GuestSpec::dual("g0", 0, 7);
    let mut guest = Outside::snat(spec, addr("203.0.113.9")?, (2000, 2099));
    let floating = Outside::floating(guest.spec.clone(), &[addr("2001:db8:7::7")?]);
    guest.external.extend(floating.external);
    guest.ingress.extend(floating.ingress);
    println!(
        "guest g0 on sled 0: xdeadm set-external-ips g0 {}",
        guest.external.join(" ")
    );
    let switch_bin = sibling("boundary")?.display().to_string();
    let (rack, internet) = nat_rack(prefix, 1, vec![guest], &switch_bin)?;
    println!(
        "boundary switch on sled 1 ({}); internet server {} / {}",
        rack.sled(1)?.addr,
        Internet::SERVER4,
        Internet::SERVER6
    );
    xdeadm(&rack, 0, &["dump-v2b"])?;
    xdeadm(&rack, 0, &["list-ports"])?;
    let g = rack.guest("g0")?;
    let servers = [IpAddr::V4(Internet::SERVER4), IpAddr::V6(Internet::SERVER6)];
    for server in servers {
        // The first packets may wait for the underlay neighbour.
        g.ping(server, 56, Duration::from_secs(10))?;
        in_guest(g, "ping", &["-c", "2", "-i", "0.2", &server.to_string()])?;
    }
    for (server, port) in servers.into_iter().zip([5201, 5202]) {
        fetch(&g.ns, &internet.server, server, port, 1 << 20)?;
        let sent = transfer_between(
            &sibling("e2e-xfer")?,
            &g.ns,
            &internet.server,
            server,
            port + 10,
            1 << 20,
            Duration::from_secs(60),
        )?;
        println!(
            "checked TCP with {server}: 1 MiB fetched intact, {} bytes sent intact",
            sent.bytes
        );
    }
    xdeadm(&rack, 0, &["dump-uft", "g0"])?;
    let stats = Snapshot::take(rack.sled(0)?)?;
    println!("NAT drop counters of g0 (xdeadm --json stats):");
    for reason in ["no_external_ip", "snat_exhausted", "nat_no_mapping"] {
        println!(
            "  {reason}: {}",
            stats.get(&format!("engine.ports.g0.drops.{reason}"))
        );
    }
    println!("the switch counted {}", internet.counters()?);
    drop(internet);
    rack.teardown_quietly();
    println!("done: the second rack and the internet removed");
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("demo failed: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_counters_go_and_so_do_their_empty_headings() {
        let stats = "drops:\n  no_v2p: 0\ntap_queues:\n  a1:\n    guest_tx_dropped: 0\n\
                     uft_in:\n  hits: 3\n  misses: 0\nname: a1\nempty:\n";
        assert_eq!(without_zeros(stats), "uft_in:\n  hits: 3\nname: a1\n");
    }

    #[test]
    fn healthy_drops_are_explained_when_shown() {
        let stats = "drops:\n  link_local_only: 12\n  rs_rate_limited: 0\n  no_v2p: 1\n";
        let notes = healthy_drops(stats);
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            notes[0].starts_with("(link_local_only is normal: "),
            "{notes:?}"
        );
        assert!(healthy_drops("drops:\n  no_v2p: 3\n").is_empty());
    }
}
