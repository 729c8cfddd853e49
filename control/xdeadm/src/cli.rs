//! `xdeadm`'s command line, one room for each step of a command's trip: the words
//! it takes ([`grammar`], parsed by clap), what they ask ([`requests`]: an
//! [`Action`](requests::Action), mostly an API request), and how the answer is
//! printed ([`render`]: tables, text or JSON; the flow and layer dumps in `flows`,
//! `mtu` and `ra` in `mtu`, over the plain-text `layout` they share). The writer
//! verbs of `fleet` talk to the fleet's store instead of the daemon ([`fleet`]).
//!
//! It all lives in the library so tests can check that every verb builds the
//! request it should and that bad values are refused by name before anything is
//! sent.

pub mod fleet;
mod flows;
pub mod grammar;
mod layout;
mod mtu;
pub mod render;
pub mod requests;
