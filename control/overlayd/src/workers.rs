//! The controller's view of several poll-mode workers, each owning its own
//! dataplane (an engine, its ports' taps, some underlay queues).
//!
//! Port affinity, like OVS assigning rx queues to PMD threads: every port lives on
//! exactly one worker, chosen least-loaded when the port is created, so its
//! firewall connections, flow tables, gateway timers and coalescer are touched by
//! one thread only and the fast path takes no lock. Configuration that is not per
//! port (V2P) is applied to every worker's engine; per-port configuration and
//! inspection go to the port's owner only.
//!
//! Requests travel to a worker as jobs (closures run on the worker between
//! batches) and the controller waits for each answer, so a request is
//! acknowledged only once every worker that had to apply it has. A change that
//! spans workers is applied in worker order, worker 0 first: worker 0 is the
//! validation (all engines share one configuration, so what it accepts the others
//! accept), and should a later worker still refuse, the workers that already
//! applied it are put back, so a refusal changes nothing.

use crate::controller::{Dataplane, DataplaneError, Inspect, PortTables};
use crate::util::Doorbell;
use crate::worker::jobs::{JobTx, PortKey, WorkerPlane};
use crate::worker::stats::{UnderlayTx, WorkerReport, WorkerView};
use crate::worker::Datapath;
use api::{
    ExternalIps, FwRule, MacAddr, Outcome, PortCidrs, PortInfo, PortLimits, PortState, Reply,
    RouteEntry, V2pEntry, Vni,
};
use engine::{Imported, LiveState, V2b};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{mpsc, Arc};

/// The worker that gets the next port: the one with the fewest ports, the lowest
/// index among equals (so one worker behaves like one, and ports spread evenly
/// in creation order).
pub fn least_loaded(loads: &[usize]) -> usize {
    loads
        .iter()
        .enumerate()
        .min_by_key(|&(i, &n)| (n, i))
        .map_or(0, |(i, _)| i)
}

/// Where a port lives and its dispatch key.
#[derive(Clone, Debug)]
struct Placement {
    worker: usize,
    key: PortKey,
}

/// Extra `stats` that belong to no worker (the underlay links' XDP counters).
pub type SharedStats = Box<dyn FnMut() -> Value>;

/// The fan-out: a [`Dataplane`] made of one dataplane per worker thread.
pub struct Workers<D> {
    jobs: Vec<JobTx<D>>,
    /// Wakes a sleeping worker when a job is queued (absent in tests).
    doorbells: Vec<Arc<Doorbell>>,
    ports: BTreeMap<String, Placement>,
    /// The V2P table every engine holds, kept here to undo a partial change.
    v2p: BTreeMap<(Vni, IpAddr), V2pEntry>,
    /// The V2B table every engine holds, likewise.
    v2b: V2b,
    shared_stats: Option<SharedStats>,
}

impl<D: WorkerPlane + 'static> Workers<D> {
    /// One entry of `jobs` per worker, in worker order.
    pub fn new(jobs: Vec<JobTx<D>>, shared_stats: Option<SharedStats>) -> Workers<D> {
        Workers {
            jobs,
            doorbells: Vec::new(),
            ports: BTreeMap::new(),
            v2p: BTreeMap::new(),
            v2b: V2b::default(),
            shared_stats,
        }
    }

    /// Jobs for worker `i` ring `doorbells[i]`, so a sleeping worker answers at
    /// once instead of after its idle timeout.
    pub fn with_doorbells(mut self, doorbells: Vec<Arc<Doorbell>>) -> Workers<D> {
        self.doorbells = doorbells;
        self
    }

    pub fn count(&self) -> usize {
        self.jobs.len()
    }

    /// The worker owning port `name`.
    pub fn owner(&self, name: &str) -> Option<usize> {
        self.ports.get(name).map(|p| p.worker)
    }

    /// Runs `f` on worker `w` and waits for its result (also how the daemon hands
    /// every worker an underlay change: `crate::underlay::UnderlayWatch`).
    pub fn call<R: Send + 'static>(
        &self,
        w: usize,
        f: impl FnOnce(&mut D) -> R + Send + 'static,
    ) -> Result<R, DataplaneError> {
        let gone = || DataplaneError::Stopped(w);
        let tx = self.jobs.get(w).ok_or_else(gone)?;
        let (rtx, rrx) = mpsc::channel();
        tx.send(Box::new(move |dp: &mut D| {
            let _ = rtx.send(f(dp));
        }))
        .map_err(|_| gone())?;
        if let Some(d) = self.doorbells.get(w) {
            d.ring();
        }
        rrx.recv().map_err(|_| gone())
    }

    /// Runs a fallible change on the owner of `port`.
    fn on_owner<R: Send + 'static>(
        &self,
        port: &str,
        f: impl FnOnce(&mut D) -> Result<R, DataplaneError> + Send + 'static,
    ) -> Result<R, DataplaneError> {
        let w = self
            .owner(port)
            .ok_or_else(|| DataplaneError::NoSuchPort(port.to_string()))?;
        self.call(w, f)?
    }

    /// Applies `change` on every worker, worker 0 first; if a worker refuses (or
    /// has stopped), `undo` runs on the workers that had applied it and the first
    /// refusal is returned.
    fn on_all(
        &self,
        change: impl Fn(&mut D) -> Result<(), DataplaneError> + Clone + Send + 'static,
        undo: impl Fn(&mut D) + Clone + Send + 'static,
    ) -> Result<(), DataplaneError> {
        for w in 0..self.jobs.len() {
            let r = self.call(w, change.clone()).and_then(|r| r);
            if let Err(e) = r {
                for done in (0..w).rev() {
                    if let Err(u) = self.call(done, undo.clone()) {
                        tracing::error!(worker = done, error = %u, "change not undone");
                    }
                }
                let e = match w {
                    0 => e,
                    worker => DataplaneError::OnWorker {
                        worker,
                        error: Box::new(e),
                    },
                };
                return Err(e);
            }
        }
        Ok(())
    }

    /// Tells every worker who owns (`vni`, `mac`). Cannot be refused; fails only
    /// if a worker has stopped.
    fn announce(&self, key: &PortKey, owner: Option<usize>) -> Result<(), DataplaneError> {
        for w in 0..self.jobs.len() {
            let key = key.clone();
            self.call(w, move |dp: &mut D| dp.set_port_owner(&key, owner))?;
        }
        Ok(())
    }

    /// Ports per worker.
    fn loads(&self) -> Vec<usize> {
        let mut loads = vec![0; self.jobs.len()];
        for p in self.ports.values() {
            if let Some(n) = loads.get_mut(p.worker) {
                *n += 1;
            }
        }
        loads
    }

    /// Every worker's report and view, one call per worker (answered between its
    /// rounds, so the fast path takes no lock): the reports merged by type
    /// ([`WorkerReport::merge`]), the views with the ports each worker owns.
    fn gather(&self) -> Result<(Option<WorkerReport>, Vec<WorkerView>), DataplaneError> {
        let mut merged: Option<WorkerReport> = None;
        let mut views = Vec::with_capacity(self.jobs.len());
        for w in 0..self.jobs.len() {
            let (report, info) = self.call(w, |dp: &mut D| (dp.report(), dp.info()))?;
            let ports = self.ports.iter().filter(|(_, p)| p.worker == w);
            let ports = ports.map(|(name, _)| name.clone()).collect();
            views.push(WorkerView::new(w, ports, info, &report.worker));
            match &mut merged {
                Some(m) => m.merge(report),
                None => merged = Some(report),
            }
        }
        Ok((merged, views))
    }

    /// Every worker's `stats`, merged, plus each worker's view and the underlay
    /// links' counters (with the frames the workers sent through each).
    fn merged_stats(&mut self) -> Result<Value, DataplaneError> {
        let (merged, views) = self.gather()?;
        let tx = merged
            .as_ref()
            .map(|m| m.underlay_tx.clone())
            .unwrap_or_default();
        let mut v = json(merged)?;
        if let Value::Object(m) = &mut v {
            let views = json(views)?;
            m.insert("workers".into(), views);
            if let Some(f) = self.shared_stats.as_mut() {
                let mut links = f();
                add_link_tx(&mut links, &tx);
                m.insert("underlay".into(), links);
            }
        }
        Ok(v)
    }
}

/// Adds to each underlay link of `links` (`stats`' `underlay`) the frames the
/// workers sent through it (0 for a link none went through).
fn add_link_tx(links: &mut Value, tx: &UnderlayTx) {
    for link in links.as_array_mut().into_iter().flatten() {
        let ifindex = link["ifindex"].as_u64().and_then(|i| u32::try_from(i).ok());
        let counts = ifindex.and_then(|i| tx.get(i).copied()).unwrap_or_default();
        if let Value::Object(l) = link {
            l.insert("tx_frames".into(), counts.tx_frames.into());
            l.insert("tx_super_frames".into(), counts.tx_super_frames.into());
        }
    }
}

/// A merged report as JSON.
fn json(v: impl serde::Serialize) -> Result<Value, DataplaneError> {
    serde_json::to_value(v).map_err(|error| DataplaneError::Encode {
        what: "the workers' statistics",
        error,
    })
}

impl<D: WorkerPlane + 'static> Dataplane for Workers<D> {
    fn add_port(&mut self, p: &PortInfo, tables: &PortTables) -> Result<(), DataplaneError> {
        let w = least_loaded(&self.loads());
        let (info, tables) = (p.clone(), tables.clone());
        self.call(w, move |dp: &mut D| dp.add_port(&info, &tables))??;
        let (name, key) = (p.config.name.clone(), PortKey::of(p));
        if let Err(e) = self.announce(&key, Some(w)) {
            let _ = self.announce(&key, None);
            let n = name.clone();
            let _ = self.call(w, move |dp: &mut D| dp.remove_port(&n));
            return Err(e);
        }
        self.ports.insert(name, Placement { worker: w, key });
        tracing::info!(port = %p.config.name, worker = w, "port placed");
        Ok(())
    }

    fn remove_port(&mut self, name: &str) -> Result<(), DataplaneError> {
        let place = self
            .ports
            .get(name)
            .cloned()
            .ok_or_else(|| DataplaneError::NoSuchPort(name.to_string()))?;
        let n = name.to_string();
        self.call(place.worker, move |dp: &mut D| dp.remove_port(&n))??;
        self.ports.remove(name);
        // The port is gone whatever happens next; a worker that missed this
        // hands frames for it to the old owner, which counts them as no_port.
        self.announce(&place.key, None)
    }

    fn set_v2p(&mut self, e: &V2pEntry) -> Result<(), DataplaneError> {
        let key = (e.vni, e.vpc_ip);
        let old = self.v2p.get(&key).copied();
        let new = *e;
        self.on_all(
            move |dp: &mut D| dp.set_v2p(&new),
            move |dp: &mut D| {
                let _ = match old {
                    Some(o) => dp.set_v2p(&o),
                    None => dp.clear_v2p(new.vpc_ip, new.vni),
                };
            },
        )?;
        self.v2p.insert(key, new);
        Ok(())
    }

    /// One job per worker for the whole batch.
    fn add_v2p_batch(&mut self, entries: &[V2pEntry]) -> Result<(), DataplaneError> {
        let batch: Arc<[V2pEntry]> = entries.into();
        let added = batch.clone();
        self.on_all(
            move |dp: &mut D| dp.add_v2p_batch(&batch),
            move |dp: &mut D| {
                for e in added.iter() {
                    let _ = dp.clear_v2p(e.vpc_ip, e.vni);
                }
            },
        )?;
        self.v2p
            .extend(entries.iter().map(|e| ((e.vni, e.vpc_ip), *e)));
        Ok(())
    }

    fn clear_v2p(&mut self, vpc_ip: IpAddr, vni: Vni) -> Result<(), DataplaneError> {
        let old = self.v2p.get(&(vni, vpc_ip)).copied();
        self.on_all(
            move |dp: &mut D| dp.clear_v2p(vpc_ip, vni),
            move |dp: &mut D| {
                if let Some(o) = old {
                    let _ = dp.set_v2p(&o);
                }
            },
        )?;
        self.v2p.remove(&(vni, vpc_ip));
        Ok(())
    }

    fn set_v2b(&mut self, table: &V2b) -> Result<(), DataplaneError> {
        let (new, old) = (table.clone(), self.v2b.clone());
        self.on_all(
            move |dp: &mut D| dp.set_v2b(&new),
            move |dp: &mut D| {
                let _ = dp.set_v2b(&old);
            },
        )?;
        self.v2b = table.clone();
        Ok(())
    }

    fn set_routes(&mut self, port: &str, routes: &[RouteEntry]) -> Result<(), DataplaneError> {
        let (n, r) = (port.to_string(), routes.to_vec());
        self.on_owner(port, move |dp: &mut D| dp.set_routes(&n, &r))
    }

    fn routes(&self, port: &str) -> Result<Vec<RouteEntry>, DataplaneError> {
        let n = port.to_string();
        self.on_owner(port, move |dp: &mut D| dp.routes(&n))
    }

    fn set_fw_rules(&mut self, port: &str, rules: &[FwRule]) -> Result<(), DataplaneError> {
        let (n, r) = (port.to_string(), rules.to_vec());
        self.on_owner(port, move |dp: &mut D| dp.set_fw_rules(&n, &r))
    }

    fn set_port_paused(&mut self, port: &str, paused: bool) -> Result<(), DataplaneError> {
        let n = port.to_string();
        self.on_owner(port, move |dp: &mut D| dp.set_port_paused(&n, paused))
    }

    fn port_state(&self, port: &str) -> Result<PortState, DataplaneError> {
        let n = port.to_string();
        self.on_owner(port, move |dp: &mut D| dp.port_state(&n))
    }

    fn clear_uft(&mut self, port: &str) -> Result<(), DataplaneError> {
        let n = port.to_string();
        self.on_owner(port, move |dp: &mut D| dp.clear_uft(&n))
    }

    fn clear_lft(&mut self, port: &str, layer: &str) -> Result<u64, DataplaneError> {
        let (n, layer) = (port.to_string(), layer.to_string());
        self.on_owner(port, move |dp: &mut D| dp.clear_lft(&n, &layer))
    }

    fn export_live(&mut self, port: &str) -> Result<LiveState, DataplaneError> {
        let n = port.to_string();
        self.on_owner(port, move |dp: &mut D| dp.export_live(&n))
    }

    fn import_live(&mut self, port: &str, flows: &LiveState) -> Result<Imported, DataplaneError> {
        let (n, flows) = (port.to_string(), flows.clone());
        self.on_owner(port, move |dp: &mut D| dp.import_live(&n, &flows))
    }

    /// On every worker: a frame for the guest may arrive at any of them.
    fn relay_departed(
        &mut self,
        vni: Vni,
        mac: MacAddr,
        to: Option<Ipv6Addr>,
    ) -> Result<(), DataplaneError> {
        self.on_all(
            move |dp: &mut D| dp.relay_departed(vni, mac, to),
            move |dp: &mut D| {
                let _ = dp.relay_departed(vni, mac, None);
            },
        )
    }

    fn set_external_ips(&mut self, port: &str, ext: &ExternalIps) -> Result<(), DataplaneError> {
        let (n, ext) = (port.to_string(), ext.clone());
        self.on_owner(port, move |dp: &mut D| dp.set_external_ips(&n, &ext))
    }

    fn set_port_limits(&mut self, port: &str, limits: &PortLimits) -> Result<(), DataplaneError> {
        let (n, limits) = (port.to_string(), *limits);
        self.on_owner(port, move |dp: &mut D| dp.set_port_limits(&n, &limits))
    }

    fn set_port_cidrs(&mut self, port: &str, cidrs: &PortCidrs) -> Result<(), DataplaneError> {
        let (n, cidrs) = (port.to_string(), cidrs.clone());
        self.on_owner(port, move |dp: &mut D| dp.set_port_cidrs(&n, &cidrs))
    }

    fn inspect(&mut self, what: &Inspect) -> Result<Value, DataplaneError> {
        let port = match what {
            Inspect::Stats { port: None } => return self.merged_stats(),
            Inspect::Workers => {
                let (_, views) = self.gather()?;
                return json(views);
            }
            // Every worker holds the same table.
            Inspect::V2b => return self.call(0, |dp: &mut D| dp.inspect(&Inspect::V2b))?,
            Inspect::Stats { port: Some(p) }
            | Inspect::Layer { port: p, .. }
            | Inspect::Uft { port: p, .. }
            | Inspect::Mtu { port: p }
            | Inspect::Ra { port: p }
            | Inspect::Layers { port: p }
            | Inspect::TcpFlows { port: p } => p.clone(),
        };
        let w = what.clone();
        self.on_owner(&port, move |dp: &mut D| dp.inspect(&w))
    }
}

/// A `list-ports` answer with each port's link state filled in, asked of the
/// workers that serve the taps; any other answer as it is.
impl Workers<Datapath> {
    pub fn with_port_links(&self, out: Outcome) -> Outcome {
        let Outcome::Ok(Reply::Ports(mut ports)) = out else {
            return out;
        };
        let mut links = HashMap::new();
        for w in 0..self.count() {
            match self.call(w, |dp: &mut Datapath| dp.port_links()) {
                Ok(l) => links.extend(l),
                Err(e) => tracing::warn!(worker = w, error = %e, "port link states not read"),
            }
        }
        for p in &mut ports {
            if let Some((link, vhost)) = links.remove(&p.port.config.name) {
                p.link = Some(link);
                p.vhost_negotiated = vhost;
            }
        }
        Outcome::Ok(Reply::Ports(ports))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::Controller;
    use crate::worker::jobs::{serve_jobs, Job};
    use crate::worker::stats::WorkerInfo;
    use api::testing::sample_port;
    use api::{MacAddr, Request};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::thread;

    /// A worker's dataplane that records what it holds and refuses on command.
    #[derive(Default, Debug)]
    struct Fake {
        ports: Vec<String>,
        v2p: Vec<V2pEntry>,
        v2b: V2b,
        owners: BTreeMap<(u32, MacAddr), usize>,
        departed: BTreeMap<(u32, MacAddr), Ipv6Addr>,
        refuse_v2p: bool,
        stats: u64,
    }

    impl Dataplane for Fake {
        fn add_port(&mut self, p: &PortInfo, _: &PortTables) -> Result<(), DataplaneError> {
            self.ports.push(p.config.name.clone());
            Ok(())
        }
        fn remove_port(&mut self, name: &str) -> Result<(), DataplaneError> {
            let before = self.ports.len();
            self.ports.retain(|n| n != name);
            if before == self.ports.len() {
                return Err(DataplaneError::NoSuchPort(name.to_string()));
            }
            Ok(())
        }
        fn set_v2p(&mut self, e: &V2pEntry) -> Result<(), DataplaneError> {
            if self.refuse_v2p {
                return Err(refusing(e.vpc_ip));
            }
            self.v2p
                .retain(|o| !(o.vpc_ip == e.vpc_ip && o.vni == e.vni));
            self.v2p.push(*e);
            Ok(())
        }
        fn clear_v2p(&mut self, ip: IpAddr, vni: Vni) -> Result<(), DataplaneError> {
            if self.refuse_v2p {
                return Err(refusing(ip));
            }
            self.v2p.retain(|o| !(o.vpc_ip == ip && o.vni == vni));
            Ok(())
        }
        fn set_v2b(&mut self, table: &V2b) -> Result<(), DataplaneError> {
            if self.refuse_v2p {
                return Err(refusing("the V2B table"));
            }
            self.v2b = table.clone();
            Ok(())
        }
        fn set_routes(&mut self, port: &str, _: &[RouteEntry]) -> Result<(), DataplaneError> {
            self.has(port)
        }
        fn routes(&self, port: &str) -> Result<Vec<RouteEntry>, DataplaneError> {
            self.has(port).map(|()| Vec::new())
        }
        fn set_fw_rules(&mut self, port: &str, _: &[FwRule]) -> Result<(), DataplaneError> {
            self.has(port)
        }
        fn set_port_paused(&mut self, port: &str, _: bool) -> Result<(), DataplaneError> {
            self.has(port)
        }
        fn port_state(&self, port: &str) -> Result<PortState, DataplaneError> {
            self.has(port).map(|()| PortState::Ready)
        }
        fn clear_uft(&mut self, port: &str) -> Result<(), DataplaneError> {
            self.has(port)
        }
        fn clear_lft(&mut self, port: &str, _: &str) -> Result<u64, DataplaneError> {
            self.has(port).map(|()| 0)
        }
        fn export_live(&mut self, port: &str) -> Result<LiveState, DataplaneError> {
            self.has(port).map(|()| LiveState::default())
        }
        fn import_live(&mut self, port: &str, f: &LiveState) -> Result<Imported, DataplaneError> {
            self.has(port).map(|()| Imported {
                connections: f.connections.len(),
                snat_ports: f.nat.snat.len(),
            })
        }
        fn relay_departed(
            &mut self,
            vni: Vni,
            mac: MacAddr,
            to: Option<Ipv6Addr>,
        ) -> Result<(), DataplaneError> {
            match to {
                Some(to) => self.departed.insert((vni.get(), mac), to),
                None => self.departed.remove(&(vni.get(), mac)),
            };
            Ok(())
        }
        fn set_external_ips(&mut self, port: &str, _: &ExternalIps) -> Result<(), DataplaneError> {
            self.has(port)
        }
        fn set_port_limits(&mut self, port: &str, _: &PortLimits) -> Result<(), DataplaneError> {
            self.has(port)
        }
        fn set_port_cidrs(&mut self, port: &str, _: &PortCidrs) -> Result<(), DataplaneError> {
            self.has(port)
        }
        fn inspect(&mut self, what: &Inspect) -> Result<Value, DataplaneError> {
            Ok(serde_json::json!({ "asked": format!("{what:?}"), "ports": self.ports }))
        }
    }

    fn refusing(what: impl std::fmt::Display) -> DataplaneError {
        DataplaneError::Guest {
            device: "fake",
            port: String::new(),
            error: std::io::Error::other(format!("refusing {what}")),
        }
    }

    impl Fake {
        fn has(&self, port: &str) -> Result<(), DataplaneError> {
            if self.ports.iter().any(|p| p == port) {
                Ok(())
            } else {
                Err(DataplaneError::NoSuchPort(port.to_string()))
            }
        }
    }

    impl WorkerPlane for Fake {
        fn set_port_owner(&mut self, key: &PortKey, owner: Option<usize>) {
            match owner {
                Some(w) => self.owners.insert((key.vni.get(), key.mac), w),
                None => self.owners.remove(&(key.vni.get(), key.mac)),
            };
        }

        /// `stats` as its counters: epoch, drops and rounds; the V2P count.
        fn report(&mut self) -> WorkerReport {
            let addr = "fd00::1".parse().unwrap();
            let mut e = engine::Engine::new(engine::EngineConfig::new(addr))
                .unwrap()
                .stats();
            e.epoch = self.stats;
            e.v2p_entries = self.v2p.len();
            e.datapath_drops.add(engine::DropReason::NoPort, self.stats);
            let w = crate::worker::stats::WorkerStats {
                rounds: self.stats,
                ..Default::default()
            };
            WorkerReport::new(e, w, None, None, Default::default())
        }

        fn info(&self) -> WorkerInfo {
            WorkerInfo {
                core: Some(self.stats as usize),
                ..WorkerInfo::default()
            }
        }
    }

    /// `n` worker threads serving jobs on a `Fake` each until dropped.
    struct Pool {
        stop: Arc<AtomicBool>,
        threads: Vec<thread::JoinHandle<()>>,
    }

    impl Drop for Pool {
        fn drop(&mut self) {
            self.stop.store(true, Ordering::Relaxed);
            for t in self.threads.drain(..) {
                t.join().unwrap();
            }
        }
    }

    fn pool(fakes: Vec<Fake>) -> (Workers<Fake>, Pool) {
        let stop = Arc::new(AtomicBool::new(false));
        let mut jobs = Vec::new();
        let mut threads = Vec::new();
        for mut fake in fakes {
            let (tx, rx) = mpsc::channel::<Job<Fake>>();
            jobs.push(tx);
            let stop = stop.clone();
            threads.push(thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if serve_jobs(&rx, &mut fake) == 0 {
                        thread::sleep(std::time::Duration::from_micros(200));
                    }
                }
            }));
        }
        (Workers::new(jobs, None), Pool { stop, threads })
    }

    /// What worker `w` holds, read on its own thread.
    fn peek<R: Send + 'static>(ws: &Workers<Fake>, w: usize, f: fn(&Fake) -> R) -> R {
        ws.call(w, move |dp: &mut Fake| f(dp)).unwrap()
    }

    fn port(name: &str, last: u8) -> PortInfo {
        PortInfo {
            config: sample_port(name, last),
            netns: None,
            vhost_user: None,
            attach: None,
        }
    }

    fn v2p(ip: &str) -> V2pEntry {
        V2pEntry {
            vpc_ip: ip.parse().unwrap(),
            vpc_mac: "a8:40:25:ff:00:09".parse().unwrap(),
            underlay_ip: "fd00:99::2".parse().unwrap(),
            vni: Vni::new(1701).unwrap(),
        }
    }

    #[test]
    fn least_loaded_prefers_fewest_then_lowest_index() {
        assert_eq!(least_loaded(&[0]), 0);
        assert_eq!(least_loaded(&[0, 0]), 0);
        assert_eq!(least_loaded(&[1, 0]), 1);
        assert_eq!(least_loaded(&[2, 1, 1]), 1);
        assert_eq!(least_loaded(&[1, 1, 0]), 2);
        assert_eq!(least_loaded(&[]), 0);
    }

    /// Ports alternate between two workers, a freed worker gets the next port,
    /// every worker learns every port's owner, and per-port requests reach the
    /// owner only.
    #[test]
    fn ports_spread_least_loaded_and_owners_are_announced() {
        let (mut ws, _pool) = pool(vec![Fake::default(), Fake::default()]);
        for (i, name) in ["p0", "p1", "p2"].iter().enumerate() {
            ws.add_port(&port(name, 5 + i as u8), &PortTables::default())
                .unwrap();
        }
        assert_eq!(peek(&ws, 0, |f| f.ports.clone()), ["p0", "p2"]);
        assert_eq!(peek(&ws, 1, |f| f.ports.clone()), ["p1"]);
        for w in 0..2 {
            let owners = peek(&ws, w, |f| f.owners.values().copied().collect::<Vec<_>>());
            let mut owners = owners;
            owners.sort_unstable();
            assert_eq!(owners, [0, 0, 1], "worker {w} knows every owner");
        }
        ws.remove_port("p0").unwrap();
        assert_eq!(peek(&ws, 1, |f| f.owners.len()), 2, "p0 forgotten");
        // Worker 0 now has one port, worker 1 one: a tie goes to worker 0.
        ws.add_port(&port("p3", 9), &PortTables::default()).unwrap();
        assert_eq!(ws.owner("p3"), Some(0));
        ws.add_port(&port("p4", 10), &PortTables::default())
            .unwrap();
        assert_eq!(ws.owner("p4"), Some(1));
        // Per-port requests go to the owner (the fake refuses ports it lacks).
        ws.set_routes("p1", &[]).unwrap();
        ws.clear_uft("p4").unwrap();
        ws.set_fw_rules("p3", &[]).unwrap();
        let v = ws.inspect(&Inspect::Mtu { port: "p1".into() }).unwrap();
        assert_eq!(v["ports"], serde_json::json!(["p1", "p4"]));
        assert!(ws.remove_port("p0").unwrap_err().to_string().contains("p0"));
    }

    /// A global change refused by any worker changes no worker: the workers that
    /// had applied it get the previous entry back, or lose the new one.
    #[test]
    fn v2b_reaches_every_worker_or_none() {
        let (mut ws, _pool) = pool(vec![
            Fake::default(),
            Fake {
                refuse_v2p: true,
                ..Fake::default()
            },
        ]);
        let mut old = V2b::default();
        old.set("::/0".parse().unwrap(), &["fd00:99::b1".parse().unwrap()])
            .unwrap();
        ws.call(1, |f: &mut Fake| f.refuse_v2p = false).unwrap();
        ws.set_v2b(&old).unwrap();
        ws.call(1, |f: &mut Fake| f.refuse_v2p = true).unwrap();
        let mut new = old.clone();
        new.set(
            "0.0.0.0/0".parse().unwrap(),
            &["fd00:99::b2".parse().unwrap()],
        )
        .unwrap();
        ws.set_v2b(&new).unwrap_err();
        for w in 0..2 {
            assert_eq!(peek(&ws, w, |f| f.v2b.clone()), old, "worker {w}");
        }
        ws.call(1, |f: &mut Fake| f.refuse_v2p = false).unwrap();
        ws.set_v2b(&new).unwrap();
        for w in 0..2 {
            assert_eq!(peek(&ws, w, |f| f.v2b.clone()), new, "worker {w}");
        }
    }

    #[test]
    fn v2p_refused_by_a_later_worker_is_rolled_back() {
        let (mut ws, _pool) = pool(vec![
            Fake::default(),
            Fake::default(),
            Fake {
                refuse_v2p: true,
                ..Fake::default()
            },
        ]);
        let e = ws.set_v2p(&v2p("10.0.0.9")).unwrap_err().to_string();
        assert!(e.contains("worker 2") && e.contains("10.0.0.9"), "{e}");
        for w in 0..3 {
            assert!(peek(&ws, w, |f| f.v2p.is_empty()), "worker {w} kept it");
        }
        // With an earlier value present, the rollback restores it.
        ws.call(2, |f: &mut Fake| f.refuse_v2p = false).unwrap();
        let old = v2p("10.0.0.9");
        ws.set_v2p(&old).unwrap();
        ws.call(2, |f: &mut Fake| f.refuse_v2p = true).unwrap();
        let mut moved = old;
        moved.underlay_ip = "fd00:99::3".parse().unwrap();
        ws.set_v2p(&moved).unwrap_err();
        ws.clear_v2p(old.vpc_ip, old.vni).unwrap_err();
        for w in 0..3 {
            assert_eq!(peek(&ws, w, |f| f.v2p.clone()), [old], "worker {w}");
        }
        // Accepted everywhere: applied everywhere.
        ws.call(2, |f: &mut Fake| f.refuse_v2p = false).unwrap();
        ws.set_v2p(&moved).unwrap();
        for w in 0..3 {
            assert_eq!(peek(&ws, w, |f| f.v2p.clone()), [moved], "worker {w}");
        }
    }

    /// Through the controller: a refusal by worker 0 (the validation) reaches the
    /// client unchanged and nothing is recorded.
    #[test]
    fn controller_over_workers_refuses_atomically() {
        let (ws, _pool) = pool(vec![
            Fake {
                refuse_v2p: true,
                ..Fake::default()
            },
            Fake::default(),
        ]);
        let mut c = Controller::new(ws, None);
        let Outcome::Error(e) = c.handle(Request::set_v2p(v2p("10.0.0.7"))) else {
            panic!("accepted");
        };
        assert!(e.message.ends_with("refusing 10.0.0.7"), "{e}");
        assert!(c.state().v2p.is_empty());
        assert!(peek(c.dataplane(), 1, |f| f.v2p.is_empty()));
        let r = c.handle(Request::CreatePort(Box::new(PortInfo {
            config: sample_port("opte0", 5),
            netns: None,
            vhost_user: None,
            attach: None,
        })));
        assert!(matches!(r, Outcome::Ok(_)), "{r:?}");
        assert_eq!(c.dataplane().owner("opte0"), Some(0));
    }

    /// Stats of all workers: counters summed, port lists joined, the V2P count
    /// and epoch not added up, and the placement listed.
    #[test]
    fn stats_merge_across_workers() {
        let (mut ws, _pool) = pool(vec![
            Fake {
                stats: 3,
                ..Fake::default()
            },
            Fake {
                stats: 4,
                ..Fake::default()
            },
        ]);
        ws.add_port(&port("p0", 5), &PortTables::default()).unwrap();
        ws.add_port(&port("p1", 6), &PortTables::default()).unwrap();
        ws.set_v2p(&v2p("10.0.0.9")).unwrap();
        let v = ws.inspect(&Inspect::Stats { port: None }).unwrap();
        assert_eq!(v["version"], crate::worker::stats::STATS_VERSION);
        assert_eq!(v["worker"]["rounds"], 7);
        assert_eq!(v["engine"]["datapath_drops"]["no_port_for_vni_mac"], 7);
        assert_eq!(v["engine"]["v2p_entries"], 1);
        assert_eq!(v["engine"]["epoch"], 4);
        assert_eq!(v["workers"][1]["ports"], serde_json::json!(["p1"]));
        assert_eq!(v["workers"][1]["core"], 4);
        let w = ws.inspect(&Inspect::Workers).unwrap();
        assert_eq!(w, v["workers"]);
        assert_eq!(w[0]["ports"], serde_json::json!(["p0"]));
        assert_eq!(w[0]["rounds"], 3);
    }

    /// A stopped worker is an error naming it, not a hang.
    #[test]
    fn stopped_worker_is_reported() {
        let (tx, rx) = mpsc::channel::<Job<Fake>>();
        drop(rx);
        let mut ws = Workers::new(vec![tx], None);
        let e = ws
            .add_port(&port("p0", 5), &PortTables::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("worker 0 has stopped"), "{e}");
        assert_eq!(ws.owner("p0"), None);
    }
}
