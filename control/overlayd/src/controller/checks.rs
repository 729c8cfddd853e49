//! The checks that refuse a port that cannot be, on its own or next to the other
//! ports of this sled: names, MACs, attachments, vhost-user sockets, external
//! addresses.

use api::port::PortConfigError;
use api::{ErrorCode, ExternalIps, MacAddr, PortConfig, PortInfo, SnatRange, Vni};
use std::net::IpAddr;
use std::path::PathBuf;

/// Why a port cannot be created (or restored) as it is.
#[derive(Debug, thiserror::Error)]
pub enum PortCheckError {
    #[error(transparent)]
    Config(#[from] PortConfigError),
    #[error("invalid network namespace name {0:?}")]
    NetnsName(String),
    #[error("port {owner:?} is attached to interface {name:?}: a tap cannot have its name")]
    TapNameAttached { owner: String, name: String },
    #[error("port {0:?}: a vhost-user port has no tap or interface (drop --netns and --attach)")]
    VhostWithTap(String),
    #[error("vhost-user socket {0:?} must be an absolute path")]
    VhostRelative(PathBuf),
    #[error("vhost-user socket {socket:?} is port {owner:?}'s")]
    VhostInUse { socket: PathBuf, owner: String },
    #[error("port {port:?}: --attach {iface:?} and --netns {netns:?} exclude each other (an attached interface stays in the daemon's namespace)")]
    AttachWithNetns {
        port: String,
        iface: String,
        netns: String,
    },
    #[error("invalid interface name {0:?} (1..{max} bytes, no '/', ':' or white space)", max = libc::IFNAMSIZ - 1)]
    InterfaceName(String),
    #[error("interface {iface:?} is already attached to port {owner:?}")]
    AlreadyAttached { iface: String, owner: String },
    #[error("interface {0:?} is the tap of port {0:?}, not a hypervisor's")]
    IsATap(String),
    #[error("a port named {0:?} already exists")]
    NameInUse(String),
    #[error("guest MAC {mac} is already used in VNI {vni} by port {owner:?}")]
    MacInUse {
        mac: MacAddr,
        vni: Vni,
        owner: String,
    },
    #[error("SNAT range {}:{}-{} overlaps port {owner:?}'s {}:{}-{}", ours.ip, ours.start, ours.end, theirs.ip, theirs.start, theirs.end)]
    SnatOverlap {
        ours: SnatRange,
        theirs: SnatRange,
        owner: String,
    },
    #[error("external IP {ip} is already used by port {owner:?}")]
    ExternalIpInUse { ip: IpAddr, owner: String },
}

impl PortCheckError {
    pub fn code(&self) -> ErrorCode {
        match self {
            PortCheckError::Config(_)
            | PortCheckError::NetnsName(_)
            | PortCheckError::VhostWithTap(_)
            | PortCheckError::VhostRelative(_)
            | PortCheckError::AttachWithNetns { .. }
            | PortCheckError::InterfaceName(_)
            | PortCheckError::IsATap(_) => ErrorCode::Invalid,
            PortCheckError::TapNameAttached { .. }
            | PortCheckError::VhostInUse { .. }
            | PortCheckError::AlreadyAttached { .. }
            | PortCheckError::NameInUse(_)
            | PortCheckError::MacInUse { .. }
            | PortCheckError::SnatOverlap { .. }
            | PortCheckError::ExternalIpInUse { .. } => ErrorCode::Conflict,
        }
    }
}

/// Refuses a port that is invalid in itself (configuration, namespace name) or
/// collides with one of `others`.
pub(super) fn check_port(others: &[PortInfo], p: &PortInfo) -> Result<(), PortCheckError> {
    p.config.validate()?;
    if let Some(ns) = &p.netns {
        check_netns_name(ns)?;
    }
    match &p.attach {
        Some(iface) => check_attach(others, p, iface)?,
        None => {
            let name = &p.config.name;
            if let Some(o) = others.iter().find(|o| o.attach.as_ref() == Some(name)) {
                return Err(PortCheckError::TapNameAttached {
                    owner: o.config.name.clone(),
                    name: name.clone(),
                });
            }
        }
    }
    if let Some(v) = &p.vhost_user {
        if p.netns.is_some() || p.attach.is_some() {
            return Err(PortCheckError::VhostWithTap(p.config.name.clone()));
        }
        if !v.socket.is_absolute() {
            return Err(PortCheckError::VhostRelative(v.socket.clone()));
        }
        let theirs = |o: &&PortInfo| o.config.name != p.config.name;
        if let Some(o) = others
            .iter()
            .filter(theirs)
            .find(|o| o.vhost_user.as_ref().is_some_and(|w| w.socket == v.socket))
        {
            return Err(PortCheckError::VhostInUse {
                socket: v.socket.clone(),
                owner: o.config.name.clone(),
            });
        }
    }
    check_port_against(others, &p.config)
}

/// Refuses an attachment that cannot be: with a namespace (an attached interface
/// stays where its hypervisor made it, in the daemon's namespace), to a name no
/// interface can have, or to an interface another port already uses (as its
/// attachment, or as its tap: the daemon would read its own frames).
fn check_attach(others: &[PortInfo], p: &PortInfo, iface: &str) -> Result<(), PortCheckError> {
    if let Some(ns) = &p.netns {
        return Err(PortCheckError::AttachWithNetns {
            port: p.config.name.clone(),
            iface: iface.to_string(),
            netns: ns.clone(),
        });
    }
    let b = iface.as_bytes();
    if b.is_empty()
        || b.len() >= libc::IFNAMSIZ
        || b.iter()
            .any(|&c| c == b'/' || c == b':' || c.is_ascii_whitespace() || c == 0)
    {
        return Err(PortCheckError::InterfaceName(iface.to_string()));
    }
    for o in others.iter().filter(|o| o.config.name != p.config.name) {
        if o.attach.as_deref() == Some(iface) {
            return Err(PortCheckError::AlreadyAttached {
                iface: iface.to_string(),
                owner: o.config.name.clone(),
            });
        }
        if o.attach.is_none() && o.config.name == iface {
            return Err(PortCheckError::IsATap(iface.to_string()));
        }
    }
    Ok(())
}

/// Refuses a port that collides with one of `others`: the same name (it names the
/// tap), or the same guest MAC in the same VPC (inbound frames are dispatched by VNI
/// and destination MAC, so two would be ambiguous).
fn check_port_against(others: &[PortInfo], cfg: &PortConfig) -> Result<(), PortCheckError> {
    for p in others {
        if p.config.name == cfg.name {
            return Err(PortCheckError::NameInUse(cfg.name.clone()));
        }
        if p.config.vni == cfg.vni && p.config.guest_mac == cfg.guest_mac {
            return Err(PortCheckError::MacInUse {
                mac: cfg.guest_mac,
                vni: cfg.vni,
                owner: p.config.name.clone(),
            });
        }
    }
    check_external_against(others, &cfg.name, &cfg.external)
}

/// Refuses external addresses port `name` cannot have next to the other ports of
/// this sled: a SNAT range sharing a port with another port's on the same address
/// (replies could not be told apart), or a floating or ephemeral address another
/// port uses in any role (a 1:1 address is one guest's alone).
pub(super) fn check_external_against(
    others: &[PortInfo],
    name: &str,
    ext: &ExternalIps,
) -> Result<(), PortCheckError> {
    let one_to_one = || ext.ephemeral.iter().chain(&ext.floating);
    for p in others.iter().filter(|p| p.config.name != name) {
        let theirs = &p.config.external;
        if let (Some(a), Some(b)) = (&ext.snat, &theirs.snat) {
            if a.overlaps(b) {
                return Err(PortCheckError::SnatOverlap {
                    ours: *a,
                    theirs: *b,
                    owner: p.config.name.clone(),
                });
            }
        }
        let their_ips: Vec<IpAddr> = theirs
            .snat
            .map(|s| s.ip)
            .into_iter()
            .chain(theirs.ephemeral)
            .chain(theirs.floating.iter().copied())
            .collect();
        let ours_used = one_to_one().find(|ip| their_ips.contains(ip));
        let theirs_used = ext
            .snat
            .map(|s| s.ip)
            .filter(|ip| theirs.ephemeral == Some(*ip) || theirs.floating.contains(ip));
        if let Some(ip) = ours_used.copied().or(theirs_used) {
            return Err(PortCheckError::ExternalIpInUse {
                ip,
                owner: p.config.name.clone(),
            });
        }
    }
    Ok(())
}

/// Namespace names end up in a path under /run/netns: refuse anything that could
/// leave that directory.
fn check_netns_name(ns: &str) -> Result<(), PortCheckError> {
    if ns.is_empty() || ns.len() > 255 || ns.contains('/') || ns == "." || ns == ".." {
        return Err(PortCheckError::NetnsName(ns.to_string()));
    }
    Ok(())
}
