//! What failed talking to the store, where (endpoint, key, revision), and whether
//! trying again elsewhere or later may help.

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::time::Duration;
use tonic::Code;

/// The request a [`StoreError::Rpc`] or [`StoreError::Timeout`] was about, with the
/// key or prefix and the revision it named.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Operation {
    /// The status request that also checks a member at connect.
    Status,
    /// One page of a snapshot; revision 0 is the first page (not yet pinned).
    Range { prefix: String, revision: i64 },
    /// One transaction of [`crate::Store::apply`], named by its first key and
    /// its number of operations.
    Txn { first_key: String, ops: usize },
    /// Opening a watch, or the stream of one (named by its first prefix and the
    /// revision it would resume from).
    Watch { prefix: String, from_revision: i64 },
    /// The lease of a [`crate::LeasedKey`].
    LeaseGrant { ttl_secs: i64 },
    /// A keep-alive of a lease (ids in hex, as etcdctl prints them).
    LeaseKeepAlive { lease: i64 },
    /// [`crate::LeasedKey::revoke`].
    LeaseRevoke { lease: i64 },
    /// A put of a [`crate::LeasedKey`].
    Put { key: String },
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Operation::Status => write!(f, "status"),
            Operation::Range {
                prefix,
                revision: 0,
            } => write!(f, "range read of {prefix}"),
            Operation::Range { prefix, revision } => {
                write!(f, "range read of {prefix} at revision {revision}")
            }
            Operation::Txn { first_key, ops } => {
                write!(f, "transaction of {ops} ops from {first_key}")
            }
            Operation::Watch {
                prefix,
                from_revision,
            } => write!(f, "watch of {prefix} from revision {from_revision}"),
            Operation::LeaseGrant { ttl_secs } => write!(f, "lease grant ({ttl_secs}s)"),
            Operation::LeaseKeepAlive { lease } => write!(f, "keep-alive of lease {lease:x}"),
            Operation::LeaseRevoke { lease } => write!(f, "revoke of lease {lease:x}"),
            Operation::Put { key } => write!(f, "put of {key}"),
        }
    }
}

/// Why a store operation failed. [`StoreError::is_transient`] sorts them into
/// those worth a reconnect (to another member, after a back-off) and those that
/// the same request would meet again (a refused certificate, a permission, a bad
/// argument) and that need a person.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// [`crate::StoreConfig::endpoints`] is empty.
    #[error("no store endpoints given")]
    NoEndpoints,
    /// A TLS file cannot be read.
    #[error("cannot read {path}: {source}")]
    ReadFile {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// [`crate::TlsFiles::load`] refuses a key file its group or others may use.
    #[error(
        "{path} has mode {mode:04o}: a key file must be readable by its owner alone \
         (0600 or stricter)"
    )]
    KeyFileMode { path: PathBuf, mode: u32 },
    /// The client certificate file holds no certificate that can be read.
    #[error("client certificate {}: {why}", path.display())]
    Certificate { path: PathBuf, why: String },
    /// The client certificate is not valid now: a member would refuse it.
    #[error(
        "client certificate {} is not valid now: valid from {not_before} to {not_after}",
        path.display()
    )]
    CertificateNotValid {
        path: PathBuf,
        not_before: String,
        not_after: String,
    },
    /// The endpoint or the TLS material could not even be set up (a malformed URL,
    /// unparsable PEM).
    #[error("cannot set up a connection to {endpoint}: {source}")]
    Setup {
        endpoint: String,
        #[source]
        source: etcd_client::Error,
    },
    /// A request failed at the member: etcd's answer (a gRPC status) or the
    /// transport's (connection refused, TLS), with the causes etcd-client hides.
    #[error("{operation} at {endpoint}: {}", detail(.source))]
    Rpc {
        endpoint: String,
        operation: Operation,
        #[source]
        source: etcd_client::Error,
    },
    /// A request got no answer within [`crate::StoreConfig::timeout`].
    #[error("{operation} at {endpoint}: no answer within {timeout:?}")]
    Timeout {
        endpoint: String,
        operation: Operation,
        timeout: Duration,
    },
    /// [`crate::Store::connect`] tried every endpoint; one error per endpoint.
    #[error("no store endpoint answered: {}", list(.attempts))]
    NoEndpointAnswered { attempts: Vec<StoreError> },
    /// A snapshot's pinned revision was compacted away under it every time it was
    /// tried (someone compacts in a tight loop: compaction is not permission
    /// checked in etcd 3.4).
    #[error("snapshot of {prefixes:?} at {endpoint}: compacted under the read {attempts} times")]
    SnapshotCompacted {
        endpoint: String,
        prefixes: Vec<String>,
        attempts: u32,
    },
    /// The store cancelled one prefix's watcher for a reason other than compaction
    /// (typically a permission: the sled no longer may read that VPC).
    #[error("watch of {prefix} at {endpoint} cancelled by the store: {reason}")]
    WatchCanceled {
        endpoint: String,
        prefix: String,
        reason: String,
    },
    /// The watch stream ended (the member closed it) or was used after it reported
    /// [`crate::WatchEvent::Compacted`].
    #[error("watch at {endpoint} ended")]
    WatchEnded { endpoint: String },
    /// An answer came from another cluster than the one the connection found
    /// (the endpoint's address now leads to another store): the caller's alarm,
    /// not a reason to obey the new store.
    #[error(
        "{endpoint} answers for cluster {got:x}; this connection began with cluster {expected:x}"
    )]
    ClusterChanged {
        endpoint: String,
        expected: u64,
        got: u64,
    },
    /// A prefix that contains, or lies within, one the watch has: each key must
    /// belong to one prefix, whose position says what of it was delivered.
    #[error("{prefix} overlaps {watched}, which is watched")]
    OverlappingPrefix { prefix: String, watched: String },
    /// [`crate::Store::watch`] with no prefixes (a stream needs a first watcher).
    #[error("a watch needs at least one prefix")]
    NothingToWatch,
    /// A watch start below 1 (etcd would read 0 as "from now", and miss changes).
    #[error("watch from revision {0}: revisions start at 1")]
    InvalidRevision(i64),
    /// [`crate::Watch::add_prefix`] of a prefix the watch has.
    #[error("{prefix} is watched already")]
    AlreadyWatched { prefix: String },
    /// [`crate::Watch::remove_prefix`] of a prefix the watch does not have.
    #[error("{prefix} is not watched")]
    NotWatched { prefix: String },
    /// [`crate::Store::apply`] failed after earlier transactions went through:
    /// those stay applied (transactions are atomic one by one, not together).
    #[error("the first {applied} ops were applied (revision {revision}), then: {source}")]
    ApplyPartly {
        applied: usize,
        revision: i64,
        #[source]
        source: Box<StoreError>,
    },
}

impl StoreError {
    /// True when another try may work without anyone changing anything: the member
    /// is down, unreachable, without a leader (`with_require_leader`), overloaded,
    /// or slow. The caller reconnects (another member) after a [`crate::Backoff`]
    /// wait. False when the same request would meet the same answer: a refused or
    /// unreadable certificate, a permission, a malformed request, a cluster that
    /// changed identity (an operator must `adopt` it).
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Rpc { source, .. } => transient_client_error(source),
            StoreError::Timeout { .. }
            | StoreError::WatchEnded { .. }
            | StoreError::SnapshotCompacted { .. } => true,
            StoreError::NoEndpointAnswered { attempts } => {
                attempts.iter().any(StoreError::is_transient)
            }
            StoreError::ApplyPartly { source, .. } => source.is_transient(),
            StoreError::NoEndpoints
            | StoreError::ReadFile { .. }
            | StoreError::KeyFileMode { .. }
            | StoreError::Certificate { .. }
            | StoreError::CertificateNotValid { .. }
            | StoreError::Setup { .. }
            | StoreError::WatchCanceled { .. }
            | StoreError::ClusterChanged { .. }
            | StoreError::OverlappingPrefix { .. }
            | StoreError::NothingToWatch
            | StoreError::InvalidRevision(_)
            | StoreError::AlreadyWatched { .. }
            | StoreError::NotWatched { .. } => false,
        }
    }
}

/// etcd's own codes (etcdserver/api/v3rpc/rpctypes): "no leader", "leader
/// changed", "request timed out" are `Unavailable`; a compacted revision is
/// `OutOfRange`; permissions `PermissionDenied`; too many ops or too large a
/// request `InvalidArgument`; a full database `ResourceExhausted` (an operator
/// must compact or defragment; meanwhile retrying later is harmless).
fn transient_client_error(e: &etcd_client::Error) -> bool {
    use etcd_client::Error as E;
    match e {
        E::GRpcStatus(status) => {
            let retry_code = matches!(
                status.code(),
                Code::Unavailable
                    | Code::DeadlineExceeded
                    | Code::Cancelled
                    | Code::Aborted
                    | Code::ResourceExhausted
                    | Code::Unknown
                    | Code::Internal
            );
            retry_code && !tls_refused(status)
        }
        E::TransportError(t) => !tls_refused(t),
        E::IoError(_) | E::WatchError(_) | E::LeaseKeepAliveError(_) => true,
        _ => false,
    }
}

/// A TLS failure (an unknown CA, a refused client certificate, a name or address
/// the certificate does not cover) reaches us as a transport error whose chain
/// holds an `io::Error` of kind `InvalidData` (how tokio-rustls reports TLS
/// errors) or rustls's own error: the next member would refuse the same way.
fn tls_refused(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if let Some(io) = c.downcast_ref::<io::Error>() {
            if io.kind() == io::ErrorKind::InvalidData {
                return true;
            }
        }
        let text = c.to_string();
        if text.contains("certificate") || text.contains("received fatal alert") {
            return true;
        }
        cause = c.source();
    }
    false
}

fn list(attempts: &[StoreError]) -> String {
    attempts
        .iter()
        .map(StoreError::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// etcd-client's error with the causes it hides: its `Display` of a transport
/// error is "transport error: transport error", and the useful part ("connection
/// refused", "invalid peer certificate: UnknownIssuer") is further down the chain.
fn detail(e: &etcd_client::Error) -> String {
    let (mut text, mut cause): (String, Option<&(dyn std::error::Error + 'static)>) = match e {
        etcd_client::Error::GRpcStatus(status) => (
            format!("{:?}: {}", status.code(), status.message()),
            std::error::Error::source(status),
        ),
        etcd_client::Error::TransportError(t) => {
            ("transport error".to_string(), std::error::Error::source(t))
        }
        other => (other.to_string(), None),
    };
    // Layers often repeat their inner error's words: say each part once.
    while let Some(c) = cause {
        let part = c.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        cause = c.source();
    }
    text
}
