//! Writes: guarded deletes, transactions split at etcd's limit, status and
//! connection errors.

use crate::harness::{connect, Etcd, TIMEOUT};
use fleet::{Op, Positions, SkippedDelete, Store, StoreConfig, StoreError, MAX_TXN_OPS};
use std::collections::BTreeMap;
use std::net::TcpListener;
use std::time::{Duration, Instant};

fn put(key: &str, value: &str) -> Op {
    Op::Put {
        key: key.to_string(),
        value: value.as_bytes().to_vec(),
    }
}

/// Writes "1" at each of `keys` (under `prefix`) and returns the mod revision
/// each has then, as a reader of the store sees it.
async fn written(store: &mut Store, prefix: &str, keys: &[&str]) -> BTreeMap<String, i64> {
    let puts = keys.iter().map(|k| put(k, "1")).collect();
    store.apply(puts).await.unwrap();
    let seen = store.snapshot(&[prefix.to_string()]).await.unwrap();
    seen.kvs
        .into_iter()
        .map(|kv| (kv.key, kv.mod_revision))
        .collect()
}

/// What is stored under `prefix` now, key and value, and the store's revision.
async fn stored(store: &mut Store, prefix: &str) -> (Vec<(String, String)>, i64) {
    let now = store.snapshot(&[prefix.to_string()]).await.unwrap();
    let kvs = now
        .kvs
        .into_iter()
        .map(|kv| (kv.key, String::from_utf8_lossy(&kv.value).into_owned()))
        .collect();
    (kvs, now.revision)
}

fn pairs(kvs: &[(&str, &str)]) -> Vec<(String, String)> {
    kvs.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[tokio::test]
async fn a_stale_guarded_delete_leaves_the_newer_value() {
    let etcd = Etcd::start();
    let mut store = etcd.store().await;
    let rev = written(&mut store, "/t/g/", &["/t/g/a", "/t/g/b"]).await;
    // Someone rewrites b after we read it.
    let newer = store
        .apply(vec![put("/t/g/b", "2")])
        .await
        .unwrap()
        .revision;

    let applied = store
        .apply(vec![
            Op::Delete {
                key: "/t/g/a".into(),
                if_mod_revision: Some(rev["/t/g/a"]),
            },
            Op::Delete {
                key: "/t/g/b".into(),
                if_mod_revision: Some(rev["/t/g/b"]),
            },
            Op::Delete {
                key: "/t/g/gone".into(),
                if_mod_revision: Some(3),
            },
            put("/t/g/c", "1"),
        ])
        .await
        .unwrap();
    assert_eq!(
        applied.skipped,
        [
            SkippedDelete {
                key: "/t/g/b".into(),
                expected_mod_revision: rev["/t/g/b"],
                current_mod_revision: newer,
            },
            SkippedDelete {
                key: "/t/g/gone".into(),
                expected_mod_revision: 3,
                current_mod_revision: 0,
            },
        ]
    );
    let (kvs, revision) = stored(&mut store, "/t/g/").await;
    assert_eq!(kvs, pairs(&[("/t/g/b", "2"), ("/t/g/c", "1")]));
    assert_eq!(applied.revision, revision);
}

#[tokio::test]
async fn a_move_goes_whole_or_not_at_all() {
    let etcd = Etcd::start();
    let mut store = etcd.store().await;
    let rev = written(&mut store, "/t/m/", &["/t/m/a/x", "/t/m/a/y"]).await;
    // y changes after it was read: its move must not happen, not even its put.
    store.apply(vec![put("/t/m/a/y", "2")]).await.unwrap();
    let moving = |key: &str| Op::Move {
        from: format!("/t/m/a/{key}"),
        to: format!("/t/m/c/{key}"),
        value: b"1".to_vec(),
        if_mod_revision: rev[&format!("/t/m/a/{key}")],
    };
    let applied = store.apply(vec![moving("x"), moving("y")]).await.unwrap();
    assert_eq!(applied.skipped.len(), 1);
    assert_eq!(applied.skipped[0].key, "/t/m/a/y");
    let (kvs, _) = stored(&mut store, "/t/m/").await;
    assert_eq!(kvs, pairs(&[("/t/m/a/y", "2"), ("/t/m/c/x", "1")]));
}

#[tokio::test]
async fn large_batches_split_into_transactions_etcd_accepts() {
    let etcd = Etcd::start();
    let mut store = etcd.store().await;
    // etcd refuses one transaction above --max-txn-ops (128 by default) ...
    let mut raw = etcd.raw().await;
    let too_many: Vec<etcd_client::TxnOp> = (0..=MAX_TXN_OPS)
        .map(|i| etcd_client::TxnOp::put(format!("/t/raw/{i}"), "x", None))
        .collect();
    assert!(raw
        .txn(etcd_client::Txn::new().and_then(too_many))
        .await
        .is_err());

    // ... so 300 ops go as 128 + 128 + 44: three revisions.
    let before = store.status().await.unwrap().revision;
    let ops: Vec<Op> = (0..300)
        .map(|i| put(&format!("/t/s/{i:03}"), "x"))
        .collect();
    let applied = store.apply(ops).await.unwrap();
    assert_eq!(applied.revision, before + 3);
    assert!(applied.skipped.is_empty());
    let snap = store.snapshot(&["/t/s/".to_string()]).await.unwrap();
    assert_eq!(snap.kvs.len(), 300);

    // A key twice: in order, the later write wins.
    let applied = store
        .apply(vec![put("/t/s/000", "first"), put("/t/s/000", "second")])
        .await
        .unwrap();
    assert_eq!(applied.revision, before + 5);
    let snap = store.snapshot(&["/t/s/000".to_string()]).await.unwrap();
    assert_eq!(snap.kvs[0].value, b"second");
}

#[tokio::test]
async fn status_names_leader_and_version() {
    let etcd = Etcd::start();
    let mut store = etcd.store().await;
    let status = store.status().await.unwrap();
    assert_eq!(status.leader, Some(status.member_id));
    assert_eq!(status.cluster_id, store.cluster_id());
    assert!(status.version.starts_with("3."), "{}", status.version);
    assert_eq!(status.endpoint, etcd.endpoints[0]);
    assert_eq!(store.endpoint(), etcd.endpoints[0]);
}

#[tokio::test]
async fn an_unreachable_member_is_transient_and_skipped() {
    let etcd = Etcd::start();
    // A port nobody listens on (bound, then closed).
    let dead = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://127.0.0.1:{}", l.local_addr().unwrap().port())
    };
    let only_dead = StoreConfig {
        endpoints: vec![dead.clone()],
        tls: None,
        timeout: TIMEOUT,
    };
    let e = Store::connect(&only_dead)
        .await
        .err()
        .expect("no store there");
    assert!(e.is_transient(), "{e}");
    assert!(e.to_string().contains(&dead), "{e}");

    // With a live member beside it, connect gets there, whichever it tries first.
    let mut both = etcd.config();
    both.endpoints.insert(0, dead);
    for _ in 0..4 {
        let store = Store::connect(&both).await.expect("the live member");
        assert_eq!(store.endpoint(), etcd.endpoints[0]);
    }
    let none = StoreConfig {
        endpoints: vec![],
        tls: None,
        timeout: TIMEOUT,
    };
    assert!(matches!(
        Store::connect(&none).await,
        Err(StoreError::NoEndpoints)
    ));
}

/// A member cut off from its quorum must not serve what it knew before: once it
/// has noticed, it answers "no leader" (worth a reconnect elsewhere), and a few
/// election timeouts later it ends the watches on it. (A read admitted just before
/// it noticed waits for a quorum that does not come, and times out.)
#[tokio::test]
async fn a_member_without_quorum_answers_no_leader() {
    let mut members = Etcd::cluster(2);
    let mut config = members[0].config();
    config.endpoints.truncate(1);
    config.timeout = Duration::from_secs(1);
    let mut store = connect(&config).await;
    store.apply(vec![put("/t/q/a", "1")]).await.unwrap();
    let start = store.status().await.unwrap().revision;
    let mut watch = store
        .watch(&Positions::from([("/t/q/".to_string(), start)]))
        .await
        .unwrap();

    drop(members.remove(1)); // killed: one member of two is no quorum
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match store.snapshot(&["/t/q/".to_string()]).await {
            Err(e) if e.to_string().contains("no leader") => {
                assert!(e.is_transient(), "{e}");
                break;
            }
            Err(e) => assert!(e.is_transient(), "{e}"),
            Ok(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
        assert!(Instant::now() < deadline, "no \"no leader\" within 10 s");
    }

    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Err(e) = watch.next().await {
                return e;
            }
        }
    })
    .await
    .expect("the watch ends within 10 s");
    assert!(ended.is_transient(), "{ended}");
}
