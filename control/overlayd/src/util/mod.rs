//! Small tools several parts of the daemon share, none of them about packets.

mod backoff;
mod doorbell;

pub use backoff::Backoff;
pub use doorbell::Doorbell;
