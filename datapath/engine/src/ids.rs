//! The ground floor: the plain identifiers nearly every part of the engine names,
//! a VPC's [`Vni`] and a port's [`PortId`]. They import nothing else of the crate,
//! so any module may use them without pulling a layer of policy along.

use serde::{Deserialize, Serialize};

/// The engine's handle for a port; stable for the port's life, reused after deletion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PortId(pub u32);

/// One of a port's internet gateways (OPTE's IGW id, a UUID as its 128 bits): a
/// route names the one it leaves by (`add-router-entry … ig=UUID`), and each
/// external address may serve only some of them ([`crate::ExternalIps`]).
/// Serialised in the UUID's text form, as the API names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct IgwId(pub u128);

impl core::str::FromStr for IgwId {
    type Err = String;
    /// 32 hex digits, dashes anywhere ignored (the UUID's text form).
    fn from_str(s: &str) -> Result<Self, String> {
        let hex: String = s.chars().filter(|c| *c != '-').collect();
        let bad = || format!("internet gateway id {s:?} is not a UUID");
        if hex.len() != 32 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(bad());
        }
        u128::from_str_radix(&hex, 16).map(IgwId).map_err(|_| bad())
    }
}

impl TryFrom<String> for IgwId {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl From<IgwId> for String {
    fn from(id: IgwId) -> String {
        id.to_string()
    }
}

impl core::fmt::Display for IgwId {
    /// The UUID's text form (8-4-4-4-12 hex digits).
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let v = self.0;
        write!(
            f,
            "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
            v >> 96,
            (v >> 80) & 0xffff,
            (v >> 64) & 0xffff,
            (v >> 48) & 0xffff,
            v & 0xffff_ffff_ffff
        )
    }
}

/// A VPC's 24-bit Geneve Virtual Network Identifier: the wire crate's, which the
/// API shares.
pub use wire::{Vni, VniError};

#[cfg(test)]
mod tests {
    use super::IgwId;

    #[test]
    fn gateway_ids_read_and_print_as_uuids() {
        let text = "0b8b2f6e-8b44-4a8e-9f5c-0d1c1d0e5b1a";
        let id: IgwId = text.parse().unwrap();
        assert_eq!(id.0, 0x0b8b2f6e_8b44_4a8e_9f5c_0d1c1d0e5b1a);
        assert_eq!(id.to_string(), text);
        assert_eq!(serde_json::to_string(&id).unwrap(), format!("\"{text}\""));
        for bad in [
            "0b8b2f6e",
            "",
            "0b8b2f6e-8b44-4a8e-9f5c-0d1c1d0e5b1g",
            "+b8b2f6e-8b44-4a8e-9f5c-0d1c1d0e5b1a",
        ] {
            let e = bad.parse::<IgwId>().unwrap_err();
            assert!(e.contains("not a UUID"), "{e}");
        }
    }
}
