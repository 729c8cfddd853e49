//! Frames for a guest that did not take every offload (a vhost-user VM whose
//! driver negotiated no GUEST_TSO4/6 or GUEST_CSUM): what the engine hands a
//! guest port (coalesced GSO frames, a local guest's TSO buffer, partial
//! checksums, `DATA_VALID`) is made into frames it takes before it is written,
//! by the engine's own segmentation ([`engine::frames::tso::fit_guest`]). A tap
//! or an attached interface takes everything (its kernel does the rest).

use super::stats::WorkerStats;
use dpio::guest::GuestPort;
use engine::frames::tso::{fit_guest, GuestFit, GuestOffloads, TsoDrop};
use engine::{FrameBytes, PortId, TxBatch, TxDest, VnetHdr};

/// What a guest port's guest takes.
pub(super) fn offloads(tap: &GuestPort) -> GuestOffloads {
    match tap {
        GuestPort::Vhost(v) => {
            let t = v.guest_takes();
            GuestOffloads {
                csum: t.csum,
                tso4: t.tso4,
                tso6: t.tso6,
                ecn: t.ecn,
            }
        }
        GuestPort::Tap(_) | GuestPort::Attached(_) => GuestOffloads::ALL,
    }
}

/// A frame that could not be made into frames its guest takes (its header does
/// not match it): dropped, counted as `vhost_tx_unfit`.
#[derive(Debug, thiserror::Error)]
#[error("not made into frames the guest takes: {0}")]
pub(super) struct Unfit(pub(super) TsoDrop);

impl Unfit {
    /// Whether a write error is one.
    pub(super) fn is(e: &std::io::Error) -> bool {
        matches!(e.get_ref(), Some(i) if i.is::<Unfit>())
    }
}

/// Where a frame goes and what its guest takes.
pub(super) struct Guest<'a> {
    pub(super) tap: &'a GuestPort,
    pub(super) port: PortId,
    /// The port's MTU: the largest IP packet a segment may be.
    pub(super) mtu: u16,
}

impl Guest<'_> {
    /// How `vnet` goes to this guest.
    pub(super) fn fit(&self, vnet: &VnetHdr) -> GuestFit {
        offloads(self.tap).fit(vnet)
    }

    /// Writes contiguous `frame` under `vnet` to the guest, made into frames
    /// it takes first (in `remade`) when it does not take `vnet` as it is.
    /// Counts what was remade; an error is the last write's that failed, or an
    /// [`Unfit`].
    pub(super) fn write(
        &self,
        vnet: &VnetHdr,
        frame: &[u8],
        remade: &mut TxBatch<'static>,
        st: &mut WorkerStats,
    ) -> std::io::Result<()> {
        match self.fit(vnet) {
            GuestFit::AsIs => self.tap.write(vnet, frame),
            GuestFit::Header(h) => self.tap.write(&h, frame),
            GuestFit::Remake => self.remake(vnet, frame, remade, st),
        }
    }

    /// [`Self::write`] of a frame the guest does not take as it is.
    fn remake(
        &self,
        vnet: &VnetHdr,
        frame: &[u8],
        remade: &mut TxBatch<'static>,
        st: &mut WorkerStats,
    ) -> std::io::Result<()> {
        remade.clear();
        let offloads = offloads(self.tap);
        let n = fit_guest(frame, vnet, offloads, self.mtu, self.port, remade)
            .map_err(|d| std::io::Error::new(std::io::ErrorKind::InvalidData, Unfit(d)))?;
        if vnet.is_gso() {
            st.vhost_tx_segmented += 1;
            st.vhost_tx_segments += n as u64;
        } else {
            st.vhost_tx_csum_completed += 1;
        }
        let mut r = Ok(());
        for (dest, bytes) in remade.iter() {
            if let (TxDest::Port { vnet, .. }, FrameBytes::Own(b)) = (dest, bytes) {
                if let Err(e) = self.tap.write(&vnet, b) {
                    r = Err(e);
                }
            }
        }
        remade.clear();
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dpio::vhost::test_frontend::{connect, linux_features, plain_features, wait_for};
    use std::net::Ipv4Addr;
    use wire::checksum;
    use wire::vnet::{F_DATA_VALID, F_NEEDS_CSUM, GSO_TCPV4};

    const SRC: Ipv4Addr = Ipv4Addr::new(172, 30, 0, 5);
    const DST: Ipv4Addr = Ipv4Addr::new(172, 30, 0, 6);

    /// An IPv4 TCP frame of `payload` bytes, its TCP checksum field holding the
    /// pseudo-header sum (as a sender with NEEDS_CSUM leaves it).
    fn tcp_frame(payload: usize) -> Vec<u8> {
        let mut f = vec![0u8; 54 + payload];
        f[..6].copy_from_slice(&[0xa8, 0x40, 0x25, 0xff, 0, 1]);
        f[6..12].copy_from_slice(&[0xa8, 0x40, 0x25, 0, 0, 1]);
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        let ip = &mut f[14..34];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&((40 + payload) as u16).to_be_bytes());
        ip[6] = 0x40;
        ip[8] = 64;
        ip[9] = 6;
        ip[12..16].copy_from_slice(&SRC.octets());
        ip[16..20].copy_from_slice(&DST.octets());
        let c = !checksum::fold(checksum::sum(ip, 0));
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        let tcp = &mut f[34..54];
        tcp[0..4].copy_from_slice(&[0x9c, 0x40, 0x14, 0x51]);
        tcp[4..8].copy_from_slice(&1000u32.to_be_bytes());
        tcp[12] = 5 << 4;
        tcp[13] = 0x18;
        tcp[14..16].copy_from_slice(&501u16.to_be_bytes());
        for (i, b) in f[54..].iter_mut().enumerate() {
            *b = (i * 7) as u8;
        }
        let pseudo = checksum::pseudo_header_v4(SRC, DST, 6, (20 + payload) as u32);
        f[50..52].copy_from_slice(&checksum::fold(pseudo).to_be_bytes());
        f
    }

    /// Whether the IPv4 and TCP checksums of frame `f` verify.
    fn verifies(f: &[u8]) -> bool {
        let tcp_len = f.len() - 34;
        let pseudo = checksum::pseudo_header_v4(SRC, DST, 6, tcp_len as u32);
        checksum::fold(checksum::sum(&f[14..34], 0)) == 0xffff
            && checksum::fold(checksum::sum(&f[34..], pseudo)) == 0xffff
    }

    fn csum_hdr() -> VnetHdr {
        VnetHdr {
            flags: F_NEEDS_CSUM,
            csum_start: 34,
            csum_offset: 16,
            ..VnetHdr::default()
        }
    }

    /// A guest that took no offload (VERSION_1 alone, as a DPDK guest) gets a
    /// coalesced GSO frame as segments of at most its MTU, each in one receive
    /// buffer with complete checksums and no offload in its header; a partial
    /// checksum completed; DATA_VALID cleared. A Linux guest gets the same GSO
    /// frame as it is.
    #[test]
    fn a_guest_without_offloads_gets_segments_with_complete_checksums() {
        let (port, g) = connect("fit-plain", plain_features(), 1526);
        assert!(wait_for(|| port.is_up()), "the rings started");
        let tap = GuestPort::Vhost(port);
        let guest = Guest {
            tap: &tap,
            port: PortId(0),
            mtu: 1500,
        };
        let mut st = WorkerStats::default();
        let mut remade = TxBatch::new();
        let f = tcp_frame(5000);
        let gso = VnetHdr {
            gso_type: GSO_TCPV4,
            gso_size: 1448,
            hdr_len: 54,
            ..csum_hdr()
        };
        guest.write(&gso, &f, &mut remade, &mut st).unwrap();
        assert_eq!(g.rx_used(), 4, "5000 bytes in segments of 1448");
        let mut stream = Vec::new();
        for i in 0..4 {
            let b = g.received(i);
            assert_eq!(&b[..10], &[0u8; 10], "no offload in segment {i}'s header");
            assert_eq!(u16::from_le_bytes([b[10], b[11]]), 1, "one buffer");
            let seg = &b[12..];
            assert!(seg.len() - 14 <= 1500, "within the MTU");
            assert!(verifies(seg), "segment {i}'s checksums");
            stream.extend_from_slice(&seg[54..]);
        }
        assert_eq!(stream, f[54..], "the payload in order");
        assert_eq!((st.vhost_tx_segmented, st.vhost_tx_segments), (1, 4));

        // A partial checksum is completed; DATA_VALID is only cleared.
        let small = tcp_frame(100);
        guest
            .write(&csum_hdr(), &small, &mut remade, &mut st)
            .unwrap();
        let b = g.received(4);
        assert_eq!(&b[..10], &[0u8; 10]);
        assert!(verifies(&b[12..]));
        assert_eq!(st.vhost_tx_csum_completed, 1);
        let valid = VnetHdr {
            flags: F_DATA_VALID,
            ..VnetHdr::default()
        };
        let mut whole = small.clone();
        whole[50..52].copy_from_slice(&b[12 + 50..12 + 52]);
        guest.write(&valid, &whole, &mut remade, &mut st).unwrap();
        let b = g.received(5);
        assert_eq!(&b[..10], &[0u8; 10], "DATA_VALID cleared");
        assert_eq!(&b[12..], &whole[..]);

        // A header that does not match its frame is dropped as unfit.
        let lying = VnetHdr {
            csum_start: 20,
            ..csum_hdr()
        };
        let e = guest
            .write(&lying, &small, &mut remade, &mut st)
            .unwrap_err();
        assert!(Unfit::is(&e), "{e}");
        assert_eq!(g.rx_used(), 6, "nothing written");

        // A guest with GUEST_TSO4 takes the GSO frame as it is.
        let (port, g) = connect("fit-linux", linux_features(), 2048);
        assert!(wait_for(|| port.is_up()), "the rings started");
        let tap = GuestPort::Vhost(port);
        let guest = Guest { tap: &tap, ..guest };
        guest.write(&gso, &f, &mut remade, &mut st).unwrap();
        let b = g.received(0);
        assert_eq!(&b[..10], &gso.to_bytes()[..]);
        assert_eq!(
            u16::from_le_bytes([b[10], b[11]]),
            3,
            "over mergeable buffers"
        );
        assert_eq!(st.vhost_tx_segmented, 1, "not cut");
    }
}
