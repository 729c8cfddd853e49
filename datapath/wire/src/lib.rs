//! Zero-copy typed views over byte buffers, and emitters, for every header the
//! datapath reads or writes.
//!
//! Each protocol module has the same shape (after smoltcp's `wire`): a `Packet<T>`
//! view whose checked constructor rejects short buffers before any accessor can index
//! out of range, a private `field` module of byte ranges, a `Repr` value with
//! `parse`/`buffer_len`/`emit`, and tests with real packet bytes.
//!
//! Why hand-written rather than etherparse: the fast path rewrites headers in place
//! (MACs, lengths, sequence numbers, checksums patched by RFC 1624) and emits outer
//! headers from prebuilt templates into buffers it does not own; etherparse's slices
//! are read-only and its builders serialize whole packets. Its decoders serve instead
//! as the independent check in our tests (`parse_inner` is compared with etherparse on
//! generated frames, and the engine's pipeline tests decode what it emits with it).

mod bytes;
pub mod mac;
pub mod vnet;
pub mod vni;

pub use mac::MacAddr;
pub use vni::{Vni, VniError};

pub mod checksum;
pub mod meta;

// Protocol modules. Owners while the first slice is built: ethernet, ipv4, ipv6, udp,
// tcp, geneve and the parsers in `meta` (fast path); arp, icmpv4, icmpv6, ndp, dhcpv4,
// dhcpv6 (gateway slow path).
pub mod arp;
pub mod dhcpv4;
pub mod dhcpv6;
pub mod dns;
pub mod ethernet;
pub mod geneve;
pub mod icmpv4;
pub mod icmpv6;
pub mod ipv4;
pub mod ipv6;
pub mod ndp;
pub mod tcp;
pub mod udp;

/// Why a buffer could not be read as the header it should hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireError {
    /// Fewer bytes than the header (or its own length fields) require.
    Truncated,
    /// A field holds a value the format does not allow; the text names the field.
    Malformed(&'static str),
    /// A well-formed header of a kind this code does not handle.
    Unsupported(&'static str),
}

impl core::fmt::Display for WireError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            WireError::Truncated => write!(f, "truncated"),
            WireError::Malformed(what) => write!(f, "malformed {what}"),
            WireError::Unsupported(what) => write!(f, "unsupported {what}"),
        }
    }
}

impl std::error::Error for WireError {}

pub type Result<T> = core::result::Result<T, WireError>;
