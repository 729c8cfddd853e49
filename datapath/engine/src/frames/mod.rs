//! Frames in and out, and what is built between: a received frame in the pieces it
//! arrived in (`input`), the batch of frames a round produces and where each goes
//! (`output`), rewrites of addresses and ports with their checksums (`rewrite`),
//! Geneve encapsulation (`encap`) and tunneled TSO and coalescing (`tso`).
//!
//! What belongs here: code that reads, writes, cuts or merges the bytes of frames
//! for whoever decided what to do with them. It decides nothing about policy and
//! imports neither `vpc` nor `pipeline` (of the machinery, only the flow key's
//! protocol helpers and `summed_across_workers!`).

pub mod ecn;
pub mod encap;
pub mod input;
pub mod output;
pub mod rewrite;
pub mod tso;
