//! The fleet end to end (docs/fleet.md): four sleds whose daemons follow a
//! three-member etcd cluster over TLS, each with its own certificate and role.
//! Guest traffic flows exactly while the store maps the guests; a sled restarted
//! while the whole store is down forwards on its saved layer and later resumes
//! where it left off; bad values are refused key by key, counted once, while their
//! neighbours apply; a sled presenting the wrong or an expired certificate keeps
//! what it holds. Prints its timings (run with `--nocapture`).

use e2e::etcd::{sled_user, KEY_ROOT, WRITER};
use e2e::fleet::{FleetRack, Took, CONVERGE, MEMBERS};
use e2e::{poll_until, Error, Guest, GuestSpec, Result};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// The first packets of a pair may wait for underlay neighbour resolution.
const FIRST_REPLY: Duration = Duration::from_secs(20);

/// The drop of a frame to a guest no V2P mapping places.
const NO_V2P: &str = "no_v2p";

/// How long a counter may take to show a drop (workers publish their stats).
const COUNTED: Duration = Duration::from_secs(10);

/// A reconnect after the whole store was down: the watcher's back-off (full
/// jitter, capped at 30 s) may be anywhere up to its ceiling.
const RECONNECT: Duration = Duration::from_secs(90);

fn dual(name: &str, sled: usize, n: u8) -> GuestSpec {
    GuestSpec::dual(name, sled, n)
}

fn sorted(mut v: Vec<api::V2pEntry>) -> Vec<api::V2pEntry> {
    v.sort_by_key(|e| (e.vni, e.vpc_ip));
    v
}

fn counter(f: &FleetRack, sled: usize, name: &str) -> Result<u64> {
    f.rack.sled(sled)?.counter(None, name)
}

/// `from` pings `to` once: it must fail, and sled `sled` must count it as drop
/// `reason`.
fn ping_dropped(f: &FleetRack, from: &Guest, to: IpAddr, sled: usize, reason: &str) -> Result<()> {
    let before = counter(f, sled, reason)?;
    let out = from.ping_once(to, 56)?;
    if out.status.success() {
        return Err(Error::new(format!(
            "{} reached {to} without a V2P mapping: {}",
            from.spec.name, out.stdout
        )));
    }
    poll_until(
        &format!(
            "sled {sled} to count {reason} for {} -> {to}",
            from.spec.name
        ),
        COUNTED,
        || match counter(f, sled, reason)? {
            n if n > before => Ok(()),
            n => Err(Error::new(format!("{reason} still {n}"))),
        },
    )
}

#[test]
fn guests_talk_exactly_while_the_fleet_maps_them() -> Result<()> {
    let _took = Took::new("guests_talk_exactly_while_the_fleet_maps_them");
    let t = Instant::now();
    let mut f = FleetRack::start("fga", 4)?;
    let built = t.elapsed();
    let (a, c) = (dual("ga", 1, 1), dual("gc", 3, 3));
    // Another VPC on sled 0, and nothing on sled 2: neither may get VPC 10's keys.
    let x = dual("gx", 0, 5).vni(20);
    for g in [&a, &c, &x] {
        f.add_guest(g.clone())?;
    }
    for (sled, vnis) in [(0, vec![20]), (1, vec![10]), (2, vec![]), (3, vec![10])] {
        f.wait_status(sled, "watching the VPCs it hosts", CONVERGE, |s| {
            let got: Vec<u32> = s.vnis.iter().map(|v| v.get()).collect();
            match s.connected && got == vnis && s.last_error.is_none() {
                true => Ok(()),
                false => Err(Error::new(format!("VNIs {got:?}"))),
            }
        })?;
    }
    let (ga, gc) = (f.rack.guest("ga")?, f.rack.guest("gc")?);

    // Nothing published: no way across, and sled 1 says why.
    ping_dropped(&f, ga, gc.ipv4()?, 1, NO_V2P)?;
    ping_dropped(&f, ga, gc.ipv6()?, 1, NO_V2P)?;

    let t = Instant::now();
    let rev = f.publish(&[&a, &c])?;
    f.wait_converged(&[0, 1, 2, 3], rev, CONVERGE)?;
    let converged = t.elapsed();
    let both = sorted(f.v2p_of(&[&a, &c])?);
    for sled in [1, 3] {
        assert_eq!(f.fleet_v2p(sled)?, both, "sled {sled}'s fleet mappings");
        assert_eq!(f.fleet_status(sled)?.entries.v2p, both.len());
    }
    for sled in [0, 2] {
        assert_eq!(
            f.fleet_v2p(sled)?,
            vec![],
            "sled {sled} hosts no port in VPC 10"
        );
        assert_eq!(f.fleet_status(sled)?.entries.v2p, 0);
    }
    let t = Instant::now();
    ga.ping(gc.ipv4()?, 56, FIRST_REPLY)?;
    let first_reply = t.elapsed();
    ga.ping(gc.ipv6()?, 56, FIRST_REPLY)?;
    gc.ping(ga.ipv4()?, 56, FIRST_REPLY)?;
    gc.ping(ga.ipv6()?, 56, FIRST_REPLY)?;

    // gc's mappings go: sled 1 no longer sends to it, nor takes its frames (the
    // inner source must be where V2P says it lives).
    let t = Instant::now();
    let rev = f.unpublish(&[&c])?;
    f.wait_converged(&[1, 3], rev, CONVERGE)?;
    let deleted = t.elapsed();
    let only_a = sorted(f.v2p_of(&[&a])?);
    for sled in [1, 3] {
        assert_eq!(f.fleet_v2p(sled)?, only_a, "sled {sled} after the delete");
    }
    ping_dropped(&f, ga, gc.ipv4()?, 1, NO_V2P)?;
    ping_dropped(&f, ga, gc.ipv6()?, 1, NO_V2P)?;
    ping_dropped(&f, gc, ga.ipv4()?, 1, "underlay_src_mismatch")?;
    for sled in 0..4 {
        let s = f.fleet_status(sled)?;
        assert_eq!((s.resyncs, s.refused.len()), (0, 0), "sled {sled}: {s:?}");
        // Each sled keeps its status key, of the cluster it follows.
        let key = f.status_key(sled)?;
        assert!(
            key.as_ref()
                .is_some_and(|k| k.cluster_id == s.cluster_id && k.revision > 0),
            "sled {sled}'s status key: {key:?}"
        );
    }
    eprintln!(
        "fleet rack (4 sleds, 3 members) up in {built:.2?}; a publish reached every sled \
         in {converged:.2?}, first reply {first_reply:.2?} later; a delete reached sleds 1 \
         and 3 in {deleted:.2?}"
    );
    Ok(())
}

#[test]
fn a_sled_restarted_while_the_store_is_down_forwards_at_once_and_resumes_later() -> Result<()> {
    let _took =
        Took::new("a_sled_restarted_while_the_store_is_down_forwards_at_once_and_resumes_later");
    let mut f = FleetRack::start("fgr", 4)?;
    let (a, c) = (dual("ga", 1, 1), dual("gc", 3, 3));
    f.add_guest(a.clone())?;
    f.add_guest(c.clone())?;
    // Ten more guests on sled 2 (no ports: mappings only).
    let others: Vec<GuestSpec> = (20..30)
        .map(|n| GuestSpec::v4(&format!("o{n}"), 2, n))
        .collect();
    let mut all: Vec<&GuestSpec> = vec![&a, &c];
    all.extend(&others);
    let rev = f.publish(&all)?;
    f.wait_converged(&[1, 3], rev, CONVERGE)?;
    let saved = sorted(f.v2p_of(&all)?);
    assert_eq!(f.fleet_v2p(3)?, saved);
    let (ga, gc) = (f.rack.guest("ga")?, f.rack.guest("gc")?);
    gc.ping(ga.ipv4()?, 56, FIRST_REPLY)?;

    // Sled 3 stops (SIGTERM: its layer is saved) and the store changes meanwhile.
    assert!(f.status_key(3)?.is_some());
    f.rack.stop_daemon(3)?;
    // A clean stop revokes the status key's lease: the key goes at once.
    assert_eq!(f.status_key(3)?, None, "sled 3 stopped");
    let added = GuestSpec::v4("o40", 2, 40);
    let gone = &others[0];
    let changed = f.load(&f.v2p_of(&[&added])?, &f.v2p_of(&[gone])?)?;
    assert!(changed > rev);
    // Then the whole store goes down.
    for i in 0..MEMBERS {
        f.etcd.kill(i)?;
    }

    let spawned = Instant::now();
    f.start_daemon(3)?;
    let answering = spawned.elapsed();
    let (ga, gc) = (f.rack.guest("ga")?, f.rack.guest("gc")?);
    // The first answer comes after the saved layer is restored: no waiting here.
    assert_eq!(f.fleet_v2p(3)?, saved, "the saved fleet mappings");
    let restored = spawned.elapsed();
    gc.ping(ga.ipv4()?, 56, FIRST_REPLY)?;
    let forwarding = spawned.elapsed();
    ga.ping(gc.ipv6()?, 56, FIRST_REPLY)?;
    eprintln!(
        "sled 3 restarted with every etcd member down: API answering {answering:.2?} after \
         the spawn, fleet mappings shown {restored:.2?}, first reply gc -> ga {forwarding:.2?}"
    );
    // docs/fleet.md: a restart with the store down forwards on the last known
    // state at once. Seen: 0.17-0.34 s from the spawn, also with two CPU hogs
    // beside two fleet tests on the 2-core machine.
    assert!(
        forwarding < Duration::from_secs(1),
        "forwarding on the saved layer took {forwarding:.2?} from the daemon's spawn"
    );
    let s = f.wait_status(3, "a failed connection", CONVERGE, |s| {
        match !s.connected && s.last_error.is_some() {
            true => Ok(()),
            false => Err(Error::new("no connection error yet")),
        }
    })?;
    assert!(
        s.revision >= rev && s.revision < changed,
        "resumes from its saved revision (>= {rev}, < {changed}): {s:?}"
    );
    assert_eq!((s.resyncs, s.entries.v2p), (0, saved.len()), "{s:?}");

    // The store comes back: the sled reconnects, resumes from its saved revision
    // (the change made while it was down arrives as events), no full read.
    let t = Instant::now();
    f.etcd.restart_all()?;
    let store_back = t.elapsed();
    f.wait_converged(&[3], changed, RECONNECT)?;
    let resumed = t.elapsed();
    let s = f.fleet_status(3)?;
    assert_eq!(s.resyncs, 0, "a full resync: {s:?}");
    let mut now: Vec<&GuestSpec> = all
        .iter()
        .copied()
        .filter(|g| g.name != gone.name)
        .collect();
    now.push(&added);
    assert_eq!(f.fleet_v2p(3)?, sorted(f.v2p_of(&now)?));
    let log = f.log(3)?;
    assert!(!log.contains("fleet full resync"), "{log}");
    gc.ping(ga.ipv4()?, 56, FIRST_REPLY)?;
    // The other sleds came back on their live sessions too.
    f.wait_converged(&[0, 1, 2], changed, RECONNECT)?;
    for sled in 0..4 {
        assert_eq!(f.fleet_status(sled)?.resyncs, 0, "sled {sled}");
    }
    eprintln!(
        "store restarted and healthy in {store_back:.2?}; sled 3 current at revision \
         {changed} {resumed:.2?} after the restart began"
    );
    Ok(())
}

/// A V2P value with a valid MAC and `underlay`.
fn mapping(underlay: &str) -> String {
    format!(r#"{{"mac": "a8:40:25:f0:00:30", "underlay": "{underlay}"}}"#)
}

#[test]
fn bad_values_are_refused_by_reason_once_while_their_neighbours_apply() -> Result<()> {
    let _took = Took::new("bad_values_are_refused_by_reason_once_while_their_neighbours_apply");
    let mut f = FleetRack::start("fgb", 4)?;
    let (a, c) = (dual("ga", 1, 1), dual("gc", 3, 3));
    f.add_guest(a.clone())?;
    f.add_guest(c.clone())?;
    let rev = f.publish(&[&a, &c])?;
    f.wait_converged(&[0, 1, 2, 3], rev, CONVERGE)?;

    let good = f.rack.sled(2)?.addr.to_string();
    let vpc = format!("{KEY_ROOT}vpc/10/v2p/");
    let big = format!(
        r#"{{"mac": "a8:40:25:f0:00:30", "underlay": "{good}", "pad": "{}"}}"#,
        "x".repeat(4200)
    );
    // (key, value, reason): every sled hosting VPC 10 refuses these.
    let bad_v2p = [
        (format!("{vpc}10.0.0.62"), big, "too_large"),
        (
            format!("{vpc}10.0.0.63"),
            r#"{"mac": 48, "underlay": ["fd00:99::3"]}"#.to_string(),
            "shape",
        ),
        (
            format!("{vpc}10.0.0.64"),
            mapping("ff02::1"),
            "underlay_address",
        ),
        (format!("{vpc}10.0.0.65"), mapping("::"), "underlay_address"),
        (format!("{vpc}10.0.0.300"), mapping(&good), "key"),
    ];
    // Every sled reads V2B.
    let bad_v2b = (
        format!("{KEY_ROOT}v2b/0.0.0.0/0"),
        r#"{"endpoints": ["ff02::2"]}"#.to_string(),
        "underlay_address",
    );
    let neighbours = [
        (format!("{vpc}10.0.0.61"), mapping(&good)),
        (format!("{vpc}fd00:1::61"), mapping(&good)),
        (
            format!("{KEY_ROOT}v2b/::/0"),
            r#"{"endpoints": ["fd00:99::b1"]}"#.to_string(),
        ),
    ];
    // A VPC of 2^24 cannot be hosted, so no sled watches (or may read) its keys.
    let beyond = (
        format!("{KEY_ROOT}vpc/16777216/v2p/10.0.0.66"),
        mapping(&good),
    );
    let mut puts: Vec<(&str, &str)> = Vec::new();
    for (i, (k, v, _)) in bad_v2p.iter().chain([&bad_v2b]).enumerate() {
        puts.push((k, v));
        if let Some((k, v)) = neighbours.get(i) {
            puts.push((k, v));
        }
    }
    puts.push((&beyond.0, &beyond.1));
    let txn = f.etcd.put_txn(WRITER, &puts)?;
    f.wait_converged(&[0, 1, 2, 3], txn, CONVERGE)?;

    let refused_of = |sled: usize| -> Result<BTreeMap<String, (String, i64)>> {
        Ok(f.fleet_status(sled)?
            .refused
            .into_iter()
            .map(|r| (r.key, (r.reason, r.mod_revision)))
            .collect())
    };
    let expect_vpc: BTreeMap<String, (String, i64)> = bad_v2p
        .iter()
        .chain([&bad_v2b])
        .map(|(k, _, r)| (k.clone(), (r.to_string(), txn)))
        .collect();
    let expect_v2b: BTreeMap<String, (String, i64)> =
        BTreeMap::from([(bad_v2b.0.clone(), (bad_v2b.2.to_string(), txn))]);
    let counts = |pairs: &[(&str, u64)]| -> Vec<(String, u64)> {
        pairs.iter().map(|(r, n)| (r.to_string(), *n)).collect()
    };
    let vpc_metrics = counts(&[
        ("key", 1),
        ("shape", 1),
        ("too_large", 1),
        ("underlay_address", 3),
    ]);
    let v2b_metrics = counts(&[("underlay_address", 1)]);
    let neighbour_ips: Vec<IpAddr> = ["10.0.0.61", "fd00:1::61"]
        .iter()
        .map(|s| s.parse().expect("an address"))
        .collect();
    for (sled, refused, metrics, v2p) in [
        (0, &expect_v2b, &v2b_metrics, 0),
        (1, &expect_vpc, &vpc_metrics, 6),
        (2, &expect_v2b, &v2b_metrics, 0),
        (3, &expect_vpc, &vpc_metrics, 6),
    ] {
        assert_eq!(&refused_of(sled)?, refused, "sled {sled}'s refused keys");
        assert_eq!(&f.refused_metrics(sled)?, metrics, "sled {sled}'s metrics");
        let s = f.fleet_status(sled)?;
        assert_eq!(
            (s.entries.v2p, s.entries.v2b),
            (v2p, 1),
            "sled {sled}: {s:?}"
        );
        let held = f.fleet_v2p(sled)?;
        for ip in &neighbour_ips {
            assert_eq!(
                held.iter().any(|e| e.vpc_ip == *ip),
                v2p > 0,
                "sled {sled}: the good neighbour {ip} in {held:?}"
            );
        }
        assert!(held.iter().all(|e| e.vni.get() == 10), "{held:?}");
    }
    let logged =
        |sled: usize| -> Result<usize> { Ok(f.log(sled)?.matches("fleet entry refused").count()) };
    assert_eq!(logged(1)?, 6);

    // Not tried again while the keys stay as they are: not on a change elsewhere,
    // not on a full read (the same keys at the same mod revisions), not over a few
    // seconds of the store's progress notifications.
    let rev = f.writer(
        &["set-v2p", "10.0.0.70", "a8:40:25:f0:00:46", &good, "10"],
        None,
    )?;
    f.rack.sled(1)?.admin(&["fleet", "resync"])?;
    f.wait_status(
        1,
        "a full resync past the last change",
        CONVERGE,
        |s| match s.resyncs == 1 && s.connected && s.revision >= rev {
            true => Ok(()),
            false => Err(Error::new("not yet")),
        },
    )?;
    let watch_for = Duration::from_secs(4);
    let t = Instant::now();
    let mut samples = 0;
    while t.elapsed() < watch_for {
        for (sled, refused, metrics) in [
            (1, &expect_vpc, &vpc_metrics),
            (3, &expect_vpc, &vpc_metrics),
        ] {
            assert_eq!(
                &refused_of(sled)?,
                refused,
                "sled {sled}, {:.1?} on",
                t.elapsed()
            );
            assert_eq!(
                &f.refused_metrics(sled)?,
                metrics,
                "sled {sled}, {:.1?} on",
                t.elapsed()
            );
        }
        samples += 1;
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(logged(1)?, 6, "refusals logged again");
    assert_eq!(logged(3)?, 6, "refusals logged again");
    let s1 = f.fleet_status(1)?;
    assert!(s1.revision >= rev && s1.entries.v2p == 7, "{s1:?}");

    // A refused key that changes is tried again.
    let fixed = f
        .etcd
        .put_txn(WRITER, &[(&bad_v2p[1].0, &mapping(&good))])?;
    f.wait_converged(&[1, 3], fixed, CONVERGE)?;
    for sled in [1, 3] {
        let refused = refused_of(sled)?;
        assert!(!refused.contains_key(&bad_v2p[1].0), "{refused:?}");
        assert_eq!(refused.len(), 5);
        let ip: IpAddr = "10.0.0.63".parse().expect("an address");
        assert!(f.fleet_v2p(sled)?.iter().any(|e| e.vpc_ip == ip));
    }
    eprintln!("refusals unchanged over {samples} samples in {watch_for:?}, after a full resync");
    Ok(())
}

#[test]
fn a_sled_with_a_wrong_or_expired_certificate_keeps_its_tables() -> Result<()> {
    let _took = Took::new("a_sled_with_a_wrong_or_expired_certificate_keeps_its_tables");
    let mut f = FleetRack::start("fgc", 4)?;
    let (a, c) = (dual("ga", 1, 1), dual("gc", 3, 3));
    f.add_guest(a.clone())?;
    f.add_guest(c.clone())?;
    f.publish(&[&a, &c])?;
    let rev = f.writer(&["set-v2b", "::/0", "fd00:99::b1"], None)?;
    f.wait_converged(&[0, 1, 2, 3], rev, CONVERGE)?;
    let held = f.fleet_v2p(3)?;
    let entries = f.fleet_status(3)?.entries;
    assert_eq!((entries.v2p, entries.v2b), (4, 1));

    // Sled 3 comes back with sled 0's certificate and name (a cloned image): sled 0
    // hosts no port in VPC 10 and was never granted it.
    f.rack.stop_daemon(3)?;
    let other = f.etcd.credentials(&sled_user(0))?;
    f.start_daemon_as(3, &other, &sled_user(0))?;
    let vpc10 = format!("{KEY_ROOT}vpc/10/");
    let s = f.wait_status(3, "permission denied on VPC 10", CONVERGE, |s| {
        match s.last_error.as_deref() {
            Some(e) if e.contains("permission denied") && e.contains(&vpc10) => Ok(()),
            _ => Err(Error::new("no such error yet")),
        }
    })?;
    eprintln!("with another sled's certificate: {:?}", s.last_error);
    assert_eq!(s.entries, entries, "{s:?}");
    assert_eq!(f.fleet_v2p(3)?, held);
    let (ga, gc) = (f.rack.guest("ga")?, f.rack.guest("gc")?);
    gc.ping(ga.ipv4()?, 56, FIRST_REPLY)?;

    // Sled 2 comes back with its own certificate, expired: it starts and forwards on
    // what it saved, and says why it does not connect (the date, which a member's
    // bare TLS alert would not), and keeps its V2B entry.
    f.rack.stop_daemon(2)?;
    let expired = f.etcd.expired_credentials(&sled_user(2))?;
    f.start_daemon_as(2, &expired, &sled_user(2))?;
    let s = f.wait_status(2, "a failed connection", CONVERGE, |s| {
        match !s.connected && s.last_error.is_some() {
            true => Ok(()),
            false => Err(Error::new("no connection error yet")),
        }
    })?;
    eprintln!("with an expired certificate: {:?}", s.last_error);
    let why = s.last_error.clone().unwrap_or_default();
    assert!(
        why.contains("not valid now") && why.contains(&expired.cert.display().to_string()),
        "{why}"
    );
    assert_eq!((s.entries.v2b, s.resyncs), (1, 0), "{s:?}");
    // It stays out: the next attempts fail the same way.
    let attempts = |s: &str| s.matches("fleet store session ended").count();
    let first = attempts(&f.log(2)?);
    poll_until("sled 2 to try again", RECONNECT, || {
        match attempts(&f.log(2)?) > first {
            true => Ok(()),
            false => Err(Error::new("one attempt so far")),
        }
    })?;
    let s = f.fleet_status(2)?;
    assert!(!s.connected && s.entries.v2b == 1, "{s:?}");
    Ok(())
}
