//! A counting wrapper around the system allocator.
//!
//! Counts are kept per thread: libtest runs each test on its own thread while the
//! harness itself allocates (output capture, channels), and criterion may allocate
//! between samples; only the allocations made by the thread that runs the packets
//! say anything about the engine (which spawns no threads).
//!
//! Use: in the final binary,
//! `#[global_allocator] static A: bench::alloc::CountingAlloc = bench::alloc::CountingAlloc;`
//! then read [`thread_allocations`] before and after the code under test.

// A counting global allocator: implementing `GlobalAlloc` is `unsafe` by nature.
#![allow(unsafe_code)]

use engine::TxBatch;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    // `const` initialisation and a type without `Drop`: the slot needs no lazy
    // registration, so touching it from inside the allocator cannot recurse into it.
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
    static BYTES: Cell<u64> = const { Cell::new(0) };
    // Bytes allocated minus bytes freed by this thread: what it holds, for code
    // that allocates and frees on one thread.
    static LIVE: Cell<i64> = const { Cell::new(0) };
}

/// The system allocator, counting every `alloc`, `alloc_zeroed` and `realloc` (a
/// reallocation is heap work on the packet path just like a fresh allocation).
/// Frees are not counted: a steady state that frees must have allocated first.
pub struct CountingAlloc;

fn record(bytes: usize) {
    // `try_with`: during thread teardown the slot may be gone; such allocations are
    // not the engine's (it runs no code at thread exit), so skipping them is correct.
    let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
    let _ = BYTES.try_with(|c| c.set(c.get() + bytes as u64));
}

fn hold(delta: i64) {
    let _ = LIVE.try_with(|c| c.set(c.get() + delta));
}

fn signed(bytes: usize) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so
// `System`'s guarantees (and the caller's obligations) carry over as they are; the
// counting touches only a thread-local `Cell`, which never allocates.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        record(layout.size());
        hold(signed(layout.size()));
        // SAFETY: forwarded as is; the caller upholds `GlobalAlloc::alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        record(layout.size());
        hold(signed(layout.size()));
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        hold(-signed(layout.size()));
        // SAFETY: `ptr` came from this allocator, i.e. from `System`, with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        record(new_size);
        hold(signed(new_size) - signed(layout.size()));
        // SAFETY: `ptr` came from `System` with `layout`; the caller upholds the rest.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Allocations (including reallocations) made by the calling thread so far. Zero
/// forever if [`CountingAlloc`] is not the global allocator of this binary.
pub fn thread_allocations() -> u64 {
    ALLOCS.with(Cell::get)
}

/// Bytes requested by those allocations.
pub fn thread_allocated_bytes() -> u64 {
    BYTES.with(Cell::get)
}

/// Heap bytes the calling thread allocated and has not freed: a change in it over
/// some code is what that code keeps (exact, unlike the resident set, which
/// reused or unreturned memory blurs).
pub fn thread_live_bytes() -> i64 {
    LIVE.with(Cell::get)
}

/// Allocations and bytes made by `f` on this thread.
pub fn count<R>(f: impl FnOnce() -> R) -> (R, u64, u64) {
    let (a0, b0) = (thread_allocations(), thread_allocated_bytes());
    let r = f();
    (r, thread_allocations() - a0, thread_allocated_bytes() - b0)
}

/// Allocations and bytes of `packets` packets through `process`, after `warm_up`
/// uncounted ones (the batch's own buffers grow once, as a worker's do); the batch
/// is cleared after each packet, as a worker clears it after each round.
pub fn per_packets(
    warm_up: u64,
    packets: u64,
    mut process: impl FnMut(&mut TxBatch),
) -> (u64, u64) {
    let mut out = TxBatch::new();
    let mut one = |out: &mut TxBatch| {
        process(out);
        out.clear();
    };
    for _ in 0..warm_up {
        one(&mut out);
    }
    let ((), n, bytes) = count(|| {
        for _ in 0..packets {
            one(&mut out);
        }
    });
    (n, bytes)
}
