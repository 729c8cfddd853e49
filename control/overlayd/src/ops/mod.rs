//! What operators look through, above the datapath: counters as OpenMetrics
//! ([`metrics`]), port captures as pcapng ([`capture`], [`pcapng`]), the host and
//! setup checks of `xdeadm doctor` ([`doctor`]), and systemd's readiness and
//! watchdog protocol ([`notify`]).

pub mod capture;
pub mod doctor;
pub mod metrics;
pub mod notify;
pub mod pcapng;
