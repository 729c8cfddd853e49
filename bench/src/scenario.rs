//! The measured scenarios: one packet of an established flow (fast path) in each of
//! the 16 combinations {IPv4, IPv6} x {TCP, UDP} x {outbound, inbound} x {0, 1400-byte
//! payload}, and the first packet of a new outbound flow (slow path).
//!
//! Each fixture checks before it is measured that it really takes the path it claims
//! (flow-table hit or miss, counted by the engine's own stats; exactly one output frame
//! with the expected bytes), so a bench can never time a drop by mistake.

use crate::frames::{data_frame, set_src_port, FlowSpec};
use crate::sleds::{Sled, TwoSleds, IFINDEX, NOW};
use core::fmt;
use engine::UftStats;
use engine::{RxFrame, TxBatch, TxDest, VnetHdr};
use wire::ipv4::protocol;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IpVersion {
    V4,
    V6,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Tcp,
    Udp,
}

/// Which fast path: guest -> underlay (`process_guest`, encapsulation) or underlay ->
/// guest (`process_underlay` + `end_of_batch`, decapsulation and coalescing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    Out,
    In,
}

/// Payload sizes measured: a bare ACK-sized packet and a full 1500-MTU-sized one.
pub const PAYLOADS: [usize; 2] = [0, 1400];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scenario {
    pub ip: IpVersion,
    pub l4: Transport,
    pub dir: Dir,
    pub payload: usize,
}

impl Scenario {
    /// All 16 fast-path scenarios, in table order.
    pub fn all() -> Vec<Scenario> {
        let mut v = Vec::with_capacity(16);
        for dir in [Dir::Out, Dir::In] {
            for ip in [IpVersion::V4, IpVersion::V6] {
                for l4 in [Transport::Tcp, Transport::Udp] {
                    for payload in PAYLOADS {
                        v.push(Scenario {
                            ip,
                            l4,
                            dir,
                            payload,
                        });
                    }
                }
            }
        }
        v
    }

    /// The guest A -> guest B flow of this scenario.
    fn spec(&self, s: &TwoSleds) -> Result<FlowSpec, String> {
        let proto = match self.l4 {
            Transport::Tcp => protocol::TCP,
            Transport::Udp => protocol::UDP,
        };
        FlowSpec::between(
            &s.a.cfg,
            &s.b.cfg,
            self.ip == IpVersion::V6,
            proto,
            40000,
            5201,
        )
        .ok_or_else(|| format!("{self}: the guests lack an address of this family"))
    }
}

/// `ipv4/tcp/out/1400`: the benchmark id.
impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Through `pad`, so that width and alignment flags apply.
        f.pad(&format!(
            "{}/{}/{}/{}",
            match self.ip {
                IpVersion::V4 => "ipv4",
                IpVersion::V6 => "ipv6",
            },
            match self.l4 {
                Transport::Tcp => "tcp",
                Transport::Udp => "udp",
            },
            match self.dir {
                Dir::Out => "out",
                Dir::In => "in",
            },
            self.payload
        ))
    }
}

/// What the engine counted that tells hit from miss and delivery from drop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Counts {
    uft: UftStats,
    drops: u64,
}

fn counts(sled: &Sled, dir: Dir) -> Result<Counts, String> {
    let st = sled.engine.stats();
    let p = st
        .ports
        .iter()
        .find(|p| p.id == sled.port)
        .ok_or_else(|| format!("port {:?} missing from stats", sled.port))?;
    Ok(Counts {
        uft: match dir {
            Dir::Out => p.uft_out,
            Dir::In => p.uft_in,
        },
        drops: p.drops.total() + st.underlay_drops.total() + st.datapath_drops.total(),
    })
}

/// Runs guest `sled`'s frame through its engine and returns the one underlay frame it
/// produced.
fn send_from_guest(sled: &mut Sled, frame: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = TxBatch::new();
    sled.engine.process_guest(
        sled.port,
        VnetHdr::default(),
        frame,
        NOW,
        &sled.routes,
        &mut out,
    );
    match (out.len(), out.frame(0)) {
        (1, Some((TxDest::Underlay { ifindex: IFINDEX }, f))) => Ok(f.to_vec()),
        (n, f) => Err(format!(
            "{}: expected one underlay frame on ifindex {IFINDEX}, got {n} (first: {:?}); stats {:?}",
            sled.cfg.name,
            f.map(|(d, _)| d),
            sled.engine.stats()
        )),
    }
}

/// One packet of an established flow, ready to be processed again and again.
pub struct FastPath {
    pub scenario: Scenario,
    sleds: TwoSleds,
    /// The guest frame (outbound) or the underlay frame (inbound) fed each time.
    input: Vec<u8>,
    /// The frame the engine must emit for it.
    expected: Vec<u8>,
}

impl FastPath {
    /// Builds both sleds, establishes the flow the way a real connection would (guest
    /// B sends first, so B's firewall admits A's packets inbound; A's first packet
    /// compiles its outbound flow), obtains the underlay frame from sled A's engine,
    /// warms the receiving side, then checks one packet is a flow-table hit producing
    /// exactly the expected frame.
    pub fn new(scenario: Scenario) -> Result<FastPath, String> {
        let mut sleds = TwoSleds::new()?;
        let spec = scenario.spec(&sleds)?;
        let guest_frame = data_frame(&spec, scenario.payload)?;
        let reply = data_frame(&spec.reply_from(&sleds.b.cfg), 0)?;
        send_from_guest(&mut sleds.b, &reply)?;
        let underlay = send_from_guest(&mut sleds.a, &guest_frame)?;
        let um = wire::meta::parse_underlay(&underlay)
            .map_err(|d| format!("{scenario}: sled A emitted an invalid frame: {}", d.name()))?;
        let inner = underlay
            .get(um.inner_off..um.inner_end)
            .ok_or_else(|| format!("{scenario}: inner frame out of bounds"))?;
        // Encapsulation keeps the guest frame except the destination MAC, which
        // becomes the remote guest's.
        let mut want_inner = guest_frame.clone();
        want_inner[..6].copy_from_slice(sleds.b.cfg.guest_mac.as_bytes());
        if inner != want_inner.as_slice() {
            return Err(format!(
                "{scenario}: inner frame differs from the guest frame"
            ));
        }
        let (input, expected) = match scenario.dir {
            Dir::Out => (guest_frame, underlay),
            Dir::In => {
                // Delivery makes the frame come from the gateway.
                let mut delivered = want_inner;
                delivered[6..12].copy_from_slice(sleds.b.cfg.gateway_mac.as_bytes());
                (underlay, delivered)
            }
        };
        let mut fp = FastPath {
            scenario,
            sleds,
            input,
            expected,
        };
        let mut out = TxBatch::new();
        for _ in 0..4 {
            fp.process(&mut out);
            out.clear();
        }
        fp.check()?;
        Ok(fp)
    }

    /// One packet through the fast path. For inbound, also ends the batch so that a
    /// segment held by the coalescer is written out: every call leaves its frame in
    /// `out`. The caller clears `out` between calls (as a worker does between
    /// batches).
    ///
    /// Never inlined, so that a profiler sees one call per packet and can divide
    /// (docs/benchmarks.md, "Instruction counts"); the call costs about a nanosecond.
    #[inline(never)]
    pub fn process(&mut self, out: &mut TxBatch) {
        match self.scenario.dir {
            Dir::Out => {
                let a = &mut self.sleds.a;
                a.engine.process_guest(
                    a.port,
                    VnetHdr::default(),
                    &self.input,
                    NOW,
                    &a.routes,
                    out,
                );
            }
            Dir::In => {
                let b = &mut self.sleds.b;
                let pieces = [&self.input[..]];
                b.engine
                    .process_underlay(RxFrame::new(&pieces, 0), NOW, &b.routes, out);
                b.engine.end_of_batch(out);
            }
        }
    }

    /// The frame fed on each call: the guest frame (outbound) or the underlay frame
    /// sled A's engine produced for it (inbound).
    pub fn input(&self) -> &[u8] {
        &self.input
    }

    fn sled(&self) -> &Sled {
        match self.scenario.dir {
            Dir::Out => &self.sleds.a,
            Dir::In => &self.sleds.b,
        }
    }

    /// Processes one packet and checks it was a flow-table hit, dropped nothing, and
    /// produced exactly the expected frame to the expected destination.
    pub fn check(&mut self) -> Result<(), String> {
        let s = self.scenario;
        let before = counts(self.sled(), s.dir)?;
        let mut out = TxBatch::new();
        self.process(&mut out);
        let after = counts(self.sled(), s.dir)?;
        if after.uft.hits != before.uft.hits + 1 || after.uft.misses != before.uft.misses {
            return Err(format!(
                "{s}: not a flow-table hit (before {:?}, after {:?})",
                before.uft, after.uft
            ));
        }
        if after.drops != before.drops {
            return Err(format!("{s}: dropped: {:?}", self.sled().engine.stats()));
        }
        let want_dest = |d: &TxDest| match (s.dir, d) {
            (Dir::Out, TxDest::Underlay { ifindex }) => *ifindex == IFINDEX,
            (Dir::In, TxDest::Port { port, .. }) => *port == self.sleds.b.port,
            _ => false,
        };
        // Input 0 is the frame fed (inbound frames refer to it).
        let frames = out.to_vecs(&[&self.input[..]]).unwrap_or_default();
        match &frames[..] {
            [(d, f)] if want_dest(d) && f == &self.expected => Ok(()),
            f => Err(format!(
                "{s}: expected one frame equal to the reference ({} bytes), got {}: {:?}",
                self.expected.len(),
                f.len(),
                f.iter().map(|(d, f)| (d, f.len())).collect::<Vec<_>>()
            )),
        }
    }
}

/// The first packet of a new outbound flow: each call rewrites the source port, so
/// the flow table misses and the layers (firewall, router, V2P, underlay next hop,
/// outer template) compile the flow, which is then cached and encapsulated.
pub struct SlowPath {
    pub scenario: Scenario,
    sleds: TwoSleds,
    spec: FlowSpec,
    frame: Vec<u8>,
    next_port: u16,
}

/// Source ports used for new flows: `FIRST_PORT..FIRST_PORT + FLOWS_PER_SETUP`, then
/// the sleds are rebuilt ([`SlowPath::reset`]) so that tables never reach their
/// limits (eviction is a different cost) and ports are never reused.
const FIRST_PORT: u16 = 1024;
pub const FLOWS_PER_SETUP: u16 = 16384;

impl SlowPath {
    /// Outbound scenarios only (a new inbound flow is refused by the default
    /// firewall: measuring it would measure a drop).
    pub fn new(scenario: Scenario) -> Result<SlowPath, String> {
        if scenario.dir != Dir::Out {
            return Err(format!(
                "{scenario}: the slow path is measured outbound only"
            ));
        }
        let sleds = TwoSleds::new()?;
        let spec = scenario.spec(&sleds)?;
        let frame = data_frame(&spec, scenario.payload)?;
        let mut sp = SlowPath {
            scenario,
            sleds,
            spec,
            frame,
            next_port: FIRST_PORT,
        };
        sp.check()?;
        Ok(sp)
    }

    /// New flows left before [`SlowPath::reset`] is needed.
    pub fn remaining(&self) -> u64 {
        u64::from(FIRST_PORT + FLOWS_PER_SETUP - self.next_port)
    }

    /// Fresh sleds (empty tables), source ports from the start.
    pub fn reset(&mut self) -> Result<(), String> {
        self.sleds = TwoSleds::new()?;
        self.next_port = FIRST_PORT;
        Ok(())
    }

    /// Outbound flow-table misses so far on sled A.
    pub fn misses(&self) -> Result<u64, String> {
        Ok(counts(&self.sleds.a, Dir::Out)?.uft.misses)
    }

    /// The first packet of one new flow. Once [`SlowPath::remaining`] is zero the
    /// packet would repeat an old flow, so the caller resets first; a call made
    /// anyway processes nothing. Never inlined, as [`FastPath::process`].
    #[inline(never)]
    pub fn process(&mut self, out: &mut TxBatch) {
        if self.remaining() == 0 {
            return;
        }
        set_src_port(&self.spec, &mut self.frame, self.next_port);
        self.next_port += 1;
        let a = &mut self.sleds.a;
        a.engine
            .process_guest(a.port, VnetHdr::default(), &self.frame, NOW, &a.routes, out);
    }

    /// Processes one packet and checks it missed the flow table and was encapsulated.
    pub fn check(&mut self) -> Result<(), String> {
        let s = self.scenario;
        let before = counts(&self.sleds.a, Dir::Out)?;
        let mut out = TxBatch::new();
        self.process(&mut out);
        let after = counts(&self.sleds.a, Dir::Out)?;
        if after.uft.misses != before.uft.misses + 1 || after.drops != before.drops {
            return Err(format!(
                "{s}: not a clean flow-table miss (before {before:?}, after {after:?})"
            ));
        }
        match (out.len(), out.frame(0)) {
            (1, Some((TxDest::Underlay { ifindex: IFINDEX }, _))) => Ok(()),
            (n, f) => Err(format!(
                "{s}: expected one underlay frame, got {n}: {:?}",
                f.map(|(d, _)| d)
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every fast-path fixture builds and passes its own check (a hit, the exact
    /// frame), and keeps passing it.
    #[test]
    fn fast_path_fixtures_hit() {
        let all = Scenario::all();
        assert_eq!(all.len(), 16);
        for s in all {
            let mut fp = FastPath::new(s).unwrap_or_else(|e| panic!("{e}"));
            fp.check().unwrap_or_else(|e| panic!("{e}"));
        }
    }

    /// Every slow-path packet misses, across a reset too.
    #[test]
    fn slow_path_misses() {
        for s in Scenario::all().into_iter().filter(|s| s.dir == Dir::Out) {
            let mut sp = SlowPath::new(s).unwrap_or_else(|e| panic!("{e}"));
            let m0 = sp.misses().unwrap();
            let mut out = TxBatch::new();
            for _ in 0..10 {
                sp.process(&mut out);
            }
            assert_eq!(sp.misses().unwrap(), m0 + 10, "{s}");
            assert_eq!(out.len(), 10, "{s}");
            sp.reset().unwrap();
            sp.check().unwrap_or_else(|e| panic!("{e}"));
        }
        let inbound = Scenario {
            dir: Dir::In,
            ..Scenario::all()[0]
        };
        assert!(SlowPath::new(inbound).is_err());
    }
}
