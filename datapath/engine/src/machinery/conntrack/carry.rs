//! A port's connections leaving one sled and entering another (port migration:
//! `export-port`, `import-port`). Each travels as a [`ConnRecord`] whose clocks are
//! durations (its age, how long it has been idle), never this engine's clock
//! values, which mean nothing on another sled: the importing table counts the
//! idle time on from where it was, so a connection keeps exactly the life it had
//! left.

use super::{Conn, ConnHandle, ConnTable, TcpConn, Traffic};
use crate::machinery::flow::{FlowKey, PROTO_TCP};
use crate::machinery::rule::Direction;
use serde::{Deserialize, Serialize};

/// One live connection of a port, as its export carries it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConnRecord {
    /// The flow with the guest as source.
    pub key: FlowKey,
    /// Who sent its first packet.
    pub initiator: Direction,
    /// Whether the other side has answered.
    pub replied: bool,
    pub age_ns: u64,
    pub idle_ns: u64,
    /// What the guest sent on it.
    pub out: Traffic,
    /// What the guest received on it.
    #[serde(rename = "in")]
    pub inb: Traffic,
    /// TCP state and both sides' sequence numbers: present exactly for TCP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp: Option<TcpConn>,
}

/// Why records could not go into a table. Nothing went in.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConnImportError {
    #[error("the port has {flows} connections already (connections go into a new port)")]
    NotEmpty { flows: u64 },
    #[error("{count} connections are more than the port's limit of {limit}")]
    TooMany { count: usize, limit: usize },
    #[error("connection {index} ({key:?}) is given twice")]
    Duplicate { index: usize, key: FlowKey },
    #[error(
        "connection {index} ({key:?}) is TCP without TCP state, or has TCP state without being TCP"
    )]
    TcpMismatch { index: usize, key: FlowKey },
    #[error("connection {index} ({key:?}) has been idle {idle_ns} ns, past its timeout here ({timeout_ns} ns)")]
    Expired {
        index: usize,
        key: FlowKey,
        idle_ns: u64,
        timeout_ns: u64,
    },
}

impl ConnTable {
    /// The live connections as records. One idle past its timeout does not move:
    /// the sweep would take it anyway.
    pub fn export(&self, now: u64) -> Vec<ConnRecord> {
        self.slots
            .iter()
            .filter_map(|s| s.conn.as_ref())
            .filter(|(_, c)| c.live(now, &self.limits))
            .map(|(k, c)| ConnRecord {
                key: *k,
                initiator: c.initiator,
                replied: c.replied,
                age_ns: now.saturating_sub(c.created),
                idle_ns: now.saturating_sub(c.last_seen),
                out: c.out,
                inb: c.inb,
                tcp: c.tcp,
            })
            .collect()
    }

    /// Puts `records` into this table, which must be empty (a port just made for
    /// them), all or none; their handles, in order. A record idle past its timeout
    /// here is refused (an export holds live connections only).
    ///
    /// This engine's clock starts with its worker, so a connection idle longer
    /// than the clock has run is taken as idle since the clock started: it lives
    /// at most that much longer than it would have on the old sled, never less.
    pub fn import(
        &mut self,
        records: &[ConnRecord],
        now: u64,
    ) -> Result<Vec<ConnHandle>, ConnImportError> {
        if !self.index.is_empty() {
            return Err(ConnImportError::NotEmpty {
                flows: self.index.len() as u64,
            });
        }
        let limit = self.limits.fw_flow_limit;
        if records.len() > limit {
            return Err(ConnImportError::TooMany {
                count: records.len(),
                limit,
            });
        }
        let conn = |r: &ConnRecord| Conn {
            tcp: r.tcp,
            initiator: r.initiator,
            replied: r.replied,
            created: now.saturating_sub(r.age_ns),
            last_seen: now.saturating_sub(r.idle_ns),
            out: r.out,
            inb: r.inb,
        };
        let mut seen = std::collections::HashSet::with_capacity(records.len());
        for (index, r) in records.iter().enumerate() {
            if !seen.insert(r.key) {
                return Err(ConnImportError::Duplicate { index, key: r.key });
            }
            if (r.key.proto == PROTO_TCP) != r.tcp.is_some() {
                return Err(ConnImportError::TcpMismatch { index, key: r.key });
            }
            let timeout_ns = conn(r).timeout(&self.limits);
            if r.idle_ns >= timeout_ns {
                return Err(ConnImportError::Expired {
                    index,
                    key: r.key,
                    idle_ns: r.idle_ns,
                    timeout_ns,
                });
            }
        }
        Ok(records
            .iter()
            .map(|r| self.occupy(r.key, conn(r)))
            .collect())
    }
}
