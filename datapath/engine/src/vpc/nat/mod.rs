//! The NAT layer, between router and overlay, for traffic whose route target is the
//! internet gateway (docs/nat.md).
//!
//! A port reaches the internet only from one of its external addresses
//! ([`ExternalIps`]), as in the reference: a floating IP if it has one (of the
//! flow's family), else its ephemeral IP, else its SNAT IP with a source port (ICMP
//! echo: identifier) allocated from the port's range. A port without one is refused
//! (`no_external_ip`): its private address must never reach the internet.
//!
//! Floating and ephemeral addresses are 1:1: only the address changes, and the
//! inbound rewrite needs no state. SNAT shares one address among several ports
//! (disjoint ranges), so each flow owns an allocated port ([`SnatTable`]) for as long
//! as its firewall connection lives: the expiry of NAT state is the connection's
//! (one set of timeouts, docs/engine.md "Firewall state"), and a mapping whose
//! connection is gone is free for the next flow.
//!
//! The rewrite of an established flow is compiled into its flow-table entry
//! ([`Rewrite`] in the encapsulation) and applied by `frames::rewrite` with
//! incremental checksum updates (RFC 1624), so the fast path stays a table hit plus
//! a few stores. This file decides what to rewrite; how is that module's.

mod carry;

pub use carry::{NatImportError, NatRecords, ReplyFromRecord, SnatRecord};

use crate::drop::DropReason;
use crate::frames::rewrite::{
    icmp_checksum, local_port, quote_of, rewrite, rewritten_meta, End, Rewrite, SrcNat,
};
use crate::ids::IgwId;
use crate::machinery::conntrack::{ConnHandle, ConnTable};
use crate::machinery::flow::{
    is_echo, FlowHashBuilder, FlowKey, PROTO_ICMP, PROTO_ICMPV6, PROTO_TCP, PROTO_UDP,
};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use wire::meta::InnerMeta;

/// A SNAT address and the source ports this port may use on it (inclusive). A
/// range whose start is above its end holds no port: its flows are refused as
/// `snat_exhausted` (the API refuses such a range before it gets here).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnatRange {
    pub ip: IpAddr,
    pub start: u16,
    pub end: u16,
}

/// A port's external addresses (opteadm's `--snat-ip/--snat-start/--snat-end`,
/// `--ephemeral-ip`, `--floating-ip`). Taken as given (the API checks them: ports
/// of 1024 and up, no address twice, every address of a family the port has): an
/// address of a family the port has no private address of is never chosen for a
/// flow and translates nothing inbound (`nat_no_mapping`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExternalIps {
    pub snat: Option<SnatRange>,
    pub ephemeral: Option<IpAddr>,
    pub floating: Vec<IpAddr>,
    /// The internet gateways each address serves (OPTE's `inet_gw_map`): a flow
    /// routed through gateway `G` (`add-router-entry … ig=G`) leaves from an
    /// address that serves `G`, so a port with several gateways leaves through
    /// each from that gateway's own addresses. Empty: every address serves every
    /// gateway. A route without a gateway id (`ig`) may use every address.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub gateways: BTreeMap<IpAddr, BTreeSet<IgwId>>,
}

impl ExternalIps {
    /// Whether the port has no external address at all.
    pub fn is_empty(&self) -> bool {
        self.snat.is_none() && self.ephemeral.is_none() && self.floating.is_empty()
    }

    /// Whether address `ip` may be the source of flows through gateway `gw`.
    fn serves(&self, ip: IpAddr, gw: Option<IgwId>) -> bool {
        match gw {
            None => true,
            Some(g) => {
                self.gateways.is_empty() || self.gateways.get(&ip).is_some_and(|s| s.contains(&g))
            }
        }
    }

    /// The 1:1 address (floating first, then ephemeral) of `family`'s flows
    /// through gateway `gw`.
    fn one_to_one(&self, v4: bool, gw: Option<IgwId>) -> Option<IpAddr> {
        let usable = |ip: &&IpAddr| ip.is_ipv4() == v4 && self.serves(**ip, gw);
        self.floating
            .iter()
            .find(usable)
            .or(self.ephemeral.as_ref().filter(usable))
            .copied()
    }

    /// The SNAT range for `family`'s flows through gateway `gw`.
    fn snat_for(&self, v4: bool, gw: Option<IgwId>) -> Option<&SnatRange> {
        self.snat
            .as_ref()
            .filter(|s| s.ip.is_ipv4() == v4 && self.serves(s.ip, gw))
    }

    /// Whether `ip` is a 1:1 (floating or ephemeral) address of the port.
    fn is_one_to_one(&self, ip: IpAddr) -> bool {
        self.ephemeral == Some(ip) || self.floating.contains(&ip)
    }
}

/// Whether a flow has ports (or an echo identifier) SNAT can allocate. A non-first
/// fragment has none (its key's ports are 0): it keeps the ports of the datagram's
/// first fragment, which carries the L4 header.
fn has_ports(key: &FlowKey) -> bool {
    let ports = key.src_port != 0 || key.dst_port != 0;
    (matches!(key.proto, PROTO_TCP | PROTO_UDP) && ports) || is_echo(key.proto, key.icmp_type)
}

/// One allocated SNAT port: the flow it belongs to and the connection whose life
/// it shares.
#[derive(Clone, Copy, Debug)]
struct Binding {
    private_port: u16,
    remote_ip: IpAddr,
    remote_port: u16,
    conn: Option<ConnHandle>,
}

/// (protocol, private source port, remote address, remote port).
type PrivateKey = (u8, u16, IpAddr, u16);

/// The [`PrivateKey`] of flow `key` (guest as source).
fn private_key(key: &FlowKey) -> PrivateKey {
    (key.proto, key.src_port, key.dst_ip, key.dst_port)
}

/// Most inbound connections to a port's non-default 1:1 addresses remembered at
/// once (see [`SnatTable::reply_from`]); beyond it, replies of new ones leave from
/// the default address until a remembered connection ends.
pub const REPLY_FROM_MAX: usize = 4096;

/// A port's SNAT state: which source ports of its range are bound to which flows.
/// At most one mapping per port of the range and protocol, so its size is bounded
/// by the range.
#[derive(Debug)]
pub struct SnatTable {
    by_private: HashMap<PrivateKey, u16, FlowHashBuilder>,
    by_port: HashMap<(u8, u16), Binding, FlowHashBuilder>,
    /// Where the next allocation starts looking (round robin over the range, so a
    /// just-freed port is not handed to the next flow at once).
    cursor: u32,
    /// Connections from the internet to a floating or ephemeral address that is not
    /// the one the port's own flows of that family leave from: their replies must
    /// leave from the address the connection came in to. Each lives as long as its
    /// connection (handle), like a SNAT binding.
    reply_from: HashMap<PrivateKey, (IpAddr, ConnHandle), FlowHashBuilder>,
}

impl SnatTable {
    pub fn new(hash_seed: u64) -> Self {
        SnatTable {
            by_private: HashMap::with_hasher(FlowHashBuilder::new(hash_seed ^ 0x5a7)),
            by_port: HashMap::with_hasher(FlowHashBuilder::new(hash_seed ^ 0xa75)),
            cursor: 0,
            reply_from: HashMap::with_hasher(FlowHashBuilder::new(hash_seed ^ 0x7e1)),
        }
    }

    /// Forgets every mapping (the port's external addresses changed).
    pub fn clear(&mut self) {
        self.by_private.clear();
        self.by_port.clear();
        self.reply_from.clear();
    }

    /// The source port of flow `key` (guest as source) in `range`: the one it was
    /// given before if still bound, else a port free or whose connection is gone.
    /// `None`: the range is exhausted.
    fn allocate(
        &mut self,
        range: &SnatRange,
        key: &FlowKey,
        conns: &ConnTable,
        now: u64,
    ) -> Option<u16> {
        let pk = private_key(key);
        if let Some(&p) = self.by_private.get(&pk) {
            return Some(p);
        }
        // A reversed range is empty (no underflow: `span` is 0 and nothing is tried).
        let span = (u32::from(range.end) + 1).saturating_sub(u32::from(range.start));
        for i in 0..span {
            // Below `span`, so the port is within the range.
            let p = range.start + ((self.cursor + i) % span) as u16;
            let free = match self.by_port.get(&(key.proto, p)) {
                None => true,
                Some(b) => !b.conn.is_some_and(|h| conns.is_live(h, now)),
            };
            if free {
                if let Some(old) = self.by_port.remove(&(key.proto, p)) {
                    self.by_private.remove(&(
                        key.proto,
                        old.private_port,
                        old.remote_ip,
                        old.remote_port,
                    ));
                }
                self.cursor = (self.cursor + i + 1) % span;
                self.by_private.insert(pk, p);
                self.by_port.insert(
                    (key.proto, p),
                    Binding {
                        private_port: key.src_port,
                        remote_ip: key.dst_ip,
                        remote_port: key.dst_port,
                        conn: None,
                    },
                );
                return Some(p);
            }
        }
        None
    }

    /// Ties the mapping of `key`'s flow to its firewall connection once the
    /// firewall has opened it.
    pub fn bind(&mut self, key: &FlowKey, conn: Option<ConnHandle>) {
        let pk = private_key(key);
        if let Some(p) = self.by_private.get(&pk) {
            if let Some(b) = self.by_port.get_mut(&(key.proto, *p)) {
                b.conn = conn;
            }
        }
    }

    /// Forgets the mapping of a flow whose connection expired (`key`: guest as
    /// source, the connection's key).
    pub fn forget(&mut self, key: &FlowKey) {
        let pk = private_key(key);
        self.reply_from.remove(&pk);
        if let Some(p) = self.by_private.remove(&pk) {
            self.by_port.remove(&(key.proto, p));
        }
    }

    /// The private port an inbound packet from `remote_ip` (and `remote_port`,
    /// if it has ports: an echo reply has only the identifier) to SNAT port `port`
    /// is for.
    fn reverse(
        &self,
        proto: u8,
        port: u16,
        remote_ip: IpAddr,
        remote_port: Option<u16>,
    ) -> Option<u16> {
        let b = self.by_port.get(&(proto, port))?;
        let same_port = remote_port.is_none_or(|r| r == b.remote_port);
        (b.remote_ip == remote_ip && same_port).then_some(b.private_port)
    }
}

/// The outbound NAT decision for flow `key` (guest as source) to the internet
/// gateway: the source rewrite, a SNAT port allocated if the flow needs one. A flow
/// of a family the port has no external address of is refused
/// (`no_external_ip`), like a port without any.
pub fn outbound(
    ext: &ExternalIps,
    gw: Option<IgwId>,
    snat: &mut SnatTable,
    conns: &ConnTable,
    key: &FlowKey,
    now: u64,
) -> Result<SrcNat, DropReason> {
    let rewrite = match source(ext, gw, snat, conns, key, now)? {
        Source::Ready(r) => r,
        Source::Port(range) => {
            let port = snat
                .allocate(range, key, conns, now)
                .ok_or(DropReason::SnatExhausted)?;
            Rewrite::new(key.src_ip, key.src_port, range.ip, port)
        }
    };
    Ok(SrcNat {
        rewrite,
        quote: None,
    })
}

/// The outbound NAT decision for an ICMP error the guest sends to the internet
/// about a packet it received through NAT, `quoted` that packet's flow (the guest
/// as destination). The packet came in to an external address and port, which
/// the error must come from and quote, or the sender cannot match it to its
/// socket: the error's source becomes that address, and the quote's destination
/// that address and port. Nothing is allocated: a quote no NAT state explains is
/// `nat_no_mapping`.
pub fn outbound_icmp_error(
    ext: &ExternalIps,
    gw: Option<IgwId>,
    snat: &SnatTable,
    conns: &ConnTable,
    error: &FlowKey,
    quoted: &FlowKey,
    now: u64,
) -> Result<SrcNat, DropReason> {
    // The flow the quoted packet belongs to, as the guest's replies leave.
    let flow = quoted.reversed();
    if flow.src_ip != error.src_ip {
        return Err(DropReason::NatNoMapping);
    }
    let quote = match source(ext, gw, snat, conns, &flow, now)? {
        Source::Ready(r) => r,
        Source::Port(range) => {
            let port = *snat
                .by_private
                .get(&private_key(&flow))
                .ok_or(DropReason::NatNoMapping)?;
            Rewrite::new(flow.src_ip, flow.src_port, range.ip, port)
        }
    };
    Ok(SrcNat {
        rewrite: Rewrite::new(error.src_ip, error.src_port, quote.ip, error.src_port),
        quote: Some(quote),
    })
}

/// Where flow `key`'s source goes through NAT, short of a SNAT port.
enum Source<'a> {
    /// Decided: a 1:1 address, or the SNAT address alone for a flow without ports.
    Ready(Rewrite),
    /// The SNAT address, with a port of this range.
    Port(&'a SnatRange),
}

/// Where flow `key`'s source goes through gateway `gw` (`None`: any).
fn source<'a>(
    ext: &'a ExternalIps,
    gw: Option<IgwId>,
    snat: &SnatTable,
    conns: &ConnTable,
    key: &FlowKey,
    now: u64,
) -> Result<Source<'a>, DropReason> {
    let v4 = key.src_ip.is_ipv4();
    if let Some(default) = ext.one_to_one(v4, gw) {
        // A reply to a connection that came in to another 1:1 address leaves from
        // it, whichever gateway its route names: the peer knows it by that address.
        let ip = snat
            .reply_from
            .get(&private_key(key))
            .filter(|(a, h)| ext.is_one_to_one(*a) && conns.is_live(*h, now))
            .map_or(default, |(a, _)| *a);
        return Ok(Source::Ready(Rewrite::new(
            key.src_ip,
            key.src_port,
            ip,
            key.src_port,
        )));
    }
    let range = ext.snat_for(v4, gw).ok_or(DropReason::NoExternalIp)?;
    if !has_ports(key) {
        // Without ports (ICMP other than echo, other protocols) nothing can tell
        // the replies of two guests apart: only the address changes.
        return Ok(Source::Ready(Rewrite::new(
            key.src_ip,
            key.src_port,
            range.ip,
            key.src_port,
        )));
    }
    Ok(Source::Port(range))
}

/// Translates an ICMP error from outside (Packet Too Big, destination unreachable,
/// time exceeded...) to external address `m.dst_ip` back to the port's private
/// address, in `buf` (a copy of the IP frame `m` describes). It must quote a packet
/// the port sent through NAT, whose quoted source is translated too, so that path
/// MTU discovery works through NAT. Returns the translated packet's metadata, or
/// `None` if nothing maps (`nat_no_mapping`). Other packets from outside are
/// translated by [`inbound_target`] and [`rewrite`].
pub fn inbound_icmp_error(
    ext: &ExternalIps,
    private4: Option<Ipv4Addr>,
    private6: Option<Ipv6Addr>,
    snat: &SnatTable,
    m: &InnerMeta,
    buf: &mut [u8],
) -> Option<InnerMeta> {
    let private = private_of(m.dst_ip, private4, private6)?;
    icmp_error(ext, snat, m, private, buf)
}

/// Where an inbound packet to an external address goes: the port's private
/// address of the packet's family (not kept here: a flow-table entry holding this
/// stays small) and the private port, with the checksum changes worked out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InboundTarget {
    /// The private port (echo: identifier).
    pub port: u16,
    addr_delta: u16,
    port_delta: u16,
    /// It came in to a 1:1 address (see [`note_inbound`]).
    pub one_to_one: bool,
}

impl InboundTarget {
    /// The rewrite to `private`, the port's address of the family this was made for.
    pub fn rewrite(&self, private: IpAddr) -> Rewrite {
        Rewrite::with_deltas(private, self.port, (self.addr_delta, self.port_delta))
    }
}

/// The translation of packet `m` (not an ICMP error) from outside to one of the
/// port's external addresses: to a 1:1 address (floating, ephemeral) the port's
/// private address and the same port; to the SNAT address, the private port of the
/// flow that holds the SNAT port for this peer. `None` if nothing maps.
pub fn inbound_target(
    ext: &ExternalIps,
    private4: Option<Ipv4Addr>,
    private6: Option<Ipv6Addr>,
    snat: &SnatTable,
    m: &InnerMeta,
) -> Option<InboundTarget> {
    let private = private_of(m.dst_ip, private4, private6)?;
    let one_to_one = ext.is_one_to_one(m.dst_ip);
    let port = if one_to_one {
        local_port(m)
    } else {
        let port = local_port(m);
        let echo = is_echo_reply(m);
        let remote_port = (!echo).then_some(m.src_port);
        if !(matches!(m.proto, PROTO_TCP | PROTO_UDP) || echo) {
            return None;
        }
        snat_private_port(ext, snat, m.dst_ip, m.proto, port, m.src_ip, remote_port)?
    };
    let (addr_delta, port_delta) = Rewrite::new(m.dst_ip, local_port(m), private, port).deltas();
    Some(InboundTarget {
        port,
        addr_delta,
        port_delta,
        one_to_one,
    })
}

/// The port's private address of `to`'s family, if it has one.
pub fn private_of(
    to: IpAddr,
    private4: Option<Ipv4Addr>,
    private6: Option<Ipv6Addr>,
) -> Option<IpAddr> {
    match to {
        IpAddr::V4(_) => private4.map(IpAddr::V4),
        IpAddr::V6(_) => private6.map(IpAddr::V6),
    }
}

/// Remembers that the inbound connection of `key` (the translated packet's key,
/// admitted by the firewall) came in to 1:1 address `to`, if that is not the
/// address the port's flows leave from anyway, so that its replies leave from `to`.
/// Called for packets to 1:1 addresses only ([`inbound`] says which); costs a
/// lookup per packet of connections to a secondary one, nothing for the others.
pub fn note_inbound(
    ext: &ExternalIps,
    table: &mut SnatTable,
    conns: &ConnTable,
    key: &FlowKey,
    to: IpAddr,
    now: u64,
) {
    // Without gateway ties the port's flows of a family all leave from one
    // address: a connection to it needs no note. With them, the address depends
    // on the route, so every connection to a 1:1 address is noted.
    let default = ext.gateways.is_empty() && ext.one_to_one(to.is_ipv4(), None) == Some(to);
    if default || !ext.is_one_to_one(to) {
        return;
    }
    let ck = key.reversed();
    let pk = private_key(&ck);
    if table.reply_from.get(&pk).is_some_and(|(a, _)| *a == to) {
        return;
    }
    let Some(h) = conns.live_handle(&ck, now) else {
        return;
    };
    if table.reply_from.len() >= REPLY_FROM_MAX {
        table.reply_from.retain(|_, (_, h)| conns.is_live(*h, now));
        if table.reply_from.len() >= REPLY_FROM_MAX {
            return;
        }
    }
    table.reply_from.insert(pk, (to, h));
}

/// The private port SNAT port `port` of external address `ext_ip` stands for, for
/// a packet from `remote_ip` (and `remote_port`, if it has ports).
fn snat_private_port(
    ext: &ExternalIps,
    snat: &SnatTable,
    ext_ip: IpAddr,
    proto: u8,
    port: u16,
    remote_ip: IpAddr,
    remote_port: Option<u16>,
) -> Option<u16> {
    let s = ext.snat.as_ref().filter(|s| s.ip == ext_ip)?;
    if port < s.start || port > s.end {
        return None;
    }
    snat.reverse(proto, port, remote_ip, remote_port)
}

/// The ICMP error `m` (to external address `m.dst_ip`) translated in `buf`: its
/// destination becomes `private`, and the packet it quotes (which the port sent,
/// source = the external address) gets the private source address and port back,
/// with the quoted IPv4 header checksum and, as far as the quote holds it, the
/// quoted L4 checksum fixed. The error's own checksum is computed afresh over the
/// changed quote.
fn icmp_error(
    ext: &ExternalIps,
    snat: &SnatTable,
    m: &InnerMeta,
    private: IpAddr,
    buf: &mut [u8],
) -> Option<InnerMeta> {
    let (q, quoted) = quote_of(m, buf)?;
    if q.src_ip != m.dst_ip {
        return None;
    }
    let port = if ext.is_one_to_one(q.src_ip) {
        q.src_port
    } else if has_ports(&q) {
        let echo = is_echo(q.proto, q.icmp_type);
        let remote_port = (!echo).then_some(q.dst_port);
        snat_private_port(
            ext,
            snat,
            q.src_ip,
            q.proto,
            q.src_port,
            q.dst_ip,
            remote_port,
        )?
    } else {
        return None;
    };
    rewrite(buf, m, End::Dst, private, m.dst_port);
    rewrite(buf, &quoted, End::Src, private, port);
    icmp_checksum(buf, m, m.src_ip, private);
    Some(rewritten_meta(m, End::Dst, private, m.dst_port))
}

/// Whether `m` is an ICMP or ICMPv6 error message (which quotes a packet).
pub fn is_icmp_error(m: &InnerMeta) -> bool {
    match m.proto {
        PROTO_ICMP => wire::icmpv4::msg::is_error(m.icmp_type),
        PROTO_ICMPV6 => wire::icmpv6::msg::is_error(m.icmp_type),
        _ => false,
    }
}

fn is_echo_reply(m: &InnerMeta) -> bool {
    use wire::icmpv4::msg as v4;
    use wire::icmpv6::msg as v6;
    (m.proto == PROTO_ICMP && m.icmp_type == v4::ECHO_REPLY)
        || (m.proto == PROTO_ICMPV6 && m.icmp_type == v6::ECHO_REPLY)
}
