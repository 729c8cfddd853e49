//! A port's live state leaving one sled and entering another (`export-port`,
//! `import-port`, docs/operating.md "Moving a port"): the firewall's connections
//! with their TCP tracking and the NAT state they hold. Imported into a port made
//! for them (paused, empty), the guest's connections go on where they were: an
//! inbound segment of one is not refused as mid-stream (`fw_midstream_in`), its
//! sequence numbers are checked against the same windows, and a NAT-ed connection
//! keeps its external source port.
//!
//! The rate limits' buckets move as they are (a guest that spent its burst does
//! not get a new one by moving). What does not move: the flow tables (compiled
//! again from the connections on the first packet each way) and the port's
//! counters (the new sled's start at zero; each connection keeps its own).
//!
//! For a grace period after the move (`vpc::moved`), the old sled relays the
//! frames still sent to it for the guest ([`Engine::relay_departed_to`], `relay.rs`)
//! and the new port admits them from the sled the export names.

use super::Engine;
use crate::ids::Vni;
use crate::machinery::conntrack::{ConnImportError, ConnRecord};
use crate::machinery::flow::FlowKey;
use crate::machinery::ratelimit::BucketLevels;
use crate::pipeline::error::EngineError;
use crate::vpc::moved::Arrival;
use crate::vpc::nat::{NatImportError, NatRecords};
use serde::{Deserialize, Serialize};
use std::net::{IpAddr, Ipv6Addr};
use wire::MacAddr;

/// A port's live state, as its export carries it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LiveState {
    pub connections: Vec<ConnRecord>,
    #[serde(default)]
    pub nat: NatRecords,
    /// How much of its rate limits the guest has spent.
    #[serde(default)]
    pub buckets: BucketLevels,
    /// The underlay address of the sled the port leaves: the port it is
    /// imported into admits that sled's relayed frames for the grace period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_sled: Option<Ipv6Addr>,
}

/// What an import put into the port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Imported {
    pub connections: usize,
    pub snat_ports: usize,
}

/// Why a port's live state could not be imported. Nothing was.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LiveImportError {
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
    #[error("connection {index} ({key:?}) is between addresses of two families")]
    MixedFamilies { index: usize, key: FlowKey },
}

impl Engine {
    /// The port's live connections and the NAT state they hold.
    pub fn export_live(&self, port: &str) -> Result<LiveState, EngineError> {
        let p = self.port_by_name(port)?;
        Ok(LiveState {
            connections: p.fw.conns().export(self.now),
            nat: p.snat.export(p.fw.conns(), self.now),
            buckets: p.policer.levels(self.now),
            from_sled: Some(self.cfg.underlay_addr),
        })
    }

    /// Puts `live` (another sled's export) into port `port`, which holds no
    /// connection yet; all or nothing. Every connection must be the port's own
    /// (its VNI, from its addresses), as a frame the port sent would have to be.
    pub fn import_live(&mut self, port: &str, live: &LiveState) -> Result<Imported, EngineError> {
        let now = self.now;
        let this_sled = self.cfg.underlay_addr;
        let p = self.port_by_name_mut(port)?;
        let refused = |error: LiveImportError| EngineError::Import {
            port: port.to_string(),
            error,
        };
        let cfg = &p.cfg;
        let own = |ip: IpAddr| match ip {
            IpAddr::V4(a) => cfg.ipv4 == Some(a),
            IpAddr::V6(a) => cfg.ipv6 == Some(a),
        };
        for (index, r) in live.connections.iter().enumerate() {
            let key = r.key;
            if key.vni != cfg.vni.get() {
                return Err(refused(LiveImportError::WrongVni {
                    index,
                    key,
                    port_vni: cfg.vni.get(),
                }));
            }
            if !own(key.src_ip) && !cfg.cidrs.admits_out(key.src_ip) {
                return Err(refused(LiveImportError::NotPortAddress { index, key }));
            }
            if key.src_ip.is_ipv4() != key.dst_ip.is_ipv4() {
                return Err(refused(LiveImportError::MixedFamilies { index, key }));
            }
        }
        let handles =
            p.fw.conns_mut()
                .import(&live.connections, now)
                .map_err(|e| refused(e.into()))?;
        let keyed: Vec<_> = live
            .connections
            .iter()
            .map(|r| r.key)
            .zip(handles)
            .collect();
        if let Err(e) = p.snat.import(&live.nat, &p.cfg.external, &keyed) {
            p.fw.conns_mut().clear();
            return Err(refused(e.into()));
        }
        p.policer.set_levels(&live.buckets, now);
        // An export of this sled's own (a port deleted and imported again here)
        // relays nothing.
        p.arrival = live
            .from_sled
            .filter(|s| *s != this_sled && is_unicast(*s))
            .map(|from| Arrival::new(from, now));
        p.epoch += 1;
        Ok(Imported {
            connections: live.connections.len(),
            snat_ports: live.nat.snat.len(),
        })
    }
}

impl Engine {
    /// Relays the frames for guest `mac` of VPC `vni`, whose port is deleted
    /// here, to sled `to` for the grace period (`vpc::moved`); refuses a
    /// destination that is not another sled's unicast address. Asked before
    /// the port is deleted (so a refusal changes nothing), it takes effect when
    /// the port is gone; a port made for the guest here ends it.
    pub fn relay_departed_to(
        &mut self,
        vni: Vni,
        mac: MacAddr,
        to: Ipv6Addr,
    ) -> Result<(), EngineError> {
        if !is_unicast(to) {
            return Err(EngineError::UnderlayAddrNotUnicast { addr: to });
        }
        if to == self.cfg.underlay_addr {
            return Err(EngineError::MoveToThisSled { addr: to });
        }
        self.departures.insert(vni.get(), mac, to, self.now);
        Ok(())
    }

    /// Stops relaying the frames for guest `mac` of VPC `vni`.
    pub fn forget_departed(&mut self, vni: Vni, mac: MacAddr) {
        self.departures.remove(vni.get(), mac);
    }
}

/// An address a sled may have on the underlay.
fn is_unicast(a: Ipv6Addr) -> bool {
    !(a.is_unspecified() || a.is_multicast() || a.is_loopback())
}
