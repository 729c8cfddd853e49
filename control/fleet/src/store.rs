//! One connection to one etcd member: connect (and pick the member), status,
//! pinned paged snapshots, bounded transactions with guarded deletes.

use crate::backoff::random_u64;
use crate::call::{check_cluster, rpc};
use crate::config::{StoreConfig, TlsPem};
use crate::error::{Operation, StoreError};
use crate::lease::LeasedKey;
use crate::watch::{Positions, Watch};
use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, GetOptions, Identity, KeyValue,
    KvClient, LeaseClient, MaintenanceClient, ResponseHeader, TlsOptions, Txn, TxnOp,
    TxnOpResponse, WatchClient,
};
use std::collections::HashSet;
use std::time::Duration;

/// etcd's default `--max-txn-ops`: a transaction with more operations is refused
/// whole. [`Store::apply`] splits larger batches into transactions of at most
/// this many.
pub const MAX_TXN_OPS: usize = 128;

/// Bytes of keys and values per transaction: etcd refuses requests above its
/// `--max-request-bytes` (1.5 MiB by default); a MiB leaves room for the framing.
/// Routes and firewall values may be 64 KiB each, so 128 of them would not fit.
const MAX_TXN_BYTES: usize = 1 << 20;

/// Keys per page of a snapshot: small enough that one answer stays a few MiB even
/// with large values, large enough that a VPC of 2,000 guests is two round trips.
const PAGE_KEYS: i64 = 1000;

/// How often a snapshot starts over when its pinned revision is compacted under
/// it, before giving up (each try pins the then-current revision, which a single
/// compaction cannot take away again at once).
const SNAPSHOT_ATTEMPTS: u32 = 3;

/// The largest answer accepted (tonic's default is 4 MiB): a page of 1,000 keys
/// with values of up to 64 KiB, or a watch catching up 1,000 revisions at once
/// (etcd batches that many into one message), must not be refused by our own
/// client and turn into an endless reconnect.
pub(crate) const MAX_RESPONSE_BYTES: usize = 256 << 20;

/// HTTP/2 pings on idle connections: a watch waiting for changes must notice a
/// member that vanished without a FIN (power loss, partition). etcd closes
/// connections that ping more often than its `--grpc-keepalive-min-time` (5 s).
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);

/// A connection to one member of the store, chosen among the configured
/// endpoints by [`Store::connect`]. Every request requires the member to have a
/// leader: a member cut off from its quorum answers "no leader" (a transient
/// [`StoreError`]) instead of serving what it knew before the cut, so the caller
/// reconnects, which moves it to another member.
pub struct Store {
    endpoint: String,
    timeout: Duration,
    cluster_id: u64,
    ordered_progress: bool,
    kv: KvClient,
    lease: LeaseClient,
    maintenance: MaintenanceClient,
    watch: WatchClient,
}

/// A member's view of the store ([`Store::status`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreStatus {
    /// The endpoint that answered.
    pub endpoint: String,
    /// The store's current revision: a sled whose saved revision is above it is
    /// looking at a store that went back in time (a restore).
    pub revision: i64,
    /// Identifies the cluster: another id behind the same endpoints is another
    /// store (wiped, replaced), not a newer state of the same one.
    pub cluster_id: u64,
    /// The answering member.
    pub member_id: u64,
    /// The member the answering member takes for leader; `None` if it knows none.
    pub leader: Option<u64>,
    /// etcd's version, e.g. "3.4.23".
    pub version: String,
}

/// Every key under some prefixes at one revision ([`Store::snapshot`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// The revision every page was read at: watch from `revision + 1` to see what
    /// came after, nothing missed and nothing twice.
    pub revision: i64,
    /// The cluster that answered every page.
    pub cluster_id: u64,
    /// Sorted by key, each key once (even where prefixes overlap).
    pub kvs: Vec<Kv>,
}

/// A key and its value at a snapshot's revision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kv {
    /// The key as text. The schema's keys are ASCII; bytes that are not UTF-8
    /// show as U+FFFD, so a stray binary key is refused by the schema's parser,
    /// not by the store.
    pub key: String,
    /// The value as stored: the schema's parser decides what it means.
    pub value: Vec<u8>,
    /// The revision of the key's last change: what a guarded delete compares.
    pub mod_revision: i64,
}

/// One write of [`Store::apply`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Writes `value` under `key`, whatever was there.
    Put { key: String, value: Vec<u8> },
    /// With `if_mod_revision: Some(r)`, the key is deleted only if its last change
    /// is still revision `r` (what the writer read): a delete computed from a
    /// stale view must not remove a value written since (etcd's mod revision of a
    /// missing key is 0).
    Delete {
        key: String,
        if_mod_revision: Option<i64>,
    },
    /// Writes `value` (what `from` held when read) under `to` and deletes
    /// `from`, both or neither: only if `from`'s last change is still revision
    /// `if_mod_revision`; otherwise it is reported as a skipped delete of `from`.
    Move {
        from: String,
        to: String,
        value: Vec<u8>,
        if_mod_revision: i64,
    },
}

impl Op {
    /// The key the op writes (a move's source).
    pub fn key(&self) -> &str {
        match self {
            Op::Put { key, .. } | Op::Delete { key, .. } => key,
            Op::Move { from, .. } => from,
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Op::Put { key, value } => key.len() + value.len(),
            Op::Delete { key, .. } => key.len(),
            Op::Move {
                from, to, value, ..
            } => from.len() + to.len() + value.len(),
        }
    }

    /// A delete guarded by a mod revision, or a move: a nested transaction.
    fn is_guarded(&self) -> bool {
        matches!(
            self,
            Op::Delete {
                if_mod_revision: Some(_),
                ..
            } | Op::Move { .. }
        )
    }
}

/// What [`Store::apply`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    /// The store's revision after the last transaction.
    pub revision: i64,
    /// Guarded deletes whose key had changed (or gone): left as they were.
    pub skipped: Vec<SkippedDelete>,
}

/// A guarded delete that did not apply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SkippedDelete {
    /// The key left in place.
    pub key: String,
    /// The guard: the mod revision the writer had read.
    pub expected_mod_revision: i64,
    /// The key's mod revision when the transaction ran; 0 if it no longer exists.
    pub current_mod_revision: i64,
}

impl Store {
    /// Connects to one of `config.endpoints`: the first one tried is drawn at
    /// random (1,000 sleds spread over the members instead of all loading the
    /// first), then the others in turn until one answers a status request with a
    /// leader. The TLS files are read anew on every call.
    pub async fn connect(config: &StoreConfig) -> Result<Store, StoreError> {
        let n = config.endpoints.len();
        if n == 0 {
            return Err(StoreError::NoEndpoints);
        }
        let pem = config
            .tls
            .as_ref()
            .map(super::config::TlsFiles::load)
            .transpose()?;
        let first = usize::try_from(random_u64() % n as u64).unwrap_or(0);
        let mut attempts = Vec::new();
        for i in 0..n {
            let endpoint = &config.endpoints[(first + i) % n];
            match Store::connect_one(endpoint, pem.as_ref(), config.timeout).await {
                Ok(store) => return Ok(store),
                Err(e) => {
                    tracing::debug!(%endpoint, error = %e, "store endpoint did not answer");
                    attempts.push(e);
                }
            }
        }
        if attempts.len() == 1 {
            return Err(attempts.remove(0));
        }
        Err(StoreError::NoEndpointAnswered { attempts })
    }

    async fn connect_one(
        endpoint: &str,
        pem: Option<&TlsPem>,
        timeout: Duration,
    ) -> Result<Store, StoreError> {
        let mut options = ConnectOptions::new()
            .with_require_leader(true)
            .with_timeout(timeout)
            .with_connect_timeout(timeout)
            .with_keep_alive(KEEPALIVE_INTERVAL, timeout)
            .with_keep_alive_while_idle(true);
        if let Some(pem) = pem {
            options = options.with_tls(tls_options(endpoint, pem));
        }
        let setup = |source| StoreError::Setup {
            endpoint: endpoint.to_string(),
            source,
        };
        let connecting = Client::connect([endpoint], Some(options));
        let client = match tokio::time::timeout(timeout, connecting).await {
            Ok(client) => client.map_err(setup)?,
            Err(_) => {
                return Err(StoreError::Timeout {
                    endpoint: endpoint.to_string(),
                    operation: Operation::Status,
                    timeout,
                })
            }
        };
        let mut store = Store {
            endpoint: endpoint.to_string(),
            timeout,
            cluster_id: 0,
            ordered_progress: false,
            kv: client
                .kv_client()
                .max_decoding_message_size(MAX_RESPONSE_BYTES),
            lease: client.lease_client(),
            maintenance: client.maintenance_client(),
            watch: client
                .watch_client()
                .max_decoding_message_size(MAX_RESPONSE_BYTES),
        };
        let status = store.status().await?;
        store.cluster_id = status.cluster_id;
        store.ordered_progress = requested_progress_is_ordered(&status.version);
        Ok(store)
    }

    /// The member this connection talks to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The cluster this connection found when it connected; every later answer
    /// is checked against it ([`StoreError::ClusterChanged`]).
    pub fn cluster_id(&self) -> u64 {
        self.cluster_id
    }

    /// The member's status: revision, cluster, leader, version.
    pub async fn status(&mut self) -> Result<StoreStatus, StoreError> {
        let status = rpc(
            &self.endpoint,
            self.timeout,
            Operation::Status,
            self.maintenance.status(),
        )
        .await?;
        let header = status.header();
        let cluster_id = header.map_or(0, ResponseHeader::cluster_id);
        if self.cluster_id != 0 {
            check_cluster(&self.endpoint, self.cluster_id, header)?;
        }
        Ok(StoreStatus {
            endpoint: self.endpoint.clone(),
            revision: header.map_or(0, ResponseHeader::revision),
            cluster_id,
            member_id: header.map_or(0, ResponseHeader::member_id),
            leader: Some(status.leader()).filter(|l| *l != 0),
            version: status.version().to_string(),
        })
    }

    /// Every key under `prefixes`, read in pages of 1,000 keys (in key order, each
    /// page starting after the last key of the one before) and all at one
    /// revision: the first page's, which every later page and prefix asks for
    /// explicitly. A write during the read is therefore not seen, and watching
    /// from `revision + 1` continues exactly where the snapshot ends. If the
    /// pinned revision is compacted during the read, the read starts over at the
    /// then-current revision (at most three times).
    pub async fn snapshot(&mut self, prefixes: &[String]) -> Result<Snapshot, StoreError> {
        for attempt in 1..=SNAPSHOT_ATTEMPTS {
            match self.read_pinned(prefixes).await {
                Err(e) if is_compacted(&e) => {
                    tracing::info!(attempt, error = %e, "snapshot compacted under the read; starting over");
                }
                done => return done,
            }
        }
        Err(StoreError::SnapshotCompacted {
            endpoint: self.endpoint.clone(),
            prefixes: prefixes.to_vec(),
            attempts: SNAPSHOT_ATTEMPTS,
        })
    }

    async fn read_pinned(&mut self, prefixes: &[String]) -> Result<Snapshot, StoreError> {
        // Nothing to page through: the revision still says what "now" is.
        let mut revision = if prefixes.is_empty() {
            self.status().await?.revision
        } else {
            0
        };
        let mut kvs = Vec::new();
        for prefix in prefixes {
            let (mut from, end) = prefix_range(prefix.as_bytes());
            loop {
                let mut options = GetOptions::new()
                    .with_range(end.clone())
                    .with_limit(PAGE_KEYS);
                if revision != 0 {
                    options = options.with_revision(revision);
                }
                let operation = Operation::Range {
                    prefix: prefix.clone(),
                    revision,
                };
                let mut page = rpc(
                    &self.endpoint,
                    self.timeout,
                    operation,
                    self.kv.get(from.clone(), Some(options)),
                )
                .await?;
                check_cluster(&self.endpoint, self.cluster_id, page.header())?;
                if revision == 0 {
                    revision = page.header().map_or(0, ResponseHeader::revision);
                }
                let more = page.more();
                let page = page.take_kvs();
                let next = page.last().filter(|_| more).map(|last| {
                    let mut key = last.key().to_vec();
                    key.push(0);
                    key
                });
                kvs.extend(page.into_iter().map(Kv::from));
                match next {
                    Some(key) => from = key,
                    None => break,
                }
            }
        }
        kvs.sort_by(|a, b| a.key.cmp(&b.key));
        kvs.dedup_by(|a, b| a.key == b.key);
        Ok(Snapshot {
            revision,
            cluster_id: self.cluster_id,
            kvs,
        })
    }

    /// Watches every prefix of `positions` after its revision there (from the
    /// next one on); see [`Watch`].
    pub async fn watch(&mut self, positions: &Positions) -> Result<Watch, StoreError> {
        Watch::start(
            self.watch.clone(),
            self.endpoint.clone(),
            self.timeout,
            self.cluster_id,
            self.ordered_progress,
            positions,
        )
        .await
    }

    /// Writes `ops` in order, in transactions of at most [`MAX_TXN_OPS`]
    /// operations and about a MiB; a key that comes back within a transaction
    /// starts the next one (etcd refuses a transaction that writes one key twice,
    /// and the later write must win). Each transaction is atomic; together they
    /// are not: if one fails after others went through, the error says how many
    /// ops were applied ([`StoreError::ApplyPartly`]). Guarded deletes whose key
    /// changed are skipped and reported, the rest of their transaction applies.
    pub async fn apply(&mut self, ops: Vec<Op>) -> Result<Applied, StoreError> {
        let mut done = Applied {
            revision: 0,
            skipped: Vec::new(),
        };
        if ops.is_empty() {
            done.revision = self.status().await?.revision;
            return Ok(done);
        }
        let mut applied = 0;
        for txn in split_txns(ops) {
            let n = txn.len();
            match self.apply_txn(txn).await {
                Ok((revision, mut skipped)) => {
                    done.revision = revision;
                    done.skipped.append(&mut skipped);
                    applied += n;
                }
                Err(e) if applied == 0 => return Err(e),
                Err(e) => {
                    return Err(StoreError::ApplyPartly {
                        applied,
                        revision: done.revision,
                        source: Box::new(e),
                    })
                }
            }
        }
        Ok(done)
    }

    /// One transaction. A guarded delete or a move is a nested transaction of its own
    /// (compare the mod revision; then delete, else read the key to report what
    /// it is now), so one stale delete does not hold back its neighbours.
    async fn apply_txn(&mut self, ops: Vec<Op>) -> Result<(i64, Vec<SkippedDelete>), StoreError> {
        let operation = Operation::Txn {
            first_key: ops.first().map(|o| o.key().to_string()).unwrap_or_default(),
            ops: ops.len(),
        };
        let mut guarded = Vec::new();
        let txn_ops: Vec<TxnOp> = ops
            .into_iter()
            .enumerate()
            .map(|(i, op)| match op {
                Op::Put { key, value } => TxnOp::put(key, value, None),
                Op::Delete {
                    key,
                    if_mod_revision: None,
                } => TxnOp::delete(key, None),
                Op::Delete {
                    key,
                    if_mod_revision: Some(revision),
                } => {
                    let op = if_unchanged(&key, revision, vec![TxnOp::delete(key.clone(), None)]);
                    guarded.push((i, key, revision));
                    op
                }
                Op::Move {
                    from,
                    to,
                    value,
                    if_mod_revision: revision,
                } => {
                    let then = vec![
                        TxnOp::put(to, value, None),
                        TxnOp::delete(from.clone(), None),
                    ];
                    let op = if_unchanged(&from, revision, then);
                    guarded.push((i, from, revision));
                    op
                }
            })
            .collect();
        let response = rpc(
            &self.endpoint,
            self.timeout,
            operation,
            self.kv.txn(Txn::new().and_then(txn_ops)),
        )
        .await?;
        check_cluster(&self.endpoint, self.cluster_id, response.header())?;
        let revision = response.header().map_or(0, ResponseHeader::revision);
        let answers = response.op_responses();
        let skipped = guarded
            .into_iter()
            .filter_map(|(i, key, expected)| match answers.get(i) {
                Some(TxnOpResponse::Txn(nested)) if !nested.succeeded() => {
                    let current = match nested.op_responses().first() {
                        Some(TxnOpResponse::Get(get)) => {
                            get.kvs().first().map_or(0, KeyValue::mod_revision)
                        }
                        _ => 0,
                    };
                    Some(SkippedDelete {
                        key,
                        expected_mod_revision: expected,
                        current_mod_revision: current,
                    })
                }
                _ => None,
            })
            .collect();
        Ok((revision, skipped))
    }

    /// Puts `key` on a lease of `ttl` (whole seconds, at least one) kept alive in
    /// the background; see [`LeasedKey`].
    pub async fn lease_key(
        &mut self,
        key: impl Into<String>,
        value: Vec<u8>,
        ttl: Duration,
    ) -> Result<LeasedKey, StoreError> {
        LeasedKey::start(
            self.kv.clone(),
            self.lease.clone(),
            self.endpoint.clone(),
            self.timeout,
            key.into(),
            value,
            ttl,
        )
        .await
    }
}

/// A nested transaction: `then` if `key` is still at mod revision `revision`,
/// else a read of `key`, to report what it is now.
fn if_unchanged(key: &str, revision: i64, then: Vec<TxnOp>) -> TxnOp {
    TxnOp::txn(
        Txn::new()
            .when([Compare::mod_revision(key, CompareOp::Equal, revision)])
            .and_then(then)
            .or_else([TxnOp::get(key, None)]),
    )
}

/// The client's TLS setup: our CA only (not the system's roots: the store's
/// certificates come from the fleet's own CA) and our certificate. The server's
/// name to verify is the endpoint's host; for an IPv6 literal without the
/// brackets, so that it is checked against the certificate's IP SANs.
fn tls_options(endpoint: &str, pem: &TlsPem) -> TlsOptions {
    let options = TlsOptions::new()
        .ca_certificate(Certificate::from_pem(&pem.ca))
        .identity(Identity::from_pem(&pem.cert, &pem.key));
    match endpoint_host(endpoint) {
        Some(host) => options.domain_name(host),
        None => options,
    }
}

/// The host of `scheme://host:port/...`, IPv6 brackets removed.
fn endpoint_host(endpoint: &str) -> Option<&str> {
    let rest = endpoint.split_once("://").map_or(endpoint, |(_, r)| r);
    let authority = rest.split('/').next()?;
    if let Some(v6) = authority.strip_prefix('[') {
        return v6.split_once(']').map(|(host, _)| host);
    }
    authority.split(':').next().filter(|h| !h.is_empty())
}

/// Whether the member sends requested progress notifications in order with the
/// events of its watch stream. Before etcd 3.4.31 and 3.5.13 it may send one
/// ahead of events of lower revisions (etcd issues 15220 and 17507); those are the
/// versions Kubernetes also requires before it relies on them.
pub(crate) fn requested_progress_is_ordered(version: &str) -> bool {
    let mut parts = version
        .split(['.', '-', '+'])
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor, patch) = (
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
    );
    match (major, minor) {
        (3, 4) => patch >= 31,
        (3, 5) => patch >= 13,
        (3, m) => m >= 6,
        (m, _) => m > 3,
    }
}

/// The key range `[start, end)` of a prefix, as etcd spells it: the end is the
/// prefix with its last byte below 0xff incremented; an empty prefix is every key.
pub(crate) fn prefix_range(prefix: &[u8]) -> (Vec<u8>, Vec<u8>) {
    if prefix.is_empty() {
        return (vec![0], vec![0]);
    }
    match prefix.iter().rposition(|b| *b < 0xff) {
        Some(i) => {
            let mut end = prefix[..=i].to_vec();
            end[i] += 1;
            (prefix.to_vec(), end)
        }
        None => (prefix.to_vec(), vec![0]),
    }
}

/// Groups ops into transactions: at most [`MAX_TXN_OPS`] ops and about
/// [`MAX_TXN_BYTES`] each, and never one key twice in one transaction. etcd
/// counts a nested transaction (a guarded delete is one) against what the outer
/// one leaves of `--max-txn-ops`, so a transaction holding a guarded delete holds
/// one op less.
fn split_txns(ops: Vec<Op>) -> Vec<Vec<Op>> {
    let mut txns = Vec::new();
    let mut current: Vec<Op> = Vec::new();
    let mut keys: HashSet<String> = HashSet::new();
    let mut bytes = 0;
    let mut nested = false;
    for op in ops {
        let guarded = op.is_guarded();
        let room = if nested || guarded {
            MAX_TXN_OPS - 1
        } else {
            MAX_TXN_OPS
        };
        let full = current.len() >= room
            || (!current.is_empty() && bytes + op.bytes() > MAX_TXN_BYTES)
            || keys.contains(op.key());
        if full {
            txns.push(std::mem::take(&mut current));
            keys.clear();
            bytes = 0;
            nested = false;
        }
        bytes += op.bytes();
        nested |= guarded;
        keys.insert(op.key().to_string());
        current.push(op);
    }
    if !current.is_empty() {
        txns.push(current);
    }
    txns
}

impl From<KeyValue> for Kv {
    fn from(kv: KeyValue) -> Kv {
        let mod_revision = kv.mod_revision();
        let (key, value) = kv.into_key_value();
        Kv {
            key: String::from_utf8_lossy(&key).into_owned(),
            value,
            mod_revision,
        }
    }
}

/// etcd's "required revision has been compacted" (`OutOfRange`).
fn is_compacted(e: &StoreError) -> bool {
    matches!(
        e,
        StoreError::Rpc {
            source: etcd_client::Error::GRpcStatus(status),
            ..
        } if status.code() == tonic::Code::OutOfRange && status.message().contains("compacted")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &str, len: usize) -> Op {
        Op::Put {
            key: key.to_string(),
            value: vec![b'x'; len],
        }
    }

    #[test]
    fn transactions_hold_at_most_max_txn_ops() {
        let ops: Vec<Op> = (0..300).map(|i| put(&format!("k{i}"), 10)).collect();
        let sizes: Vec<usize> = split_txns(ops).iter().map(Vec::len).collect();
        assert_eq!(sizes, [128, 128, 44]);
    }

    #[test]
    fn transactions_with_guarded_deletes_hold_one_op_less() {
        let guarded = |i: usize| Op::Delete {
            key: format!("d{i}"),
            if_mod_revision: Some(5),
        };
        let ops: Vec<Op> = (0..300).map(guarded).collect();
        let sizes: Vec<usize> = split_txns(ops).iter().map(Vec::len).collect();
        assert_eq!(sizes, [127, 127, 46]);
        // 127 puts, then a guarded delete: the delete starts the next one.
        let mut ops: Vec<Op> = (0..127).map(|i| put(&format!("k{i}"), 1)).collect();
        ops.push(guarded(0));
        ops.push(put("z", 1));
        let sizes: Vec<usize> = split_txns(ops).iter().map(Vec::len).collect();
        assert_eq!(sizes, [127, 2]);
    }

    #[test]
    fn transactions_stay_under_the_request_size() {
        let ops: Vec<Op> = (0..40).map(|i| put(&format!("k{i}"), 64 << 10)).collect();
        let txns = split_txns(ops);
        assert!(txns.len() >= 3);
        for txn in &txns {
            assert!(txn.iter().map(Op::bytes).sum::<usize>() <= MAX_TXN_BYTES);
        }
        // One op too large for any transaction still goes, alone (etcd says why).
        assert_eq!(split_txns(vec![put("big", 2 << 20)]).len(), 1);
    }

    #[test]
    fn a_repeated_key_starts_a_new_transaction_in_order() {
        let ops = vec![
            put("a", 1),
            put("b", 1),
            Op::Delete {
                key: "a".into(),
                if_mod_revision: None,
            },
            put("c", 1),
        ];
        let txns = split_txns(ops);
        let keys: Vec<Vec<&str>> = txns
            .iter()
            .map(|t| t.iter().map(Op::key).collect())
            .collect();
        assert_eq!(keys, [vec!["a", "b"], vec!["a", "c"]]);
    }

    #[test]
    fn prefix_ranges_match_etcd() {
        assert_eq!(prefix_range(b"/a/"), (b"/a/".to_vec(), b"/a0".to_vec()));
        assert_eq!(prefix_range(b"a\xff"), (b"a\xff".to_vec(), b"b".to_vec()));
        assert_eq!(prefix_range(b"\xff"), (b"\xff".to_vec(), vec![0]));
        assert_eq!(prefix_range(b""), (vec![0], vec![0]));
    }

    #[test]
    fn requested_progress_is_trusted_from_the_fixed_releases_on() {
        for v in [
            "3.4.31",
            "3.4.40",
            "3.5.13",
            "3.5.21",
            "3.6.0",
            "3.6.5-rc.1",
            "4.0.0",
        ] {
            assert!(requested_progress_is_ordered(v), "{v}");
        }
        for v in ["3.4.23", "3.4.30", "3.5.12", "3.3.27", "", "garbage"] {
            assert!(!requested_progress_is_ordered(v), "{v}");
        }
    }

    #[test]
    fn endpoint_hosts_lose_their_brackets() {
        assert_eq!(
            endpoint_host("https://[fd00:99::e1]:2379"),
            Some("fd00:99::e1")
        );
        assert_eq!(endpoint_host("https://127.0.0.1:2379"), Some("127.0.0.1"));
        assert_eq!(endpoint_host("https://etcd1:2379/"), Some("etcd1"));
        assert_eq!(endpoint_host("10.0.0.1:2379"), Some("10.0.0.1"));
    }
}
