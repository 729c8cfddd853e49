//! What `list-layers` and `dump-layer` show: every layer a port's packets pass, in
//! the order an outbound packet meets them, with its rules (and their hit counts),
//! what it does with a packet no rule matches, and the state it keeps.
//!
//! Only the firewall and the router are rule tables; the gateway and the overlay
//! are fixed steps (answers and anti-spoofing; V2P lookup and the underlay source
//! check), shown with their counters so `dump-layer` covers every layer
//! `list-layers` names. The layers keep no per-layer flow tables except the
//! firewall's connections: a port's compiled flows are in its unified flow table
//! (`dump-uft`).

use super::error::EngineError;
use super::ports::Port;
use super::Engine;
use crate::machinery::conntrack::ConnStats;
use crate::machinery::layer::{LayerDump, TableDump};
use crate::vpc::gateway::GatewayCounters;
use crate::vpc::v2b::V2bEntry;
use serde::Serialize;

/// A port's layers, in the order an outbound packet meets them (inbound packets
/// meet them in reverse).
pub const LAYERS: &[&str] = &["gateway", "firewall", "router", "overlay"];

/// One line of `list-layers`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LayerSummary {
    pub name: &'static str,
    pub rules_in: usize,
    pub rules_out: usize,
    /// What happens to a packet no rule matches, per direction.
    pub default_in: String,
    pub default_out: String,
    /// Flows the layer keeps state for (the firewall's connections); `None` for a
    /// layer that keeps none.
    pub flows: Option<u64>,
}

/// `dump-layer` output: the rule tables, plus what the layer counts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PortLayerDump {
    #[serde(flatten)]
    pub layer: LayerDump,
    /// As in [`LayerSummary::flows`].
    pub flows: Option<u64>,
    /// The layer's own counters and settings.
    pub state: LayerState,
}

/// What a layer keeps besides its rules.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerState {
    /// Replies it sent and packets it refused, by name (docs/gateway.md).
    Gateway(Box<GatewayCounters>),
    /// The connection table's counters.
    Firewall(ConnStats),
    /// Routes are its rules; nothing else.
    Router,
    Overlay {
        /// V2P mappings of the sled (all VNIs).
        v2p_entries: usize,
        /// Where internet-gateway traffic goes: the V2B table, and its VNI.
        v2b: Vec<V2bEntry>,
        boundary_vni: u32,
    },
}

/// The name of one of [`LAYERS`], or a refusal naming it and the layers there are.
fn known_layer(layer: &str) -> Result<&'static str, EngineError> {
    LAYERS
        .iter()
        .find(|l| **l == layer)
        .copied()
        .ok_or_else(|| EngineError::NoSuchLayer {
            layer: layer.to_string(),
            layers: LAYERS,
        })
}

/// A layer without rules: empty tables whose defaults say what the step does.
fn fixed(name: &str, default_in: &str, default_out: &str) -> LayerDump {
    let table = |d: &str| TableDump {
        default_action: d.to_string(),
        rules: Vec::new(),
        no_match: 0,
        denied: 0,
    };
    LayerDump {
        name: name.to_string(),
        inbound: table(default_in),
        outbound: table(default_out),
    }
}

impl Engine {
    /// The port's layers with their rule counts, defaults and flow counts.
    pub fn list_layers(&self, port: &str) -> Result<Vec<LayerSummary>, EngineError> {
        let p = self.port_by_name(port)?;
        Ok(LAYERS
            .iter()
            .map(|name| {
                let d = self.layer_of(p, name);
                LayerSummary {
                    name,
                    rules_in: d.layer.inbound.rules.len(),
                    rules_out: d.layer.outbound.rules.len(),
                    default_in: d.layer.inbound.default_action,
                    default_out: d.layer.outbound.default_action,
                    flows: d.flows,
                }
            })
            .collect())
    }

    /// One layer of the port (one of [`LAYERS`]); another name is refused, naming
    /// it and the layers there are.
    pub fn dump_layer(&self, port: &str, layer: &str) -> Result<PortLayerDump, EngineError> {
        let p = self.port_by_name(port)?;
        Ok(self.layer_of(p, known_layer(layer)?))
    }

    /// Empties one layer's flow table (`clear-lft`) and says how many flows it
    /// held: the firewall's connections, the only flows a layer keeps (the
    /// others, as `list-layers` shows, have none: 0). The port's flows are
    /// decided again (its epoch moves), so no cached flow keeps a connection that
    /// is gone; a connection's next packet meets the rules as a new one would.
    pub fn clear_lft(&mut self, port: &str, layer: &str) -> Result<u64, EngineError> {
        let p = self.port_by_name_mut(port)?;
        if known_layer(layer)? != "firewall" {
            return Ok(0);
        }
        let flows = p.fw.conns().stats().flows;
        p.fw.conns_mut().clear();
        p.epoch += 1;
        Ok(flows)
    }

    /// The dump of layer `name`, one of [`LAYERS`].
    fn layer_of(&self, p: &Port, name: &str) -> PortLayerDump {
        let (layer, flows, state) = match name {
            "gateway" => (
                fixed(
                    name,
                    "pass to the guest's own MAC/IP (inbound_dst_not_guest otherwise)",
                    "answer ARP, NDP, RS, DHCP and echo for the gateway; pass the guest's own MAC/IP (spoofed_* otherwise)",
                ),
                None,
                LayerState::Gateway(Box::new(p.gw.counters().clone())),
            ),
            "firewall" => (
                p.fw.dump(),
                Some(p.fw.conns().stats().flows),
                LayerState::Firewall(p.fw.conns().stats()),
            ),
            "router" => (p.router.dump(), None, LayerState::Router),
            // "overlay", the last of LAYERS (the only names callers pass).
            _ => (
                fixed(
                    name,
                    "accept from the sled V2P maps the inner source to (underlay_src_mismatch otherwise)",
                    "encapsulate to the sled V2P maps the destination to (no_v2p otherwise), or deliver on this sled",
                ),
                None,
                LayerState::Overlay {
                    v2p_entries: self.v2p.len(),
                    v2b: self.v2b.dump(),
                    boundary_vni: self.cfg.boundary_vni.get(),
                },
            ),
        };
        PortLayerDump {
            layer,
            flows,
            state,
        }
    }
}
