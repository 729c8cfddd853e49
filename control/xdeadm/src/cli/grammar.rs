//! The words `xdeadm` takes: its verbs and their arguments as clap parses them
//! ([`Cli`], [`Command`] and the argument groups), and the value parsers that
//! refuse a bad value by name before anything else runs. What a parsed command
//! asks of the daemon is the job of `requests`.

use crate::opteadm;
use api::fleet::SledId;
use api::port::{CidrDirError, DEFAULT_PORT_MTU, MIN_PORT_MTU};
use api::protocol::DEFAULT_API_SOCKET;
use api::{
    CidrDir, Direction, FwAction, FwHost, FwPorts, FwProtoSpec, FwRule, FwSyntaxError, Uuid, Vni,
};
use clap::{Args, Parser, Subcommand};
use ipnet::IpNet;
use std::net::{IpAddr, Ipv6Addr};
use std::path::PathBuf;
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
                  remove-cidr, attach-subnet, detach-subnet, clear-lft); create-xde takes \
                  opteadm's flags (--private-mac, --dns-servers, --host-domain, \
                  --domain-search-list, and --src-underlay-addr, --bsvc-addr, --bsvc-vni, \
                  which the daemon checks against its own)."
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

/// Where a port's guest is: a tap of the port's own (in the daemon's namespace or
/// moved into another), a hypervisor's interface, or a VM over vhost-user.
#[derive(Debug, Args)]
pub struct GuestArgs {
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
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create a guest port (a tap device) and its gateway.
    CreateXde(Box<CreateXde>),
    /// Delete a port and its routes and firewall rules.
    DeleteXde {
        name: String,
        /// The port's guest moved to the sled of this underlay address: frames
        /// still sent here for it are relayed there for 10 s (docs/operating.md,
        /// "Moving a port").
        #[arg(long, value_name = "UNDERLAY_ADDR")]
        forward_to: Option<Ipv6Addr>,
    },
    /// List ports, with their state (ready: no frame yet; running; paused).
    ListPorts,
    /// Pause a port: every frame from and to its guest is dropped (counted as
    /// port_paused) until resume-port; its flows, connections and rules are kept.
    PausePort { port: String },
    /// Resume a paused port: its connections continue where they were.
    ResumePort { port: String },
    /// Pause a port and write its configuration and live state (connections with
    /// their TCP state, the NAT ports they hold) for import-port on another sled
    /// (docs/operating.md, "Moving a port").
    ExportPort {
        port: String,
        /// Write the export to FILE (mode 0600) instead of standard output.
        #[arg(short = 'o', long, value_name = "FILE")]
        output: Option<PathBuf>,
        /// Delete the port once the export is written to FILE (not with standard
        /// output, whose reader may not have kept it) and found small enough for
        /// import-port to carry.
        #[arg(long, requires = "output")]
        delete: bool,
        /// Once deleted, send this sled's traffic for the guest to the sled it
        /// moves to (a V2P mapping of each of its addresses here), and relay there
        /// for 10 s the frames other sleds still send here; the other sleds learn
        /// of the move from the control plane.
        #[arg(long, value_name = "UNDERLAY_ADDR", requires = "delete")]
        to: Option<Ipv6Addr>,
    },
    /// Make a port from another sled's export, paused (resume-port starts it),
    /// with its connections and NAT state; refused whole, naming the conflict.
    /// Where the guest is here, if not where it was: --netns, --attach or
    /// --vhost-user.
    ImportPort {
        /// The export (-: standard input).
        file: PathBuf,
        #[command(flatten)]
        guest: GuestArgs,
    },
    /// Map a guest's VPC address to its MAC and the sled hosting it.
    SetV2p {
        vpc_ip: IpAddr,
        vpc_mac: MacAddr,
        underlay_ip: Ipv6Addr,
        vni: Vni,
        /// Set it although the fleet maps the address (docs/fleet.md): the local
        /// mapping wins until it is cleared.
        #[arg(long)]
        override_fleet: bool,
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
    /// Add a router entry: DEST is a prefix; TARGET is subnet (inside the VPC),
    /// igw (the internet gateway), drop, or ip4=ADDR / ip6=ADDR (the VPC guest at
    /// ADDR, of DEST's family: an appliance), and opteadm's sub4=CIDR, sub6=CIDR
    /// and ig; CLASS is system (the default) or custom. A port has one route per
    /// prefix and class.
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
    /// Remove the router entry of CLASS (system unless given) for DEST: a port has
    /// one route per prefix and class. opteadm's TARGET, when given, is checked for
    /// syntax only.
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
        #[arg(long = "rule", value_parser = FwRule::parse_line)]
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
    /// Empty one layer's flow table (a layer list-layers names): the firewall's
    /// connections; the other layers keep no flows (0 cleared). The port's flows
    /// are decided again.
    ClearLft { port: String, layer: String },
    /// Replace a port's external addresses (create-xde's flags; none removes them
    /// all). The port's flows are decided again at once.
    SetExternalIps {
        port: String,
        #[command(flatten)]
        external: ExternalArgs,
    },
    /// Replace a port's rate limits (create-xde's flags; none removes them all).
    /// Egress is back-pressure: a guest over its limit is read from later, so its
    /// frames wait in its own queues and nothing is lost (`egress_throttled`).
    /// Ingress frames over the limit wait in a 4 MiB queue per port; only a frame
    /// that finds it full is dropped (`ingress_throttled`, drop `rate_limited`).
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
        /// An external subnet (opteadm's): exempt from NAT, so traffic between
        /// its addresses and the internet keeps them, both ways.
        #[arg(short, long)]
        external: bool,
    },
    /// Undo `attach-subnet` (both ways must be allowed).
    DetachSubnet {
        port: String,
        #[arg(value_parser = parse_net)]
        prefix: IpNet,
    },
    /// opteadm's: check that LINKS are this sled's underlay links, in any order.
    /// They are overlayd's configuration (`--underlay`), fixed while it runs, so
    /// this changes nothing; links that differ are refused, named.
    SetXdeUnderlay {
        #[arg(required = true)]
        links: Vec<String>,
    },
    /// opteadm's: refused, naming why: the underlay links are overlayd's
    /// configuration, released only when it stops.
    ClearXdeUnderlay,
    /// Counters: datapath-wide, or one port's.
    Stats {
        port: Option<String>,
        /// `text`, `json` (as --json), `prometheus` (the classic Prometheus text
        /// format, what node_exporter's textfile collector reads) or `openmetrics`
        /// (what `--metrics-listen` serves Prometheus); these two: whole sled only.
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
    /// The sled as a member of a fleet, and the fleet's store itself: its V2P and
    /// V2B entries, written to etcd directly (docs/fleet.md).
    #[command(subcommand)]
    Fleet(FleetCommand),
}

/// `xdeadm fleet ...`: the sled's view (`status`, `resync`, `adopt`, asked of the
/// daemon), and the writer verbs, which talk to the fleet's store (etcd) directly
/// with a certificate of their own and need no daemon.
#[derive(Debug, Subcommand)]
pub enum FleetCommand {
    /// The sled's view of the fleet's store: connection, revisions, lag, resyncs,
    /// alarms, refused keys.
    Status,
    /// Read everything the sled watches again now, and apply the difference.
    Resync,
    /// Obey a store whose cluster changed and came empty (the sled holds its
    /// tables until told so).
    Adopt,
    #[command(flatten)]
    Write(FleetWriteCommand),
}

/// The writer verbs of `xdeadm fleet`.
#[derive(Debug, Subcommand)]
pub enum FleetWriteCommand {
    /// Write a V2P mapping to the store (set-v2p's arguments): every sled with a
    /// port in VNI applies it.
    SetV2p {
        vpc_ip: IpAddr,
        vpc_mac: MacAddr,
        underlay_ip: Ipv6Addr,
        vni: Vni,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Delete a V2P mapping from the store, unless it changed after it was read.
    ClearV2p {
        vpc_ip: IpAddr,
        vni: Vni,
        /// A mapping that is not there is no error.
        #[arg(long)]
        if_exists: bool,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Write a V2B entry to the store: PREFIX and all its boundary-services
    /// endpoints (they replace those the store has for PREFIX).
    SetV2b {
        #[arg(value_parser = parse_net)]
        prefix: IpNet,
        #[arg(required = true, value_name = "ENDPOINTS")]
        boundary: Vec<Ipv6Addr>,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Delete a V2B entry from the store, unless it changed after it was read.
    ClearV2b {
        #[arg(value_parser = parse_net)]
        prefix: IpNet,
        /// An entry that is not there is no error.
        #[arg(long)]
        if_exists: bool,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Write and delete many entries, from a JSON document (FILE, or - for
    /// standard input).
    ///
    /// The document: {"v2p": [{"vni", "vpc_ip", "vpc_mac", "underlay_ip"}, ...],
    /// "v2b": [{"prefix", "endpoints"}, ...], "clear_v2p": [{"vni", "vpc_ip"},
    /// ...], "clear_v2b": [{"prefix"}, ...]}, each part optional; the entries of
    /// dump-v2p --json and dump-v2b --json fit. Nothing is written if an entry is
    /// invalid (each bad one is named by its place, e.g. v2p[3]) or a key comes
    /// twice. Written in transactions of at most 128 operations.
    Load {
        #[arg(value_name = "FILE")]
        file: PathBuf,
        /// Entries of clear_v2p and clear_v2b that are not there are no error.
        #[arg(long)]
        if_exists: bool,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Move a port's fleet state with the port (docs/operating.md, "Moving a
    /// port"): from its export (FILE from export-port, or - for standard
    /// input), its guest's V2P mappings to the new sled's UNDERLAY_ADDR, and
    /// its routes and firewall rules from --from-sled's keys to --to-sled's,
    /// written in one transaction.
    MovePort {
        #[arg(value_name = "FILE")]
        file: PathBuf,
        /// The sled the port leaves (its --sled-id).
        #[arg(long, value_name = "SLED")]
        from_sled: SledId,
        /// The sled the port moves to (its --sled-id).
        #[arg(long, value_name = "SLED")]
        to_sled: SledId,
        /// The underlay address of the sled the port moves to.
        #[arg(long, value_name = "UNDERLAY_ADDR")]
        underlay: Ipv6Addr,
        #[command(flatten)]
        store: StoreArgs,
    },
}

/// Where the fleet's store is, for the writer verbs of `xdeadm fleet`: flags,
/// else the environment (`XDEADM_FLEET_ENDPOINTS`, `XDEADM_FLEET_CERT`,
/// `XDEADM_FLEET_KEY`, `XDEADM_FLEET_CA`).
#[derive(Debug, Args, Clone, PartialEq, Eq)]
pub struct StoreArgs {
    /// The store's client URLs, comma separated: http://HOST:PORT, or
    /// https://HOST:PORT with --cert, --key and --ca.
    #[arg(
        long,
        env = "XDEADM_FLEET_ENDPOINTS",
        value_name = "URL[,URL...]",
        value_delimiter = ',',
        required = true
    )]
    pub endpoints: Vec<String>,
    /// Our client certificate (PEM); its common name is our etcd user.
    #[arg(long, env = "XDEADM_FLEET_CERT", value_name = "FILE")]
    pub cert: Option<PathBuf>,
    /// The certificate's private key (PEM, mode 0600 or stricter).
    #[arg(long, env = "XDEADM_FLEET_KEY", value_name = "FILE")]
    pub key: Option<PathBuf>,
    /// The CA that signed the store's certificates (PEM): the only one trusted.
    #[arg(long, env = "XDEADM_FLEET_CA", value_name = "FILE")]
    pub ca: Option<PathBuf>,
    /// The longest wait for a member to connect or answer, in seconds.
    #[arg(
        long,
        value_name = "SECS",
        default_value_t = 10,
        value_parser = clap::value_parser!(u64).range(1..=3600)
    )]
    pub timeout: u64,
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

/// `--vhost-user-mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum VhostModeArg {
    Server,
    Client,
}

#[derive(Debug, Args)]
pub struct CreateXde {
    pub name: String,
    /// The guest's MAC (opteadm's older --private-mac too).
    #[arg(long, alias = "private-mac")]
    pub guest_mac: MacAddr,
    /// The guest's private address (one IPv4 and/or one IPv6).
    #[arg(long = "private-ip", required = true)]
    pub private_ip: Vec<IpAddr>,
    /// The VPC subnet (one IPv4 and/or one IPv6).
    #[arg(long = "vpc-subnet", value_parser = parse_net)]
    pub vpc_subnet: Vec<IpNet>,
    #[arg(long)]
    pub gateway_mac: MacAddr,
    /// The gateway's IPv4 address (its IPv6 address is derived from the gateway MAC).
    #[arg(long)]
    pub gateway_ip: Option<IpAddr>,
    #[arg(long)]
    pub vpc_vni: Vni,
    #[arg(long, default_value_t = DEFAULT_PORT_MTU, value_parser = parse_mtu)]
    pub mtu: u16,
    /// Let external traffic use the port MTU (needs the daemon's sled-wide flag too).
    #[arg(long)]
    pub external_jumbo: bool,
    #[command(flatten)]
    pub guest: GuestArgs,
    /// DNS servers offered by DHCPv4 (IPv4 ones) and DHCPv6 (IPv6 ones):
    /// repeatable, or comma separated (opteadm's --dns-servers).
    #[arg(long = "dns-server", alias = "dns-servers", value_delimiter = ',')]
    pub dns_server: Vec<IpAddr>,
    #[arg(long)]
    pub hostname: Option<String>,
    /// The guest's domain, DHCPv4 option 15 (opteadm's --host-domain).
    #[arg(long, alias = "host-domain")]
    pub domain: Option<String>,
    /// The guest's DNS search list, comma separated (DHCPv4 option 119, DHCPv6
    /// option 24); without it the domain alone is offered.
    #[arg(long = "domain-search-list", value_delimiter = ',')]
    pub domain_search: Vec<String>,
    #[command(flatten)]
    pub sled: SledArgs,
    #[command(flatten)]
    pub external: ExternalArgs,
    #[command(flatten)]
    pub limits: LimitArgs,
}

/// What opteadm's `create-xde` says of the sled. Here these are the daemon's,
/// sled-wide: given, the daemon checks them and refuses the port if they are not
/// its own (`api::SledExpect`).
#[derive(Debug, Args, Clone, Default, PartialEq, Eq)]
pub struct SledArgs {
    /// This sled's underlay address, as overlayd has it (--underlay-addr).
    #[arg(long)]
    pub src_underlay_addr: Option<Ipv6Addr>,
    /// Boundary services' underlay address, as overlayd has it
    /// (--boundary-services).
    #[arg(long)]
    pub bsvc_addr: Option<Ipv6Addr>,
    /// Boundary services' VNI, as overlayd has it (--boundary-vni).
    #[arg(long)]
    pub bsvc_vni: Option<Vni>,
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
    /// The internet gateways an external address serves, `ADDR=UUID[,UUID...]`
    /// (repeatable; OPTE's internet gateway map): a flow routed through `ig=UUID`
    /// leaves from an address that serves it. None: every address serves every
    /// gateway.
    #[arg(long = "inet-gw", value_name = "ADDR=UUID[,UUID]", value_parser = parse_inet_gw)]
    pub inet_gw: Vec<(IpAddr, Vec<Uuid>)>,
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
pub struct Ports(pub Vec<FwPorts>);

/// `22,443,8000-8080` or `any` (opteadm's spelling of no port filter).
pub fn parse_ports(s: &str) -> Result<Ports, FwSyntaxError> {
    FwPorts::parse_list(s).map(Ports)
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
    Prometheus,
    Openmetrics,
}

/// A command-line value that no type of the API's parses, naming it (clap prints
/// it after the argument's name).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    #[error("invalid prefix {0:?}: expected e.g. 10.0.0.0/24 or fd00::/64")]
    Prefix(String),
    #[error(transparent)]
    CidrDir(#[from] CidrDirError),
    #[error("invalid direction {0:?}: expected in or out (attach-subnet allows both)")]
    CidrBoth(String),
    #[error("invalid MTU {0:?}: expected a number")]
    Mtu(String),
    #[error("invalid internet gateway map {0:?}: expected ADDR=UUID[,UUID...]")]
    InetGw(String),
    #[error("MTU {0} is below {MIN_PORT_MTU}")]
    MtuBelowMin(u32),
    #[error("MTU {0} is above 65535")]
    MtuAboveMax(u32),
}

/// A prefix, with a message that shows what one looks like.
pub fn parse_net(s: &str) -> Result<IpNet, ValueError> {
    s.parse().map_err(|_| ValueError::Prefix(s.to_string()))
}

/// `--dir in|out` of `allow-cidr`/`remove-cidr` (any case; both ways is
/// `attach-subnet`).
pub fn parse_cidr_dir(s: &str) -> Result<CidrDir, ValueError> {
    match s.parse()? {
        CidrDir::Both => Err(ValueError::CidrBoth(s.to_string())),
        d => Ok(d),
    }
}

/// `--inet-gw ADDR=UUID[,UUID...]`: an external address and the internet
/// gateways it serves.
pub fn parse_inet_gw(s: &str) -> Result<(IpAddr, Vec<Uuid>), ValueError> {
    let bad = || ValueError::InetGw(s.to_string());
    let (addr, ids) = s.split_once('=').ok_or_else(bad)?;
    let addr = addr.parse().map_err(|_| bad())?;
    let ids = ids
        .split(',')
        .map(|id| id.parse().map_err(|_| bad()))
        .collect::<Result<Vec<Uuid>, _>>()?;
    Ok((addr, ids))
}

/// A port's MTU: [`MIN_PORT_MTU`] to 65535.
pub fn parse_mtu(s: &str) -> Result<u16, ValueError> {
    let v: u32 = s.parse().map_err(|_| ValueError::Mtu(s.to_string()))?;
    if v < u32::from(MIN_PORT_MTU) {
        return Err(ValueError::MtuBelowMin(v));
    }
    u16::try_from(v).map_err(|_| ValueError::MtuAboveMax(v))
}
