//! Per-packet cost of the engine (docs/benchmarks.md has the method and figures).
//!
//! - `parse`: `wire::meta::parse_inner` on guest frames and `parse_underlay` on the
//!   underlay frames the engine emits for them.
//! - `fast_path`: one packet of an established flow, 16 scenarios
//!   {ipv4, ipv6} x {tcp, udp} x {out, in} x {0, 1400-byte payload}; each iteration
//!   processes the packet (inbound: plus `end_of_batch`, so the coalescer flushes) and
//!   clears the `TxBatch`.
//! - `nat_fast_path`: the same for an IPv4 TCP flow through SNAT to an internet
//!   host, both ways (`bench::nat`); compare with `fast_path`'s `ipv4/tcp/...`.
//! - `slow_path`: the first packet of a new outbound flow (flow-table miss, layers,
//!   cache insert, encapsulation); a new source port per iteration, fresh sleds every
//!   `FLOWS_PER_SETUP` flows (outside the timed region), misses checked per run.
//!
//! Before measuring, the allocations per packet of each scenario are counted in this
//! (optimised) binary and printed, confirming `tests/alloc.rs` outside debug builds.

use bench::alloc::{per_packets, CountingAlloc};
use bench::frames::{data_frame, FlowSpec};
use bench::nat::NatFastPath;
use bench::tso::TsoOut;
use bench::{Dir, FastPath, Scenario, SlowPath, TwoSleds};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use engine::TxBatch;
use std::hint::black_box;
use std::time::{Duration, Instant};
use wire::ipv4::protocol;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

fn fixture<T>(r: Result<T, String>) -> T {
    r.unwrap_or_else(|e| panic!("fixture: {e}"))
}

fn parse(c: &mut Criterion) {
    let sleds = fixture(TwoSleds::new());
    let mut g = c.benchmark_group("parse");
    g.throughput(Throughput::Elements(1));
    for v6 in [false, true] {
        for (proto, l4) in [(protocol::TCP, "tcp"), (protocol::UDP, "udp")] {
            let ip = if v6 { "ipv6" } else { "ipv4" };
            let spec = FlowSpec::between(&sleds.a.cfg, &sleds.b.cfg, v6, proto, 40000, 5201)
                .unwrap_or_else(|| panic!("guests lack {ip}"));
            let frame = fixture(data_frame(&spec, 0));
            assert!(wire::meta::parse_inner(&frame).is_ok());
            g.bench_function(format!("inner/{ip}/{l4}"), |b| {
                b.iter(|| wire::meta::parse_inner(black_box(&frame)));
            });
        }
    }
    for s in Scenario::all()
        .into_iter()
        .filter(|s| s.dir == Dir::In && s.payload == 0)
    {
        let fp = fixture(FastPath::new(s));
        let frame = fp.input().to_vec();
        assert!(wire::meta::parse_underlay(&frame).is_ok());
        let id = format!("{s}");
        let id = id.trim_end_matches("/in/0").to_string();
        g.bench_function(format!("underlay/{id}"), |b| {
            b.iter(|| wire::meta::parse_underlay(black_box(&frame)));
        });
    }
    g.finish();
}

fn fast_path(c: &mut Criterion) {
    const PACKETS: u64 = 10_000;
    println!("allocations per {PACKETS} fast-path packets (after warm-up):");
    for s in Scenario::all() {
        let mut fp = fixture(FastPath::new(s));
        let (n, bytes) = per_packets(1, PACKETS, |out| fp.process(out));
        println!("  {s:<18} {n} allocations, {bytes} bytes");
    }

    let mut g = c.benchmark_group("fast_path");
    g.throughput(Throughput::Elements(1));
    for s in Scenario::all() {
        let mut fp = fixture(FastPath::new(s));
        let mut out = TxBatch::new();
        g.bench_function(s.to_string(), |b| {
            b.iter(|| {
                fp.process(black_box(&mut out));
                out.clear();
            });
        });
        // The measured packets were still hits producing the reference frame.
        fixture(fp.check());
    }
    g.finish();
}

/// The fast path of a flow through SNAT (`bench::nat`), under the ids of the same
/// flow without NAT in `fast_path`.
fn nat_fast_path(c: &mut Criterion) {
    let mut g = c.benchmark_group("nat_fast_path");
    g.throughput(Throughput::Elements(1));
    for (id, dir, payload) in bench::nat::scenarios() {
        let mut fp = fixture(NatFastPath::new(dir, payload));
        let (n, bytes) = per_packets(1, 10_000, |out| fp.process(out));
        println!("  nat {id:<18} {n} allocations, {bytes} bytes per 10000 packets");
        let mut out = TxBatch::new();
        g.bench_function(id, |b| {
            b.iter(|| {
                fp.process(black_box(&mut out));
                out.clear();
            });
        });
        fixture(fp.check());
    }
    g.finish();
}

/// A 64 KiB guest TSO buffer (`bench::tso`), cut into segments or sent as
/// super-frames; throughput in bytes of TCP payload.
fn tso_out(c: &mut Criterion) {
    let mut g = c.benchmark_group("tso_out");
    g.throughput(Throughput::Bytes(bench::tso::PAYLOAD as u64));
    for (id, tunnel_gso) in bench::tso::WAYS {
        let mut t = fixture(TsoOut::new(tunnel_gso));
        let mut out = TxBatch::new();
        g.bench_function(format!("ipv4/tcp/64k/{id}"), |b| {
            b.iter(|| {
                t.process(black_box(&mut out));
                out.clear();
            });
        });
        fixture(t.check());
    }
    g.finish();
}

fn slow_path(c: &mut Criterion) {
    let mut g = c.benchmark_group("slow_path");
    g.throughput(Throughput::Elements(1));
    for s in Scenario::all().into_iter().filter(|s| s.dir == Dir::Out) {
        let mut sp = fixture(SlowPath::new(s));
        let mut out = TxBatch::new();
        g.bench_function(s.to_string(), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                let mut left = iters;
                while left > 0 {
                    if sp.remaining() == 0 {
                        fixture(sp.reset());
                    }
                    let n = left.min(sp.remaining());
                    let m0 = fixture(sp.misses());
                    let t = Instant::now();
                    for _ in 0..n {
                        sp.process(black_box(&mut out));
                        out.clear();
                    }
                    total += t.elapsed();
                    let m1 = fixture(sp.misses());
                    assert_eq!(m1, m0 + n, "{s}: every slow-path packet must miss");
                    left -= n;
                }
                total
            });
        });
    }
    g.finish();
}

criterion_group!(benches, parse, fast_path, nat_fast_path, tso_out, slow_path);
criterion_main!(benches);
