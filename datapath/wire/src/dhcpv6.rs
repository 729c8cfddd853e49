//! DHCPv6 (RFC 8415): message type, transaction id and the option walk, with the
//! options a server that leases one fixed address needs: client/server identifier
//! (DUID), IA_NA with IAADDR, rapid commit, status code, DNS servers (RFC 3646 opt 23)
//! and domain list (opt 24).
//!
//! The option walk is bounded by the buffer; an option running past it is
//! `Truncated`. Parsing decodes what a client sends; DNS servers and the domain list
//! are emitted only.

use crate::{dns, MacAddr, Result, WireError};
use core::fmt;
use std::net::Ipv6Addr;

pub const HEADER_LEN: usize = 4;
/// "Infinity" for lifetimes and T1/T2 (RFC 8415 §7.7).
pub const INFINITY: u32 = 0xffff_ffff;

/// Option codes.
pub mod opt {
    pub const CLIENT_ID: u16 = 1;
    pub const SERVER_ID: u16 = 2;
    pub const IA_NA: u16 = 3;
    pub const IAADDR: u16 = 5;
    pub const STATUS_CODE: u16 = 13;
    pub const RAPID_COMMIT: u16 = 14;
    pub const DNS_SERVERS: u16 = 23;
    pub const DOMAIN_LIST: u16 = 24;
}

/// Message types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MessageType {
    Solicit,
    Advertise,
    Request,
    Confirm,
    Renew,
    Rebind,
    Reply,
    Release,
    Decline,
    InformationRequest,
    Unknown(u8),
}

impl From<u8> for MessageType {
    fn from(v: u8) -> Self {
        use MessageType::*;
        match v {
            1 => Solicit,
            2 => Advertise,
            3 => Request,
            4 => Confirm,
            5 => Renew,
            6 => Rebind,
            7 => Reply,
            8 => Release,
            9 => Decline,
            11 => InformationRequest,
            o => Unknown(o),
        }
    }
}

impl From<MessageType> for u8 {
    fn from(m: MessageType) -> u8 {
        use MessageType::*;
        match m {
            Solicit => 1,
            Advertise => 2,
            Request => 3,
            Confirm => 4,
            Renew => 5,
            Rebind => 6,
            Reply => 7,
            Release => 8,
            Decline => 9,
            InformationRequest => 11,
            Unknown(v) => v,
        }
    }
}

/// DUID-LL (RFC 8415 §11.4) of an Ethernet address: type 3, hardware type 1, MAC.
pub fn duid_ll(mac: MacAddr) -> [u8; 10] {
    let m = mac.0;
    [0, 3, 0, 1, m[0], m[1], m[2], m[3], m[4], m[5]]
}

/// A view of a DHCPv6 client/server message (the UDP payload).
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

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

    pub fn msg_type(&self) -> MessageType {
        self.buffer.as_ref()[0].into()
    }
    /// The 24-bit transaction id.
    pub fn transaction_id(&self) -> u32 {
        let b = self.buffer.as_ref();
        u32::from_be_bytes([0, b[1], b[2], b[3]])
    }
    pub fn options(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }
}

/// One option: code and value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dhcpv6Option<'a> {
    pub code: u16,
    pub data: &'a [u8],
}

/// Walks options (top level or inside IA_NA); an error ends the walk.
pub struct OptionIter<'a> {
    rest: &'a [u8],
}

pub fn options(opts: &[u8]) -> OptionIter<'_> {
    OptionIter { rest: opts }
}

impl<'a> Iterator for OptionIter<'a> {
    type Item = Result<Dhcpv6Option<'a>>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let r = match self.rest {
            [c0, c1, l0, l1, rest @ ..] => {
                let len = usize::from(u16::from_be_bytes([*l0, *l1]));
                match rest.get(..len) {
                    Some(data) => {
                        let code = u16::from_be_bytes([*c0, *c1]);
                        self.rest = &rest[len..];
                        return Some(Ok(Dhcpv6Option { code, data }));
                    }
                    None => Err(WireError::Truncated),
                }
            }
            _ => Err(WireError::Truncated),
        };
        self.rest = &[];
        Some(r)
    }
}

/// An identity association for non-temporary addresses with at most one address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IaNa {
    pub iaid: u32,
    pub t1: u32,
    pub t2: u32,
    pub address: Option<IaAddr>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IaAddr {
    pub addr: Ipv6Addr,
    pub preferred_lifetime: u32,
    pub valid_lifetime: u32,
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

fn parse_ia_na(d: &[u8]) -> Result<IaNa> {
    if d.len() < 12 {
        return Err(WireError::Malformed("dhcpv6 ia_na length"));
    }
    let mut ia = IaNa {
        iaid: be32(&d[0..4]),
        t1: be32(&d[4..8]),
        t2: be32(&d[8..12]),
        address: None,
    };
    for o in options(&d[12..]) {
        let o = o?;
        if o.code == opt::IAADDR && ia.address.is_none() {
            if o.data.len() < 24 {
                return Err(WireError::Malformed("dhcpv6 iaaddr length"));
            }
            let mut a = [0u8; 16];
            a.copy_from_slice(&o.data[..16]);
            ia.address = Some(IaAddr {
                addr: Ipv6Addr::from(a),
                preferred_lifetime: be32(&o.data[16..20]),
                valid_lifetime: be32(&o.data[20..24]),
            });
        }
    }
    Ok(ia)
}

/// A DHCPv6 message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Repr<'a> {
    pub msg_type: MessageType,
    pub transaction_id: u32,
    pub client_id: Option<&'a [u8]>,
    pub server_id: Option<&'a [u8]>,
    pub ia_na: Option<IaNa>,
    pub rapid_commit: bool,
    pub status_code: Option<u16>,
    pub dns_servers: &'a [Ipv6Addr],
    /// Option 24 (RFC 3646): the names one after the other.
    pub domain_list: &'a [&'a str],
}

impl<'a> Repr<'a> {
    /// Decodes a message; the first IA_NA counts, duplicates of single options are
    /// malformed.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Packet<&'a T>) -> Result<Repr<'a>> {
        p.check_len()?;
        let buf: &'a T = p.buffer;
        let mut r = Repr {
            msg_type: p.msg_type(),
            transaction_id: p.transaction_id(),
            client_id: None,
            server_id: None,
            ia_na: None,
            rapid_commit: false,
            status_code: None,
            dns_servers: &[],
            domain_list: &[],
        };
        for o in options(&buf.as_ref()[HEADER_LEN..]) {
            let o = o?;
            match o.code {
                opt::CLIENT_ID if r.client_id.is_some() => {
                    return Err(WireError::Malformed("dhcpv6 duplicate client id"));
                }
                opt::CLIENT_ID => r.client_id = Some(o.data),
                opt::SERVER_ID if r.server_id.is_some() => {
                    return Err(WireError::Malformed("dhcpv6 duplicate server id"));
                }
                opt::SERVER_ID => r.server_id = Some(o.data),
                opt::IA_NA if r.ia_na.is_none() => r.ia_na = Some(parse_ia_na(o.data)?),
                opt::RAPID_COMMIT => r.rapid_commit = true,
                opt::STATUS_CODE => {
                    let [a, b, ..] = o.data else {
                        return Err(WireError::Malformed("dhcpv6 status code length"));
                    };
                    r.status_code = Some(u16::from_be_bytes([*a, *b]));
                }
                _ => {}
            }
        }
        Ok(r)
    }

    pub fn buffer_len(&self) -> Result<usize> {
        let mut n = HEADER_LEN;
        for id in [self.client_id, self.server_id].into_iter().flatten() {
            if id.len() > usize::from(u16::MAX) {
                return Err(WireError::Malformed("dhcpv6 duid length"));
            }
            n += 4 + id.len();
        }
        if let Some(ia) = self.ia_na {
            n += 4 + 12 + if ia.address.is_some() { 4 + 24 } else { 0 };
        }
        if self.rapid_commit {
            n += 4;
        }
        if self.status_code.is_some() {
            n += 4 + 2;
        }
        if !self.dns_servers.is_empty() {
            n += 4 + 16 * self.dns_servers.len();
        }
        if !self.domain_list.is_empty() {
            n += 4 + dns::names_len(self.domain_list)?;
        }
        if n > usize::from(u16::MAX) {
            return Err(WireError::Malformed("dhcpv6 message length"));
        }
        Ok(n)
    }

    /// Writes the message (options in the order client id, server id, IA_NA, rapid
    /// commit, status code, DNS servers, domain list); the buffer must be exactly
    /// `buffer_len()` long.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) -> Result<()> {
        let len = self.buffer_len()?;
        let b = p.buffer.as_mut();
        if b.len() != len {
            return Err(WireError::Truncated);
        }
        b[0] = self.msg_type.into();
        b[1..4].copy_from_slice(&self.transaction_id.to_be_bytes()[1..]);
        let mut w = Writer { b, at: HEADER_LEN };
        if let Some(id) = self.client_id {
            w.opt(opt::CLIENT_ID, id);
        }
        if let Some(id) = self.server_id {
            w.opt(opt::SERVER_ID, id);
        }
        if let Some(ia) = self.ia_na {
            let inner = if ia.address.is_some() { 28 } else { 0 };
            w.header(opt::IA_NA, 12 + inner);
            w.bytes(&ia.iaid.to_be_bytes());
            w.bytes(&ia.t1.to_be_bytes());
            w.bytes(&ia.t2.to_be_bytes());
            if let Some(a) = ia.address {
                w.header(opt::IAADDR, 24);
                w.bytes(&a.addr.octets());
                w.bytes(&a.preferred_lifetime.to_be_bytes());
                w.bytes(&a.valid_lifetime.to_be_bytes());
            }
        }
        if self.rapid_commit {
            w.header(opt::RAPID_COMMIT, 0);
        }
        if let Some(s) = self.status_code {
            w.opt(opt::STATUS_CODE, &s.to_be_bytes());
        }
        if !self.dns_servers.is_empty() {
            w.header(opt::DNS_SERVERS, 16 * self.dns_servers.len());
            for a in self.dns_servers {
                w.bytes(&a.octets());
            }
        }
        if !self.domain_list.is_empty() {
            w.header(opt::DOMAIN_LIST, dns::names_len(self.domain_list)?);
            w.names(self.domain_list)?;
        }
        Ok(())
    }
}

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
    fn header(&mut self, code: u16, len: usize) {
        self.bytes(&code.to_be_bytes());
        self.bytes(&(len as u16).to_be_bytes());
    }
    fn opt(&mut self, code: u16, d: &[u8]) {
        self.header(code, d.len());
        self.bytes(d);
    }
}

impl fmt::Display for Repr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "DHCPv6 {:?} xid={:#08x} ia_na={:?} rapid_commit={}",
            self.msg_type, self.transaction_id, self.ia_na, self.rapid_commit
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

    /// scapy: DHCP6_Solicit(trid=0x5a1b2c) / DHCP6OptClientId(duid=DUID_LL(lladdr=
    /// a8:40:25:ff:00:01)) / DHCP6OptRapidCommit() / DHCP6OptIA_NA(iaid=0x0c0ffee0).
    const SOLICIT: &str =
        "015a1b2c0001000a00030001a84025ff0001000e00000003000c0c0ffee00000000000000000";

    #[test]
    fn parses_solicit_and_round_trips() {
        let b = unhex(SOLICIT);
        let p = Packet::new_checked(&b[..]).unwrap();
        let r = Repr::parse(&p).unwrap();
        assert_eq!(r.msg_type, MessageType::Solicit);
        assert_eq!(r.transaction_id, 0x5a1b2c);
        assert_eq!(
            r.client_id,
            Some(&duid_ll(MacAddr([0xa8, 0x40, 0x25, 0xff, 0, 1]))[..])
        );
        assert!(r.rapid_commit);
        assert_eq!(
            r.ia_na,
            Some(IaNa {
                iaid: 0x0c0f_fee0,
                t1: 0,
                t2: 0,
                address: None
            })
        );
        let mut out = vec![0u8; r.buffer_len().unwrap()];
        r.emit(&mut Packet::new_unchecked(&mut out[..])).unwrap();
        // Emit puts rapid commit after IA_NA; the option set is the same.
        assert_eq!(out.len(), b.len());
        assert_eq!(
            Repr::parse(&Packet::new_checked(&out[..]).unwrap()).unwrap(),
            r
        );
    }

    #[test]
    fn reply_with_address_dns_and_domains_round_trips() {
        let dns = ["2001:4860:4860::8888".parse().unwrap()];
        let r = Repr {
            msg_type: MessageType::Reply,
            transaction_id: 7,
            client_id: Some(&[0, 3, 0, 1, 1, 2, 3, 4, 5, 6]),
            server_id: Some(&[0, 3, 0, 1, 6, 5, 4, 3, 2, 1]),
            ia_na: Some(IaNa {
                iaid: 1,
                t1: INFINITY,
                t2: INFINITY,
                address: Some(IaAddr {
                    addr: "fd00::5".parse().unwrap(),
                    preferred_lifetime: INFINITY,
                    valid_lifetime: INFINITY,
                }),
            }),
            rapid_commit: true,
            status_code: Some(0),
            dns_servers: &dns,
            domain_list: &["oxide.internal", "eng.oxide.internal"],
        };
        let mut out = vec![0u8; r.buffer_len().unwrap()];
        r.emit(&mut Packet::new_unchecked(&mut out[..])).unwrap();
        let back = Repr::parse(&Packet::new_checked(&out[..]).unwrap()).unwrap();
        assert_eq!(
            back,
            Repr {
                dns_servers: &[],
                domain_list: &[],
                ..r
            }
        );
        assert!(out.ends_with(&unhex(
            "00180024056f7869646508696e7465726e616c0003656e67056f7869646508696e7465726e616c00"
        )));
        let opts: Vec<Dhcpv6Option> = options(&out[HEADER_LEN..]).map(|o| o.unwrap()).collect();
        let find = |code| opts.iter().find(|o| o.code == code).unwrap().data;
        assert_eq!(
            find(opt::DNS_SERVERS),
            &"2001:4860:4860::8888".parse::<Ipv6Addr>().unwrap().octets()[..]
        );
        assert_eq!(
            dns::parse_names(find(opt::DOMAIN_LIST)).unwrap(),
            ["oxide.internal", "eng.oxide.internal"]
        );
    }

    #[test]
    fn malformed_options_are_refused() {
        let b = unhex(SOLICIT);
        let p = Packet::new_checked(&b[..b.len() - 1]).unwrap();
        assert_eq!(Repr::parse(&p).unwrap_err(), WireError::Truncated);
        let mut d = b.clone();
        d.extend_from_slice(&[0, 1, 0, 0]); // second client id
        let p = Packet::new_checked(&d[..]).unwrap();
        assert_eq!(
            Repr::parse(&p).unwrap_err(),
            WireError::Malformed("dhcpv6 duplicate client id")
        );
        assert!(Packet::new_checked(&b[..3]).is_err());
    }
}
