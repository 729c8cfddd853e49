//! Snapshots: paged over more than one page, pinned at one revision.

use crate::harness::Etcd;
use fleet::{Kv, Op};
use std::cell::Cell;

fn puts(prefix: &str, n: usize) -> Vec<Op> {
    (0..n)
        .map(|i| Op::Put {
            key: format!("{prefix}k{i:05}"),
            value: format!("v{i}").into_bytes(),
        })
        .collect()
}

#[tokio::test]
async fn snapshot_pages_through_more_than_a_thousand_keys() {
    let etcd = Etcd::start();
    let mut store = etcd.store().await;
    let mut ops = puts("/t/a/", 2500);
    ops.extend(puts("/t/b/", 3));
    ops.extend(puts("/t/c/", 3)); // not asked for
    store.apply(ops).await.expect("apply");

    let prefixes = vec!["/t/b/".to_string(), "/t/a/".to_string()];
    let snap = store.snapshot(&prefixes).await.expect("snapshot");
    assert_eq!(snap.kvs.len(), 2503);
    assert!(
        snap.kvs.windows(2).all(|w| w[0].key < w[1].key),
        "sorted, unique"
    );
    assert!(snap.kvs.iter().all(|kv| !kv.key.starts_with("/t/c/")));
    assert_eq!(snap.kvs[0].key, "/t/a/k00000");
    assert_eq!(snap.kvs[2499].value, b"v2499");
    assert_eq!(
        snap.revision,
        store.status().await.expect("status").revision
    );
    assert_eq!(snap.cluster_id, store.cluster_id());
}

/// A writer updates keys of every page and adds keys past the end while the
/// snapshot pages through: what the snapshot returns is exactly the store at its
/// revision, although writes of later revisions landed before it finished.
#[tokio::test]
async fn snapshot_is_pinned_while_writes_land() {
    let etcd = Etcd::start();
    let mut store = etcd.store().await;
    store.apply(puts("/t/a/", 3000)).await.expect("apply");
    let mut writer = etcd.store().await;
    let mut raw = etcd.raw().await;
    let prefix = vec!["/t/a/".to_string()];

    for attempt in 0..5 {
        let done = Cell::new(false);
        let read = async {
            let snap = store.snapshot(&prefix).await;
            done.set(true);
            snap
        };
        let writes = async {
            // While the snapshot pages: update a key of some page and add one
            // past the last, noting each write's revision.
            let mut revisions = Vec::new();
            let mut i = 0;
            while !done.get() {
                let ops = vec![
                    Op::Put {
                        key: format!("/t/a/k{:05}", (i * 997) % 3000),
                        value: b"new".to_vec(),
                    },
                    Op::Put {
                        key: format!("/t/a/z{attempt}-{i:04}"),
                        value: b"new".to_vec(),
                    },
                ];
                let revision = writer.apply(ops).await.expect("write").revision;
                if !done.get() {
                    revisions.push(revision);
                }
                i += 1;
            }
            revisions
        };
        let (snap, revisions) = tokio::join!(read, writes);
        let snap = snap.expect("snapshot");

        let at = raw
            .get(
                "/t/a/",
                Some(
                    etcd_client::GetOptions::new()
                        .with_prefix()
                        .with_revision(snap.revision),
                ),
            )
            .await
            .expect("raw read");
        let expected: Vec<Kv> = at
            .kvs()
            .iter()
            .map(|kv| Kv {
                key: kv.key_str().expect("utf-8").to_string(),
                value: kv.value().to_vec(),
                mod_revision: kv.mod_revision(),
            })
            .collect();
        assert_eq!(
            snap.kvs, expected,
            "the snapshot is the store at its revision"
        );
        assert!(snap.kvs.iter().all(|kv| kv.mod_revision <= snap.revision));

        // The point is made only if a write landed after the pinned revision
        // while the read went on; on a fast machine it may not, so try again.
        if revisions.iter().any(|r| *r > snap.revision) {
            return;
        }
    }
    panic!("no write landed during a snapshot in five tries");
}
