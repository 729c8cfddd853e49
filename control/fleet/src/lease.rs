//! A key that lives as long as its writer: the sled's status key on a lease.

use crate::call::rpc;
use crate::error::{Operation, StoreError};
use etcd_client::{KvClient, LeaseClient, LeaseKeepAliveStream, LeaseKeeper, PutOptions};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::task::JoinHandle;

/// A key put on a lease that a background task keeps alive every third of its
/// TTL. While the process runs the key stays (and comes back if the lease expired
/// during a partition longer than the TTL: the task grants a new lease and puts
/// the latest value again); when the process dies, or drops this without
/// [`LeasedKey::revoke`], keep-alives stop and the store deletes the key when the
/// lease's TTL runs out. Readers therefore see a sled's status only while the
/// sled is alive.
///
/// The task runs on the caller's tokio runtime: it makes progress while that
/// runtime runs (for the daemon's watcher, while it waits in a `block_on`).
pub struct LeasedKey {
    key: String,
    endpoint: String,
    timeout: Duration,
    kv: KvClient,
    lease: LeaseClient,
    held: Arc<Mutex<Held>>,
    keeper: JoinHandle<()>,
}

/// What the keeper needs to put the key again on a new lease.
struct Held {
    lease: i64,
    value: Vec<u8>,
}

/// What the keeper task owns.
struct Keeper {
    key: String,
    ttl_secs: i64,
    endpoint: String,
    timeout: Duration,
    kv: KvClient,
    lease: LeaseClient,
    held: Arc<Mutex<Held>>,
    stream: Option<(i64, LeaseKeeper, LeaseKeepAliveStream)>,
}

impl LeasedKey {
    pub(crate) async fn start(
        kv: KvClient,
        lease: LeaseClient,
        endpoint: String,
        timeout: Duration,
        key: String,
        value: Vec<u8>,
        ttl: Duration,
    ) -> Result<LeasedKey, StoreError> {
        let ttl_secs = i64::try_from(ttl.as_secs().max(1)).unwrap_or(i64::MAX);
        let mut keeper = Keeper {
            key: key.clone(),
            ttl_secs,
            endpoint: endpoint.clone(),
            timeout,
            kv: kv.clone(),
            lease: lease.clone(),
            held: Arc::new(Mutex::new(Held { lease: 0, value })),
            stream: None,
        };
        keeper.grant_and_put().await?;
        let held = keeper.held.clone();
        Ok(LeasedKey {
            key,
            endpoint,
            timeout,
            kv,
            lease,
            held,
            keeper: tokio::spawn(keeper.run()),
        })
    }

    /// The leased key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The lease the key is on now (it changes if the lease had to be granted
    /// anew).
    pub fn lease_id(&self) -> i64 {
        lock(&self.held).lease
    }

    /// Puts a new value on the current lease and returns the store's revision.
    /// The keeper puts this value again if it ever has to grant a new lease (if
    /// the lease has just expired, this put fails, and the keeper's next tick
    /// puts the value on a new one).
    pub async fn update(&mut self, value: Vec<u8>) -> Result<i64, StoreError> {
        let lease = {
            let mut held = lock(&self.held);
            held.value.clone_from(&value);
            held.lease
        };
        let put = rpc(
            &self.endpoint,
            self.timeout,
            Operation::Put {
                key: self.key.clone(),
            },
            self.kv.put(
                self.key.as_bytes(),
                value,
                Some(PutOptions::new().with_lease(lease)),
            ),
        )
        .await?;
        Ok(put
            .header()
            .map_or(0, etcd_client::ResponseHeader::revision))
    }

    /// Deletes the key now, with its lease (a clean stop: readers need not wait
    /// for the TTL to learn the sled is gone).
    pub async fn revoke(mut self) -> Result<(), StoreError> {
        self.keeper.abort();
        let lease = self.lease_id();
        rpc(
            &self.endpoint,
            self.timeout,
            Operation::LeaseRevoke { lease },
            self.lease.revoke(lease),
        )
        .await?;
        Ok(())
    }
}

impl Drop for LeasedKey {
    /// Stops the keep-alives; the key goes when the lease's TTL runs out.
    fn drop(&mut self) {
        self.keeper.abort();
    }
}

impl Keeper {
    /// Keeps the lease alive every third of the TTL, so that two lost keep-alives
    /// in a row still leave the key in place. Failures are logged and retried at
    /// the next tick: the task ends only when the [`LeasedKey`] goes.
    async fn run(mut self) {
        let period = Duration::from_secs(u64::try_from(self.ttl_secs).unwrap_or(1)) / 3;
        loop {
            tokio::time::sleep(period).await;
            match self.keep_alive().await {
                Ok(true) => {}
                Ok(false) => {
                    tracing::warn!(key = %self.key, "lease expired; putting the key on a new one");
                    if let Err(e) = self.grant_and_put().await {
                        tracing::warn!(key = %self.key, error = %e, "cannot put the leased key again");
                    }
                }
                Err(e) => {
                    tracing::warn!(key = %self.key, error = %e, "lease keep-alive failed");
                    self.stream = None;
                }
            }
        }
    }

    /// One keep-alive on the (re)opened stream: `Ok(false)` when the store no
    /// longer knows the lease (it expired).
    async fn keep_alive(&mut self) -> Result<bool, StoreError> {
        let lease = lock(&self.held).lease;
        let operation = Operation::LeaseKeepAlive { lease };
        if self.stream.as_ref().is_none_or(|(id, ..)| *id != lease) {
            // Opening the stream sends the first keep-alive and reads its answer.
            let opened = rpc(
                &self.endpoint,
                self.timeout,
                operation,
                self.lease.keep_alive(lease),
            )
            .await;
            return match opened {
                Ok((keeper, stream)) => {
                    self.stream = Some((lease, keeper, stream));
                    Ok(true)
                }
                Err(StoreError::Rpc {
                    source: etcd_client::Error::LeaseKeepAliveError(_),
                    ..
                }) => Ok(false),
                Err(e) => Err(e),
            };
        }
        let Some((_, keeper, stream)) = self.stream.as_mut() else {
            return Ok(false);
        };
        let answer = rpc(&self.endpoint, self.timeout, operation.clone(), async {
            keeper.keep_alive().await?;
            stream.message().await
        })
        .await?;
        match answer {
            Some(answer) => Ok(answer.ttl() > 0),
            None => Err(StoreError::Rpc {
                endpoint: self.endpoint.clone(),
                operation,
                source: etcd_client::Error::LeaseKeepAliveError(
                    "the keep-alive stream ended".to_string(),
                ),
            }),
        }
    }

    /// Grants a lease and puts the latest value on it.
    async fn grant_and_put(&mut self) -> Result<(), StoreError> {
        let granted = rpc(
            &self.endpoint,
            self.timeout,
            Operation::LeaseGrant {
                ttl_secs: self.ttl_secs,
            },
            self.lease.grant(self.ttl_secs, None),
        )
        .await?;
        let value = lock(&self.held).value.clone();
        rpc(
            &self.endpoint,
            self.timeout,
            Operation::Put {
                key: self.key.clone(),
            },
            self.kv.put(
                self.key.as_bytes(),
                value,
                Some(PutOptions::new().with_lease(granted.id())),
            ),
        )
        .await?;
        lock(&self.held).lease = granted.id();
        self.stream = None;
        Ok(())
    }
}

/// The lock is only held to copy a value in or out, never across a panic that
/// could leave it half-written: a poisoned lock's contents are still whole.
fn lock(held: &Mutex<Held>) -> std::sync::MutexGuard<'_, Held> {
    held.lock().unwrap_or_else(PoisonError::into_inner)
}
