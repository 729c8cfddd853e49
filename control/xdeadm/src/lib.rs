//! `xdeadm`, the admin tool of `overlayd`, as a library for its binary and tests:
//! its command line ([`cli`]), opteadm's command lines ([`opteadm`]) and the Router
//! Advertisement listener it runs inside a guest ([`ra_listen`]). It speaks to the
//! daemon through the `api` crate alone: no engine and no I/O layer of the daemon's.

#![forbid(unsafe_code)]

pub mod cli;
pub mod opteadm;
pub mod ra_listen;
