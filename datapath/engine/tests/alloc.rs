//! The fast path allocates nothing: once a flow is cached and the output batch has
//! its capacity, encapsulating, decapsulating and coalescing a packet must not touch
//! the heap. A counting global allocator checks it.

mod common;

use common::*;
use engine::{Engine, FrameBytes, RxFrame, TxBatch, VnetHdr};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: defers every operation to the system allocator; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Hands every underlay frame of `sent` to `b` as AF_XDP would: in pieces, the first
/// [`PIECE`] bytes long.
fn receive_all(b: &mut Engine, sent: &TxBatch, now: u64, out: &mut TxBatch) {
    for (i, (_, f)) in sent.iter().enumerate() {
        let FrameBytes::Own(u) = f else {
            panic!("the sending batch lends no space");
        };
        let (head, rest) = u.split_at(u.len().min(PIECE));
        let pieces = [head, rest];
        b.process_underlay(RxFrame::new(&pieces, i as u32), now, &Fabric, out);
    }
}

#[test]
fn cached_flows_allocate_nothing_per_packet() {
    let (mut a, pa, mut b, _pb) = two_sleds();
    let (g1, g2) = (guest(1), guest(2));
    let tcp = tcp_v4(&g1, g2.v4, 40000, 80, false, &[7u8; 1200]);
    let icmp6 = frame(&g1, None, Some(g2.v6), L4::Icmp { id: 9, seq: 1 }, b"ping");
    let mut out_a = TxBatch::new();
    let mut out_b = TxBatch::new();
    // Open the TCP connection first: sled B admits inbound TCP only from a SYN on.
    let syn = tcp_v4(&g1, g2.v4, 40000, 80, true, &[]);
    out_a.clear();
    a.process_guest(pa, VnetHdr::default(), &syn, 0, &Fabric, &mut out_a);
    receive_all(&mut b, &out_a, 0, &mut out_b);
    let mut round = |now: u64, out_a: &mut TxBatch, out_b: &mut TxBatch| {
        out_a.clear();
        out_b.clear();
        for f in [&tcp, &icmp6] {
            a.process_guest(pa, VnetHdr::default(), f, now, &Fabric, out_a);
        }
        receive_all(&mut b, out_a, now, out_b);
        b.end_of_batch(out_b);
        assert_eq!(out_b.len(), 2);
    };
    // Warm up: compile the flows, size the batches and the coalescer's buffers.
    for now in 0..4 {
        round(now, &mut out_a, &mut out_b);
    }
    let before = ALLOCS.load(Ordering::Relaxed);
    assert!(before > 0, "the counting allocator is in use");
    for now in 4..1004 {
        round(now, &mut out_a, &mut out_b);
    }
    let n = ALLOCS.load(Ordering::Relaxed) - before;
    assert_eq!(n, 0, "{n} allocations in 1000 rounds of 2 packets each way");
}
