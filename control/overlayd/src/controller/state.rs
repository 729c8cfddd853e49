//! The daemon's persisted configuration: ports, V2P and V2B mappings, routes and firewall
//! rules, kept in one JSON file in the state directory and restored at start.
//!
//! The file is the control plane's intent, not the engine's memory: on restart the
//! daemon puts it back into the dataplane with the same checks the API applies, and
//! what the dataplane refuses then stays in the file (see
//! [`crate::controller::Controller::restore`]). Writes are atomic (temporary file,
//! fsync, rename, fsync of the directory), so a crash leaves either the old or the
//! new file.

use api::V2bEntry;
use api::{FwRule, PortInfo, RouteEntry, V2pEntry};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Bumped when the file's shape changes incompatibly.
pub const STATE_FORMAT: u32 = 1;

const STATE_FILE: &str = "state.json";

/// The file describes tenants' networks: readable by the daemon's user only.
const FILE_MODE: u32 = 0o600;
const DIR_MODE: u32 = 0o700;

/// Everything configured through the API.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    /// Ports in creation order (the order they are restored in).
    pub ports: Vec<PortInfo>,
    pub v2p: Vec<V2pEntry>,
    /// The V2B table set through the API (not the `--boundary-services`
    /// shorthand, which is configuration). Absent from files written before V2B.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub v2b: Vec<V2bEntry>,
    /// Router entries by port name.
    pub routes: BTreeMap<String, Vec<RouteEntry>>,
    /// Firewall rules by port name.
    pub fw_rules: BTreeMap<String, Vec<FwRule>>,
    /// By port name, the id the port's next firewall rule gets (ids are never
    /// reused while the port exists). Absent from files written before rule ids:
    /// see [`State::assign_missing_fw_rule_ids`].
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub fw_next_id: BTreeMap<String, u64>,
    /// Ports paused by `pause-port` (restored paused). Absent from files written
    /// before port states.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub paused: BTreeSet<String>,
}

impl State {
    /// Gives each rule of `rules` (port `port`'s) without an id (0) the port's
    /// next id, and moves the port's next id on.
    pub fn assign_fw_rule_ids(&mut self, port: &str, rules: &mut [FwRule]) {
        let highest = rules.iter().map(|r| r.id).max().unwrap_or(0);
        let next = self.fw_next_id.entry(port.to_string()).or_insert(1);
        // Never below an id in use (a hand-edited file).
        *next = (*next).max(highest.saturating_add(1));
        for r in rules.iter_mut().filter(|r| r.id == 0) {
            r.id = *next;
            *next = next.saturating_add(1);
        }
    }

    /// Gives ids to saved rules that have none (a file from before rule ids): a
    /// rule's position in its port's list, from 1, as `rm-fw-rule ID` took it then.
    pub fn assign_missing_fw_rule_ids(&mut self) {
        let ports: Vec<String> = self.fw_rules.keys().cloned().collect();
        for port in ports {
            let Some(mut rules) = self.fw_rules.remove(&port) else {
                continue;
            };
            if rules.iter().any(|r| r.id == 0) {
                let mut used: std::collections::BTreeSet<u64> =
                    rules.iter().map(|r| r.id).collect();
                for (pos, r) in (1u64..).zip(rules.iter_mut()) {
                    if r.id == 0 && used.insert(pos) {
                        r.id = pos;
                    }
                }
            }
            self.assign_fw_rule_ids(&port, &mut rules);
            self.fw_rules.insert(port, rules);
        }
    }
}

#[derive(Serialize, Deserialize)]
struct StateFile {
    format: u32,
    #[serde(flatten)]
    state: State,
}

/// Why the state could not be read or written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    #[error("cannot create state directory {}: {error}", dir.display())]
    Dir { dir: PathBuf, error: String },
    #[error("cannot read {}: {error}", path.display())]
    Read { path: PathBuf, error: String },
    #[error("state file {} is unreadable: {error}", path.display())]
    Unreadable { path: PathBuf, error: String },
    #[error("state file {} has format {format} (this build reads {STATE_FORMAT})", path.display())]
    Format { path: PathBuf, format: u32 },
    #[error("cannot encode state: {0}")]
    Encode(String),
    #[error("cannot write {}: {error}", path.display())]
    Write { path: PathBuf, error: String },
}

/// The state file in one directory.
#[derive(Clone, Debug)]
pub struct StateStore {
    dir: PathBuf,
}

impl StateStore {
    /// Creates the directory (and missing parents) mode 0700 if needed; an existing
    /// one is left as it is.
    pub fn open(dir: &Path) -> Result<StateStore, StateError> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(DIR_MODE)
            .create(dir)
            .map_err(|e| StateError::Dir {
                dir: dir.to_path_buf(),
                error: e.to_string(),
            })?;
        Ok(StateStore {
            dir: dir.to_path_buf(),
        })
    }

    pub fn path(&self) -> PathBuf {
        self.dir.join(STATE_FILE)
    }

    /// The state directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Reads the saved state; an absent file is an empty state (first start).
    pub fn load(&self) -> Result<State, StateError> {
        let file: Option<StateFile> = self.read(STATE_FILE)?;
        match file {
            None => Ok(State::default()),
            Some(f) if f.format != STATE_FORMAT => Err(StateError::Format {
                path: self.path(),
                format: f.format,
            }),
            Some(f) => Ok(f.state),
        }
    }

    /// Replaces the saved state atomically.
    pub fn save(&self, state: &State) -> Result<(), StateError> {
        self.write(
            STATE_FILE,
            &StateFile {
                format: STATE_FORMAT,
                state: state.clone(),
            },
        )
    }

    /// Reads the document `name` of the state directory; `None` if it does not
    /// exist yet.
    pub(super) fn read<T: DeserializeOwned>(&self, name: &str) -> Result<Option<T>, StateError> {
        let path = self.dir.join(name);
        let text = match fs::read(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(StateError::Read {
                    path,
                    error: e.to_string(),
                })
            }
        };
        serde_json::from_slice(&text)
            .map(Some)
            .map_err(|e| StateError::Unreadable {
                path,
                error: e.to_string(),
            })
    }

    /// Replaces the document `name` of the state directory atomically: written to a
    /// temporary file, synced, renamed over the old one, the directory synced.
    pub(super) fn write<T: Serialize>(&self, name: &str, doc: &T) -> Result<(), StateError> {
        let path = self.dir.join(name);
        let tmp = self.dir.join(format!("{name}.tmp"));
        let body = serde_json::to_vec_pretty(doc).map_err(|e| StateError::Encode(e.to_string()))?;
        let write = || -> std::io::Result<()> {
            // The mode given to open is reduced by the umask and ignored for a
            // temporary file left by a crash, so it is set on the open file too; a
            // symlink planted in its place is refused rather than followed.
            let mut f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(FILE_MODE)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&tmp)?;
            f.set_permissions(fs::Permissions::from_mode(FILE_MODE))?;
            f.write_all(&body)?;
            f.sync_all()?;
            fs::rename(&tmp, &path)?;
            // The rename is durable only once the directory entry is.
            File::open(&self.dir)?.sync_all()
        };
        write().map_err(|e| StateError::Write {
            path,
            error: e.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::testing::sample_port;
    use api::Vni;
    use api::{Direction, FwAction, FwFilters, FwHost, FwPorts, FwProto, RouteTarget};

    fn sample_state() -> State {
        let mut s = State {
            ports: vec![
                PortInfo {
                    config: sample_port("opte0", 5),
                    netns: Some("g0".into()),
                    vhost_user: None,
                    attach: None,
                },
                PortInfo {
                    config: sample_port("opte1", 6),
                    netns: None,
                    vhost_user: None,
                    attach: Some("vnet1".into()),
                },
            ],
            v2p: vec![V2pEntry {
                vpc_ip: "172.30.0.9".parse().unwrap(),
                vpc_mac: "a8:40:25:ff:00:09".parse().unwrap(),
                underlay_ip: "fd00:99::2".parse().unwrap(),
                vni: Vni::new(1701).unwrap(),
            }],
            ..State::default()
        };
        s.routes.insert(
            "opte0".into(),
            vec![RouteEntry {
                class: Default::default(),
                dest: "0.0.0.0/0".parse().unwrap(),
                target: RouteTarget::Igw,
                mtu: None,
            }],
        );
        s.fw_rules.insert(
            "opte0".into(),
            vec![FwRule {
                id: 4,
                direction: Direction::In,
                priority: 10,
                action: FwAction::Allow,
                filters: FwFilters {
                    host: FwHost::Any,
                    proto: FwProto::Tcp,
                    ports: vec![FwPorts::One(22)],
                    icmp: None,
                },
            }],
        );
        s.fw_next_id.insert("opte0".into(), 5);
        s
    }

    /// A file from before rule ids: each rule gets its position, the port's next
    /// id follows the highest; ids then survive a save and load, and are never
    /// reused.
    #[test]
    fn rules_saved_without_ids_get_their_positions() {
        let old = br#"{"format":1,"ports":[],"v2p":[],"routes":{},"fw_rules":{"opte0":[
            {"direction":"in","priority":65534,"action":"allow","filters":{"host":{"subnet":"10.0.0.0/8"},"proto":"any","ports":[]}},
            {"direction":"in","priority":10,"action":"allow","filters":{"host":"any","proto":"tcp","ports":[22]}}]}}"#;
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open(dir.path()).unwrap();
        fs::write(store.path(), old).unwrap();
        let mut s = store.load().unwrap();
        s.assign_missing_fw_rule_ids();
        let ids: Vec<u64> = s.fw_rules["opte0"].iter().map(|r| r.id).collect();
        assert_eq!(ids, [1, 2]);
        assert_eq!(s.fw_next_id["opte0"], 3);
        store.save(&s).unwrap();
        let mut back = store.load().unwrap();
        assert_eq!(back, s);
        // Removing the last rule and adding another: a new id, not 2 again.
        let mut rules = back.fw_rules.remove("opte0").unwrap();
        rules.pop();
        rules.push(sample_state().fw_rules["opte0"][0].clone());
        rules[1].id = 0;
        back.assign_fw_rule_ids("opte0", &mut rules);
        assert_eq!(rules.iter().map(|r| r.id).collect::<Vec<_>>(), [1, 3]);
        assert_eq!(back.fw_next_id["opte0"], 4);
    }

    #[test]
    fn round_trip_and_atomic_replace() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open(&dir.path().join("sub")).unwrap();
        assert_eq!(store.load().unwrap(), State::default());
        let s = sample_state();
        store.save(&s).unwrap();
        assert_eq!(store.load().unwrap(), s);
        store.save(&State::default()).unwrap();
        assert_eq!(store.load().unwrap(), State::default());
        let names: Vec<_> = fs::read_dir(dir.path().join("sub"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [STATE_FILE], "no temporary file left behind");
        let mode = fs::metadata(store.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    /// A port saved before `--attach` existed (no `attach` key) loads as a tap
    /// port, and a tap port is saved without the key (older daemons read it).
    #[test]
    fn ports_saved_without_attach_are_tap_ports() {
        let mut v = serde_json::to_value(sample_state()).unwrap();
        assert_eq!(v["ports"][1]["attach"], "vnet1");
        for p in v["ports"].as_array_mut().unwrap() {
            p.as_object_mut().unwrap().remove("attach");
        }
        let s: State = serde_json::from_value(v).unwrap();
        assert!(s.ports.iter().all(|p| p.attach.is_none()));
        let saved = serde_json::to_value(&s).unwrap();
        assert!(saved["ports"][0].get("attach").is_none(), "{saved}");
    }

    fn mode(p: &Path) -> u32 {
        fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    /// The directory is created private; the file is 0600 even when a temporary
    /// file left by a crash was world-readable (open's mode does not apply to an
    /// existing file, and the umask cannot widen what is set afterwards).
    #[test]
    fn modes_are_enforced() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("a/state");
        let store = StateStore::open(&sub).unwrap();
        assert_eq!(mode(&sub), 0o700);
        let tmp = sub.join(format!("{STATE_FILE}.tmp"));
        fs::write(&tmp, b"stale").unwrap();
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o666)).unwrap();
        store.save(&sample_state()).unwrap();
        assert_eq!(mode(&store.path()), 0o600);
        assert_eq!(store.load().unwrap(), sample_state());
    }

    /// A symlink where the temporary file goes is not followed: saving fails and
    /// the link's target is untouched.
    #[test]
    fn planted_symlink_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open(&dir.path().join("s")).unwrap();
        let target = dir.path().join("elsewhere");
        fs::write(&target, b"keep").unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join("s/state.json.tmp")).unwrap();
        let e = store.save(&sample_state()).unwrap_err().to_string();
        assert!(e.contains("state.json"), "{e}");
        assert_eq!(fs::read(&target).unwrap(), b"keep");
    }

    #[test]
    fn refuses_corrupt_or_foreign_files_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open(dir.path()).unwrap();
        fs::write(store.path(), b"{not json").unwrap();
        assert!(store.load().unwrap_err().to_string().contains("state.json"));
        fs::write(
            store.path(),
            br#"{"format":7,"ports":[],"v2p":[],"routes":{},"fw_rules":{}}"#,
        )
        .unwrap();
        assert!(store.load().unwrap_err().to_string().contains("format 7"));
    }
}
