//! Where the store is, how long to wait for it, and the certificate to show it.

use crate::error::StoreError;
use std::fmt;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use x509_parser::time::ASN1Time;

/// How to reach the store: the daemon's `--fleet-endpoints`, `--fleet-cert`,
/// `--fleet-key`, `--fleet-ca`, or `xdeadm fleet`'s `--endpoints`, `--cert`,
/// `--key`, `--ca`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreConfig {
    /// The members' client URLs (`https://[fd00:99::e1]:2379`). A connection talks
    /// to one of them at a time ([`crate::Store::connect`] says which).
    pub endpoints: Vec<String>,
    /// `None` for plain `http://` endpoints (tests, a lab); the fleet runs with TLS
    /// and client certificates.
    pub tls: Option<TlsFiles>,
    /// The longest wait for a connection and for the answer to one request; also
    /// how long an HTTP/2 ping may go unanswered before the connection counts as
    /// dead (a watch that is idle by nature must still notice a vanished member).
    pub timeout: Duration,
}

/// The PEM files of a client's TLS identity and of the CA that signs the members'
/// certificates. The certificate's common name is the etcd user
/// (`--client-cert-auth`), so the key is the sled's credential: readable by its
/// owner alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The client's certificate (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM), mode 0600 or stricter.
    pub key: PathBuf,
    /// The CA that signed the members' certificates (PEM): the only one trusted.
    pub ca: PathBuf,
}

/// The contents of [`TlsFiles`], read at one moment. Every connection reads the
/// files anew, so a renewed certificate is used from the next reconnect on without
/// a restart.
#[derive(Clone)]
pub struct TlsPem {
    pub(crate) cert: Vec<u8>,
    pub(crate) key: Vec<u8>,
    pub(crate) ca: Vec<u8>,
}

impl fmt::Debug for TlsPem {
    /// Sizes only: the key must not reach a log.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsPem")
            .field("cert_bytes", &self.cert.len())
            .field("key_bytes", &self.key.len())
            .field("ca_bytes", &self.ca.len())
            .finish()
    }
}

impl TlsFiles {
    /// Reads the three files, refusing a key file that its group or others may
    /// read or write (the mode must be 0600 or stricter: a credential others can
    /// read is a credential others have) and a certificate that is not valid now
    /// (expired, or not yet valid: a member refuses it with a TLS alert that does
    /// not say why). Public so that a daemon can refuse a bad setup at start,
    /// before it first needs the store.
    pub fn load(&self) -> Result<TlsPem, StoreError> {
        let mode = fs::metadata(&self.key)
            .map_err(|source| StoreError::ReadFile {
                path: self.key.clone(),
                source,
            })?
            .permissions()
            .mode();
        if mode & 0o077 != 0 {
            return Err(StoreError::KeyFileMode {
                path: self.key.clone(),
                mode: mode & 0o7777,
            });
        }
        let cert = read(&self.cert)?;
        check_validity(&self.cert, &cert, SystemTime::now())?;
        Ok(TlsPem {
            cert,
            key: read(&self.key)?,
            ca: read(&self.ca)?,
        })
    }
}

/// Refuses the first certificate of PEM file `path` unless it is valid at `now`.
fn check_validity(path: &Path, pem: &[u8], now: SystemTime) -> Result<(), StoreError> {
    let unreadable = |why: String| StoreError::Certificate {
        path: path.to_path_buf(),
        why,
    };
    let (_, pem) =
        x509_parser::pem::parse_x509_pem(pem).map_err(|e| unreadable(format!("not PEM: {e}")))?;
    let cert = pem
        .parse_x509()
        .map_err(|e| unreadable(format!("not an X.509 certificate: {e}")))?;
    let secs = now
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    let now = ASN1Time::from_timestamp(secs).map_err(|e| unreadable(e.to_string()))?;
    let validity = cert.validity();
    if validity.is_valid_at(now) {
        return Ok(());
    }
    Err(StoreError::CertificateNotValid {
        path: path.to_path_buf(),
        not_before: validity.not_before.to_string(),
        not_after: validity.not_after.to_string(),
    })
}

fn read(path: &Path) -> Result<Vec<u8>, StoreError> {
    fs::read(path).map_err(|source| StoreError::ReadFile {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed certificate valid from `from` to `to` (years), as PEM.
    fn cert(from: i32, to: i32) -> String {
        let mut params = rcgen::CertificateParams::new(vec!["sled7".to_string()]).unwrap();
        params.not_before = rcgen::date_time_ymd(from, 1, 1);
        params.not_after = rcgen::date_time_ymd(to, 1, 1);
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().pem()
    }

    fn files(dir: &Path, key_mode: u32) -> TlsFiles {
        let tls = TlsFiles {
            cert: dir.join("c.pem"),
            key: dir.join("k.pem"),
            ca: dir.join("ca.pem"),
        };
        fs::write(&tls.cert, cert(2020, 4000)).unwrap();
        for p in [&tls.key, &tls.ca] {
            fs::write(p, b"pem").unwrap();
        }
        fs::set_permissions(&tls.key, fs::Permissions::from_mode(key_mode)).unwrap();
        tls
    }

    #[test]
    fn a_certificate_not_valid_now_is_named_with_its_dates() {
        let dir = tempfile::tempdir().unwrap();
        let tls = files(dir.path(), 0o600);
        for (from, to) in [(2000, 2001), (3900, 4000)] {
            fs::write(&tls.cert, cert(from, to)).unwrap();
            let e = tls.load().unwrap_err();
            let text = e.to_string();
            assert!(
                matches!(e, StoreError::CertificateNotValid { .. }),
                "{text}"
            );
            assert!(
                text.contains("c.pem")
                    && text.contains(&from.to_string())
                    && text.contains(&to.to_string()),
                "{text}"
            );
        }
        fs::write(&tls.cert, b"not a certificate").unwrap();
        let e = tls.load().unwrap_err().to_string();
        assert!(e.contains("c.pem") && e.contains("not PEM"), "{e}");
    }

    #[test]
    fn key_readable_by_others_is_refused_naming_file_and_mode() {
        let dir = tempfile::tempdir().unwrap();
        for mode in [0o644, 0o640, 0o604, 0o660] {
            let tls = files(dir.path(), mode);
            match tls.load() {
                Err(e @ StoreError::KeyFileMode { .. }) => {
                    let text = e.to_string();
                    assert!(text.contains("k.pem"), "{text}");
                    assert!(text.contains(&format!("{mode:04o}")), "{text}");
                }
                other => panic!("mode {mode:o}: {other:?}"),
            }
        }
    }

    #[test]
    fn owner_only_key_loads() {
        let dir = tempfile::tempdir().unwrap();
        for mode in [0o600, 0o400] {
            let pem = files(dir.path(), mode).load().unwrap();
            assert_eq!(pem.key, b"pem");
            assert!(!format!("{pem:?}").contains("pem\""));
        }
    }

    #[test]
    fn missing_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let mut tls = files(dir.path(), 0o600);
        tls.ca = dir.path().join("absent.pem");
        let e = tls.load().unwrap_err();
        assert!(e.to_string().contains("absent.pem"), "{e}");
    }
}
