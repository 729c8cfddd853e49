//! A daemon restarted while a guest's namespace is missing: the saved port is kept
//! and shown as not applied (with the reason), and once the namespace exists again
//! the daemon puts the port back by itself, under the firewall rules saved for it,
//! not the looser defaults a new port gets.

use e2e::standard::{self, A1, A2};
use e2e::{poll_until, stats, Error, Guest, Result, Sled};
use serde_json::Value;
use std::time::Duration;

const FIRST_REPLY: Duration = Duration::from_secs(20);
/// How long the daemon may take to notice the namespace (it looks every 100 ms).
const NOTICE: Duration = Duration::from_secs(10);

/// Inbound TCP to 5201 only: a ping from another guest of the VPC is dropped, where
/// the defaults (and the standard rack's rules) let it in.
const ONLY_TCP_5201: &str = "direction=in priority=10 action=allow host=any proto=tcp ports=5201";

fn json(out: &str) -> Result<Value> {
    serde_json::from_str(out).map_err(|e| Error::new(format!("not JSON ({e}): {out}")))
}

/// `not_applied` of `port` in `xdeadm --json list-ports` (null when applied).
fn not_applied(sled: &Sled, port: &str) -> Result<Value> {
    let v = json(&sled.admin(&["--json", "list-ports"])?)?;
    v["data"]
        .as_array()
        .and_then(|ports| ports.iter().find(|p| p["config"]["name"] == port))
        .map(|p| p["not_applied"].clone())
        .ok_or_else(|| Error::new(format!("{port} not listed: {v}")))
}

/// The firewall's rules as the engine holds them, without ids and hit counts.
fn fw_rules(sled: &Sled, port: &str) -> Result<Value> {
    let v = json(&sled.admin(&["--json", "dump-layer", port, "firewall"])?)?;
    let rules = |dir: &str| -> Vec<Value> {
        v["data"][dir]["rules"]
            .as_array()
            .map(|rs| {
                rs.iter()
                    .map(|r| serde_json::json!([r["priority"], r["predicates"], r["action"]]))
                    .collect()
            })
            .unwrap_or_default()
    };
    Ok(serde_json::json!({ "in": rules("inbound"), "out": rules("outbound") }))
}

#[test]
fn port_whose_netns_is_missing_at_start_comes_back_with_its_rules() -> Result<()> {
    let mut rack = standard::rack("rr", &[])?;
    rack.sled(0)?
        .admin(&["set-fw-rules", A2, "--rule", ONLY_TCP_5201])?;
    let saved = fw_rules(rack.sled(0)?, A2)?;
    assert_eq!(saved["in"].as_array().map(Vec::len), Some(1), "{saved}");

    // The daemon stops; a2's guest goes away with its namespace (and the tap in it).
    rack.stop_daemon(0)?;
    let at = rack
        .guests
        .iter()
        .position(|g| g.spec.name == A2)
        .ok_or_else(|| Error::new("no guest a2"))?;
    let a2 = rack.guests.remove(at);
    let (spec, ns_name) = (a2.spec.clone(), a2.ns.name().to_string());
    drop(a2);

    rack.start_daemon(0, &[])?;
    let sled0 = rack.sled(0)?;
    let na = not_applied(sled0, A2)?;
    let reason = na["reason"].as_str().unwrap_or_default();
    assert!(reason.contains(&ns_name), "{na}");
    assert!(not_applied(sled0, A1)?.is_null(), "a1 is applied");
    let listing = sled0.admin(&["list-ports"])?;
    assert!(
        listing
            .lines()
            .any(|l| l.starts_with(A2) && l.contains("NOT APPLIED")),
        "{listing}"
    );
    let st = json(&sled0.admin(&["--json", "stats"])?)?;
    assert_eq!(
        st["data"]["control"]["not_applied"]["ports"][0]["name"], A2,
        "{st}"
    );
    let e = sled0.admin(&["mtu", A2]).unwrap_err().to_string();
    assert!(e.contains("not applied"), "{e}");

    // The guest is back: the daemon notices the namespace and puts the port in it.
    let ns = Guest::namespace(&ns_name)?;
    rack.guests.push(Guest { spec, ns });
    let sled0 = rack.sled(0)?;
    poll_until("a2 to be applied", NOTICE, || {
        let na = not_applied(sled0, A2)?;
        if na.is_null() {
            Ok(())
        } else {
            Err(Error::new(na.to_string()))
        }
    })?;
    let (a1, a2) = (rack.guest(A1)?, rack.guest(A2)?);
    a2.configure_os()?;
    assert_eq!(
        fw_rules(sled0, A2)?,
        saved,
        "the saved rules, not the defaults"
    );
    // a2 reaches out (outbound allowed, the replies tracked back in)...
    a2.ping(a1.ipv4()?, 56, FIRST_REPLY)?;
    // ...but nothing its rules do not admit gets in.
    let denied = |sled: &Sled| -> Result<u64> {
        Ok(stats::sum(
            &stats::parse(&sled.admin(&["--json", "stats", A2])?)?,
            "fw_deny_in",
        ))
    };
    let before = denied(sled0)?;
    let o = a1.ping_once(a2.ipv4()?, 56)?;
    assert!(!o.status.success(), "a1 got through to a2: {}", o.stdout);
    assert!(denied(sled0)? > before, "the drop is not the firewall's");
    Ok(())
}
