//! xdeadm: the admin tool.
fn main() {}
