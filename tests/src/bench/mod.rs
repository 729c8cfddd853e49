//! The side-by-side benchmark (`bench-e2e`, run through `scripts/bench-e2e.sh`): the
//! same two-sled job built several ways and measured in alternation, with iperf3
//! (throughput) and sockperf (latency) between namespace guests or with DPDK's
//! testpmd as both guests.
//!
//! | setup | what carries guest traffic between the sleds |
//! |---|---|
//! | `ours` (and named variants) | this datapath: one `overlayd` per sled, guests on tap ports ([`crate::Rack`]) |
//! | `vxlan` | the kernel's VXLAN over IPv6, a Linux bridge per sled |
//! | `vxlan-wire` | the same, TSO buffers cut to the underlay MTU at the sled's edge |
//! | `veth` | nothing: one veth pair between the two guests (the ceiling) |
//! | `ovs` | Open vSwitch's userspace (netdev) datapath with a Geneve/IPv6 tunnel |
//! | `ours-vhost` | this datapath, testpmd guests on vhost-user ports ([`pmd`]) |
//! | `ovs-dpdk` | OVS with DPDK, testpmd guests on `dpdkvhostuser` ports ([`ovs`]) |
//! | `vm-bridge` (`--vm`; one per attachment way) | this datapath, the client a QEMU VM bridged to its port ([`vm`]) |
//!
//! Every setup with an underlay uses the harness's switch bridge and veth links at
//! MTU 9000 ([`crate::Rack::build`]), so only the overlay differs.
//!
//! Modules: [`options`] (command line), [`setup`] (building each topology),
//! [`ovs`] (the per-namespace OVS daemons), [`iperf`] (the tests, one measured
//! run), [`sockperf`] (the latency tests' tool),
//! [`pmd`] (the testpmd setups and their runs),
//! [`vm`] (the VM setups and their busybox stream),
//! [`cpu`] (CPU accounting from `/proc`), [`runner`] (rounds in alternation),
//! [`report`] (medians, tables, JSON), [`process`] (background processes),
//! [`signals`] (stopping cleanly on Ctrl-C).

pub mod cpu;
pub mod iperf;
pub mod options;
pub mod ovs;
pub mod pmd;
pub mod process;
pub mod report;
pub mod runner;
pub mod setup;
pub mod signals;
pub mod sockperf;
pub mod vm;
