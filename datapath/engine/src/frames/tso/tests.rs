//! Tests of segmentation and coalescing. Checksums are verified with a naive RFC 1071
//! routine written here (independent of `wire::checksum` and of `copy_and_sum`), and
//! outer frames are validated with `wire::meta::parse_underlay`.

use super::*;
use crate::frames::input::RxFrame;
use crate::frames::output::TunnelGso;
use crate::ids::{PortId, Vni};
use proptest::prelude::*;
use wire::meta::{parse_inner, parse_underlay};
use wire::vnet::{
    F_DATA_VALID, F_NEEDS_CSUM, F_UDP_TUNNEL_CSUM, GSO_ECN, GSO_NONE, GSO_UDP, GSO_UDP_TUNNEL_IPV6,
};

const GUEST_MAC: [u8; 6] = [0xa8, 0x40, 0x25, 0xff, 0, 1];
const GW_MAC: [u8; 6] = [0xa8, 0x40, 0x25, 0, 0, 1];
const DST_GUEST_MAC: [u8; 6] = [0xa8, 0x40, 0x25, 0xff, 0, 2];
const UNDERLAY: TxDest = TxDest::Underlay { ifindex: 7 };
const TS_OPTS: [u8; 12] = [1, 1, 8, 10, 0, 0, 0, 9, 0, 0, 0, 3];

/// Naive one's-complement sum of 16-bit big-endian words, folded after every add.
fn naive_sum(data: &[u8]) -> u16 {
    let mut acc: u32 = 0;
    for c in data.chunks(2) {
        let w = if c.len() == 2 {
            u16::from_be_bytes([c[0], c[1]])
        } else {
            u16::from(c[0]) << 8
        };
        acc += u32::from(w);
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// Whether the TCP segment at `l4..end` of an IPv4/IPv6 packet at `l3` verifies.
fn tcp_verifies(f: &[u8], l3: usize, l4: usize, end: usize) -> bool {
    let mut v = pseudo_bytes(f, l3, l4, end);
    v.extend_from_slice(&f[l4..end]);
    naive_sum(&v) == 0xffff
}

fn be16(b: &[u8], i: usize) -> u16 {
    u16::from_be_bytes([b[i], b[i + 1]])
}
fn be32(b: &[u8], i: usize) -> u32 {
    u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// A guest TCP buffer as a Linux guest hands it over a tap.
#[derive(Clone, Debug)]
struct Spec {
    v6: bool,
    opts: Vec<u8>,
    payload: Vec<u8>,
    seq: u32,
    ack: u32,
    flags: u8,
    ip_id: u16,
    df: bool,
}

impl Spec {
    fn new(v6: bool, payload: Vec<u8>) -> Spec {
        Spec {
            v6,
            opts: TS_OPTS.to_vec(),
            payload,
            seq: 0xfffff000,
            ack: 77,
            flags: 0x10,
            ip_id: 0xfffe,
            df: true,
        }
    }

    fn ip_hdr(&self) -> usize {
        if self.v6 {
            40
        } else {
            20
        }
    }

    fn hdrs(&self) -> usize {
        14 + self.ip_hdr() + 20 + self.opts.len()
    }

    /// The frame, with the TCP checksum field holding the pseudo-header sum (what a
    /// guest with NEEDS_CSUM leaves there).
    fn build(&self) -> Vec<u8> {
        let mut f = Vec::new();
        f.extend_from_slice(&GW_MAC);
        f.extend_from_slice(&GUEST_MAC);
        let tcp_len = 20 + self.opts.len() + self.payload.len();
        if self.v6 {
            f.extend_from_slice(&[0x86, 0xdd, 0x60, 0x01, 0x23, 0x45]);
            f.extend_from_slice(&(tcp_len as u16).to_be_bytes());
            f.extend_from_slice(&[6, 64]);
            f.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5]);
            f.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 6]);
        } else {
            f.extend_from_slice(&[0x08, 0x00, 0x45, 0x00]);
            f.extend_from_slice(&((20 + tcp_len) as u16).to_be_bytes());
            f.extend_from_slice(&self.ip_id.to_be_bytes());
            f.extend_from_slice(&[if self.df { 0x40 } else { 0 }, 0, 64, 6, 0, 0]);
            f.extend_from_slice(&[172, 30, 0, 5, 172, 30, 0, 6]);
            let c = !naive_sum(&f[14..34]);
            f[24..26].copy_from_slice(&c.to_be_bytes());
        }
        let l4 = f.len();
        f.extend_from_slice(&[0x9c, 0x40, 0x14, 0x51]);
        f.extend_from_slice(&self.seq.to_be_bytes());
        f.extend_from_slice(&self.ack.to_be_bytes());
        f.push(((20 + self.opts.len()) / 4 * 16) as u8);
        f.push(self.flags);
        f.extend_from_slice(&[0x01, 0xf5, 0, 0, 0, 0]);
        f.extend_from_slice(&self.opts);
        f.extend_from_slice(&self.payload);
        let pseudo = pseudo_bytes(&f, 14, l4, f.len());
        f[l4 + 16..l4 + 18].copy_from_slice(&naive_sum(&pseudo).to_be_bytes());
        f
    }

    fn vnet(&self, gso_size: u16) -> VnetHdr {
        let mut gso_type = if self.v6 { GSO_TCPV6 } else { GSO_TCPV4 };
        if self.flags & TCP_CWR != 0 {
            gso_type |= GSO_ECN;
        }
        VnetHdr {
            flags: F_NEEDS_CSUM,
            gso_type,
            hdr_len: self.hdrs() as u16,
            gso_size,
            csum_start: (14 + self.ip_hdr()) as u16,
            csum_offset: 16,
        }
    }
}

fn pseudo_bytes(f: &[u8], l3: usize, l4: usize, end: usize) -> Vec<u8> {
    let mut v = Vec::new();
    if f[l3] >> 4 == 4 {
        v.extend_from_slice(&f[l3 + 12..l3 + 20]);
        v.extend_from_slice(&[0, 6]);
        v.extend_from_slice(&((end - l4) as u16).to_be_bytes());
    } else {
        v.extend_from_slice(&f[l3 + 8..l3 + 40]);
        v.extend_from_slice(&((end - l4) as u32).to_be_bytes());
        v.extend_from_slice(&[0, 0, 0, 6]);
    }
    v
}

fn template() -> OuterTemplate {
    template_with(false, false)
}

/// The test flow's outer headers, with the External option and the outer UDP
/// checksum as given.
fn template_with(external: bool, udp_checksum: bool) -> OuterTemplate {
    OuterTemplate::new(
        "02:00:00:00:00:01".parse().unwrap(),
        "02:00:00:00:00:02".parse().unwrap(),
        "fd00:1::1".parse().unwrap(),
        "fd00:2::1".parse().unwrap(),
        4242,
        77,
        Vni::new(1701).unwrap(),
        external,
        udp_checksum,
    )
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn run_segment(
    f: &[u8],
    vnet: &VnetHdr,
    seg: usize,
    mss: u32,
    out: &mut TxBatch,
) -> Result<usize, TsoDrop> {
    let meta = parse_inner(f).expect("test frame parses");
    segment(
        f,
        vnet,
        &meta,
        seg,
        mss,
        &template(),
        MacAddr(DST_GUEST_MAC),
        UNDERLAY,
        out,
    )
}

/// Checks every underlay frame of `out` against the rules and returns the inner frames.
fn check_segments(spec: &Spec, out: &TxBatch, mtu: usize, seg: usize, mss: u32) -> Vec<Vec<u8>> {
    let n = out.len();
    let mut inners = Vec::new();
    let mut stream = Vec::new();
    let (l3, l4, hdrs) = (14, 14 + spec.ip_hdr(), spec.hdrs());
    for (i, (dest, f)) in own_frames(out).into_iter().enumerate() {
        assert_eq!(dest, UNDERLAY);
        let f = &f[..];
        assert!(
            f.len() - 14 <= mtu,
            "outer IPv6 packet {} > MTU {mtu}",
            f.len() - 14
        );
        assert_eq!(
            be16(f, 18) as usize,
            f.len() - 54,
            "outer IPv6 payload length"
        );
        assert_eq!(be16(f, 58) as usize, f.len() - 54, "outer UDP length");
        let u = parse_underlay(f).expect("outer frame validates");
        assert_eq!(u.mss, Some(mss));
        assert_eq!(u.vni, 1701);
        assert_eq!(u.inner_off, 78);
        let inner = &f[u.inner_off..u.inner_end];
        assert_eq!(&inner[0..6], &DST_GUEST_MAC);
        assert_eq!(&inner[6..12], &GUEST_MAC);
        let p = &inner[hdrs..];
        if i + 1 < n {
            assert_eq!(p.len(), seg, "all but the last segment are full");
        } else {
            assert!(!p.is_empty() && p.len() <= seg);
        }
        if spec.v6 {
            assert_eq!(be16(inner, l3 + 4) as usize, inner.len() - l3 - 40);
        } else {
            assert_eq!(be16(inner, l3 + 2) as usize, inner.len() - l3);
            assert_eq!(be16(inner, l3 + 4), spec.ip_id.wrapping_add(i as u16));
            assert_eq!(naive_sum(&inner[l3..l4]), 0xffff, "IPv4 header checksum");
        }
        assert!(
            tcp_verifies(inner, l3, l4, inner.len()),
            "TCP checksum of segment {i}"
        );
        assert_eq!(
            be32(inner, l4 + 4),
            spec.seq.wrapping_add(stream.len() as u32)
        );
        let flags = inner[l4 + 13];
        let mut want = spec.flags;
        if i > 0 {
            want &= !TCP_CWR;
        }
        if i + 1 < n {
            want &= !(TCP_FIN | TCP_PSH);
        }
        assert_eq!(flags, want, "flags of segment {i}/{n}");
        // Everything else in the headers is the guest's.
        assert_eq!(&inner[l4 + 8..l4 + 13], &spec.build()[l4 + 8..l4 + 13]);
        assert_eq!(&inner[l4 + 14..l4 + 16], &spec.build()[l4 + 14..l4 + 16]);
        assert_eq!(&inner[l4 + 18..hdrs], &spec.build()[l4 + 18..hdrs]);
        stream.extend_from_slice(p);
        inners.push(inner.to_vec());
    }
    assert_eq!(stream, spec.payload, "segments reassemble to the buffer");
    inners
}

/// The frames of a batch that holds no gathered input (segmentation output).
fn own_frames(out: &TxBatch) -> Vec<(TxDest, Vec<u8>)> {
    out.to_vecs(&[]).expect("every frame in the batch's arena")
}

/// Size of the pieces the coalescer tests cut received frames into, as AF_XDP
/// chains do; odd, so that pieces also start at odd offsets of a payload.
const PIECE: usize = 777;

/// Pushes frame `f` (input number `input`, metadata `m`) to the coalescer in pieces,
/// as it would arrive.
fn push_frame(
    c: &mut Coalescer,
    f: &[u8],
    input: u32,
    m: &InnerMeta,
    mss: Option<u32>,
    out: &mut TxBatch,
) {
    let pieces: Vec<&[u8]> = f.chunks(PIECE).collect();
    c.push(
        PortId(3),
        RxFrame::new(&pieces, input),
        m,
        None,
        mss,
        MacAddr(GW_MAC),
        out,
    );
}

/// Pushes `frames` (no Mss option) as inputs `first`, `first + 1`, ...
fn push_frames(c: &mut Coalescer, frames: &[Vec<u8>], first: u32, out: &mut TxBatch) {
    for (i, f) in frames.iter().enumerate() {
        push_frame(c, f, first + i as u32, &parse_inner(f).unwrap(), None, out);
    }
}

/// `frames` as the coalescer's inputs 0, 1, ...
fn inputs(frames: &[Vec<u8>]) -> Vec<&[u8]> {
    frames.iter().map(|f| &f[..]).collect()
}

/// Feeds inner frames to a coalescer as the receiving sled would (input `i` is
/// `inners[i]`) and returns its output, references resolved.
fn coalesce(inners: &[Vec<u8>], mss: Option<u32>) -> (Vec<(TxDest, Vec<u8>)>, CoalesceStats) {
    let mut c = Coalescer::new();
    let mut out = TxBatch::new();
    for (i, f) in inners.iter().enumerate() {
        let meta = parse_inner(f).unwrap();
        push_frame(&mut c, f, i as u32, &meta, mss, &mut out);
    }
    c.flush(&mut out);
    let frames = out.to_vecs(&inputs(inners)).expect("references resolve");
    (frames, c.stats())
}

/// Completes a NEEDS_CSUM frame the way the guest's kernel would.
fn complete(f: &[u8], v: &VnetHdr) -> Vec<u8> {
    let mut g = f.to_vec();
    complete_checksum(&mut g, v).unwrap();
    g
}

fn check_coalesced(spec: &Spec, out: &[(TxDest, Vec<u8>)], mss: u32) {
    assert_eq!(
        out.len(),
        1,
        "segments of one buffer coalesce into one frame"
    );
    let (dest, f) = (out[0].0, &out[0].1[..]);
    let TxDest::Port { port, vnet } = dest else {
        panic!("not to a port: {dest:?}")
    };
    assert_eq!(port, PortId(3));
    let orig = spec.build();
    let (l4, hdrs) = (14 + spec.ip_hdr(), spec.hdrs());
    assert_eq!(&f[0..6], &DST_GUEST_MAC);
    assert_eq!(&f[6..12], &GW_MAC);
    assert_eq!(&f[hdrs..], &spec.payload[..]);
    if spec.payload.len() > mss as usize {
        let kind = if spec.v6 { GSO_TCPV6 } else { GSO_TCPV4 };
        let ecn = if spec.flags & TCP_CWR != 0 {
            GSO_ECN
        } else {
            0
        };
        assert_eq!(
            vnet,
            VnetHdr {
                flags: F_NEEDS_CSUM,
                gso_type: kind | ecn,
                hdr_len: hdrs as u16,
                gso_size: mss as u16,
                csum_start: l4 as u16,
                csum_offset: 16,
            }
        );
        // The guest's buffer exactly, checksum field included (pseudo-header sum).
        assert_eq!(&f[12..], &orig[12..]);
        assert!(tcp_verifies(&complete(f, &vnet), 14, l4, f.len()));
    } else {
        assert!(vnet.flags & F_DATA_VALID != 0 || vnet.flags & F_NEEDS_CSUM != 0);
        assert_eq!(vnet.gso_type, GSO_NONE);
        assert_eq!(&f[12..l4 + 16], &orig[12..l4 + 16]);
        assert_eq!(&f[l4 + 18..], &orig[l4 + 18..]);
        assert!(tcp_verifies(&complete(f, &vnet), 14, l4, f.len()));
    }
}

fn opts_strategy() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(vec![]),
        Just(TS_OPTS.to_vec()),
        // SACK blocks with timestamps: 40 bytes, the most TCP allows.
        Just({
            let mut v = TS_OPTS.to_vec();
            v.extend_from_slice(&[1, 1, 5, 26]);
            v.extend_from_slice(&[7; 24]);
            v
        }),
        Just(vec![1, 1, 1, 0]),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn segment_then_coalesce_round_trips(
        v6 in any::<bool>(),
        opts in opts_strategy(),
        len_frac in 0.0f64..1.0,
        seed in any::<u64>(),
        guest_mss in 88u16..9000,
        mtu in prop_oneof![Just(9000u16), 1280u16..9001],
        seq in any::<u32>(),
        ip_id in any::<u16>(),
        psh in any::<bool>(),
        fin in any::<bool>(),
        cwr in any::<bool>(),
        df in any::<bool>(),
    ) {
        let ip_hdr = if v6 { 0 } else { 20 };
        let max = 65535 - ip_hdr - 20 - opts.len();
        // Bias toward both tiny and maximal buffers.
        let len = (1.0 + len_frac.powi(2) * (max - 1) as f64) as usize;
        let mut spec = Spec::new(v6, pattern(seed, len));
        spec.opts = opts;
        spec.seq = seq;
        spec.ip_id = ip_id;
        spec.df = df;
        spec.flags = 0x10 | if psh { TCP_PSH } else { 0 } | if fin { TCP_FIN } else { 0 }
            | if cwr { TCP_CWR } else { 0 };
        let f = spec.build();
        let meta = parse_inner(&f).unwrap();
        let seg = internal_segment_size(mtu, &meta);
        let mut out = TxBatch::new();
        let n = run_segment(&f, &spec.vnet(guest_mss), seg, u32::from(guest_mss), &mut out).unwrap();
        prop_assert_eq!(n, out.len());
        prop_assert_eq!(n, len.div_ceil(seg));
        let inners = check_segments(&spec, &out, usize::from(mtu), seg, u32::from(guest_mss));
        let (c, stats) = coalesce(&inners, Some(u32::from(guest_mss)));
        check_coalesced(&spec, &c, u32::from(guest_mss));
        prop_assert_eq!(stats.frames_in, n as u64);
        prop_assert_eq!(stats.frames_out, 1);
        prop_assert_eq!(stats.merged, n as u64 - 1);
    }

    /// Whatever the metadata claims, segment() either emits frames that verify or
    /// refuses with nothing appended; it never panics.
    #[test]
    fn lying_metadata_never_panics_or_corrupts(
        v6 in any::<bool>(),
        len in 0usize..3000,
        flags in any::<u8>(),
        gso_type in any::<u8>(),
        hdr_len in any::<u16>(),
        gso_size in any::<u16>(),
        csum_start in 0u16..200,
        csum_offset in 0u16..40,
        l4_delta in -30i64..8,
        end_delta in -8i64..8,
        seg in 0usize..9000,
    ) {
        let spec = Spec::new(v6, pattern(len as u64, len));
        let f = spec.build();
        let mut meta = parse_inner(&f).unwrap();
        meta.l4_off = (meta.l4_off as i64 + l4_delta).max(0) as usize;
        meta.ip_end = (meta.ip_end as i64 + end_delta).max(0) as usize;
        let v = VnetHdr { flags, gso_type, hdr_len, gso_size, csum_start, csum_offset };
        let mut out = TxBatch::new();
        let r = segment(&f, &v, &meta, seg, 1448, &template(), MacAddr(DST_GUEST_MAC),
            UNDERLAY, &mut out);
        match r {
            Err(_) => prop_assert!(out.is_empty()),
            Ok(n) => {
                prop_assert_eq!(n, out.len());
                for (_, o) in own_frames(&out) {
                    prop_assert!(parse_underlay(&o).is_ok());
                }
            }
        }
    }

    /// The coalescer with metadata that disagrees with its frames never panics, and
    /// every frame it is given comes out (merged or not).
    #[test]
    fn coalescer_survives_lying_metadata(
        deltas in proptest::collection::vec((-30i64..30, -30i64..30, -30i64..30, any::<bool>()), 1..6),
        mss in proptest::option::of(0u32..70000),
    ) {
        let (frames, _) = flow_segments(false, &[700, 700, 700, 700, 700, 700], 1);
        let mut c = Coalescer::new();
        let mut out = TxBatch::new();
        for (i, (f, (d3, d4, dp, v6))) in frames.iter().zip(deltas.iter().cycle()).enumerate() {
            let mut m = parse_inner(f).unwrap();
            let shift = |x: usize, d: i64| (x as i64 + d).max(0) as usize;
            m.l3_off = shift(m.l3_off, *d3);
            m.l4_off = shift(m.l4_off, *d4);
            m.payload_off = shift(m.payload_off, *dp);
            if *v6 {
                m.l3 = L3::Ipv6;
            }
            push_frame(&mut c, f, i as u32, &m, mss, &mut out);
        }
        c.flush(&mut out);
        let s = c.stats();
        prop_assert_eq!(s.frames_in, 6);
        prop_assert_eq!(s.frames_out + s.merged, 6);
        prop_assert_eq!(out.len() as u64, s.frames_out);
        // Whatever was merged, every reference points into its input.
        prop_assert!(out.to_vecs(&inputs(&frames)).is_some());
    }

    #[test]
    fn copy_and_sum_matches_naive(data in proptest::collection::vec(any::<u8>(), 0..600)) {
        let mut dst = vec![0u8; data.len()];
        let s = checksum::copy_and_sum(&mut dst, &data, 0);
        prop_assert_eq!(&dst, &data);
        // 0 and 0xffff are the same number in one's complement.
        let (a, b) = (checksum::fold(s), naive_sum(&data));
        prop_assert!(a == b || (a | b) == 0xffff && (a & b) == 0, "{:x} {:x}", a, b);
    }
}

#[test]
fn segment_sizes_from_the_mtu_budget() {
    let v4ts = parse_inner(&Spec::new(false, vec![0; 10]).build()).unwrap();
    assert_eq!(internal_segment_size(9000, &v4ts), 8870);
    let v6ts = parse_inner(&Spec::new(true, vec![0; 10]).build()).unwrap();
    assert_eq!(internal_segment_size(9000, &v6ts), 8850);
    let mut plain = Spec::new(false, vec![0; 10]);
    plain.opts.clear();
    let v4 = parse_inner(&plain.build()).unwrap();
    assert_eq!(internal_segment_size(9000, &v4), 8882);
    assert_eq!(internal_segment_size(100, &v4), 0);
}

#[test]
fn the_worked_example_fills_the_underlay_exactly() {
    // IPv4 + TCP timestamps at 9000: 8870-byte segments, UDP length 8960, IPv6 9000.
    let spec = Spec::new(false, pattern(1, 3 * 8870));
    let f = spec.build();
    let seg = internal_segment_size(9000, &parse_inner(&f).unwrap());
    let mut out = TxBatch::new();
    assert_eq!(
        run_segment(&f, &spec.vnet(8448), seg, 8448, &mut out),
        Ok(3)
    );
    for (_, o) in own_frames(&out) {
        assert_eq!(o.len() - 14, 9000);
        assert_eq!(be16(&o, 58), 8960);
    }
}

#[test]
fn one_segment_payload_is_one_plain_packet() {
    for (len, frames) in [(8870, 1), (8871, 2), (1, 1)] {
        let spec = Spec::new(false, pattern(len as u64, len));
        let f = spec.build();
        let mut out = TxBatch::new();
        assert_eq!(
            run_segment(&f, &spec.vnet(1448), 8870, 1448, &mut out),
            Ok(frames)
        );
        check_segments(&spec, &out, 9000, 8870, 1448);
    }
}

#[test]
fn gso_size_larger_than_payload() {
    let spec = Spec::new(true, pattern(3, 500));
    let mut out = TxBatch::new();
    assert_eq!(
        run_segment(&spec.build(), &spec.vnet(8948), 8850, 8948, &mut out),
        Ok(1)
    );
    check_segments(&spec, &out, 9000, 8850, 8948);
}

#[test]
fn gso_size_one_is_bounded() {
    let big = Spec::new(false, pattern(4, 60000));
    let mut out = TxBatch::new();
    assert_eq!(
        run_segment(&big.build(), &big.vnet(1), 8870, 1, &mut out),
        Err(TsoDrop::TooManySegments)
    );
    assert!(out.is_empty());
    // Within the bound the buffer is sent; the option says 1 as the guest did.
    let small = Spec::new(false, pattern(4, MAX_SEGMENTS));
    assert_eq!(
        run_segment(&small.build(), &small.vnet(1), 8870, 1, &mut out),
        Ok(1)
    );
    // A tiny segment size is bounded too.
    out.clear();
    assert_eq!(
        run_segment(&big.build(), &big.vnet(1448), 20, 1448, &mut out),
        Err(TsoDrop::TooManySegments)
    );
}

#[test]
fn ecn_cwr_only_on_the_first_segment_fin_psh_only_on_the_last() {
    let mut spec = Spec::new(true, pattern(5, 20000));
    spec.flags = 0x10 | TCP_CWR | TCP_PSH | TCP_FIN | 0x40;
    let mut out = TxBatch::new();
    assert_eq!(
        run_segment(&spec.build(), &spec.vnet(1400), 8850, 1400, &mut out),
        Ok(3)
    );
    let inners = check_segments(&spec, &out, 9000, 8850, 1400);
    let l4 = 54;
    assert_eq!(inners[0][l4 + 13], 0x10 | TCP_CWR | 0x40);
    assert_eq!(inners[1][l4 + 13], 0x10 | 0x40);
    assert_eq!(inners[2][l4 + 13], 0x10 | 0x40 | TCP_PSH | TCP_FIN);
}

#[test]
fn inconsistent_metadata_is_a_named_drop() {
    let spec = Spec::new(false, pattern(6, 3000));
    let f = spec.build();
    let good = spec.vnet(1448);
    let cases: Vec<(VnetHdr, TsoDrop)> = vec![
        (
            VnetHdr {
                gso_type: GSO_UDP,
                ..good
            },
            TsoDrop::BadGsoType,
        ),
        (
            VnetHdr {
                gso_type: 0x7f,
                ..good
            },
            TsoDrop::BadGsoType,
        ),
        (
            VnetHdr {
                gso_type: GSO_TCPV6,
                ..good
            },
            TsoDrop::GsoIpMismatch,
        ),
        (
            VnetHdr {
                hdr_len: f.len() as u16 + 1,
                ..good
            },
            TsoDrop::HdrLenMismatch,
        ),
        (
            VnetHdr {
                csum_start: 14,
                ..good
            },
            TsoDrop::CsumStartMismatch,
        ),
        (
            VnetHdr {
                csum_offset: 6,
                ..good
            },
            TsoDrop::CsumOffsetOutOfRange,
        ),
        (
            VnetHdr {
                gso_size: 0,
                ..good
            },
            TsoDrop::GsoSizeZero,
        ),
    ];
    for (v, want) in cases {
        let mut out = TxBatch::new();
        assert_eq!(
            run_segment(&f, &v, 8870, 1448, &mut out),
            Err(want),
            "{v:?}"
        );
        assert!(out.is_empty());
    }
    let mut out = TxBatch::new();
    assert_eq!(
        run_segment(&f, &good, 0, 1448, &mut out),
        Err(TsoDrop::SegmentSizeZero)
    );
    // Metadata of a longer frame than the one given.
    let meta = parse_inner(&f).unwrap();
    let r = segment(
        &f[..f.len() - 1],
        &good,
        &meta,
        8870,
        1448,
        &template(),
        MacAddr(DST_GUEST_MAC),
        UNDERLAY,
        &mut out,
    );
    assert_eq!(r, Err(TsoDrop::Truncated));
    // A GSO header on a UDP datagram.
    let mut udp = f.clone();
    udp[23] = 17;
    let mut m = meta;
    m.proto = 17;
    let r = segment(
        &udp,
        &good,
        &m,
        8870,
        1448,
        &template(),
        MacAddr(DST_GUEST_MAC),
        UNDERLAY,
        &mut out,
    );
    assert_eq!(r, Err(TsoDrop::GsoNotTcp));
    assert!(out.is_empty());
    // Names are distinct counter names, each a TSO reason of the one vocabulary.
    let names: std::collections::BTreeSet<_> = TsoDrop::ALL
        .iter()
        .map(std::string::ToString::to_string)
        .collect();
    assert_eq!(names.len(), TsoDrop::ALL.len());
    assert!(names.iter().all(|n| n.starts_with("tso_")), "{names:?}");
}

#[test]
fn non_gso_frames_get_their_checksum_completed() {
    let spec = Spec::new(true, pattern(7, 999));
    let f = spec.build();
    let v = VnetHdr {
        flags: F_NEEDS_CSUM,
        gso_type: GSO_NONE,
        csum_start: 54,
        csum_offset: 16,
        ..VnetHdr::default()
    };
    let mut out = TxBatch::new();
    assert_eq!(run_segment(&f, &v, 8850, 0, &mut out), Ok(1));
    let o = out.frame(0).unwrap().1;
    assert_eq!(out.len(), 1);
    let u = parse_underlay(o).unwrap();
    assert_eq!(u.mss, None);
    assert_eq!(u.inner_off, 70);
    let inner = &o[70..];
    assert_eq!(&inner[..6], &DST_GUEST_MAC);
    assert!(tcp_verifies(inner, 14, 54, inner.len()));
    assert_eq!(&inner[12..70], &f[12..70]);
    assert_eq!(&inner[72..], &f[72..]);

    // The same in place, for same-sled delivery.
    let mut g = f.clone();
    complete_checksum(&mut g, &v).unwrap();
    assert_eq!(&g[14..], &inner[14..]);
    let far = VnetHdr {
        csum_offset: 2000,
        ..v
    };
    assert_eq!(
        complete_checksum(&mut g, &far),
        Err(TsoDrop::CsumOffsetOutOfRange)
    );
    let beyond = VnetHdr {
        csum_start: 5000,
        ..v
    };
    assert_eq!(
        complete_checksum(&mut g, &beyond),
        Err(TsoDrop::CsumStartMismatch)
    );
    // Without NEEDS_CSUM nothing changes.
    let before = g.clone();
    complete_checksum(&mut g, &VnetHdr::default()).unwrap();
    assert_eq!(g, before);
}

/// Segments of one flow as a sender without TSO (or another sled) would send them.
fn flow_segments(v6: bool, sizes: &[usize], first_seq: u32) -> (Vec<Vec<u8>>, Vec<u8>) {
    let mut seq = first_seq;
    let mut frames = Vec::new();
    let mut all = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        let mut s = Spec::new(v6, pattern(i as u64 + 100, n));
        s.seq = seq;
        s.ip_id = 10 + i as u16;
        let mut f = s.build();
        let l4 = 14 + s.ip_hdr();
        let end = f.len();
        let c = !naive_sum(
            &[pseudo_bytes(&f, 14, l4, end), {
                let mut t = f[l4..].to_vec();
                t[16] = 0;
                t[17] = 0;
                t
            }]
            .concat(),
        );
        f[l4 + 16..l4 + 18].copy_from_slice(&c.to_be_bytes());
        assert!(tcp_verifies(&f, 14, l4, end));
        seq = seq.wrapping_add(n as u32);
        all.extend_from_slice(&s.payload);
        frames.push(f);
    }
    (frames, all)
}

#[test]
fn coalesces_without_mss_option_using_the_first_segment_size() {
    let (frames, all) = flow_segments(false, &[1448, 1448, 1448, 100], 5);
    let (out, stats) = coalesce(&frames, None);
    assert_eq!(out.len(), 1);
    let (dest, f) = (out[0].0, &out[0].1[..]);
    let TxDest::Port { vnet, .. } = dest else {
        unreachable!()
    };
    assert_eq!((vnet.gso_type, vnet.gso_size), (GSO_TCPV4, 1448));
    assert_eq!(&f[66..], &all[..]);
    assert_eq!(be16(f, 16) as usize, f.len() - 14);
    assert_eq!(be16(f, 18), 10, "IPv4 ID of the first segment");
    assert_eq!(naive_sum(&f[14..34]), 0xffff);
    assert!(tcp_verifies(&complete(f, &vnet), 14, 34, f.len()));
    assert_eq!(
        stats,
        CoalesceStats {
            frames_in: 4,
            frames_out: 1,
            merged: 3,
            gso_frames_out: 1
        }
    );
}

#[test]
fn a_single_large_segment_becomes_gso_for_the_guest() {
    let (frames, _) = flow_segments(true, &[8850], 1);
    let (out, _) = coalesce(&frames, Some(1440));
    let (dest, f) = (out[0].0, &out[0].1[..]);
    let TxDest::Port { vnet, .. } = dest else {
        unreachable!()
    };
    assert_eq!(
        (vnet.gso_type, vnet.gso_size, vnet.flags),
        (GSO_TCPV6, 1440, F_NEEDS_CSUM)
    );
    assert!(tcp_verifies(&complete(f, &vnet), 14, 54, f.len()));
    // Small ones stay plain, checksum verified.
    let (frames, _) = flow_segments(true, &[1000], 1);
    let (out, _) = coalesce(&frames, Some(1440));
    let TxDest::Port { vnet, .. } = out[0].0 else {
        unreachable!()
    };
    assert_eq!(
        vnet,
        VnetHdr {
            flags: F_DATA_VALID,
            ..VnetHdr::default()
        }
    );
}

#[test]
fn what_is_not_merged() {
    // A gap in sequence numbers, a different ACK, a bad checksum.
    let (mut frames, _) = flow_segments(false, &[1000, 1000, 1000, 1000], 1);
    let seq = be32(&frames[1], 38).wrapping_add(1);
    frames[1][38..42].copy_from_slice(&seq.to_be_bytes());
    let (out, stats) = coalesce(&frames, None);
    // Frame 1 no longer verifies and its sequence is off: 0 | 1 | 2+3.
    assert_eq!(out.len(), 3);
    assert_eq!(stats.merged, 1);
    let TxDest::Port { vnet, .. } = out[1].0 else {
        unreachable!()
    };
    assert_eq!(
        vnet,
        VnetHdr::default(),
        "unverified frames carry no offload claim"
    );

    let (mut frames, _) = flow_segments(false, &[1000, 1000], 1);
    frames[1][42] ^= 1; // ACK number (checksum then wrong too, still not merged)
    assert_eq!(coalesce(&frames, None).0.len(), 2);

    // Random IPv4 IDs without DF are not merged; fixed IDs with DF are.
    let (mut frames, _) = flow_segments(false, &[1000, 1000, 1000], 1);
    for f in &mut frames {
        f[18..20].copy_from_slice(&[0, 9]);
        f[24..26].copy_from_slice(&[0, 0]);
        let c = !naive_sum(&f[14..34]);
        f[24..26].copy_from_slice(&c.to_be_bytes());
    }
    assert_eq!(coalesce(&frames, None).0.len(), 1, "fixed ID with DF");
    for f in &mut frames {
        f[20] = 0; // clear DF
        f[24..26].copy_from_slice(&[0, 0]);
        let c = !naive_sum(&f[14..34]);
        f[24..26].copy_from_slice(&c.to_be_bytes());
    }
    assert_eq!(coalesce(&frames, None).0.len(), 3, "fixed ID without DF");
}

/// A merged segment's checksum is verified from the header sum kept for its frame plus
/// its own sequence number, flags and checksum: a change to those in flight must still
/// be caught (the segment is passed on unmerged, with no offload claim).
#[test]
fn a_segment_header_changed_in_flight_is_not_merged() {
    for v6 in [false, true] {
        let l4 = if v6 { 54 } else { 34 };
        // Checksum field; PSH gained (a flag that may differ between merged segments).
        for (at, bit) in [(l4 + 16, 0x01), (l4 + 17, 0x80), (l4 + 13, TCP_PSH)] {
            let (mut frames, _) = flow_segments(v6, &[1000; 3], 1);
            frames[1][at] ^= bit;
            let (out, stats) = coalesce(&frames, None);
            assert_eq!(out.len(), 3, "0 | changed 1 | 2 (v6 {v6}, byte {at})");
            assert_eq!(stats.merged, 0);
            let (dest, f) = (out[1].0, &out[1].1[..]);
            assert_eq!(&f[12..], &frames[1][12..]);
            let TxDest::Port { vnet, .. } = dest else {
                unreachable!()
            };
            assert_eq!(vnet, VnetHdr::default());
        }
    }
}

/// A payload byte changed in flight, in any piece of the frame, is caught by the
/// checksum read across the pieces.
#[test]
fn a_payload_changed_in_flight_is_caught_in_any_piece() {
    let (clean, _) = flow_segments(false, &[3000; 2], 1);
    for at in [66, PIECE - 1, PIECE, 2 * PIECE + 1, 3065] {
        let mut frames = clean.clone();
        frames[1][at] ^= 0x40;
        let (out, stats) = coalesce(&frames, None);
        assert_eq!((out.len(), stats.merged), (2, 0), "byte {at}");
        assert_eq!(out[1].1[12..], frames[1][12..]);
        assert!(matches!(out[1].0, TxDest::Port { vnet, .. } if vnet == VnetHdr::default()));
    }
}

/// A merged frame never stands for more than MAX_SEGMENTS segments of its gso_size.
#[test]
fn a_merged_frame_stands_for_at_most_max_segments() {
    let (frames, all) = flow_segments(false, &vec![1; MAX_SEGMENTS + 5], 1);
    let (out, stats) = coalesce(&frames, Some(1));
    assert_eq!(out.len(), 2);
    assert_eq!(stats.merged as usize, MAX_SEGMENTS + 3);
    let mut payload = Vec::new();
    for (i, want) in [MAX_SEGMENTS, 5].into_iter().enumerate() {
        let (dest, f) = (out[i].0, &out[i].1[..]);
        let TxDest::Port { vnet, .. } = dest else {
            unreachable!()
        };
        assert_eq!((f.len() - 66, vnet.gso_size), (want, 1));
        assert!(tcp_verifies(&complete(f, &vnet), 14, 34, f.len()));
        payload.extend_from_slice(&f[66..]);
    }
    assert_eq!(payload, all);
}

/// Whatever the Mss option says, no GSO frame handed to a guest stands for more than
/// MAX_SEGMENTS segments of its gso_size: not a merged run (`Pending::advance`), not
/// a frame begun with one large segment (`Pending::begin`), not a segment passed on
/// alone (`emit_single`, here because of PSH).
#[test]
fn tiny_mss_options_never_stand_for_more_than_max_segments() {
    let fix_checksum = |f: &mut Vec<u8>| {
        f[50..52].fill(0);
        let end = f.len();
        let c = !naive_sum(&[pseudo_bytes(f, 14, 34, end), f[34..].to_vec()].concat());
        f[50..52].copy_from_slice(&c.to_be_bytes());
    };
    for mss in [1usize, 2] {
        // (segment sizes, PSH on each, frames the guest gets)
        let cases = [
            (vec![8850], false, 1),
            (vec![8850], true, 1),
            (vec![1000; 12], false, 12 / (2 * mss)),
            (vec![1500; 3], false, 3 - (mss - 1)),
        ];
        for (sizes, psh, frames_out) in cases {
            let (mut frames, all) = flow_segments(false, &sizes, 1);
            if psh {
                for f in &mut frames {
                    f[47] |= TCP_PSH;
                    fix_checksum(f);
                }
            }
            let (out, _) = coalesce(&frames, Some(mss as u32));
            assert_eq!(out.len(), frames_out, "{sizes:?} at Mss {mss}");
            let mut payload = Vec::new();
            for (dest, f) in &out {
                let TxDest::Port { vnet, .. } = *dest else {
                    unreachable!()
                };
                let n = f.len() - 66;
                if vnet.is_gso() {
                    assert_eq!(usize::from(vnet.gso_size), mss);
                    assert!(n.div_ceil(mss) <= MAX_SEGMENTS, "{n} bytes at Mss {mss}");
                } else {
                    assert_eq!(n, 8850, "only the oversized segment goes plain");
                }
                assert!(tcp_verifies(&complete(f, &vnet), 14, 34, f.len()));
                payload.extend_from_slice(&f[66..]);
            }
            assert_eq!(payload, all, "every byte delivered, in order");
        }
    }
}

#[test]
fn non_tcp_flushes_the_port_first_and_interleaved_flows_merge() {
    let (a, a_all) = flow_segments(false, &[1000, 1000], 1);
    let (mut b, b_all) = flow_segments(false, &[500, 500], 9);
    for f in &mut b {
        f[34..36].copy_from_slice(&[0x11, 0x11]); // another source port
        f[50..52].copy_from_slice(&[0, 0]);
        let end = f.len();
        let c = !naive_sum(&[pseudo_bytes(f, 14, 34, end), f[34..].to_vec()].concat());
        f[50..52].copy_from_slice(&c.to_be_bytes());
    }
    let arp = {
        let mut f = vec![0xff; 6];
        f.extend_from_slice(&GUEST_MAC);
        f.extend_from_slice(&[0x08, 0x06]);
        f.extend_from_slice(&[0; 28]);
        f
    };
    let all = [a[0].clone(), b[0].clone(), a[1].clone(), b[1].clone(), arp];
    let mut c = Coalescer::new();
    let mut out = TxBatch::new();
    push_frames(&mut c, &all[..4], 0, &mut out);
    assert!(out.is_empty(), "both flows held");
    push_frame(
        &mut c,
        &all[4],
        4,
        &parse_inner(&all[4]).unwrap(),
        None,
        &mut out,
    );
    let out = out.to_vecs(&inputs(&all)).unwrap();
    assert_eq!(out.len(), 3);
    let payloads: Vec<_> = out.iter().take(2).map(|(_, f)| f[66..].to_vec()).collect();
    assert!(payloads.contains(&a_all) && payloads.contains(&b_all));
    let last = &out[2].1;
    assert_eq!(
        &last[6..12],
        &GW_MAC,
        "source MAC rewritten on pass-through too"
    );
    assert_eq!(&last[12..], &all[4][12..]);
}

#[test]
fn steady_state_reuses_buffers() {
    // Same work twice: the second run must not grow the slot table.
    let (frames, _) = flow_segments(true, &[1000; 20], 1);
    let mut c = Coalescer::new();
    let mut out = TxBatch::new();
    for _ in 0..2 {
        push_frames(&mut c, &frames, 0, &mut out);
        c.flush(&mut out);
        assert_eq!(c.slots.len(), 1);
        assert_eq!(c.slots[0].refs.capacity(), coalesce::REFS_RESERVED);
    }
    assert_eq!(out.len(), 2);
}

#[test]
fn maximal_buffers_round_trip() {
    for v6 in [false, true] {
        let ip_hdr = if v6 { 0 } else { 20 };
        let spec = Spec::new(v6, pattern(8, 65535 - ip_hdr - 32));
        let f = spec.build();
        let seg = internal_segment_size(9000, &parse_inner(&f).unwrap());
        let mut out = TxBatch::new();
        let n = run_segment(&f, &spec.vnet(8448), seg, 8448, &mut out).unwrap();
        assert_eq!(n, 8);
        let inners = check_segments(&spec, &out, 9000, seg, 8448);
        check_coalesced(&spec, &coalesce(&inners, Some(8448)).0, 8448);
    }
}

/// The payloads of a coalesced frame and whether its TCP checksum verifies the way the
/// guest's kernel would check it.
fn payload_and_verifies(dest: TxDest, f: &[u8]) -> (Vec<u8>, bool) {
    let TxDest::Port { vnet, .. } = dest else {
        panic!("not to a port: {dest:?}")
    };
    let ok = tcp_verifies(&complete(f, &vnet), 14, 34, f.len());
    (f[66..].to_vec(), ok && naive_sum(&f[14..34]) == 0xffff)
}

/// A held frame lives in the coalescer, not in the batch: frames others push in
/// between go out first, and the held one comes out whole at the flush.
#[test]
fn frames_pushed_by_others_do_not_disturb_a_held_frame() {
    let (frames, all) = flow_segments(false, &[1000; 4], 1);
    let mut c = Coalescer::new();
    let mut out = TxBatch::new();
    push_frames(&mut c, &frames[..2], 0, &mut out);
    // Another part of the engine appends a frame between two receive calls.
    out.push(UNDERLAY, 60).fill(0x5a);
    push_frames(&mut c, &frames[2..], 2, &mut out);
    c.flush(&mut out);
    let out = out.to_vecs(&inputs(&frames)).unwrap();
    assert_eq!(out.len(), 2);
    assert_eq!((out[0].0, &out[0].1[..]), (UNDERLAY, &[0x5a; 60][..]));
    let (payload, ok) = payload_and_verifies(out[1].0, &out[1].1);
    assert!(ok, "the merged frame verifies");
    assert_eq!(payload, all);
    let s = c.stats();
    assert_eq!((s.frames_in, s.frames_out, s.merged), (4, 1, 3));
}

#[test]
fn a_bad_segment_ends_the_frame_before_it() {
    let (mut frames, _) = flow_segments(false, &[1000; 3], 1);
    let last = frames[1].len() - 1;
    frames[1][last] ^= 0xff; // payload corrupted: the checksum no longer verifies
    let (out, _) = coalesce(&frames, None);
    assert_eq!(out.len(), 3, "0 | bad 1 | 2");
    let mut expect = frames[0].clone();
    expect[6..12].copy_from_slice(&GW_MAC);
    assert_eq!(out[0].1, expect, "first segment untouched");
    let TxDest::Port { vnet, .. } = out[0].0 else {
        unreachable!()
    };
    assert_eq!(vnet.flags, F_DATA_VALID);
    assert_eq!(&out[1].1[12..], &frames[1][12..]);
    assert_eq!(
        out[1].0,
        TxDest::Port {
            port: PortId(3),
            vnet: VnetHdr::default()
        }
    );
}

/// Headers that do not lie in the first piece cannot be merged or vouched for: the
/// segment is passed on as it is, with no offload claim.
#[test]
fn headers_across_pieces_pass_through_unclaimed() {
    let (frames, _) = flow_segments(true, &[1000; 2], 1);
    let mut c = Coalescer::new();
    let mut out = TxBatch::new();
    let f = &frames[0];
    let pieces = [&f[..60], &f[60..]];
    let m = parse_inner(f).unwrap();
    c.push(
        PortId(3),
        RxFrame::new(&pieces, 0),
        &m,
        None,
        None,
        MacAddr(GW_MAC),
        &mut out,
    );
    c.flush(&mut out);
    let out = out.to_vecs(&inputs(&frames)).unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(&out[0].1[12..], &f[12..]);
    assert_eq!(&out[0].1[6..12], &GW_MAC);
    assert!(matches!(out[0].0, TxDest::Port { vnet, .. } if vnet == VnetHdr::default()));
}

/// What the kernel's GSO makes of a UDP-tunnel super-frame (`__skb_udp_tunnel_segment`
/// over `tcp_gso_segment`), written naively here from docs/tunnel-gso.md: every
/// header up to `hdr_len` replicated; per segment the outer IPv6 payload and UDP
/// lengths, the outer UDP checksum completed over the segment when
/// `F_UDP_TUNNEL_CSUM` says so (else copied), the inner IPv4 total length, ID
/// (+1 per segment) and header checksum or the IPv6 payload length, the TCP
/// sequence number, CWR on the first segment only, FIN/PSH on the last only, and
/// the TCP checksum computed over the segment.
/// Where two lists of frames first differ, for a failure message.
fn first_difference(a: &[Vec<u8>], b: &[Vec<u8>]) -> String {
    if a.len() != b.len() {
        return format!("{} frames against {}", a.len(), b.len());
    }
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        if let Some(at) = x.iter().zip(y).position(|(p, q)| p != q) {
            return format!("frame {i} byte {at}: {:#04x} against {:#04x}", x[at], y[at]);
        }
        if x.len() != y.len() {
            return format!("frame {i}: {} bytes against {}", x.len(), y.len());
        }
    }
    "no difference".into()
}

fn kernel_segments(sf: &[u8], gso: &TunnelGso) -> Vec<Vec<u8>> {
    let hdr = usize::from(gso.hdr_len);
    let mss = usize::from(gso.gso_size);
    let l3 = usize::from(gso.inner_nh);
    let l4 = usize::from(gso.csum_start);
    let v4 = sf[l3] >> 4 == 4;
    let payload = &sf[hdr..];
    // `__virtio_net_hdr_to_skb` takes a frame of one segment as no GSO at all:
    // nothing would cut it or complete its outer checksum.
    assert!(
        payload.len() > mss,
        "a super-frame of one segment ({} bytes, gso_size {mss})",
        payload.len()
    );
    let n = payload.len().div_ceil(mss);
    let mut segs = Vec::new();
    for (k, chunk) in payload.chunks(mss).enumerate() {
        let mut f = sf[..hdr].to_vec();
        f.extend_from_slice(chunk);
        let udp_len = (f.len() - 54) as u16;
        f[18..20].copy_from_slice(&udp_len.to_be_bytes());
        f[58..60].copy_from_slice(&udp_len.to_be_bytes());
        if v4 {
            let ip_len = (f.len() - l3) as u16;
            f[l3 + 2..l3 + 4].copy_from_slice(&ip_len.to_be_bytes());
            let id = be16(&f, l3 + 4).wrapping_add(k as u16);
            f[l3 + 4..l3 + 6].copy_from_slice(&id.to_be_bytes());
            f[l3 + 10..l3 + 12].fill(0);
            let c = !naive_sum(&f[l3..l4]);
            f[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
        } else {
            let plen = (f.len() - l3 - 40) as u16;
            f[l3 + 4..l3 + 6].copy_from_slice(&plen.to_be_bytes());
        }
        let seq = be32(&f, l4 + 4).wrapping_add((k * mss) as u32);
        f[l4 + 4..l4 + 8].copy_from_slice(&seq.to_be_bytes());
        if k > 0 {
            f[l4 + 13] &= !TCP_CWR;
        }
        if k + 1 < n {
            f[l4 + 13] &= !(TCP_FIN | TCP_PSH);
        }
        f[l4 + 16..l4 + 18].fill(0);
        let mut v = pseudo_bytes(&f, l3, l4, f.len());
        v.extend_from_slice(&f[l4..]);
        // A computed zero: the kernel writes 0x0000 (`gso_make_checksum`) or
        // 0xffff (`skb_checksum_help`'s CSUM_MANGLED_0) depending on its path, and
        // both verify (one's complement has two zeros); today's segments say 0xffff.
        let c = match !naive_sum(&v) {
            0 => 0xffff,
            c => c,
        };
        f[l4 + 16..l4 + 18].copy_from_slice(&c.to_be_bytes());
        if gso.flags & F_UDP_TUNNEL_CSUM != 0 {
            f[60..62].fill(0);
            let mut v = f[22..54].to_vec(); // outer source and destination
            v.extend_from_slice(&u32::from(udp_len).to_be_bytes());
            v.extend_from_slice(&[0, 0, 0, 17]);
            v.extend_from_slice(&f[54..]);
            let c = match !naive_sum(&v) {
                0 => 0xffff,
                c => c,
            };
            f[60..62].copy_from_slice(&c.to_be_bytes());
        }
        segs.push(f);
    }
    segs
}

/// Super-frames, each with its offload metadata.
type Supers = Vec<(TunnelGso, Vec<u8>)>;

/// The super-frames of `f` (with `edit`) and what `segment_with` sends for it today.
fn super_and_today(
    f: &[u8],
    vnet: &VnetHdr,
    seg: usize,
    outer: &OuterTemplate,
    edit: &InnerEdit,
) -> (Supers, SuperFrames, Vec<Vec<u8>>) {
    let meta = parse_inner(f).expect("test frame parses");
    let mss = u32::from(vnet.gso_size);
    let mut out = TxBatch::new();
    let sent = super_frames(f, vnet, &meta, seg, mss, outer, edit, 7, &mut out)
        .expect("accepted")
        .expect("a super-frame");
    let supers = own_frames(&out)
        .into_iter()
        .map(|(dest, b)| match dest {
            TxDest::UnderlayGso { ifindex: 7, gso } => (gso, b),
            d => panic!("super-frame to {d:?}"),
        })
        .collect();
    let mut today = TxBatch::new();
    segment_with(f, vnet, &meta, seg, mss, outer, *edit, UNDERLAY, &mut today).unwrap();
    let today = own_frames(&today).into_iter().map(|(_, b)| b).collect();
    (supers, sent, today)
}

/// Checks a super-frame's own headers independently (etherparse for the lengths,
/// the naive sum for the seeds).
fn check_super_frame(sf: &[u8], gso: &TunnelGso, udp_checksum: bool) {
    use etherparse::{NetSlice, SlicedPacket, TransportSlice};
    let outer = SlicedPacket::from_ethernet(sf).expect("outer parses");
    let Some(NetSlice::Ipv6(ip6)) = &outer.net else {
        panic!("outer IPv6")
    };
    assert_eq!(
        usize::from(ip6.header().payload_length()) + 54,
        sf.len(),
        "outer payload length"
    );
    let Some(TransportSlice::Udp(udp)) = &outer.transport else {
        panic!("outer UDP")
    };
    assert_eq!(usize::from(udp.length()), sf.len() - 54);
    assert_eq!(udp.destination_port(), 6081);
    let l3 = usize::from(gso.inner_nh);
    let l4 = usize::from(gso.csum_start);
    let inner = SlicedPacket::from_ethernet(&sf[l3 - 14..]).expect("inner parses");
    match &inner.net {
        Some(NetSlice::Ipv4(ip)) => {
            assert_eq!(usize::from(ip.header().total_len()), sf.len() - l3);
            assert_eq!(naive_sum(&sf[l3..l4]), 0xffff, "inner IPv4 header checksum");
        }
        Some(NetSlice::Ipv6(ip)) => {
            assert_eq!(
                usize::from(ip.header().payload_length()),
                sf.len() - l3 - 40
            );
        }
        n => panic!("inner {n:?}"),
    }
    let Some(TransportSlice::Tcp(tcp)) = &inner.transport else {
        panic!("inner TCP")
    };
    // The seed: the pseudo-header sum with the full TCP length, not complemented.
    let pseudo = pseudo_bytes(sf, l3, l4, sf.len());
    assert_eq!(tcp.checksum(), naive_sum(&pseudo), "inner TCP seed");
    let outer_seed = if udp_checksum {
        let mut v = sf[22..54].to_vec();
        v.extend_from_slice(&((sf.len() - 54) as u32).to_be_bytes());
        v.extend_from_slice(&[0, 0, 0, 17]);
        naive_sum(&v)
    } else {
        0
    };
    assert_eq!(udp.checksum(), outer_seed, "outer UDP seed");
    assert_eq!(
        usize::from(gso.hdr_len),
        l4 + tcp.slice().len() - tcp.payload().len()
    );
    assert_eq!(gso.flags & F_NEEDS_CSUM, F_NEEDS_CSUM);
    assert_eq!(gso.flags & F_UDP_TUNNEL_CSUM != 0, udp_checksum);
    assert_eq!(gso.gso_type & GSO_UDP_TUNNEL_IPV6, GSO_UDP_TUNNEL_IPV6);
}

/// The kernel's segmentation of the super-frames equals today's segments, byte for
/// byte, for both inner families, with and without the outer UDP checksum, and
/// through NAT.
#[test]
fn kernel_segmentation_of_super_frames_equals_todays_segments() {
    for v6 in [false, true] {
        for (outer, udp_checksum) in [(template(), false), (template_with(true, true), true)] {
            for nat in [false, true] {
                let mut spec = Spec::new(v6, pattern(u64::from(v6) + 3, 40_001));
                spec.flags = 0x10 | TCP_CWR | TCP_PSH;
                let f = spec.build();
                let seg = internal_segment_size(9000, &parse_inner(&f).unwrap());
                let nat = nat.then(|| {
                    let (old, new): (IpAddr, IpAddr) = if v6 {
                        ("fd00::5".parse().unwrap(), "2001:db8::9".parse().unwrap())
                    } else {
                        (
                            "172.30.0.5".parse().unwrap(),
                            "198.51.100.9".parse().unwrap(),
                        )
                    };
                    SrcNat {
                        rewrite: crate::frames::rewrite::Rewrite::new(old, 0x9c40, new, 40123),
                        quote: None,
                    }
                });
                let edit = InnerEdit {
                    dst_mac: MacAddr(DST_GUEST_MAC),
                    nat: nat.as_ref(),
                };
                let (supers, sent, today) =
                    super_and_today(&f, &spec.vnet(1448), seg, &outer, &edit);
                assert_eq!(supers.len(), 1);
                assert_eq!(sent.frames, 1);
                assert_eq!(sent.segments, today.len());
                assert_eq!(today.len(), 40_001_usize.div_ceil(seg));
                let (gso, sf) = &supers[0];
                assert_eq!(usize::from(gso.gso_size), seg);
                check_super_frame(sf, gso, udp_checksum);
                let cut = kernel_segments(sf, gso);
                assert_eq!(cut.len(), today.len());
                for (i, (k, t)) in cut.iter().zip(&today).enumerate() {
                    assert!(
                        k == t,
                        "segment {i} differs (v6 {v6}, csum {udp_checksum}, nat {})",
                        edit.nat.is_some()
                    );
                }
                if edit.nat.is_some() {
                    // The NAT source is in the super-frame, not only in what the
                    // kernel would make of it.
                    let sport = be16(sf, usize::from(gso.csum_start));
                    assert_eq!(sport, 40123);
                }
            }
        }
    }
}

/// A buffer whose outer IPv6 payload would pass 65535 bytes becomes two
/// super-frames split at a segment boundary, which together cut into today's
/// segments; the IP ID and sequence number continue across them, CWR is on the
/// first only and PSH on the last only.
#[test]
fn a_buffer_past_the_outer_length_limit_is_split_at_a_segment_boundary() {
    for v6 in [false, true] {
        let hdrs = Spec::new(v6, Vec::new()).hdrs();
        // The largest payload a guest sends: the inner IP length at 65535.
        let len = 65535 - (hdrs - 14) + if v6 { 40 } else { 0 };
        let mut spec = Spec::new(v6, pattern(9, len));
        spec.flags = 0x10 | TCP_CWR | TCP_PSH | TCP_FIN;
        let f = spec.build();
        let seg = 1000;
        let edit = InnerEdit {
            dst_mac: MacAddr(DST_GUEST_MAC),
            nat: None,
        };
        let outer = template();
        let (supers, sent, today) = super_and_today(&f, &spec.vnet(1448), seg, &outer, &edit);
        assert_eq!(supers.len(), 2, "v6 {v6}");
        assert_eq!(sent.frames, 2);
        assert_eq!(sent.segments, len.div_ceil(seg));
        let mut cut = Vec::new();
        for (gso, sf) in &supers {
            assert!(sf.len() - 54 <= 65535, "outer payload {}", sf.len() - 54);
            check_super_frame(sf, gso, false);
            cut.extend(kernel_segments(sf, gso));
        }
        let (first, second) = (&supers[0].1, &supers[1].1);
        let l4 = usize::from(supers[0].0.csum_start);
        let hdr_len = usize::from(supers[0].0.hdr_len);
        assert_eq!((first.len() - hdr_len) % seg, 0, "split at a boundary");
        // Spread evenly: 66 segments as 33 + 33, not 65 + 1 (a lone segment
        // would not be GSO to the kernel).
        assert_eq!((first.len() - hdr_len) / seg, len.div_ceil(seg) / 2);
        assert_eq!(first[l4 + 13] & (TCP_CWR | TCP_PSH | TCP_FIN), TCP_CWR);
        assert_eq!(
            second[l4 + 13] & (TCP_CWR | TCP_PSH | TCP_FIN),
            TCP_PSH | TCP_FIN
        );
        assert_eq!(cut.len(), today.len());
        assert!(
            cut == today,
            "v6 {v6}: the two super-frames cut into today's segments"
        );
    }
}

/// What is not a super-frame: a frame without GSO, a buffer of one segment (both
/// sent as today), and a buffer with bad metadata (the same drop as today).
#[test]
fn what_does_not_become_a_super_frame() {
    let spec = Spec::new(false, pattern(1, 3000));
    let f = spec.build();
    let meta = parse_inner(&f).unwrap();
    let outer = template();
    let edit = InnerEdit {
        dst_mac: MacAddr(DST_GUEST_MAC),
        nat: None,
    };
    let mut out = TxBatch::new();
    let plain = VnetHdr::default();
    assert_eq!(
        super_frames(&f, &plain, &meta, 1000, 0, &outer, &edit, 7, &mut out),
        Ok(None)
    );
    assert_eq!(
        super_frames(
            &f,
            &spec.vnet(1448),
            &meta,
            3000,
            1448,
            &outer,
            &edit,
            7,
            &mut out
        ),
        Ok(None)
    );
    let mut bad = spec.vnet(1448);
    bad.gso_type = GSO_UDP;
    assert_eq!(
        super_frames(&f, &bad, &meta, 1000, 1448, &outer, &edit, 7, &mut out),
        Err(TsoDrop::BadGsoType)
    );
    assert_eq!(
        super_frames(
            &f,
            &spec.vnet(1448),
            &meta,
            0,
            1448,
            &outer,
            &edit,
            7,
            &mut out
        ),
        Err(TsoDrop::SegmentSizeZero)
    );
    assert!(out.is_empty());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// For any buffer, segment size and header shape, the kernel's segmentation of
    /// the super-frames equals today's segments byte for byte, and a buffer of one
    /// segment is left to today's path.
    #[test]
    fn super_frames_always_cut_into_todays_segments(
        v6 in any::<bool>(),
        opts in opts_strategy(),
        len_frac in 0.0f64..1.0,
        seed in any::<u64>(),
        mtu in prop_oneof![Just(9000u16), 1280u16..9001],
        seq in any::<u32>(),
        ip_id in any::<u16>(),
        flags in any::<u8>(),
        udp_checksum in any::<bool>(),
    ) {
        let ip_hdr = if v6 { 0 } else { 20 };
        let max = 65535 - ip_hdr - 20 - opts.len();
        let len = (1.0 + len_frac.powi(2) * (max - 1) as f64) as usize;
        let mut spec = Spec::new(v6, pattern(seed, len));
        spec.opts = opts;
        spec.seq = seq;
        spec.ip_id = ip_id;
        spec.flags = flags;
        let f = spec.build();
        let meta = parse_inner(&f).unwrap();
        let seg = internal_segment_size(mtu, &meta);
        let outer = template_with(false, udp_checksum);
        let edit = InnerEdit {
            dst_mac: MacAddr(DST_GUEST_MAC),
            nat: None,
        };
        if len <= seg {
            let mut out = TxBatch::new();
            let vnet = spec.vnet(1448);
            let r = super_frames(&f, &vnet, &meta, seg, 1448, &outer, &edit, 7, &mut out);
            prop_assert_eq!(r, Ok(None));
            prop_assert!(out.is_empty());
        } else {
            let (supers, sent, today) = super_and_today(&f, &spec.vnet(1448), seg, &outer, &edit);
            prop_assert_eq!(sent.frames, supers.len());
            prop_assert_eq!(sent.segments, today.len());
            let mut cut = Vec::new();
            for (gso, sf) in &supers {
                check_super_frame(sf, gso, udp_checksum);
                cut.extend(kernel_segments(sf, gso));
            }
            prop_assert!(
                cut == today,
                "{} super-frames, {} segments: {}",
                supers.len(),
                today.len(),
                first_difference(&cut, &today)
            );
        }
    }
}

/// A guest without GUEST_TSO gets a GSO buffer as segments of at most its MTU,
/// each a plain frame with complete checksums, the stream intact; with
/// GUEST_CSUM they say DATA_VALID.
#[test]
fn a_gso_frame_for_a_guest_without_tso_is_cut_to_its_mtu() {
    let no_tso = GuestOffloads {
        csum: false,
        tso4: false,
        tso6: false,
        ecn: false,
    };
    for v6 in [false, true] {
        let mut spec = Spec::new(v6, pattern(11, 20_000));
        spec.flags = 0x10 | TCP_PSH | TCP_CWR;
        let f = spec.build();
        let v = spec.vnet(1448);
        assert_eq!(no_tso.fit(&v), GuestFit::Remake);
        assert_eq!(GuestOffloads::ALL.fit(&v), GuestFit::AsIs);
        let port = PortId(3);
        for (guest, mtu, flags) in [
            (no_tso, 1500, 0),
            (
                GuestOffloads {
                    csum: true,
                    ..no_tso
                },
                1280,
                F_DATA_VALID,
            ),
        ] {
            let mut out = TxBatch::new();
            let n = fit_guest(&f, &v, guest, mtu, port, &mut out).unwrap();
            let (l3, l4, hdrs) = (14, 14 + spec.ip_hdr(), spec.hdrs());
            let seg = (usize::from(mtu) - (hdrs - l3)).min(1448);
            assert_eq!(n, 20_000usize.div_ceil(seg));
            assert_eq!(out.len(), n);
            let mut stream = Vec::new();
            for (i, (dest, g)) in own_frames(&out).into_iter().enumerate() {
                let TxDest::Port { port: p, vnet } = dest else {
                    panic!("{dest:?}");
                };
                assert_eq!(p, port);
                assert_eq!(
                    vnet,
                    VnetHdr {
                        flags,
                        ..VnetHdr::default()
                    }
                );
                assert!(g.len() - l3 <= usize::from(mtu), "within the MTU");
                assert!(tcp_verifies(&g, l3, l4, g.len()), "segment {i}");
                if !v6 {
                    assert_eq!(!naive_sum(&g[l3..l4]), 0, "IPv4 header checksum");
                    assert_eq!(usize::from(be16(&g, l3 + 2)), g.len() - l3);
                }
                assert_eq!(be32(&g, l4 + 4), spec.seq.wrapping_add(stream.len() as u32));
                let fl = g[l4 + 13];
                assert_eq!(fl & TCP_CWR != 0, i == 0, "CWR only first");
                assert_eq!(fl & TCP_PSH != 0, i + 1 == n, "PSH only last");
                assert_eq!(&g[..l3], &f[..l3], "MACs and EtherType");
                assert_eq!(&g[l4..l4 + 4], &f[l4..l4 + 4], "ports");
                if !v6 {
                    assert_eq!(be16(&g, l3 + 4), spec.ip_id.wrapping_add(i as u16));
                }
                stream.extend_from_slice(&g[hdrs..]);
            }
            assert_eq!(stream, spec.payload);
        }
    }
}

/// A partial checksum is completed for a guest without GUEST_CSUM; DATA_VALID
/// is only cleared; a guest that takes them gets the frame as it is.
#[test]
fn a_partial_checksum_for_a_guest_without_guest_csum_is_completed() {
    let none = GuestOffloads {
        csum: false,
        tso4: false,
        tso6: false,
        ecn: false,
    };
    let spec = Spec::new(false, pattern(5, 700));
    let mut f = spec.build();
    f.extend_from_slice(&[0xee; 6]); // Ethernet padding, not summed
    let v = VnetHdr {
        flags: F_NEEDS_CSUM,
        csum_start: 34,
        csum_offset: 16,
        ..VnetHdr::default()
    };
    assert_eq!(none.fit(&v), GuestFit::Remake);
    assert_eq!(GuestOffloads { csum: true, ..none }.fit(&v), GuestFit::AsIs);
    let valid = VnetHdr {
        flags: F_DATA_VALID,
        ..VnetHdr::default()
    };
    assert_eq!(none.fit(&valid), GuestFit::Header(VnetHdr::default()));
    assert_eq!(none.fit(&VnetHdr::default()), GuestFit::AsIs);

    let mut out = TxBatch::new();
    assert_eq!(fit_guest(&f, &v, none, 1500, PortId(1), &mut out), Ok(1));
    let (dest, g) = own_frames(&out).remove(0);
    assert_eq!(
        dest,
        TxDest::Port {
            port: PortId(1),
            vnet: VnetHdr::default()
        }
    );
    let end = f.len() - 6;
    assert!(tcp_verifies(&g, 14, 34, end));
    assert_eq!(&g[..50], &f[..50]);
    assert_eq!(&g[52..], &f[52..]);
    // A header that does not match the frame is refused, nothing pushed.
    let lying = VnetHdr {
        csum_offset: 6,
        ..v
    };
    let mut out = TxBatch::new();
    assert_eq!(
        fit_guest(&f, &lying, none, 1500, PortId(1), &mut out),
        Err(TsoDrop::CsumOffsetOutOfRange)
    );
    assert!(out.is_empty());
    // A GSO buffer whose headers leave no room in the MTU is refused too.
    let gso = spec.vnet(1448);
    assert_eq!(
        fit_guest(&f[..end], &gso, none, 40, PortId(1), &mut out),
        Err(TsoDrop::SegmentSizeZero)
    );
}
