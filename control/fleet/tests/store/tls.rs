//! TLS with client certificates (`--client-cert-auth`), over IPv4 and IPv6.

use crate::harness::{connect, Etcd, Pki, TIMEOUT};
use fleet::{Op, Positions, Store, StoreConfig, StoreError, TlsFiles};
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

/// An admin client on the root certificate, for what the crate does not do
/// (users, roles, auth).
async fn admin(etcd: &Etcd, pki: &Pki) -> etcd_client::Client {
    let pem = |p: &std::path::Path| fs::read(p).unwrap();
    let tls = etcd_client::TlsOptions::new()
        .ca_certificate(etcd_client::Certificate::from_pem(pem(&pki.ca)))
        .identity(etcd_client::Identity::from_pem(
            pem(&pki.root.cert),
            pem(&pki.root.key),
        ));
    let options = etcd_client::ConnectOptions::new().with_tls(tls);
    etcd_client::Client::connect(&etcd.endpoints[..1], Some(options))
        .await
        .expect("admin client")
}

/// docs/fleet.md's security: the certificate's CN is the etcd user, whose role
/// reads V2B and writes its status key, and nothing else. What lies outside is
/// refused for good (no reconnect helps), and a watch of it says which prefix.
#[tokio::test]
async fn a_sled_reads_only_what_its_role_grants() {
    use etcd_client::{Permission, UserAddOptions};
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::create(dir.path());
    let etcd = Etcd::start_tls(&pki);
    let _ready = connect(&config(&etcd.endpoints[0], &pki.root)).await;
    let mut root = admin(&etcd, &pki).await;
    let no_password = || Some(UserAddOptions::new().with_no_pwd());
    root.user_add("root", "", no_password()).await.unwrap();
    root.user_grant_role("root", "root").await.unwrap();
    root.role_add("sled7").await.unwrap();
    let v2b = Permission::read("/overlay/v1/v2b/").with_prefix();
    root.role_grant_permission("sled7", v2b).await.unwrap();
    let status = Permission::read_write("/overlay/v1/sled/sled7/status");
    root.role_grant_permission("sled7", status).await.unwrap();
    root.user_add("sled7", "", no_password()).await.unwrap();
    root.user_grant_role("sled7", "sled7").await.unwrap();
    root.put("/overlay/v1/v2b/0.0.0.0/0", "{}", None)
        .await
        .unwrap();
    root.put("/overlay/v1/vpc/7/v2p/10.0.0.1", "{}", None)
        .await
        .unwrap();
    root.auth_enable().await.unwrap();

    let mut store = connect(&config(&etcd.endpoints[0], &pki.client)).await;
    let v2b = vec!["/overlay/v1/v2b/".to_string()];
    let vpc = vec!["/overlay/v1/vpc/7/".to_string()];
    let snap = store.snapshot(&v2b).await.unwrap();
    assert_eq!(snap.kvs.len(), 1);
    store
        .lease_key(
            "/overlay/v1/sled/sled7/status",
            b"{}".to_vec(),
            std::time::Duration::from_secs(5),
        )
        .await
        .unwrap();

    let e = store.snapshot(&vpc).await.unwrap_err();
    assert!(!e.is_transient(), "{e}");
    assert!(e.to_string().contains("permission denied"), "{e}");
    let put = Op::Put {
        key: "/overlay/v1/v2b/::/0".to_string(),
        value: b"{}".to_vec(),
    };
    let e = store.apply(vec![put]).await.unwrap_err();
    assert!(!e.is_transient(), "{e}");

    let both = Positions::from([
        (v2b[0].clone(), snap.revision),
        (vpc[0].clone(), snap.revision),
    ]);
    let mut watch = store.watch(&both).await.unwrap();
    match tokio::time::timeout(std::time::Duration::from_secs(5), watch.next()).await {
        Ok(Err(StoreError::WatchCanceled { prefix, reason, .. })) => {
            assert_eq!(prefix, vpc[0]);
            assert!(reason.contains("permission denied"), "{reason}");
        }
        other => panic!("expected the VPC's watch refused, got {other:?}"),
    }
}
