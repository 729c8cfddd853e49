//! DHCPv4 (RFC 2131/2132): the BOOTP header, the magic cookie and the option TLVs,
//! as far as a server that leases one fixed address needs them.
//!
//! Parsing decodes what a client sends (message type, requested address, server
//! identifier, parameter request list, hostname, ...). Emitting writes the server's
//! options in a fixed order: 53 message type, 54 server identifier, 51 lease time,
//! 1 subnet mask, 3 router, 121 classless static routes (RFC 3442), 26 interface MTU,
//! 6 DNS servers, 12 hostname, 15 domain name, 119 domain search (RFC 3397), 255 end.
//! The option walk is bounded by the buffer and stops at End; an option running past
//! the end is `Truncated`.

use crate::{dns, MacAddr, Result, WireError};
use core::fmt;
use std::net::Ipv4Addr;

/// Fixed BOOTP header plus the magic cookie.
pub const HEADER_LEN: usize = 240;
pub const MAGIC_COOKIE: [u8; 4] = [0x63, 0x82, 0x53, 0x63];
pub const OP_REQUEST: u8 = 1;
pub const OP_REPLY: u8 = 2;
/// The broadcast bit of the flags field (RFC 2131 §2).
pub const FLAG_BROADCAST: u16 = 0x8000;

/// Option codes.
pub mod opt {
    pub const PAD: u8 = 0;
    pub const SUBNET_MASK: u8 = 1;
    pub const ROUTER: u8 = 3;
    pub const DNS_SERVERS: u8 = 6;
    pub const HOSTNAME: u8 = 12;
    pub const DOMAIN_NAME: u8 = 15;
    pub const INTERFACE_MTU: u8 = 26;
    pub const REQUESTED_IP: u8 = 50;
    pub const LEASE_TIME: u8 = 51;
    pub const MESSAGE_TYPE: u8 = 53;
    pub const SERVER_ID: u8 = 54;
    pub const PARAMETER_REQUEST_LIST: u8 = 55;
    pub const DOMAIN_SEARCH: u8 = 119;
    pub const CLASSLESS_STATIC_ROUTE: u8 = 121;
    pub const END: u8 = 255;
}

mod field {
    use core::ops::Range;
    pub const OP: usize = 0;
    pub const HTYPE: usize = 1;
    pub const HLEN: usize = 2;
    pub const HOPS: usize = 3;
    pub const XID: Range<usize> = 4..8;
    pub const SECS: Range<usize> = 8..10;
    pub const FLAGS: Range<usize> = 10..12;
    pub const CIADDR: Range<usize> = 12..16;
    pub const YIADDR: Range<usize> = 16..20;
    pub const SIADDR: Range<usize> = 20..24;
    pub const GIADDR: Range<usize> = 24..28;
    pub const CHADDR: Range<usize> = 28..44;
    pub const COOKIE: Range<usize> = 236..240;
    pub const OPTIONS: usize = 240;
}

/// DHCP message type (option 53).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MessageType {
    Discover,
    Offer,
    Request,
    Decline,
    Ack,
    Nak,
    Release,
    Inform,
    Unknown(u8),
}

impl From<u8> for MessageType {
    fn from(v: u8) -> Self {
        match v {
            1 => MessageType::Discover,
            2 => MessageType::Offer,
            3 => MessageType::Request,
            4 => MessageType::Decline,
            5 => MessageType::Ack,
            6 => MessageType::Nak,
            7 => MessageType::Release,
            8 => MessageType::Inform,
            o => MessageType::Unknown(o),
        }
    }
}

impl From<MessageType> for u8 {
    fn from(m: MessageType) -> u8 {
        match m {
            MessageType::Discover => 1,
            MessageType::Offer => 2,
            MessageType::Request => 3,
            MessageType::Decline => 4,
            MessageType::Ack => 5,
            MessageType::Nak => 6,
            MessageType::Release => 7,
            MessageType::Inform => 8,
            MessageType::Unknown(v) => v,
        }
    }
}

/// A view of a DHCPv4 message (the UDP payload).
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps a buffer holding at least the BOOTP header and cookie.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < HEADER_LEN {
            Err(WireError::Truncated)
        } else {
            Ok(())
        }
    }

    fn ip_at(&self, r: core::ops::Range<usize>) -> Ipv4Addr {
        let b = &self.buffer.as_ref()[r];
        Ipv4Addr::new(b[0], b[1], b[2], b[3])
    }

    pub fn op(&self) -> u8 {
        self.buffer.as_ref()[field::OP]
    }
    pub fn hardware_type(&self) -> u8 {
        self.buffer.as_ref()[field::HTYPE]
    }
    pub fn hardware_len(&self) -> u8 {
        self.buffer.as_ref()[field::HLEN]
    }
    pub fn hops(&self) -> u8 {
        self.buffer.as_ref()[field::HOPS]
    }
    pub fn xid(&self) -> u32 {
        let b = &self.buffer.as_ref()[field::XID];
        u32::from_be_bytes([b[0], b[1], b[2], b[3]])
    }
    pub fn secs(&self) -> u16 {
        let b = &self.buffer.as_ref()[field::SECS];
        u16::from_be_bytes([b[0], b[1]])
    }
    pub fn flags(&self) -> u16 {
        let b = &self.buffer.as_ref()[field::FLAGS];
        u16::from_be_bytes([b[0], b[1]])
    }
    pub fn client_ip(&self) -> Ipv4Addr {
        self.ip_at(field::CIADDR)
    }
    pub fn your_ip(&self) -> Ipv4Addr {
        self.ip_at(field::YIADDR)
    }
    pub fn server_ip(&self) -> Ipv4Addr {
        self.ip_at(field::SIADDR)
    }
    pub fn relay_ip(&self) -> Ipv4Addr {
        self.ip_at(field::GIADDR)
    }
    /// The first 6 bytes of chaddr (the client's Ethernet address).
    pub fn client_hw_addr(&self) -> MacAddr {
        let mut m = [0u8; 6];
        m.copy_from_slice(&self.buffer.as_ref()[field::CHADDR][..6]);
        MacAddr(m)
    }
    pub fn magic_cookie(&self) -> [u8; 4] {
        let b = &self.buffer.as_ref()[field::COOKIE];
        [b[0], b[1], b[2], b[3]]
    }
    pub fn options(&self) -> &[u8] {
        &self.buffer.as_ref()[field::OPTIONS..]
    }
}

/// One option: code and value bytes (pad and end are consumed by the walk).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DhcpOption<'a> {
    pub code: u8,
    pub data: &'a [u8],
}

/// Walks options until End or the end of the buffer; an error ends the walk.
pub struct OptionIter<'a> {
    rest: &'a [u8],
}

pub fn options(opts: &[u8]) -> OptionIter<'_> {
    OptionIter { rest: opts }
}

impl<'a> Iterator for OptionIter<'a> {
    type Item = Result<DhcpOption<'a>>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            match self.rest {
                [] | [opt::END, ..] => {
                    self.rest = &[];
                    return None;
                }
                [opt::PAD, rest @ ..] => self.rest = rest,
                [code, len, rest @ ..] => {
                    let len = usize::from(*len);
                    let Some(data) = rest.get(..len) else {
                        self.rest = &[];
                        return Some(Err(WireError::Truncated));
                    };
                    let code = *code;
                    self.rest = &rest[len..];
                    return Some(Ok(DhcpOption { code, data }));
                }
                [_] => {
                    self.rest = &[];
                    return Some(Err(WireError::Truncated));
                }
            }
        }
    }
}

/// One classless static route (RFC 3442): destination/prefix_len via router
/// (0.0.0.0 = on-link).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClasslessRoute {
    pub destination: Ipv4Addr,
    pub prefix_len: u8,
    pub router: Ipv4Addr,
}

impl ClasslessRoute {
    /// Encoded size: width, the significant destination octets, the router.
    fn encoded_len(&self) -> usize {
        1 + usize::from(self.prefix_len.min(32)).div_ceil(8) + 4
    }
}

/// A DHCPv4 message. Parsing fills the fields a client sends; `dns_servers`,
/// `classless_routes` and `domain_search` are emitted only (empty on parse; a
/// client reads option 119 with [`crate::dns::parse_names`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Repr<'a> {
    pub op: u8,
    pub message_type: MessageType,
    pub xid: u32,
    pub secs: u16,
    pub broadcast: bool,
    pub client_ip: Ipv4Addr,
    pub your_ip: Ipv4Addr,
    pub server_ip: Ipv4Addr,
    pub relay_ip: Ipv4Addr,
    pub client_hw_addr: MacAddr,
    pub requested_ip: Option<Ipv4Addr>,
    pub server_identifier: Option<Ipv4Addr>,
    pub lease_time: Option<u32>,
    pub subnet_mask: Option<Ipv4Addr>,
    pub router: Option<Ipv4Addr>,
    pub classless_routes: &'a [ClasslessRoute],
    pub interface_mtu: Option<u16>,
    pub dns_servers: &'a [Ipv4Addr],
    pub hostname: Option<&'a str>,
    pub domain_name: Option<&'a str>,
    /// Option 119 (RFC 3397): the names one after the other, at most 255 bytes
    /// encoded (one option; no RFC 3396 splitting).
    pub domain_search: &'a [&'a str],
    pub parameter_request_list: Option<&'a [u8]>,
}

fn ip_opt(d: &[u8], what: &'static str) -> Result<Ipv4Addr> {
    match d {
        [a, b, c, e] => Ok(Ipv4Addr::new(*a, *b, *c, *e)),
        _ => Err(WireError::Malformed(what)),
    }
}

impl<'a> Repr<'a> {
    /// Decodes a message: Ethernet hardware addresses only, the magic cookie, a
    /// message type (53) present, and well-formed options.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Packet<&'a T>) -> Result<Repr<'a>> {
        p.check_len()?;
        if p.hardware_type() != 1 || p.hardware_len() != 6 {
            return Err(WireError::Unsupported("dhcp hardware type"));
        }
        if p.magic_cookie() != MAGIC_COOKIE {
            return Err(WireError::Malformed("dhcp magic cookie"));
        }
        let buf: &'a T = p.buffer;
        let mut r = Repr {
            op: p.op(),
            message_type: MessageType::Unknown(0),
            xid: p.xid(),
            secs: p.secs(),
            broadcast: p.flags() & FLAG_BROADCAST != 0,
            client_ip: p.client_ip(),
            your_ip: p.your_ip(),
            server_ip: p.server_ip(),
            relay_ip: p.relay_ip(),
            client_hw_addr: p.client_hw_addr(),
            requested_ip: None,
            server_identifier: None,
            lease_time: None,
            subnet_mask: None,
            router: None,
            classless_routes: &[],
            interface_mtu: None,
            dns_servers: &[],
            hostname: None,
            domain_name: None,
            domain_search: &[],
            parameter_request_list: None,
        };
        let mut have_type = false;
        for o in options(&buf.as_ref()[field::OPTIONS..]) {
            let o = o?;
            let d = o.data;
            match o.code {
                opt::MESSAGE_TYPE => {
                    let [t] = d else {
                        return Err(WireError::Malformed("dhcp message type length"));
                    };
                    r.message_type = MessageType::from(*t);
                    have_type = true;
                }
                opt::REQUESTED_IP => r.requested_ip = Some(ip_opt(d, "dhcp requested address")?),
                opt::SERVER_ID => r.server_identifier = Some(ip_opt(d, "dhcp server identifier")?),
                opt::SUBNET_MASK => r.subnet_mask = Some(ip_opt(d, "dhcp subnet mask")?),
                opt::ROUTER => {
                    // A list; the first router is the one that matters.
                    r.router = Some(ip_opt(d.get(..4).unwrap_or(d), "dhcp router")?);
                }
                opt::LEASE_TIME => {
                    let [a, b, c, e] = d else {
                        return Err(WireError::Malformed("dhcp lease time length"));
                    };
                    r.lease_time = Some(u32::from_be_bytes([*a, *b, *c, *e]));
                }
                opt::INTERFACE_MTU => {
                    let [a, b] = d else {
                        return Err(WireError::Malformed("dhcp interface mtu length"));
                    };
                    r.interface_mtu = Some(u16::from_be_bytes([*a, *b]));
                }
                opt::HOSTNAME => r.hostname = core::str::from_utf8(d).ok(),
                opt::DOMAIN_NAME => r.domain_name = core::str::from_utf8(d).ok(),
                opt::PARAMETER_REQUEST_LIST => r.parameter_request_list = Some(d),
                _ => {}
            }
        }
        if !have_type {
            return Err(WireError::Malformed("dhcp message type missing"));
        }
        Ok(r)
    }

    /// Bytes of the options area including End, or an error naming an option whose
    /// value does not fit its one-byte length.
    fn options_len(&self) -> Result<usize> {
        let mut n = 3 + 1; // message type, end
        let ip = |o: &Option<Ipv4Addr>| if o.is_some() { 6 } else { 0 };
        n += ip(&self.server_identifier)
            + ip(&self.requested_ip)
            + ip(&self.subnet_mask)
            + ip(&self.router);
        if self.lease_time.is_some() {
            n += 6;
        }
        if !self.classless_routes.is_empty() {
            let l: usize = self
                .classless_routes
                .iter()
                .map(ClasslessRoute::encoded_len)
                .sum();
            if l > 255 {
                return Err(WireError::Malformed("dhcp classless routes length"));
            }
            n += 2 + l;
        }
        if self.interface_mtu.is_some() {
            n += 4;
        }
        if !self.dns_servers.is_empty() {
            if self.dns_servers.len() > 63 {
                return Err(WireError::Malformed("dhcp dns servers count"));
            }
            n += 2 + 4 * self.dns_servers.len();
        }
        for (s, what) in [
            (self.hostname, "dhcp hostname length"),
            (self.domain_name, "dhcp domain name length"),
        ] {
            if let Some(s) = s {
                if s.is_empty() || s.len() > 255 {
                    return Err(WireError::Malformed(what));
                }
                n += 2 + s.len();
            }
        }
        if !self.domain_search.is_empty() {
            let l = dns::names_len(self.domain_search)?;
            if l > 255 {
                return Err(WireError::Malformed("dhcp domain search length"));
            }
            n += 2 + l;
        }
        if let Some(p) = self.parameter_request_list {
            if p.len() > 255 {
                return Err(WireError::Malformed("dhcp parameter request list length"));
            }
            n += 2 + p.len();
        }
        Ok(n)
    }

    /// Total message length, or why the message cannot be encoded.
    pub fn buffer_len(&self) -> Result<usize> {
        Ok(HEADER_LEN + self.options_len()?)
    }

    /// Writes the message; the buffer must be exactly `buffer_len()` long.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) -> Result<()> {
        let len = self.buffer_len()?;
        let b = p.buffer.as_mut();
        if b.len() != len {
            return Err(WireError::Truncated);
        }
        b[..HEADER_LEN].fill(0);
        b[field::OP] = self.op;
        b[field::HTYPE] = 1;
        b[field::HLEN] = 6;
        b[field::XID].copy_from_slice(&self.xid.to_be_bytes());
        b[field::SECS].copy_from_slice(&self.secs.to_be_bytes());
        let flags = if self.broadcast { FLAG_BROADCAST } else { 0 };
        b[field::FLAGS].copy_from_slice(&flags.to_be_bytes());
        b[field::CIADDR].copy_from_slice(&self.client_ip.octets());
        b[field::YIADDR].copy_from_slice(&self.your_ip.octets());
        b[field::SIADDR].copy_from_slice(&self.server_ip.octets());
        b[field::GIADDR].copy_from_slice(&self.relay_ip.octets());
        b[field::CHADDR][..6].copy_from_slice(&self.client_hw_addr.0);
        b[field::COOKIE].copy_from_slice(&MAGIC_COOKIE);
        let mut w = Writer {
            b: &mut b[field::OPTIONS..],
            at: 0,
        };
        w.opt(opt::MESSAGE_TYPE, &[u8::from(self.message_type)]);
        if let Some(a) = self.server_identifier {
            w.opt(opt::SERVER_ID, &a.octets());
        }
        if let Some(a) = self.requested_ip {
            w.opt(opt::REQUESTED_IP, &a.octets());
        }
        if let Some(t) = self.lease_time {
            w.opt(opt::LEASE_TIME, &t.to_be_bytes());
        }
        if let Some(a) = self.subnet_mask {
            w.opt(opt::SUBNET_MASK, &a.octets());
        }
        if let Some(a) = self.router {
            w.opt(opt::ROUTER, &a.octets());
        }
        if !self.classless_routes.is_empty() {
            let l: usize = self
                .classless_routes
                .iter()
                .map(ClasslessRoute::encoded_len)
                .sum();
            w.header(opt::CLASSLESS_STATIC_ROUTE, l);
            for r in self.classless_routes {
                let plen = r.prefix_len.min(32);
                let sig = usize::from(plen).div_ceil(8);
                w.bytes(&[plen]);
                w.bytes(&r.destination.octets()[..sig]);
                w.bytes(&r.router.octets());
            }
        }
        if let Some(m) = self.interface_mtu {
            w.opt(opt::INTERFACE_MTU, &m.to_be_bytes());
        }
        if !self.dns_servers.is_empty() {
            w.header(opt::DNS_SERVERS, 4 * self.dns_servers.len());
            for a in self.dns_servers {
                w.bytes(&a.octets());
            }
        }
        if let Some(s) = self.hostname {
            w.opt(opt::HOSTNAME, s.as_bytes());
        }
        if let Some(s) = self.domain_name {
            w.opt(opt::DOMAIN_NAME, s.as_bytes());
        }
        if !self.domain_search.is_empty() {
            w.header(opt::DOMAIN_SEARCH, dns::names_len(self.domain_search)?);
            w.names(self.domain_search)?;
        }
        if let Some(p) = self.parameter_request_list {
            w.opt(opt::PARAMETER_REQUEST_LIST, p);
        }
        w.bytes(&[opt::END]);
        Ok(())
    }
}

/// Appends options to a buffer that `options_len` sized.
struct Writer<'b> {
    b: &'b mut [u8],
    at: usize,
}

impl Writer<'_> {
    fn bytes(&mut self, d: &[u8]) {
        self.b[self.at..self.at + d.len()].copy_from_slice(d);
        self.at += d.len();
    }
    /// Domain names one after the other ([`dns::emit_names`]).
    fn names(&mut self, names: &[&str]) -> Result<()> {
        self.at += dns::emit_names(&mut self.b[self.at..], names)?;
        Ok(())
    }
    fn header(&mut self, code: u8, len: usize) {
        self.bytes(&[code, len as u8]);
    }
    fn opt(&mut self, code: u8, d: &[u8]) {
        self.header(code, d.len());
        self.bytes(d);
    }
}

impl fmt::Display for Repr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "DHCPv4 {:?} xid={:#010x} chaddr={} ciaddr={} yiaddr={}",
            self.message_type, self.xid, self.client_hw_addr, self.client_ip, self.your_ip
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// A DHCPREQUEST from scapy: BOOTP(op=1, xid=0x3903F326, chaddr=a8:40:25:ff:00:01)
    /// / DHCP(message-type request, server_id 172.30.0.1, requested_addr 172.30.0.5,
    /// param_req_list [1,3,6,12,15,26,28,119,121], end).
    fn request_bytes() -> Vec<u8> {
        let mut b = vec![0u8; 236];
        b[..4].copy_from_slice(&[1, 1, 6, 0]);
        b[4..8].copy_from_slice(&0x3903_f326u32.to_be_bytes());
        b[28..34].copy_from_slice(&[0xa8, 0x40, 0x25, 0xff, 0x00, 0x01]);
        b.extend(unhex(
            "638253633501033604ac1e00013204ac1e000537090103060c0f1a1c7779ff",
        ));
        b
    }

    #[test]
    fn parses_a_request_and_round_trips() {
        let b = request_bytes();
        let p = Packet::new_checked(&b[..]).unwrap();
        let r = Repr::parse(&p).unwrap();
        assert_eq!(r.message_type, MessageType::Request);
        assert_eq!(r.xid, 0x3903_f326);
        assert_eq!(r.client_hw_addr.to_string(), "a8:40:25:ff:00:01");
        assert_eq!(r.requested_ip, Some(Ipv4Addr::new(172, 30, 0, 5)));
        assert_eq!(r.server_identifier, Some(Ipv4Addr::new(172, 30, 0, 1)));
        assert_eq!(
            r.parameter_request_list,
            Some(&[1u8, 3, 6, 12, 15, 26, 28, 119, 121][..])
        );
        // Emit writes server id before requested address; parse is order-free.
        let mut out = vec![0u8; r.buffer_len().unwrap()];
        r.emit(&mut Packet::new_unchecked(&mut out[..])).unwrap();
        let back = Repr::parse(&Packet::new_checked(&out[..]).unwrap()).unwrap();
        assert_eq!(back, r);
        assert_eq!(out.len(), b.len());
    }

    #[test]
    fn server_options_encode_per_rfc() {
        let routes = [
            ClasslessRoute {
                destination: Ipv4Addr::new(172, 30, 0, 1),
                prefix_len: 32,
                router: Ipv4Addr::UNSPECIFIED,
            },
            ClasslessRoute {
                destination: Ipv4Addr::UNSPECIFIED,
                prefix_len: 0,
                router: Ipv4Addr::new(172, 30, 0, 1),
            },
        ];
        let req = request_bytes();
        let mut r = Repr::parse(&Packet::new_checked(&req[..]).unwrap()).unwrap();
        r.requested_ip = None;
        r.server_identifier = None;
        r.parameter_request_list = None;
        r.classless_routes = &routes;
        r.interface_mtu = Some(8500);
        r.domain_search = &["oxide.internal."];
        let mut out = vec![0u8; r.buffer_len().unwrap()];
        r.emit(&mut Packet::new_unchecked(&mut out[..])).unwrap();
        let opts = &out[240..];
        assert_eq!(
            opts,
            &unhex("350103790e20ac1e00010000000000ac1e00011a0221347710056f7869646508696e7465726e616c00ff")[..]
        );
        let back = Repr::parse(&Packet::new_checked(&out[..]).unwrap()).unwrap();
        assert_eq!(back.interface_mtu, Some(8500));
    }

    #[test]
    fn malformed_messages_are_refused() {
        let mut b = request_bytes();
        b[236] = 0;
        assert_eq!(
            Repr::parse(&Packet::new_checked(&b[..]).unwrap()).unwrap_err(),
            WireError::Malformed("dhcp magic cookie")
        );
        let mut b = request_bytes();
        b[241] = 200; // message type option claims 200 bytes
        assert_eq!(
            Repr::parse(&Packet::new_checked(&b[..]).unwrap()).unwrap_err(),
            WireError::Truncated
        );
        let mut b = request_bytes();
        b.truncate(240);
        b.push(opt::END);
        assert_eq!(
            Repr::parse(&Packet::new_checked(&b[..]).unwrap()).unwrap_err(),
            WireError::Malformed("dhcp message type missing")
        );
        assert_eq!(
            Packet::new_checked(&b[..239]).unwrap_err(),
            WireError::Truncated
        );
        let req = request_bytes();
        let mut r = Repr::parse(&Packet::new_checked(&req[..]).unwrap()).unwrap();
        let long = "x".repeat(256);
        r.hostname = Some(&long);
        assert_eq!(
            r.buffer_len().unwrap_err(),
            WireError::Malformed("dhcp hostname length")
        );
        r.hostname = None;
        r.domain_search = &["a..b"];
        assert!(r.buffer_len().is_err());
        let names = [
            "x".repeat(60),
            "y".repeat(60),
            "z".repeat(60),
            "w".repeat(60),
            "v".repeat(60),
        ];
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        r.domain_search = &names;
        assert_eq!(
            r.buffer_len().unwrap_err(),
            WireError::Malformed("dhcp domain search length")
        );
    }

    /// What a guest reads from an ACK: DNS servers (6), the domain (15) and a
    /// search list of several names (119), decoded by the option walk.
    #[test]
    fn dns_domain_and_search_list_round_trip() {
        let req = request_bytes();
        let mut r = Repr::parse(&Packet::new_checked(&req[..]).unwrap()).unwrap();
        r.op = OP_REPLY;
        r.message_type = MessageType::Ack;
        r.parameter_request_list = None;
        let dns = [Ipv4Addr::new(45, 55, 68, 2), Ipv4Addr::new(8, 8, 8, 8)];
        r.dns_servers = &dns;
        r.domain_name = Some("oxide.internal");
        r.domain_search = &["eng.oxide.internal", "oxide.internal", "example.com."];
        let mut out = vec![0u8; r.buffer_len().unwrap()];
        r.emit(&mut Packet::new_unchecked(&mut out[..])).unwrap();
        let back = Repr::parse(&Packet::new_checked(&out[..]).unwrap()).unwrap();
        assert_eq!(back.domain_name, Some("oxide.internal"));
        let opts: Vec<DhcpOption> = options(&out[HEADER_LEN..]).map(|o| o.unwrap()).collect();
        let find = |code| opts.iter().find(|o| o.code == code).unwrap().data;
        assert_eq!(find(opt::DNS_SERVERS), &unhex("2d37440208080808")[..]);
        assert_eq!(
            dns::parse_names(find(opt::DOMAIN_SEARCH)).unwrap(),
            ["eng.oxide.internal", "oxide.internal", "example.com"]
        );
    }
}
