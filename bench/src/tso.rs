//! A guest TSO buffer on an established VPC-internal flow, sent the two ways the
//! engine can: cut into underlay-sized segments (`tso::segment_with`: every byte
//! copied with its checksum computed) or as UDP-tunnel GSO super-frames that the
//! kernel cuts (`EngineConfig::underlay_tunnel_gso`: the headers written, the
//! payload copied once, no checksum pass). The engine's share of what
//! `--underlay-gso` changes; the kernel's share is measured end to end
//! (docs/benchmarks.md).

use crate::frames::{data_frame, FlowSpec};
use crate::sleds::{Sled, TwoSleds, NOW};
use engine::{TxBatch, TxDest, VnetHdr};
use wire::ipv4::protocol;
use wire::vnet::{F_NEEDS_CSUM, GSO_TCPV4};

/// TCP payload of the buffer: what a Linux guest hands over with a 64 KiB send
/// (65535 less its headers, rounded down to its MSS).
pub const PAYLOAD: usize = 63_712;
/// The guest's MSS (a 1500-byte link's; the engine cuts at the underlay's size).
const GUEST_MSS: u16 = 1448;

/// The two ways, as benchmark ids.
pub const WAYS: [(&str, bool); 2] = [("segmented", false), ("super_frames", true)];

/// One IPv4 TCP TSO buffer from sled A's guest, processed again and again.
pub struct TsoOut {
    sled: Sled,
    frame: Vec<u8>,
    vnet: VnetHdr,
    /// The frames each call must produce: how many, and whether super-frames.
    want: (usize, bool),
}

impl TsoOut {
    /// Sled A with or without tunnel GSO; its outbound flow compiled by a first
    /// buffer, then checked to produce `want` frames with nothing dropped.
    pub fn new(tunnel_gso: bool) -> Result<TsoOut, String> {
        let sleds = TwoSleds::with_tunnel_gso(tunnel_gso)?;
        let spec = FlowSpec::between(
            &sleds.a.cfg,
            &sleds.b.cfg,
            false,
            protocol::TCP,
            40000,
            5201,
        )
        .ok_or("the guests lack IPv4 addresses")?;
        let frame = data_frame(&spec, PAYLOAD)?;
        let vnet = VnetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: GSO_TCPV4,
            hdr_len: 54,
            gso_size: GUEST_MSS,
            csum_start: 34,
            csum_offset: 16,
        };
        // Eight segments of the 9000-byte underlay; a super-frame holds at most
        // seven within the outer IPv6 payload's 65535 bytes: spread as four and four.
        let want = if tunnel_gso { (2, true) } else { (8, false) };
        let mut t = TsoOut {
            sled: sleds.a,
            frame,
            vnet,
            want,
        };
        t.check()?;
        Ok(t)
    }

    /// The buffer through `process_guest` once; its frames are left in `out`.
    #[inline(never)]
    pub fn process(&mut self, out: &mut TxBatch) {
        let a = &mut self.sled;
        a.engine
            .process_guest(a.port, self.vnet, &self.frame, NOW, &a.routes, out);
    }

    /// Processes the buffer once and checks the frames it made and that the
    /// engine dropped nothing.
    pub fn check(&mut self) -> Result<(), String> {
        let mut out = TxBatch::new();
        self.process(&mut out);
        let (n, supers) = self.want;
        let kinds_ok = (0..out.len()).all(|i| match out.frame(i) {
            Some((TxDest::UnderlayGso { .. }, _)) => supers,
            Some((TxDest::Underlay { .. }, _)) => !supers,
            _ => false,
        });
        let st = self.sled.engine.stats();
        let drops: u64 = st.ports.iter().map(|p| p.drops.total()).sum::<u64>()
            + st.underlay_drops.total()
            + st.datapath_drops.total();
        if out.len() != n || !kinds_ok || drops != 0 {
            return Err(format!(
                "TSO buffer ({}): {} frames (want {n}, super-frames {supers}), {drops} drops",
                if supers { "super-frames" } else { "segmented" },
                out.len()
            ));
        }
        Ok(())
    }
}
