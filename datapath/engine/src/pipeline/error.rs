//! Why a management request was refused.

use core::fmt;
use serde::Serialize;

/// Why a management request was refused; the message names the bad value. A refused
/// request changes nothing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum EngineError {
    /// No port has this name.
    NoSuchPort(String),
    /// The request collides with existing state (a name, MAC, address or route).
    Conflict(String),
    /// A value is out of range or inconsistent.
    Invalid(String),
    /// The thing to remove or show does not exist.
    NotFound(String),
}

impl fmt::Display for EngineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EngineError::NoSuchPort(n) => write!(f, "no port named {n:?}"),
            EngineError::Conflict(m) | EngineError::Invalid(m) | EngineError::NotFound(m) => {
                f.write_str(m)
            }
        }
    }
}

impl std::error::Error for EngineError {}
