//! The fleet at scale and under faults (docs/fleet.md): ten thousand mappings at
//! once, steady churn and how long each change takes to reach every sled, the
//! store losing a follower and then its leader under churn, sleds cut off from the
//! store for a minute (with and without the history they missed compacted away), a
//! guest moving between sleds under a ping every 10 ms, and a long soak (ignored:
//! `cargo test --release -p e2e --test fleet_scale -- --ignored`).
//!
//! Latencies are measured, not polled for: each sled's daemon logs every batch of
//! changes it applies (`fleet batch applied`, at debug level), and the writer
//! ([`StoreClient`]) records when it sent each transaction, on the same clock.
//! Every figure is printed (run with `--nocapture`).

use api::V2pEntry;
use e2e::fleet::applied::applied_at;
use e2e::fleet::client::{delete_v2p, put_v2p};
use e2e::fleet::{Commit, Distribution, FleetRack, Took, CONVERGE};
use e2e::guest::Pings;
use e2e::soak::sample::{level, Sample};
use e2e::{poll_until, Error, GuestSpec, Result};
use fleet::Op;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

/// The first packets of a pair may wait for underlay neighbour resolution.
const FIRST_REPLY: Duration = Duration::from_secs(20);

/// A reconnect after the sled's member went away: the watcher's back-off (full
/// jitter, capped at 30 s) may be anywhere up to its ceiling.
const RECONNECT: Duration = Duration::from_secs(90);

/// The VPC every test maps into (every guest's, by default).
const VNI: u32 = 10;

/// The longest a churn may wait for one step (a member restarting under it).
const CHURN_STEP: Duration = Duration::from_secs(120);

/// Mapping number `i` (not a guest's address: fd00:1::1:0 on), its `generation`
/// choosing its MAC and underlay among the rack's four sled addresses, so a
/// rewrite changes the value.
fn mapping(i: u32, generation: u32) -> V2pEntry {
    let [_, hi, mid, lo] = i.to_be_bytes();
    let g = generation.to_be_bytes()[3];
    let mac = format!("a8:40:25:{:02x}:{mid:02x}:{lo:02x}", 0x80 | (hi ^ g) & 0x7f);
    V2pEntry {
        vpc_ip: IpAddr::V6(Ipv6Addr::new(
            0xfd00,
            1,
            0,
            0,
            0,
            0,
            1 + u16::from(hi),
            u16::from_be_bytes([mid, lo]),
        )),
        vpc_mac: mac.parse().expect("a MAC"),
        underlay_ip: e2e::rack::sled_underlay_addr(((i + generation) % 4) as usize),
        vni: api::Vni::new(VNI).expect("a VNI"),
    }
}

fn sorted(mut v: Vec<V2pEntry>) -> Vec<V2pEntry> {
    v.sort_by_key(|e| (e.vni, e.vpc_ip));
    v
}

/// A guest in VPC 10 on each of `sleds` (IPv4 only, numbered from 1): each
/// sled then watches the VPC.
fn one_guest_per_sled(f: &mut FleetRack, sleds: usize) -> Result<Vec<GuestSpec>> {
    let mut specs = Vec::new();
    for sled in 0..sleds {
        let n = u8::try_from(sled + 1).expect("a few sleds");
        let g = GuestSpec::v4(&format!("g{sled}"), sled, n);
        f.add_guest(g.clone())?;
        specs.push(g);
    }
    Ok(specs)
}

/// Waits until each of `sleds` is connected and watches VPC 10.
fn wait_watching(f: &FleetRack, sleds: &[usize]) -> Result<()> {
    for &sled in sleds {
        f.wait_status(sled, "watching VPC 10", CONVERGE, |s| {
            match s.connected && s.vnis.iter().any(|v| v.get() == VNI) {
                true => Ok(()),
                false => Err(Error::new("not yet")),
            }
        })?;
    }
    Ok(())
}

/// Requires every sled of `sleds` to hold exactly `store` from the fleet.
fn assert_tables(f: &FleetRack, sleds: &[usize], store: &[V2pEntry], when: &str) -> Result<()> {
    for &sled in sleds {
        let held = f.fleet_v2p(sled)?;
        if held != store {
            let missing: Vec<_> = store.iter().filter(|e| !held.contains(e)).collect();
            let extra: Vec<_> = held.iter().filter(|e| !store.contains(e)).collect();
            return Err(Error::new(format!(
                "{when}: sled {sled} holds {} fleet mappings, the store {}; missing or \
                 stale {} (first {:?}), extra or stale {} (first {:?})",
                held.len(),
                store.len(),
                missing.len(),
                missing.first(),
                extra.len(),
                extra.first()
            )));
        }
    }
    Ok(())
}

/// How long after `since` each sled of `sleds` applied each of `commits` (one
/// change each), from the sleds' logs, all sleds together; and per sled.
fn latencies(
    f: &FleetRack,
    sleds: &[usize],
    commits: &[Commit],
    since: SystemTime,
) -> Result<(Distribution, Vec<Distribution>)> {
    let writes: Vec<(usize, i64)> = commits.iter().map(|c| (1, c.revision)).collect();
    let mut all = Vec::new();
    let mut each = Vec::new();
    for &sled in sleds {
        let at = applied_at(&writes, &f.applied_batches(sled)?, since)
            .map_err(|e| e.context(format!("sled {sled}'s log")))?;
        let d = Distribution::between(commits.iter().map(|c| c.sent).zip(at));
        all.extend_from_slice(d.seconds());
        each.push(d);
    }
    Ok((Distribution::new(all), each))
}

/// Waits until `done` reaches `n` (a churn running beside).
fn wait_churned(done: &AtomicUsize, n: usize) -> Result<()> {
    poll_until(
        &format!("the churn to reach {n} changes"),
        CHURN_STEP,
        || match done.load(Ordering::SeqCst) {
            d if d >= n => Ok(()),
            d => Err(Error::new(format!("{d} so far"))),
        },
    )
}

/// `n` single-key changes over the mappings `0..keys`, starting from `present`
/// (the keys that exist), drawn with a fixed seed: a key that exists is deleted
/// one time in `delete_one_in`, else rewritten; one that does not is created. Every
/// delete removes a key, so every change is one event.
fn churn_plan(n: usize, keys: u32, present: &mut [bool], delete_one_in: u64) -> Vec<Vec<Op>> {
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        // xorshift64
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    (0..n)
        .map(|k| {
            let i = (next() % u64::from(keys)) as u32;
            let at = i as usize;
            let generation = u32::try_from(k).expect("a few changes") + 1;
            if present[at] && next() % delete_one_in == 0 {
                present[at] = false;
                vec![delete_v2p(&mapping(i, generation))]
            } else {
                present[at] = true;
                vec![put_v2p(&mapping(i, generation)).expect("a valid mapping")]
            }
        })
        .collect()
}

/// Writes `entries` through the writer, `xdeadm fleet load FILE`, in one file in
/// the rack's directory; returns the revision.
fn load_file(f: &FleetRack, entries: &[V2pEntry], name: &str) -> Result<i64> {
    let path = f.rack.dir().join(name);
    let doc = serde_json::json!({ "v2p": entries });
    std::fs::write(&path, doc.to_string())?;
    f.writer(&["load", &path.display().to_string()], None)
}

fn seconds(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

fn since(t: SystemTime, at: SystemTime) -> f64 {
    match at.duration_since(t) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}

/// docs/fleet.md promises a change on every sled within a second; the issue asks
/// for ten thousand mappings on every sled within 10 s of the last commit.
const LOAD_CONVERGE: Duration = Duration::from_secs(10);

#[test]
fn ten_thousand_mappings_loaded_at_once_reach_every_sled_in_full() -> Result<()> {
    let _took = Took::new("ten_thousand_mappings_loaded_at_once_reach_every_sled_in_full");
    let mut f = FleetRack::start("fsl", 4)?;
    one_guest_per_sled(&mut f, 4)?;
    let sleds = [0, 1, 2, 3];
    wait_watching(&f, &sleds)?;
    let rss_before: Vec<u64> = sleds.iter().map(|&s| f.rss_kib(s)).collect::<Result<_>>()?;

    let entries: Vec<V2pEntry> = (0..10_000).map(|i| mapping(i, 0)).collect();
    let expected = sorted(entries.clone());
    let began = SystemTime::now();
    let t = Instant::now();
    let rev = load_file(&f, &entries, "v2p-10000.json")?;
    let committed = Instant::now();
    let committed_at = SystemTime::now();
    let loaded = t.elapsed();

    // Every sled current at the last revision within 10 s of the last commit.
    let mut converged = Vec::new();
    for &sled in &sleds {
        let left = LOAD_CONVERGE.saturating_sub(committed.elapsed());
        f.wait_converged(&[sled], rev, left)
            .map_err(|e| e.context(format!("within {LOAD_CONVERGE:?} of the last commit")))?;
        converged.push(committed.elapsed());
    }
    let rss_after: Vec<u64> = sleds.iter().map(|&s| f.rss_kib(s)).collect::<Result<_>>()?;
    let client = f.store_client()?;
    let (store, _) = client.v2p(VNI)?;
    assert_eq!(store, expected, "the store holds what was loaded");
    assert_tables(&f, &sleds, &store, "after the load")?;

    // When each sled applied the last of the 10,000 changes, from its log.
    let mut applied = Vec::new();
    for &sled in &sleds {
        let at = applied_at(&[(entries.len(), rev)], &f.applied_batches(sled)?, began)
            .map_err(|e| e.context(format!("sled {sled}'s log")))?;
        applied.push(at[0]);
    }
    eprintln!(
        "10,000 mappings loaded by `xdeadm fleet load` in {} (revision {rev}); each sled \
         applied the last change (log) at {} s from the load's start, {} s after the \
         writer returned; seen current (fleet status) {} after the writer returned",
        seconds(loaded),
        applied
            .iter()
            .map(|&a| format!("{:.2}", since(began, a)))
            .collect::<Vec<_>>()
            .join(", "),
        applied
            .iter()
            .map(|&a| format!("{:+.2}", since(committed_at, a)))
            .collect::<Vec<_>>()
            .join(", "),
        converged
            .iter()
            .map(|d| seconds(*d))
            .collect::<Vec<_>>()
            .join(", "),
    );
    eprintln!(
        "resident memory per sled before -> after (growth, bytes per mapping): {}",
        rss_before
            .iter()
            .zip(&rss_after)
            .map(|(b, a)| format!(
                "{b} -> {a} KiB ({:+} KiB, {:.0} B)",
                *a as i64 - *b as i64,
                (*a as f64 - *b as f64) * 1024.0 / entries.len() as f64
            ))
            .collect::<Vec<_>>()
            .join("; ")
    );
    // docs/fleet.md's model: ~300 bytes of heap per mapping (controller and one
    // engine). Three times that per sled, as resident memory, is room for the
    // allocator and the batches in flight; a copy per change held would not fit.
    for (i, (b, a)) in rss_before.iter().zip(&rss_after).enumerate() {
        let per_mapping = (*a as f64 - *b as f64) * 1024.0 / entries.len() as f64;
        assert!(
            per_mapping < 1024.0,
            "sled {i} grew {per_mapping:.0} bytes per mapping ({b} -> {a} KiB)"
        );
    }
    Ok(())
}

/// The bound on the 99th percentile of a change's way to a sled, steady churn.
/// docs/fleet.md promises a second; see docs/testing.md for the runs it rests on.
const P99_BOUND: Duration = Duration::from_secs(1);

#[test]
fn two_hundred_changes_at_five_a_second_each_reach_every_sled_within_a_second() -> Result<()> {
    let _took =
        Took::new("two_hundred_changes_at_five_a_second_each_reach_every_sled_within_a_second");
    let mut f = FleetRack::start("fsc", 4)?;
    one_guest_per_sled(&mut f, 4)?;
    let sleds = [0, 1, 2, 3];
    wait_watching(&f, &sleds)?;
    let client = f.store_client()?;

    let changes: Vec<Vec<Op>> = (0..200)
        .map(|i| put_v2p(&mapping(i, 0)).map(|op| vec![op]))
        .collect::<Result<_>>()?;
    let began = SystemTime::now();
    let t = Instant::now();
    let commits = client.churn(changes, 5.0, &AtomicUsize::new(0))?;
    let took = t.elapsed();
    let last = commits.last().map_or(0, |c| c.revision);
    f.wait_converged(&sleds, last, CONVERGE)?;
    let (store, _) = client.v2p(VNI)?;
    assert_eq!(store.len(), 200);
    assert_tables(&f, &sleds, &store, "after the churn")?;

    let (all, each) = latencies(&f, &sleds, &commits, began)?;
    let answered = Distribution::between(commits.iter().map(|c| (c.sent, c.answered)));
    eprintln!(
        "200 changes (one put, one transaction each) written in {} at 5/s; the \
         writer's round trips: {answered}",
        seconds(took)
    );
    for (sled, d) in sleds.iter().zip(&each) {
        eprintln!("  applied on sled {sled} after the commit was sent: {d}");
    }
    eprintln!("  every sled: {all}");
    assert!(
        all.quantile(0.99) < P99_BOUND.as_secs_f64(),
        "the 99th percentile of a change's way to a sled: {all}"
    );
    Ok(())
}

/// Pings lost while the store changes its members: the underlay does not go
/// through etcd, so none should be; a loaded 2-core machine may drop one now and
/// then without the fleet's doing (the figure is printed).
const MAX_LOST_PINGS: u64 = 2;

#[test]
fn a_follower_and_then_the_leader_killed_under_a_thousand_changes_lose_nothing() -> Result<()> {
    let _took =
        Took::new("a_follower_and_then_the_leader_killed_under_a_thousand_changes_lose_nothing");
    let mut f = FleetRack::start("fsk", 4)?;
    let guests = one_guest_per_sled(&mut f, 4)?;
    let sleds = [0, 1, 2, 3];
    let rev = f.publish(&guests.iter().collect::<Vec<_>>())?;
    f.wait_converged(&sleds, rev, CONVERGE)?;
    let (ga, gc) = (f.rack.guest("g1")?, f.rack.guest("g3")?);
    ga.ping(gc.ipv4()?, 56, FIRST_REPLY)?;
    gc.ping(ga.ipv4()?, 56, FIRST_REPLY)?;
    let client = f.store_client()?;

    let changes = churn_plan(1000, 300, &mut vec![false; 300], 4);
    let pings = ga.start_pings(gc.ipv4()?, Duration::from_millis(20), &dir(&f, "pings"))?;
    let done = AtomicUsize::new(0);
    let t = Instant::now();
    let (commits, faults) = std::thread::scope(|s| {
        let churn = s.spawn(|| client.churn(changes, 50.0, &done));
        let etcd = &mut f.etcd;
        let faults = (|| -> Result<Vec<String>> {
            let mut log = Vec::new();
            let mut note =
                |what: String| log.push(format!("{:.1} s {what}", t.elapsed().as_secs_f64()));
            wait_churned(&done, 200)?;
            let leader = etcd.leader()?;
            let follower = (leader + 1) % etcd.size();
            etcd.kill(follower)?;
            note(format!("follower {} killed", etcd.member_name(follower)?));
            wait_churned(&done, 400)?;
            etcd.restart(follower)?;
            note(format!("follower {} back", etcd.member_name(follower)?));
            wait_churned(&done, 600)?;
            let leader = etcd.leader()?;
            etcd.kill(leader)?;
            note(format!("leader {} killed", etcd.member_name(leader)?));
            wait_churned(&done, 800)?;
            let new_leader = etcd.leader()?;
            note(format!("leader now {}", etcd.member_name(new_leader)?));
            etcd.restart(leader)?;
            note(format!("old leader {} back", etcd.member_name(leader)?));
            Ok(log)
        })();
        let commits = churn
            .join()
            .unwrap_or_else(|_| Err(Error::new("the churn panicked")));
        (commits, faults)
    });
    let faults = faults?;
    let commits = commits?;
    let churned = t.elapsed();
    f.etcd.wait_healthy(CONVERGE)?;
    let (store, rev) = client.v2p(VNI)?;
    f.wait_converged(&sleds, rev, RECONNECT)?;
    assert_tables(&f, &sleds, &store, "after the churn")?;
    let pinged = pings.stop()?;

    let retried = commits.iter().filter(|c| c.attempts > 1).count();
    // The longest the writer went without a commit (an election).
    let stalled =
        Distribution::between(commits.windows(2).map(|w| (w[0].answered, w[1].answered))).max();
    let gap = pinged
        .longest_gap(0.0)
        .map_or(Duration::ZERO, |(a, b)| Duration::from_secs_f64(b.1 - a.1));
    eprintln!(
        "1,000 changes at 50/s in {}: {}; writes stalled {stalled:.2} s at most, {retried} \
         transactions sent again after a lost member; {} mappings at the end, on every \
         sled; pings every 20 ms: {} sent, {} lost, longest gap between replies {:.0} ms",
        seconds(churned),
        faults.join(", "),
        store.len(),
        pinged.sent,
        pinged.lost(),
        gap.as_secs_f64() * 1000.0
    );
    for sled in sleds {
        let sessions = f.log(sled)?.matches("fleet store session ended").count();
        let s = f.fleet_status(sled)?;
        eprintln!(
            "  sled {sled}: {sessions} store sessions ended, {} full resyncs, on {:?}",
            s.resyncs, s.endpoint
        );
    }
    assert!(
        pinged.lost() <= MAX_LOST_PINGS,
        "{} of {} pings lost while the store lost members",
        pinged.lost(),
        pinged.sent
    );
    Ok(())
}

/// A file in the rack's directory.
fn dir(f: &FleetRack, name: &str) -> std::path::PathBuf {
    f.rack.dir().join(name)
}

/// How long a sled cut off from the store may take to hold the store's contents
/// again once it can reach it (the figure).
const HEALED: Duration = Duration::from_secs(5);

/// How long the sleds stay cut off (the figure).
const CUT_FOR: Duration = Duration::from_secs(60);

#[test]
fn sleds_cut_off_from_the_store_for_a_minute_forward_and_catch_up_with_or_without_history(
) -> Result<()> {
    let _took = Took::new(
        "sleds_cut_off_from_the_store_for_a_minute_forward_and_catch_up_with_or_without_history",
    );
    let mut f = FleetRack::start("fsp", 4)?;
    let guests = one_guest_per_sled(&mut f, 4)?;
    let sleds = [0, 1, 2, 3];
    // 300 mappings besides the guests': 100 will be deleted, 100 rewritten.
    let base: Vec<V2pEntry> = (0..300).map(|i| mapping(i, 0)).collect();
    let mut first = f.v2p_of(&guests.iter().collect::<Vec<_>>())?;
    first.extend(base.iter().copied());
    let rev = f.load(&first, &[])?;
    f.wait_converged(&sleds, rev, CONVERGE)?;
    let before = sorted(first);
    assert_tables(&f, &sleds, &before, "before the cut")?;
    let g0 = f.rack.guest("g0")?;
    for name in ["g2", "g3"] {
        f.rack.guest(name)?.ping(g0.ipv4()?, 56, FIRST_REPLY)?;
    }
    let client = f.store_client()?;

    // Sled 2 and sled 3 lose the store (their underlay stays).
    let cut = Instant::now();
    for sled in [2, 3] {
        f.etcd.cut_client_port(f.rack.sled(sled)?)?;
    }
    let g0 = f.rack.guest("g0")?;
    let pings: Vec<_> = [2, 3]
        .iter()
        .map(|&sled| {
            f.rack.guest(&format!("g{sled}"))?.start_pings(
                g0.ipv4()?,
                Duration::from_millis(100),
                &dir(&f, &format!("pings{sled}")),
            )
        })
        .collect::<Result<_>>()?;
    // 500 changes over most of the minute: every fifth deletes one of the first
    // 100, the others rewrite the next 200 and add 200 new ones.
    let mut puts = (100..300)
        .map(|i| mapping(i, 1))
        .chain((300..500).map(|i| mapping(i, 0)));
    let mut changes = Vec::new();
    for k in 0..500 {
        changes.push(match k % 5 {
            0 => vec![delete_v2p(&base[k / 5])],
            _ => vec![put_v2p(&puts.next().expect("400 puts"))?],
        });
    }
    let rate = 500.0 / (CUT_FOR.as_secs_f64() - 5.0);
    let commits = client.churn(changes, rate, &AtomicUsize::new(0))?;
    let churned = cut.elapsed();
    let (store, rev) = client.v2p(VNI)?;
    assert_eq!(store.len(), 4 + 300 - 100 + 200);
    assert!(commits.iter().all(|c| c.revision <= rev));
    // Cut off, they still hold the old tables and say they are disconnected.
    for sled in [2, 3] {
        let s = f.fleet_status(sled)?;
        assert!(
            !s.connected && s.revision < rev,
            "sled {sled} cut off: {s:?}"
        );
    }
    assert_tables(&f, &[2, 3], &before, "while cut off")?;
    assert_tables(&f, &[0, 1], &store, "the sleds not cut off")?;
    // The minute: wait it out (the churn ended a little before).
    std::thread::sleep(CUT_FOR.saturating_sub(cut.elapsed()));
    let resyncs: Vec<u64> = sleds
        .iter()
        .map(|&s| f.fleet_status(s).map(|s| s.resyncs))
        .collect::<Result<_>>()?;

    // Sled 2 comes back: it resumes from its positions, deletes included.
    let t = Instant::now();
    f.etcd.heal(f.rack.sled(2)?)?;
    let cut2 = cut.elapsed();
    poll_until("sled 2 to hold the store's mappings", HEALED, || {
        assert_tables(&f, &[2], &store, "healed")
    })?;
    let healed2 = t.elapsed();
    let s2 = f.fleet_status(2)?;
    assert_eq!(
        s2.resyncs, resyncs[2],
        "sled 2 resumed without a full read: {s2:?}"
    );

    // Sled 3 is still cut off; the history it missed goes.
    let s3 = f.fleet_status(3)?;
    let compacted = f.etcd.revision()?;
    assert!(s3.revision < compacted, "{s3:?}");
    let behind = s3.revision;
    f.etcd.compact(compacted)?;
    let t = Instant::now();
    f.etcd.heal(f.rack.sled(3)?)?;
    let cut3 = cut.elapsed();
    poll_until("sled 3 to hold the store's mappings", HEALED, || {
        assert_tables(&f, &[3], &store, "healed after the compaction")
    })?;
    let healed3 = t.elapsed();
    let s3 = f.wait_status(3, "connected", CONVERGE, |s| match s.connected {
        true => Ok(()),
        false => Err(Error::new("not yet")),
    })?;
    assert_eq!(
        s3.resyncs,
        resyncs[3] + 1,
        "exactly one full resync: {s3:?}"
    );
    let full_reads = f.log(3)?.matches("fleet full resync").count();
    assert_eq!(full_reads, 1, "sled 3's full resyncs logged");
    f.wait_converged(&sleds, rev, CONVERGE)?;
    assert_tables(&f, &sleds, &store, "at the end")?;

    let mut lost = Vec::new();
    for (p, sled) in pings.into_iter().zip([2, 3]) {
        let log = p.stop()?;
        eprintln!(
            "sled {sled}'s guest pinging sled 0's every 100 ms from the cut on: {} sent, {} lost",
            log.sent,
            log.lost()
        );
        lost.push((sled, log.sent, log.lost()));
    }
    let after: Vec<u64> = sleds
        .iter()
        .map(|&s| f.fleet_status(s).map(|s| s.resyncs))
        .collect::<Result<_>>()?;
    eprintln!(
        "sleds 2 and 3 cut off; 500 changes (100 deletes) in {} while cut off; sled 2 \
         healed after {} and held the store's {} mappings {} later, without a full read; \
         the store compacted at revision {compacted} (sled 3 at {}); sled 3 healed after \
         {} and held them {} later, with one full read; full resyncs per sled {after:?}",
        seconds(churned),
        seconds(cut2),
        store.len(),
        seconds(healed2),
        behind,
        seconds(cut3),
        seconds(healed3),
    );
    for (sled, sent, lost) in lost {
        assert!(
            lost <= MAX_LOST_PINGS,
            "sled {sled}'s guest lost {lost} of {sent} pings while cut off from the store"
        );
    }
    Ok(())
}

/// How long a guest that moved may be unreachable (the figure).
const MOVE_GAP: Duration = Duration::from_secs(1);

#[test]
fn a_guest_moved_to_another_sled_answers_again_within_a_second() -> Result<()> {
    let _took = Took::new("a_guest_moved_to_another_sled_answers_again_within_a_second");
    let mut f = FleetRack::start("fsm", 5)?;
    let a = GuestSpec::dual("ga", 1, 1);
    let m = GuestSpec::dual("gm", 2, 2);
    // Sled 4 already hosts a guest of the VPC (and its underlay neighbours are
    // known), as a sled a guest moves to usually does.
    let w = GuestSpec::v4("gw", 4, 4);
    for g in [&a, &m, &w] {
        f.add_guest(g.clone())?;
    }
    let rev = f.publish(&[&a, &m, &w])?;
    f.wait_converged(&[1, 2, 4], rev, CONVERGE)?;
    let ga = f.rack.guest("ga")?;
    for g in ["gm", "gw"] {
        ga.ping(f.rack.guest(g)?.ipv4()?, 56, FIRST_REPLY)?;
    }
    let client = f.store_client()?;
    let target = m
        .ipv4
        .map(IpAddr::V4)
        .ok_or_else(|| Error::new("no IPv4"))?;
    let pings = ga.start_pings(target, Duration::from_millis(10), &dir(&f, "pings"))?;
    wait_replies(&pings, 20, None)?;

    let moved_at = SystemTime::now();
    let t = Instant::now();
    f.move_guest("gm", 4)?;
    let port_moved = t.elapsed();
    let moved = GuestSpec {
        sled: 4,
        ..m.clone()
    };
    let ops: Vec<Op> = f
        .v2p_of(&[&moved])?
        .iter()
        .map(put_v2p)
        .collect::<Result<_>>()?;
    let commit = client.apply(ops)?;
    let v2p_written = t.elapsed();
    wait_replies(&pings, 50, Some(moved_at))?;
    let log = pings.stop()?;

    // The move's gap: the longest between two replies from the last before it.
    let (last, next) = log
        .longest_gap(since_epoch(moved_at))
        .ok_or_else(|| Error::new(format!("no replies around the move: {log:?}")))?;
    let gap = Duration::from_secs_f64(next.1 - last.1);
    let lost_in_gap = next.0 - last.0 - 1;
    let applied: Vec<String> = [1, 4]
        .iter()
        .map(|&sled| -> Result<String> {
            let b = f.applied_batches(sled)?;
            let at = b
                .iter()
                .find(|b| !b.full_read && b.changes > 0 && b.revision >= commit.revision)
                .map(|b| since(commit.sent, b.at));
            Ok(format!(
                "sled {sled} {:.0} ms",
                at.unwrap_or(f64::NAN) * 1000.0
            ))
        })
        .collect::<Result<_>>()?;
    eprintln!(
        "guest moved from sled 2 to sled 4 under a ping every 10 ms: port deleted and \
         created in {:.0} ms, V2P (one transaction, revision {}) written {:.0} ms after \
         the move began; new mapping applied {} after it was sent; last reply before \
         the move to the first after: {:.0} ms ({lost_in_gap} pings unanswered); in all \
         {} sent, {} lost",
        port_moved.as_secs_f64() * 1000.0,
        commit.revision,
        v2p_written.as_secs_f64() * 1000.0,
        applied.join(", "),
        gap.as_secs_f64() * 1000.0,
        log.sent,
        log.lost()
    );
    // Where the guest is now, every sled agrees; sled 2 hosts none of the VPC's
    // ports any more and drops the VPC.
    let (store, rev) = client.v2p(VNI)?;
    f.wait_converged(&[0, 1, 2, 3, 4], rev, CONVERGE)?;
    assert_tables(&f, &[1, 4], &store, "after the move")?;
    // Sleds 0 and 3 host no port of the VPC.
    assert_tables(&f, &[0, 3], &[], "without a port in the VPC")?;
    f.wait_status(2, "no VPC watched", CONVERGE, |s| match s.vnis.is_empty() {
        true => Ok(()),
        false => Err(Error::new("still watching")),
    })?;
    assert_tables(&f, &[2], &[], "sled 2 without a port in the VPC")?;
    assert!(gap < MOVE_GAP, "no reply for {gap:.2?} across the move");
    Ok(())
}

fn since_epoch(t: SystemTime) -> f64 {
    since(SystemTime::UNIX_EPOCH, t)
}

/// Waits until `pings` show `n` replies (that came at or after `after`).
fn wait_replies(pings: &Pings, n: usize, after: Option<SystemTime>) -> Result<()> {
    let after = after.map_or(0.0, since_epoch);
    poll_until(&format!("{n} ping replies"), FIRST_REPLY, || {
        let replies = pings.replies()?.iter().filter(|r| r.1 >= after).count();
        match replies >= n {
            true => Ok(()),
            false => Err(Error::new(format!("{replies} so far"))),
        }
    })
}

/// The soak's length and how often a member restarts: `FLEET_SOAK_SECONDS`
/// (default 1800) and `FLEET_SOAK_RESTART_SECONDS` (default 300).
fn soak_setting(name: &str, default: u64) -> Result<Duration> {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .map(Duration::from_secs)
            .map_err(|_| Error::new(format!("{name}={v:?} is not whole seconds"))),
        Err(_) => Ok(Duration::from_secs(default)),
    }
}

/// Each sled's resident memory, sampled.
type RssSamples = BTreeMap<usize, Vec<Sample>>;

/// The soak's resident memory may grow this much after its warm-up (see the test).
const SOAK_RSS_GROWTH_KIB: i64 = 2048;

/// Churn at 20 changes a second over 2,000 keys (a table of ~1,700 mappings at
/// steady state) with a member restarted every few minutes: every sled holds what
/// the store holds at the end, and its resident memory is as flat as the table.
/// Not in CI (`#[ignore]`): half an hour by default.
#[test]
#[ignore]
fn a_long_churn_with_member_restarts_keeps_sleds_equal_and_memory_flat() -> Result<()> {
    let _took = Took::new("a_long_churn_with_member_restarts_keeps_sleds_equal_and_memory_flat");
    let length = soak_setting("FLEET_SOAK_SECONDS", 1800)?;
    let restart_every = soak_setting("FLEET_SOAK_RESTART_SECONDS", 300)?;
    const RATE: f64 = 20.0;
    const KEYS: u32 = 2000;
    let mut f = FleetRack::start("fss", 4)?;
    one_guest_per_sled(&mut f, 4)?;
    let sleds = [0, 1, 2, 3];
    wait_watching(&f, &sleds)?;
    let base: Vec<V2pEntry> = (0..KEYS).map(|i| mapping(i, 0)).collect();
    let rev = load_file(&f, &base, "base.json")?;
    f.wait_converged(&sleds, rev, CONVERGE)?;
    let client = f.store_client()?;

    let n = (length.as_secs_f64() * RATE) as usize;
    // One delete in six for a key that exists: ~5/6 of the keys exist at steady state.
    let changes = churn_plan(n, KEYS, &mut vec![true; KEYS as usize], 6);
    let warmup = (length / 6).max(Duration::from_secs(30));
    let done = AtomicUsize::new(0);
    let began = SystemTime::now();
    let t = Instant::now();
    let sample_every = Duration::from_secs(10);
    let (commits, watched) = std::thread::scope(|s| {
        let churn = s.spawn(|| client.churn(changes, RATE, &done));
        let f = &mut f;
        let watched = (|| -> Result<(RssSamples, Vec<String>)> {
            let mut samples = RssSamples::new();
            let mut restarts = Vec::new();
            let mut next_restart = restart_every;
            let mut next_sample = Duration::ZERO;
            while !churn.is_finished() {
                if t.elapsed() >= next_sample {
                    next_sample += sample_every;
                    for &sled in &sleds {
                        let now = SystemTime::now();
                        samples.entry(sled).or_default().push(Sample {
                            at: t.elapsed(),
                            rss_kib: f.rss_kib(sled)?,
                            counters: e2e::counters::Snapshot {
                                counters: BTreeMap::new(),
                                asked: now,
                                answered: now,
                            },
                        });
                    }
                }
                if t.elapsed() >= next_restart {
                    next_restart += restart_every;
                    let i = restarts.len() % f.etcd.size();
                    let r = Instant::now();
                    f.etcd.kill(i)?;
                    f.etcd.restart(i)?;
                    restarts.push(format!(
                        "{} at {:.0} s ({:.1} s)",
                        f.etcd.member_name(i)?,
                        t.elapsed().as_secs_f64(),
                        r.elapsed().as_secs_f64()
                    ));
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            Ok((samples, restarts))
        })();
        let commits = churn
            .join()
            .unwrap_or_else(|_| Err(Error::new("the churn panicked")));
        (commits, watched)
    });
    let (samples, restarts) = watched?;
    let commits = commits?;
    let churned = t.elapsed();
    let (store, rev) = client.v2p(VNI)?;
    f.wait_converged(&sleds, rev, RECONNECT)?;
    assert_tables(&f, &sleds, &store, "at the end of the soak")?;
    eprintln!(
        "{n} changes at {RATE}/s in {}; member restarts: {}; {} mappings at the end, on \
         every sled",
        seconds(churned),
        restarts.join(", "),
        store.len()
    );
    match latencies(&f, &sleds, &commits, began) {
        Ok((all, _)) => eprintln!("  applied on every sled after the commit was sent: {all}"),
        Err(e) => eprintln!("  latencies not attributed: {e}"),
    }
    for sled in sleds {
        eprintln!("  sled {sled}: {:?}", f.fleet_status(sled)?);
    }
    // Flat: the level at the end (median of the last three samples) against the
    // level at the end of the warm-up. The table is ~1,700 mappings at steady
    // state (~0.5 MB by docs/fleet.md's model); 2 MiB is four times that, and a
    // leak of 100 bytes per change over the half hour's 36,000 changes (3.4 MiB)
    // would exceed it. (A 3-minute run's 3,600 changes cannot show such a leak.)
    let mut grown = Vec::new();
    for (sled, s) in &samples {
        let (before, after): (Vec<&Sample>, Vec<&Sample>) = s.iter().partition(|x| x.at <= warmup);
        let (Some(base), Some(end)) = (level(&before), level(&after)) else {
            return Err(Error::new(format!("too few samples of sled {sled}")));
        };
        let kib = end as i64 - base as i64;
        eprintln!(
            "  sled {sled} RSS (KiB, every {sample_every:?}): {:?}; after the warm-up \
             {base} -> {end} KiB ({kib:+} KiB)",
            s.iter().map(|x| x.rss_kib).collect::<Vec<_>>(),
        );
        grown.push((sled, kib));
    }
    for (sled, kib) in grown {
        assert!(
            kib <= SOAK_RSS_GROWTH_KIB,
            "sled {sled}'s resident memory grew {kib} KiB after the warm-up"
        );
    }
    Ok(())
}
