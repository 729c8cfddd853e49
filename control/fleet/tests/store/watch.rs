//! Watches: replay from a revision (deletes included), each prefix in its own
//! order and from its own position, progress when idle, compaction, prefixes
//! added and removed.

use crate::harness::Etcd;
use fleet::{Change, Op, Positions, StoreError, Watch, WatchEvent};
use std::time::Duration;

fn put(key: &str, value: &str) -> Op {
    Op::Put {
        key: key.to_string(),
        value: value.as_bytes().to_vec(),
    }
}

fn delete(key: &str) -> Op {
    Op::Delete {
        key: key.to_string(),
        if_mod_revision: None,
    }
}

/// Every prefix of `p` after revision `after`.
fn after(p: &[&str], after: i64) -> Positions {
    p.iter().map(|s| (s.to_string(), after)).collect()
}

/// The next `n` events other than progress, within a few seconds, in the order
/// (revision, prefix): the order across prefixes is not the watch's to promise.
async fn next_changes(watch: &mut Watch, n: usize) -> Vec<WatchEvent> {
    let mut got = Vec::new();
    while got.len() < n {
        match next(watch).await {
            WatchEvent::Progress { .. } => continue,
            event => got.push(event),
        }
    }
    got.sort_by_key(|e| match e {
        WatchEvent::Changes {
            prefix, revision, ..
        } => (*revision, prefix.clone()),
        _ => (0, String::new()),
    });
    got
}

async fn next(watch: &mut Watch) -> WatchEvent {
    tokio::time::timeout(Duration::from_secs(5), watch.next())
        .await
        .expect("an event within 5 s")
        .expect("watch")
}

fn changed(prefix: &str, revision: i64, changes: &[(&str, Option<&str>)]) -> WatchEvent {
    WatchEvent::Changes {
        prefix: prefix.to_string(),
        revision,
        changes: changes
            .iter()
            .map(|(key, value)| Change {
                key: key.to_string(),
                value: value.map(|v| v.as_bytes().to_vec()),
                mod_revision: revision,
            })
            .collect(),
    }
}

#[tokio::test]
async fn watch_from_a_revision_replays_puts_and_deletes_in_order() {
    let etcd = Etcd::start();
    let mut store = etcd.store().await;
    let r1 = store
        .apply(vec![put("/t/w/a", "1"), put("/t/w/b", "1")])
        .await
        .unwrap()
        .revision;
    let r2 = store.apply(vec![delete("/t/w/a")]).await.unwrap().revision;
    // One transaction over both watched prefixes and one that is not watched.
    let r3 = store
        .apply(vec![
            put("/t/w/c", "1"),
            put("/t/x/d", "1"),
            put("/t/y/e", "1"),
        ])
        .await
        .unwrap()
        .revision;

    // Both watchers catch up after r1 - 1; r3 comes once for each prefix.
    let mut watch = store
        .watch(&after(&["/t/w/", "/t/x/"], r1 - 1))
        .await
        .unwrap();
    assert_eq!(
        next_changes(&mut watch, 4).await,
        [
            changed("/t/w/", r1, &[("/t/w/a", Some("1")), ("/t/w/b", Some("1"))]),
            changed("/t/w/", r2, &[("/t/w/a", None)]),
            changed("/t/w/", r3, &[("/t/w/c", Some("1"))]),
            changed("/t/x/", r3, &[("/t/x/d", Some("1"))]),
        ]
    );

    // Live: the same holds for a transaction written now.
    let r4 = store
        .apply(vec![delete("/t/w/b"), put("/t/x/d", "2")])
        .await
        .unwrap()
        .revision;
    assert_eq!(
        next_changes(&mut watch, 2).await,
        [
            changed("/t/w/", r4, &[("/t/w/b", None)]),
            changed("/t/x/", r4, &[("/t/x/d", Some("2"))]),
        ]
    );
    // A change under one prefix while the other is quiet comes at once: it does
    // not wait for the quiet one's progress, and only its own position moves.
    let r5 = store
        .apply(vec![put("/t/x/e", "1")])
        .await
        .unwrap()
        .revision;
    assert_eq!(
        next_changes(&mut watch, 1).await,
        [changed("/t/x/", r5, &[("/t/x/e", Some("1"))])]
    );
    let positions = watch.positions();
    assert_eq!(positions["/t/x/"], r5);
    assert!(positions["/t/w/"] >= r4, "{positions:?}");
    assert_eq!(watch.cluster_id(), store.cluster_id());

    // A watch resumed from those positions replays nothing.
    let mut resumed = store.watch(&positions).await.unwrap();
    let r6 = store
        .apply(vec![put("/t/w/f", "1")])
        .await
        .unwrap()
        .revision;
    assert_eq!(
        next_changes(&mut resumed, 1).await,
        [changed("/t/w/", r6, &[("/t/w/f", Some("1"))])]
    );
}

#[tokio::test]
async fn an_idle_watch_hears_progress() {
    let etcd = Etcd::start();
    let mut store = etcd.store().await;
    let start = store.status().await.unwrap().revision;
    let mut watch = store
        .watch(&after(&["/t/quiet/", "/t/still/"], start))
        .await
        .unwrap();
    // Writes elsewhere move the store's revision, and both positions with it.
    let elsewhere = store
        .apply(vec![put("/t/other/k", "1")])
        .await
        .unwrap()
        .revision;
    while watch.delivered() < elsewhere {
        match next(&mut watch).await {
            WatchEvent::Progress { .. } => continue,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(watch.positions().values().all(|&r| r >= elsewhere));
}

#[tokio::test]
async fn a_watch_from_a_compacted_revision_says_so() {
    let etcd = Etcd::start();
    let mut store = etcd.store().await;
    let first = store
        .apply(vec![put("/t/c/a", "1")])
        .await
        .unwrap()
        .revision;
    let last = store
        .apply(vec![put("/t/c/a", "2")])
        .await
        .unwrap()
        .revision;
    etcd.raw().await.compact(last, None).await.expect("compact");

    let mut watch = store.watch(&after(&["/t/c/"], first - 1)).await.unwrap();
    assert_eq!(
        next(&mut watch).await,
        WatchEvent::Compacted {
            prefix: "/t/c/".to_string(),
            compact_revision: last
        }
    );
    assert!(matches!(
        watch.next().await,
        Err(StoreError::WatchEnded { .. })
    ));

    // The way out: a snapshot, and a watch from after it.
    let snap = store.snapshot(&["/t/c/".to_string()]).await.unwrap();
    assert_eq!(snap.kvs.len(), 1);
    let mut watch = store
        .watch(&after(&["/t/c/"], snap.revision))
        .await
        .unwrap();
    let r = store
        .apply(vec![put("/t/c/b", "1")])
        .await
        .unwrap()
        .revision;
    assert_eq!(
        next_changes(&mut watch, 1).await,
        [changed("/t/c/", r, &[("/t/c/b", Some("1"))])]
    );
}

#[tokio::test]
async fn prefixes_come_and_go_on_a_live_watch() {
    let etcd = Etcd::start();
    let mut store = etcd.store().await;
    let start = store.status().await.unwrap().revision;
    let mut watch = store.watch(&after(&["/t/a/"], start)).await.unwrap();
    let r1 = store
        .apply(vec![put("/t/a/1", "x"), put("/t/b/1", "x")])
        .await
        .unwrap()
        .revision;
    assert_eq!(
        next_changes(&mut watch, 1).await,
        [changed("/t/a/", r1, &[("/t/a/1", Some("x"))])]
    );

    // A new VPC: snapshot its prefix, then watch it from after the snapshot.
    let snap = store.snapshot(&["/t/b/".to_string()]).await.unwrap();
    assert_eq!(snap.kvs.len(), 1);
    watch.add_prefix("/t/b/", snap.revision).await.unwrap();
    assert!(matches!(
        watch.add_prefix("/t/b/", snap.revision).await,
        Err(StoreError::AlreadyWatched { .. })
    ));
    assert!(matches!(
        watch.add_prefix("/t/b/sub/", snap.revision).await,
        Err(StoreError::OverlappingPrefix { .. })
    ));
    let r2 = store
        .apply(vec![put("/t/a/2", "x"), put("/t/b/2", "x")])
        .await
        .unwrap()
        .revision;
    assert_eq!(
        next_changes(&mut watch, 2).await,
        [
            changed("/t/a/", r2, &[("/t/a/2", Some("x"))]),
            changed("/t/b/", r2, &[("/t/b/2", Some("x"))]),
        ]
    );

    // The VPC's last port goes: its changes stop, the others' go on.
    watch.remove_prefix("/t/b/").await.unwrap();
    let r3 = store
        .apply(vec![put("/t/b/3", "x")])
        .await
        .unwrap()
        .revision;
    let r4 = store
        .apply(vec![put("/t/a/4", "x")])
        .await
        .unwrap()
        .revision;
    assert!(r4 > r3);
    assert_eq!(
        next_changes(&mut watch, 1).await,
        [changed("/t/a/", r4, &[("/t/a/4", Some("x"))])]
    );
    assert!(matches!(
        watch.remove_prefix("/t/b/").await,
        Err(StoreError::NotWatched { .. })
    ));
    assert_eq!(watch.positions().len(), 1);
}
