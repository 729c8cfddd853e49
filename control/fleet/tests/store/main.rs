//! The store client against a real etcd (Debian's 3.4): each test starts a
//! member of its own ([`harness::Etcd`]), so they run in parallel.

mod harness;
mod lease;
mod snapshot;
mod tls;
mod watch;
mod write;
