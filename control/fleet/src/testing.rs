//! Test fixtures (feature `testing`), shared by this crate's tests and those of
//! the store's other users (`xdeadm fleet`): a single-member etcd of each test's
//! own ([`Etcd`], Debian's `etcd` binary): free ports on the loopback, a temporary
//! data directory, killed when the guard drops (also when the test fails), so
//! tests run in parallel without meeting; and a test PKI ([`Pki`]).

use crate::{Store, StoreConfig, TlsFiles};
use std::fs;
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tempfile::TempDir;

/// Requests in tests: generous for a loaded 2-core machine, short enough that a
/// hang fails the test rather than the run.
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// A running etcd; dropping it kills it.
pub struct Etcd {
    child: Child,
    dir: TempDir,
    /// Client URLs: 127.0.0.1, then [::1] when served with TLS.
    pub endpoints: Vec<String>,
}

/// The certificates of a test PKI: a CA, the server's (IP SANs 127.0.0.1 and
/// ::1), clients with CN "sled7" and "root" (etcd's user names under
/// `--client-cert-auth`), a client signed by a CA etcd does not know, and that CA.
pub struct Pki {
    pub ca: PathBuf,
    pub other_ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client: TlsFiles,
    pub root: TlsFiles,
    pub stranger: TlsFiles,
}

impl Etcd {
    /// Plain http, progress notifications every second.
    pub fn start() -> Etcd {
        Etcd::launch(None, 1).remove(0)
    }

    /// https with `--client-cert-auth`, on 127.0.0.1 and [::1].
    pub fn start_tls(pki: &Pki) -> Etcd {
        Etcd::launch(Some(pki), 1).remove(0)
    }

    /// A cluster of `n` plain-http members.
    pub fn cluster(n: usize) -> Vec<Etcd> {
        Etcd::launch(None, n)
    }

    fn launch(pki: Option<&Pki>, n: usize) -> Vec<Etcd> {
        // A free port may be taken between our probe and etcd's bind (tests run in
        // parallel): etcd then exits, and we try again with others.
        for _ in 0..5 {
            let ports: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
            let peer_url = |i: usize| format!("http://127.0.0.1:{}", ports[i].1);
            let initial_cluster = (0..n)
                .map(|i| format!("m{i}={}", peer_url(i)))
                .collect::<Vec<_>>()
                .join(",");
            let mut members: Vec<Etcd> = (0..n)
                .map(|i| Etcd::spawn(pki, i, ports[i].0, &peer_url(i), &initial_cluster))
                .collect();
            let ready = members
                .iter_mut()
                .zip(&ports)
                .all(|(etcd, (client, _))| etcd.listening(*client));
            if ready {
                return members;
            }
        }
        panic!("etcd did not start in five tries");
    }

    fn spawn(
        pki: Option<&Pki>,
        index: usize,
        client: u16,
        peer_url: &str,
        initial_cluster: &str,
    ) -> Etcd {
        let dir = tempfile::tempdir().expect("temporary directory");
        let scheme = if pki.is_some() { "https" } else { "http" };
        let mut endpoints = vec![format!("{scheme}://127.0.0.1:{client}")];
        if pki.is_some() {
            endpoints.push(format!("{scheme}://[::1]:{client}"));
        }
        let log = fs::File::create(dir.path().join("etcd.log")).expect("log file");
        let mut command = Command::new("etcd");
        command
            .arg(format!("--name=m{index}"))
            .arg(format!("--data-dir={}", dir.path().join("data").display()))
            .arg(format!("--listen-client-urls={}", endpoints.join(",")))
            .arg(format!("--advertise-client-urls={}", endpoints[0]))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster={initial_cluster}"))
            .arg("--initial-cluster-state=new")
            // Idle watchers hear of progress within a second.
            .arg("--experimental-watch-progress-notify-interval=1s")
            // Elections within a fraction of a second, and the shortest lease TTL
            // becomes one second.
            .arg("--heartbeat-interval=50")
            .arg("--election-timeout=250")
            .arg("--unsafe-no-fsync")
            .arg("--logger=zap")
            .arg("--log-level=warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log);
        if let Some(pki) = pki {
            command
                .arg(format!("--cert-file={}", pki.server_cert.display()))
                .arg(format!("--key-file={}", pki.server_key.display()))
                .arg(format!("--trusted-ca-file={}", pki.ca.display()))
                .arg("--client-cert-auth");
        }
        let child = command
            .spawn()
            .expect("etcd (Debian's etcd-server; scripts/install-deps.sh)");
        Etcd {
            child,
            dir,
            endpoints,
        }
    }

    /// Waits until the client port accepts, or etcd exits (port taken).
    fn listening(&mut self, port: u16) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("etcd did not listen within 10 s: {}", self.log());
    }

    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default()
    }

    /// A plain-http configuration for this member.
    pub fn config(&self) -> StoreConfig {
        StoreConfig {
            endpoints: self.endpoints.clone(),
            tls: None,
            timeout: TIMEOUT,
        }
    }

    /// A connected store, once the member has elected itself.
    pub async fn store(&self) -> Store {
        connect(&self.config()).await
    }

    /// The raw etcd client, for what the crate does not do itself (compaction)
    /// and to check its work independently.
    pub async fn raw(&self) -> etcd_client::Client {
        etcd_client::Client::connect(&self.endpoints[..1], None)
            .await
            .expect("raw client")
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Connects, retrying while the member starts (no leader yet, not listening).
pub async fn connect(config: &StoreConfig) -> Store {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match Store::connect(config).await {
            Ok(store) => return store,
            Err(e) if Instant::now() > deadline => panic!("no store: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

impl Pki {
    /// Writes the PKI's files into `dir`, keys with mode 0600.
    pub fn create(dir: &Path) -> Pki {
        use rcgen::{
            BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose,
            IsCa, Issuer, KeyPair, KeyUsagePurpose,
        };
        let write = |name: &str, pem: String| {
            let path = dir.join(name);
            fs::write(&path, pem).expect("write pem");
            fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).expect("chmod");
            path
        };
        let ca_of = |name: &str| {
            let key = KeyPair::generate().expect("key");
            let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.distinguished_name.push(DnType::CommonName, name);
            params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
            CertifiedIssuer::self_signed(params, key).expect("ca")
        };
        let ca = ca_of("fleet test ca");
        let other_ca = ca_of("someone else's ca");

        let server_key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(vec!["127.0.0.1".to_string(), "::1".to_string()])
            .expect("params");
        params.distinguished_name.push(DnType::CommonName, "etcd");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let server = params.signed_by(&server_key, &ca).expect("server");

        let client_of = |name: &str, cn: &str, issuer: &Issuer<'_, KeyPair>| {
            let key = KeyPair::generate().expect("key");
            let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
            params.distinguished_name.push(DnType::CommonName, cn);
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
            let cert = params.signed_by(&key, issuer).expect("client");
            TlsFiles {
                cert: write(&format!("{name}.crt"), cert.pem()),
                key: write(&format!("{name}.key"), key.serialize_pem()),
                ca: dir.join("ca.crt"),
            }
        };
        let client = client_of("sled7", "sled7", &ca);
        let root = client_of("root", "root", &ca);
        let stranger = client_of("stranger", "sled7", &other_ca);
        Pki {
            ca: write("ca.crt", ca.pem()),
            other_ca: write("other-ca.crt", other_ca.pem()),
            server_cert: write("server.crt", server.pem()),
            server_key: write("server.key", server_key.serialize_pem()),
            client,
            root,
            stranger,
        }
    }
}
