//! A daemon restart (SIGTERM, then a new overlayd on the same state directory) keeps
//! the guests' links: the taps are persistent, the new daemon reattaches them and
//! restores ports, V2P and rules from its state, and traffic resumes.

use e2e::standard::{self, A1, A2, B1};
use e2e::Result;
use std::time::Duration;

const FIRST_REPLY: Duration = Duration::from_secs(20);

#[test]
fn restarted_daemon_restores_ports_and_traffic_resumes() -> Result<()> {
    let mut rack = standard::rack("rs", &[])?;
    {
        let (a1, b1) = (rack.guest(A1)?, rack.guest(B1)?);
        a1.ping(b1.ipv4()?, 56, FIRST_REPLY)?;
    }
    let before = rack.sled(0)?.admin(&["--json", "list-ports"])?;

    rack.restart_daemon(0, &[])?;

    let after = rack.sled(0)?.admin(&["--json", "list-ports"])?;
    // A restored port is `ready` until it carries a frame again (states are
    // counted from the restore), so the comparison leaves the state out.
    let without_state = |s: &str| -> Result<serde_json::Value> {
        let mut v: serde_json::Value = serde_json::from_str(s)
            .map_err(|e| e2e::Error::new(format!("list-ports is not JSON ({e}): {s}")))?;
        for p in v["data"].as_array_mut().into_iter().flatten() {
            let state = p.as_object_mut().and_then(|m| m.remove("state"));
            assert!(
                matches!(
                    state.as_ref().and_then(|s| s.as_str()),
                    Some("ready" | "running")
                ),
                "{state:?}"
            );
        }
        Ok(v)
    };
    assert_eq!(
        without_state(&before)?,
        without_state(&after)?,
        "ports restored as they were"
    );
    let v2p = rack.sled(0)?.admin(&["dump-v2p"])?;
    let b1 = rack.guest(B1)?;
    assert!(
        v2p.contains(&b1.ipv4()?.to_string()),
        "V2P restored:\n{v2p}"
    );
    let a1 = rack.guest(A1)?;
    let a2 = rack.guest(A2)?;
    // Across sleds, both ways (the other sled's flows toward us recompile), and
    // within the restarted sled.
    a1.ping(b1.ipv4()?, 8472, FIRST_REPLY)?;
    b1.ping(a1.ipv6()?, 56, FIRST_REPLY)?;
    a2.ping(a1.ipv4()?, 56, FIRST_REPLY)?;
    Ok(())
}

#[test]
fn deleted_port_takes_its_tap_and_traffic_with_it() -> Result<()> {
    let rack = standard::rack("dl", &[])?;
    let (a1, a2) = (rack.guest(A1)?, rack.guest(A2)?);
    a2.ping(a1.ipv4()?, 56, FIRST_REPLY)?;
    rack.sled(0)?.admin(&["delete-xde", A2])?;
    let ports = rack.sled(0)?.admin(&["list-ports"])?;
    assert!(!ports.lines().any(|l| l.starts_with(A2)), "{ports}");
    // The tap is gone from the guest's namespace.
    assert!(a2.run("ip", &["link", "show", A2]).is_err());
    // Deleting it again names it.
    let err = rack.sled(0)?.admin(&["delete-xde", A2]).unwrap_err();
    assert!(err.to_string().contains(A2), "{err}");
    // The remaining guest still works.
    a1.ping(rack.guest(B1)?.ipv4()?, 56, FIRST_REPLY)?;
    Ok(())
}
