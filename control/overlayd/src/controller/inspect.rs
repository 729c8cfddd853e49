//! The questions the controller answers: the ports as `list-ports` shows them, and
//! the engine's inspections with the control plane's own figures added (what is
//! not applied, the state file, the API server, the taps' queues).

use super::tap_queue;
use super::{ControlError, Controller, Dataplane, Inspect};
use api::{PortStatus, Reply};
use serde_json::{json, Value};
use std::time::Instant;

/// How many not-applied V2P mappings `stats` lists (it counts them all).
const STATS_V2P_LISTED: usize = 32;

impl<D: Dataplane> Controller<D> {
    pub(super) fn port_statuses(&self, now: Instant) -> Vec<PortStatus> {
        self.state
            .ports
            .iter()
            .map(|p| PortStatus {
                port: p.clone(),
                not_applied: self
                    .unapplied_ports
                    .get(&p.config.name)
                    .map(|r| r.view(now)),
                // Filled in by the daemon, which asks the workers serving the taps.
                link: None,
                state: if self.unapplied_ports.contains_key(&p.config.name) {
                    None
                } else {
                    self.dp.port_state(&p.config.name).ok()
                },
                // Filled in with the link.
                vhost_negotiated: None,
            })
            .collect()
    }

    /// Inspection of a port the dataplane does not hold answers with why (for
    /// `stats PORT`) or refuses naming the reason; `stats` adds the control plane's
    /// own figures to the dataplane's.
    pub(super) fn inspect(&mut self, what: Inspect) -> Result<Reply, ControlError> {
        let now = Instant::now();
        if let Some(port) = what.port() {
            self.port(port)?;
            if let (Inspect::Stats { .. }, Some(r)) = (&what, self.unapplied_ports.get(port)) {
                return Ok(Reply::Inspect(
                    json!({ "name": port, "not_applied": r.view(now) }),
                ));
            }
            self.applied_port(port)?;
        }
        let mut v = self.dp.inspect(&what)?;
        if let (Inspect::Stats { port }, Value::Object(m)) = (&what, &mut v) {
            if port.is_none() {
                m.insert("control".into(), self.control_stats(now));
            }
            m.insert("tap_queues".into(), self.tap_queues(port.as_deref()));
        }
        Ok(Reply::Inspect(v))
    }

    /// Per applied port with a tap (or the one asked for; a vhost-user port has
    /// none): what its tap's queue
    /// dropped of what the guest sent (`guest_tx_dropped`), or why that cannot be
    /// read. An attached port's loss is its packet socket's, counted by the worker
    /// (`attached_rx_dropped`).
    fn tap_queues(&self, only: Option<&str>) -> Value {
        let m: serde_json::Map<String, Value> = self
            .state
            .ports
            .iter()
            .filter(|p| only.is_none_or(|o| o == p.config.name))
            .filter(|p| !self.unapplied_ports.contains_key(&p.config.name))
            .filter(|p| p.attach.is_none() && p.vhost_user.is_none())
            .map(|p| {
                let name = &p.config.name;
                let read =
                    tap_queue::guest_tx_dropped(&self.netns_visitor, name, p.netns.as_deref());
                let v = match read {
                    Ok(n) => json!({ "guest_tx_dropped": n }),
                    Err(e) => json!({ "error": e.to_string() }),
                };
                (name.clone(), v)
            })
            .collect();
        Value::Object(m)
    }

    /// What is saved but not applied, the state file and whether saving works, and
    /// the API server's counters.
    fn control_stats(&self, now: Instant) -> Value {
        let ports: Vec<Value> = self
            .unapplied_ports
            .iter()
            .map(|(name, r)| json!({ "name": name, "not_applied": r.view(now) }))
            .collect();
        let v2p: Vec<Value> = self
            .unapplied_v2p
            .iter()
            .take(STATS_V2P_LISTED)
            .map(|((vni, ip), r)| json!({ "vni": vni, "vpc_ip": ip, "not_applied": r.view(now) }))
            .collect();
        json!({
            "not_applied": {
                "ports": ports,
                "v2p_count": self.unapplied_v2p.len(),
                "v2p": v2p,
            },
            "state": {
                "file": self.store.as_ref().map(super::state::StateStore::path),
                "save_error": self.save_error.as_ref().map(ToString::to_string),
            },
            "api": self.api.as_deref(),
            "fleet": self.fleet_stats(now),
        })
    }
}
