//! TLS with client certificates (`--client-cert-auth`), over IPv4 and IPv6.

use crate::harness::{connect, Etcd, Pki, TIMEOUT};
use fleet::{Op, Store, StoreConfig, StoreError, TlsFiles};
use std::fs;
use std::os::unix::fs::PermissionsExt;

fn config(endpoint: &str, tls: &TlsFiles) -> StoreConfig {
    StoreConfig {
        endpoints: vec![endpoint.to_string()],
        tls: Some(tls.clone()),
        timeout: TIMEOUT,
    }
}

#[tokio::test]
async fn a_client_certificate_opens_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::create(dir.path());
    let etcd = Etcd::start_tls(&pki);

    // IPv4 and IPv6 endpoints, each checked against the certificate's IP SANs.
    for endpoint in &etcd.endpoints {
        let mut store = connect(&config(endpoint, &pki.client)).await;
        let key = format!("/t/tls/{}", store.endpoint());
        let written = store
            .apply(vec![Op::Put {
                key: key.clone(),
                value: b"x".to_vec(),
            }])
            .await
            .unwrap();
        let snap = store.snapshot(&[key]).await.unwrap();
        assert_eq!(snap.revision, written.revision);
        assert_eq!(snap.kvs.len(), 1);
    }

    // A member whose certificate our CA did not sign: refused by us, and no
    // retry would help.
    let mut distrust = pki.client.clone();
    distrust.ca = pki.other_ca.clone();
    let e = Store::connect(&config(&etcd.endpoints[0], &distrust))
        .await
        .err()
        .expect("refused");
    assert!(!e.is_transient(), "{e}");
    assert!(e.to_string().contains("certificate"), "{e}");

    // A client certificate from another CA: refused by the member. With TLS 1.3
    // the refusal comes after the handshake, as a closed connection, which cannot
    // be told from a member going away: it counts as transient.
    assert!(Store::connect(&config(&etcd.endpoints[0], &pki.stranger))
        .await
        .is_err());

    // Plain http to a TLS member: refused too, but that one is a setup error.
    let mut plain = config(&etcd.endpoints[0], &pki.client);
    plain.tls = None;
    assert!(Store::connect(&plain).await.is_err());
}

#[tokio::test]
async fn a_key_others_can_read_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::create(dir.path());
    fs::set_permissions(&pki.client.key, fs::Permissions::from_mode(0o644)).unwrap();
    let config = config("https://127.0.0.1:1", &pki.client);
    match Store::connect(&config).await {
        Err(e @ StoreError::KeyFileMode { .. }) => {
            assert!(
                e.to_string().contains("sled7.key") && e.to_string().contains("0644"),
                "{e}"
            );
            assert!(!e.is_transient());
        }
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("connected with a key others can read"),
    }
}
