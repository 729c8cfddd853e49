//! `overlayd`'s configuration: a TOML or JSON file, command-line flags that override
//! it, and the resolved [`DaemonConfig`] the daemon runs with.

use api::protocol::DEFAULT_API_SOCKET;
use api::vni::ParseVniError;
use clap::Parser;
use core::fmt;
use core::str::FromStr;
use engine::{TableBudget, Vni};
use serde::{Deserialize, Serialize};
use std::net::{Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};

/// Why the flags or the config file cannot be run with: each names the flag or key
/// and the value refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("invalid XDP mode {0:?}: expected native or skb")]
    XdpMode(String),
    #[error("invalid underlay GSO mode {0:?}: expected auto, on or off")]
    UnderlayGso(String),
    #[error(
        "invalid outer DSCP {0:?}: expected copy, a DSCP 0-63, or a class name (ef, af11-af43, cs0-cs7)"
    )]
    OuterDscp(String),
    #[error("invalid poll mode {0:?}: expected adaptive or busy")]
    PollMode(String),
    #[error("invalid log format {0:?}: expected text or json")]
    LogFormat(String),
    #[error("invalid core list {list:?}: {word:?} is not a core number")]
    CoreNumber { list: String, word: String },
    #[error("invalid core list {list:?}: core {core} is above {MAX_CORE}")]
    CoreTooHigh { list: String, core: usize },
    #[error("invalid core list {list:?}: range {first}-{last} is backwards")]
    CoreRange {
        list: String,
        first: usize,
        last: usize,
    },
    #[error("cannot read config file {}: {error}", path.display())]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("config file {}: {error}", path.display())]
    Json {
        path: PathBuf,
        error: serde_json::Error,
    },
    #[error("config file {}: {error}", path.display())]
    Toml {
        path: PathBuf,
        error: toml::de::Error,
    },
    #[error("no underlay interface: give --underlay IFACE or `underlay` in the config file")]
    NoUnderlay,
    #[error("invalid underlay interface name {0:?}")]
    UnderlayName(String),
    #[error(
        "no underlay address: give --underlay-addr IPV6 or `underlay-addr` in the config file"
    )]
    NoUnderlayAddr,
    #[error("underlay address {0} is not a unicast address")]
    UnderlayAddr(Ipv6Addr),
    /// `option` is the flag's name without its dashes, which is also the key's.
    #[error("{option} {} is not an absolute path", path.display())]
    Relative { option: &'static str, path: PathBuf },
    #[error("table budget of {0} MiB is too large")]
    TableBudgetMib(usize),
    /// The engine's refusal of the budget, which names the values.
    #[error("{why}")]
    Tables {
        budget: TableBudget,
        why: engine::pipeline::budget::BudgetError,
    },
    #[error("path-check interval 0: give at least 1 second")]
    PathCheckInterval,
    #[error("fleet-endpoints given without sled-id: a fleet member needs its name")]
    FleetNoSled,
    #[error("sled-id given without fleet-endpoints: no store to be a member of")]
    FleetNoEndpoints,
    #[error(transparent)]
    SledId(#[from] api::fleet::SledIdError),
    #[error("fleet endpoint {0:?} is not an http:// or https:// URL")]
    FleetEndpoint(String),
    #[error("fleet endpoint {0:?} is https: give fleet-cert, fleet-key and fleet-ca")]
    FleetHttpsWithoutTls(String),
    #[error("fleet TLS needs fleet-cert, fleet-key and fleet-ca together; {0} is missing")]
    FleetTlsPart(&'static str),
}

/// Where ports, V2P, routes and firewall rules are kept across restarts by default.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/overlayd";

/// The VNI boundary services use for traffic leaving the rack unless configured.
pub const DEFAULT_BOUNDARY_VNI: Vni = Vni::DEFAULT_BOUNDARY;

/// How the XDP steering program is attached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum XdpMode {
    /// In the driver: the fast path, and what multi-buffer (jumbo) frames need.
    #[default]
    Native,
    /// Generic, after the kernel built an skb: works on any driver, slower, and may
    /// hand AF_XDP unsegmented GSO packets.
    Skb,
}

impl FromStr for XdpMode {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        match s {
            "native" => Ok(XdpMode::Native),
            "skb" => Ok(XdpMode::Skb),
            _ => Err(ConfigError::XdpMode(s.to_string())),
        }
    }
}

impl fmt::Display for XdpMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            XdpMode::Native => "native",
            XdpMode::Skb => "skb",
        })
    }
}

/// Whether guest TSO buffers leave as UDP-tunnel GSO super-frames through the
/// underlay's tunnel tap (`dpio::tunnel_tx`, Linux 6.17+) for the kernel to
/// segment, or are cut into frames by the datapath and sent by AF_XDP.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UnderlayGso {
    /// Use it when the kernel supports it; otherwise today's path, with one
    /// warning saying why.
    #[default]
    Auto,
    /// Use it; the daemon does not start when the kernel cannot.
    On,
    /// Never: the datapath segments and AF_XDP sends every frame.
    Off,
}

impl FromStr for UnderlayGso {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        match s {
            "auto" => Ok(UnderlayGso::Auto),
            "on" => Ok(UnderlayGso::On),
            "off" => Ok(UnderlayGso::Off),
            _ => Err(ConfigError::UnderlayGso(s.to_string())),
        }
    }
}

/// The outer DSCP of encapsulated frames (`--outer-dscp`): `copy` (the guest's,
/// the default) or one class for all the sled's tunnel traffic, by number or by
/// its name (RFC 2474 class selectors, RFC 2597 assured forwarding, RFC 3246
/// expedited forwarding). The ECN field is always carried (RFC 6040).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct OuterDscp(pub engine::OuterDscp);

impl FromStr for OuterDscp {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        let bad = || ConfigError::OuterDscp(s.to_string());
        let lower = s.to_ascii_lowercase();
        let dscp = match lower.as_str() {
            "copy" => return Ok(OuterDscp(engine::OuterDscp::Copy)),
            "ef" => 46,
            "default" | "be" => 0,
            name => match (name.strip_prefix("cs"), name.strip_prefix("af")) {
                (Some(n), _) => match n.parse::<u8>() {
                    Ok(n @ 0..=7) => n << 3,
                    _ => return Err(bad()),
                },
                // AFxy: class x (1-4), drop precedence y (1-3): 8x + 2y.
                (_, Some(xy)) => match xy.as_bytes() {
                    &[x @ b'1'..=b'4', y @ b'1'..=b'3'] => 8 * (x - b'0') + 2 * (y - b'0'),
                    _ => return Err(bad()),
                },
                _ => name.parse::<u8>().map_err(|_| bad())?,
            },
        };
        if dscp > engine::OuterDscp::MAX {
            return Err(bad());
        }
        Ok(OuterDscp(engine::OuterDscp::Fixed(dscp)))
    }
}

impl TryFrom<String> for OuterDscp {
    type Error = ConfigError;
    fn try_from(s: String) -> Result<Self, ConfigError> {
        s.parse()
    }
}

impl From<OuterDscp> for String {
    fn from(d: OuterDscp) -> String {
        d.to_string()
    }
}

impl fmt::Display for OuterDscp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            engine::OuterDscp::Copy => f.write_str("copy"),
            engine::OuterDscp::Fixed(d) => write!(f, "{d}"),
        }
    }
}

impl fmt::Display for UnderlayGso {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            UnderlayGso::Auto => "auto",
            UnderlayGso::On => "on",
            UnderlayGso::Off => "off",
        })
    }
}

/// How a worker waits for work.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PollMode {
    /// Spin while there is work, and sleep in epoll within microseconds of running
    /// out of it: a worker gives its core back to the guests it shares it with.
    #[default]
    Adaptive,
    /// Never sleep: the lowest latency, at the price of a whole core per worker even
    /// when idle (the OVS-DPDK PMD model, for cores dedicated to the datapath).
    Busy,
}

impl FromStr for PollMode {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        match s {
            "adaptive" => Ok(PollMode::Adaptive),
            "busy" => Ok(PollMode::Busy),
            _ => Err(ConfigError::PollMode(s.to_string())),
        }
    }
}

impl fmt::Display for PollMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PollMode::Adaptive => "adaptive",
            PollMode::Busy => "busy",
        })
    }
}

/// How `overlayd` writes its log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One human-readable line per event.
    #[default]
    Text,
    /// One JSON object per event (tracing-subscriber's format), for journald or a
    /// log shipper that indexes fields.
    Json,
}

impl FromStr for LogFormat {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err(ConfigError::LogFormat(s.to_string())),
        }
    }
}

/// A set of CPU cores, written like `0,1`, `0-3` or `0-1,6`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct CoreList(Vec<usize>);

/// Core numbers above this are refused: `sched_setaffinity`'s `cpu_set_t` holds 1024.
pub const MAX_CORE: usize = 1023;

impl CoreList {
    pub fn cores(&self) -> &[usize] {
        &self.0
    }
}

impl FromStr for CoreList {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        let list = || s.to_string();
        let num = |t: &str| -> Result<usize, ConfigError> {
            let n: usize = t.trim().parse().map_err(|_| ConfigError::CoreNumber {
                list: list(),
                word: t.to_string(),
            })?;
            if n > MAX_CORE {
                return Err(ConfigError::CoreTooHigh {
                    list: list(),
                    core: n,
                });
            }
            Ok(n)
        };
        let mut cores = Vec::new();
        for part in s.split(',') {
            match part.split_once('-') {
                Some((a, b)) => {
                    let (a, b) = (num(a)?, num(b)?);
                    if a > b {
                        return Err(ConfigError::CoreRange {
                            list: list(),
                            first: a,
                            last: b,
                        });
                    }
                    cores.extend(a..=b);
                }
                None => cores.push(num(part)?),
            }
        }
        cores.sort_unstable();
        cores.dedup();
        Ok(CoreList(cores))
    }
}

impl TryFrom<String> for CoreList {
    type Error = ConfigError;
    fn try_from(s: String) -> Result<Self, ConfigError> {
        s.parse()
    }
}

impl From<CoreList> for String {
    fn from(c: CoreList) -> String {
        c.to_string()
    }
}

impl fmt::Display for CoreList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .0
            .iter()
            .map(std::string::ToString::to_string)
            .collect();
        f.write_str(&parts.join(","))
    }
}

/// The config file's shape: every field optional, so a file can set a few and flags
/// the rest. Unknown keys are refused so a typo does not silently fall back to a
/// default.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileConfig {
    #[serde(default)]
    pub underlay: Vec<String>,
    pub underlay_addr: Option<Ipv6Addr>,
    pub api_socket: Option<PathBuf>,
    pub state_dir: Option<PathBuf>,
    pub cores: Option<CoreList>,
    #[serde(default)]
    pub external_jumbo: bool,
    pub boundary_services: Option<Ipv6Addr>,
    pub boundary_vni: Option<Vni>,
    pub xdp_mode: Option<XdpMode>,
    pub underlay_gso: Option<UnderlayGso>,
    pub outer_dscp: Option<OuterDscp>,
    pub poll: Option<PollMode>,
    pub log_level: Option<String>,
    pub table_budget_mib: Option<usize>,
    pub max_ports: Option<usize>,
    pub log_format: Option<LogFormat>,
    pub path_check_interval: Option<u64>,
    pub path_probe_ms: Option<u64>,
    pub metrics_listen: Option<SocketAddr>,
    #[serde(default)]
    pub fleet_endpoints: Vec<String>,
    pub fleet_cert: Option<PathBuf>,
    pub fleet_key: Option<PathBuf>,
    pub fleet_ca: Option<PathBuf>,
    pub sled_id: Option<String>,
}

impl FileConfig {
    /// Reads a TOML file, or JSON when the name ends in `.json`.
    pub fn load(path: &Path) -> Result<FileConfig, ConfigError> {
        let path_buf = || path.to_path_buf();
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
            path: path_buf(),
            error,
        })?;
        if path.extension().is_some_and(|e| e == "json") {
            serde_json::from_str(&text).map_err(|error| ConfigError::Json {
                path: path_buf(),
                error,
            })
        } else {
            toml::from_str(&text).map_err(|error| ConfigError::Toml {
                path: path_buf(),
                error,
            })
        }
    }
}

/// `overlayd`'s command line. Flags override the config file.
#[derive(Clone, Debug, Parser)]
#[command(
    name = "overlayd",
    version,
    about = "Geneve/IPv6 overlay datapath daemon"
)]
pub struct DaemonArgs {
    /// Config file (TOML, or JSON if the name ends in .json).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Underlay interface (repeatable).
    #[arg(long, value_name = "IFACE")]
    pub underlay: Vec<String>,
    /// This sled's underlay IPv6 address (outer source, and what the XDP program steers).
    #[arg(long, value_name = "IPV6")]
    pub underlay_addr: Option<Ipv6Addr>,
    /// The API socket, in a directory of its own (default /run/overlayd/api.sock).
    #[arg(long, value_name = "PATH")]
    pub api_socket: Option<PathBuf>,
    /// Where the daemon saves its state, state.json (default /var/lib/overlayd).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Cores to run workers on, e.g. 0,1 or 0-1: one pinned worker per core,
    /// each serving its own ports and underlay queues. Every underlay interface
    /// is given at least one rx queue per worker (like `ethtool -L`).
    #[arg(long, value_name = "LIST")]
    pub cores: Option<CoreList>,
    /// Sled-wide: external traffic may use the port MTU (needs the port flag too).
    #[arg(long)]
    pub external_jumbo: bool,
    /// Underlay address of boundary services (where traffic leaving the rack goes).
    #[arg(long, value_name = "UNDERLAY_ADDR")]
    pub boundary_services: Option<Ipv6Addr>,
    /// The Geneve VNI of traffic to and from boundary services (default 99).
    #[arg(long, value_name = "N", value_parser = parse_vni)]
    pub boundary_vni: Option<Vni>,
    /// How the XDP program is attached: in the driver, or generic (default native).
    #[arg(long, value_name = "native|skb")]
    pub xdp_mode: Option<XdpMode>,
    /// How guest TSO buffers reach the underlay: `auto` hands each to the kernel
    /// as one UDP-tunnel GSO super-frame through a tunnel tap when the kernel can
    /// (Linux 6.17+); `on` requires that; `off` cuts them into frames here and
    /// sends those by AF_XDP (default auto).
    #[arg(long, value_name = "auto|on|off")]
    pub underlay_gso: Option<UnderlayGso>,
    /// The outer DSCP of encapsulated frames: `copy` takes the guest's (RFC 2983
    /// uniform model), or one class for every frame of this sled, as a number
    /// (0-63) or a name (`ef`, `af41`, `cs1`) (default copy). The guest's ECN field
    /// is always carried across the tunnel (RFC 6040).
    #[arg(long, value_name = "copy|DSCP")]
    pub outer_dscp: Option<OuterDscp>,
    /// How workers wait for work: `adaptive` sleeps in epoll as soon as there is
    /// none, so a worker shares its core with guests; `busy` never sleeps (a core
    /// dedicated to each worker) (default adaptive).
    #[arg(long, value_name = "adaptive|busy")]
    pub poll: Option<PollMode>,
    /// A tracing filter: a level, or targets (module paths of the daemon) with
    /// levels, e.g. info or info,overlayd::controller=debug (default info).
    #[arg(long, value_name = "LEVEL")]
    pub log_level: Option<String>,
    /// Memory for every port's flow and connection tables together, in MiB
    /// (default 16384); each of `--max-ports` ports gets an equal share.
    #[arg(long, value_name = "MIB")]
    pub table_budget_mib: Option<usize>,
    /// Ports the table budget is shared by, and the most this sled accepts
    /// (default 256).
    #[arg(long, value_name = "N")]
    pub max_ports: Option<usize>,
    /// Log lines as plain text or one JSON object each (default text).
    #[arg(long, value_name = "text|json")]
    pub log_format: Option<LogFormat>,
    /// Probe every underlay peer named in V2P with full-size packets this often
    /// (`xdeadm path-check`), counting and logging paths that do not carry the
    /// underlay MTU. Off unless given.
    #[arg(long, value_name = "SECS")]
    pub path_check_interval: Option<u64>,
    /// Probe each path of a multipath route to an underlay peer (one per link)
    /// this often, in milliseconds, taking a path whose probes are lost out of
    /// use (default 500; 0: off).
    #[arg(long, value_name = "MS")]
    pub path_probe_ms: Option<u64>,
    /// Serve the counters in the OpenMetrics text format over HTTP at
    /// http://ADDR:PORT/metrics, for Prometheus (off unless given).
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics_listen: Option<SocketAddr>,
    /// Make this sled a member of a fleet: the client URLs of the etcd members
    /// that hold the fleet's V2P, V2B and port tables (docs/fleet.md), comma
    /// separated. Off unless given.
    #[arg(long, value_name = "URL,...", value_delimiter = ',')]
    pub fleet_endpoints: Vec<String>,
    /// The sled's client certificate for the fleet's store (PEM).
    #[arg(long, value_name = "FILE")]
    pub fleet_cert: Option<PathBuf>,
    /// Its private key (PEM, mode 0600).
    #[arg(long, value_name = "FILE")]
    pub fleet_key: Option<PathBuf>,
    /// The CA that signed the store members' certificates (PEM).
    #[arg(long, value_name = "FILE")]
    pub fleet_ca: Option<PathBuf>,
    /// This sled's name in the fleet: its keys' path element and its certificate's
    /// user.
    #[arg(long, value_name = "NAME")]
    pub sled_id: Option<String>,
}

/// Where the fleet's store is and who this sled is in it (docs/fleet.md).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FleetConfig {
    pub endpoints: Vec<String>,
    /// The certificate, key and CA files; `None` for plain http:// endpoints.
    pub tls: Option<FleetTls>,
    pub sled: api::fleet::SledId,
}

/// The sled's TLS files for the store.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FleetTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

impl FleetConfig {
    /// The fleet flags and keys merged (flags win, a flag's endpoint list
    /// replaces the file's), or `None` when neither names a store.
    fn merge(file: &FileConfig, args: &DaemonArgs) -> Result<Option<FleetConfig>, ConfigError> {
        let endpoints = if args.fleet_endpoints.is_empty() {
            file.fleet_endpoints.clone()
        } else {
            args.fleet_endpoints.clone()
        };
        let sled = args.sled_id.clone().or_else(|| file.sled_id.clone());
        let (endpoints, sled) = match (endpoints.is_empty(), sled) {
            (true, None) => return Ok(None),
            (true, Some(_)) => return Err(ConfigError::FleetNoEndpoints),
            (false, None) => return Err(ConfigError::FleetNoSled),
            (false, Some(s)) => (endpoints, s.parse::<api::fleet::SledId>()?),
        };
        let file_of = |option: &'static str, flag: &Option<PathBuf>, key: &Option<PathBuf>| {
            let path = flag.clone().or_else(|| key.clone());
            if let Some(p) = &path {
                absolute(option, p)?;
            }
            Ok::<_, ConfigError>(path)
        };
        let cert = file_of("fleet-cert", &args.fleet_cert, &file.fleet_cert)?;
        let key = file_of("fleet-key", &args.fleet_key, &file.fleet_key)?;
        let ca = file_of("fleet-ca", &args.fleet_ca, &file.fleet_ca)?;
        let tls = match (cert, key, ca) {
            (None, None, None) => None,
            (Some(cert), Some(key), Some(ca)) => Some(FleetTls { cert, key, ca }),
            (None, _, _) => return Err(ConfigError::FleetTlsPart("fleet-cert")),
            (_, None, _) => return Err(ConfigError::FleetTlsPart("fleet-key")),
            (_, _, None) => return Err(ConfigError::FleetTlsPart("fleet-ca")),
        };
        for e in &endpoints {
            if e.starts_with("https://") {
                if tls.is_none() {
                    return Err(ConfigError::FleetHttpsWithoutTls(e.clone()));
                }
            } else if !e.starts_with("http://") || e.len() == "http://".len() {
                return Err(ConfigError::FleetEndpoint(e.clone()));
            }
        }
        Ok(Some(FleetConfig {
            endpoints,
            tls,
            sled,
        }))
    }
}

/// Refuses a relative path: the daemon would resolve it against wherever it was
/// started (a service manager's `/`, an operator's shell) and work on files there.
fn absolute(option: &'static str, path: &Path) -> Result<(), ConfigError> {
    if path.is_absolute() {
        Ok(())
    } else {
        Err(ConfigError::Relative {
            option,
            path: path.to_path_buf(),
        })
    }
}

/// Parses a VNI argument with the API's parser (the admin tool's too), which names
/// the value when it is not a 24-bit number.
pub fn parse_vni(s: &str) -> Result<Vni, ParseVniError> {
    s.parse::<Vni>()
}

/// What the daemon runs with, file and flags merged and defaults filled in.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DaemonConfig {
    pub underlay: Vec<String>,
    pub underlay_addr: Ipv6Addr,
    pub api_socket: PathBuf,
    pub state_dir: PathBuf,
    /// Cores for the workers, one worker each; empty means "do not pin" (one
    /// worker, anywhere).
    pub cores: Vec<usize>,
    pub external_jumbo: bool,
    pub boundary_services: Option<Ipv6Addr>,
    pub boundary_vni: Vni,
    pub xdp_mode: XdpMode,
    pub underlay_gso: UnderlayGso,
    pub outer_dscp: OuterDscp,
    pub poll: PollMode,
    pub log_level: String,
    /// The sled's flow and connection table budget (docs/engine.md, "Table budget").
    pub tables: TableBudget,
    pub log_format: LogFormat,
    /// How often the underlay paths to the V2P peers are probed; `None`: never.
    pub path_check_interval: Option<std::time::Duration>,
    /// How often each path of a multipath route to a peer is probed; `None`:
    /// never.
    pub path_probe_interval: Option<std::time::Duration>,
    /// Where the OpenMetrics endpoint listens, if anywhere.
    pub metrics_listen: Option<SocketAddr>,
    /// The fleet this sled is a member of, if any.
    pub fleet: Option<FleetConfig>,
}

/// How often each path to a peer is probed unless configured: three lost
/// probes take a path out of use, so a silent drop is found in about 2 s.
const DEFAULT_PATH_PROBE_MS: u64 = 500;

impl DaemonConfig {
    /// Merges the config file (if any) and the flags; flags win. Repeated
    /// `--underlay` flags replace the file's list rather than adding to it, so the
    /// command line alone says what is used when it says anything.
    pub fn resolve(args: &DaemonArgs) -> Result<DaemonConfig, ConfigError> {
        let file = match &args.config {
            Some(p) => FileConfig::load(p)?,
            None => FileConfig::default(),
        };
        Self::merge(file, args)
    }

    fn merge(file: FileConfig, args: &DaemonArgs) -> Result<DaemonConfig, ConfigError> {
        let fleet = FleetConfig::merge(&file, args)?;
        let underlay = if args.underlay.is_empty() {
            file.underlay
        } else {
            args.underlay.clone()
        };
        if underlay.is_empty() {
            return Err(ConfigError::NoUnderlay);
        }
        if let Some(name) = underlay
            .iter()
            .find(|name| name.is_empty() || name.len() > 15 || name.contains('/'))
        {
            return Err(ConfigError::UnderlayName(name.clone()));
        }
        let underlay_addr = args
            .underlay_addr
            .or(file.underlay_addr)
            .ok_or(ConfigError::NoUnderlayAddr)?;
        if underlay_addr.is_unspecified() || underlay_addr.is_multicast() {
            return Err(ConfigError::UnderlayAddr(underlay_addr));
        }
        let boundary_vni = args
            .boundary_vni
            .or(file.boundary_vni)
            .unwrap_or(DEFAULT_BOUNDARY_VNI);
        let api_socket = args
            .api_socket
            .clone()
            .or(file.api_socket)
            .unwrap_or_else(|| DEFAULT_API_SOCKET.into());
        let state_dir = args
            .state_dir
            .clone()
            .or(file.state_dir)
            .unwrap_or_else(|| DEFAULT_STATE_DIR.into());
        absolute("api-socket", &api_socket)?;
        absolute("state-dir", &state_dir)?;
        let default = TableBudget::default();
        let tables = TableBudget {
            bytes: match args.table_budget_mib.or(file.table_budget_mib) {
                Some(mib) => mib
                    .checked_mul(1 << 20)
                    .ok_or(ConfigError::TableBudgetMib(mib))?,
                None => default.bytes,
            },
            ports: args.max_ports.or(file.max_ports).unwrap_or(default.ports),
        };
        tables.validate().map_err(|why| ConfigError::Tables {
            budget: tables,
            why,
        })?;
        let path_check_interval = match args.path_check_interval.or(file.path_check_interval) {
            Some(0) => return Err(ConfigError::PathCheckInterval),
            s => s.map(std::time::Duration::from_secs),
        };
        Ok(DaemonConfig {
            underlay,
            underlay_addr,
            api_socket,
            state_dir,
            cores: args
                .cores
                .clone()
                .or(file.cores)
                .map(|c| c.0)
                .unwrap_or_default(),
            external_jumbo: args.external_jumbo || file.external_jumbo,
            boundary_services: args.boundary_services.or(file.boundary_services),
            boundary_vni,
            xdp_mode: args.xdp_mode.or(file.xdp_mode).unwrap_or_default(),
            underlay_gso: args.underlay_gso.or(file.underlay_gso).unwrap_or_default(),
            outer_dscp: args.outer_dscp.or(file.outer_dscp).unwrap_or_default(),
            poll: args.poll.or(file.poll).unwrap_or_default(),
            log_level: args
                .log_level
                .clone()
                .or(file.log_level)
                .unwrap_or_else(|| "info".into()),
            tables,
            log_format: args.log_format.or(file.log_format).unwrap_or_default(),
            path_check_interval,
            path_probe_interval: match args.path_probe_ms.or(file.path_probe_ms) {
                Some(0) => None,
                ms => Some(std::time::Duration::from_millis(
                    ms.unwrap_or(DEFAULT_PATH_PROBE_MS),
                )),
            },
            metrics_listen: args.metrics_listen.or(file.metrics_listen),
            fleet,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Result<DaemonArgs, clap::Error> {
        DaemonArgs::try_parse_from(std::iter::once("overlayd").chain(v.iter().copied()))
    }

    #[test]
    fn core_lists() {
        let c: CoreList = "0-2,5,1".parse().unwrap();
        assert_eq!(c.cores(), &[0, 1, 2, 5]);
        assert_eq!(c.to_string(), "0,1,2,5");
        let e = |s: &str| s.parse::<CoreList>().unwrap_err().to_string();
        assert!(e("3-1").contains("3-1"));
        assert!(e("a").contains("\"a\""));
        assert!(e("4096").contains("4096"));
        assert!("".parse::<CoreList>().is_err());
    }

    #[test]
    fn flags_alone() {
        let a = args(&[
            "--underlay",
            "eth0",
            "--underlay",
            "eth1",
            "--underlay-addr",
            "fd00:99::1",
            "--cores",
            "0-1",
            "--xdp-mode",
            "skb",
            "--poll",
            "busy",
            "--boundary-vni",
            "1234",
            "--underlay-gso",
            "off",
            "--outer-dscp",
            "AF41",
        ])
        .unwrap();
        let c = DaemonConfig::resolve(&a).unwrap();
        assert_eq!(c.underlay_gso, UnderlayGso::Off);
        assert_eq!(c.outer_dscp.0, engine::OuterDscp::Fixed(34));
        assert_eq!(c.underlay, ["eth0", "eth1"]);
        assert_eq!(c.underlay_addr, "fd00:99::1".parse::<Ipv6Addr>().unwrap());
        assert_eq!(c.cores, [0, 1]);
        assert_eq!(c.xdp_mode, XdpMode::Skb);
        assert_eq!(c.poll, PollMode::Busy);
        assert_eq!(c.boundary_vni.get(), 1234);
        assert_eq!(c.api_socket, PathBuf::from(DEFAULT_API_SOCKET));
        assert_eq!(c.state_dir, PathBuf::from(DEFAULT_STATE_DIR));
        assert!(!c.external_jumbo);
    }

    #[test]
    fn defaults_and_refusals() {
        let c = DaemonConfig::resolve(
            &args(&["--underlay", "eth0", "--underlay-addr", "fd00::1"]).unwrap(),
        )
        .unwrap();
        assert_eq!(c.boundary_vni, DEFAULT_BOUNDARY_VNI);
        assert_eq!(c.xdp_mode, XdpMode::Native);
        assert_eq!(c.underlay_gso, UnderlayGso::Auto);
        assert_eq!(c.outer_dscp.0, engine::OuterDscp::Copy);
        assert!(args(&["--underlay", "eth0", "--underlay-gso", "yes"]).is_err());
        assert_eq!(c.poll, PollMode::Adaptive);
        assert_eq!(c.log_level, "info");
        let e = DaemonConfig::resolve(&args(&["--underlay-addr", "fd00::1"]).unwrap()).unwrap_err();
        assert!(matches!(e, ConfigError::NoUnderlay), "{e}");
        assert!(e.to_string().contains("--underlay"), "{e}");
        let e = DaemonConfig::resolve(&args(&["--underlay", "eth0"]).unwrap()).unwrap_err();
        assert!(e.to_string().contains("--underlay-addr"), "{e}");
        let e = args(&["--boundary-vni", "16777216"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("16777216"), "{e}");
        let e = args(&["--xdp-mode", "turbo"]).unwrap_err().to_string();
        assert!(e.contains("turbo"), "{e}");
        let e = args(&["--poll", "lazy"]).unwrap_err().to_string();
        assert!(e.contains("lazy"), "{e}");
        let e = DaemonConfig::resolve(
            &args(&["--underlay", "eth0", "--underlay-addr", "ff02::1"]).unwrap(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("ff02::1"), "{e}");
    }

    /// Each default a flag's help states ("(default X)", which docs/operating.md's
    /// command reference repeats) is the one the daemon runs with: giving the flag
    /// that value changes nothing.
    #[test]
    fn the_defaults_help_states_are_the_real_ones() {
        use clap::CommandFactory;
        let base = ["--underlay", "eth0", "--underlay-addr", "fd00::1"];
        let plain = DaemonConfig::resolve(&args(&base).unwrap()).unwrap();
        let mut checked = Vec::new();
        for a in DaemonArgs::command().get_arguments() {
            let Some(help) = a.get_help().map(ToString::to_string) else {
                continue;
            };
            let Some(value) = api::testing::stated_default(&help) else {
                continue;
            };
            let flag = format!("--{}", a.get_long().unwrap());
            let v: Vec<&str> = base.iter().copied().chain([flag.as_str(), value]).collect();
            let given = DaemonConfig::resolve(&args(&v).unwrap()).unwrap();
            assert_eq!(given, plain, "{flag} {value} is not the default");
            checked.push(flag);
        }
        assert!(checked.len() >= 10, "{checked:?}");
    }

    #[test]
    fn table_budget_from_flags() {
        let base = ["--underlay", "eth0", "--underlay-addr", "fd00::1"];
        let c = DaemonConfig::resolve(&args(&base).unwrap()).unwrap();
        assert_eq!(c.tables, TableBudget::default());
        let with = |extra: &[&str]| {
            let v: Vec<&str> = base.iter().chain(extra).copied().collect();
            DaemonConfig::resolve(&args(&v).unwrap())
        };
        let c = with(&["--table-budget-mib", "512", "--max-ports", "8"]).unwrap();
        assert_eq!(
            c.tables,
            TableBudget {
                bytes: 512 << 20,
                ports: 8
            }
        );
        let e = with(&["--max-ports", "0"]).unwrap_err().to_string();
        assert!(e.contains("ports"), "{e}");
        let e = with(&["--table-budget-mib", "0"]).unwrap_err().to_string();
        assert!(e.contains("0 bytes"), "{e}");
    }

    #[test]
    fn log_format_and_path_check_interval() {
        let base = ["--underlay", "eth0", "--underlay-addr", "fd00::1"];
        let with = |extra: &[&str]| {
            let v: Vec<&str> = base.iter().chain(extra).copied().collect();
            DaemonConfig::resolve(&args(&v).unwrap())
        };
        let c = with(&[]).unwrap();
        assert_eq!(c.log_format, LogFormat::Text);
        assert_eq!(c.path_check_interval, None);
        let c = with(&["--log-format", "json", "--path-check-interval", "30"]).unwrap();
        assert_eq!(c.log_format, LogFormat::Json);
        assert_eq!(
            c.path_check_interval,
            Some(std::time::Duration::from_secs(30))
        );
        assert_eq!(
            c.path_probe_interval,
            Some(std::time::Duration::from_millis(500))
        );
        let c = with(&["--path-probe-ms", "0"]).unwrap();
        assert_eq!(c.path_probe_interval, None);
        let c = with(&["--path-probe-ms", "200"]).unwrap();
        assert_eq!(
            c.path_probe_interval,
            Some(std::time::Duration::from_millis(200))
        );
        let e = with(&["--path-check-interval", "0"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("interval 0"), "{e}");
        let e = args(&["--log-format", "xml"]).unwrap_err().to_string();
        assert!(e.contains("xml"), "{e}");
    }

    /// The metrics endpoint: off by default, from the file, the flag winning; a
    /// value that is no ADDR:PORT is refused naming it.
    #[test]
    fn metrics_listen_from_file_and_flag() {
        let base = ["--underlay", "eth0", "--underlay-addr", "fd00::1"];
        let c = DaemonConfig::resolve(&args(&base).unwrap()).unwrap();
        assert_eq!(c.metrics_listen, None);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "metrics-listen = \"127.0.0.1:9464\"\n").unwrap();
        let file = ["--config", path.to_str().unwrap()];
        let c = DaemonConfig::resolve(&args(&[&base[..], &file].concat()).unwrap()).unwrap();
        assert_eq!(c.metrics_listen, Some("127.0.0.1:9464".parse().unwrap()));
        let flag = ["--metrics-listen", "[::1]:9100"];
        let a = args(&[&base[..], &file, &flag].concat()).unwrap();
        let c = DaemonConfig::resolve(&a).unwrap();
        assert_eq!(c.metrics_listen, Some("[::1]:9100".parse().unwrap()));
        let e = args(&[&base[..], &["--metrics-listen", "9464"]].concat()).unwrap_err();
        assert!(e.to_string().contains("9464"), "{e}");
    }

    /// `--api-socket api.sock` used to make the daemon take over (and chmod) the
    /// directory it was started in; relative paths are refused by name.
    #[test]
    fn relative_paths_are_refused() {
        let base = ["--underlay", "eth0", "--underlay-addr", "fd00::1"];
        for (flag, value) in [
            ("--api-socket", "api.sock"),
            ("--api-socket", "run/overlayd.sock"),
            ("--state-dir", "state"),
        ] {
            let a = args(&[&base[..], &[flag, value]].concat()).unwrap();
            let e = DaemonConfig::resolve(&a).unwrap_err().to_string();
            assert!(
                e.contains(&flag[2..]) && e.contains(value) && e.contains("not an absolute path"),
                "{e}"
            );
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "underlay = [\"eth0\"]\nunderlay-addr = \"fd00::1\"\napi-socket = \"x.sock\"\n",
        )
        .unwrap();
        let e = DaemonConfig::resolve(&args(&["--config", path.to_str().unwrap()]).unwrap())
            .unwrap_err();
        assert!(
            matches!(&e, ConfigError::Relative { option: "api-socket", path } if path.as_os_str() == "x.sock"),
            "{e}"
        );
    }

    /// The fleet flags: endpoints and sled id together, TLS files all three or
    /// none (and required by https), each refusal naming what is wrong; the file's
    /// keys the same, flags winning.
    #[test]
    fn fleet_membership_from_flags_and_file() {
        let base = ["--underlay", "eth0", "--underlay-addr", "fd00::1"];
        let resolve =
            |extra: &[&str]| DaemonConfig::resolve(&args(&[&base[..], extra].concat()).unwrap());
        assert_eq!(resolve(&[]).unwrap().fleet, None);
        let c = resolve(&[
            "--fleet-endpoints",
            "https://[fd00:99::e1]:2379,https://[fd00:99::e2]:2379",
            "--fleet-cert",
            "/etc/o/s.crt",
            "--fleet-key",
            "/etc/o/s.key",
            "--fleet-ca",
            "/etc/o/ca.crt",
            "--sled-id",
            "sled7",
        ])
        .unwrap();
        let f = c.fleet.unwrap();
        assert_eq!(f.endpoints.len(), 2);
        assert_eq!(f.sled.to_string(), "sled7");
        assert_eq!(f.tls.unwrap().key, PathBuf::from("/etc/o/s.key"));
        let refused = |extra: &[&str]| resolve(extra).unwrap_err().to_string();
        let http = ["--fleet-endpoints", "http://127.0.0.1:2379"];
        assert!(refused(&http).contains("sled-id"));
        assert!(refused(&["--sled-id", "s1"]).contains("fleet-endpoints"));
        assert!(refused(&[&http[..], &["--sled-id", "s/1"]].concat()).contains("\"s/1\""));
        let e = refused(&["--fleet-endpoints", "https://[::1]:2379", "--sled-id", "s1"]);
        assert!(
            e.contains("https://[::1]:2379") && e.contains("fleet-cert"),
            "{e}"
        );
        let e = refused(&["--fleet-endpoints", "etcd:2379", "--sled-id", "s1"]);
        assert!(e.contains("\"etcd:2379\""), "{e}");
        let e = refused(
            &[
                &http[..],
                &["--sled-id", "s1", "--fleet-cert", "/c", "--fleet-ca", "/a"],
            ]
            .concat(),
        );
        assert!(e.contains("fleet-key is missing"), "{e}");
        let e = refused(
            &[
                &http[..],
                &[
                    "--sled-id",
                    "s1",
                    "--fleet-cert",
                    "c",
                    "--fleet-key",
                    "/k",
                    "--fleet-ca",
                    "/a",
                ],
            ]
            .concat(),
        );
        assert!(e.contains("fleet-cert") && e.contains("absolute"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "fleet-endpoints = [\"http://127.0.0.1:2379\"]\nsled-id = \"file-sled\"\n",
        )
        .unwrap();
        let file = ["--config", path.to_str().unwrap()];
        let f = resolve(&file).unwrap().fleet.unwrap();
        assert_eq!((f.sled.to_string(), f.tls), ("file-sled".to_string(), None));
        let f = resolve(&[&file[..], &["--sled-id", "flag-sled"]].concat())
            .unwrap()
            .fleet
            .unwrap();
        assert_eq!(f.sled.to_string(), "flag-sled");
    }

    #[test]
    fn toml_file_with_flag_overrides() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("overlayd.toml");
        std::fs::write(
            &path,
            r#"
underlay = ["eth0"]
underlay-addr = "fd00:99::1"
cores = "0-1"
external-jumbo = true
boundary-services = "fd00:99::ff"
boundary-vni = 77
xdp-mode = "skb"
state-dir = "/tmp/s"
"#,
        )
        .unwrap();
        let a = args(&[
            "--config",
            path.to_str().unwrap(),
            "--underlay",
            "veth9",
            "--xdp-mode",
            "native",
        ])
        .unwrap();
        let c = DaemonConfig::resolve(&a).unwrap();
        assert_eq!(c.underlay, ["veth9"]);
        assert_eq!(c.xdp_mode, XdpMode::Native);
        assert_eq!(c.cores, [0, 1]);
        assert!(c.external_jumbo);
        assert_eq!(c.boundary_vni.get(), 77);
        assert_eq!(c.state_dir, PathBuf::from("/tmp/s"));
        assert_eq!(
            c.boundary_services,
            Some("fd00:99::ff".parse::<Ipv6Addr>().unwrap())
        );
    }

    #[test]
    fn json_file_and_unknown_keys() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.json");
        std::fs::write(&path, r#"{"underlay":["eth0"],"underlay-addr":"fd00::1"}"#).unwrap();
        let c =
            DaemonConfig::resolve(&args(&["--config", path.to_str().unwrap()]).unwrap()).unwrap();
        assert_eq!(c.underlay, ["eth0"]);
        let bad = dir.path().join("bad.toml");
        std::fs::write(&bad, "underlai = [\"eth0\"]\n").unwrap();
        let e = FileConfig::load(&bad).unwrap_err().to_string();
        assert!(e.contains("underlai"), "{e}");
    }
}
