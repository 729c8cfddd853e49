//! Loss before the datapath is counted where it happens: frames a guest sends while
//! its worker does not read them are dropped by the tap's queue, and `xdeadm stats`
//! reports that count for the port (`tap_queues.PORT.guest_tx_dropped`), the same
//! figure the guest's kernel shows for the tap.

use e2e::standard::{self, A1, B1};
use e2e::{Error, Result};
use serde_json::Value;
use std::time::Duration;

/// Datagrams sent while the daemon is stopped: three times the tap's 1000-frame queue.
const SENT: u32 = 3000;

#[test]
fn frames_the_tap_queue_drops_are_counted_for_the_port() -> Result<()> {
    let rack = standard::rack("tq", &[])?;
    let (a1, b1) = (rack.guest(A1)?, rack.guest(B1)?);
    a1.ping(b1.ipv4()?, 56, Duration::from_secs(20))?;
    let sled = rack.sled(0)?;
    let pid = sled
        .daemon()?
        .pid()
        .ok_or_else(|| Error::new("sled 0's daemon has no pid"))?;
    let signal = |sig: &str| -> Result<()> {
        e2e::cmd::Cmd::new("kill")
            .args([sig, &pid.to_string()])
            .run()
            .map(|_| ())
    };
    // The worker cannot read while the daemon is stopped: the tap's queue fills.
    signal("-STOP")?;
    let flood = a1.run(
        "python3",
        &[
            "-c",
            &format!(
                "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
                 for _ in range({SENT}):\n    s.sendto(b'x', ('{}', 9))",
                b1.ipv4()?
            ),
        ],
    );
    signal("-CONT")?;
    flood?;
    let stats: Value = serde_json::from_str(&sled.admin(&["--json", "stats", A1])?)
        .map_err(|e| Error::new(format!("stats: {e}")))?;
    let counted = stats["data"]["tap_queues"][A1]["guest_tx_dropped"]
        .as_u64()
        .ok_or_else(|| Error::new(format!("no tap_queues.{A1} in {stats}")))?;
    let link: Value =
        serde_json::from_str(&a1.run("ip", &["-j", "-s", "link", "show", "dev", a1.ifname()])?)
            .map_err(|e| Error::new(format!("ip -j: {e}")))?;
    let kernel = link[0]["stats64"]["tx"]["dropped"]
        .as_u64()
        .ok_or_else(|| Error::new(format!("no tx dropped in {link}")))?;
    assert!(
        counted >= u64::from(SENT) - 1000,
        "{counted} counted of {SENT} sent into a 1000-frame queue"
    );
    assert_eq!(counted, kernel, "stats and the guest's kernel disagree");
    Ok(())
}
