//! The fast path must not touch the heap: after warm-up, 10,000 packets of an
//! established flow in each of the 16 scenarios make zero allocations (reallocations
//! included). Counted by a wrapper around the system allocator on the thread that runs
//! the packets, so this test fails as soon as the engine allocates per packet.

use bench::alloc::{count, per_packets, CountingAlloc};
use bench::nat::NatFastPath;
use bench::{FastPath, Scenario, SlowPath};
use engine::TxBatch;
use std::hint::black_box;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

const WARM_UP: u64 = 100;
const PACKETS: u64 = 10_000;

/// The counter is live in this binary (else every zero below would be vacuous).
#[test]
fn counter_sees_allocations() {
    let (v, n, bytes) = count(|| black_box(vec![7u8; 100]));
    assert_eq!(v.len(), 100);
    assert_eq!(n, 1);
    assert_eq!(bytes, 100);
}

#[test]
fn fast_path_allocates_nothing() {
    let mut failures = Vec::new();
    for s in Scenario::all() {
        let mut fp = FastPath::new(s).unwrap_or_else(|e| panic!("{e}"));
        let (n, bytes) = per_packets(WARM_UP, PACKETS, |out| fp.process(out));
        println!("{s:<20} {n} allocations ({bytes} bytes) in {PACKETS} packets");
        if n != 0 {
            failures.push(format!("{s}: {n} allocations ({bytes} bytes)"));
        }
        // Still the path we meant to measure.
        fp.check().unwrap_or_else(|e| panic!("{e}"));
    }
    assert!(
        failures.is_empty(),
        "fast path allocated: {}",
        failures.join("; ")
    );
}

/// The same for an established flow through SNAT, both ways.
#[test]
fn nat_fast_path_allocates_nothing() {
    for (id, dir, payload) in bench::nat::scenarios() {
        let mut fp = NatFastPath::new(dir, payload).unwrap_or_else(|e| panic!("{e}"));
        let (n, bytes) = per_packets(WARM_UP, PACKETS, |out| fp.process(out));
        assert_eq!(n, 0, "nat {id}: {n} allocations ({bytes} bytes)");
        fp.check().unwrap_or_else(|e| panic!("{e}"));
    }
}

/// A new flow compiles and caches an action, which allocates (at least the boxed
/// encapsulation): seeing it proves the counter observes the engine's own
/// allocations. The per-flow figure is printed for docs/benchmarks.md.
#[test]
fn slow_path_allocations_are_seen() {
    const FLOWS: u64 = 1000;
    for s in Scenario::all()
        .into_iter()
        .filter(|s| s.dir == bench::Dir::Out)
    {
        let mut sp = SlowPath::new(s).unwrap_or_else(|e| panic!("{e}"));
        let mut out = TxBatch::new();
        let m0 = sp.misses().unwrap();
        let ((), n, bytes) = count(|| {
            for _ in 0..FLOWS {
                sp.process(&mut out);
                out.clear();
            }
        });
        assert_eq!(sp.misses().unwrap(), m0 + FLOWS, "{s}");
        println!(
            "{s:<20} new flow: {:.2} allocations ({} bytes) per flow",
            n as f64 / FLOWS as f64,
            bytes / FLOWS
        );
        assert!(
            n >= FLOWS,
            "{s}: only {n} allocations for {FLOWS} new flows"
        );
    }
}
