//! Watches: replay from a revision (deletes included), one event per transaction
//! across prefixes, progress when idle, compaction, prefixes added and removed.

use crate::harness::Etcd;
use fleet::{Change, Op, StoreError, Watch, WatchEvent};
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

fn prefixes(p: &[&str]) -> Vec<String> {
    p.iter().map(|s| s.to_string()).collect()
}

/// The next event other than progress, within a few seconds.
async fn next_change(watch: &mut Watch) -> WatchEvent {
    loop {
        match next(watch).await {
            WatchEvent::Progress { .. } => continue,
            event => return event,
        }
    }
}

async fn next(watch: &mut Watch) -> WatchEvent {
    tokio::time::timeout(Duration::from_secs(5), watch.next())
        .await
        .expect("an event within 5 s")
        .expect("watch")
}

fn changed(revision: i64, changes: &[(&str, Option<&str>)]) -> WatchEvent {
    WatchEvent::Changes {
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

    // Both watchers catch up from r1; /t/x/'s events of r3 must wait for /t/w/'s
    // backlog and come out with them as one event.
    let mut watch = store
        .watch(&prefixes(&["/t/w/", "/t/x/"]), r1)
        .await
        .unwrap();
    assert_eq!(
        next_change(&mut watch).await,
        changed(r1, &[("/t/w/a", Some("1")), ("/t/w/b", Some("1"))])
    );
    assert_eq!(
        next_change(&mut watch).await,
        changed(r2, &[("/t/w/a", None)])
    );
    assert_eq!(
        next_change(&mut watch).await,
        changed(r3, &[("/t/w/c", Some("1")), ("/t/x/d", Some("1"))])
    );

    // Live: the same holds for a transaction written now.
    let r4 = store
        .apply(vec![delete("/t/w/b"), put("/t/x/d", "2")])
        .await
        .unwrap()
        .revision;
    assert_eq!(
        next_change(&mut watch).await,
        changed(r4, &[("/t/w/b", None), ("/t/x/d", Some("2"))])
    );
    // A change under one prefix while the other is quiet: it waits for the quiet
    // watcher's progress (etcd 3.4.23 sends it every second here).
    let r5 = store
        .apply(vec![put("/t/x/e", "1")])
        .await
        .unwrap()
        .revision;
    assert_eq!(
        next_change(&mut watch).await,
        changed(r5, &[("/t/x/e", Some("1"))])
    );
    assert_eq!(watch.delivered(), r5);
    assert_eq!(watch.cluster_id(), store.cluster_id());
}

#[tokio::test]
async fn an_idle_watch_hears_progress() {
    let etcd = Etcd::start();
    let mut store = etcd.store().await;
    let start = store.status().await.unwrap().revision;
    let mut watch = store
        .watch(&prefixes(&["/t/quiet/", "/t/still/"]), start + 1)
        .await
        .unwrap();
    // Writes elsewhere move the store's revision, and the watch's with it.
    let elsewhere = store
        .apply(vec![put("/t/other/k", "1")])
        .await
        .unwrap()
        .revision;
    loop {
        match next(&mut watch).await {
            WatchEvent::Progress { revision } if revision >= elsewhere => break,
            WatchEvent::Progress { .. } => continue,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(watch.delivered() >= elsewhere);
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

    let mut watch = store.watch(&prefixes(&["/t/c/"]), first).await.unwrap();
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
    let snap = store.snapshot(&prefixes(&["/t/c/"])).await.unwrap();
    assert_eq!(snap.kvs.len(), 1);
    let mut watch = store
        .watch(&prefixes(&["/t/c/"]), snap.revision + 1)
        .await
        .unwrap();
    let r = store
        .apply(vec![put("/t/c/b", "1")])
        .await
        .unwrap()
        .revision;
    assert_eq!(
        next_change(&mut watch).await,
        changed(r, &[("/t/c/b", Some("1"))])
    );
}

#[tokio::test]
async fn prefixes_come_and_go_on_a_live_watch() {
    let etcd = Etcd::start();
    let mut store = etcd.store().await;
    let start = store.status().await.unwrap().revision;
    let mut watch = store.watch(&prefixes(&["/t/a/"]), start + 1).await.unwrap();
    let r1 = store
        .apply(vec![put("/t/a/1", "x"), put("/t/b/1", "x")])
        .await
        .unwrap()
        .revision;
    assert_eq!(
        next_change(&mut watch).await,
        changed(r1, &[("/t/a/1", Some("x"))])
    );

    // A new VPC: snapshot its prefix, then watch it from after the snapshot.
    let snap = store.snapshot(&prefixes(&["/t/b/"])).await.unwrap();
    assert_eq!(snap.kvs.len(), 1);
    assert!(matches!(
        watch.add_prefix("/t/b/", r1 - 1).await,
        Err(StoreError::WatchStartBehind { .. })
    ));
    watch.add_prefix("/t/b/", snap.revision + 1).await.unwrap();
    assert!(matches!(
        watch.add_prefix("/t/b/", snap.revision + 1).await,
        Err(StoreError::AlreadyWatched { .. })
    ));
    let r2 = store
        .apply(vec![put("/t/a/2", "x"), put("/t/b/2", "x")])
        .await
        .unwrap()
        .revision;
    assert_eq!(
        next_change(&mut watch).await,
        changed(r2, &[("/t/a/2", Some("x")), ("/t/b/2", Some("x"))])
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
        next_change(&mut watch).await,
        changed(r4, &[("/t/a/4", Some("x"))])
    );
    assert!(matches!(
        watch.remove_prefix("/t/b/").await,
        Err(StoreError::NotWatched { .. })
    ));
}
