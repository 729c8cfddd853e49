//! Moving a port to another sled (docs/operating.md "Moving a port"):
//! `export-port` pauses the port and answers its configuration and live state;
//! `import-port` on the other sled makes the port from that, paused, with its
//! connections and NAT state, for `resume-port` to start. Each is refused whole:
//! an import that conflicts with this sled or cannot be the port's leaves
//! nothing behind, and an export that fails leaves the port as it was.

use super::checks::check_port;
use super::dispatch::{check_new_route, check_rules};
use super::{put_table, saved_tables, ControlError, Controller, Dataplane, PortTables};
use api::{ExportError, PortExport, PortImport, Reply, PORT_EXPORT_FORMAT, PORT_EXPORT_KIND};
use engine::LiveState;

/// The largest firewall rule id an import takes: far more rules than a port
/// could have been given, and far from where the next id would stop growing.
const MAX_RULE_ID: u64 = u32::MAX as u64;

/// Why an export could not be made or read.
#[derive(Debug, thiserror::Error)]
pub enum MoveError {
    #[error(transparent)]
    Export(#[from] ExportError),
    #[error("the export's live state is unreadable: {0}")]
    Live(serde_json::Error),
    #[error("firewall rule id {0} is given twice")]
    RuleIdTwice(u64),
    #[error("firewall rule id {0} is out of range (ids go up to {MAX_RULE_ID})")]
    RuleIdRange(u64),
    #[error("the port's live state cannot be written: {0}")]
    Encode(serde_json::Error),
}

impl<D: Dataplane> Controller<D> {
    /// `export-port`: pauses the port (saved, so a restart keeps it paused), then
    /// takes its state: nothing the guest sends or receives moves it on after the
    /// snapshot.
    pub(super) fn export_port(&mut self, name: &str) -> Result<Reply, ControlError> {
        let was_paused = self.state.paused.contains(name);
        self.set_port_paused(name, true)?;
        let export = self.snapshot(name);
        if export.is_err() && !was_paused {
            let _ = self.set_port_paused(name, false);
        }
        Ok(Reply::PortExport(Box::new(export?)))
    }

    /// The export of port `name` as it is now.
    fn snapshot(&mut self, name: &str) -> Result<PortExport, ControlError> {
        let live = self.dp.export_live(name)?;
        let live = serde_json::to_value(&live).map_err(MoveError::Encode)?;
        let tables = saved_tables(&self.state, name);
        Ok(PortExport {
            kind: PORT_EXPORT_KIND.to_string(),
            format: PORT_EXPORT_FORMAT,
            port: self.port(name)?.clone(),
            routes: tables.routes.unwrap_or_default(),
            fw_rules: tables.fw_rules,
            fw_next_id: self.state.fw_next_id.get(name).copied().unwrap_or(1),
            live,
        })
    }

    /// `import-port`: the exported port made here, paused, its tables and state
    /// as they were; the checks `create-xde`, `add-router-entry` and
    /// `set-fw-rules` make, and the engine's of the state (docs/operating.md).
    pub(super) fn import_port(&mut self, import: &PortImport) -> Result<Reply, ControlError> {
        let export = &import.export;
        export.check().map_err(MoveError::Export)?;
        let live: LiveState =
            serde_json::from_value(export.live.clone()).map_err(MoveError::Live)?;
        let info = import.port();
        check_port(&self.state.ports, &info)?;
        let name = info.config.name.clone();
        check_tables(&name, export)?;
        let mut rules = export.fw_rules.clone();
        let mut next = self.state.clone();
        next.fw_next_id
            .insert(name.clone(), export.fw_next_id.max(1));
        next.assign_fw_rule_ids(&name, &mut rules);
        next.paused.insert(name.clone());
        let tables = PortTables {
            routes: Some(export.routes.clone()),
            fw_rules: rules.clone(),
            paused: true,
        };
        self.dp.add_port(&info, &tables)?;
        let imported = match self.dp.import_live(&name, &live) {
            Ok(i) => i,
            Err(e) => {
                let _ = self.dp.remove_port(&name);
                return Err(e.into());
            }
        };
        next.ports.push(info);
        put_table(&mut next.routes, &name, export.routes.clone());
        put_table(&mut next.fw_rules, &name, rules);
        self.commit(next, |dp| {
            let _ = dp.remove_port(&name);
        })?;
        self.push_port_tables(&name);
        Ok(Reply::Imported {
            connections: imported.connections as u64,
            snat_ports: imported.snat_ports as u64,
        })
    }
}

/// Refuses the export's routes and firewall rules where `add-router-entry` and
/// `set-fw-rules` would refuse them, and rule ids given twice or out of range.
fn check_tables(port: &str, export: &PortExport) -> Result<(), ControlError> {
    for (i, r) in export.routes.iter().enumerate() {
        check_new_route(port, &export.routes[..i], r)?;
    }
    check_rules(&export.fw_rules)?;
    let ids = export.fw_rules.iter().map(|r| r.id);
    if let Some(id) = ids.chain([export.fw_next_id]).find(|&id| id > MAX_RULE_ID) {
        return Err(MoveError::RuleIdRange(id).into());
    }
    let mut ids = std::collections::BTreeSet::new();
    match export
        .fw_rules
        .iter()
        .find(|r| r.id != 0 && !ids.insert(r.id))
    {
        Some(r) => Err(MoveError::RuleIdTwice(r.id).into()),
        None => Ok(()),
    }
}
