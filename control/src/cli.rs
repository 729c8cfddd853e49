//! `xdeadm`'s command line: parsing (clap), turning commands into API requests, and
//! printing the answers as tables or JSON.
//!
//! Parsing lives in the library so tests can check that every verb builds the request
//! it should and that bad values are refused by name before anything is sent.

mod flows;

use crate::api::{
    CaptureEnd, CaptureSpec, Check, CheckStatus, CreatePort, Direction, FwAction, FwFilters,
    FwHost, FwPorts, FwProto, FwProtoSpec, FwRule, PeerPath, PortLink, PortStatus, Reply, Request,
    RouteEntry, V2pEntry, V2pTarget, DEFAULT_API_SOCKET,
};
use crate::config::parse_vni;
use crate::opteadm;
use clap::{Args, Parser, Subcommand};
use engine::PortLimits;
use engine::DEFAULT_PORT_MTU;
use engine::{CidrDir, PortConfig, RouteClass, Vni};
use engine::{ExternalIps, SnatRange};
use ipnet::IpNet;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv6Addr};
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};
use wire::MacAddr;

#[derive(Debug, Parser)]
#[command(
    name = "xdeadm",
    version,
    about = "Administer the overlayd datapath",
    after_help = "opteadm's command lines work too: -p/--port PORT wherever opteadm takes it \
                  (list-layers, dump-layer, dump-uft, clear-uft, dump-tcp-flows, \
                  add/del-router-entry, add/rm-fw-rule, remove-fw-rule, list-fw-rules, \
                  set-fw-rules, which then reads its rules from standard input, \
                  set-external-ips, set-port-limits, pause-port, resume-port, allow-cidr, \
                  remove-cidr, attach-subnet, detach-subnet)."
)]
pub struct Cli {
    /// The daemon's API socket.
    #[arg(long, global = true, value_name = "PATH", default_value = DEFAULT_API_SOCKET)]
    pub socket: PathBuf,
    /// Print machine-readable JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// Parses a command line, opteadm's forms included (see [`opteadm::normalize`]).
    pub fn parse_line(
        args: impl IntoIterator<Item = impl Into<std::ffi::OsString>>,
    ) -> Result<Cli, clap::Error> {
        let args = args.into_iter().map(Into::into).collect();
        Cli::try_parse_from(opteadm::normalize(args))
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create a guest port (a tap device) and its gateway.
    CreateXde(Box<CreateXde>),
    /// Delete a port and its routes and firewall rules.
    DeleteXde { name: String },
    /// List ports, with their state (ready: no frame yet; running; paused).
    ListPorts,
    /// Pause a port: every frame from and to its guest is dropped (counted as
    /// port_paused) until resume-port; its flows, connections and rules are kept.
    PausePort { port: String },
    /// Resume a paused port: its connections continue where they were.
    ResumePort { port: String },
    /// Map a guest's VPC address to its MAC and the sled hosting it.
    SetV2p {
        vpc_ip: IpAddr,
        #[arg(value_parser = parse_mac)]
        vpc_mac: MacAddr,
        underlay_ip: Ipv6Addr,
        #[arg(value_parser = parse_vni)]
        vni: Vni,
    },
    /// Remove a V2P mapping: `VPC_IP VNI`, or opteadm's `VPC_IP VPC_MAC UNDERLAY_IP
    /// VNI` (then only if the mapping is exactly that).
    ClearV2p {
        #[arg(num_args = 2..=4, value_names = ["VPC_IP", "VNI"], required = true)]
        words: Vec<String>,
    },
    /// Show all V2P mappings.
    DumpV2p,
    /// Let traffic to an external PREFIX leave by these boundary-services
    /// endpoints (underlay addresses; added to those the prefix has). Each flow
    /// takes one, by its hash, among those of the longest matching prefix.
    SetV2b {
        prefix: IpNet,
        #[arg(required = true)]
        endpoints: Vec<Ipv6Addr>,
    },
    /// Remove boundary-services endpoints from a V2B prefix (the prefix goes with
    /// its last endpoint).
    ClearV2b {
        prefix: IpNet,
        #[arg(required = true)]
        endpoints: Vec<Ipv6Addr>,
    },
    /// Show the V2B table, `--boundary-services` included.
    DumpV2b,
    /// Add a router entry: DEST is a prefix, TARGET one of subnet, igw, drop (or
    /// opteadm's sub4=CIDR, sub6=CIDR, ig, drop, with CLASS system).
    AddRouterEntry {
        port: String,
        #[arg(value_parser = parse_net)]
        dest: IpNet,
        target: String,
        /// opteadm's router class: system (the default) or custom (wins a tie with
        /// a system route of the same prefix).
        class: Option<String>,
        /// The router class as a flag (the same as CLASS).
        #[arg(long = "class")]
        class_flag: Option<String>,
        /// Path MTU for this destination, when smaller than the port's.
        #[arg(long, value_parser = parse_mtu)]
        mtu: Option<u16>,
    },
    /// Remove the router entry for DEST (opteadm's TARGET and CLASS, when given,
    /// are checked for syntax only: a port has one route per prefix).
    DelRouterEntry {
        port: String,
        #[arg(value_parser = parse_net)]
        dest: IpNet,
        target: Option<String>,
        /// The class of the route to delete: system (the default) or custom.
        class: Option<String>,
        #[arg(long = "class")]
        class_flag: Option<String>,
    },
    /// Show a port's router entries.
    DumpRoutes { port: String },
    /// Add one firewall rule.
    AddFwRule {
        port: String,
        #[command(flatten)]
        rule: RuleArgs,
        #[arg(long, default_value = "allow")]
        action: FwAction,
    },
    /// Remove a firewall rule: the one with ID (as list-fw-rules and dump-layer
    /// PORT firewall show it; opteadm's form, checking --direction), or the one
    /// with this direction, priority and filters.
    RmFwRule {
        port: String,
        /// The rule's id (list-fw-rules PORT).
        id: Option<u64>,
        #[command(flatten)]
        rule: RuleArgs,
    },
    /// Remove the firewall rule with ID (as list-fw-rules and dump-layer PORT
    /// firewall show it), whichever way it looks.
    RemoveFwRule {
        port: String,
        /// The rule's id (list-fw-rules PORT).
        id: u64,
    },
    /// A port's firewall rules as configured, with their ids.
    ListFwRules { port: String },
    /// Replace all of a port's firewall rules. Each --rule is
    /// "direction=in priority=10 action=allow host=any proto=tcp ports=22,443"
    /// (opteadm's "dir=in action=allow priority=10 hosts=any protocol=TCP port=22"
    /// too); no --rule clears the set.
    SetFwRules {
        port: String,
        #[arg(long = "rule", value_parser = parse_rule)]
        rules: Vec<FwRule>,
        /// Read the rules from standard input, one per line (what opteadm's
        /// `set-fw-rules -p PORT` does).
        #[arg(long, conflicts_with = "rules")]
        stdin: bool,
    },
    /// The port's layers in the order outbound packets meet them (inbound: the
    /// reverse), with rule counts, default actions and flow counts.
    ListLayers { port: String },
    /// Show one layer list-layers names (gateway, firewall, router, overlay): its
    /// rules with hit counts, default actions, flows and counters.
    DumpLayer { port: String, layer: String },
    /// The port's tracked connections: 5-tuple, TCP state, packets and bytes each
    /// way, age and idle time.
    DumpTcpFlows { port: String },
    /// Show the unified flow table of a port, a page at a time (a table that fits
    /// one page is shown whole); a page that is not the last ends with `next`.
    DumpUft {
        port: String,
        /// Most entries in the page (the daemon shows at most 4096).
        #[arg(long)]
        limit: Option<usize>,
        /// Show the page from here: the `next` the previous page ended with.
        #[arg(long)]
        cursor: Option<u64>,
    },
    /// Empty the unified flow table of a port.
    ClearUft { port: String },
    /// Replace a port's external addresses (create-xde's flags; none removes them
    /// all). The port's flows are decided again at once.
    SetExternalIps {
        port: String,
        #[command(flatten)]
        external: ExternalArgs,
    },
    /// Replace a port's rate limits (create-xde's flags; none removes them all).
    /// Policing: frames over a limit are dropped and counted (`rate_limited`).
    SetPortLimits {
        port: String,
        #[command(flatten)]
        limits: LimitArgs,
    },
    /// Let the guest receive frames to (`--dir in`) or send frames from (`--dir
    /// out`) addresses of PREFIX besides its own (OPTE's transit IPs). Shown by
    /// `list-ports --json` (`config.cidrs`).
    AllowCidr {
        port: String,
        #[arg(value_parser = parse_net)]
        prefix: IpNet,
        #[arg(long, value_parser = parse_cidr_dir)]
        dir: CidrDir,
    },
    /// Undo `allow-cidr` for one direction.
    RemoveCidr {
        port: String,
        #[arg(value_parser = parse_net)]
        prefix: IpNet,
        #[arg(long, value_parser = parse_cidr_dir)]
        dir: CidrDir,
    },
    /// Attach a subnet to the guest (an appliance): `allow-cidr` both ways.
    AttachSubnet {
        port: String,
        #[arg(value_parser = parse_net)]
        prefix: IpNet,
    },
    /// Undo `attach-subnet` (both ways must be allowed).
    DetachSubnet {
        port: String,
        #[arg(value_parser = parse_net)]
        prefix: IpNet,
    },
    /// Counters: datapath-wide, or one port's.
    Stats {
        port: Option<String>,
        /// `text`, `json` (as --json) or `openmetrics` (the exposition
        /// `--metrics-listen` serves, for a textfile collector; whole sled only).
        #[arg(long, value_enum, default_value_t = StatsFormat::Text)]
        format: StatsFormat,
    },
    /// Per worker: its core, ports and underlay queues, rounds, busy ratio, idle
    /// sleeps, handoffs, and since when it runs.
    Workers,
    /// The MTU budget of a port: underlay MTU, overhead, segment sizes, warnings.
    Mtu { port: String },
    /// `ra PORT`: the RA a port advertises; `ra listen IFACE`: solicit one (in a guest).
    Ra(RaArgs),
    /// Check the host and the daemon: XDP and AF_XDP modes, queues, MTU, cores,
    /// offloads, and each port. Exits 1 when a check fails.
    Doctor,
    /// Probe the underlay path to a peer sled (or every sled in V2P) with
    /// unfragmented packets up to the underlay MTU; exits 1 when a path does not
    /// carry it.
    PathCheck {
        /// The peer's underlay address (default: every sled V2P names).
        underlay_addr: Option<Ipv6Addr>,
    },
    /// Capture the frames passing a port (both directions; frames the datapath
    /// dropped carry the reason) as pcapng: into FILE, or to standard output
    /// (`xdeadm capture PORT | tshark -r -`). Ends after COUNT frames or SECONDS.
    Capture(CaptureArgs),
}

#[derive(Debug, Args, Clone, PartialEq, Eq)]
pub struct CaptureArgs {
    pub port: String,
    /// Also the port's underlay frames: the Geneve frames its guest's frames
    /// became, and those addressed to it (delivered or dropped).
    #[arg(long)]
    pub underlay: bool,
    /// The pcapng file overlayd writes (new, or empty; under systemd, a directory
    /// overlayd may write, such as /run/overlayd). Default: standard output.
    #[arg(short = 'w', long = "write", value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// Stop after this many frames.
    #[arg(short = 'c', long = "count", value_name = "N")]
    pub count: Option<u64>,
    /// Stop after this many seconds (default 10, at most 3600).
    #[arg(long, value_name = "S")]
    pub seconds: Option<u32>,
}

impl CaptureArgs {
    /// The request for a capture into `file`.
    pub fn spec(&self, file: PathBuf) -> CaptureSpec {
        CaptureSpec {
            port: self.port.clone(),
            underlay: self.underlay,
            count: self.count,
            seconds: self.seconds,
            file,
        }
    }
}

/// `--vhost-user-mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum VhostModeArg {
    Server,
    Client,
}

impl From<VhostModeArg> for crate::api::VhostUserMode {
    fn from(m: VhostModeArg) -> Self {
        match m {
            VhostModeArg::Server => crate::api::VhostUserMode::Server,
            VhostModeArg::Client => crate::api::VhostUserMode::Client,
        }
    }
}

#[derive(Debug, Args)]
pub struct CreateXde {
    pub name: String,
    #[arg(long, value_parser = parse_mac)]
    pub guest_mac: MacAddr,
    /// The guest's private address (one IPv4 and/or one IPv6).
    #[arg(long = "private-ip", required = true)]
    pub private_ip: Vec<IpAddr>,
    /// The VPC subnet (one IPv4 and/or one IPv6).
    #[arg(long = "vpc-subnet", value_parser = parse_net)]
    pub vpc_subnet: Vec<IpNet>,
    #[arg(long, value_parser = parse_mac)]
    pub gateway_mac: MacAddr,
    /// The gateway's IPv4 address (its IPv6 address is derived from the gateway MAC).
    #[arg(long)]
    pub gateway_ip: Option<IpAddr>,
    #[arg(long, value_parser = parse_vni)]
    pub vpc_vni: Vni,
    #[arg(long, default_value_t = DEFAULT_PORT_MTU, value_parser = parse_mtu)]
    pub mtu: u16,
    /// Let external traffic use the port MTU (needs the daemon's sled-wide flag too).
    #[arg(long)]
    pub external_jumbo: bool,
    /// Move the tap into this network namespace.
    #[arg(long)]
    pub netns: Option<String>,
    /// Make no tap: attach the port to this existing interface, the host side of a
    /// hypervisor's tap (QEMU `-netdev tap,ifname=IFACE,script=no`), which the
    /// daemon never deletes.
    #[arg(long, value_name = "IFACE", conflicts_with = "netns")]
    pub attach: Option<String>,
    /// Serve a VM over vhost-user at this socket instead of a tap: overlayd is the
    /// backend of the VM's virtio-net device.
    #[arg(long, value_name = "SOCKET_PATH", conflicts_with_all = ["netns", "attach"])]
    pub vhost_user: Option<std::path::PathBuf>,
    /// Who listens on the vhost-user socket: overlayd (server) or QEMU (client:
    /// the VM survives a restart of overlayd).
    #[arg(long, value_enum, requires = "vhost_user", default_value_t = VhostModeArg::Server)]
    pub vhost_user_mode: VhostModeArg,
    #[arg(long = "dns-server")]
    pub dns_server: Vec<IpAddr>,
    #[arg(long)]
    pub hostname: Option<String>,
    #[arg(long)]
    pub domain: Option<String>,
    #[command(flatten)]
    pub external: ExternalArgs,
    #[command(flatten)]
    pub limits: LimitArgs,
}

/// A port's rate limits as flags (`create-xde`, `set-port-limits`); none given is
/// unlimited. Checked by the daemon (and here for create-xde), errors naming the
/// bad value.
#[derive(Debug, Args, Clone, Default, PartialEq, Eq)]
pub struct LimitArgs {
    /// What the guest may send, in Mbit/s.
    #[arg(long)]
    pub egress_mbps: Option<u32>,
    /// What may be delivered to the guest, in Mbit/s.
    #[arg(long)]
    pub ingress_mbps: Option<u32>,
    /// Burst of the Mbit/s limits, in KiB (default: 20 ms at the limit, at least
    /// 256 KiB: four 64 KiB TSO buffers).
    #[arg(long)]
    pub burst_kib: Option<u32>,
    /// Packets per second, each direction.
    #[arg(long)]
    pub pps: Option<u32>,
}

impl LimitArgs {
    pub fn to_limits(&self) -> PortLimits {
        PortLimits {
            egress_mbps: self.egress_mbps,
            ingress_mbps: self.ingress_mbps,
            burst_kib: self.burst_kib,
            pps: self.pps,
        }
    }
}

/// A port's external addresses as opteadm's flags give them (`create-xde`,
/// `set-external-ips`); the datapath reaches the internet only from these.
#[derive(Debug, Args, Clone, Default, PartialEq, Eq)]
pub struct ExternalArgs {
    /// SNAT address, shared by ports with disjoint port ranges.
    #[arg(long)]
    pub snat_ip: Option<IpAddr>,
    /// First source port of this port's SNAT range (1024-65535).
    #[arg(long, requires = "snat_ip")]
    pub snat_start: Option<u16>,
    /// Last source port of this port's SNAT range.
    #[arg(long, requires = "snat_ip")]
    pub snat_end: Option<u16>,
    /// The port's own external address, used when it has no floating IP.
    #[arg(long)]
    pub ephemeral_ip: Option<IpAddr>,
    /// A floating IP (repeatable; the first of a flow's family is its source).
    #[arg(long = "floating-ip")]
    pub floating_ip: Vec<IpAddr>,
}

impl ExternalArgs {
    /// The addresses; the range's bounds are checked with the port's addresses
    /// (create-xde here, set-external-ips by the daemon).
    pub fn to_external(&self) -> Result<ExternalIps, String> {
        let snat = match (self.snat_ip, self.snat_start, self.snat_end) {
            (None, _, _) => None,
            (Some(ip), Some(start), Some(end)) => Some(SnatRange { ip, start, end }),
            (Some(ip), _, _) => {
                return Err(format!(
                    "SNAT IP {ip} needs its port range: --snat-start and --snat-end"
                ))
            }
        };
        Ok(ExternalIps {
            snat,
            ephemeral: self.ephemeral_ip,
            floating: self.floating_ip.clone(),
        })
    }
}

/// Direction, priority and filters of a firewall rule, as flags (opteadm's
/// spellings as aliases: --dir, --hosts, --protocol).
#[derive(Debug, Args)]
pub struct RuleArgs {
    #[arg(long, alias = "dir")]
    pub direction: Direction,
    /// Needed, except by `rm-fw-rule ID`.
    #[arg(long)]
    pub priority: Option<u16>,
    /// any, an address or a prefix (opteadm's ip=ADDR, subnet=CIDR), or vni=N
    /// (traffic of that VPC).
    #[arg(long, alias = "hosts", default_value = "any")]
    pub host: FwHost,
    /// any, tcp, udp, icmp[:TYPE[/CODE]], icmp6[:TYPE[/CODE]] or proto=N.
    #[arg(long, alias = "protocol", default_value = "any")]
    pub proto: FwProtoSpec,
    /// Destination ports and ranges, comma separated (TCP/UDP only:
    /// 80,443,8000-8080), or any.
    #[arg(long, value_parser = parse_ports)]
    pub ports: Option<Ports>,
}

/// A port list as `--ports` takes it (`any`: none given).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ports(Vec<FwPorts>);

/// `22,443,8000-8080` or `any` (opteadm's spelling of no port filter).
pub fn parse_ports(s: &str) -> Result<Ports, String> {
    if s.eq_ignore_ascii_case("any") {
        return Ok(Ports(Vec::new()));
    }
    s.split(',')
        .map(|p| {
            p.parse::<FwPorts>()
                .map_err(|e| format!("{e} (ports: {s:?})"))
        })
        .collect::<Result<_, _>>()
        .map(Ports)
}

impl RuleArgs {
    fn filters(&self) -> FwFilters {
        FwFilters {
            host: self.host,
            proto: self.proto.proto,
            ports: self.ports.clone().map(|p| p.0).unwrap_or_default(),
            icmp: self.proto.icmp,
        }
    }

    fn priority(&self, verb: &str) -> Result<u16, String> {
        self.priority
            .ok_or_else(|| format!("{verb} needs --priority"))
    }
}

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct RaArgs {
    /// The port whose RA to show.
    pub port: Option<String>,
    #[command(subcommand)]
    pub listen: Option<RaCommand>,
}

#[derive(Debug, Subcommand)]
pub enum RaCommand {
    /// Send a Router Solicitation on IFACE and print the RA received (runs locally,
    /// no daemon needed).
    Listen {
        iface: String,
        #[arg(long, default_value_t = 5)]
        timeout: u64,
    },
}

/// How `stats` prints.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum StatsFormat {
    #[default]
    Text,
    Json,
    Openmetrics,
}

/// Answers printed in a form of their own rather than by [`render`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Show {
    /// A `stats` reply as an OpenMetrics exposition.
    OpenMetrics,
    /// A `workers` reply as a table (or JSON).
    Workers,
    /// Any reply as JSON (`stats --format json`).
    Json,
}

/// What a parsed command does.
#[derive(Debug, PartialEq)]
pub enum Action {
    /// Ask the daemon.
    Call(Request),
    /// Ask the daemon and print the answer as `Show` says.
    Show(Request, Show),
    /// Solicit an RA locally.
    RaListen { iface: String, timeout_s: u64 },
    /// Capture into a file of xdeadm's own and copy it to standard output.
    CaptureToStdout(CaptureArgs),
}

pub fn parse_mac(s: &str) -> Result<MacAddr, String> {
    s.parse()
        .map_err(|e: wire::mac::ParseMacError| e.to_string())
}

pub fn parse_net(s: &str) -> Result<IpNet, String> {
    s.parse()
        .map_err(|_| format!("invalid prefix {s:?}: expected e.g. 10.0.0.0/24 or fd00::/64"))
}

/// A route's class from opteadm's positional CLASS or `--class` (the same if
/// both); `system` when neither.
fn route_class(positional: Option<&str>, flag: Option<&str>) -> Result<RouteClass, String> {
    let p = positional
        .map(str::parse::<RouteClass>)
        .transpose()
        .map_err(|e| e.to_string())?;
    let f = flag
        .map(str::parse::<RouteClass>)
        .transpose()
        .map_err(|e| e.to_string())?;
    match (p, f) {
        (Some(a), Some(b)) if a != b => {
            Err(format!("router class given twice: {a} and --class {b}"))
        }
        (a, b) => Ok(a.or(b).unwrap_or_default()),
    }
}

/// `--dir in|out` of `allow-cidr`/`remove-cidr` (any case; both ways is
/// `attach-subnet`).
pub fn parse_cidr_dir(s: &str) -> Result<CidrDir, String> {
    match s.parse::<CidrDir>().map_err(|e| e.to_string())? {
        CidrDir::Both => Err(format!(
            "invalid direction {s:?}: expected in or out (attach-subnet allows both)"
        )),
        d => Ok(d),
    }
}

pub fn parse_mtu(s: &str) -> Result<u16, String> {
    let v: u32 = s
        .parse()
        .map_err(|_| format!("invalid MTU {s:?}: expected a number"))?;
    let min = engine::MIN_PORT_MTU;
    if v < u32::from(min) {
        return Err(format!("MTU {v} is below {min}"));
    }
    u16::try_from(v).map_err(|_| format!("MTU {v} is above 65535"))
}

/// Parses "direction=in priority=10 action=allow host=any proto=tcp ports=22,443".
pub fn parse_rule(s: &str) -> Result<FwRule, String> {
    let (mut direction, mut priority, mut action) = (None, None, FwAction::Allow);
    let (mut host, mut ports) = (FwHost::Any, Vec::new());
    let mut proto = FwProtoSpec {
        proto: FwProto::Any,
        icmp: None,
    };
    for word in s.split_whitespace() {
        let (k, v) = word
            .split_once('=')
            .ok_or_else(|| format!("rule {s:?}: {word:?} is not key=value"))?;
        match k.to_ascii_lowercase().as_str() {
            "direction" | "dir" => direction = Some(v.parse()?),
            "priority" | "prio" => {
                priority = Some(
                    v.parse::<u16>()
                        .map_err(|_| format!("rule {s:?}: invalid priority {v:?}"))?,
                )
            }
            "action" => action = v.parse()?,
            "host" | "hosts" => host = v.parse()?,
            "proto" | "protocol" => proto = v.parse()?,
            "ports" | "port" => ports = parse_ports(v).map_err(|e| format!("rule {s:?}: {e}"))?.0,
            _ => return Err(format!("rule {s:?}: unknown key {k:?}")),
        }
    }
    let rule = FwRule {
        id: 0,
        direction: direction.ok_or_else(|| format!("rule {s:?}: needs direction=in|out"))?,
        priority: priority.ok_or_else(|| format!("rule {s:?}: needs priority=N"))?,
        action,
        filters: FwFilters {
            host,
            proto: proto.proto,
            ports,
            icmp: proto.icmp,
        },
    };
    rule.filters
        .validate()
        .map_err(|e| format!("rule {s:?}: {e}"))?;
    Ok(rule)
}

impl CreateXde {
    /// Builds the port configuration, refusing what it cannot hold by name.
    pub fn to_config(&self) -> Result<PortConfig, String> {
        fn one<T: Copy + std::fmt::Display>(what: &str, v: &[T]) -> Result<Option<T>, String> {
            match v {
                [] => Ok(None),
                [x] => Ok(Some(*x)),
                _ => Err(format!(
                    "more than one {what}: {}",
                    v.iter()
                        .map(|x| x.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                )),
            }
        }
        let (mut v4, mut v6) = (Vec::new(), Vec::new());
        for ip in &self.private_ip {
            match ip {
                IpAddr::V4(a) => v4.push(*a),
                IpAddr::V6(a) => v6.push(*a),
            }
        }
        let (mut n4, mut n6) = (Vec::new(), Vec::new());
        for net in &self.vpc_subnet {
            match net {
                IpNet::V4(n) => n4.push(*n),
                IpNet::V6(n) => n6.push(*n),
            }
        }
        let gateway_ipv4 = match self.gateway_ip {
            None => None,
            Some(IpAddr::V4(a)) => Some(a),
            Some(IpAddr::V6(a)) => {
                return Err(format!(
                    "gateway IP {a} is IPv6: the gateway's IPv6 address is always fe80::EUI-64(gateway MAC); give its IPv4 address"
                ))
            }
        };
        let cfg = PortConfig {
            name: self.name.clone(),
            guest_mac: self.guest_mac,
            gateway_mac: self.gateway_mac,
            ipv4: one("IPv4 private IP", &v4)?,
            ipv6: one("IPv6 private IP", &v6)?,
            vpc_subnet4: one("IPv4 VPC subnet", &n4)?,
            vpc_subnet6: one("IPv6 VPC subnet", &n6)?,
            gateway_ipv4,
            vni: self.vpc_vni,
            mtu: self.mtu,
            external_jumbo: self.external_jumbo,
            dns_servers4: self
                .dns_server
                .iter()
                .filter_map(|ip| match ip {
                    IpAddr::V4(a) => Some(*a),
                    IpAddr::V6(_) => None,
                })
                .collect(),
            dns_servers6: self
                .dns_server
                .iter()
                .filter_map(|ip| match ip {
                    IpAddr::V6(a) => Some(*a),
                    IpAddr::V4(_) => None,
                })
                .collect(),
            hostname: self.hostname.clone(),
            domain: self.domain.clone(),
            external: self.external.to_external()?,
            limits: self.limits.to_limits(),
            cidrs: Default::default(),
        };
        cfg.validate().map_err(|e| e.to_string())?;
        Ok(cfg)
    }
}

impl Command {
    /// Turns the command into what to do; errors name the bad value.
    pub fn action(self) -> Result<Action, String> {
        let req = match self {
            Command::CreateXde(c) => Request::CreatePort(Box::new(CreatePort {
                vhost_user: c.vhost_user.clone().map(|socket| crate::api::VhostUser {
                    socket,
                    mode: c.vhost_user_mode.into(),
                }),
                config: c.to_config()?,
                netns: c.netns,
                attach: c.attach,
            })),
            Command::DeleteXde { name } => Request::DeletePort { name },
            Command::ListPorts => Request::ListPorts,
            Command::PausePort { port } => Request::PausePort { port },
            Command::ResumePort { port } => Request::ResumePort { port },
            Command::SetV2p {
                vpc_ip,
                vpc_mac,
                underlay_ip,
                vni,
            } => Request::SetV2p(V2pEntry {
                vpc_ip,
                vpc_mac,
                underlay_ip,
                vni,
            }),
            Command::ClearV2p { words } => clear_v2p(&words)?,
            Command::DumpV2p => Request::DumpV2p,
            Command::SetV2b { prefix, endpoints } => Request::SetV2b { prefix, endpoints },
            Command::ClearV2b { prefix, endpoints } => Request::ClearV2b { prefix, endpoints },
            Command::DumpV2b => Request::DumpV2b,
            Command::AddRouterEntry {
                port,
                dest,
                target,
                class,
                class_flag,
                mtu,
            } => {
                let target = opteadm::route_target(&dest, &target)?;
                let class = route_class(class.as_deref(), class_flag.as_deref())?;
                Request::AddRouterEntry {
                    port,
                    entry: RouteEntry {
                        dest,
                        target,
                        mtu,
                        class,
                    },
                }
            }
            Command::DelRouterEntry {
                port,
                dest,
                target,
                class,
                class_flag,
            } => {
                if let Some(t) = &target {
                    opteadm::route_target(&dest, t)?;
                }
                let class = route_class(class.as_deref(), class_flag.as_deref())?;
                Request::DelRouterEntry { port, dest, class }
            }
            Command::DumpRoutes { port } => Request::DumpRoutes { port },
            Command::AddFwRule { port, rule, action } => {
                let filters = rule.filters();
                filters.validate()?;
                Request::AddFwRule {
                    port,
                    rule: FwRule {
                        id: 0,
                        direction: rule.direction,
                        priority: rule.priority("add-fw-rule")?,
                        action,
                        filters,
                    },
                }
            }
            Command::RmFwRule {
                port,
                id: Some(id),
                rule,
            } => {
                if rule.priority.is_some() || rule.ports.is_some() {
                    return Err(format!(
                        "rm-fw-rule {id}: a rule is named by its id or by --priority and filters, not both"
                    ));
                }
                Request::RmFwRuleId {
                    port,
                    direction: Some(rule.direction),
                    id,
                }
            }
            Command::RemoveFwRule { port, id } => Request::RmFwRuleId {
                port,
                direction: None,
                id,
            },
            Command::ListFwRules { port } => Request::ListFwRules { port },
            Command::RmFwRule {
                port,
                id: None,
                rule,
            } => Request::RmFwRule {
                port,
                direction: rule.direction,
                priority: rule.priority("rm-fw-rule without an ID")?,
                filters: rule.filters(),
            },
            Command::SetFwRules {
                port, stdin: true, ..
            } => Request::SetFwRules {
                port,
                rules: opteadm::read_rules(std::io::stdin().lock())?,
            },
            Command::SetFwRules { port, rules, .. } => Request::SetFwRules { port, rules },
            Command::ListLayers { port } => Request::ListLayers { port },
            Command::DumpLayer { port, layer } => Request::DumpLayer { port, layer },
            Command::DumpTcpFlows { port } => Request::DumpTcpFlows { port },
            Command::DumpUft {
                port,
                limit,
                cursor,
            } => Request::DumpUft {
                port,
                cursor,
                limit,
            },
            Command::ClearUft { port } => Request::ClearUft { port },
            Command::SetExternalIps { port, external } => Request::SetExternalIps {
                port,
                external: external.to_external()?,
            },
            Command::SetPortLimits { port, limits } => Request::SetPortLimits {
                port,
                limits: limits.to_limits(),
            },
            Command::AllowCidr { port, prefix, dir } => Request::AllowCidr { port, prefix, dir },
            Command::RemoveCidr { port, prefix, dir } => Request::RemoveCidr { port, prefix, dir },
            Command::AttachSubnet { port, prefix } => Request::AllowCidr {
                port,
                prefix,
                dir: CidrDir::Both,
            },
            Command::DetachSubnet { port, prefix } => Request::RemoveCidr {
                port,
                prefix,
                dir: CidrDir::Both,
            },
            Command::Stats { port, format } => {
                let show = match (format, &port) {
                    (StatsFormat::Text, _) => return Ok(Action::Call(Request::Stats { port })),
                    (StatsFormat::Json, _) => Show::Json,
                    (StatsFormat::Openmetrics, None) => Show::OpenMetrics,
                    (StatsFormat::Openmetrics, Some(p)) => {
                        return Err(format!(
                            "stats --format openmetrics covers the whole sled: give no port (got {p:?})"
                        ))
                    }
                };
                return Ok(Action::Show(Request::Stats { port }, show));
            }
            Command::Workers => return Ok(Action::Show(Request::Workers, Show::Workers)),
            Command::Mtu { port } => Request::Mtu { port },
            Command::Ra(RaArgs {
                listen: Some(RaCommand::Listen { iface, timeout }),
                ..
            }) => {
                return Ok(Action::RaListen {
                    iface,
                    timeout_s: timeout,
                })
            }
            Command::Ra(RaArgs {
                port: Some(port), ..
            }) => Request::Ra { port },
            Command::Ra(RaArgs { .. }) => {
                return Err("ra needs a PORT, or `listen IFACE`".into());
            }
            Command::Doctor => Request::Doctor,
            Command::PathCheck { underlay_addr } => Request::PathCheck {
                peer: underlay_addr,
            },
            Command::Capture(c) => match &c.file {
                // The daemon has its own working directory.
                Some(f) => Request::Capture(
                    c.spec(
                        std::path::absolute(f)
                            .map_err(|e| format!("capture file {:?}: {e}", f.display()))?,
                    ),
                ),
                None => return Ok(Action::CaptureToStdout(c)),
            },
        };
        Ok(Action::Call(req))
    }
}

/// `clear-v2p VPC_IP VNI`, or opteadm's `clear-v2p VPC_IP VPC_MAC UNDERLAY_IP VNI`.
fn clear_v2p(words: &[String]) -> Result<Request, String> {
    let ip = |s: &str| {
        s.parse::<IpAddr>()
            .map_err(|_| format!("invalid VPC IP {s:?}"))
    };
    match words {
        [vpc_ip, vni] => Ok(Request::ClearV2p {
            vpc_ip: ip(vpc_ip)?,
            vni: parse_vni(vni)?,
            expect: None,
        }),
        [vpc_ip, mac, underlay, vni] => Ok(Request::ClearV2p {
            vpc_ip: ip(vpc_ip)?,
            vni: parse_vni(vni)?,
            expect: Some(V2pTarget {
                vpc_mac: parse_mac(mac)?,
                underlay_ip: underlay
                    .parse()
                    .map_err(|_| format!("invalid underlay IPv6 address {underlay:?}"))?,
            }),
        }),
        _ => Err(format!(
            "clear-v2p takes VPC_IP VNI, or VPC_IP VPC_MAC UNDERLAY_IP VNI; got {} words",
            words.len()
        )),
    }
}

/// Renders the reply to `request` for people: the flow and layer verbs as tables
/// (`flows`), everything else as [`render`] does.
pub fn render_for(request: &Request, reply: &Reply) -> String {
    flows::render(request, reply).unwrap_or_else(|| render(reply))
}

/// Renders a reply for people: tables for lists, indented key/value lines for the
/// engine's inspection results.
pub fn render(reply: &Reply) -> String {
    let mut out = String::new();
    match reply {
        Reply::Done => {}
        Reply::Ports(ports) => render_ports(&mut out, ports),
        Reply::V2p(entries) => {
            let rows = entries
                .iter()
                .map(|e| {
                    vec![
                        e.vni.to_string(),
                        e.vpc_ip.to_string(),
                        e.vpc_mac.to_string(),
                        e.underlay_ip.to_string(),
                    ]
                })
                .collect();
            table(&mut out, &["VNI", "VPC IP", "VPC MAC", "UNDERLAY IP"], rows);
        }
        Reply::V2b(entries) => {
            let rows = entries
                .iter()
                .map(|e| {
                    let eps: Vec<String> = e.endpoints.iter().map(|a| a.to_string()).collect();
                    vec![e.prefix.to_string(), eps.join(",")]
                })
                .collect();
            table(&mut out, &["PREFIX", "BOUNDARY ENDPOINTS"], rows);
        }
        Reply::Routes(routes) => {
            let rows = routes
                .iter()
                .map(|r| {
                    vec![
                        r.dest.to_string(),
                        r.target.to_string(),
                        r.class.to_string(),
                        r.mtu.map_or("-".into(), |m| m.to_string()),
                    ]
                })
                .collect();
            table(&mut out, &["DEST", "TARGET", "CLASS", "MTU"], rows);
        }
        Reply::FwRules(rules) => {
            for r in rules {
                let _ = writeln!(out, "{r}");
            }
        }
        Reply::Inspect(v) => render_value(&mut out, v, 0),
        Reply::Doctor(checks) => render_checks(&mut out, checks),
        Reply::PathCheck(paths) => render_paths(&mut out, paths),
        Reply::Capture(r) => {
            let ended = match r.ended {
                CaptureEnd::Count => "count reached",
                CaptureEnd::Time => "time up",
                CaptureEnd::PortGone => "port deleted",
            };
            let _ = writeln!(
                out,
                "{} frames of {} written to {} ({ended}); {} not captured (the file was written too slowly)",
                r.frames,
                r.port,
                r.file.display(),
                r.dropped
            );
        }
    }
    out
}

/// Whether a reply reports a failure (a `doctor` check that failed, a path that
/// does not carry the underlay MTU): `xdeadm` then exits 1 after printing it.
pub fn reply_fails(reply: &Reply) -> bool {
    match reply {
        Reply::Doctor(checks) => checks.iter().any(|c| c.status == CheckStatus::Fail),
        Reply::PathCheck(paths) => paths.iter().any(|p| !p.ok()),
        _ => false,
    }
}

/// One line per check, `pass`/`warn`/`FAIL` first, and the fix under each
/// warning or failure.
fn render_checks(out: &mut String, checks: &[Check]) {
    for c in checks {
        let _ = writeln!(out, "{:<4}  {:<28}  {}", c.status, c.name, c.detail);
        if let Some(fix) = &c.fix {
            let _ = writeln!(out, "      fix: {fix}");
        }
    }
}

/// One row per peer: the largest size that made the round trip, and whether
/// that is the underlay MTU.
fn render_paths(out: &mut String, paths: &[PeerPath]) {
    let rows = paths
        .iter()
        .map(|p| {
            vec![
                p.peer.to_string(),
                p.wanted.to_string(),
                p.largest.map_or("none".into(), |l| l.to_string()),
                p.probes.to_string(),
                match (&p.error, p.ok()) {
                    (Some(e), _) => format!("ERROR: {e}"),
                    (None, true) => "ok".into(),
                    (None, false) if p.largest.is_none() => "FAIL: no probe answered".into(),
                    (None, false) => {
                        "FAIL: full-size frames are lost on the way (a smaller MTU on a link or switch port)".into()
                    }
                },
            ]
        })
        .collect();
    table(
        out,
        &["PEER", "WANTED", "LARGEST", "PROBES", "STATUS"],
        rows,
    );
}

/// Prints a reply as `show` says (`json`: the global `--json`).
pub fn render_as(show: Show, reply: &Reply, json: bool) -> Result<String, String> {
    let to_json = |v: &Reply| {
        serde_json::to_string_pretty(v)
            .map(|s| s + "\n")
            .map_err(|e| format!("cannot print JSON: {e}"))
    };
    match (show, reply) {
        (Show::OpenMetrics, Reply::Inspect(v)) => crate::metrics::render(v),
        (Show::Workers, Reply::Inspect(v)) if !json => {
            let rows = crate::stats::worker_rows(v, SystemTime::now());
            let mut out = String::new();
            let head = [
                "WORKER",
                "CORE",
                "PORTS",
                "QUEUES",
                "ROUNDS",
                "BUSY",
                "IDLE SLEEPS",
                "HANDOFF IN",
                "HANDOFF OUT",
                "UP FOR",
            ];
            table(&mut out, &head, rows);
            Ok(out)
        }
        (Show::Workers | Show::Json, r) => to_json(r),
        (Show::OpenMetrics, other) => Err(format!("not a stats reply: {other:?}")),
    }
}

/// One row per port; a port the daemon could not put into the dataplane says why
/// and when it is tried again.
fn render_ports(out: &mut String, ports: &[PortStatus]) {
    let rows = ports
        .iter()
        .map(|s| {
            let p = &s.port;
            let c = &p.config;
            let ips: Vec<String> = c
                .ipv4
                .map(|a| a.to_string())
                .into_iter()
                .chain(c.ipv6.map(|a| a.to_string()))
                .collect();
            vec![
                c.name.clone(),
                c.guest_mac.to_string(),
                ips.join(","),
                c.vni.to_string(),
                c.mtu.to_string(),
                c.external.to_string(),
                c.limits.describe(),
                p.netns.clone().unwrap_or_else(|| "-".into()),
                p.attach.clone().unwrap_or_else(|| "-".into()),
                s.state.map_or("-".into(), |st| st.to_string()),
                match &s.not_applied {
                    None => link_status(s.link.as_ref(), SystemTime::now()),
                    Some(n) => format!(
                        "NOT APPLIED (try {}, next in {} s): {}",
                        n.attempts,
                        n.retry_in_ms.div_ceil(1000),
                        n.reason
                    ),
                },
            ]
        })
        .collect();
    table(
        out,
        &[
            "NAME", "MAC", "IP", "VNI", "MTU", "EXTERNAL", "LIMITS", "NETNS", "ATTACH", "STATE",
            "STATUS",
        ],
        rows,
    );
}

/// A port in the dataplane: whether its tap is served, and since when not.
fn link_status(link: Option<&PortLink>, now: SystemTime) -> String {
    match link {
        None => "applied".into(),
        Some(PortLink::Up) => "up".into(),
        Some(PortLink::Down {
            since_unix_ms,
            reason,
        }) => {
            let now_ms = now
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
            let secs = now_ms.saturating_sub(*since_unix_ms) / 1000;
            format!("DOWN for {secs} s (re-attached when the tap is back): {reason}")
        }
    }
}

fn table(out: &mut String, head: &[&str], rows: Vec<Vec<String>>) {
    let mut width: Vec<usize> = head.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.len());
        }
    }
    let line = |out: &mut String, cells: &mut dyn Iterator<Item = &str>| {
        let mut s = String::new();
        for (c, w) in cells.zip(&width) {
            let _ = write!(s, "{c:<w$}  ");
        }
        let _ = writeln!(out, "{}", s.trim_end());
    };
    line(out, &mut head.iter().copied());
    for r in &rows {
        line(out, &mut r.iter().map(String::as_str));
    }
}

/// Prints nested objects as indented `key: value` lines and arrays of objects as
/// numbered entries, so any engine result is readable without a per-type printer.
fn render_value(out: &mut String, v: &serde_json::Value, depth: usize) {
    let pad = "  ".repeat(depth);
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                if v.is_object()
                    || v.as_array()
                        .is_some_and(|a| a.iter().any(|x| !x.is_string() && !x.is_number()))
                {
                    let _ = writeln!(out, "{pad}{k}:");
                    render_value(out, v, depth + 1);
                } else {
                    let _ = writeln!(out, "{pad}{k}: {}", scalar(v));
                }
            }
        }
        serde_json::Value::Array(a) => {
            for (i, v) in a.iter().enumerate() {
                if v.is_object() || v.is_array() {
                    let _ = writeln!(out, "{pad}[{i}]");
                    render_value(out, v, depth + 1);
                } else {
                    let _ = writeln!(out, "{pad}{}", scalar(v));
                }
            }
        }
        other => {
            let _ = writeln!(out, "{pad}{}", scalar(other));
        }
    }
}

fn scalar(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "-".into(),
        serde_json::Value::Array(a) => a.iter().map(scalar).collect::<Vec<_>>().join(", "),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::RouteTarget;

    fn parse(args: &[&str]) -> Result<Action, String> {
        let cli = Cli::parse_line(std::iter::once("xdeadm").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        cli.command.action()
    }

    const CREATE: &[&str] = &[
        "create-xde",
        "opte0",
        "--guest-mac",
        "a8:40:25:ff:00:01",
        "--private-ip",
        "172.30.0.5",
        "--private-ip",
        "fd00:1122:3344:100::5",
        "--vpc-subnet",
        "172.30.0.0/22",
        "--vpc-subnet",
        "fd00:1122:3344:100::/64",
        "--gateway-mac",
        "a8:40:25:00:00:01",
        "--gateway-ip",
        "172.30.0.1",
        "--vpc-vni",
        "1701",
    ];

    fn with(extra: &[&'static str]) -> Vec<&'static str> {
        CREATE.iter().chain(extra).copied().collect()
    }

    #[test]
    fn create_xde_builds_the_port() {
        let a = parse(&with(&[
            "--mtu",
            "8500",
            "--netns",
            "g0",
            "--dns-server",
            "1.1.1.1",
        ]))
        .unwrap();
        let Action::Call(Request::CreatePort(c)) = a else {
            panic!("{a:?}")
        };
        assert_eq!(c.netns.as_deref(), Some("g0"));
        let p = c.config;
        assert_eq!(p.mtu, 8500);
        assert_eq!(p.ipv4.unwrap().to_string(), "172.30.0.5");
        assert_eq!(p.ipv6.unwrap().to_string(), "fd00:1122:3344:100::5");
        assert_eq!(p.vni.get(), 1701);
        assert_eq!(p.dns_servers4.len(), 1);
        let Action::Call(Request::CreatePort(c)) = parse(CREATE).unwrap() else {
            panic!()
        };
        assert_eq!(c.config.mtu, DEFAULT_PORT_MTU);
        assert_eq!(c.attach, None);
    }

    /// `--attach IFACE` names the interface; with `--netns` it is refused, naming
    /// both.
    #[test]
    fn create_xde_attaches_to_an_interface_but_not_with_a_netns() {
        let Action::Call(Request::CreatePort(c)) = parse(&with(&["--attach", "vnet3"])).unwrap()
        else {
            panic!()
        };
        assert_eq!((c.attach.as_deref(), c.netns), (Some("vnet3"), None));
        let e = parse(&with(&["--attach", "vnet3", "--netns", "g0"])).unwrap_err();
        assert!(e.contains("--attach") && e.contains("--netns"), "{e}");
    }

    #[test]
    fn bad_values_are_named() {
        let mut bad_mac = CREATE.to_vec();
        bad_mac[3] = "zz:40:25:ff:00:01";
        let e = parse(&bad_mac).unwrap_err();
        assert!(
            e.contains("invalid MAC address \"zz:40:25:ff:00:01\""),
            "{e}"
        );
        let e = parse(&with(&["--mtu", "100"])).unwrap_err();
        assert!(e.contains("MTU 100 is below 1280"), "{e}");
        let e = parse(&with(&["--private-ip", "172.30.0.6"])).unwrap_err();
        assert!(e.contains("172.30.0.5, 172.30.0.6"), "{e}");
        let mut big_vni = CREATE.to_vec();
        *big_vni.last_mut().unwrap() = "16777216";
        let e = parse(&big_vni).unwrap_err();
        assert!(e.contains("16777216"), "{e}");
        let e = parse(&["set-v2p", "10.0.0.1", "a8:40:25:ff:00:01", "10.0.0.2", "5"]).unwrap_err();
        assert!(e.contains("10.0.0.2"), "{e}");
        let e = parse(&["add-router-entry", "p", "10.0.0.0/33", "subnet"]).unwrap_err();
        assert!(e.contains("10.0.0.0/33"), "{e}");
        let e = parse(&["add-router-entry", "p", "10.0.0.0/8", "router"]).unwrap_err();
        assert!(e.contains("router"), "{e}");
        let e = parse(&["ra"]).unwrap_err();
        assert!(e.contains("PORT"), "{e}");
    }

    #[test]
    fn verbs_map_to_requests() {
        assert_eq!(
            parse(&[
                "set-v2p",
                "172.30.0.6",
                "a8:40:25:ff:00:06",
                "fd00:99::2",
                "1701"
            ])
            .unwrap(),
            Action::Call(Request::SetV2p(V2pEntry {
                vpc_ip: "172.30.0.6".parse().unwrap(),
                vpc_mac: "a8:40:25:ff:00:06".parse().unwrap(),
                underlay_ip: "fd00:99::2".parse().unwrap(),
                vni: Vni::new(1701).unwrap(),
            }))
        );
        assert_eq!(
            parse(&["add-router-entry", "p", "0.0.0.0/0", "igw", "--mtu", "1500"]).unwrap(),
            Action::Call(Request::AddRouterEntry {
                port: "p".into(),
                entry: RouteEntry {
                    class: Default::default(),
                    dest: "0.0.0.0/0".parse().unwrap(),
                    target: RouteTarget::Igw,
                    mtu: Some(1500)
                }
            })
        );
        assert_eq!(
            parse(&["--json", "stats"]).unwrap(),
            Action::Call(Request::Stats { port: None })
        );
        assert_eq!(
            parse(&["stats", "--format", "openmetrics"]).unwrap(),
            Action::Show(Request::Stats { port: None }, Show::OpenMetrics)
        );
        let e = parse(&["stats", "p1", "--format", "openmetrics"]).unwrap_err();
        assert!(e.contains("\"p1\""), "{e}");
        assert_eq!(
            parse(&["workers"]).unwrap(),
            Action::Show(Request::Workers, Show::Workers)
        );
        assert_eq!(
            parse(&["ra", "opte0"]).unwrap(),
            Action::Call(Request::Ra {
                port: "opte0".into()
            })
        );
        assert_eq!(
            parse(&["ra", "listen", "eth0", "--timeout", "2"]).unwrap(),
            Action::RaListen {
                iface: "eth0".into(),
                timeout_s: 2
            }
        );
        let a = parse(&[
            "add-fw-rule",
            "p",
            "--direction",
            "in",
            "--priority",
            "10",
            "--proto",
            "tcp",
            "--ports",
            "22,443",
        ])
        .unwrap();
        let Action::Call(Request::AddFwRule { rule, .. }) = a else {
            panic!("{a:?}")
        };
        assert_eq!(rule.filters.ports, [FwPorts::One(22), FwPorts::One(443)]);
        assert_eq!(rule.action, FwAction::Allow);
        let e = parse(&[
            "add-fw-rule",
            "p",
            "--direction",
            "in",
            "--priority",
            "10",
            "--proto",
            "icmp",
            "--ports",
            "22",
        ])
        .unwrap_err();
        assert!(e.contains("22"), "{e}");
    }

    /// opteadm's command lines, as its usage writes them, build the requests
    /// xdeadm's own forms do; what the engine cannot do is refused by name.
    #[test]
    fn external_addresses_from_opteadm_flags() {
        let a = parse(&with(&[
            "--snat-ip",
            "198.51.100.1",
            "--snat-start",
            "1024",
            "--snat-end",
            "2047",
            "--ephemeral-ip",
            "198.51.100.7",
            "--floating-ip",
            "192.0.2.5",
            "--floating-ip",
            "2001:db8:f::5",
        ]))
        .unwrap();
        let Action::Call(Request::CreatePort(c)) = a else {
            panic!("{a:?}")
        };
        let ext = c.config.external;
        assert_eq!(
            ext.to_string(),
            "snat 198.51.100.1:1024-2047, ephemeral 198.51.100.7, floating 192.0.2.5, floating 2001:db8:f::5"
        );
        // list-ports shows them.
        let mut config = crate::api::tests::sample_port("opte0", 5);
        config.external = ext;
        let listed = render(&Reply::Ports(vec![PortStatus {
            port: crate::api::PortInfo {
                config,
                netns: None,
                vhost_user: None,
                attach: None,
            },
            not_applied: None,
            link: None,
            state: None,
        }]));
        assert!(
            listed.lines().next().unwrap().contains("EXTERNAL"),
            "{listed}"
        );
        assert!(listed.contains("snat 198.51.100.1:1024-2047"), "{listed}");
        // The same flags change them live; opteadm's -p form too.
        for line in [
            "set-external-ips opte0 --ephemeral-ip 198.51.100.8",
            "set-external-ips -p opte0 --ephemeral-ip 198.51.100.8",
        ] {
            let a = parse(&line.split_whitespace().collect::<Vec<_>>()).unwrap();
            let Action::Call(Request::SetExternalIps { port, external }) = a else {
                panic!("{a:?}")
            };
            assert_eq!(port, "opte0");
            assert_eq!(external.ephemeral, Some("198.51.100.8".parse().unwrap()));
            assert_eq!((external.snat, external.floating.len()), (None, 0));
        }
        // Rate limits: set-port-limits (also opteadm's -p form) and create-xde.
        for line in [
            "set-port-limits opte0 --egress-mbps 100 --burst-kib 512 --pps 5000",
            "set-port-limits -p opte0 --egress-mbps 100 --burst-kib 512 --pps 5000",
        ] {
            let a = parse(&line.split_whitespace().collect::<Vec<_>>()).unwrap();
            let Action::Call(Request::SetPortLimits { port, limits }) = a else {
                panic!("{a:?}")
            };
            assert_eq!(port, "opte0");
            assert_eq!(
                (
                    limits.egress_mbps,
                    limits.ingress_mbps,
                    limits.burst_kib,
                    limits.pps
                ),
                (Some(100), None, Some(512), Some(5000))
            );
            assert_eq!(
                limits.describe(),
                "egress 100 Mbit/s, burst 512 KiB, 5000 pps"
            );
        }
        // Bad values are named.
        let bad = [
            (vec!["--snat-ip", "198.51.100.1"], "198.51.100.1"),
            (
                vec![
                    "--snat-ip",
                    "198.51.100.1",
                    "--snat-start",
                    "80",
                    "--snat-end",
                    "90",
                ],
                "80",
            ),
            (
                vec![
                    "--snat-ip",
                    "198.51.100.1",
                    "--snat-start",
                    "5000",
                    "--snat-end",
                    "4000",
                ],
                "5000-4000",
            ),
            (vec!["--ephemeral-ip", "nonsense"], "nonsense"),
        ];
        for (flags, named) in bad {
            let e = parse(&with(&flags)).unwrap_err();
            assert!(e.contains(named), "{e}");
        }
        // An address of a family the port has none of.
        let v4_only_line = [
            "create-xde",
            "opte0",
            "--guest-mac",
            "a8:40:25:ff:00:01",
            "--private-ip",
            "172.30.0.5",
            "--vpc-subnet",
            "172.30.0.0/22",
            "--gateway-mac",
            "a8:40:25:00:00:01",
            "--gateway-ip",
            "172.30.0.1",
            "--vpc-vni",
            "1701",
            "--floating-ip",
            "2001:db8:f::5",
        ];
        let e = parse(&v4_only_line).unwrap_err();
        assert!(e.contains("2001:db8:f::5"), "{e}");
    }

    #[test]
    fn opteadm_lines_parse() {
        let call = |line: &str| match parse(&line.split_whitespace().collect::<Vec<_>>()) {
            Ok(Action::Call(r)) => r,
            other => panic!("{line}: {other:?}"),
        };
        let port = || "opte0".to_string();
        assert_eq!(
            call("list-layers -p opte0"),
            Request::ListLayers { port: port() }
        );
        assert_eq!(
            call("dump-layer -p opte0 firewall"),
            Request::DumpLayer {
                port: port(),
                layer: "firewall".into()
            }
        );
        assert_eq!(
            call("dump-uft -p opte0"),
            Request::DumpUft {
                port: port(),
                cursor: None,
                limit: None
            }
        );
        assert_eq!(
            call("clear-uft -p opte0"),
            Request::ClearUft { port: port() }
        );
        assert_eq!(
            call("dump-tcp-flows -p opte0"),
            Request::DumpTcpFlows { port: port() }
        );
        assert_eq!(
            call("dump-tcp-flows opte0"),
            Request::DumpTcpFlows { port: port() }
        );
        assert_eq!(
            call("add-router-entry -p opte0 10.0.0.0/24 sub4=10.0.0.0/24 system"),
            Request::AddRouterEntry {
                port: port(),
                entry: RouteEntry {
                    class: Default::default(),
                    dest: "10.0.0.0/24".parse().unwrap(),
                    target: RouteTarget::Subnet,
                    mtu: None
                }
            }
        );
        assert_eq!(
            call("add-router-entry -p opte0 0.0.0.0/0 ig system"),
            call("add-router-entry opte0 0.0.0.0/0 igw")
        );
        assert_eq!(
            call("del-router-entry -p opte0 fd00::/64 sub6=fd00::/64 system"),
            Request::DelRouterEntry {
                class: Default::default(),
                port: port(),
                dest: "fd00::/64".parse().unwrap()
            }
        );
        assert_eq!(
            call("add-fw-rule -p opte0 --dir in --hosts subnet=10.0.0.0/8 --protocol TCP --ports 22 --action allow --priority 10"),
            Request::AddFwRule {
                port: port(),
                rule: FwRule {
                    id: 0,
                    direction: Direction::In,
                    priority: 10,
                    action: FwAction::Allow,
                    filters: FwFilters {
                        host: FwHost::Subnet("10.0.0.0/8".parse().unwrap()),
                        proto: FwProto::Tcp,
                        ports: vec![FwPorts::One(22)],
                        icmp: None,
                    }
                }
            }
        );
        let Request::AddFwRule { rule, .. } = call(
            "add-fw-rule -p opte0 --dir out --hosts any --protocol any --ports any --action deny --priority 65000",
        ) else {
            panic!()
        };
        assert_eq!(rule.to_string(), "out prio=65000 deny host=any proto=any");
        assert_eq!(
            call("rm-fw-rule -p opte0 --dir in 3"),
            Request::RmFwRuleId {
                port: port(),
                direction: Some(Direction::In),
                id: 3
            }
        );
        // opteadm's VPC hosts, ICMP types, protocol numbers and port ranges.
        let Request::AddFwRule { rule, .. } = call(
            "add-fw-rule -p opte0 --direction in --priority 5 --action deny --hosts vni=10 --protocol icmp6:128",
        ) else {
            panic!()
        };
        assert_eq!(
            rule.to_string(),
            "in prio=5 deny host=vni=10 proto=icmp6:128"
        );
        let Request::AddFwRule { rule, .. } =
            call("add-fw-rule -p opte0 --direction in --priority 6 --protocol icmp:3/4")
        else {
            panic!()
        };
        assert_eq!(rule.to_string(), "in prio=6 allow host=any proto=icmp:3/4");
        let Request::AddFwRule { rule, .. } =
            call("add-fw-rule -p opte0 --direction out --priority 7 --protocol proto=47")
        else {
            panic!()
        };
        assert_eq!(rule.filters.proto, FwProto::Number(47));
        let Request::AddFwRule { rule, .. } = call(
            "add-fw-rule -p opte0 --direction in --priority 8 --protocol udp --ports 53,5000-5010",
        ) else {
            panic!()
        };
        assert_eq!(
            rule.to_string(),
            "in prio=8 allow host=any proto=udp ports=53,5000-5010"
        );
        assert_eq!(
            call("remove-fw-rule -p opte0 12"),
            Request::RmFwRuleId {
                port: port(),
                direction: None,
                id: 12
            }
        );
        assert_eq!(
            call("remove-fw-rule opte0 12"),
            call("remove-fw-rule -p opte0 12")
        );
        assert_eq!(
            call("list-fw-rules -p opte0"),
            Request::ListFwRules { port: port() }
        );
        assert_eq!(
            call("pause-port -p opte0"),
            Request::PausePort { port: port() }
        );
        assert_eq!(
            call("resume-port opte0"),
            Request::ResumePort { port: port() }
        );
        for (bad, named) in [
            (
                "add-fw-rule -p opte0 --direction in --priority 1 --hosts vni=16777216",
                "vni=16777216",
            ),
            (
                "add-fw-rule -p opte0 --direction in --priority 1 --protocol proto=300",
                "300",
            ),
            (
                "add-fw-rule -p opte0 --direction in --priority 1 --protocol icmp:8/256",
                "256",
            ),
            (
                "add-fw-rule -p opte0 --direction in --priority 1 --protocol tcp --ports 90-80",
                "90-80",
            ),
            (
                "add-fw-rule -p opte0 --direction in --priority 1 --protocol tcp:1",
                "tcp:1",
            ),
            (
                "add-fw-rule -p opte0 --direction in --priority 1 --protocol udp:1",
                "udp:1",
            ),
            ("remove-fw-rule -p opte0 x", "x"),
        ] {
            let words: Vec<&str> = bad.split_whitespace().collect();
            let e = parse(&words).unwrap_err();
            assert!(e.contains(named), "{bad}: {e}");
        }
        let eps = |a: &[&str]| a.iter().map(|e| e.parse().unwrap()).collect::<Vec<_>>();
        assert_eq!(
            call("set-v2b 0.0.0.0/0 fd00:99::b1 fd00:99::b2"),
            Request::SetV2b {
                prefix: "0.0.0.0/0".parse().unwrap(),
                endpoints: eps(&["fd00:99::b1", "fd00:99::b2"]),
            }
        );
        assert_eq!(
            call("clear-v2b ::/0 fd00:99::b1"),
            Request::ClearV2b {
                prefix: "::/0".parse().unwrap(),
                endpoints: eps(&["fd00:99::b1"]),
            }
        );
        assert_eq!(call("dump-v2b"), Request::DumpV2b);
        let e = parse(&["set-v2b", "0.0.0.0/0"]).unwrap_err();
        assert!(e.contains("ENDPOINTS"), "{e}");
        let e = parse(&["set-v2b", "0.0.0.0/0", "10.0.0.1"]).unwrap_err();
        assert!(e.contains("10.0.0.1"), "{e}");
        let shown = render(&Reply::V2b(vec![engine::V2bEntry {
            prefix: "0.0.0.0/0".parse().unwrap(),
            endpoints: eps(&["fd00:99::b1", "fd00:99::b2"]),
        }]));
        assert!(
            shown.contains("0.0.0.0/0") && shown.contains("fd00:99::b1,fd00:99::b2"),
            "{shown}"
        );
        assert_eq!(
            call("clear-v2p 172.30.0.6 a8:40:25:ff:00:06 fd00:99::2 1701"),
            Request::ClearV2p {
                vpc_ip: "172.30.0.6".parse().unwrap(),
                vni: Vni::new(1701).unwrap(),
                expect: Some(V2pTarget {
                    vpc_mac: "a8:40:25:ff:00:06".parse().unwrap(),
                    underlay_ip: "fd00:99::2".parse().unwrap()
                })
            }
        );
        assert_eq!(
            call("clear-v2p 172.30.0.6 1701"),
            Request::ClearV2p {
                vpc_ip: "172.30.0.6".parse().unwrap(),
                vni: Vni::new(1701).unwrap(),
                expect: None
            }
        );
        // Refused by name.
        for (line, named) in [
            ("add-router-entry -p opte0 fd00::/64 ip4=10.0.0.1 system", "ip4=10.0.0.1"),
            ("add-router-entry -p opte0 10.0.0.0/24 sub4=10.0.0.0/24 user", "user"),
            ("add-router-entry -p opte0 10.0.0.0/24 drop custom --class system", "given twice"),
            ("add-fw-rule -p opte0 --dir in --hosts vni=x --protocol any --ports any --action allow --priority 1", "vni=x"),
            ("add-fw-rule -p opte0 --dir in --hosts any --protocol arp --ports any --action allow --priority 1", "arp"),
            ("add-fw-rule -p opte0 --dir in --hosts any --protocol icmp:8 --ports 80 --action allow --priority 1", "has no ports"),
            ("add-fw-rule -p opte0 --dir in --hosts any --protocol tcp --ports 22,x --action allow --priority 1", "\"x\""),
            ("add-fw-rule -p opte0 --dir in --hosts any --protocol tcp --ports 22 --action allow", "--priority"),
            ("rm-fw-rule -p opte0 --dir in 3 --priority 4", "not both"),
            ("clear-v2p 172.30.0.6 zz:40:25:ff:00:06 fd00:99::2 1701", "zz:40:25:ff:00:06"),
            ("clear-v2p 172.30.0.6 a8:40:25:ff:00:06 1701", "3 words"),
        ] {
            let e = parse(&line.split_whitespace().collect::<Vec<_>>()).unwrap_err();
            assert!(e.contains(named), "{line}: {e}");
        }
        for (line, class) in [
            (
                "add-router-entry -p opte0 10.0.0.0/24 drop Custom",
                RouteClass::Custom,
            ),
            (
                "add-router-entry opte0 10.0.0.0/24 drop --class custom",
                RouteClass::Custom,
            ),
            (
                "add-router-entry opte0 10.0.0.0/24 drop",
                RouteClass::System,
            ),
        ] {
            let Action::Call(Request::AddRouterEntry { entry, .. }) =
                parse(&line.split_whitespace().collect::<Vec<_>>()).unwrap()
            else {
                panic!("{line}")
            };
            assert_eq!(entry.class, class, "{line}");
        }
        assert_eq!(
            parse(&[
                "del-router-entry",
                "-p",
                "opte0",
                "10.0.0.0/24",
                "drop",
                "custom"
            ])
            .unwrap(),
            Action::Call(Request::DelRouterEntry {
                port: "opte0".into(),
                dest: "10.0.0.0/24".parse().unwrap(),
                class: RouteClass::Custom,
            })
        );
        let line = "add-router-entry -p opte0 192.168.50.0/24 ip4=10.0.0.5 system";
        assert_eq!(
            parse(&line.split_whitespace().collect::<Vec<_>>()).unwrap(),
            Action::Call(Request::AddRouterEntry {
                port: "opte0".into(),
                entry: RouteEntry {
                    class: Default::default(),
                    dest: "192.168.50.0/24".parse().unwrap(),
                    target: RouteTarget::Ip("10.0.0.5".parse().unwrap()),
                    mtu: None,
                },
            })
        );
    }

    #[test]
    fn allowed_prefixes_and_attached_subnets() {
        let call = |line: &str| parse(&line.split_whitespace().collect::<Vec<_>>());
        let want = |prefix: &str, dir| Request::AllowCidr {
            port: "opte0".into(),
            prefix: prefix.parse().unwrap(),
            dir,
        };
        assert_eq!(
            call("allow-cidr -p opte0 192.168.50.0/24 --dir IN").unwrap(),
            Action::Call(want("192.168.50.0/24", CidrDir::In))
        );
        assert_eq!(
            call("allow-cidr opte0 fd00:50::/64 --dir out").unwrap(),
            Action::Call(want("fd00:50::/64", CidrDir::Out))
        );
        assert_eq!(
            call("attach-subnet -p opte0 192.168.50.0/24").unwrap(),
            Action::Call(want("192.168.50.0/24", CidrDir::Both))
        );
        assert_eq!(
            call("detach-subnet opte0 192.168.50.0/24").unwrap(),
            Action::Call(Request::RemoveCidr {
                port: "opte0".into(),
                prefix: "192.168.50.0/24".parse().unwrap(),
                dir: CidrDir::Both,
            })
        );
        for (line, named) in [
            ("allow-cidr opte0 192.168.50.0/24 --dir both", "both"),
            ("remove-cidr opte0 192.168.50.0/24 --dir up", "up"),
            (
                "allow-cidr opte0 192.168.50.0/33 --dir in",
                "192.168.50.0/33",
            ),
        ] {
            let e = call(line).unwrap_err();
            assert!(e.contains(named), "{line}: {e}");
        }
    }

    #[test]
    fn doctor_and_path_check() {
        assert_eq!(parse(&["doctor"]).unwrap(), Action::Call(Request::Doctor));
        assert_eq!(
            parse(&["path-check"]).unwrap(),
            Action::Call(Request::PathCheck { peer: None })
        );
        assert_eq!(
            parse(&["--json", "path-check", "fd00:99::3"]).unwrap(),
            Action::Call(Request::PathCheck {
                peer: Some("fd00:99::3".parse().unwrap())
            })
        );
        let e = parse(&["path-check", "10.0.0.1"]).unwrap_err();
        assert!(e.contains("10.0.0.1"), "{e}");
    }

    #[test]
    fn checks_and_paths_render_with_their_fixes() {
        let checks = vec![
            Check {
                name: "xdp-mode".into(),
                status: CheckStatus::Pass,
                detail: "native".into(),
                fix: None,
            },
            Check {
                name: "underlay-mtu".into(),
                status: CheckStatus::Fail,
                detail: "underlay MTU 1500".into(),
                fix: Some("ip link set ul0 mtu 9000".into()),
            },
        ];
        let s = render(&Reply::Doctor(checks.clone()));
        assert_eq!(
            s,
            "pass  xdp-mode                      native\n\
             FAIL  underlay-mtu                  underlay MTU 1500\n\
             \x20     fix: ip link set ul0 mtu 9000\n"
        );
        assert!(reply_fails(&Reply::Doctor(checks.clone())));
        assert!(!reply_fails(&Reply::Doctor(checks[..1].to_vec())));
        let path = |largest| PeerPath {
            peer: "fd00:99::2".parse().unwrap(),
            wanted: 9000,
            largest,
            probes: 3,
            error: None,
        };
        let s = render(&Reply::PathCheck(vec![path(Some(9000)), path(Some(1500))]));
        assert!(s.lines().nth(1).unwrap().ends_with("ok"), "{s}");
        assert!(s.lines().nth(2).unwrap().contains("1500"), "{s}");
        assert!(reply_fails(&Reply::PathCheck(vec![path(Some(1500))])));
        assert!(!reply_fails(&Reply::PathCheck(vec![path(Some(9000))])));
        assert!(!reply_fails(&Reply::Done));
    }

    #[test]
    fn capture_to_a_file_or_standard_output() {
        let a = parse(&["capture", "a1", "-w", "/run/x.pcapng", "-c", "5"]).unwrap();
        let want = CaptureSpec {
            port: "a1".into(),
            underlay: false,
            count: Some(5),
            seconds: None,
            file: "/run/x.pcapng".into(),
        };
        assert_eq!(a, Action::Call(Request::Capture(want)));
        // A relative file is made absolute here: the daemon has its own directory.
        let Action::Call(Request::Capture(c)) =
            parse(&["capture", "a1", "-w", "x.pcapng"]).unwrap()
        else {
            panic!("not a capture request");
        };
        assert!(
            c.file.is_absolute() && c.file.ends_with("x.pcapng"),
            "{c:?}"
        );
        let Action::CaptureToStdout(c) =
            parse(&["capture", "a1", "--underlay", "--seconds", "3"]).unwrap()
        else {
            panic!("not a capture to standard output");
        };
        assert_eq!((c.underlay, c.seconds, c.count), (true, Some(3), None));
        let e = parse(&["capture", "a1", "-c", "many"]).unwrap_err();
        assert!(e.contains("many"), "{e}");
    }

    #[test]
    fn dump_uft_pages() {
        assert_eq!(
            parse(&["dump-uft", "p"]).unwrap(),
            Action::Call(Request::DumpUft {
                port: "p".into(),
                cursor: None,
                limit: None
            })
        );
        assert_eq!(
            parse(&["dump-uft", "p", "--limit", "50", "--cursor", "4294967300"]).unwrap(),
            Action::Call(Request::DumpUft {
                port: "p".into(),
                cursor: Some(4_294_967_300),
                limit: Some(50)
            })
        );
        let e = parse(&["dump-uft", "p", "--cursor", "-1"]).unwrap_err();
        assert!(e.contains("-1"), "{e}");
    }

    #[test]
    fn rule_strings() {
        let r =
            parse_rule("direction=out priority=5 action=deny host=10.0.0.0/8 proto=udp ports=53")
                .unwrap();
        assert_eq!(
            r.to_string(),
            "out prio=5 deny host=10.0.0.0/8 proto=udp ports=53"
        );
        assert!(parse_rule("priority=5").unwrap_err().contains("direction"));
        assert!(parse_rule("dir=in prio=5 colour=red")
            .unwrap_err()
            .contains("colour"));
        assert!(parse_rule("dir=in prio=x").unwrap_err().contains("\"x\""));
    }

    #[test]
    fn renders_tables_and_values() {
        let s = render(&Reply::Routes(vec![RouteEntry {
            class: Default::default(),
            dest: "0.0.0.0/0".parse().unwrap(),
            target: RouteTarget::Igw,
            mtu: None,
        }]));
        assert_eq!(
            s,
            "DEST       TARGET  CLASS   MTU\n0.0.0.0/0  igw     system  -\n"
        );
        let s = render(&Reply::Inspect(serde_json::json!({
            "port": "opte0",
            "drops": {"bad_vni": 2},
            "warnings": ["a", "b"],
        })));
        assert_eq!(s, "drops:\n  bad_vni: 2\nport: opte0\nwarnings: a, b\n");
    }

    /// A port that is not applied says so on its own line, with the reason.
    #[test]
    fn renders_ports_with_their_status() {
        let port = |name: &str, last: u8, netns: Option<&str>| crate::api::PortInfo {
            config: crate::api::tests::sample_port(name, last),
            netns: netns.map(Into::into),
            vhost_user: None,
            attach: None,
        };
        let attached = crate::api::PortInfo {
            attach: Some("vnet7".into()),
            ..port("opte2", 7, None)
        };
        let s = render(&Reply::Ports(vec![
            PortStatus {
                port: port("opte0", 5, None),
                not_applied: None,
                link: None,
                state: Some(engine::PortState::Paused),
            },
            PortStatus {
                port: port("opte1", 6, Some("g1")),
                not_applied: Some(crate::api::NotApplied {
                    reason: "network namespace \"g1\" not found".into(),
                    attempts: 2,
                    retry_in_ms: 1500,
                }),
                link: None,
                state: None,
            },
            PortStatus {
                port: attached,
                not_applied: None,
                link: Some(PortLink::Up),
                state: Some(engine::PortState::Running),
            },
        ]));
        let lines: Vec<&str> = s.lines().collect();
        assert!(lines[0].ends_with("NETNS  ATTACH  STATE    STATUS"), "{s}");
        assert!(
            lines[1].starts_with("opte0") && lines[1].ends_with("-      -       paused   applied"),
            "{s}"
        );
        assert!(
            lines[2].starts_with("opte1")
                && lines[2].ends_with(
                    "g1     -       -        NOT APPLIED (try 2, next in 2 s): network namespace \"g1\" not found"
                ),
            "{s}"
        );
        assert!(
            lines[3].starts_with("opte2") && lines[3].ends_with("-      vnet7   running  up"),
            "{s}"
        );
    }

    /// A port whose tap is gone says so, since when and why; a served one is up.
    #[test]
    fn link_status_says_down_since_when_and_why() {
        let at = UNIX_EPOCH + std::time::Duration::from_secs(1_000);
        let down = PortLink::Down {
            since_unix_ms: 958_500,
            reason: "read: File descriptor in bad state".into(),
        };
        assert_eq!(
            link_status(Some(&down), at),
            "DOWN for 41 s (re-attached when the tap is back): read: File descriptor in bad state"
        );
        assert_eq!(link_status(Some(&PortLink::Up), at), "up");
        assert_eq!(link_status(None, at), "applied", "a daemon without taps");
    }
}
