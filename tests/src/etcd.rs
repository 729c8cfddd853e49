//! The etcd cluster of the fleet tests (docs/fleet.md): a few etcd members on the
//! rack's underlay, TLS everywhere with certificates made here, client-certificate
//! auth with a role per sled, and the faults the tests inflict (a member killed and
//! restarted, a sled cut off from the client port).
//!
//! Each member is a namespace joined to the rack's switch bridge like a sled, at
//! `fd00:99::eN` (N = 1..), its data directory on tmpfs (`/dev/shm`: the raft log's
//! fsyncs cost nothing, so elections are not slowed by a busy disk). A control-plane
//! namespace at [`CONTROL_ADDR`] runs the writer's and root's `etcdctl`: it is
//! neither a member nor a sled, so killing members or cutting sleds never takes it
//! away. Everything is named by a unique id ([`unique_id`] with [`PREFIX`]) and
//! removed on drop, also when a test panics; what a killed run left behind is swept
//! by the next one.
//!
//! etcd is Debian's 3.4 (`etcd-server`, `etcd-client`), started here, never through
//! systemd (`scripts/install-deps.sh` disables the unit the package enables). A
//! member gets SIGTERM when the test thread that started it dies outright; a leader
//! then tries to hand its leadership over and exits about 11 s later (seen), and
//! the next run's sweep SIGKILLs whatever is left.

use crate::cmd::Cmd;
use crate::netns::{creator_pid, sweep_stale, unique_id, Netns};
use crate::poll::poll_until;
use crate::rack::{Rack, Sled, BRIDGE, UNDERLAY_IF, UNDERLAY_MTU};
use crate::{Context, Error, Result};
use rcgen::{
    date_time_ymd, BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use std::fs::File;
use std::io::Write;
use std::net::{IpAddr, Ipv6Addr};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// Start of every name the cluster makes (namespaces, the tmpfs directory): lets
/// [`sweep_stale`] find what a killed run left. Not a hex digit after `e2e`, so the
/// racks' own sweeps (prefix `e2e`) never take these for theirs.
pub const PREFIX: &str = "e2etcd";

/// The client port (the one [`Cluster::cut_client_port`] closes) and the peer port.
pub const CLIENT_PORT: u16 = 2379;
pub const PEER_PORT: u16 = 2380;

/// Raft timing for a loaded 2-core machine shared with other tests: etcd's defaults
/// (100 ms, 1 s) make a member that is starved for a second call an election.
pub const HEARTBEAT_MS: u32 = 300;
pub const ELECTION_TIMEOUT_MS: u32 = 3000;

/// How long a cluster may take to elect its first leader and serve every member.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The control plane's address on the rack (where the writer's `etcdctl` runs).
pub const CONTROL_ADDR: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x99, 0, 0, 0, 0, 0, 0xec);

/// The users besides the sleds': the control plane's writer and etcd's root.
pub const WRITER: &str = "writer";
pub const ROOT: &str = "root";

/// Where the fleet's keys live (docs/fleet.md, "Key schema").
pub const KEY_ROOT: &str = "/overlay/v1/";

/// The name of the nftables table that cuts a sled off the client port.
const CUT_TABLE: &str = "e2e_etcd_cut";

/// Lines of each member's log printed when the cluster is dropped.
const LOG_TAIL: usize = 40;

/// Member `i`'s underlay address: `fd00:99::e1` for the first.
pub fn member_addr(i: usize) -> Ipv6Addr {
    let host = 0xe1 + u16::try_from(i).unwrap_or(u16::MAX - 0xe1);
    Ipv6Addr::new(0xfd00, 0x99, 0, 0, 0, 0, 0, host)
}

/// Sled `index`'s etcd user, its certificate's CN and its daemon's `--sled-id`.
pub fn sled_user(index: usize) -> String {
    format!("sled{index}")
}

/// A user's certificate and key, and the CA that signed every certificate of the
/// cluster (what `--fleet-cert`, `--fleet-key`, `--fleet-ca` and etcdctl take).
#[derive(Clone, Debug)]
pub struct TlsFiles {
    pub cert: PathBuf,
    /// Mode 0600: the daemon refuses a key readable by others.
    pub key: PathBuf,
    pub ca: PathBuf,
}

/// One etcd member.
#[derive(Debug)]
struct Member {
    name: String,
    addr: Ipv6Addr,
    ns: Netns,
    /// The etcd process itself (`ip netns exec` execs it), while it runs.
    child: Option<Child>,
}

/// What `etcdctl endpoint status` says of one member.
#[derive(Debug)]
struct Status {
    member_id: u64,
    leader: u64,
}

/// A running etcd cluster on a rack. Dropping it kills and reaps the members,
/// removes the nftables tables it added to sleds, deletes its namespaces and removes
/// its tmpfs directory.
#[derive(Debug)]
pub struct Cluster {
    id: String,
    dir: PathBuf,
    users: Vec<String>,
    members: Vec<Member>,
    control: Option<Netns>,
    /// Sled namespaces holding a [`CUT_TABLE`] (by name: the sled may be gone first).
    cut: Vec<String>,
    first_election: Duration,
}

impl Cluster {
    /// Builds `n` members on `rack` (one namespace each on the rack's bridge), the
    /// control-plane namespace, the certificates (a CA; one per member; one per
    /// sled of the rack, one for the writer and one for root), starts the members,
    /// waits for a leader and every member healthy, then creates the roles and users
    /// and enables auth. One cluster per rack (the addresses are fixed).
    pub fn start(rack: &Rack, n: usize) -> Result<Cluster> {
        crate::require_root()?;
        if n == 0 || n > 9 {
            return Err(Error::new(format!(
                "a cluster of {n} members: 1 to 9 please"
            )));
        }
        static SWEPT: std::sync::Once = std::sync::Once::new();
        SWEPT.call_once(|| {
            if let Err(e) = sweep_stale(PREFIX).and_then(|()| sweep_stale_dirs()) {
                eprintln!("e2e: sweeping stale etcd clusters: {e}");
            }
        });
        let id = unique_id(PREFIX);
        let dir = tmpfs_root().join(&id);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .with_context(|| format!("creating {}", dir.display()))?;
        let mut users: Vec<String> = (0..rack.sleds.len()).map(sled_user).collect();
        users.extend([WRITER.to_string(), ROOT.to_string()]);
        // From here on, `cluster`'s Drop cleans up whatever was created so far.
        let mut cluster = Cluster {
            id,
            dir,
            users,
            members: Vec::new(),
            control: None,
            cut: Vec::new(),
            first_election: Duration::ZERO,
        };
        for i in 0..n {
            let name = format!("e{}", i + 1);
            let addr = member_addr(i);
            let ns = cluster.join_rack(rack, &name, addr)?;
            cluster.members.push(Member {
                name,
                addr,
                ns,
                child: None,
            });
        }
        cluster.control = Some(cluster.join_rack(rack, "ctl", CONTROL_ADDR)?);
        cluster.make_certificates()?;
        cluster.check_reachable()?;
        let started = Instant::now();
        for i in 0..n {
            cluster.spawn(i)?;
        }
        cluster.wait_healthy(START_TIMEOUT)?;
        cluster.first_election = started.elapsed();
        cluster.enable_auth()?;
        Ok(cluster)
    }

    /// Makes namespace `{id}-{name}` with an underlay link on the rack's bridge
    /// (bridge port `{name}` prefixed with `etcd`) addressed `addr`, like a sled.
    fn join_rack(&self, rack: &Rack, name: &str, addr: Ipv6Addr) -> Result<Netns> {
        let ns = Netns::create(
            &format!("{}-{name}", self.id),
            // DAD off: the address is usable at once, as on the sleds.
            &[
                ("net.ipv6.conf.all.accept_dad", "0"),
                ("net.ipv6.conf.default.accept_dad", "0"),
            ],
        )?;
        let port = format!("etcd{name}");
        let mtu = UNDERLAY_MTU.to_string();
        Cmd::new("ip")
            .args(["link", "add", UNDERLAY_IF, "netns", ns.name(), "mtu", &mtu])
            .args(["type", "veth", "peer", "name", &port])
            .args(["netns", rack.switch.name(), "mtu", &mtu])
            .run()?;
        rack.switch
            .ip(&["link", "set", &port, "master", BRIDGE, "up"])?;
        ns.ip(&[
            "-6",
            "addr",
            "add",
            &format!("{addr}/64"),
            "dev",
            UNDERLAY_IF,
            "nodad",
        ])?;
        ns.ip(&["link", "set", UNDERLAY_IF, "up"])?;
        Ok(ns)
    }

    /// The control plane pings every member: a wiring mistake fails here, named,
    /// rather than as an election that never ends.
    fn check_reachable(&self) -> Result<()> {
        let control = self.control_ns()?;
        for m in &self.members {
            let target = m.addr.to_string();
            poll_until(
                &format!("the control plane to reach member {} ({target})", m.name),
                Duration::from_secs(15),
                || control.run("ping", &["-6", "-c", "1", "-W", "1", &target]),
            )?;
        }
        Ok(())
    }

    fn pki(&self) -> PathBuf {
        self.dir.join("pki")
    }

    fn ca_file(&self) -> PathBuf {
        self.pki().join("ca.crt")
    }

    /// One CA; per member a certificate for both its client and its peer URL (the
    /// member's address in subjectAltName: clients and peers dial an IP, there is no
    /// name to check); per user a client certificate whose CN is the user, and a
    /// second one for the same key that expired long ago
    /// ([`Cluster::expired_credentials`]). Made
    /// in-process with rcgen (ECDSA P-256): no openssl CLI, which a minimal Debian
    /// lacks. The CA's key is never written: nothing signs after the start.
    fn make_certificates(&self) -> Result<()> {
        let pki = self.pki();
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&pki)
            .with_context(|| format!("creating {}", pki.display()))?;
        let mut ca = CertificateParams::default();
        ca.distinguished_name = common_name(&format!("e2e etcd CA {}", self.id));
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().map_err(tls_error)?)
            .map_err(tls_error)?;
        write_file(&self.ca_file(), &ca.pem(), 0o644)?;
        for m in &self.members {
            // Both purposes: a member is a server to clients and peers, and a client
            // of its peers (and of its own client URL, for the gRPC gateway).
            let purposes = [
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ];
            self.leaf(&ca, &m.name, Some(m.addr), &purposes)?;
        }
        for user in &self.users {
            let params = self.leaf(&ca, user, None, &[ExtendedKeyUsagePurpose::ClientAuth])?;
            self.expired_leaf(&ca, user, params)?;
        }
        Ok(())
    }

    /// Writes `pki/{cn}.crt` and `pki/{cn}.key` (0600), signed by `ca`; returns
    /// the certificate's parameters and key for [`Cluster::expired_leaf`].
    fn leaf(
        &self,
        ca: &Issuer<'_, KeyPair>,
        cn: &str,
        ip: Option<Ipv6Addr>,
        purposes: &[ExtendedKeyUsagePurpose],
    ) -> Result<(CertificateParams, KeyPair)> {
        let key = KeyPair::generate().map_err(tls_error)?;
        let mut params = CertificateParams::default();
        params.distinguished_name = common_name(cn);
        params.subject_alt_names = ip
            .map(|a| SanType::IpAddress(IpAddr::V6(a)))
            .into_iter()
            .collect();
        // ECDSA keys sign; key encipherment is for RSA.
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = purposes.to_vec();
        params.use_authority_key_identifier_extension = true;
        let cert = params.signed_by(&key, ca).map_err(tls_error)?;
        write_file(&self.pki().join(format!("{cn}.crt")), &cert.pem(), 0o644)?;
        write_file(
            &self.pki().join(format!("{cn}.key")),
            &key.serialize_pem(),
            0o600,
        )?;
        Ok((params, key))
    }

    /// Writes `pki/{cn}.expired.crt`: the certificate of `params` for the same key,
    /// valid in the year 2000 only.
    fn expired_leaf(
        &self,
        ca: &Issuer<'_, KeyPair>,
        cn: &str,
        (mut params, key): (CertificateParams, KeyPair),
    ) -> Result<()> {
        params.not_before = date_time_ymd(2000, 1, 1);
        params.not_after = date_time_ymd(2000, 12, 31);
        let cert = params.signed_by(&key, ca).map_err(tls_error)?;
        write_file(&self.expired_cert(cn), &cert.pem(), 0o644)
    }

    fn expired_cert(&self, cn: &str) -> PathBuf {
        self.pki().join(format!("{cn}.expired.crt"))
    }

    /// The certificate, key and CA of `user` (a [`sled_user`], [`WRITER`] or
    /// [`ROOT`]).
    pub fn credentials(&self, user: &str) -> Result<TlsFiles> {
        if !self.users.iter().any(|u| u == user) {
            return Err(Error::new(format!(
                "no etcd user {user:?} (users: {})",
                self.users.join(", ")
            )));
        }
        Ok(self.tls_files(user))
    }

    /// [`Cluster::credentials`] of `user` with a certificate that expired in
    /// 2000 (same CA, same key, same CN): what a sled whose certificate was not
    /// renewed presents.
    pub fn expired_credentials(&self, user: &str) -> Result<TlsFiles> {
        Ok(TlsFiles {
            cert: self.expired_cert(user),
            ..self.credentials(user)?
        })
    }

    fn tls_files(&self, cn: &str) -> TlsFiles {
        TlsFiles {
            cert: self.pki().join(format!("{cn}.crt")),
            key: self.pki().join(format!("{cn}.key")),
            ca: self.ca_file(),
        }
    }

    /// Every member's client URL, comma-separated (`--fleet-endpoints`).
    pub fn endpoints(&self) -> String {
        self.endpoints_of(0..self.members.len())
    }

    fn endpoints_of(&self, members: impl IntoIterator<Item = usize>) -> String {
        members
            .into_iter()
            .map(|i| format!("https://[{}]:{CLIENT_PORT}", self.members[i].addr))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn peer_url(&self, i: usize) -> String {
        format!("https://[{}]:{PEER_PORT}", self.members[i].addr)
    }

    /// The number of members.
    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// The namespace the control plane's commands run in (`xdeadm fleet ...`).
    pub fn control_ns(&self) -> Result<&Netns> {
        self.control
            .as_ref()
            .ok_or_else(|| Error::new("the cluster has no control-plane namespace"))
    }

    /// The time from starting the members to a leader with every member healthy.
    pub fn first_election(&self) -> Duration {
        self.first_election
    }

    /// Starts member `i`'s etcd (its log appended to `{name}.log`).
    fn spawn(&mut self, i: usize) -> Result<()> {
        let m = &self.members[i];
        let tls = self.tls_files(&m.name);
        let initial: Vec<String> = (0..self.members.len())
            .map(|j| format!("{}={}", self.members[j].name, self.peer_url(j)))
            .collect();
        let (cert, key, ca) = (path(&tls.cert), path(&tls.key), path(&tls.ca));
        let data = path(&self.dir.join(&m.name));
        let client_url = self.endpoints_of([i]);
        let peer_url = self.peer_url(i);
        let cmd =
            m.ns.cmd("etcd")
                .args(["--name", &m.name, "--data-dir", &data])
                .args(["--listen-client-urls", &client_url])
                .args(["--advertise-client-urls", &client_url])
                .args(["--listen-peer-urls", &peer_url])
                .args(["--initial-advertise-peer-urls", &peer_url])
                .args(["--initial-cluster", &initial.join(",")])
                // Ignored by a member that restarts on its data directory.
                .args(["--initial-cluster-state", "new"])
                .args(["--initial-cluster-token", &self.id])
                .args(["--heartbeat-interval", &HEARTBEAT_MS.to_string()])
                .args(["--election-timeout", &ELECTION_TIMEOUT_MS.to_string()])
                // What docs/fleet.md asks of a fleet's store: quiet prefixes'
                // positions keep up within a second (the default is 10 minutes).
                .args(["--experimental-watch-progress-notify-interval", "1s"])
                .args(["--client-cert-auth", "--trusted-ca-file", &ca])
                .args(["--cert-file", &cert, "--key-file", &key])
                .args(["--peer-client-cert-auth", "--peer-trusted-ca-file", &ca])
                .args(["--peer-cert-file", &cert, "--peer-key-file", &key])
                .args(["--logger", "zap", "--log-outputs", "stderr"])
                .die_with_parent();
        let log_path = self.log_path(i);
        let log = File::options()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("opening {}", log_path.display()))?;
        let child = cmd.spawn_with(Stdio::from(log.try_clone()?), Stdio::from(log))?;
        self.members[i].child = Some(child);
        Ok(())
    }

    fn log_path(&self, i: usize) -> PathBuf {
        self.dir.join(format!("{}.log", self.members[i].name))
    }

    /// Member `i`'s log so far (empty if unreadable: for diagnostics only).
    pub fn log(&self, i: usize) -> String {
        std::fs::read_to_string(self.log_path(i)).unwrap_or_default()
    }

    fn member(&self, i: usize) -> Result<&Member> {
        self.members.get(i).ok_or_else(|| {
            Error::new(format!(
                "no member {i} (the cluster has {})",
                self.members.len()
            ))
        })
    }

    /// Member `i`'s name (`e1` for the first), as etcd and the logs call it.
    pub fn member_name(&self, i: usize) -> Result<&str> {
        Ok(&self.member(i)?.name)
    }

    /// Whether member `i`'s etcd runs (it was not killed, or was restarted).
    pub fn running(&self, i: usize) -> bool {
        self.members.get(i).is_some_and(|m| m.child.is_some())
    }

    fn running_members(&self) -> Vec<usize> {
        (0..self.members.len())
            .filter(|&i| self.running(i))
            .collect()
    }

    /// `etcdctl` as `user` inside `ns`, against every member, with short timeouts
    /// (a cut-off client fails in seconds, not etcdctl's default of a minute or so).
    /// The caller adds the command (`get`, `put`, ...).
    pub fn etcdctl(&self, ns: &Netns, user: &str) -> Result<Cmd> {
        let tls = self.credentials(user)?;
        Ok(self.etcdctl_at(ns, &tls, &self.endpoints()))
    }

    fn etcdctl_at(&self, ns: &Netns, tls: &TlsFiles, endpoints: &str) -> Cmd {
        ns.cmd("etcdctl")
            .args(["--endpoints", endpoints])
            .args(["--cacert", &path(&tls.ca)])
            .args(["--cert", &path(&tls.cert), "--key", &path(&tls.key)])
            .args(["--dial-timeout", "2s", "--command-timeout", "5s"])
    }

    /// `etcdctl` as `user` from the control-plane namespace against member `i`
    /// alone (with `--consistency s` a read shows that member's own copy).
    pub fn member_etcdctl(&self, i: usize, user: &str) -> Result<Cmd> {
        self.member(i)?;
        let tls = self.credentials(user)?;
        Ok(self.etcdctl_at(self.control_ns()?, &tls, &self.endpoints_of([i])))
    }

    /// `etcdctl` as sled `sled`'s user, from inside the sled's namespace (where a
    /// cut of the client port applies).
    pub fn sled_etcdctl(&self, sled: &Sled) -> Result<Cmd> {
        self.etcdctl(&sled.ns, &sled_user(sled.index))
    }

    /// `etcdctl` as `user` from the control-plane namespace.
    pub fn ctl(&self, user: &str) -> Result<Cmd> {
        self.etcdctl(self.control_ns()?, user)
    }

    /// Writes `key` = `value` as the writer (the value through stdin, so it may
    /// start with `-` or hold newlines).
    pub fn put(&self, key: &str, value: &str) -> Result<()> {
        self.ctl(WRITER)?
            .args(["put", key])
            .stdin(value)
            .run()
            .map(drop)
    }

    /// Writes every `(key, value)` of `puts` in one transaction as `user` (the
    /// writer or root): they all get the same revision, which is returned. Values
    /// are sent quoted (etcdctl's `txn` syntax), so they may hold quotes and
    /// backslashes, not newlines.
    pub fn put_txn(&self, user: &str, puts: &[(&str, &str)]) -> Result<i64> {
        let quote = |s: &str| format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""));
        // No compares: an empty line.
        let mut script = String::from("\n");
        for (key, value) in puts {
            if key.contains(char::is_whitespace) || value.contains('\n') {
                return Err(Error::new(format!(
                    "put_txn: {key:?} has white space or its value a newline"
                )));
            }
            script.push_str(&format!("put {} {}\n", quote(key), quote(value)));
        }
        // The end of the success requests, then no failure requests: etcdctl
        // wants each list ended by an empty line, the last one too.
        script.push_str("\n\n");
        let out = self
            .ctl(user)?
            .args(["txn", "-w", "json"])
            .stdin(script)
            .run()?;
        let v = json(&out)?;
        if v["succeeded"] != serde_json::Value::Bool(true) {
            return Err(Error::new(format!("the transaction failed: {out}")));
        }
        v["header"]["revision"]
            .as_i64()
            .ok_or_else(|| Error::new(format!("no revision in {out}")))
    }

    /// Reads `key` as the writer: its value, or `None` if it does not exist.
    pub fn get(&self, key: &str) -> Result<Option<String>> {
        let out = self.ctl(WRITER)?.args(["get", key, "-w", "json"]).run()?;
        let v = json(&out)?;
        match v["kvs"].as_array().and_then(|kvs| kvs.first()) {
            None => Ok(None),
            Some(kv) => {
                // Absent when the value is empty (protobuf leaves empty fields out).
                let b64 = kv["value"].as_str().unwrap_or("");
                let bytes = base64_decode(b64)
                    .ok_or_else(|| Error::new(format!("bad base64 in etcdctl's {out}")))?;
                String::from_utf8(bytes)
                    .map(Some)
                    .map_err(|e| Error::new(format!("value of {key} is not UTF-8: {e}")))
            }
        }
    }

    /// Deletes `key` as the writer; returns how many keys went (0 or 1).
    pub fn del(&self, key: &str) -> Result<u64> {
        let out = self.ctl(WRITER)?.args(["del", key]).run()?;
        out.trim()
            .parse()
            .map_err(|_| Error::new(format!("etcdctl del printed {out:?}")))
    }

    /// The store's current revision (a linearizable read's header).
    pub fn revision(&self) -> Result<i64> {
        let out = self
            .ctl(WRITER)?
            // One key, likely absent: only the header is wanted (3.4's etcdctl has
            // no --count-only).
            .args(["get", KEY_ROOT, "-w", "json"])
            .run()?;
        json(&out)?["header"]["revision"]
            .as_i64()
            .ok_or_else(|| Error::new(format!("no revision in {out}")))
    }

    /// Compacts the history up to `rev` (physically: returns once the members have
    /// dropped it). Watches and reads from older revisions fail afterwards.
    pub fn compact(&self, rev: i64) -> Result<()> {
        self.ctl(ROOT)?
            .args(["compaction", "--physical", &rev.to_string()])
            .run()
            .map(drop)
    }

    /// `endpoint status` of every running member, in the order of `running`.
    fn statuses(&self, running: &[usize]) -> Result<Vec<Status>> {
        let tls = self.tls_files(ROOT);
        let out = self
            .etcdctl_at(
                self.control_ns()?,
                &tls,
                &self.endpoints_of(running.iter().copied()),
            )
            .args(["endpoint", "status", "-w", "json"])
            .run()?;
        let v = json(&out)?;
        let list = v
            .as_array()
            .ok_or_else(|| Error::new(format!("endpoint status is not a list: {out}")))?;
        running
            .iter()
            .map(|&i| {
                let url = self.endpoints_of([i]);
                let s = list
                    .iter()
                    .find(|s| s["Endpoint"].as_str() == Some(url.as_str()))
                    .ok_or_else(|| Error::new(format!("no status of {url} in {out}")))?;
                let field = |v: &serde_json::Value| {
                    v.as_u64()
                        .ok_or_else(|| Error::new(format!("bad status of {url}: {s}")))
                };
                Ok(Status {
                    member_id: field(&s["Status"]["header"]["member_id"])?,
                    leader: field(&s["Status"]["leader"])?,
                })
            })
            .collect()
    }

    /// The member every running member follows, if they agree on one that runs.
    pub fn leader(&self) -> Result<usize> {
        let running = self.running_members();
        if running.is_empty() {
            return Err(Error::new("no member is running"));
        }
        let statuses = self.statuses(&running)?;
        let leader = statuses[0].leader;
        if leader == 0 || statuses.iter().any(|s| s.leader != leader) {
            return Err(Error::new(format!(
                "no agreed leader: {:?}",
                running
                    .iter()
                    .zip(&statuses)
                    .map(|(&i, s)| (&self.members[i].name, s.leader))
                    .collect::<Vec<_>>()
            )));
        }
        running
            .iter()
            .zip(&statuses)
            .find(|(_, s)| s.member_id == leader)
            .map(|(&i, _)| i)
            .ok_or_else(|| Error::new(format!("the leader {leader:x} is not a running member")))
    }

    /// Waits until a leader is elected and every running member answers a
    /// linearizable read (`endpoint health`). Returns the leader.
    pub fn wait_healthy(&self, timeout: Duration) -> Result<usize> {
        poll_until("the etcd cluster to be healthy", timeout, || {
            let leader = self.leader()?;
            let tls = self.tls_files(ROOT);
            self.etcdctl_at(
                self.control_ns()?,
                &tls,
                &self.endpoints_of(self.running_members()),
            )
            .args(["endpoint", "health"])
            .run()?;
            Ok(leader)
        })
    }

    /// SIGKILLs member `i`'s etcd (a crash) and reaps it. Its data directory stays
    /// for [`Cluster::restart`].
    pub fn kill(&mut self, i: usize) -> Result<()> {
        let name = self.member(i)?.name.clone();
        let child = self.members[i]
            .child
            .as_mut()
            .ok_or_else(|| Error::new(format!("member {name} is not running")))?;
        // The pid must be etcd's own (a shell's would die and leave etcd running).
        let comm_path = format!("/proc/{}/comm", child.id());
        let comm = std::fs::read_to_string(&comm_path).unwrap_or_default();
        if comm.trim() != "etcd" {
            return Err(Error::new(format!(
                "member {name}'s pid {} is {:?}, not etcd",
                child.id(),
                comm.trim()
            )));
        }
        child.kill()?;
        let status = child.wait()?;
        self.members[i].child = None;
        if status.signal() == Some(libc::SIGKILL) {
            Ok(())
        } else {
            Err(Error::new(format!(
                "member {name} did not die of SIGKILL: {status}"
            )))
        }
    }

    /// Starts member `i` again on its data directory and waits until it has
    /// rejoined (the cluster healthy with it). Returns the leader.
    pub fn restart(&mut self, i: usize) -> Result<usize> {
        if self.member(i)?.child.is_some() {
            return Err(Error::new(format!(
                "member {} is running",
                self.members[i].name
            )));
        }
        self.spawn(i)?;
        self.wait_healthy(START_TIMEOUT)
            .with_context(|| format!("member {} rejoining", self.members[i].name))
    }

    /// Starts every member that is not running (all of them after a [`kill`] of
    /// each: a lone member has no quorum, so [`Cluster::restart`] one by one would
    /// wait for a leader in vain) and waits until the cluster is healthy. Returns
    /// the leader.
    ///
    /// [`kill`]: Cluster::kill
    pub fn restart_all(&mut self) -> Result<usize> {
        for i in 0..self.members.len() {
            if !self.running(i) {
                self.spawn(i)?;
            }
        }
        self.wait_healthy(START_TIMEOUT)
            .context("the members restarting together")
    }

    /// Creates root, a role and user per sled, the writer, and enables auth. Done as
    /// root's certificate before auth is on (every valid certificate may then do
    /// anything), so the same commands work after.
    fn enable_auth(&self) -> Result<()> {
        let root = |args: &[&str]| -> Result<()> {
            self.ctl(ROOT)?.args(args.iter().copied()).run().map(drop)
        };
        root(&["user", "add", ROOT, "--no-password"])?;
        root(&["role", "add", ROOT])?;
        root(&["user", "grant-role", ROOT, ROOT])?;
        for user in self.users.iter().filter(|u| *u != ROOT && *u != WRITER) {
            root(&["role", "add", user])?;
            let own = format!("{KEY_ROOT}sled/{user}/");
            for (perm, key, prefix) in [
                ("read", format!("{KEY_ROOT}v2b/"), true),
                ("read", own.clone(), true),
                ("write", format!("{own}status"), false),
            ] {
                root(&[
                    "role",
                    "grant-permission",
                    user,
                    perm,
                    &key,
                    &format!("--prefix={prefix}"),
                ])?;
            }
            root(&["user", "add", user, "--no-password"])?;
            root(&["user", "grant-role", user, user])?;
        }
        root(&["role", "add", WRITER])?;
        root(&[
            "role",
            "grant-permission",
            WRITER,
            "readwrite",
            KEY_ROOT,
            "--prefix=true",
        ])?;
        root(&["user", "add", WRITER, "--no-password"])?;
        root(&["user", "grant-role", WRITER, WRITER])?;
        root(&["auth", "enable"])
    }

    /// Lets sled `sled` read VPC `vni`'s prefix (`/overlay/v1/vpc/<vni>/`), as the
    /// control plane does when it places a port of that VPC on the sled.
    pub fn grant_vni(&self, sled: usize, vni: u32) -> Result<()> {
        let user = sled_user(sled);
        self.credentials(&user)?;
        self.ctl(ROOT)?
            .args(["role", "grant-permission", &user, "read"])
            .arg(format!("{KEY_ROOT}vpc/{vni}/"))
            .arg("--prefix=true")
            .run()
            .map(drop)
    }

    /// Drops every packet between `sled` and a member's client port, both ways
    /// (nftables rules in the sled's own namespace): its etcd clients time out
    /// while its underlay, and every other sled, work as before. Both ways: with
    /// the sled's packets alone dropped, a watch stream open at the cut still
    /// brings the sled what the member sends before its TCP window closes (the
    /// first few changes, seen). Idempotent.
    pub fn cut_client_port(&mut self, sled: &Sled) -> Result<()> {
        let addrs: Vec<String> = self.members.iter().map(|m| m.addr.to_string()).collect();
        let addrs = addrs.join(", ");
        let script = format!(
            "add table inet {CUT_TABLE}\n\
             flush table inet {CUT_TABLE}\n\
             table inet {CUT_TABLE} {{\n\
             \tchain out {{\n\
             \t\ttype filter hook output priority filter; policy accept;\n\
             \t\tip6 daddr {{ {addrs} }} tcp dport {CLIENT_PORT} drop\n\
             \t}}\n\
             \tchain in {{\n\
             \t\ttype filter hook input priority filter; policy accept;\n\
             \t\tip6 saddr {{ {addrs} }} tcp sport {CLIENT_PORT} drop\n\
             \t}}\n\
             }}\n"
        );
        sled.ns
            .cmd("nft")
            .args(["-f", "-"])
            .stdin(script)
            .run()
            .with_context(|| format!("cutting sled {} off etcd", sled.index))?;
        if !self.cut.iter().any(|n| n == sled.ns.name()) {
            self.cut.push(sled.ns.name().to_string());
        }
        Ok(())
    }

    /// Undoes [`Cluster::cut_client_port`] for `sled`.
    pub fn heal(&mut self, sled: &Sled) -> Result<()> {
        sled.ns
            .run("nft", &["delete", "table", "inet", CUT_TABLE])
            .with_context(|| format!("healing sled {}'s cut", sled.index))?;
        self.cut.retain(|n| n != sled.ns.name());
        Ok(())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Processes first: one left in a namespace keeps it alive after deletion.
        for m in &mut self.members {
            if let Some(mut child) = m.child.take() {
                let _ = child.kill();
                if let Err(e) = child.wait() {
                    eprintln!("e2e cleanup: reaping etcd {}: {e}", m.name);
                }
            }
        }
        for ns in std::mem::take(&mut self.cut) {
            // Gone with its namespace if the rack went first.
            if Path::new("/var/run/netns").join(&ns).exists() {
                if let Err(e) = Cmd::in_netns(&ns, "nft")
                    .args(["delete", "table", "inet", CUT_TABLE])
                    .run()
                {
                    eprintln!("e2e cleanup: {e}");
                }
            }
        }
        // Captured by the test runner and shown only when the test fails.
        for i in 0..self.members.len() {
            let log = self.log(i);
            let lines: Vec<&str> = log.lines().collect();
            let tail = &lines[lines.len().saturating_sub(LOG_TAIL)..];
            eprintln!(
                "----- etcd {} log (last {} lines) -----\n{}\n----- end of etcd {} log -----",
                self.members[i].name,
                tail.len(),
                tail.join("\n"),
                self.members[i].name
            );
        }
        self.members.clear();
        self.control.take();
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            eprintln!("e2e cleanup: removing {}: {e}", self.dir.display());
        }
    }
}

/// Where the clusters' directories go: tmpfs, so etcd's fsyncs are free.
fn tmpfs_root() -> PathBuf {
    PathBuf::from("/dev/shm")
}

/// Removes the tmpfs directories of clusters whose test process is gone (their
/// namespaces and processes are swept by [`sweep_stale`]).
fn sweep_stale_dirs() -> Result<()> {
    for entry in std::fs::read_dir(tmpfs_root())? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        // `creator_pid` wants the `-` that follows the id in namespace names.
        let Some(pid) = creator_pid(PREFIX, &format!("{name}-")) else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        if let Err(e) = std::fs::remove_dir_all(entry.path()) {
            eprintln!("e2e: removing stale {}: {e}", entry.path().display());
        }
    }
    Ok(())
}

fn common_name(cn: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    dn
}

fn tls_error(e: rcgen::Error) -> Error {
    Error::new(format!("making the etcd certificates: {e}"))
}

/// Creates (or truncates) `path` with `mode` and writes `contents`.
fn write_file(path: &Path, contents: &str, mode: u32) -> Result<()> {
    File::options()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)
        .and_then(|mut f| f.write_all(contents.as_bytes()))
        .with_context(|| format!("writing {}", path.display()))
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

fn json(s: &str) -> Result<serde_json::Value> {
    serde_json::from_str(s).map_err(|e| Error::new(format!("etcdctl printed no JSON ({e}): {s}")))
}

/// Standard base64 with padding (how etcdctl's JSON carries keys and values).
fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len() / 4 * 3);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in s.trim_end_matches('=').bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_decodes_etcdctl_values() {
        assert_eq!(base64_decode("").unwrap(), b"");
        assert_eq!(base64_decode("Zg==").unwrap(), b"f");
        assert_eq!(base64_decode("Zm8=").unwrap(), b"fo");
        assert_eq!(base64_decode("Zm9v").unwrap(), b"foo");
        assert_eq!(
            base64_decode("eyJhIjogWzEsIDJdfQ==").unwrap(),
            br#"{"a": [1, 2]}"#
        );
        assert_eq!(base64_decode("Zm9v!"), None);
    }

    #[test]
    fn members_are_apart_from_sleds_and_control() {
        assert_eq!(member_addr(0), "fd00:99::e1".parse::<Ipv6Addr>().unwrap());
        assert_eq!(member_addr(2), "fd00:99::e3".parse::<Ipv6Addr>().unwrap());
        assert!((0..9).all(|i| member_addr(i) != CONTROL_ADDR));
        assert!(
            (0..9).all(|i| (0..200).all(|s| member_addr(i) != crate::rack::sled_underlay_addr(s)))
        );
    }
}
