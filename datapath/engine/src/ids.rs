//! The ground floor: the plain identifiers nearly every part of the engine names,
//! a VPC's [`Vni`] and a port's [`PortId`]. They import nothing else of the crate,
//! so any module may use them without pulling a layer of policy along.

use serde::{Deserialize, Serialize};

/// The engine's handle for a port; stable for the port's life, reused after deletion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PortId(pub u32);

/// A VPC's 24-bit Geneve Virtual Network Identifier: the wire crate's, which the
/// API shares.
pub use wire::{Vni, VniError};
