//! TCP between guests on different sleds: every byte of a 200 MB transfer arrives
//! intact, and the underlay carries it as tunneled-TSO jumbo frames.

use e2e::capture::{Capture, Frame, OXIDE_OPTION_CLASS, OXIDE_OPTION_MSS};
use e2e::standard::{self, A1, B1, B2};
use e2e::xfer::transfer;
use e2e::{Error, Result};
use std::path::Path;
use std::time::Duration;

fn xfer_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_e2e-xfer"))
}

/// Ethernet header + the 9000-byte underlay MTU.
const MAX_UNDERLAY_FRAME: u32 = 14 + 9000;

/// The Geneve frames of a capture, more than `at_least` of them, and the longest,
/// which must fit the 9000-byte underlay (`what` names the run in the errors).
fn geneve_within_underlay<'f>(
    frames: &'f [Frame],
    at_least: usize,
    what: &str,
) -> Result<(Vec<&'f Frame>, u32)> {
    let geneve: Vec<_> = frames.iter().filter(|f| f.is_geneve()).collect();
    if geneve.len() <= at_least {
        return Err(Error::new(format!(
            "{what}: only {} Geneve frames",
            geneve.len()
        )));
    }
    let biggest = geneve.iter().map(|f| f.len).max().unwrap_or(0);
    if biggest > MAX_UNDERLAY_FRAME {
        return Err(Error::new(format!(
            "{what}: a {biggest}-byte frame exceeds the 9000-byte underlay"
        )));
    }
    Ok((geneve, biggest))
}

#[test]
fn tcp_200mb_across_sleds_arrives_intact() -> Result<()> {
    let rack = standard::rack("e2e", &[])?;
    let (a1, b1) = (rack.guest(A1)?, rack.guest(B1)?);
    let report = transfer(
        xfer_bin(),
        a1,
        b1,
        b1.ipv4()?,
        5201,
        200 * 1024 * 1024,
        Duration::from_secs(600),
    )?;
    eprintln!("200 MiB a1 -> b1 over IPv4: {report:?}");
    Ok(())
}

#[test]
fn tunneled_tso_rides_jumbo_frames_with_the_mss_option() -> Result<()> {
    let rack = standard::rack("e2e", &[])?;
    let (a1, b1, b2) = (rack.guest(A1)?, rack.guest(B1)?, rack.guest(B2)?);
    let sled0 = rack.sled(0)?;
    let file = rack.dir().join("tso.pcap");
    let cap = Capture::start(&rack.switch, &sled0.bridge_port, &file, "udp port 6081")?;
    transfer(
        xfer_bin(),
        a1,
        b1,
        b1.ipv4()?,
        5202,
        20 << 20,
        Duration::from_secs(120),
    )?;
    transfer(
        xfer_bin(),
        b2,
        a1,
        a1.ipv6()?,
        5203,
        20 << 20,
        Duration::from_secs(120),
    )?;
    let frames = cap.stop()?;
    let (geneve, biggest) = geneve_within_underlay(&frames, 1000, "")?;
    // TSO cut the guests' 64 KiB buffers into segments that fill the underlay: far
    // larger than the guest's own 8500 MTU would give through a 1500-byte path.
    assert!(
        biggest > 8500,
        "largest Geneve frame is only {biggest} bytes"
    );
    for f in &geneve {
        assert_eq!(f.vni, Some(10), "wrong VNI: {f:?}");
        assert!(
            f.ipv6_src.first() == Some(&rack.sled(0)?.addr)
                || f.ipv6_src.first() == Some(&rack.sled(1)?.addr),
            "outer source is not a sled: {f:?}"
        );
    }
    let with_mss = geneve
        .iter()
        .filter(|f| f.has_option(OXIDE_OPTION_CLASS, OXIDE_OPTION_MSS))
        .count();
    assert!(
        with_mss > 100,
        "only {with_mss} frames carry the Oxide Mss option"
    );
    let full = geneve
        .iter()
        .filter(|f| f.len == MAX_UNDERLAY_FRAME)
        .count();
    assert!(full > 100, "only {full} frames fill the underlay exactly");

    // Both directions of the data went through the sender's daemon as TSO buffers.
    for sled in [rack.sled(0)?, rack.sled(1)?] {
        let counters = e2e::stats::parse(&sled.admin(&["--json", "stats"])?)?;
        let buffers = e2e::stats::sum(&counters, e2e::stats::TSO_BUFFERS);
        let segments = e2e::stats::sum(&counters, e2e::stats::TSO_SEGMENTS);
        assert!(
            buffers > 0 && segments > buffers,
            "sled {}: {buffers} TSO buffers in, {segments} segments out; counters: {counters:?}",
            sled.index
        );
    }
    Ok(())
}

/// `--underlay-gso off` and `on` carry the same bulk TCP byte for byte. With `on`
/// every guest TSO buffer leaves as UDP-tunnel GSO super-frames written to the
/// underlay's tunnel tap, which the kernel cuts into the frames the datapath cuts
/// with `off`: the switch sees only frames that fit the underlay, filling it as
/// before. With `off` no super-frame is made.
#[test]
fn underlay_gso_on_and_off_carry_bulk_tcp_intact() -> Result<()> {
    for mode in ["off", "on"] {
        let rack = standard::rack("e2e", &["--underlay-gso", mode])?;
        let (a1, b1) = (rack.guest(A1)?, rack.guest(B1)?);
        let sled0 = rack.sled(0)?;
        let file = rack.dir().join(format!("gso-{mode}.pcap"));
        let cap = Capture::start(&rack.switch, &sled0.bridge_port, &file, "udp port 6081")?;
        transfer(
            xfer_bin(),
            a1,
            b1,
            b1.ipv4()?,
            5204,
            50 << 20,
            Duration::from_secs(300),
        )?;
        let frames = cap.stop()?;
        let (geneve, _) = geneve_within_underlay(&frames, 5000, mode)?;
        let full = geneve
            .iter()
            .filter(|f| f.len == MAX_UNDERLAY_FRAME)
            .count();
        assert!(full > 1000, "{mode}: only {full} frames fill the underlay");

        let json = sled0.admin(&["--json", "stats"])?;
        let counters = e2e::stats::parse(&json)?;
        let buffers = e2e::stats::sum(&counters, e2e::stats::TSO_BUFFERS);
        let segments = e2e::stats::sum(&counters, e2e::stats::TSO_SEGMENTS);
        let supers = e2e::stats::sum(&counters, "tso_super_frames_out");
        let written = e2e::stats::sum(&counters, "underlay_gso_tx_frames");
        let refused = e2e::stats::sum(&counters, "underlay_gso_tx_errors");
        let summary = format!(
            "{mode}: {buffers} TSO buffers, {segments} segments, {supers} super-frames, \
             {written} written, {refused} refused"
        );
        eprintln!("{summary}");
        assert!(segments > buffers && buffers > 100, "{summary}");
        let stats: serde_json::Value = serde_json::from_str(&json)
            .map_err(|e| Error::new(format!("stats are not JSON: {e}")))?;
        let path = &stats["data"]["underlay"][0]["tx_path"];
        if mode == "on" {
            assert!(supers > 100 && supers <= buffers, "{summary}");
            assert_eq!(written + refused, supers, "{summary}");
            assert_eq!(path, "tunnel-gso", "{stats}");
        } else {
            assert_eq!((supers, written, refused), (0, 0, 0), "{summary}");
            assert_eq!(path, "af-xdp", "{stats}");
        }
    }
    Ok(())
}
