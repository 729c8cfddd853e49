//! The etcd of each test and the test PKI are the crate's own fixtures
//! (`fleet::testing`, feature `testing`), shared with `xdeadm fleet`'s tests.

pub use fleet::testing::{connect, Etcd, Pki, TIMEOUT};
