//! The fleet rack (docs/fleet.md): a [`Rack`] whose sleds' daemons are members of
//! a fleet, and the three-member etcd [`Cluster`] they follow, on the same bridge.
//!
//! Each sled's `overlayd` runs with `--fleet-endpoints` (every member),
//! `--fleet-cert/-key/-ca` (its own client certificate, CN [`sled_user`]) and
//! `--sled-id` (that user). [`FleetRack::add_guest`] grants the sled the guest's
//! VPC before the port exists, as a control plane does when it places a port.
//! The control plane's writes go through `xdeadm fleet ...` with the writer's
//! certificate, run in the cluster's control-plane namespace; what the sleds make
//! of them is read back with `xdeadm --json fleet status` and `dump-v2p`, parsed
//! with the API's own types.
//!
//! Every daemon logs each batch of the store's changes it applies
//! ([`applied::BATCH_APPLIED`], at debug level): [`FleetRack::applied_batches`]
//! reads them back, so a test measures how long a change took to reach each sled
//! without polling. [`StoreClient`] is the control plane as one long-lived client
//! of the store, for tests that write many changes a second.
//!
//! Nothing here owns anything the rack and the cluster do not: dropping a
//! [`FleetRack`] drops the rack first (its daemons stop while the store is still
//! up, so their status leases are revoked at once), then the cluster. Both carry
//! unique names, so fleet tests run in parallel.

pub mod applied;
pub mod client;

pub use applied::{Batch, Distribution};
pub use client::{Commit, StoreClient};

use crate::bins::bins;
use crate::etcd::{sled_user, Cluster, TlsFiles, WRITER};
use crate::guest::GuestSpec;
use crate::poll::poll_until;
use crate::rack::{Rack, RackSpec};
use crate::{Error, Result};
use api::fleet::{FleetStatus, SledStatus};
use api::{Reply, Source, V2pEntry};
use std::time::{Duration, Instant};

/// The members of the fleet's store.
pub const MEMBERS: usize = 3;

/// How long a change may take to reach a sled on a loaded 2-core machine: docs/fleet.md
/// promises a second; the margin is for CPU starvation and a watcher that is
/// between two reconnects.
pub const CONVERGE: Duration = Duration::from_secs(30);

/// The daemons' log filter: the default, and each applied batch of the store's
/// changes ([`applied::BATCH_APPLIED`]).
pub const LOG_LEVEL: &str = "info,overlayd::controller::fleet=debug";

/// Prints how long a test took when it ends (passed or not): dropped last.
pub struct Took(pub &'static str, pub Instant);

impl Took {
    pub fn new(test: &'static str) -> Took {
        Took(test, Instant::now())
    }
}

impl Drop for Took {
    fn drop(&mut self) {
        eprintln!("{}: {:.1?} in all", self.0, self.1.elapsed());
    }
}

/// A rack of sleds in a fleet, and its store. Fields drop in order: the rack (and
/// its daemons) first, then the cluster.
#[derive(Debug)]
pub struct FleetRack {
    pub rack: Rack,
    pub etcd: Cluster,
}

impl FleetRack {
    /// Builds a rack of `sleds` sleds (namespace prefix `prefix`), starts a
    /// [`MEMBERS`]-member cluster on it and a fleet daemon on every sled. No guest
    /// yet, nothing in the store.
    pub fn start(prefix: &str, sleds: usize) -> Result<FleetRack> {
        let rack = Rack::build(&RackSpec::new(prefix, sleds))?;
        let etcd = Cluster::start(&rack, MEMBERS)?;
        let mut fleet = FleetRack { rack, etcd };
        for i in 0..sleds {
            fleet.start_daemon(i)?;
        }
        Ok(fleet)
    }

    /// The fleet flags of a daemon presenting `tls` as sled `sled_id`.
    pub fn flags(&self, tls: &TlsFiles, sled_id: &str) -> Vec<String> {
        let path = |p: &std::path::Path| p.display().to_string();
        vec![
            "--fleet-endpoints".into(),
            self.etcd.endpoints(),
            "--fleet-cert".into(),
            path(&tls.cert),
            "--fleet-key".into(),
            path(&tls.key),
            "--fleet-ca".into(),
            path(&tls.ca),
            "--sled-id".into(),
            sled_id.into(),
            "--log-level".into(),
            LOG_LEVEL.into(),
        ]
    }

    /// Starts sled `sled`'s daemon as itself: its own certificate and sled id.
    pub fn start_daemon(&mut self, sled: usize) -> Result<()> {
        let user = sled_user(sled);
        let tls = self.etcd.credentials(&user)?;
        self.start_daemon_as(sled, &tls, &user)
    }

    /// Starts sled `sled`'s daemon presenting `tls` as `sled_id` (another sled's
    /// certificate, an expired one...), on the sled's own state directory.
    pub fn start_daemon_as(&mut self, sled: usize, tls: &TlsFiles, sled_id: &str) -> Result<()> {
        let flags = self.flags(tls, sled_id);
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        self.rack.start_daemon(sled, &flags)
    }

    /// Grants the guest's sled its VPC, then creates the guest (see
    /// [`Rack::add_guest`]). No V2P anywhere: that is the fleet's job.
    pub fn add_guest(&mut self, spec: GuestSpec) -> Result<usize> {
        self.etcd.grant_vni(spec.sled, spec.vni)?;
        self.rack.add_guest(spec)
    }

    /// Moves guest `name` to sled `to` (see [`Rack::move_guest`]), granting `to`
    /// the guest's VPC first. V2P is the caller's to rewrite.
    pub fn move_guest(&mut self, name: &str, to: usize) -> Result<()> {
        let vni = self.rack.guest(name)?.spec.vni;
        self.etcd.grant_vni(to, vni)?;
        self.rack.move_guest(name, to)
    }

    /// A long-lived client of the store with the writer's certificate, from the
    /// control-plane namespace (see [`StoreClient`]).
    pub fn store_client(&self) -> Result<StoreClient> {
        StoreClient::connect(&self.etcd)
    }

    /// Runs `xdeadm --json fleet ARGS...` as the control plane's writer (its
    /// certificate, from the control-plane namespace), with `stdin` if given
    /// (`load -`). Returns the store's revision after the writes.
    pub fn writer(&self, args: &[&str], stdin: Option<&str>) -> Result<i64> {
        let tls = self.etcd.credentials(WRITER)?;
        let mut cmd = self
            .etcd
            .control_ns()?
            .cmd(&bins()?.xdeadm.display().to_string())
            .args(["--json", "fleet"])
            .args(args.iter().copied())
            .args(["--endpoints", &self.etcd.endpoints()])
            .arg("--cert")
            .arg(tls.cert.display().to_string())
            .arg("--key")
            .arg(tls.key.display().to_string())
            .arg("--ca")
            .arg(tls.ca.display().to_string());
        if let Some(input) = stdin {
            cmd = cmd.stdin(input);
        }
        let out = cmd.run()?;
        let v: serde_json::Value = serde_json::from_str(&out)
            .map_err(|e| Error::new(format!("xdeadm fleet printed no JSON ({e}): {out}")))?;
        v["revision"]
            .as_i64()
            .ok_or_else(|| Error::new(format!("no revision in xdeadm fleet's {out}")))
    }

    /// The V2P mappings of `guests` (each address of each guest to its sled's
    /// underlay address), as `fleet load` and `dump-v2p` write them.
    pub fn v2p_of(&self, guests: &[&GuestSpec]) -> Result<Vec<V2pEntry>> {
        let mut v = Vec::new();
        for g in guests {
            let underlay_ip = self.rack.sled(g.sled)?.addr;
            for vpc_ip in g.addresses() {
                v.push(V2pEntry {
                    vpc_ip,
                    vpc_mac: g.mac.parse().map_err(|e| Error::new(format!("{e:?}")))?,
                    underlay_ip,
                    vni: api::Vni::new(g.vni).map_err(|e| Error::new(format!("{e:?}")))?,
                });
            }
        }
        Ok(v)
    }

    /// Writes `put` and deletes `clear` in one `fleet load`; returns the revision.
    pub fn load(&self, put: &[V2pEntry], clear: &[V2pEntry]) -> Result<i64> {
        let clear: Vec<serde_json::Value> = clear
            .iter()
            .map(|e| serde_json::json!({"vni": e.vni, "vpc_ip": e.vpc_ip}))
            .collect();
        let doc = serde_json::json!({"v2p": put, "clear_v2p": clear});
        self.writer(&["load", "-"], Some(&doc.to_string()))
    }

    /// Publishes the V2P mappings of `guests` (one `fleet load`); returns the
    /// revision.
    pub fn publish(&self, guests: &[&GuestSpec]) -> Result<i64> {
        self.load(&self.v2p_of(guests)?, &[])
    }

    /// Deletes the V2P mappings of `guests` from the store; returns the revision.
    pub fn unpublish(&self, guests: &[&GuestSpec]) -> Result<i64> {
        self.load(&[], &self.v2p_of(guests)?)
    }

    /// `xdeadm --json fleet status` of sled `sled`.
    pub fn fleet_status(&self, sled: usize) -> Result<FleetStatus> {
        let out = self
            .rack
            .sled(sled)?
            .admin(&["--json", "fleet", "status"])?;
        match reply(&out)? {
            Reply::Fleet(s) => Ok(*s),
            other => Err(Error::new(format!("fleet status answered {other:?}"))),
        }
    }

    /// The V2P mappings sled `sled` holds from the fleet (`dump-v2p --json`,
    /// source `fleet`), sorted.
    pub fn fleet_v2p(&self, sled: usize) -> Result<Vec<V2pEntry>> {
        let out = self.rack.sled(sled)?.admin(&["--json", "dump-v2p"])?;
        let Reply::V2p(records) = reply(&out)? else {
            return Err(Error::new(format!("dump-v2p answered {out}")));
        };
        let mut v: Vec<V2pEntry> = records
            .into_iter()
            .filter(|r| r.source == Source::Fleet)
            .map(|r| r.entry)
            .collect();
        v.sort_by_key(|e| (e.vni, e.vpc_ip));
        Ok(v)
    }

    /// What sled `sled` wrote to its status key (read as the writer), if the key
    /// is there.
    pub fn status_key(&self, sled: usize) -> Result<Option<SledStatus>> {
        let key = format!("{}sled/{}/status", crate::etcd::KEY_ROOT, sled_user(sled));
        self.etcd
            .get(&key)?
            .map(|v| {
                serde_json::from_str(&v)
                    .map_err(|e| Error::new(format!("{key} holds no sled status ({e}): {v}")))
            })
            .transpose()
    }

    /// Waits up to `timeout` until `check` accepts sled `sled`'s fleet status
    /// (`Err` says what is still missing); returns that status.
    pub fn wait_status(
        &self,
        sled: usize,
        what: &str,
        timeout: Duration,
        mut check: impl FnMut(&FleetStatus) -> Result<()>,
    ) -> Result<FleetStatus> {
        poll_until(&format!("sled {sled}: {what}"), timeout, || {
            let s = self.fleet_status(sled)?;
            check(&s).map_err(|e| Error::new(format!("{e}; status {s:?}")))?;
            Ok(s)
        })
    }

    /// Waits up to `timeout` until every sled of `sleds` is connected and current
    /// at `revision` or later (every prefix it watches is: quiet ones move with
    /// the store's progress notifications).
    pub fn wait_converged(&self, sleds: &[usize], revision: i64, timeout: Duration) -> Result<()> {
        for &sled in sleds {
            self.wait_status(
                sled,
                &format!("connected and current at revision {revision}"),
                timeout,
                |s| match s.connected && s.revision >= revision {
                    true => Ok(()),
                    false => Err(Error::new("not yet")),
                },
            )?;
        }
        Ok(())
    }

    /// `overlayd_fleet_refused_total{reason=REASON}` of sled `sled`'s OpenMetrics
    /// (`stats --format openmetrics`), by reason.
    pub fn refused_metrics(&self, sled: usize) -> Result<Vec<(String, u64)>> {
        let text = self
            .rack
            .sled(sled)?
            .admin(&["stats", "--format", "openmetrics"])?;
        let mut out = Vec::new();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("overlayd_fleet_refused_total{reason=\"") else {
                continue;
            };
            let parsed = rest.split_once("\"} ").and_then(|(reason, n)| {
                let n: f64 = n.trim().parse().ok()?;
                Some((reason.to_string(), n as u64))
            });
            out.push(parsed.ok_or_else(|| Error::new(format!("metric line {line:?}")))?);
        }
        out.sort();
        Ok(out)
    }

    /// Sled `sled`'s daemon log so far.
    pub fn log(&self, sled: usize) -> Result<String> {
        Ok(self.rack.sled(sled)?.daemon()?.log())
    }

    /// Every batch of the store's changes sled `sled`'s daemon applied, in order
    /// (from its log; see [`applied`]).
    pub fn applied_batches(&self, sled: usize) -> Result<Vec<Batch>> {
        Ok(applied::batches(&self.log(sled)?))
    }

    /// Sled `sled`'s daemon's resident memory (`VmRSS`), in KiB.
    pub fn rss_kib(&self, sled: usize) -> Result<u64> {
        let pid = self
            .rack
            .sled(sled)?
            .daemon()?
            .pid()
            .ok_or_else(|| Error::new(format!("sled {sled}'s overlayd has no pid")))?;
        crate::soak::sample::rss_kib(pid)
    }
}

/// An `xdeadm --json` answer.
fn reply(out: &str) -> Result<Reply> {
    serde_json::from_str(out)
        .map_err(|e| Error::new(format!("xdeadm printed no answer ({e}): {out}")))
}
