//! What a parsed command asks: [`Command::action`] turns the words `grammar` parsed
//! into an [`Action`], mostly an API [`Request`], with the checks the API's own
//! types make (a port's configuration, a route target, firewall filters), so a bad
//! value is refused by name before anything is sent.

use super::fleet::{self, Batch, FleetWrite, LoadError, MoveError, StoreArgsError};
use super::grammar::{
    CaptureArgs, Command, CreateXde, ExternalArgs, FleetCommand, FleetWriteCommand, GuestArgs,
    LimitArgs, RaArgs, RaCommand, RuleArgs, SledArgs, StatsFormat, VhostModeArg,
};
use super::render::Show;
use crate::opteadm::{self, RulesError};
use api::fleet::{EntryError, KeyError};
use api::openmetrics::Format;
use api::port::PortConfigError;
use api::route::RouteSyntaxError;
use api::vni::ParseVniError;
use api::{
    CaptureSpec, CidrDir, ExportError, ExternalIps, FwFilters, FwRule, FwSyntaxError, PortConfig,
    PortExport, PortImport, PortInfo, PortLimits, Request, RouteClass, RouteEntry, RouteTarget,
    SledExpect, SnatRange, V2pEntry, V2pTarget,
};
use ipnet::IpNet;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::net::{IpAddr, Ipv6Addr};
use std::path::{Path, PathBuf};
use wire::mac::ParseMacError;

/// Why a parsed command cannot be what it asks for, naming the bad value: the
/// API's own syntax and validity errors as they are, and what only the command
/// line can get wrong. `xdeadm` exits 2 on it, as on clap's usage errors.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error(transparent)]
    Port(#[from] PortConfigError),
    #[error(transparent)]
    Route(#[from] RouteSyntaxError),
    #[error(transparent)]
    Firewall(#[from] FwSyntaxError),
    #[error(transparent)]
    Rules(#[from] RulesError),
    #[error(transparent)]
    Vni(#[from] ParseVniError),
    #[error(transparent)]
    Mac(#[from] ParseMacError),
    #[error("more than one {what}: {values}")]
    MoreThanOne { what: &'static str, values: String },
    #[error(
        "gateway IP {0} is IPv6: the gateway's IPv6 address is always fe80::EUI-64(gateway MAC); give its IPv4 address"
    )]
    GatewayIpv6(Ipv6Addr),
    #[error("SNAT IP {0} needs its port range: --snat-start and --snat-end")]
    SnatWithoutRange(IpAddr),
    #[error("router class given twice: {positional} and --class {flag}")]
    ClassTwice {
        positional: RouteClass,
        flag: RouteClass,
    },
    #[error("{0} needs --priority")]
    NoPriority(&'static str),
    #[error("rm-fw-rule {0}: a rule is named by its id or by --priority and filters, not both")]
    IdAndFilters(u64),
    #[error("invalid VPC IP {0:?}")]
    VpcIp(String),
    #[error("invalid underlay IPv6 address {0:?}")]
    UnderlayIp(String),
    #[error("clear-v2p takes VPC_IP VNI, or VPC_IP VPC_MAC UNDERLAY_IP VNI; got {0} words")]
    ClearV2pWords(usize),
    #[error("stats --format {format} covers the whole sled: give no port (got {port:?})")]
    ExpositionOfOnePort { format: &'static str, port: String },
    #[error("clear-xde-underlay: the underlay links are overlayd's configuration (--underlay, or `underlay` in its config file), used as long as it runs; stop overlayd to release them")]
    ClearUnderlay,
    #[error("ra needs a PORT, or `listen IFACE`")]
    RaWithoutPort,
    #[error("capture file {:?}: {error}", file.display())]
    CaptureFile {
        file: PathBuf,
        error: std::io::Error,
    },
    /// An entry for the fleet's store that a sled would refuse.
    #[error(transparent)]
    FleetEntry(#[from] EntryError),
    /// A key of the fleet's store that cannot exist.
    #[error(transparent)]
    FleetKey(#[from] KeyError),
    #[error(transparent)]
    StoreArgs(#[from] StoreArgsError),
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Move(#[from] MoveError),
    #[error("cannot read {}: {error}", file.display())]
    ExportUnread {
        file: PathBuf,
        error: std::io::Error,
    },
    #[error("{}: {error}", file.display())]
    NotAnExport { file: PathBuf, error: ExportError },
}

/// What a parsed command does.
#[derive(Debug, PartialEq)]
pub enum Action {
    /// Ask the daemon.
    Call(Request),
    /// Ask the daemon `check` (which changes nothing); only if it agrees, `then`,
    /// whose answer is printed.
    CheckThenCall { check: Request, then: Request },
    /// Ask the daemon and print the answer as `Show` says.
    Show(Request, Show),
    /// Solicit an RA locally.
    RaListen { iface: String, timeout_s: u64 },
    /// Capture into a file of xdeadm's own and copy it to standard output.
    CaptureToStdout(CaptureArgs),
    /// Write to the fleet's store, directly ([`fleet::run`]).
    FleetWrite(Box<FleetWrite>),
    /// Ask the daemon for the port's export, write it to `output` (standard
    /// output without), and only then, with `delete`, delete the port, and map
    /// its guest's addresses to sled `to`.
    ExportPort {
        port: String,
        output: Option<PathBuf>,
        delete: bool,
        to: Option<Ipv6Addr>,
    },
}

impl GuestArgs {
    /// Port `config` with its guest where these arguments say.
    fn port(&self, config: PortConfig) -> PortInfo {
        PortInfo {
            config,
            netns: self.netns.clone(),
            attach: self.attach.clone(),
            vhost_user: self.vhost_user.clone().map(|socket| api::VhostUser {
                socket,
                mode: self.vhost_user_mode.into(),
            }),
        }
    }
}

/// Reads a port's export from `file` (`-`: standard input).
fn read_export(file: &Path) -> Result<PortExport, CommandError> {
    let bytes = if file == Path::new("-") {
        let mut bytes = Vec::new();
        std::io::stdin()
            .lock()
            .read_to_end(&mut bytes)
            .map(|_| bytes)
    } else {
        std::fs::read(file)
    }
    .map_err(|error| CommandError::ExportUnread {
        file: file.to_path_buf(),
        error,
    })?;
    PortExport::read(&bytes).map_err(|error| CommandError::NotAnExport {
        file: file.to_path_buf(),
        error,
    })
}

impl Command {
    /// Turns the command into what to do; errors name the bad value.
    pub fn action(self) -> Result<Action, CommandError> {
        let req = match self {
            Command::CreateXde(c) => {
                let expect = c.sled.to_expect();
                let config = c.to_config()?;
                let create = Request::CreatePort(Box::new(c.guest.port(config)));
                if expect.is_empty() {
                    create
                } else {
                    return Ok(Action::CheckThenCall {
                        check: Request::CheckSled(expect),
                        then: create,
                    });
                }
            }
            Command::DeleteXde { name, forward_to } => Request::DeletePort { name, forward_to },
            Command::ListPorts => Request::ListPorts,
            Command::PausePort { port } => Request::PausePort { port },
            Command::ResumePort { port } => Request::ResumePort { port },
            Command::ExportPort {
                port,
                output,
                delete,
                to,
            } => {
                return Ok(Action::ExportPort {
                    port,
                    output,
                    delete,
                    to,
                })
            }
            Command::ImportPort { file, guest } => {
                let export = read_export(&file)?;
                let p = guest.port(export.port.config.clone());
                Request::ImportPort(Box::new(PortImport {
                    export,
                    netns: p.netns,
                    attach: p.attach,
                    vhost_user: p.vhost_user,
                }))
            }
            Command::SetV2p {
                vpc_ip,
                vpc_mac,
                underlay_ip,
                vni,
                override_fleet,
            } => Request::SetV2p {
                entry: V2pEntry {
                    vpc_ip,
                    vpc_mac,
                    underlay_ip,
                    vni,
                },
                override_fleet,
            },
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
                let target = RouteTarget::parse_for(&dest, &target)?;
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
                    RouteTarget::parse_for(&dest, t)?;
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
                    return Err(CommandError::IdAndFilters(id));
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
            Command::ClearLft { port, layer } => Request::ClearLft { port, layer },
            Command::SetExternalIps { port, external } => Request::SetExternalIps {
                port,
                external: external.to_external()?,
            },
            Command::SetPortLimits { port, limits } => Request::SetPortLimits {
                port,
                limits: limits.to_limits(),
            },
            Command::AllowCidr { port, prefix, dir } => Request::AllowCidr {
                port,
                prefix,
                dir,
                external: false,
            },
            Command::RemoveCidr { port, prefix, dir } => Request::RemoveCidr { port, prefix, dir },
            Command::AttachSubnet {
                port,
                prefix,
                external,
            } => Request::AllowCidr {
                port,
                prefix,
                dir: CidrDir::Both,
                external,
            },
            Command::DetachSubnet { port, prefix } => Request::RemoveCidr {
                port,
                prefix,
                dir: CidrDir::Both,
            },
            Command::SetXdeUnderlay { links } => Request::CheckSled(SledExpect {
                underlay_links: Some(links),
                ..SledExpect::default()
            }),
            Command::ClearXdeUnderlay => return Err(CommandError::ClearUnderlay),
            Command::Stats { port, format } => {
                let (exposition, name) = match format {
                    StatsFormat::Text => return Ok(Action::Call(Request::Stats { port })),
                    StatsFormat::Json => {
                        return Ok(Action::Show(Request::Stats { port }, Show::Json))
                    }
                    StatsFormat::Openmetrics => (Format::OpenMetrics, "openmetrics"),
                    StatsFormat::Prometheus => (Format::Prometheus, "prometheus"),
                };
                if let Some(port) = port {
                    return Err(CommandError::ExpositionOfOnePort { format: name, port });
                }
                let show = Show::Exposition(exposition);
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
                return Err(CommandError::RaWithoutPort);
            }
            Command::Doctor => Request::Doctor,
            Command::Fleet(FleetCommand::Status) => Request::FleetStatus,
            Command::Fleet(FleetCommand::Resync) => Request::FleetResync,
            Command::Fleet(FleetCommand::Adopt) => Request::FleetAdopt,
            Command::Fleet(FleetCommand::Write(c)) => {
                return Ok(Action::FleetWrite(Box::new(fleet_write(c)?)))
            }
            Command::PathCheck { underlay_addr } => Request::PathCheck {
                peer: underlay_addr,
            },
            Command::Capture(c) => match &c.file {
                // The daemon has its own working directory.
                Some(f) => Request::Capture(c.spec(std::path::absolute(f).map_err(|error| {
                    CommandError::CaptureFile {
                        file: f.clone(),
                        error,
                    }
                })?)),
                None => return Ok(Action::CaptureToStdout(c)),
            },
        };
        Ok(Action::Call(req))
    }
}

/// The writer verbs of `fleet`: every entry encoded and checked (a load document
/// read whole) before anything is sent.
fn fleet_write(c: FleetWriteCommand) -> Result<FleetWrite, CommandError> {
    let (store, batch) = match c {
        FleetWriteCommand::SetV2p {
            vpc_ip,
            vpc_mac,
            underlay_ip,
            vni,
            store,
        } => {
            let put = Batch::put_v2p(&V2pEntry {
                vpc_ip,
                vpc_mac,
                underlay_ip,
                vni,
            })?;
            (store, batch_of(vec![put], vec![], false))
        }
        FleetWriteCommand::ClearV2p {
            vpc_ip,
            vni,
            if_exists,
            store,
        } => (
            store,
            batch_of(vec![], vec![Batch::clear_v2p(vni, vpc_ip)?], if_exists),
        ),
        FleetWriteCommand::SetV2b {
            prefix,
            boundary,
            store,
        } => {
            let put = Batch::put_v2b(&api::V2bEntry {
                prefix,
                endpoints: boundary,
            })?;
            (store, batch_of(vec![put], vec![], false))
        }
        FleetWriteCommand::ClearV2b {
            prefix,
            if_exists,
            store,
        } => (
            store,
            batch_of(vec![], vec![Batch::clear_v2b(prefix)?], if_exists),
        ),
        FleetWriteCommand::Load {
            file,
            if_exists,
            store,
        } => {
            // The store options first: a bad one is named before a large file is read.
            let config = store.to_config()?;
            let batch = fleet::read_load(&file, if_exists)?;
            return Ok(FleetWrite {
                store: config,
                batch,
            });
        }
        FleetWriteCommand::MovePort {
            file,
            from_sled,
            to_sled,
            underlay,
            store,
        } => {
            let export = read_export(&file)?;
            let batch = Batch::move_port(&export, from_sled, to_sled, underlay)?;
            (store, batch)
        }
    };
    Ok(FleetWrite {
        store: store.to_config()?,
        batch,
    })
}

fn batch_of(puts: Vec<fleet::Put>, clears: Vec<fleet::Clear>, if_exists: bool) -> Batch {
    Batch {
        puts,
        clears,
        if_exists,
        moves: Vec::new(),
    }
}

/// `clear-v2p VPC_IP VNI`, or opteadm's `clear-v2p VPC_IP VPC_MAC UNDERLAY_IP VNI`.
fn clear_v2p(words: &[String]) -> Result<Request, CommandError> {
    let ip = |s: &str| {
        s.parse::<IpAddr>()
            .map_err(|_| CommandError::VpcIp(s.to_string()))
    };
    match words {
        [vpc_ip, vni] => Ok(Request::ClearV2p {
            vpc_ip: ip(vpc_ip)?,
            vni: vni.parse()?,
            expect: None,
        }),
        [vpc_ip, mac, underlay, vni] => Ok(Request::ClearV2p {
            vpc_ip: ip(vpc_ip)?,
            vni: vni.parse()?,
            expect: Some(V2pTarget {
                vpc_mac: mac.parse()?,
                underlay_ip: underlay
                    .parse()
                    .map_err(|_| CommandError::UnderlayIp(underlay.to_string()))?,
            }),
        }),
        _ => Err(CommandError::ClearV2pWords(words.len())),
    }
}

impl CreateXde {
    /// Builds the port configuration, refusing what it cannot hold by name.
    pub fn to_config(&self) -> Result<PortConfig, CommandError> {
        fn one<T: Copy + std::fmt::Display>(
            what: &'static str,
            v: &[T],
        ) -> Result<Option<T>, CommandError> {
            match v {
                [] => Ok(None),
                [x] => Ok(Some(*x)),
                _ => Err(CommandError::MoreThanOne {
                    what,
                    values: v
                        .iter()
                        .map(std::string::ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", "),
                }),
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
            Some(IpAddr::V6(a)) => return Err(CommandError::GatewayIpv6(a)),
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
            domain_search: self.domain_search.clone(),
            external: self.external.to_external()?,
            limits: self.limits.to_limits(),
            cidrs: Default::default(),
        };
        cfg.validate()?;
        Ok(cfg)
    }
}

/// A route's class from opteadm's positional CLASS or `--class` (the same if
/// both); `system` when neither.
fn route_class(positional: Option<&str>, flag: Option<&str>) -> Result<RouteClass, CommandError> {
    let p = positional.map(str::parse::<RouteClass>).transpose()?;
    let f = flag.map(str::parse::<RouteClass>).transpose()?;
    match (p, f) {
        (Some(positional), Some(flag)) if positional != flag => {
            Err(CommandError::ClassTwice { positional, flag })
        }
        (a, b) => Ok(a.or(b).unwrap_or_default()),
    }
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

impl From<VhostModeArg> for api::VhostUserMode {
    fn from(m: VhostModeArg) -> Self {
        match m {
            VhostModeArg::Server => api::VhostUserMode::Server,
            VhostModeArg::Client => api::VhostUserMode::Client,
        }
    }
}

impl SledArgs {
    /// What the line says of the sled, for the daemon to check.
    pub fn to_expect(&self) -> SledExpect {
        SledExpect {
            underlay_addr: self.src_underlay_addr,
            boundary_services: self.bsvc_addr,
            boundary_vni: self.bsvc_vni,
            underlay_links: None,
        }
    }
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

impl ExternalArgs {
    /// The addresses; the range's bounds are checked with the port's addresses
    /// (create-xde here, set-external-ips by the daemon).
    pub fn to_external(&self) -> Result<ExternalIps, CommandError> {
        let snat = match (self.snat_ip, self.snat_start, self.snat_end) {
            (None, _, _) => None,
            (Some(ip), Some(start), Some(end)) => Some(SnatRange { ip, start, end }),
            (Some(ip), _, _) => return Err(CommandError::SnatWithoutRange(ip)),
        };
        Ok(ExternalIps {
            snat,
            ephemeral: self.ephemeral_ip,
            floating: self.floating_ip.clone(),
            gateways: self
                .inet_gw
                .iter()
                .fold(BTreeMap::new(), |mut m, (ip, ids)| {
                    m.entry(*ip).or_insert_with(BTreeSet::new).extend(ids);
                    m
                }),
        })
    }
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

    fn priority(&self, verb: &'static str) -> Result<u16, CommandError> {
        self.priority.ok_or(CommandError::NoPriority(verb))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::grammar::Cli;
    use api::port::DEFAULT_PORT_MTU;
    use api::{CaptureSpec, Direction, FwAction, FwHost, FwPorts, FwProto, Vni};

    /// The action of a command line, or the message `xdeadm` would print.
    fn parse(args: &[&str]) -> Result<Action, String> {
        let cli = Cli::parse_line(std::iter::once("xdeadm").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        cli.command.action().map_err(|e| e.to_string())
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

    /// opteadm's whole create-xde line (as OPTE's own scripts write it): its
    /// spellings of our flags, comma-separated lists, and the sled's addresses,
    /// which become a check the daemon answers before the port is made.
    #[test]
    fn create_xde_takes_opteadm_lines() {
        let line = "create-xde opte0 --private-mac A8:40:25:ff:00:01 --private-ip 10.0.0.2 \
                    --gateway-mac A8:40:25:00:00:01 --gateway-ip 10.0.0.254 \
                    --bsvc-addr fd00:99::1 --bsvc-vni 99 --vpc-vni 10 --vpc-subnet 10.0.0.0/24 \
                    --src-underlay-addr fd00:2000::1 --snat-start 4000 --snat-end 7000 \
                    --snat-ip 10.100.0.5 --dns-servers 1.1.1.1,2001:4860:4860::8888,8.8.8.8 \
                    --hostname db01 --host-domain oxide.internal \
                    --domain-search-list eng.oxide.internal,oxide.internal";
        let a = parse(&line.split_whitespace().collect::<Vec<_>>()).unwrap();
        let Action::CheckThenCall {
            check: Request::CheckSled(expect),
            then: Request::CreatePort(c),
        } = a
        else {
            panic!("{a:?}")
        };
        assert_eq!(
            expect,
            SledExpect {
                underlay_addr: Some("fd00:2000::1".parse().unwrap()),
                boundary_services: Some("fd00:99::1".parse().unwrap()),
                boundary_vni: Some(Vni::new(99).unwrap()),
                underlay_links: None,
            }
        );
        let p = c.config;
        assert_eq!(p.guest_mac.to_string(), "a8:40:25:ff:00:01");
        assert_eq!(p.dns_servers4.len(), 2);
        assert_eq!(p.dns_servers6[0].to_string(), "2001:4860:4860::8888");
        assert_eq!(p.domain.as_deref(), Some("oxide.internal"));
        assert_eq!(p.domain_search, ["eng.oxide.internal", "oxide.internal"]);
        // Without the sled's addresses, no check is asked.
        assert!(matches!(
            parse(CREATE).unwrap(),
            Action::Call(Request::CreatePort(_))
        ));
        let e = parse(&with(&["--domain-search-list", "ok.com,a..b"])).unwrap_err();
        assert!(e.contains("\"a..b\""), "{e}");
        let e = parse(&with(&["--src-underlay-addr", "10.0.0.1"])).unwrap_err();
        assert!(e.contains("10.0.0.1"), "{e}");
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
            Action::Call(Request::set_v2p(V2pEntry {
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
            Action::Show(
                Request::Stats { port: None },
                Show::Exposition(Format::OpenMetrics)
            )
        );
        assert_eq!(
            parse(&["stats", "--format", "prometheus"]).unwrap(),
            Action::Show(
                Request::Stats { port: None },
                Show::Exposition(Format::Prometheus)
            )
        );
        for format in ["openmetrics", "prometheus"] {
            let e = parse(&["stats", "p1", "--format", format]).unwrap_err();
            assert!(e.contains("\"p1\"") && e.contains(format), "{e}");
        }
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
            external: false,
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
            call("attach-subnet -p opte0 203.0.113.0/24 -e").unwrap(),
            Action::Call(Request::AllowCidr {
                port: "opte0".into(),
                prefix: "203.0.113.0/24".parse().unwrap(),
                dir: CidrDir::Both,
                external: true,
            })
        );
        assert_eq!(
            call("detach-subnet opte0 192.168.50.0/24").unwrap(),
            Action::Call(Request::RemoveCidr {
                port: "opte0".into(),
                prefix: "192.168.50.0/24".parse().unwrap(),
                dir: CidrDir::Both,
            })
        );
        assert_eq!(
            call("clear-lft -p opte0 firewall").unwrap(),
            Action::Call(Request::ClearLft {
                port: "opte0".into(),
                layer: "firewall".into(),
            })
        );
        for (line, named) in [
            (
                "attach-subnet -p opte0 192.168.50.0/33 -e",
                "192.168.50.0/33",
            ),
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

    /// opteadm's underlay verbs: the links are the daemon's, so setting them is a
    /// check it answers, and clearing them is refused here.
    #[test]
    fn xde_underlay_is_checked_or_refused() {
        assert_eq!(
            parse(&["set-xde-underlay", "eth1", "eth2"]).unwrap(),
            Action::Call(Request::CheckSled(SledExpect {
                underlay_links: Some(vec!["eth1".into(), "eth2".into()]),
                ..SledExpect::default()
            }))
        );
        assert!(parse(&["set-xde-underlay"]).is_err());
        let e = parse(&["clear-xde-underlay"]).unwrap_err();
        assert!(e.contains("overlayd's configuration"), "{e}");
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

    /// `set-fw-rules --rule` takes the API's rule lines, and refuses a bad one
    /// naming what is wrong with it.
    #[test]
    fn rule_strings() {
        let line = "direction=out priority=5 action=deny host=10.0.0.0/8 proto=udp ports=53";
        let a = parse(&["set-fw-rules", "p", "--rule", line]).unwrap();
        let Action::Call(Request::SetFwRules { rules, .. }) = a else {
            panic!("{a:?}")
        };
        let shown: Vec<String> = rules.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            ["out prio=5 deny host=10.0.0.0/8 proto=udp ports=53"]
        );
        for (rule, named) in [
            ("priority=5", "direction"),
            ("dir=in prio=5 colour=red", "colour"),
            ("dir=in prio=x", "\"x\""),
        ] {
            let e = parse(&["set-fw-rules", "p", "--rule", rule]).unwrap_err();
            assert!(e.contains(named), "{rule}: {e}");
        }
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

    const STORE: &[&str] = &["--endpoints", "http://127.0.0.1:2379,http://[::1]:2379"];

    /// A writer verb of `fleet`, with the store options.
    fn fleet_write(args: &[&str]) -> Result<FleetWrite, String> {
        let line: Vec<&str> = ["fleet"].iter().chain(args).chain(STORE).copied().collect();
        match parse(&line)? {
            Action::FleetWrite(w) => Ok(*w),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn fleet_writer_verbs_encode_their_entries() {
        let w = fleet_write(&[
            "set-v2p",
            "172.30.0.6",
            "a8:40:25:ff:00:06",
            "fd00:99::2",
            "1701",
        ])
        .unwrap();
        assert_eq!(
            w.store.endpoints,
            ["http://127.0.0.1:2379", "http://[::1]:2379"]
        );
        assert_eq!(w.store.tls, None);
        assert_eq!(w.store.timeout, std::time::Duration::from_secs(10));
        let put = &w.batch.puts[0];
        assert_eq!(put.key, "/overlay/v1/vpc/1701/v2p/172.30.0.6");
        assert_eq!(
            put.value,
            br#"{"mac":"a8:40:25:ff:00:06","underlay":"fd00:99::2"}"#
        );
        assert!(w.batch.clears.is_empty());

        let w = fleet_write(&["set-v2b", "0.0.0.0/0", "fd00:99::b2", "fd00:99::b1"]).unwrap();
        assert_eq!(w.batch.puts[0].key, "/overlay/v1/v2b/0.0.0.0/0");
        assert_eq!(
            w.batch.puts[0].value,
            br#"{"endpoints":["fd00:99::b1","fd00:99::b2"]}"#
        );

        let w =
            fleet_write(&["clear-v2p", "fd00:1122:3344:100::6", "7", "--timeout", "2"]).unwrap();
        assert_eq!(
            w.batch.clears[0].key,
            "/overlay/v1/vpc/7/v2p/fd00:1122:3344:100::6"
        );
        assert!(!w.batch.if_exists);
        assert_eq!(w.store.timeout, std::time::Duration::from_secs(2));
        let w = fleet_write(&["clear-v2b", "::/0", "--if-exists"]).unwrap();
        assert_eq!(w.batch.clears[0].key, "/overlay/v1/v2b/::/0");
        assert!(w.batch.if_exists && w.batch.puts.is_empty());

        // The daemon's verbs stay requests.
        assert_eq!(
            parse(&["fleet", "status"]).unwrap(),
            Action::Call(Request::FleetStatus)
        );
    }

    #[test]
    fn fleet_writer_verbs_refuse_bad_values_by_name() {
        for (args, named) in [
            (
                &[
                    "set-v2p",
                    "172.30.0.6",
                    "a8:40:25:ff:00:06",
                    "fd00:99::2",
                    "16777216",
                ][..],
                "16777216",
            ),
            (
                &[
                    "set-v2p",
                    "172.30.0.6",
                    "a8:40:25:ff:00:06",
                    "ff02::1",
                    "1701",
                ],
                "ff02::1",
            ),
            (
                &["set-v2p", "172.30.0.6", "a8:40:25:ff:00:06", "::", "1701"],
                "underlay address :: ",
            ),
            (
                &[
                    "set-v2p",
                    "172.30.0.6",
                    "ff:ff:ff:ff:ff:ff",
                    "fd00:99::2",
                    "1701",
                ],
                "ff:ff:ff:ff:ff:ff",
            ),
            (
                &[
                    "set-v2p",
                    "172.30.0.6",
                    "a8:40:25:ff:00:zz",
                    "fd00:99::2",
                    "1701",
                ],
                "a8:40:25:ff:00:zz",
            ),
            (
                &[
                    "set-v2p",
                    "0.0.0.0",
                    "a8:40:25:ff:00:06",
                    "fd00:99::2",
                    "1701",
                ],
                "0.0.0.0",
            ),
            (&["set-v2b", "10.1.2.3/8", "fd00:99::b1"], "10.1.2.3/8"),
            (&["set-v2b", "0.0.0.0/0", "10.0.0.1"], "10.0.0.1"),
            (&["set-v2b", "0.0.0.0/0", "ff02::2"], "ff02::2"),
            (&["set-v2b", "0.0.0.0/0"], "ENDPOINTS"),
            (&["clear-v2b", "10.0.0.1/8"], "10.0.0.1/8"),
            (&["clear-v2p", "172.30.0.6", "x"], "\"x\""),
            (&["clear-v2p", "172.30.0.6", "1701", "--timeout", "0"], "0"),
            (
                &["clear-v2p", "172.30.0.6", "1701", "--cert", "c.pem"],
                "--key, --ca missing",
            ),
        ] {
            let e = fleet_write(args).unwrap_err();
            assert!(e.contains(named), "{args:?}: {e}");
        }
        // The store's endpoints are needed (from the environment when not given).
        if std::env::var_os("XDEADM_FLEET_ENDPOINTS").is_none() {
            let e = parse(&["fleet", "clear-v2b", "::/0"]).unwrap_err();
            assert!(e.contains("--endpoints"), "{e}");
        }
    }

    #[test]
    fn fleet_load_reads_a_file_whole_before_anything_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("fleet.json");
        std::fs::write(
            &file,
            r#"{"v2p": [{"vni": 1, "vpc_ip": "10.0.0.1", "vpc_mac": "a8:40:25:ff:00:01", "underlay_ip": "fd00:99::2"}],
                "clear_v2b": [{"prefix": "::/0"}]}"#,
        )
        .unwrap();
        let path = file.to_str().unwrap();
        let w = fleet_write(&["load", path, "--if-exists"]).unwrap();
        assert_eq!(w.batch.puts.len(), 1);
        assert_eq!(w.batch.clears.len(), 1);
        assert!(w.batch.if_exists);

        std::fs::write(
            &file,
            r#"{"v2p": [{"vni": 1, "vpc_ip": "10.0.0.1", "vpc_mac": "a8:40:25:ff:00:01", "underlay_ip": "ff02::1"}]}"#,
        )
        .unwrap();
        let e = fleet_write(&["load", path]).unwrap_err();
        assert!(
            e.contains(path) && e.contains("v2p[0]") && e.contains("ff02::1"),
            "{e}"
        );
        std::fs::write(&file, "").unwrap();
        let e = fleet_write(&["load", path]).unwrap_err();
        assert!(e.contains(path) && e.contains("empty"), "{e}");
        let missing = dir.path().join("absent.json");
        let e = fleet_write(&["load", missing.to_str().unwrap()]).unwrap_err();
        assert!(e.contains("absent.json"), "{e}");
    }

    /// `export-port`: `--to` only with `--delete`; `import-port`: the file read
    /// and checked before anything is sent, its guest placed where the flags say.
    #[test]
    fn export_and_import_port() {
        let a = parse(&[
            "export-port",
            "opte0",
            "-o",
            "x.json",
            "--delete",
            "--to",
            "fd00:99::3",
        ]);
        let Ok(Action::ExportPort { to, delete, .. }) = a else {
            panic!("{a:?}")
        };
        assert_eq!((to, delete), (Some("fd00:99::3".parse().unwrap()), true));
        let a = parse(&["delete-xde", "opte0", "--forward-to", "fd00:99::3"]);
        let Ok(Action::Call(Request::DeletePort { forward_to, .. })) = a else {
            panic!("{a:?}")
        };
        assert_eq!(forward_to, Some("fd00:99::3".parse().unwrap()));
        let e = parse(&["export-port", "opte0", "--to", "fd00:99::3"]).unwrap_err();
        assert!(e.contains("--delete"), "{e}");
        // Deleted only once written to a file, not to whatever reads stdout.
        let e = parse(&["export-port", "opte0", "--delete"]).unwrap_err();
        assert!(e.contains("--output"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("opte0.export");
        let path = file.to_str().unwrap();
        let e = parse(&["import-port", path]).unwrap_err();
        assert!(
            e.contains("cannot read") && e.contains("opte0.export"),
            "{e}"
        );
        std::fs::write(&file, "{\"kind\": \"overlayd-port-export\", \"format\": 7}").unwrap();
        let e = parse(&["import-port", path]).unwrap_err();
        assert!(e.contains("format 7"), "{e}");
        let export = api::testing::sample_export("opte0", 5, "there");
        std::fs::write(&file, serde_json::to_string(&export).unwrap()).unwrap();
        let Ok(Action::Call(Request::ImportPort(i))) = parse(&["import-port", path]) else {
            panic!("not an import")
        };
        assert_eq!(i.port().netns.as_deref(), Some("there"));
        let a = parse(&["import-port", path, "--attach", "vnet3"]);
        let Ok(Action::Call(Request::ImportPort(i))) = a else {
            panic!("{a:?}")
        };
        let p = i.port();
        assert_eq!((p.netns, p.attach.as_deref()), (None, Some("vnet3")));
    }
}
