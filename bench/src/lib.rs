//! Shared helpers for the engine benchmarks.
