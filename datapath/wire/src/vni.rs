//! The Geneve Virtual Network Identifier that names a VPC: one type for the
//! engine, the API and everything between (the wire is where it is defined).

use core::fmt;
use serde::{Deserialize, Serialize};

/// A 24-bit Geneve Virtual Network Identifier; one per VPC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "u32", into = "u32")]
pub struct Vni(u32);

/// A number that does not fit a VNI's 24 bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VniError(pub u32);

impl fmt::Display for VniError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "VNI {} does not fit in 24 bits (max {})",
            self.0,
            Vni::MAX
        )
    }
}

impl std::error::Error for VniError {}

impl Vni {
    pub const MAX: u32 = (1 << 24) - 1;
    /// Boundary services' VNI unless configured otherwise (the reference's 99).
    pub const DEFAULT_BOUNDARY: Vni = Vni(99);

    /// Refuses values that do not fit 24 bits, naming the value.
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
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParseVniError {
    NotANumber(String),
    TooBig(VniError),
}

impl fmt::Display for ParseVniError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseVniError::NotANumber(s) => {
                write!(f, "invalid VNI {s:?}: expected a number below 2^24")
            }
            ParseVniError::TooBig(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for ParseVniError {}

impl From<VniError> for ParseVniError {
    fn from(e: VniError) -> ParseVniError {
        ParseVniError::TooBig(e)
    }
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
        assert_eq!(Vni::new(Vni::MAX).map(Vni::get), Ok(Vni::MAX));
        let e = Vni::new(1 << 24).unwrap_err();
        assert_eq!(e, VniError(1 << 24));
        assert_eq!(
            e.to_string(),
            "VNI 16777216 does not fit in 24 bits (max 16777215)"
        );
        assert_eq!("1701".parse::<Vni>().unwrap(), Vni::new(1701).unwrap());
        let e = "x".parse::<Vni>().unwrap_err().to_string();
        assert!(e.contains("\"x\""), "{e}");
        assert!("16777216"
            .parse::<Vni>()
            .unwrap_err()
            .to_string()
            .contains("16777216"));
    }

    #[test]
    fn vnis_are_numbers_in_json_and_checked_there() {
        assert_eq!(serde_json::to_string(&Vni::new(7).unwrap()).unwrap(), "7");
        let e = serde_json::from_str::<Vni>("16777216")
            .unwrap_err()
            .to_string();
        assert!(e.contains("16777216"), "{e}");
    }
}
