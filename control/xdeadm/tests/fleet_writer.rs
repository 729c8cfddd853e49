//! `xdeadm fleet`'s writer verbs against a real etcd (Debian's, each test its own:
//! `fleet::testing::Etcd`), run as the built binary, as an operator runs them;
//! what they wrote is read back with the store client the sleds use.

use api::fleet::{FleetEntry, FleetKey};
use fleet::testing::{Etcd, Pki};
use fleet::Snapshot;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

/// Runs xdeadm with `args`; the store comes from the flags alone unless `env`
/// says otherwise (the test's own environment is not passed on).
fn xdeadm_env(args: &[&str], env: &[(&str, &str)], stdin: Option<&str>) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_xdeadm"));
    for var in [
        "XDEADM_FLEET_ENDPOINTS",
        "XDEADM_FLEET_CERT",
        "XDEADM_FLEET_KEY",
        "XDEADM_FLEET_CA",
    ] {
        c.env_remove(var);
    }
    c.envs(env.iter().copied())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().expect("xdeadm runs");
    let mut input = child.stdin.take().expect("stdin");
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).expect("write stdin");
    }
    drop(input);
    child.wait_with_output().expect("xdeadm ends")
}

/// `xdeadm [--json] fleet VERB ARGS... --endpoints ETCD`.
fn fleet(etcd: &Etcd, json: bool, args: &[&str]) -> Output {
    let mut line: Vec<&str> = Vec::new();
    if json {
        line.push("--json");
    }
    line.push("fleet");
    line.extend(args);
    line.extend(["--endpoints", &etcd.endpoints[0]]);
    xdeadm_env(&line, &[], None)
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn ok(o: &Output) -> &Output {
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(o), stderr(o));
    o
}

fn report(o: &Output) -> serde_json::Value {
    serde_json::from_str(&stdout(ok(o))).unwrap_or_else(|e| panic!("{e}: {}", stdout(o)))
}

fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(f)
}

/// An etcd that has elected itself (xdeadm does not wait for a leader).
fn etcd() -> Etcd {
    let etcd = Etcd::start();
    block_on(etcd.store());
    etcd
}

fn read(etcd: &Etcd, prefix: &str) -> Snapshot {
    block_on(async {
        let mut store = etcd.store().await;
        store
            .snapshot(&[prefix.to_string()])
            .await
            .expect("snapshot")
    })
}

fn value_of(etcd: &Etcd, key: &str) -> Option<serde_json::Value> {
    let snap = read(etcd, key);
    let kv = snap.kvs.into_iter().find(|kv| kv.key == key)?;
    // What a sled makes of it.
    FleetEntry::decode(&FleetKey::parse(key).unwrap(), &kv.value).expect("a sled takes it");
    Some(serde_json::from_slice(&kv.value).expect("JSON"))
}

const V2P_KEY: &str = "/overlay/v1/vpc/1701/v2p/172.30.0.6";

#[test]
fn set_and_clear_one_entry_at_a_time() {
    let etcd = etcd();
    let r = report(&fleet(
        &etcd,
        true,
        &[
            "set-v2p",
            "172.30.0.6",
            "a8:40:25:ff:00:06",
            "fd00:99::2",
            "1701",
        ],
    ));
    assert_eq!(r["written"]["v2p"], 1);
    assert_eq!(
        value_of(&etcd, V2P_KEY),
        Some(serde_json::json!({"mac": "a8:40:25:ff:00:06", "underlay": "fd00:99::2"}))
    );
    assert!(r["revision"].as_i64() > r["from_revision"].as_i64(), "{r}");

    let o = ok(&fleet(
        &etcd,
        false,
        &["set-v2b", "0.0.0.0/0", "fd00:99::b2", "fd00:99::b1"],
    ))
    .clone();
    assert!(
        stdout(&o).starts_with("wrote 1 entry (0 v2p, 1 v2b) at "),
        "{}",
        stdout(&o)
    );
    assert_eq!(
        value_of(&etcd, "/overlay/v1/v2b/0.0.0.0/0"),
        Some(serde_json::json!({"endpoints": ["fd00:99::b1", "fd00:99::b2"]}))
    );

    let r = report(&fleet(&etcd, true, &["clear-v2p", "172.30.0.6", "1701"]));
    assert_eq!(r["deleted"]["v2p"], 1);
    assert_eq!(value_of(&etcd, V2P_KEY), None);
    ok(&fleet(&etcd, false, &["clear-v2b", "0.0.0.0/0"]));
    assert_eq!(read(&etcd, "/overlay/").kvs, []);

    // Clearing what is not there names the key, exits 1 and writes nothing.
    let before = read(&etcd, "/overlay/").revision;
    for args in [
        &["clear-v2p", "172.30.0.6", "1701"][..],
        &["clear-v2b", "::/0"],
    ] {
        let o = fleet(&etcd, false, args);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("is not in the store"), "{}", stderr(&o));
    }
    assert!(stderr(&fleet(&etcd, false, &["clear-v2p", "172.30.0.6", "1701"])).contains(V2P_KEY));
    let r = report(&fleet(
        &etcd,
        true,
        &["clear-v2p", "172.30.0.6", "1701", "--if-exists"],
    ));
    assert_eq!(r["absent"], serde_json::json!([V2P_KEY]));
    assert_eq!(read(&etcd, "/overlay/").revision, before, "nothing written");

    // A bad value is refused before anything is sent (exit 2), naming it.
    for (args, named) in [
        (
            &[
                "set-v2p",
                "172.30.0.6",
                "a8:40:25:ff:00:06",
                "ff02::1",
                "1701",
            ][..],
            "ff02::1",
        ),
        (
            &[
                "set-v2p",
                "172.30.0.6",
                "a8:40:25:ff:00:06",
                "fd00:99::2",
                "16777216",
            ],
            "16777216",
        ),
        (&["set-v2b", "10.1.2.3/8", "fd00:99::b1"], "10.1.2.3/8"),
    ] {
        let o = fleet(&etcd, false, args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(named), "{args:?}: {}", stderr(&o));
    }
    assert_eq!(read(&etcd, "/overlay/").revision, before, "nothing written");
}

/// `count` V2P mappings in VNI 10 as a load document's `v2p` part.
fn mappings(count: u32) -> Vec<serde_json::Value> {
    (0..count)
        .map(|i| {
            let [_, _, hi, lo] = i.to_be_bytes();
            serde_json::json!({
                "vni": 10,
                "vpc_ip": format!("10.1.{hi}.{lo}"),
                "vpc_mac": format!("a8:40:25:ff:{hi:02x}:{lo:02x}"),
                "underlay_ip": "fd00:99::2",
            })
        })
        .collect()
}

fn write_doc(dir: &Path, name: &str, doc: &serde_json::Value) -> String {
    let path = dir.join(name);
    std::fs::write(&path, doc.to_string()).expect("write document");
    path.to_str().expect("utf-8 path").to_string()
}

#[test]
fn a_load_of_1000_entries_goes_in_transactions_of_at_most_128() {
    let etcd = etcd();
    let dir = tempfile::tempdir().unwrap();
    let doc = serde_json::json!({
        "v2p": mappings(1000),
        "v2b": [{"prefix": "::/0", "endpoints": ["fd00:99::b1"]}],
    });
    let file = write_doc(dir.path(), "load.json", &doc);
    let r = report(&fleet(&etcd, true, &["load", &file]));
    assert_eq!(r["written"], serde_json::json!({"v2p": 1000, "v2b": 1}));
    let txns = r["revision"].as_i64().unwrap() - r["from_revision"].as_i64().unwrap();
    assert!((8..=9).contains(&txns), "1001 puts in {txns} transactions");
    let snap = read(&etcd, "/overlay/v1/vpc/10/v2p/");
    assert_eq!(snap.kvs.len(), 1000);
    assert_eq!(snap.revision, r["revision"].as_i64().unwrap());

    // The text form is one line; a document on standard input deletes them all
    // (more than 64 keys of one VPC: its table is read whole for their revisions).
    let clears: Vec<serde_json::Value> = (0..1000u32)
        .map(|i| {
            let [_, _, hi, lo] = i.to_be_bytes();
            serde_json::json!({"vni": 10, "vpc_ip": format!("10.1.{hi}.{lo}")})
        })
        .collect();
    let doc = serde_json::json!({"clear_v2p": clears, "clear_v2b": [{"prefix": "::/0"}]});
    let o = xdeadm_env(
        &["fleet", "load", "-", "--endpoints", &etcd.endpoints[0]],
        &[],
        Some(&doc.to_string()),
    );
    let text = stdout(ok(&o));
    assert!(
        text.starts_with("deleted 1001 entries (1000 v2p, 1 v2b) at "),
        "{text}"
    );
    assert_eq!(text.lines().count(), 1, "{text}");
    assert_eq!(read(&etcd, "/overlay/").kvs, []);
}

#[test]
fn a_load_with_one_invalid_entry_writes_nothing() {
    let etcd = etcd();
    let dir = tempfile::tempdir().unwrap();
    let mut v2p = mappings(300);
    v2p[200]["underlay_ip"] = "ff02::1".into();
    v2p[250]["vni"] = 16_777_216.into();
    let file = write_doc(dir.path(), "bad.json", &serde_json::json!({ "v2p": v2p }));
    let before = read(&etcd, "/overlay/").revision;
    let o = fleet(&etcd, false, &["load", &file]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("bad.json: 2 invalid entries"), "{err}");
    assert!(
        err.contains("v2p[200]: ") && err.contains("ff02::1"),
        "{err}"
    );
    assert!(
        err.contains("v2p[250]: ") && err.contains("16777216"),
        "{err}"
    );
    let after = read(&etcd, "/overlay/");
    assert_eq!((after.kvs.len(), after.revision), (0, before));

    // An empty file is no document either.
    let empty = dir.path().join("empty.json");
    std::fs::write(&empty, "").unwrap();
    let o = fleet(&etcd, false, &["load", empty.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("empty"), "{}", stderr(&o));
}

#[test]
fn tls_from_the_environment_and_flags_that_win() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::create(dir.path());
    let etcd = Etcd::start_tls(&pki);
    let tls = |p: &Path| p.to_str().unwrap().to_string();
    let (cert, key, ca) = (tls(&pki.root.cert), tls(&pki.root.key), tls(&pki.root.ca));
    let env = [
        ("XDEADM_FLEET_ENDPOINTS", "https://127.0.0.1:1"),
        ("XDEADM_FLEET_CERT", cert.as_str()),
        ("XDEADM_FLEET_KEY", key.as_str()),
        ("XDEADM_FLEET_CA", ca.as_str()),
    ];
    let set = [
        "fleet",
        "set-v2p",
        "172.30.0.6",
        "a8:40:25:ff:00:06",
        "fd00:99::2",
        "1701",
    ];
    // The member may still be electing itself: retry while it is unreachable (3).
    let endpoints = etcd.endpoints.join(",");
    let with_flag: Vec<&str> = set
        .iter()
        .copied()
        .chain(["--endpoints", &endpoints])
        .collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let o = loop {
        let o = xdeadm_env(&with_flag, &env, None);
        if o.status.code() != Some(3) || std::time::Instant::now() > deadline {
            break o;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert!(
        stdout(ok(&o)).starts_with("wrote 1 entry"),
        "{}",
        stdout(&o)
    );

    // The environment's endpoint alone: nothing listens there (3).
    let o = xdeadm_env(&set, &env, None);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(stderr(&o).contains("127.0.0.1:1"), "{}", stderr(&o));

    // https without the certificate is a usage error (2), before connecting.
    let o = xdeadm_env(&with_flag, &[], None);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("https needs"), "{}", stderr(&o));

    let o = xdeadm_env(
        &[
            "fleet",
            "clear-v2p",
            "172.30.0.6",
            "1701",
            "--endpoints",
            &endpoints,
        ],
        &env,
        None,
    );
    assert!(
        stdout(ok(&o)).starts_with("deleted 1 entry"),
        "{}",
        stdout(&o)
    );
}

/// `move-port`: the guest's mappings name the new sled, and its tables leave the
/// old sled's keys for the new one's, values as they were, in one transaction.
#[test]
fn a_moved_port_takes_its_mappings_and_tables_along() {
    let etcd = etcd();
    let from = |table: &str| format!("/overlay/v1/sled/sled-a/port/opte0/{table}");
    let to = |table: &str| format!("/overlay/v1/sled/sled-c/port/opte0/{table}");
    let routes = br#"[{"dest":"0.0.0.0/0","target":"igw"}]"#.to_vec();
    let firewall = b"[]".to_vec();
    let other_port = "/overlay/v1/sled/sled-a/port/opte01/routes";
    block_on(async {
        let mut store = etcd.store().await;
        let put = |key: String, value: &Vec<u8>| fleet::Op::Put {
            key,
            value: value.clone(),
        };
        store
            .apply(vec![
                put(from("routes"), &routes),
                put(from("firewall"), &firewall),
                put(other_port.to_string(), &routes),
            ])
            .await
            .expect("tables written");
    });
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("opte0.export");
    let export = api::testing::sample_export("opte0", 6, "guest0");
    std::fs::write(&file, serde_json::to_string(&export).unwrap()).unwrap();
    let path = file.to_str().unwrap();
    let line = [
        "move-port",
        path,
        "--from-sled",
        "sled-a",
        "--to-sled",
        "sled-c",
        "--underlay",
        "fd00:99::3",
    ];
    let r = report(&fleet(&etcd, true, &line));
    assert_eq!(r["written"]["v2p"], 2, "{r}");
    assert_eq!(r["written"]["port_tables"], 2, "{r}");
    assert_eq!(r["deleted"]["port_tables"], 2, "{r}");
    assert_eq!(
        r["revision"].as_i64().unwrap() - r["from_revision"].as_i64().unwrap(),
        1,
        "one transaction: {r}"
    );
    let mapped = serde_json::json!({"mac": "a8:40:25:ff:00:06", "underlay": "fd00:99::3"});
    for key in [V2P_KEY, "/overlay/v1/vpc/1701/v2p/fd00:1122:3344:100::6"] {
        assert_eq!(value_of(&etcd, key), Some(mapped.clone()), "{key}");
    }
    let raw = |key: &str| {
        read(&etcd, key)
            .kvs
            .into_iter()
            .find(|kv| kv.key == key)
            .map(|kv| kv.value)
    };
    assert_eq!(raw(&to("routes")), Some(routes.clone()));
    assert_eq!(raw(&to("firewall")), Some(firewall));
    assert_eq!((raw(&from("routes")), raw(&from("firewall"))), (None, None));
    assert_eq!(raw(other_port), Some(routes), "another port stays");

    // To the sled it is on: refused before anything is written (exit 2).
    let before = read(&etcd, "/overlay/").revision;
    let mut same = line;
    same[5] = "sled-a";
    let o = fleet(&etcd, false, &same);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("sled-a"), "{}", stderr(&o));
    assert_eq!(read(&etcd, "/overlay/").revision, before, "nothing written");
}
