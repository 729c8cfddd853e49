//! Tunneled TSO throughput: segmenting + encapsulating a 64 KiB guest buffer (IPv4 and
//! IPv6 inner), and coalescing the resulting segments back, each next to a plain
//! memcpy of the same payload bytes in the same run. The ratio to memcpy is printed at
//! the end (target: segment+encap and coalesce each >= 0.5x memcpy).

use criterion::{Criterion, Throughput};
use engine::frames::tso::{internal_segment_size, segment, Coalescer};
use engine::OuterTemplate;
use engine::{MacAddr, PortId, RxFrame, TxBatch, TxDest, VnetHdr, Vni};
use std::hint::black_box;
use std::time::{Duration, Instant};
use wire::meta::parse_inner;
use wire::vnet::{F_NEEDS_CSUM, GSO_TCPV4, GSO_TCPV6};

const GUEST_MSS: u16 = 8448;
const TS_OPTS: [u8; 12] = [1, 1, 8, 10, 0, 0, 0, 9, 0, 0, 0, 3];

/// A maximal GSO buffer: IP length 65535 (IPv4) or payload length 65535 (IPv6), TCP
/// with timestamps.
fn gso_buffer(v6: bool) -> (Vec<u8>, VnetHdr) {
    let ip_hdr = if v6 { 40 } else { 20 };
    let payload = 65535 - if v6 { 0 } else { 20 } - 32;
    let mut f = vec![2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2];
    if v6 {
        f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0]);
        f.extend_from_slice(&((32 + payload) as u16).to_be_bytes());
        f.extend_from_slice(&[6, 64]);
        f.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5]);
        f.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 6]);
    } else {
        f.extend_from_slice(&[0x08, 0x00, 0x45, 0, 0xff, 0xff, 0, 1, 0x40, 0, 64, 6, 0, 0]);
        f.extend_from_slice(&[172, 30, 0, 5, 172, 30, 0, 6]);
        let c = wire::checksum::checksum(&f[14..34]);
        f[24..26].copy_from_slice(&c.to_be_bytes());
    }
    f.extend_from_slice(&[0x9c, 0x40, 0x14, 0x51, 0, 0, 0, 1, 0, 0, 0, 1, 0x80, 0x10]);
    f.extend_from_slice(&[0x01, 0xf5, 0, 0, 0, 0]);
    f.extend_from_slice(&TS_OPTS);
    f.extend((0..payload).map(|i| (i * 31 + 7) as u8));
    let vnet = VnetHdr {
        flags: F_NEEDS_CSUM,
        gso_type: if v6 { GSO_TCPV6 } else { GSO_TCPV4 },
        hdr_len: (14 + ip_hdr + 32) as u16,
        gso_size: GUEST_MSS,
        csum_start: (14 + ip_hdr) as u16,
        csum_offset: 16,
    };
    (f, vnet)
}

fn template() -> OuterTemplate {
    OuterTemplate::new(
        MacAddr([2, 0, 0, 0, 1, 1]),
        MacAddr([2, 0, 0, 0, 1, 2]),
        "fd00:1::1".parse().unwrap(),
        "fd00:2::1".parse().unwrap(),
        4242,
        77,
        Vni::new(1701).unwrap(),
        false,
        false,
    )
}

/// One workload: its name, payload bytes per iteration, and the routine.
struct Work {
    name: String,
    bytes: u64,
    run: Box<dyn FnMut()>,
}

fn workloads() -> Vec<Work> {
    let mut w = Vec::new();
    for v6 in [false, true] {
        let tag = if v6 { "v6" } else { "v4" };
        let (frame, vnet) = gso_buffer(v6);
        let meta = parse_inner(&frame).unwrap();
        let bytes = (meta.ip_end - meta.payload_off) as u64;
        let seg = internal_segment_size(9000, &meta);
        let outer = template();
        let dest = TxDest::Underlay { ifindex: 1 };
        let gw = MacAddr([2, 0, 0, 0, 0, 9]);

        // The segments, decapsulated, as the receiving sled's coalescer sees them.
        let mut segs = TxBatch::new();
        segment(
            &frame,
            &vnet,
            &meta,
            seg,
            GUEST_MSS.into(),
            &outer,
            gw,
            dest,
            &mut segs,
        )
        .unwrap();
        let inners: Vec<Vec<u8>> = segs
            .to_vecs(&[])
            .unwrap()
            .into_iter()
            .map(|(_, f)| f[78..].to_vec())
            .collect();
        let metas: Vec<_> = inners.iter().map(|f| parse_inner(f).unwrap()).collect();

        let src = frame[meta.payload_off..meta.ip_end].to_vec();
        let mut dst = vec![0u8; src.len()];
        w.push(Work {
            name: format!("memcpy_64k_{tag}"),
            bytes,
            run: Box::new(move || {
                dst.copy_from_slice(black_box(&src));
                black_box(&dst);
            }),
        });
        let mut out = TxBatch::new();
        w.push(Work {
            name: format!("segment_encap_64k_{tag}"),
            bytes,
            run: Box::new(move || {
                out.clear();
                let n = segment(
                    black_box(&frame),
                    &vnet,
                    &meta,
                    seg,
                    GUEST_MSS.into(),
                    &outer,
                    gw,
                    dest,
                    &mut out,
                );
                black_box(n.ok());
            }),
        });
        let mut c = Coalescer::new();
        let mut out = TxBatch::new();
        w.push(Work {
            name: format!("coalesce_64k_{tag}"),
            bytes,
            run: Box::new(move || {
                out.clear();
                for (i, (f, m)) in inners.iter().zip(&metas).enumerate() {
                    // As AF_XDP hands an underlay frame over in copy mode: 3840-byte
                    // pieces, the first with the 78 bytes of outer headers.
                    let (a, rest) = f.split_at(f.len().min(3840 - 78));
                    let (b, c2) = rest.split_at(rest.len().min(3840));
                    let pieces = [a, b, c2];
                    c.push(
                        PortId(1),
                        RxFrame::new(black_box(&pieces), i as u32),
                        m,
                        None,
                        Some(GUEST_MSS.into()),
                        gw,
                        &mut out,
                    );
                }
                c.flush(&mut out);
                black_box(out.len());
            }),
        });
    }
    w
}

/// Bytes per second of one workload over roughly `dur`.
fn rate(work: &mut Work, dur: Duration) -> f64 {
    let start = Instant::now();
    let mut iters = 0u64;
    while start.elapsed() < dur {
        for _ in 0..20 {
            (work.run)();
        }
        iters += 20;
    }
    (iters * work.bytes) as f64 / start.elapsed().as_secs_f64()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Rounds of the interleaved comparison, and the time each workload runs per round.
const ROUNDS: usize = 41;
const SLICE: Duration = Duration::from_millis(12);

fn main() {
    let mut c = Criterion::default().configure_from_args();
    let mut works = workloads();
    {
        let mut g = c.benchmark_group("tso");
        for work in &mut works {
            g.throughput(Throughput::Bytes(work.bytes));
            g.bench_function(work.name.clone(), |b| b.iter(|| (work.run)()));
        }
        g.finish();
    }
    c.final_summary();

    // The ratio to memcpy, measured in this run with the workloads interleaved in
    // short slices: on a shared, noisy machine a neighbour's burst then hits memcpy
    // and the workload it is compared with alike, and the median over the rounds
    // discards the slices it hit unevenly. Criterion's numbers above are per workload;
    // this is the summary the target is stated in.
    println!("\nratio to memcpy of the same payload bytes, median of {ROUNDS} interleaved rounds (target >= 0.5):");
    for chunk in works.chunks_mut(3) {
        for w in chunk.iter_mut() {
            rate(w, SLICE);
        }
        let mut rates = vec![Vec::with_capacity(ROUNDS); chunk.len()];
        let mut ratios = vec![Vec::with_capacity(ROUNDS); chunk.len()];
        for _ in 0..ROUNDS {
            let memcpy = rate(&mut chunk[0], SLICE);
            rates[0].push(memcpy);
            for (i, w) in chunk.iter_mut().enumerate().skip(1) {
                let r = rate(w, SLICE);
                rates[i].push(r);
                ratios[i].push(r / memcpy);
            }
        }
        println!(
            "  {:<24} {:>8.2} GB/s",
            chunk[0].name,
            median(&mut rates[0]) / 1e9
        );
        for (i, w) in chunk.iter().enumerate().skip(1) {
            println!(
                "  {:<24} {:>8.2} GB/s  {:.2}x memcpy",
                w.name,
                median(&mut rates[i]) / 1e9,
                median(&mut ratios[i])
            );
        }
    }
}
