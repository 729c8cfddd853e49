//! The ground floor: the plain identifiers nearly every part of the engine names,
//! a VPC's [`Vni`] and a port's [`PortId`]. They import nothing else of the crate,
//! so any module may use them without pulling a layer of policy along.

use core::fmt;
use serde::{Deserialize, Serialize};

/// The engine's handle for a port; stable for the port's life, reused after deletion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PortId(pub u32);

/// A 24-bit Geneve Virtual Network Identifier; one per VPC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "u32", into = "u32")]
pub struct Vni(u32);

/// A value that is no VNI: it does not fit 24 bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("VNI {value} does not fit in 24 bits (max {max})", max = Vni::MAX)]
pub struct VniError {
    pub value: u32,
}

impl Vni {
    pub const MAX: u32 = (1 << 24) - 1;
    /// Boundary services' VNI unless configured otherwise (the reference's 99).
    pub const DEFAULT_BOUNDARY: Vni = Vni(99);

    /// Refuses values that do not fit 24 bits, naming the value.
    pub fn new(v: u32) -> Result<Vni, VniError> {
        if v > Self::MAX {
            Err(VniError { value: v })
        } else {
            Ok(Vni(v))
        }
    }

    pub fn get(self) -> u32 {
        self.0
    }
}

impl TryFrom<u32> for Vni {
    type Error = VniError;
    fn try_from(v: u32) -> Result<Self, VniError> {
        Vni::new(v)
    }
}

impl From<Vni> for u32 {
    fn from(v: Vni) -> u32 {
        v.0
    }
}

impl fmt::Display for Vni {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vni_is_24_bits_and_its_refusal_names_the_value() {
        assert_eq!(Vni::new(Vni::MAX).map(Vni::get), Ok(Vni::MAX));
        let e = Vni::new(1 << 24).unwrap_err();
        assert_eq!(e, VniError { value: 1 << 24 });
        assert_eq!(
            e.to_string(),
            "VNI 16777216 does not fit in 24 bits (max 16777215)"
        );
        assert!(serde_json::from_str::<Vni>("16777216").is_err());
        assert_eq!(serde_json::to_string(&Vni::new(7).unwrap()).unwrap(), "7");
    }
}
