//! A port's NAT state leaving one sled and entering another (port migration): the
//! SNAT ports its live connections hold, and where replies of inbound connections
//! to a non-default 1:1 address leave from. A NAT-ed connection that moved with
//! its port keeps its external source port, so the remote end sees the same
//! connection; without this the new sled would allocate another port and the
//! connection would break.

use super::{private_key, Binding, ExternalIps, PrivateKey, SnatRange, SnatTable, REPLY_FROM_MAX};
use crate::machinery::conntrack::{ConnHandle, ConnTable};
use crate::machinery::flow::FlowKey;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::net::IpAddr;

/// A SNAT port held by a live connection, as a port's export carries it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnatRecord {
    pub proto: u8,
    /// The external source port (of the port's SNAT range).
    pub port: u16,
    pub private_port: u16,
    pub remote_ip: IpAddr,
    pub remote_port: u16,
}

/// An inbound connection to one of the port's 1:1 addresses other than the one its
/// own flows leave from: its replies leave from `external_ip`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplyFromRecord {
    pub proto: u8,
    pub private_port: u16,
    pub remote_ip: IpAddr,
    pub remote_port: u16,
    pub external_ip: IpAddr,
}

/// The NAT state of a port's live connections.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NatRecords {
    #[serde(default)]
    pub snat: Vec<SnatRecord>,
    #[serde(default)]
    pub reply_from: Vec<ReplyFromRecord>,
}

/// Why NAT records could not go into a port. Nothing went in.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NatImportError {
    #[error("SNAT port {proto}/{port} is outside the port's SNAT range ({range})")]
    OutsideRange { proto: u8, port: u16, range: String },
    #[error("SNAT port {proto}/{port} is given twice")]
    Duplicate { proto: u8, port: u16 },
    #[error("SNAT port {proto}/{port} (private port {private_port} to {remote_ip}) belongs to no imported connection")]
    NoConnection {
        proto: u8,
        port: u16,
        private_port: u16,
        remote_ip: IpAddr,
    },
    #[error("replies to {remote_ip} leave from {external_ip}, which is not a floating or ephemeral address of the port")]
    NotOneToOne {
        remote_ip: IpAddr,
        external_ip: IpAddr,
    },
    #[error("replies of the connection from {remote_ip} port {remote_port} are given twice, or belong to no imported connection")]
    ReplyFromUnmatched { remote_ip: IpAddr, remote_port: u16 },
    #[error("{count} reply addresses are more than a port keeps ({REPLY_FROM_MAX})")]
    TooManyReplyFrom { count: usize },
    #[error("SNAT port {proto}/{port} matches more than one imported connection (from addresses of the port and of a prefix it may send from)")]
    Ambiguous { proto: u8, port: u16 },
}

impl SnatTable {
    /// The state of the live connections (a mapping whose connection is gone is
    /// free for the next flow, and does not move).
    pub fn export(&self, conns: &ConnTable, now: u64) -> NatRecords {
        let live = |h: &Option<ConnHandle>| h.is_some_and(|h| conns.is_live(h, now));
        let mut snat: Vec<SnatRecord> = self
            .by_port
            .iter()
            .filter(|(_, b)| live(&b.conn))
            .map(|(&(proto, port), b)| SnatRecord {
                proto,
                port,
                private_port: b.private_port,
                remote_ip: b.remote_ip,
                remote_port: b.remote_port,
            })
            .collect();
        snat.sort_by_key(|r| (r.proto, r.port));
        let mut reply_from: Vec<ReplyFromRecord> = self
            .reply_from
            .iter()
            .filter(|(_, (_, h))| conns.is_live(*h, now))
            .map(
                |(&(proto, private_port, remote_ip, remote_port), &(ip, _))| ReplyFromRecord {
                    proto,
                    private_port,
                    remote_ip,
                    remote_port,
                    external_ip: ip,
                },
            )
            .collect();
        reply_from.sort_by_key(|r| (r.proto, r.private_port, r.remote_ip, r.remote_port));
        NatRecords { snat, reply_from }
    }

    /// Makes `records` this table, each tied to the imported connection of its
    /// flow (`conns`: connection key and handle), all or none. The SNAT ports must
    /// lie in the port's range here (`ext`). For a port without connections, whose
    /// table holds only free ports.
    pub fn import(
        &mut self,
        records: &NatRecords,
        ext: &ExternalIps,
        conns: &[(FlowKey, ConnHandle)],
    ) -> Result<(), NatImportError> {
        if records.reply_from.len() > REPLY_FROM_MAX {
            return Err(NatImportError::TooManyReplyFrom {
                count: records.reply_from.len(),
            });
        }
        // NAT state is keyed without the guest's address (`PrivateKey`): two
        // connections that differ only in it cannot both hold one.
        let mut handles: HashMap<PrivateKey, Option<ConnHandle>> = HashMap::new();
        for (k, h) in conns {
            handles
                .entry(private_key(k))
                .and_modify(|e| *e = None)
                .or_insert(Some(*h));
        }
        let mut by_port = HashMap::new();
        let mut by_private = HashMap::new();
        for r in &records.snat {
            let in_range = |s: &SnatRange| {
                s.ip.is_ipv4() == r.remote_ip.is_ipv4() && (s.start..=s.end).contains(&r.port)
            };
            if !ext.snat.as_ref().is_some_and(in_range) {
                return Err(NatImportError::OutsideRange {
                    proto: r.proto,
                    port: r.port,
                    range: ext.snat.map_or("none".into(), |s| {
                        format!("{} ports {}-{}", s.ip, s.start, s.end)
                    }),
                });
            }
            let pk = (r.proto, r.private_port, r.remote_ip, r.remote_port);
            let h = match handles.get(&pk) {
                Some(Some(h)) => *h,
                Some(None) => {
                    return Err(NatImportError::Ambiguous {
                        proto: r.proto,
                        port: r.port,
                    })
                }
                None => {
                    return Err(NatImportError::NoConnection {
                        proto: r.proto,
                        port: r.port,
                        private_port: r.private_port,
                        remote_ip: r.remote_ip,
                    })
                }
            };
            let binding = Binding {
                private_port: r.private_port,
                remote_ip: r.remote_ip,
                remote_port: r.remote_port,
                conn: Some(h),
            };
            if by_port.insert((r.proto, r.port), binding).is_some()
                || by_private.insert(pk, r.port).is_some()
            {
                return Err(NatImportError::Duplicate {
                    proto: r.proto,
                    port: r.port,
                });
            }
        }
        let mut reply_from = HashMap::new();
        for r in &records.reply_from {
            if !ext.is_one_to_one(r.external_ip) || r.external_ip.is_ipv4() != r.remote_ip.is_ipv4()
            {
                return Err(NatImportError::NotOneToOne {
                    remote_ip: r.remote_ip,
                    external_ip: r.external_ip,
                });
            }
            let pk = (r.proto, r.private_port, r.remote_ip, r.remote_port);
            let unmatched = NatImportError::ReplyFromUnmatched {
                remote_ip: r.remote_ip,
                remote_port: r.remote_port,
            };
            let h = handles
                .get(&pk)
                .copied()
                .flatten()
                .ok_or(unmatched.clone())?;
            if reply_from.insert(pk, (r.external_ip, h)).is_some() {
                return Err(unmatched);
            }
        }
        // What the table held belongs to no connection (the port's connection
        // table was empty): free ports, which the imported ones replace.
        self.clear();
        self.by_port.extend(by_port);
        self.by_private.extend(by_private);
        self.reply_from.extend(reply_from);
        Ok(())
    }
}
