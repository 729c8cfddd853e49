//! The fast path of an established flow through the NAT layer (docs/nat.md): guest
//! A's TCP flow to an internet host through SNAT, outbound (source rewritten after
//! the flow-table hit) and inbound (an External frame from boundary services,
//! translated back to the private address). The same packet sizes as
//! [`crate::FastPath`]'s `ipv4/tcp/{out,in}/N`, which is the same flow without NAT
//! (to a guest of the VPC), so the two medians differ by what NAT costs.
//!
//! Sled B's address stands in for boundary services, so the one underlay
//! neighbour of sled A is the boundary.

use crate::frames::{data_frame, FlowSpec};
use crate::scenario::Dir;
use crate::sleds::{guest_port, mac, sled, Sled, IFINDEX, NOW};
use engine::OuterTemplate;
use engine::{EngineConfig, RxFrame, TxBatch, TxDest, VnetHdr};
use engine::{ExternalIps, SnatRange};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use wire::ipv4::protocol;

/// The SNAT address and the internet host of the fixture.
const SNAT_IP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
const INTERNET_HOST: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 9);

/// The NAT scenarios measured: the benchmark id (as `FastPath`'s without NAT) and
/// the fixture's arguments.
pub fn scenarios() -> Vec<(String, Dir, usize)> {
    let mut v = Vec::new();
    for (dir, name) in [(Dir::Out, "out"), (Dir::In, "in")] {
        for payload in crate::scenario::PAYLOADS {
            v.push((format!("ipv4/tcp/{name}/{payload}"), dir, payload));
        }
    }
    v
}

/// One packet of an established SNAT flow, processed again and again.
pub struct NatFastPath {
    pub dir: Dir,
    pub payload: usize,
    sled: Sled,
    input: Vec<u8>,
}

impl NatFastPath {
    /// Sled A with boundary services and guest A with a SNAT range; the flow is
    /// opened by guest A (so replies are admitted), its first reply delivered, and
    /// one packet checked to be a flow-table hit producing one frame.
    pub fn new(dir: Dir, payload: usize) -> Result<NatFastPath, String> {
        let addr = |n: u16| Ipv6Addr::new(0xfd00, 0x99, 0, 0, 0, 0, 0, n);
        let (ua, boundary) = (addr(1), addr(2));
        let mut ecfg = EngineConfig::new(ua);
        ecfg.boundary_services = Some(boundary);
        let mut cfg = guest_port(1)?;
        cfg.external = ExternalIps {
            snat: Some(SnatRange {
                ip: IpAddr::V4(SNAT_IP),
                start: 1024,
                end: 65535,
            }),
            ..ExternalIps::default()
        };
        let (ma, mb) = (mac("02:00:00:00:99:01")?, mac("02:00:00:00:99:02")?);
        let mut sled = sled(ecfg, ma, cfg.clone(), boundary, mb)?;
        let spec = FlowSpec {
            src_mac: cfg.guest_mac,
            dst_mac: cfg.gateway_mac,
            src_ip: IpAddr::V4(cfg.ipv4.ok_or("guest A has no IPv4 address")?),
            dst_ip: IpAddr::V4(INTERNET_HOST),
            proto: protocol::TCP,
            src_port: 40000,
            dst_port: 5201,
        };
        let out_frame = data_frame(&spec, payload)?;
        let mut out = TxBatch::new();
        let a = &mut sled;
        a.engine.process_guest(
            a.port,
            VnetHdr::default(),
            &out_frame,
            NOW,
            &a.routes,
            &mut out,
        );
        let Some((TxDest::Underlay { ifindex: IFINDEX }, left)) = out.frame(0) else {
            return Err(format!(
                "the NATed flow sent nothing: {:?}",
                a.engine.stats()
            ));
        };
        let snat_port = snat_port(left)?;
        // The internet host's reply, as boundary services hand it to sled A.
        let reply_spec = FlowSpec {
            src_mac: mac("02:00:00:00:00:42")?,
            dst_mac: cfg.guest_mac,
            src_ip: IpAddr::V4(INTERNET_HOST),
            dst_ip: IpAddr::V4(SNAT_IP),
            proto: protocol::TCP,
            src_port: 5201,
            dst_port: snat_port,
        };
        let inner = data_frame(&reply_spec, payload)?;
        let t = OuterTemplate::new(mb, ma, boundary, ua, 50000, 0, cfg.vni, true, false);
        let mut wrapped = TxBatch::new();
        t.encapsulate(
            &inner,
            None,
            TxDest::Underlay { ifindex: IFINDEX },
            &mut wrapped,
        );
        let underlay = wrapped
            .frame(0)
            .ok_or("the reply could not be encapsulated")?
            .1
            .to_vec();
        let input = match dir {
            Dir::Out => out_frame,
            Dir::In => underlay,
        };
        let mut fp = NatFastPath {
            dir,
            payload,
            sled,
            input,
        };
        for _ in 0..4 {
            out.clear();
            fp.process(&mut out);
        }
        fp.check()?;
        Ok(fp)
    }

    /// One packet through the fast path (inbound: and the end of the batch).
    #[inline(never)]
    pub fn process(&mut self, out: &mut TxBatch) {
        let s = &mut self.sled;
        match self.dir {
            Dir::Out => {
                s.engine.process_guest(
                    s.port,
                    VnetHdr::default(),
                    &self.input,
                    NOW,
                    &s.routes,
                    out,
                );
            }
            Dir::In => {
                let pieces = [&self.input[..]];
                s.engine
                    .process_underlay(RxFrame::new(&pieces, 0), NOW, &s.routes, out);
                s.engine.end_of_batch(out);
            }
        }
    }

    /// Processes one packet and checks it was a flow-table hit that dropped
    /// nothing and produced one frame where it should go.
    pub fn check(&mut self) -> Result<(), String> {
        let dir = self.dir;
        let hits = |s: &Sled| -> Result<(u64, u64), String> {
            let st = s.engine.stats();
            let p = st.ports.first().ok_or("no port in stats")?;
            let uft = match dir {
                Dir::Out => p.uft_out,
                Dir::In => p.uft_in,
            };
            Ok((uft.hits, p.drops.total() + st.underlay_drops.total()))
        };
        let before = hits(&self.sled)?;
        let mut out = TxBatch::new();
        self.process(&mut out);
        let after = hits(&self.sled)?;
        let dest_ok = match (self.dir, out.iter().next()) {
            (Dir::Out, Some((TxDest::Underlay { ifindex }, _))) => ifindex == IFINDEX,
            (Dir::In, Some((TxDest::Port { port, .. }, _))) => port == self.sled.port,
            _ => false,
        };
        if after != (before.0 + 1, before.1) || out.len() != 1 || !dest_ok {
            return Err(format!(
                "nat/{:?}/{}: not one delivered flow-table hit (hits, drops) {before:?} -> {after:?}, {} frames; {:?}",
                self.dir,
                self.payload,
                out.len(),
                self.sled.engine.stats()
            ));
        }
        Ok(())
    }
}

/// The TCP source port of the inner packet of underlay frame `f` (the SNAT port
/// the engine allocated).
fn snat_port(f: &[u8]) -> Result<u16, String> {
    let bad = || "the NATed frame does not parse".to_string();
    let um = wire::meta::parse_underlay(f).map_err(|_| bad())?;
    let inner = f.get(um.inner_off..um.inner_end).ok_or_else(bad)?;
    let m = wire::meta::parse_inner(inner).map_err(|_| bad())?;
    Ok(m.src_port)
}
