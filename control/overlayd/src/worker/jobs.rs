//! What the controller asks of a worker: jobs (closures the worker runs between
//! rounds, so its fast path takes no lock), and what every worker can do for the
//! fan-out over all of them ([`WorkerPlane`]).

use super::stats::{WorkerInfo, WorkerReport};
use crate::controller::Dataplane;
use api::PortInfo;
use engine::{MacAddr, Vni};
use std::net::IpAddr;
use std::sync::mpsc;

/// Work for a worker: runs on the worker's thread with its dataplane.
pub type Job<D> = Box<dyn FnOnce(&mut D) + Send>;

pub type JobTx<D> = mpsc::Sender<Job<D>>;

pub type JobRx<D> = mpsc::Receiver<Job<D>>;

/// What a worker's dataplane offers beyond [`Dataplane`]: the map from a port's
/// inbound dispatch key to the worker owning it, which a worker consults for
/// underlay frames it receives for ports it does not own.
pub trait WorkerPlane: Dataplane {
    /// Records that frames for the port's (VNI, guest MAC) belong to worker `owner`
    /// (`None`: the port is gone).
    fn set_port_owner(&mut self, port: &PortKey, owner: Option<usize>);

    /// This worker's statistics, typed, so that they merge by type.
    fn report(&mut self) -> WorkerReport;

    /// Where the worker runs and which queues it serves.
    fn info(&self) -> WorkerInfo;
}

/// Runs every job waiting for this worker, without blocking. Returns how many ran.
pub fn serve_jobs<D>(jobs: &JobRx<D>, dp: &mut D) -> usize {
    let mut n = 0;
    while let Ok(job) = jobs.try_recv() {
        job(dp);
        n += 1;
    }
    n
}

/// What the other workers need to know about a port: its inbound dispatch key, and
/// its addresses and MTU, so that their guests' frames to it are handed over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortKey {
    pub vni: Vni,
    pub mac: MacAddr,
    pub ips: Vec<IpAddr>,
    pub mtu: u16,
}

impl PortKey {
    pub(crate) fn of(p: &PortInfo) -> PortKey {
        let c = &p.config;
        PortKey {
            vni: c.vni,
            mac: c.guest_mac,
            ips: c
                .ipv4
                .map(IpAddr::V4)
                .into_iter()
                .chain(c.ipv6.map(IpAddr::V6))
                .collect(),
            mtu: c.mtu,
        }
    }
}
