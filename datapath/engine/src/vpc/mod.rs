//! The VPC policy built on the machinery: what a guest port is (`port`), the virtual
//! gateway (`gateway`), the firewall's rules and which flows open a connection
//! (`firewall`; the connections are `machinery::conntrack`'s), the router (`router`),
//! NAT to the internet (`nat`), the overlay's tables, V2P (`overlay`) and V2B
//! (`v2b`), and guests moving between sleds (`moved`).
//!
//! What belongs here: the rules of an Oxide-style VPC, as OPTE's `oxide-vpc` holds
//! them. It uses the generic machinery (`machinery`) and the frame code (`frames`);
//! it never reaches up into the pipeline that drives it (`pipeline`).

pub mod firewall;
pub mod gateway;
pub mod moved;
pub mod nat;
pub mod overlay;
pub mod port;
pub mod router;
pub mod v2b;
