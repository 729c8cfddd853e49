//! Moving a port to another sled (`export-port`, `import-port`,
//! docs/operating.md "Moving a port"): the document one daemon writes and
//! another reads.

use crate::{FwRule, PortInfo, RouteEntry, VhostUser};
use serde::{Deserialize, Serialize};

/// What [`PortExport::kind`] always says: the file is a port's export.
pub const PORT_EXPORT_KIND: &str = "overlayd-port-export";

/// The shape of [`PortExport`]; bumped when it changes incompatibly. A daemon
/// refuses an export of any format but its own, naming both.
pub const PORT_EXPORT_FORMAT: u32 = 1;

/// A port's configuration and live state, as `export-port` writes it: self-
/// describing JSON (`kind`, `format`) that `import-port` on another sled reads.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortExport {
    /// [`PORT_EXPORT_KIND`].
    pub kind: String,
    /// [`PORT_EXPORT_FORMAT`] of the daemon that wrote it.
    pub format: u32,
    /// The port as `create-xde` made it, attachment included (`import-port` may
    /// give another).
    pub port: PortInfo,
    /// Its whole routing table and its firewall rules (with their ids), as saved.
    pub routes: Vec<RouteEntry>,
    pub fw_rules: Vec<FwRule>,
    /// The id its next firewall rule gets (ids are never reused while the port
    /// exists, also across the move).
    pub fw_next_id: u64,
    /// The live state the engine keeps (connections with their TCP tracking, the
    /// NAT state they hold; idle times as durations), as the engine writes it: the
    /// importing daemon's engine checks it (docs/operating.md).
    pub live: serde_json::Value,
}

/// `import-port`: an export, and where the guest is on this sled when it is not
/// where it was (`--netns`, `--attach`, `--vhost-user`: given, it replaces the
/// export's attachment whole).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortImport {
    pub export: PortExport,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attach: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vhost_user: Option<VhostUser>,
}

/// Why bytes are not a port export this version can import.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("not JSON: {0}")]
    Json(serde_json::Error),
    #[error("not a port export: its kind is {0:?}, not {PORT_EXPORT_KIND:?}")]
    Kind(String),
    #[error("the export has format {0}; this version reads format {PORT_EXPORT_FORMAT}")]
    Format(u64),
    #[error("not a port export of format {PORT_EXPORT_FORMAT}: {0}")]
    Shape(serde_json::Error),
}

/// Refuses what is not a port export ([`PORT_EXPORT_KIND`]) of this version's
/// format.
fn check_kind_and_format(kind: &str, format: u64) -> Result<(), ExportError> {
    if kind != PORT_EXPORT_KIND {
        return Err(ExportError::Kind(kind.to_string()));
    }
    if format != u64::from(PORT_EXPORT_FORMAT) {
        return Err(ExportError::Format(format));
    }
    Ok(())
}

impl PortExport {
    /// Reads an export file's bytes. Its kind and format are looked at first, so
    /// that an export of another format is refused as such rather than for a field
    /// this version does not know.
    pub fn read(bytes: &[u8]) -> Result<PortExport, ExportError> {
        let v: serde_json::Value = serde_json::from_slice(bytes).map_err(ExportError::Json)?;
        check_kind_and_format(
            v.get("kind")
                .and_then(serde_json::Value::as_str)
                .unwrap_or("(none)"),
            v.get("format")
                .and_then(serde_json::Value::as_u64)
                .unwrap_or(0),
        )?;
        serde_json::from_value(v).map_err(ExportError::Shape)
    }

    /// Refuses an export whose kind or format is not this version's (one that did
    /// not come through [`PortExport::read`]).
    pub fn check(&self) -> Result<(), ExportError> {
        check_kind_and_format(&self.kind, self.format.into())
    }
}

impl PortImport {
    /// The port as it is made here: the export's, attached where this import
    /// says if it says.
    pub fn port(&self) -> PortInfo {
        let mut p = self.export.port.clone();
        if self.netns.is_some() || self.attach.is_some() || self.vhost_user.is_some() {
            p.netns = self.netns.clone();
            p.attach = self.attach.clone();
            p.vhost_user = self.vhost_user.clone();
        }
        p
    }
}
