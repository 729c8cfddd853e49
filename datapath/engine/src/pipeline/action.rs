//! What a cached flow does with its packets: the compiled result of a port's layers
//! for one flow, per direction, as the unified flow table (`machinery::uft`) keeps
//! it, and what a frame waiting for its flow's next hop keeps.
//!
//! Outbound: deliver to a port of this sled (of this engine or another worker's),
//! encapsulate with a prebuilt outer header (and NAT's source rewrite), wait for the
//! underlay next hop, or drop. Inbound: who may send the flow (the overlay's trust),
//! deliver or drop, and NAT's translation for flows from outside.

use crate::drop::DropReason;
use crate::frames::encap::OuterTemplate;
use crate::frames::rewrite::SrcNat;
use crate::ids::{PortId, Vni};
use crate::machinery::flow::FlowKey;
use crate::machinery::uft::CachedAction;
use crate::vpc::nat::InboundTarget;
use crate::vpc::overlay::Sender;
use std::net::Ipv6Addr;
use wire::vnet::VnetHdr;
use wire::MacAddr;

/// What to do with every packet of an outbound flow.
#[derive(Clone, Debug)]
pub enum OutAction {
    /// To a guest on this sled: no encapsulation; the inner source MAC becomes that
    /// port's gateway MAC and the destination MAC the guest's.
    Local { port: PortId },
    /// To a guest of another worker of this sled (MAC `mac`): handed to that worker,
    /// which delivers it as `Local`.
    Sibling { worker: u16, mac: MacAddr },
    /// To another sled (or boundary services): encapsulate.
    Encap(Box<EncapAction>),
    /// To another sled whose underlay next hop is not known yet: the packet waits
    /// for it (`hold`). Never cached: the flow is compiled again, asking for the next
    /// hop, until it resolves.
    Unresolved(Box<EncapPlan>),
    /// Drop, counted under this reason.
    Drop(DropReason),
}

/// What to do with every packet of an inbound flow, and who may send it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InAction {
    /// Checked on every packet from the underlay before anything else: a frame from
    /// anyone else is dropped (`underlay_src_mismatch`) and leaves the entry as it was.
    pub sender: Sender,
    pub verdict: InVerdict,
    /// A flow from outside to one of the port's external addresses: cached under
    /// the key it arrives with, and translated to this private address and port
    /// (`crate::vpc::nat`), so a packet of it needs no lookup of the NAT tables.
    pub nat: Option<InboundTarget>,
}

/// The cached decision of an inbound flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InVerdict {
    /// Hand to the port's guest.
    Deliver,
    /// Drop, counted under this reason.
    Drop(DropReason),
}

impl CachedAction for OutAction {
    fn describe(&self) -> String {
        match self {
            OutAction::Local { port } => format!("local port {}", port.0),
            OutAction::Sibling { worker, mac } => format!("worker {worker} port {mac}"),
            OutAction::Encap(e) => format!(
                "encap vni {} to {} via ifindex {}{}{}",
                e.vni,
                e.underlay_dst,
                e.ifindex,
                if e.internal { "" } else { " (external)" },
                e.nat
                    .map(|n| format!(" nat src {} port {}", n.rewrite.ip, n.rewrite.port))
                    .unwrap_or_default()
            ),
            OutAction::Unresolved(p) => format!(
                "encap vni {} to {} (next hop unresolved)",
                p.vni, p.underlay_dst
            ),
            OutAction::Drop(r) => format!("drop {r}"),
        }
    }
}

impl CachedAction for InAction {
    fn describe(&self) -> String {
        let d = match self.verdict {
            InVerdict::Deliver => format!("deliver from {}", self.sender),
            InVerdict::Drop(r) => format!("drop {r} from {}", self.sender),
        };
        match self.nat {
            Some(t) => format!("{d}, nat to private port {}", t.port),
            None => d,
        }
    }
}

/// The cached encapsulation of one flow. Boxed in [`OutAction`] so that drop and
/// local entries stay small.
#[derive(Clone, Debug)]
pub struct EncapAction {
    pub outer: OuterTemplate,
    pub ifindex: u32,
    /// The inner destination MAC (the remote guest's).
    pub inner_dst_mac: MacAddr,
    /// VPC-internal: TCP is segmented to fit the underlay, not the guest MSS.
    pub internal: bool,
    /// For dumps.
    pub underlay_dst: Ipv6Addr,
    pub vni: u32,
    /// The source rewrite of a flow to the internet gateway (the NAT layer's).
    pub nat: Option<SrcNat>,
}

/// An encapsulation short of its underlay next hop: everything of an
/// [`EncapAction`] but the interface and the MACs.
#[derive(Clone, Copy, Debug)]
pub struct EncapPlan {
    pub underlay_dst: Ipv6Addr,
    pub vni: Vni,
    pub inner_dst_mac: MacAddr,
    pub internal: bool,
    pub udp_src_port: u16,
    pub flow_label: u32,
    /// The flow's hash (`FlowKey::hash64`, which also gives the UDP source port
    /// and flow label): picks the flow's next hop among several (ECMP).
    pub flow_hash: u64,
    /// The source rewrite of a flow to the internet gateway (the NAT layer's).
    pub nat: Option<SrcNat>,
}

impl EncapPlan {
    /// The plan for flow `key` to sled (or boundary services) `underlay_dst`; the
    /// outer UDP source port and flow label come from the flow.
    pub fn new(
        key: &FlowKey,
        underlay_dst: Ipv6Addr,
        vni: Vni,
        inner_dst_mac: MacAddr,
        internal: bool,
    ) -> Self {
        EncapPlan {
            underlay_dst,
            vni,
            inner_dst_mac,
            internal,
            udp_src_port: key.udp_src_port(),
            flow_label: key.flow_label(),
            flow_hash: key.hash64(),
            nat: None,
        }
    }
}

/// What a frame waiting for its next hop is kept with.
#[derive(Clone, Copy, Debug)]
pub struct HeldFrame {
    pub port: PortId,
    pub vnet: VnetHdr,
    pub plan: EncapPlan,
    pub path_mtu: u16,
}
