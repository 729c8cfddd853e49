//! Zero-copy typed views over byte buffers, and emitters, for every header the
//! datapath reads or writes.
//!
//! Each protocol module has the same shape (after smoltcp's `wire`): a `Packet<T>`
//! view whose checked constructor rejects short buffers before any accessor can index
//! out of range, a private `field` module of byte ranges, a `Repr` value with
//! `parse`/`buffer_len`/`emit`, and tests with real packet bytes.

pub mod mac;
pub mod vnet;

pub use mac::MacAddr;
