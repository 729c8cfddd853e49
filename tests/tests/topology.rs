//! The harness itself, without daemons: the rack's underlay is a 9000-byte IPv6
//! network between sleds, and everything the rack created disappears on drop.

use e2e::{Cmd, Rack, RackSpec, Result};

fn netns_names() -> Result<Vec<String>> {
    Ok(Cmd::new("ip")
        .args(["netns", "list"])
        .run()?
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect())
}

#[test]
fn rack_underlay_carries_9000_byte_packets_and_is_removed_on_drop() -> Result<()> {
    let rack = Rack::build(&RackSpec::new("e2e", 3))?;
    // `build` already pinged every pair with a 9000-byte packet; one byte more must
    // not fit (DF is implied for IPv6 and -M do forbids local fragmentation).
    let (a, b) = (rack.sled(0)?, rack.sled(2)?);
    let too_big = a.ns.output(
        "ping",
        &[
            "-6",
            "-c",
            "1",
            "-W",
            "1",
            "-M",
            "do",
            "-s",
            "8953",
            &b.addr.to_string(),
        ],
    )?;
    assert!(
        !too_big.status.success(),
        "a 9001-byte packet crossed a 9000-byte underlay: {}",
        too_big.stdout
    );
    let mtu = rack.switch.ip(&["-o", "link", "show", e2e::rack::BRIDGE])?;
    assert!(mtu.contains("mtu 9000"), "bridge: {mtu}");
    let ns: Vec<String> = [rack.switch.name(), a.ns.name(), b.ns.name()]
        .iter()
        .map(std::string::ToString::to_string)
        .collect();
    let existing = netns_names()?;
    for n in &ns {
        assert!(existing.contains(n), "{n} missing from {existing:?}");
    }
    drop(rack);
    let remaining = netns_names()?;
    for n in &ns {
        assert!(!remaining.contains(n), "{n} left behind after drop");
    }
    Ok(())
}

#[test]
fn rack_is_removed_when_a_test_panics() -> Result<()> {
    let mut names = Vec::new();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let rack = Rack::build(&RackSpec::new("e2e", 2)).expect("rack");
        names.push(rack.switch.name().to_string());
        names.extend(rack.sleds.iter().map(|s| s.ns.name().to_string()));
        panic!("deliberate panic with a rack alive");
    }));
    assert!(outcome.is_err());
    assert_eq!(names.len(), 3);
    let remaining = netns_names()?;
    for n in &names {
        assert!(!remaining.contains(n), "{n} left behind after a panic");
    }
    Ok(())
}

/// The capture path the datapath tests rely on: a Geneve frame with an Oxide Mss
/// option, built by scapy on sled 0, is seen on the bridge with its full length,
/// VNI and option decoded.
#[test]
fn bridge_capture_decodes_geneve_and_oxide_options() -> Result<()> {
    use e2e::capture::{Capture, OXIDE_OPTION_CLASS, OXIDE_OPTION_MSS};
    let rack = Rack::build(&RackSpec::new("e2e", 2))?;
    let (a, b) = (rack.sled(0)?, rack.sled(1)?);
    let file = rack.dir().join("geneve.pcap");
    let cap = Capture::start(&rack.switch, &b.bridge_port, &file, "udp port 6081")?;
    // 14 + 40 + 8 + 16 (Geneve + Mss option) + 14 + 20 + 8 + payload = 9014 on the wire.
    let script = format!(
        "from scapy.all import *\n\
         from scapy.contrib.geneve import GENEVE, GeneveOptions\n\
         opt = GeneveOptions(classid=0x0129, type=0x02, length=1, data=struct.pack('!I', 1448))\n\
         inner = Ether(src='a8:40:25:f0:00:01', dst='a8:40:25:f0:00:02')/IP(src='10.0.0.11', dst='10.0.0.12')/UDP(sport=1, dport=2)/Raw(b'x' * {payload})\n\
         f = Ether(dst='ff:ff:ff:ff:ff:ff')/IPv6(src='{src}', dst='{dst}')/UDP(sport=4242, dport=6081)/GENEVE(vni=10, proto=0x6558, options=opt)/inner\n\
         assert len(f) == 9014, len(f)\n\
         sendp(f, iface='{iface}', verbose=False)\n",
        payload = 9014 - 14 - 40 - 8 - 16 - 14 - 20 - 8,
        src = a.addr,
        dst = b.addr,
        iface = a.underlay_if,
    );
    a.ns.cmd("python3").stdin(script).arg("-").run()?;
    cap.wait_for(
        "the frame to be captured",
        std::time::Duration::from_secs(5),
        |f| !f.is_empty(),
    )?;
    let frames = cap.stop()?;
    assert_eq!(frames.len(), 1, "{frames:?}");
    let f = &frames[0];
    assert_eq!(f.len, 9014);
    assert_eq!(f.vni, Some(10));
    assert_eq!(f.ipv6_src, vec![a.addr]);
    assert!(f.has_option(OXIDE_OPTION_CLASS, OXIDE_OPTION_MSS), "{f:?}");
    Ok(())
}
