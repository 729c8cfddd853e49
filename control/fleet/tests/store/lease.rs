//! The status key on a lease: kept while held, gone when not kept alive.

use crate::harness::Etcd;
use std::time::{Duration, Instant};

async fn value_of(etcd: &Etcd, key: &str) -> Option<(Vec<u8>, i64)> {
    let answer = etcd.raw().await.get(key, None).await.expect("raw get");
    answer
        .kvs()
        .first()
        .map(|kv| (kv.value().to_vec(), kv.lease()))
}

#[tokio::test]
async fn the_status_key_lives_while_kept_alive_and_vanishes_after() {
    let etcd = Etcd::start();
    let mut store = etcd.store().await;
    let key = "/overlay/v1/sled/sled7/status";
    let mut status = store
        .lease_key(
            key,
            b"{\"connected\":true}".to_vec(),
            Duration::from_secs(1),
        )
        .await
        .expect("lease key");

    // Three TTLs later the keeper has kept it.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (value, lease) = value_of(&etcd, key).await.expect("kept alive");
    assert_eq!(value, b"{\"connected\":true}");
    assert_eq!(lease, status.lease_id());

    status
        .update(b"{\"v2p\":3}".to_vec())
        .await
        .expect("update");
    assert_eq!(
        value_of(&etcd, key).await.expect("updated").0,
        b"{\"v2p\":3}"
    );

    // The daemon dies: nobody keeps the lease, and the key goes with it.
    drop(status);
    let started = Instant::now();
    while value_of(&etcd, key).await.is_some() {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the key outlived its lease"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_clean_stop_removes_the_status_key_at_once() {
    let etcd = Etcd::start();
    let mut store = etcd.store().await;
    let key = "/overlay/v1/sled/sled8/status";
    let status = store
        .lease_key(key, b"{}".to_vec(), Duration::from_secs(30))
        .await
        .expect("lease key");
    assert_eq!(status.key(), key);
    assert!(value_of(&etcd, key).await.is_some());
    status.revoke().await.expect("revoke");
    assert!(value_of(&etcd, key).await.is_none());
}
