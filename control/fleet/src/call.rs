//! One request to one member, as every room of the crate makes it: bounded by the
//! connection's deadline (which tonic's own timeout does not cover while a
//! connection is still being made) and checked to come from the cluster the
//! connection was made to.

use crate::error::{Operation, StoreError};
use etcd_client::ResponseHeader;
use std::future::Future;
use std::time::Duration;

/// Runs one request with the connection's deadline. tonic's own timeout does
/// not cover waiting for a connection that cannot be made; this one does.
pub(crate) async fn rpc<T>(
    endpoint: &str,
    timeout: Duration,
    operation: Operation,
    request: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(timeout, request).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(source)) => Err(StoreError::Rpc {
            endpoint: endpoint.to_string(),
            operation,
            source,
        }),
        Err(_) => Err(StoreError::Timeout {
            endpoint: endpoint.to_string(),
            operation,
            timeout,
        }),
    }
}

/// Refuses an answer from another cluster than the connection's: the endpoint's
/// address now leads to a different store (tonic reconnects underneath us).
pub(crate) fn check_cluster(
    endpoint: &str,
    expected: u64,
    header: Option<&ResponseHeader>,
) -> Result<(), StoreError> {
    match header.map(ResponseHeader::cluster_id) {
        Some(got) if got != 0 && got != expected => Err(StoreError::ClusterChanged {
            endpoint: endpoint.to_string(),
            expected,
            got,
        }),
        _ => Ok(()),
    }
}
