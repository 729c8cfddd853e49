//! Ethernet MAC addresses.

use core::fmt;
use core::str::FromStr;

/// A 48-bit IEEE 802 MAC address.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// ff:ff:ff:ff:ff:ff
    pub const BROADCAST: MacAddr = MacAddr([0xff; 6]);
    /// 00:00:00:00:00:00, never a valid destination.
    pub const ZERO: MacAddr = MacAddr([0; 6]);

    /// The group bit: set for broadcast and multicast destinations.
    pub fn is_multicast(&self) -> bool {
        self.0[0] & 1 == 1
    }

    pub fn is_broadcast(&self) -> bool {
        *self == Self::BROADCAST
    }

    /// A unicast address that is not all zeroes.
    pub fn is_unicast(&self) -> bool {
        !self.is_multicast() && *self != Self::ZERO
    }

    pub fn as_bytes(&self) -> &[u8; 6] {
        &self.0
    }

    /// The Ethernet multicast address an IPv6 multicast group maps to (RFC 2464 §7).
    pub fn from_ipv6_multicast(group: &std::net::Ipv6Addr) -> MacAddr {
        let o = group.octets();
        MacAddr([0x33, 0x33, o[12], o[13], o[14], o[15]])
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Why a MAC address string was refused; carries the string so errors name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseMacError(pub String);

impl fmt::Display for ParseMacError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid MAC address {:?}: expected six hex octets like a8:40:25:ff:00:01",
            self.0
        )
    }
}

impl std::error::Error for ParseMacError {}

impl FromStr for MacAddr {
    type Err = ParseMacError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseMacError(s.to_string());
        let mut out = [0u8; 6];
        let mut parts = s.split([':', '-']);
        for byte in &mut out {
            let p = parts.next().ok_or_else(err)?;
            if p.is_empty() || p.len() > 2 {
                return Err(err());
            }
            *byte = u8::from_str_radix(p, 16).map_err(|_| err())?;
        }
        if parts.next().is_some() {
            return Err(err());
        }
        Ok(MacAddr(out))
    }
}

/// MACs travel through the API and the state files as "aa:bb:cc:dd:ee:ff" strings.
impl serde::Serialize for MacAddr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for MacAddr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_display_round_trip() {
        let m: MacAddr = "a8:40:25:FF:00:01".parse().unwrap();
        assert_eq!(m.to_string(), "a8:40:25:ff:00:01");
        assert!(m.is_unicast());
    }

    #[test]
    fn rejects_bad_strings_naming_them() {
        for bad in [
            "",
            "a8:40:25:ff:00",
            "a8:40:25:ff:00:01:02",
            "zz:40:25:ff:00:01",
            "a8::25:ff:00:01",
        ] {
            let e = bad.parse::<MacAddr>().unwrap_err();
            assert!(e.to_string().contains(bad), "{e}");
        }
    }

    #[test]
    fn ipv6_multicast_mapping() {
        let g: std::net::Ipv6Addr = "ff02::1:ff00:1234".parse().unwrap();
        assert_eq!(
            MacAddr::from_ipv6_multicast(&g).to_string(),
            "33:33:ff:00:12:34"
        );
    }
}
