//! The Geneve Virtual Network Identifier that names a VPC: the wire crate's
//! (shared with the engine, so the two sides of the daemon's edge agree on it by
//! construction).

pub use wire::vni::{ParseVniError, Vni, VniError};
