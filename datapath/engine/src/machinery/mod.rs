//! The generic machinery: what any packet engine built of layers needs, with no
//! VPC in it (OPTE's `opte` crate, where `vpc` is its `oxide-vpc`).
//!
//! What belongs here: the flow key and its hashes (`flow`), rules and their
//! predicates (`rule`), layers of rule tables (`layer`), the unified flow table and
//! the slab its entries live in (`uft`, `slab`), connection tracking with TCP state
//! (`conntrack`), the frames that wait for a next hop (`hold`), token buckets
//! (`ratelimit`) and drop counters (`counters`). None of it knows what a VPC, a
//! gateway, an external address or a route is: nothing here imports `frames`,
//! `vpc` or `pipeline`, so the policy can change without touching the machinery it
//! runs on.

pub mod conntrack;
pub mod counters;
pub mod flow;
pub mod hold;
pub mod layer;
pub mod ratelimit;
pub mod rule;
pub mod slab;
pub mod uft;
