//! A port's live state leaving one sled and entering another (`export-port`,
//! `import-port`, docs/operating.md "Moving a port"): the firewall's connections
//! with their TCP tracking and the NAT state they hold. Imported into a port made
//! for them (paused, empty), the guest's connections go on where they were: an
//! inbound segment of one is not refused as mid-stream (`fw_midstream_in`), its
//! sequence numbers are checked against the same windows, and a NAT-ed connection
//! keeps its external source port.
//!
//! What does not move: the flow tables (compiled again from the connections on
//! the first packet each way), the rate limits' buckets (they start full), and the
//! port's counters (the new sled's start at zero; each connection keeps its own).

use super::Engine;
use crate::machinery::conntrack::{ConnImportError, ConnRecord};
use crate::machinery::flow::FlowKey;
use crate::pipeline::error::EngineError;
use crate::vpc::nat::{NatImportError, NatRecords};
use serde::{Deserialize, Serialize};
use std::net::IpAddr;

/// A port's live state, as its export carries it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortFlows {
    pub connections: Vec<ConnRecord>,
    #[serde(default)]
    pub nat: NatRecords,
}

/// What an import put into the port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Imported {
    pub connections: usize,
    pub snat_ports: usize,
}

/// Why a port's flows could not be imported. Nothing was.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FlowImportError {
    #[error(transparent)]
    Connections(#[from] ConnImportError),
    #[error(transparent)]
    Nat(#[from] NatImportError),
    #[error("connection {index} ({key:?}) is in VNI {}, the port in VNI {port_vni}", key.vni)]
    WrongVni {
        index: usize,
        key: FlowKey,
        port_vni: u32,
    },
    #[error("connection {index} ({key:?}) is from {}, which is neither an address of the port nor in a prefix it may send from", key.src_ip)]
    NotPortAddress { index: usize, key: FlowKey },
}

impl Engine {
    /// The port's live connections and the NAT state they hold.
    pub fn export_flows(&self, port: &str) -> Result<PortFlows, EngineError> {
        let p = self.port_by_name(port)?;
        Ok(PortFlows {
            connections: p.fw.conns().export(self.now),
            nat: p.snat.export(p.fw.conns(), self.now),
        })
    }

    /// Puts `flows` (another sled's export) into port `port`, which holds no
    /// connection yet; all or nothing. Every connection must be the port's own
    /// (its VNI, from its addresses), as a frame the port sent would have to be.
    pub fn import_flows(&mut self, port: &str, flows: &PortFlows) -> Result<Imported, EngineError> {
        let now = self.now;
        let p = self.port_by_name_mut(port)?;
        let refused = |error: FlowImportError| EngineError::Import {
            port: port.to_string(),
            error,
        };
        let cfg = &p.cfg;
        let own = |ip: IpAddr| match ip {
            IpAddr::V4(a) => cfg.ipv4 == Some(a),
            IpAddr::V6(a) => cfg.ipv6 == Some(a),
        };
        for (index, r) in flows.connections.iter().enumerate() {
            let key = r.key;
            if key.vni != cfg.vni.get() {
                return Err(refused(FlowImportError::WrongVni {
                    index,
                    key,
                    port_vni: cfg.vni.get(),
                }));
            }
            if !own(key.src_ip) && !cfg.cidrs.admits_out(key.src_ip) {
                return Err(refused(FlowImportError::NotPortAddress { index, key }));
            }
        }
        let handles =
            p.fw.conns_mut()
                .import(&flows.connections, now)
                .map_err(|e| refused(e.into()))?;
        let keyed: Vec<_> = flows
            .connections
            .iter()
            .map(|r| r.key)
            .zip(handles)
            .collect();
        if let Err(e) = p.snat.import(&flows.nat, &p.cfg.external, &keyed) {
            p.fw.conns_mut().clear();
            return Err(refused(e.into()));
        }
        p.epoch += 1;
        Ok(Imported {
            connections: flows.connections.len(),
            snat_ports: flows.nat.snat.len(),
        })
    }
}
