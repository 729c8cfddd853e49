//! overlayd: the per-sled daemon.
fn main() {}
