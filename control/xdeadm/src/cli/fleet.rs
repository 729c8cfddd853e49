//! The writer side of `xdeadm fleet` (docs/fleet.md, "Operating"): V2P and V2B
//! entries written to the fleet's store (etcd) directly, not through a daemon.
//!
//! A command becomes a [`FleetWrite`]: where the store is ([`StoreConfig`], from
//! [`StoreArgs`]) and a [`Batch`] of puts and deletes, every key and value already
//! encoded and checked with the sleds' own checks ([`api::fleet::encode_v2p`],
//! [`api::fleet::encode_v2b`]), so nothing is sent that a sled would refuse, and a
//! load document with a bad entry writes nothing. [`run`] then connects on a
//! current-thread runtime of its own, reads the keys to delete (their mod
//! revisions), and writes everything with [`Store::apply`] (transactions of at
//! most [`fleet::MAX_TXN_OPS`] operations); each delete applies only if its key
//! is still as it was read. The [`WriteReport`] says what was done.
//!
//! `move-port` ([`Batch::move_port`]) moves a port's fleet state with the port
//! (docs/operating.md, "Moving a port"): its guest's V2P mappings to the new
//! sled, and its tables from the old sled's keys to the new one's, read first
//! and written in the same transaction as the mappings.

use super::grammar::StoreArgs;
use api::fleet::{
    encode_v2b, encode_v2p, port_key, sled_ports_prefix, vpc_prefix, EntryError, FleetKey,
    KeyError, SledId, V2B_PREFIX,
};
use api::migrate::PortExport;
use api::{V2bEntry, V2pEntry, Vni};
use fleet::{Op, Store, StoreConfig, StoreError, TlsFiles};
use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::fmt::{self, Write as _};
use std::io::{self, Read};
use std::net::{IpAddr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A clear of more keys than this under one prefix (a VPC's V2P, the V2B table)
/// reads the whole prefix, in pages, rather than one request per key.
const KEYS_READ_ONE_BY_ONE: usize = 64;

/// What a writer verb does: where the store is, and what to write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FleetWrite {
    pub store: StoreConfig,
    pub batch: Batch,
}

/// The kinds of entry the writer verbs write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    V2p,
    V2b,
    /// A port's routes or firewall rules (`move-port`).
    PortTable,
}

/// One key to write, its value encoded and checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Put {
    pub kind: Kind,
    pub key: String,
    pub value: Vec<u8>,
}

/// One key to delete, and the prefix of its table (read whole when many of its
/// keys go at once).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Clear {
    pub kind: Kind,
    pub key: String,
    pub table: String,
}

/// The writes of one command, each key at most once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Batch {
    pub puts: Vec<Put>,
    pub clears: Vec<Clear>,
    /// A key to delete that is not there is skipped rather than refused.
    pub if_exists: bool,
    /// Ports whose tables move from one sled's keys to another's.
    pub moves: Vec<PortMove>,
}

/// A port's tables to move: every key of port `port` under sled `from` is
/// written under sled `to` and deleted under `from` (unless it changed after it
/// was read).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortMove {
    pub port: String,
    pub from: SledId,
    pub to: SledId,
}

impl PortMove {
    /// The prefix of the port's keys on the sled it leaves.
    fn prefix(&self) -> String {
        format!("{}{}/", sled_ports_prefix(&self.from), self.port)
    }
}

/// Why `move-port` cannot write the move; nothing is written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MoveError {
    #[error("--from-sled and --to-sled are both {0}: the port does not move")]
    SameSled(SledId),
    #[error("the port's V2P mapping: {0}")]
    Mapping(#[from] EntryError),
}

impl Batch {
    /// A put of one V2P mapping, refused (naming the value) where a sled would
    /// refuse it.
    pub fn put_v2p(e: &V2pEntry) -> Result<Put, EntryError> {
        let enc = encode_v2p(e)?;
        Ok(Put {
            kind: Kind::V2p,
            key: enc.key,
            value: enc.value,
        })
    }

    /// A put of one V2B entry (its whole value: all its endpoints).
    pub fn put_v2b(e: &V2bEntry) -> Result<Put, EntryError> {
        let enc = encode_v2b(e)?;
        Ok(Put {
            kind: Kind::V2b,
            key: enc.key,
            value: enc.value,
        })
    }

    /// A delete of the V2P mapping of `vpc_ip` in `vni`.
    pub fn clear_v2p(vni: Vni, vpc_ip: IpAddr) -> Result<Clear, KeyError> {
        let key = FleetKey::V2p { vni, vpc_ip }.to_string();
        FleetKey::parse(&key)?;
        Ok(Clear {
            kind: Kind::V2p,
            key,
            table: format!("{}v2p/", vpc_prefix(vni)),
        })
    }

    /// The writes that move the port of `export` from sled `from` to sled `to`,
    /// at underlay address `underlay`: a V2P mapping of each of its guest's
    /// addresses to `underlay`, and the port's tables (read when written).
    pub fn move_port(
        export: &PortExport,
        from: SledId,
        to: SledId,
        underlay: Ipv6Addr,
    ) -> Result<Batch, MoveError> {
        if from == to {
            return Err(MoveError::SameSled(to));
        }
        let cfg = &export.port.config;
        let puts = [cfg.ipv4.map(IpAddr::V4), cfg.ipv6.map(IpAddr::V6)]
            .into_iter()
            .flatten()
            .map(|vpc_ip| {
                Batch::put_v2p(&V2pEntry {
                    vpc_ip,
                    vpc_mac: cfg.guest_mac,
                    underlay_ip: underlay,
                    vni: cfg.vni,
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Batch {
            puts,
            moves: vec![PortMove {
                port: cfg.name.clone(),
                from,
                to,
            }],
            ..Batch::default()
        })
    }

    /// A delete of the V2B entry of `prefix` (refused with host bits set: no
    /// such key can exist).
    pub fn clear_v2b(prefix: IpNet) -> Result<Clear, KeyError> {
        let key = FleetKey::V2b { prefix }.to_string();
        FleetKey::parse(&key)?;
        Ok(Clear {
            kind: Kind::V2b,
            key,
            table: V2B_PREFIX.to_string(),
        })
    }
}

/// Why a command line's store options cannot reach a store; exit 2.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StoreArgsError {
    #[error("--cert, --key and --ca go together (or XDEADM_FLEET_CERT, _KEY, _CA): {0} missing")]
    PartialTls(String),
    #[error("endpoint {0:?}: expected http://HOST:PORT or https://HOST:PORT")]
    Scheme(String),
    #[error("endpoint {0}: https needs --cert, --key and --ca")]
    HttpsWithoutTls(String),
    #[error("endpoint {0}: plain http, but --cert, --key and --ca are given (use https)")]
    TlsOverHttp(String),
}

impl StoreArgs {
    /// The store client's configuration: endpoints with their scheme, and the TLS
    /// files all three or none (https needs them, http refuses them).
    pub fn to_config(&self) -> Result<StoreConfig, StoreArgsError> {
        let tls = match (&self.cert, &self.key, &self.ca) {
            (Some(cert), Some(key), Some(ca)) => Some(TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                ca: ca.clone(),
            }),
            (None, None, None) => None,
            (cert, key, ca) => {
                let missing: Vec<&str> = [("--cert", cert), ("--key", key), ("--ca", ca)]
                    .iter()
                    .filter(|(_, v)| v.is_none())
                    .map(|(name, _)| *name)
                    .collect();
                return Err(StoreArgsError::PartialTls(missing.join(", ")));
            }
        };
        let mut endpoints = Vec::new();
        for e in &self.endpoints {
            let e = e.trim();
            if e.is_empty() {
                continue;
            }
            let https = match e.split_once("://") {
                Some(("https", rest)) if !rest.is_empty() => true,
                Some(("http", rest)) if !rest.is_empty() => false,
                _ => return Err(StoreArgsError::Scheme(e.to_string())),
            };
            match (https, tls.is_some()) {
                (true, false) => return Err(StoreArgsError::HttpsWithoutTls(e.to_string())),
                (false, true) => return Err(StoreArgsError::TlsOverHttp(e.to_string())),
                _ => endpoints.push(e.to_string()),
            }
        }
        if endpoints.is_empty() {
            return Err(StoreArgsError::Scheme(self.endpoints.join(",")));
        }
        Ok(StoreConfig {
            endpoints,
            tls,
            timeout: Duration::from_secs(self.timeout),
        })
    }
}

/// A `clear_v2p` entry of a load document: the mapping's key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub struct V2pKeyEntry {
    pub vni: Vni,
    pub vpc_ip: IpAddr,
}

/// A `clear_v2b` entry of a load document: the entry's key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub struct V2bKeyEntry {
    pub prefix: IpNet,
}

/// `fleet load`'s document. Each part is a list of the API's own entries (what
/// `dump-v2p --json` and `dump-v2b --json` print); every part may be left out. The
/// entries are kept as JSON values here and read one by one, so that every bad
/// entry is named by its place, not only the first.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LoadDocument {
    /// [`V2pEntry`]s: `{"vni", "vpc_ip", "vpc_mac", "underlay_ip"}`.
    #[serde(default)]
    v2p: Vec<serde_json::Value>,
    /// [`V2bEntry`]s: `{"prefix", "endpoints"}`; the endpoints are the whole value.
    #[serde(default)]
    v2b: Vec<serde_json::Value>,
    /// [`V2pKeyEntry`]s: `{"vni", "vpc_ip"}`.
    #[serde(default)]
    clear_v2p: Vec<serde_json::Value>,
    /// [`V2bKeyEntry`]s: `{"prefix"}`.
    #[serde(default)]
    clear_v2b: Vec<serde_json::Value>,
}

/// An entry of a load document that cannot be written: where it is
/// (`v2p[3]`), and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadEntry {
    pub part: &'static str,
    pub index: usize,
    pub why: String,
}

impl fmt::Display for BadEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{}]: {}", self.part, self.index, self.why)
    }
}

/// Why a load document is not taken; nothing is written then.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DocumentError {
    #[error(
        "empty: expected a JSON document {{\"v2p\": [...], \"v2b\": [...], \"clear_v2p\": \
         [...], \"clear_v2b\": [...]}}"
    )]
    Empty,
    #[error("not a load document: {0}")]
    Json(String),
    #[error("{} invalid {}, nothing written:{}", .0.len(), entries(.0.len()), indented(.0))]
    Entries(Vec<BadEntry>),
}

fn entries(n: usize) -> &'static str {
    match n {
        1 => "entry",
        _ => "entries",
    }
}

/// Each item on a line of its own, indented: the lists in errors.
fn indented<T: fmt::Display>(items: &[T]) -> String {
    items.iter().fold(String::new(), |mut s, item| {
        let _ = write!(s, "\n  {item}");
        s
    })
}

/// A load document that could not be read or taken; `xdeadm` exits 2 on it.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read {}: {error}", file.display())]
    Read { file: PathBuf, error: io::Error },
    #[error("{}: {error}", file.display())]
    Document { file: PathBuf, error: DocumentError },
}

/// Reads `file` (`-`: standard input) and makes its batch.
pub fn read_load(file: &Path, if_exists: bool) -> Result<Batch, LoadError> {
    let read = |error| LoadError::Read {
        file: file.to_path_buf(),
        error,
    };
    let text = if file == Path::new("-") {
        let mut text = String::new();
        io::stdin().lock().read_to_string(&mut text).map_err(read)?;
        text
    } else {
        std::fs::read_to_string(file).map_err(read)?
    };
    let mut batch = parse_load(&text).map_err(|error| LoadError::Document {
        file: file.to_path_buf(),
        error,
    })?;
    batch.if_exists = if_exists;
    Ok(batch)
}

/// The batch of a load document: every entry checked as a sled checks it, each
/// key at most once in the whole document; all bad entries are reported, with
/// their part and index, and then nothing is written.
pub fn parse_load(text: &str) -> Result<Batch, DocumentError> {
    if text.trim().is_empty() {
        return Err(DocumentError::Empty);
    }
    let json = |e: serde_json::Error| DocumentError::Json(e.to_string());
    // An object: serde would take a list for the document's parts too.
    let doc = match serde_json::from_str(text).map_err(json)? {
        v @ serde_json::Value::Object(_) => serde_json::from_value::<LoadDocument>(v),
        _ => return Err(DocumentError::Json("expected a JSON object".into())),
    }
    .map_err(json)?;
    let mut bad = Vec::new();
    let mut batch = Batch::default();
    let mut seen: HashMap<String, (&'static str, usize)> = HashMap::new();
    // Each part's entries: decode, encode and check, then claim the key.
    let mut claim = |part: &'static str, index: usize, key: &str, bad: &mut Vec<BadEntry>| {
        match seen.get(key) {
            Some((p, i)) => {
                bad.push(BadEntry {
                    part,
                    index,
                    why: format!("key {key} is also {p}[{i}]"),
                });
                false
            }
            None => {
                seen.insert(key.to_string(), (part, index));
                true
            }
        }
    };
    for (part, values) in [("v2p", &doc.v2p), ("v2b", &doc.v2b)] {
        for (index, value) in values.iter().enumerate() {
            let put = match part {
                "v2p" => serde_json::from_value::<V2pEntry>(value.clone())
                    .map_err(|e| e.to_string())
                    .and_then(|e| Batch::put_v2p(&e).map_err(|e| e.to_string())),
                _ => serde_json::from_value::<V2bEntry>(value.clone())
                    .map_err(|e| e.to_string())
                    .and_then(|e| Batch::put_v2b(&e).map_err(|e| e.to_string())),
            };
            match put {
                Ok(put) => {
                    if claim(part, index, &put.key, &mut bad) {
                        batch.puts.push(put);
                    }
                }
                Err(why) => bad.push(BadEntry { part, index, why }),
            }
        }
    }
    for (part, values) in [("clear_v2p", &doc.clear_v2p), ("clear_v2b", &doc.clear_v2b)] {
        for (index, value) in values.iter().enumerate() {
            let clear = match part {
                "clear_v2p" => serde_json::from_value::<V2pKeyEntry>(value.clone())
                    .map_err(|e| e.to_string())
                    .and_then(|k| Batch::clear_v2p(k.vni, k.vpc_ip).map_err(|e| e.to_string())),
                _ => serde_json::from_value::<V2bKeyEntry>(value.clone())
                    .map_err(|e| e.to_string())
                    .and_then(|k| Batch::clear_v2b(k.prefix).map_err(|e| e.to_string())),
            };
            match clear {
                Ok(clear) => {
                    if claim(part, index, &clear.key, &mut bad) {
                        batch.clears.push(clear);
                    }
                }
                Err(why) => bad.push(BadEntry { part, index, why }),
            }
        }
    }
    match bad.is_empty() {
        true => Ok(batch),
        false => Err(DocumentError::Entries(bad)),
    }
}

/// Entries of each kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub v2p: usize,
    pub v2b: usize,
    /// A port's routes or firewall rules (`move-port`).
    #[serde(skip_serializing_if = "is_zero")]
    pub port_tables: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl Counts {
    fn add(&mut self, kind: Kind) {
        match kind {
            Kind::V2p => self.v2p += 1,
            Kind::V2b => self.v2b += 1,
            Kind::PortTable => self.port_tables += 1,
        }
    }

    pub fn total(&self) -> usize {
        self.v2p + self.v2b + self.port_tables
    }
}

/// A delete that did not apply: its key changed (or went) after it was read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SkippedDelete {
    pub key: String,
    /// The key's mod revision when it was read.
    pub expected_mod_revision: i64,
    /// Its mod revision when the delete ran; 0: it was deleted meanwhile.
    pub current_mod_revision: i64,
}

impl fmt::Display for SkippedDelete {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: mod revision {} when read, ",
            self.key, self.expected_mod_revision
        )?;
        match self.current_mod_revision {
            0 => write!(f, "deleted since"),
            now => write!(f, "{now} now"),
        }
    }
}

/// What a writer verb did (its `--json` form too).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct WriteReport {
    /// The member that was written to.
    pub endpoint: String,
    /// Keys written.
    pub written: Counts,
    /// Keys deleted.
    pub deleted: Counts,
    /// Keys to delete that were not there (`--if-exists`).
    pub absent: Vec<String>,
    /// Deletes not applied because their key changed after it was read.
    pub skipped: Vec<SkippedDelete>,
    /// The store's revision before the writes (when the keys to delete were
    /// read) and after them: each transaction that changed something is one
    /// revision.
    pub from_revision: i64,
    pub revision: i64,
}

/// Why a writer verb failed; [`WriteError::exit_code`] says with which code.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("cannot start the store client: {0}")]
    Runtime(io::Error),
    #[error("fleet store: {0}")]
    Store(#[from] StoreError),
    #[error("{}", absent(.0))]
    Absent(Vec<String>),
    #[error(
        "{} not applied, the key changed after it was read (the rest was written):{}",
        deletes(.0.len()),
        indented(.0)
    )]
    Skipped(Vec<SkippedDelete>),
}

fn deletes(n: usize) -> String {
    match n {
        1 => "1 delete".to_string(),
        n => format!("{n} deletes"),
    }
}

fn absent(keys: &[String]) -> String {
    let why = "nothing written (--if-exists skips keys that are not there)";
    match keys {
        [key] => format!("{key} is not in the store: {why}"),
        keys => {
            format!(
                "{} keys are not in the store, {why}:{}",
                keys.len(),
                indented(keys)
            )
        }
    }
}

impl WriteError {
    /// As the rest of `xdeadm`: 1 refused (a key not there, a delete that lost a
    /// race, the store's refusal: a permission, a bad request), 2 a setup the
    /// command line got wrong (a key file, a certificate, no endpoint), 3 the
    /// store unreachable (or without a leader, or too slow).
    pub fn exit_code(&self) -> u8 {
        match self {
            WriteError::Runtime(_) | WriteError::Absent(_) | WriteError::Skipped(_) => 1,
            WriteError::Store(e) => store_exit_code(e),
        }
    }
}

fn store_exit_code(e: &StoreError) -> u8 {
    match e {
        StoreError::NoEndpoints
        | StoreError::ReadFile { .. }
        | StoreError::KeyFileMode { .. }
        | StoreError::Setup { .. } => 2,
        e if e.is_transient() => 3,
        _ => 1,
    }
}

/// Runs the writes on a current-thread runtime made for them.
pub fn run(write: &FleetWrite) -> Result<WriteReport, WriteError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(WriteError::Runtime)?;
    runtime.block_on(write_batch(&write.store, &write.batch))
}

/// Reads the keys to delete, refuses the batch if one is not there (unless
/// `if_exists`), then writes the puts and the guarded deletes.
async fn write_batch(config: &StoreConfig, batch: &Batch) -> Result<WriteReport, WriteError> {
    let mut store = Store::connect(config).await?;
    let mut report = WriteReport {
        endpoint: store.endpoint().to_string(),
        ..WriteReport::default()
    };
    let mut prefixes = read_prefixes(&batch.clears);
    prefixes.extend(batch.moves.iter().map(PortMove::prefix));
    let kvs = match prefixes.is_empty() {
        true => {
            report.from_revision = store.status().await?.revision;
            Vec::new()
        }
        false => {
            let snapshot = store.snapshot(&prefixes).await?;
            report.from_revision = snapshot.revision;
            snapshot.kvs
        }
    };
    let wanted: HashSet<&str> = batch.clears.iter().map(|c| c.key.as_str()).collect();
    let read: HashMap<String, i64> = kvs
        .iter()
        .filter(|kv| wanted.contains(kv.key.as_str()))
        .map(|kv| (kv.key.clone(), kv.mod_revision))
        .collect();
    let moved = moved_tables(&batch.moves, &kvs);
    report.absent = batch
        .clears
        .iter()
        .filter(|c| !read.contains_key(&c.key))
        .map(|c| c.key.clone())
        .collect();
    if !report.absent.is_empty() && !batch.if_exists {
        return Err(WriteError::Absent(report.absent));
    }
    let mut ops: Vec<Op> = batch
        .puts
        .iter()
        .map(|p| Op::Put {
            key: p.key.clone(),
            value: p.value.clone(),
        })
        .collect();
    ops.extend(moved.iter().map(|t| Op::Move {
        from: t.from_key.clone(),
        to: t.to_key.clone(),
        value: t.value.clone(),
        if_mod_revision: t.mod_revision,
    }));
    let deleting: Vec<&Clear> = batch
        .clears
        .iter()
        .filter(|c| read.contains_key(&c.key))
        .collect();
    ops.extend(deleting.iter().map(|c| Op::Delete {
        key: c.key.clone(),
        if_mod_revision: read.get(&c.key).copied(),
    }));
    if ops.is_empty() {
        report.revision = report.from_revision;
        return Ok(report);
    }
    let applied = store.apply(ops).await?;
    report.revision = applied.revision;
    for p in &batch.puts {
        report.written.add(p.kind);
    }
    let skipped: HashSet<&str> = applied.skipped.iter().map(|s| s.key.as_str()).collect();
    for c in deleting
        .iter()
        .filter(|c| !skipped.contains(c.key.as_str()))
    {
        report.deleted.add(c.kind);
    }
    // A table whose key changed after it was read stays where it was, whole.
    for _ in moved
        .iter()
        .filter(|t| !skipped.contains(t.from_key.as_str()))
    {
        report.written.add(Kind::PortTable);
        report.deleted.add(Kind::PortTable);
    }
    report.skipped = applied
        .skipped
        .into_iter()
        .map(|s| SkippedDelete {
            key: s.key,
            expected_mod_revision: s.expected_mod_revision,
            current_mod_revision: s.current_mod_revision,
        })
        .collect();
    Ok(report)
}

/// One table of a moving port, as read from the sled it leaves.
struct MovedTable {
    from_key: String,
    to_key: String,
    value: Vec<u8>,
    mod_revision: i64,
}

/// The tables of `moves` among the keys read: each a table key of its port on
/// the sled it leaves (a key under the port's prefix that is not one of the
/// schema's is left alone, as the sleds ignore it).
fn moved_tables(moves: &[PortMove], kvs: &[fleet::Kv]) -> Vec<MovedTable> {
    let mut tables = Vec::new();
    for kv in kvs {
        let Ok(FleetKey::Port { sled, port, table }) = FleetKey::parse(&kv.key) else {
            continue;
        };
        if let Some(m) = moves.iter().find(|m| m.from == sled && m.port == port) {
            tables.push(MovedTable {
                from_key: kv.key.clone(),
                to_key: port_key(&m.to, &port, table),
                value: kv.value.clone(),
                mod_revision: kv.mod_revision,
            });
        }
    }
    tables
}

/// What to read to learn the mod revisions of the keys to delete: each key (as a
/// prefix: longer keys that come with it are ignored), or its whole table when
/// many of that table's keys go.
fn read_prefixes(clears: &[Clear]) -> Vec<String> {
    let mut by_table: HashMap<&str, Vec<&str>> = HashMap::new();
    for c in clears {
        by_table.entry(&c.table).or_default().push(&c.key);
    }
    let mut prefixes: Vec<String> = by_table
        .into_iter()
        .flat_map(|(table, keys)| match keys.len() > KEYS_READ_ONE_BY_ONE {
            true => vec![table.to_string()],
            false => keys.into_iter().map(str::to_string).collect(),
        })
        .collect();
    prefixes.sort();
    prefixes
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = r#"{
        "v2p": [
            {"vni": 1701, "vpc_ip": "172.30.0.6", "vpc_mac": "a8:40:25:ff:00:06", "underlay_ip": "fd00:99::2"},
            {"vni": 1701, "vpc_ip": "fd00:1122:3344:100::6", "vpc_mac": "a8:40:25:ff:00:06", "underlay_ip": "fd00:99::2", "source": "local"}
        ],
        "v2b": [{"prefix": "0.0.0.0/0", "endpoints": ["fd00:99::b2", "fd00:99::b1"]}],
        "clear_v2p": [{"vni": 1701, "vpc_ip": "172.30.0.7"}],
        "clear_v2b": [{"prefix": "::/0"}]
    }"#;

    #[test]
    fn a_load_document_becomes_checked_puts_and_deletes() {
        let b = parse_load(DOC).unwrap();
        let keys: Vec<&str> = b.puts.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "/overlay/v1/vpc/1701/v2p/172.30.0.6",
                "/overlay/v1/vpc/1701/v2p/fd00:1122:3344:100::6",
                "/overlay/v1/v2b/0.0.0.0/0",
            ]
        );
        assert_eq!(
            b.puts[0].value,
            br#"{"mac":"a8:40:25:ff:00:06","underlay":"fd00:99::2"}"#
        );
        assert_eq!(
            b.puts[2].value, br#"{"endpoints":["fd00:99::b1","fd00:99::b2"]}"#,
            "endpoints sorted"
        );
        assert_eq!(
            b.clears,
            [
                Clear {
                    kind: Kind::V2p,
                    key: "/overlay/v1/vpc/1701/v2p/172.30.0.7".into(),
                    table: "/overlay/v1/vpc/1701/v2p/".into(),
                },
                Clear {
                    kind: Kind::V2b,
                    key: "/overlay/v1/v2b/::/0".into(),
                    table: "/overlay/v1/v2b/".into(),
                },
            ]
        );
        // Every part may be left out.
        assert_eq!(parse_load("{}").unwrap(), Batch::default());
        assert_eq!(parse_load(r#"{"v2p": []}"#).unwrap(), Batch::default());
    }

    #[test]
    fn every_bad_entry_is_named_by_its_place() {
        let doc = r#"{
            "v2p": [
                {"vni": 1701, "vpc_ip": "172.30.0.6", "vpc_mac": "a8:40:25:ff:00:06", "underlay_ip": "fd00:99::2"},
                {"vni": 16777216, "vpc_ip": "172.30.0.7", "vpc_mac": "a8:40:25:ff:00:07", "underlay_ip": "fd00:99::2"},
                {"vni": 1701, "vpc_ip": "172.30.0.8", "vpc_mac": "a8:40:25:ff:00:08", "underlay_ip": "ff02::1"},
                {"vni": 1701, "vpc_ip": "172.30.0.9", "vpc_mac": "zz:40:25:ff:00:09", "underlay_ip": "fd00:99::2"},
                {"vni": 1701, "vpc_ip": "172.30.0.6", "vpc_mac": "a8:40:25:ff:00:16", "underlay_ip": "fd00:99::3"},
                {"vni": 1701, "vpc_ip": "172.30.0.10", "vpc_mac": "a8:40:25:ff:00:10"}
            ],
            "v2b": [
                {"prefix": "10.1.2.3/8", "endpoints": ["fd00:99::b1"]},
                {"prefix": "0.0.0.0/0", "endpoints": []},
                {"prefix": "::/0", "endpoints": ["::"]}
            ],
            "clear_v2p": [{"vni": 1701, "vpc_ip": "172.30.0.6"}, {"vni": "x", "vpc_ip": "172.30.0.6"}],
            "clear_v2b": [{"prefix": "10.0.0.1/8"}]
        }"#;
        let DocumentError::Entries(bad) = parse_load(doc).unwrap_err() else {
            panic!("not an entry error");
        };
        let at: Vec<String> = bad
            .iter()
            .map(|b| format!("{}[{}]", b.part, b.index))
            .collect();
        assert_eq!(
            at,
            [
                "v2p[1]",
                "v2p[2]",
                "v2p[3]",
                "v2p[4]",
                "v2p[5]",
                "v2b[0]",
                "v2b[1]",
                "v2b[2]",
                "clear_v2p[0]",
                "clear_v2p[1]",
                "clear_v2b[0]",
            ]
        );
        let named = [
            "16777216",
            "ff02::1",
            "zz:40:25:ff:00:09",
            "also v2p[0]",
            "underlay_ip",
            "10.1.2.3/8",
            "no endpoint",
            "::",
            "also v2p[0]",
            "\"x\"",
            "10.0.0.1/8",
        ];
        for (b, named) in bad.iter().zip(named) {
            assert!(b.why.contains(named), "{b}: want {named:?}");
        }
        let text = DocumentError::Entries(bad).to_string();
        assert!(text.starts_with("11 invalid entries, nothing written:\n  v2p[1]: "));
    }

    #[test]
    fn empty_and_malformed_documents_are_refused() {
        assert_eq!(parse_load(""), Err(DocumentError::Empty));
        assert_eq!(parse_load(" \n"), Err(DocumentError::Empty));
        for (doc, named) in [
            ("[]", "expected a JSON object"),
            ("7", "expected a JSON object"),
            (r#"{"v2q": []}"#, "v2q"),
            (r#"{"v2p": {}}"#, "invalid type"),
            ("{\"v2p\": [", "EOF"),
        ] {
            let e = parse_load(doc).unwrap_err().to_string();
            assert!(e.contains(named), "{doc}: {e}");
        }
    }

    fn store_args(endpoints: &[&str], tls: [Option<&str>; 3]) -> StoreArgs {
        let path = |p: Option<&str>| p.map(PathBuf::from);
        StoreArgs {
            endpoints: endpoints
                .iter()
                .map(std::string::ToString::to_string)
                .collect(),
            cert: path(tls[0]),
            key: path(tls[1]),
            ca: path(tls[2]),
            timeout: 3,
        }
    }

    #[test]
    fn https_needs_all_three_tls_files_and_http_none() {
        let tls = [Some("c.crt"), Some("c.key"), Some("ca.crt")];
        let c = store_args(
            &["https://[fd00:99::e1]:2379", "https://10.0.0.1:2379"],
            tls,
        )
        .to_config()
        .unwrap();
        assert_eq!(c.endpoints.len(), 2);
        assert_eq!(c.tls.unwrap().key, PathBuf::from("c.key"));
        assert_eq!(c.timeout, Duration::from_secs(3));
        let c = store_args(&["http://127.0.0.1:2379"], [None; 3])
            .to_config()
            .unwrap();
        assert_eq!((c.endpoints.len(), c.tls), (1, None));
        for (endpoints, tls, named) in [
            (&["https://e1:2379"][..], [None; 3], "https needs"),
            (&["http://e1:2379"], tls, "plain http"),
            (&["e1:2379"], [None; 3], "\"e1:2379\""),
            (&["ftp://e1"], [None; 3], "ftp://e1"),
            (&[""], [None; 3], "expected http"),
            (
                &["https://e1:2379"],
                [Some("c.crt"), None, None],
                "--key, --ca missing",
            ),
        ] {
            let e = store_args(endpoints, tls)
                .to_config()
                .unwrap_err()
                .to_string();
            assert!(e.contains(named), "{endpoints:?}: {e}");
        }
    }

    #[test]
    fn many_keys_of_one_table_are_read_with_the_table() {
        let vni = Vni::new(7).unwrap();
        let mut clears: Vec<Clear> = (0..=KEYS_READ_ONE_BY_ONE as u32)
            .map(|i| Batch::clear_v2p(vni, IpAddr::from(i.to_be_bytes())).unwrap())
            .collect();
        clears.push(Batch::clear_v2b("0.0.0.0/0".parse().unwrap()).unwrap());
        assert_eq!(
            read_prefixes(&clears),
            ["/overlay/v1/v2b/0.0.0.0/0", "/overlay/v1/vpc/7/v2p/"]
        );
    }

    #[test]
    fn a_lost_race_names_the_key_and_both_revisions() {
        let e = WriteError::Skipped(vec![
            SkippedDelete {
                key: "/overlay/v1/vpc/1701/v2p/172.30.0.6".into(),
                expected_mod_revision: 12,
                current_mod_revision: 15,
            },
            SkippedDelete {
                key: "/overlay/v1/v2b/0.0.0.0/0".into(),
                expected_mod_revision: 4,
                current_mod_revision: 0,
            },
        ]);
        assert_eq!(e.exit_code(), 1);
        assert_eq!(
            e.to_string(),
            "2 deletes not applied, the key changed after it was read (the rest was \
             written):\n  /overlay/v1/vpc/1701/v2p/172.30.0.6: mod revision 12 when read, 15 \
             now\n  /overlay/v1/v2b/0.0.0.0/0: mod revision 4 when read, deleted since"
        );
        let e = WriteError::Absent(vec!["/overlay/v1/v2b/::/0".into()]);
        assert_eq!(e.exit_code(), 1);
        assert!(e.to_string().contains("/overlay/v1/v2b/::/0"), "{e}");
        assert_eq!(WriteError::Store(StoreError::NoEndpoints).exit_code(), 2);
    }

    fn sled(s: &str) -> SledId {
        s.parse().unwrap()
    }

    #[test]
    fn a_move_maps_the_guest_to_its_new_sled_and_moves_its_tables() {
        let export = api::testing::sample_export("opte0", 6, "guest0");
        let to: Ipv6Addr = "fd00:99::3".parse().unwrap();
        let b = Batch::move_port(&export, sled("sled-a"), sled("sled-c"), to).unwrap();
        let puts: Vec<(&str, &[u8])> = b
            .puts
            .iter()
            .map(|p| (p.key.as_str(), p.value.as_slice()))
            .collect();
        let value: &[u8] = br#"{"mac":"a8:40:25:ff:00:06","underlay":"fd00:99::3"}"#;
        assert_eq!(
            puts,
            [
                ("/overlay/v1/vpc/1701/v2p/172.30.0.6", value),
                ("/overlay/v1/vpc/1701/v2p/fd00:1122:3344:100::6", value),
            ]
        );
        assert_eq!(b.moves[0].prefix(), "/overlay/v1/sled/sled-a/port/opte0/");
        let kv = |key: &str, rev: i64| fleet::Kv {
            key: key.into(),
            value: key.as_bytes().to_vec(),
            mod_revision: rev,
        };
        let read = [
            kv("/overlay/v1/sled/sled-a/port/opte0/firewall", 7),
            kv("/overlay/v1/sled/sled-a/port/opte0/routes", 9),
            // Not a table of the schema: left where it is.
            kv("/overlay/v1/sled/sled-a/port/opte0/other", 4),
        ];
        let moved = moved_tables(&b.moves, &read);
        let got: Vec<(&str, &str, i64)> = moved
            .iter()
            .map(|t| (t.from_key.as_str(), t.to_key.as_str(), t.mod_revision))
            .collect();
        assert_eq!(
            got,
            [
                (
                    "/overlay/v1/sled/sled-a/port/opte0/firewall",
                    "/overlay/v1/sled/sled-c/port/opte0/firewall",
                    7
                ),
                (
                    "/overlay/v1/sled/sled-a/port/opte0/routes",
                    "/overlay/v1/sled/sled-c/port/opte0/routes",
                    9
                ),
            ]
        );
        assert_eq!(moved[1].value, read[1].value, "the value as it was");
    }

    #[test]
    fn a_move_is_refused_to_its_own_sled_or_to_an_address_no_sled_has() {
        let export = api::testing::sample_export("opte0", 6, "guest0");
        let to: Ipv6Addr = "fd00:99::3".parse().unwrap();
        let e = Batch::move_port(&export, sled("sled-a"), sled("sled-a"), to).unwrap_err();
        assert_eq!(e, MoveError::SameSled(sled("sled-a")));
        assert!(e.to_string().contains("sled-a"), "{e}");
        let e = Batch::move_port(&export, sled("a"), sled("c"), Ipv6Addr::UNSPECIFIED);
        assert!(matches!(e, Err(MoveError::Mapping(_))), "{e:?}");
    }
}
