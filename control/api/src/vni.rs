//! The Geneve Virtual Network Identifier that names a VPC.

use core::fmt;
use serde::{Deserialize, Serialize};

/// A 24-bit Geneve Virtual Network Identifier; one per VPC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "u32", into = "u32")]
pub struct Vni(u32);

/// A number that does not fit a VNI's 24 bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("VNI {0} does not fit in 24 bits (max {max})", max = Vni::MAX)]
pub struct VniError(pub u32);

impl Vni {
    pub const MAX: u32 = (1 << 24) - 1;

    /// Refuses values that do not fit 24 bits.
    pub fn new(v: u32) -> Result<Vni, VniError> {
        match v <= Self::MAX {
            true => Ok(Vni(v)),
            false => Err(VniError(v)),
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

/// A word that is not a VNI.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseVniError {
    #[error("invalid VNI {0:?}: expected a number below 2^24")]
    NotANumber(String),
    #[error(transparent)]
    TooBig(#[from] VniError),
}

impl core::str::FromStr for Vni {
    type Err = ParseVniError;
    fn from_str(s: &str) -> Result<Vni, ParseVniError> {
        let n: u32 = s
            .parse()
            .map_err(|_| ParseVniError::NotANumber(s.to_string()))?;
        Ok(Vni::new(n)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vnis_fit_24_bits_and_are_named_when_they_do_not() {
        assert_eq!(Vni::new(Vni::MAX).unwrap().get(), 16_777_215);
        assert!(Vni::new(1 << 24)
            .unwrap_err()
            .to_string()
            .contains("16777216"));
        assert_eq!("1701".parse::<Vni>().unwrap(), Vni::new(1701).unwrap());
        let e = "x".parse::<Vni>().unwrap_err().to_string();
        assert!(e.contains("\"x\""), "{e}");
        let e = serde_json::from_str::<Vni>("16777216")
            .unwrap_err()
            .to_string();
        assert!(e.contains("16777216"), "{e}");
    }
}
