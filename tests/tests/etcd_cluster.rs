//! The fleet tests' etcd cluster on its own (no daemon): TLS with client
//! certificates, the per-sled roles, a leader killed and replaced, a sled cut off the
//! client port while another is not, compaction. Prints the timings it saw (run with
//! `--nocapture`).

use e2e::etcd::{sled_user, Cluster, KEY_ROOT, ROOT, WRITER};
use e2e::{Error, Rack, RackSpec, Result};
use std::time::{Duration, Instant};

/// Long enough for an election after a kill on a loaded machine (3-7 s seen with the
/// 3 s election timeout), with room to spare.
const ELECTION: Duration = Duration::from_secs(30);

/// A rack of two sleds (no daemons) and a three-member cluster on it.
fn cluster(prefix: &str) -> Result<(Rack, Cluster)> {
    let rack = Rack::build(&RackSpec::new(prefix, 2))?;
    let started = Instant::now();
    let cluster = Cluster::start(&rack, 3)?;
    println!(
        "cluster up (certificates, namespaces, election, auth) in {:.2?}; \
         first leader {} with every member healthy {:.2?} after the members started",
        started.elapsed(),
        cluster.member_name(cluster.leader()?)?,
        cluster.first_election()
    );
    Ok((rack, cluster))
}

/// Runs `cmd` and requires it to fail with `want` in its stderr.
fn fails_with(cmd: e2e::Cmd, want: &str) -> Result<()> {
    let line = cmd.display();
    let out = cmd.output()?;
    if out.status.success() || !out.stderr.contains(want) {
        return Err(Error::new(format!(
            "`{line}` should fail with {want:?}: {} stdout {:?} stderr {:?}",
            out.status, out.stdout, out.stderr
        )));
    }
    Ok(())
}

#[test]
fn sleds_read_what_their_roles_allow_and_a_cut_sled_is_cut_alone() -> Result<()> {
    let (rack, mut cluster) = cluster("etr")?;
    let (s0, s1) = (rack.sled(0)?, rack.sled(1)?);
    let v2b = format!("{KEY_ROOT}v2b/0.0.0.0/0");
    let v2p = format!("{KEY_ROOT}vpc/7/v2p/10.0.0.5");
    let routes = format!("{KEY_ROOT}sled/{}/port/p0/routes", sled_user(0));
    cluster.put(&v2b, r#"{"endpoints": ["fd00:99::b1"]}"#)?;
    cluster.put(
        &v2p,
        r#"{"mac": "a8:40:25:ff:00:06", "underlay": "fd00:99::2"}"#,
    )?;
    cluster.put(&routes, r#"[{"dest": "0.0.0.0/0", "target": "igw"}]"#)?;
    assert_eq!(
        cluster.get(&v2b)?.as_deref(),
        Some(r#"{"endpoints": ["fd00:99::b1"]}"#)
    );
    assert_eq!(cluster.get(&format!("{KEY_ROOT}nothing"))?, None);

    // Every sled reads V2B and its own prefix, not another sled's.
    for sled in [s0, s1] {
        let out = cluster
            .sled_etcdctl(sled)?
            .args(["get", "--prefix", &format!("{KEY_ROOT}v2b/")])
            .run()?;
        assert!(out.contains("fd00:99::b1"), "{out}");
    }
    let out = cluster
        .sled_etcdctl(s0)?
        .args(["get", "--prefix", &format!("{KEY_ROOT}sled/sled0/")])
        .run()?;
    assert!(out.contains("igw"), "{out}");
    fails_with(
        cluster
            .sled_etcdctl(s1)?
            .args(["get", "--prefix", &format!("{KEY_ROOT}sled/sled0/")]),
        "permission denied",
    )?;

    // A VPC's prefix only once granted, and only to the sled it is granted to.
    let vpc7 = format!("{KEY_ROOT}vpc/7/");
    fails_with(
        cluster.sled_etcdctl(s0)?.args(["get", "--prefix", &vpc7]),
        "permission denied",
    )?;
    cluster.grant_vni(0, 7)?;
    let out = cluster
        .sled_etcdctl(s0)?
        .args(["get", "--prefix", &vpc7])
        .run()?;
    assert!(out.contains("a8:40:25:ff:00:06"), "{out}");
    fails_with(
        cluster.sled_etcdctl(s1)?.args(["get", "--prefix", &vpc7]),
        "permission denied",
    )?;
    // The grant is the VPC's prefix, not every key that starts like it.
    fails_with(
        cluster
            .sled_etcdctl(s0)?
            .args(["get", "--prefix", &format!("{KEY_ROOT}vpc/70/")]),
        "permission denied",
    )?;

    // A sled writes its status key and nothing else.
    cluster
        .sled_etcdctl(s0)?
        .args([
            "put",
            &format!("{KEY_ROOT}sled/sled0/status"),
            r#"{"v2p": 1}"#,
        ])
        .run()?;
    assert_eq!(
        cluster
            .get(&format!("{KEY_ROOT}sled/sled0/status"))?
            .as_deref(),
        Some(r#"{"v2p": 1}"#)
    );
    for key in [
        routes.clone(),
        v2b.clone(),
        v2p.clone(),
        format!("{KEY_ROOT}sled/sled1/status"),
        "/elsewhere".to_string(),
    ] {
        fails_with(
            cluster.sled_etcdctl(s0)?.args(["put", &key, "x"]),
            "permission denied",
        )?;
        fails_with(
            cluster.sled_etcdctl(s0)?.args(["del", &key]),
            "permission denied",
        )?;
    }
    // The writer is confined to the fleet's keys too.
    fails_with(
        cluster.ctl(WRITER)?.args(["put", "/elsewhere", "x"]),
        "permission denied",
    )?;

    // Cut sled 0 off the client port: its etcdctl fails, sled 1's works, and the
    // underlay between them is untouched.
    cluster.cut_client_port(s0)?;
    let t = Instant::now();
    let out = cluster
        .sled_etcdctl(s0)?
        .args(["get", "--prefix", &format!("{KEY_ROOT}v2b/")])
        .output()?;
    assert!(!out.status.success(), "a cut sled read: {}", out.stdout);
    println!(
        "a cut sled's etcdctl failed after {:.2?}: {}",
        t.elapsed(),
        out.stderr.trim()
    );
    cluster
        .sled_etcdctl(s1)?
        .args(["get", "--prefix", &format!("{KEY_ROOT}v2b/")])
        .run()?;
    s0.ns
        .run("ping", &["-6", "-c", "1", "-W", "2", &s1.addr.to_string()])?;
    cluster.heal(s0)?;
    let out = cluster
        .sled_etcdctl(s0)?
        .args(["get", "--prefix", &format!("{KEY_ROOT}v2b/")])
        .run()?;
    assert!(out.contains("fd00:99::b1"), "{out}");

    // Compaction: reads of a revision before it fail, current reads do not.
    let before = cluster.revision()?;
    cluster.put(&v2b, r#"{"endpoints": ["fd00:99::b2"]}"#)?;
    let now = cluster.revision()?;
    assert_eq!(now, before + 1);
    let t = Instant::now();
    cluster.compact(now)?;
    println!("compaction to revision {now} took {:.2?}", t.elapsed());
    fails_with(
        cluster
            .ctl(WRITER)?
            .args(["get", &v2b, "--rev", &before.to_string()]),
        "compacted",
    )?;
    assert_eq!(
        cluster.get(&v2b)?.as_deref(),
        Some(r#"{"endpoints": ["fd00:99::b2"]}"#)
    );
    assert_eq!(cluster.del(&v2b)?, 1);
    assert_eq!(cluster.del(&v2b)?, 0);
    assert_eq!(cluster.get(&v2b)?, None);
    Ok(())
}

#[test]
fn a_killed_leader_is_replaced_and_rejoins_when_restarted() -> Result<()> {
    let (_rack, mut cluster) = cluster("etk")?;
    let key = format!("{KEY_ROOT}v2b/::/0");
    cluster.put(&key, "before")?;
    let old = cluster.leader()?;

    let t = Instant::now();
    cluster.kill(old)?;
    let new = cluster.wait_healthy(ELECTION)?;
    let elected = t.elapsed();
    assert_ne!(new, old);
    println!(
        "leader {} killed: {} elected and the survivors healthy after {elected:.2?}",
        cluster.member_name(old)?,
        cluster.member_name(new)?
    );

    // The cluster takes writes without the old leader; it catches up on restart.
    cluster.put(&key, "during")?;
    let t = Instant::now();
    cluster.restart(old)?;
    println!(
        "member {} restarted and rejoined in {:.2?}",
        cluster.member_name(old)?,
        t.elapsed()
    );
    let copy = e2e::poll_until(
        "the restarted member to hold the write it missed",
        ELECTION,
        || {
            let out = cluster
                .member_etcdctl(old, ROOT)?
                .args(["get", &key, "--consistency", "s", "--print-value-only"])
                .run()?;
            if out.trim() == "during" {
                Ok(out)
            } else {
                Err(Error::new(format!("it holds {out:?}")))
            }
        },
    )?;
    assert_eq!(copy.trim(), "during");
    assert!(cluster.running(old));
    Ok(())
}
