//! The fleet's store as a sled reads it: arbitrary keys and values (anyone who can
//! write to etcd, or a broken control plane, writes them) through the key parser,
//! the value checks and a fleet member's controller over an engine without I/O.
//!
//! Input: lines; `KEY<TAB>VALUE` puts, a line without a tab deletes `KEY`, `--`
//! ends a batch of events, `==` ends a batch that is a full read of every prefix
//! the batch's keys fall under. Whatever arrives, nothing panics, and after every
//! batch the engine holds exactly the fleet layer's V2P mappings (this sled has no
//! local ones), each as the layer has it.
#![no_main]

use api::fleet::vpc_prefix;
use api::{Outcome, Reply, Request, Source};
use engine::{Engine, EngineConfig};
use fleet::{Change, Positions};
use libfuzzer_sys::fuzz_target;
use overlayd::controller::fleet::FleetLayer;
use overlayd::controller::Controller;
use overlayd::fleet::channel::{FleetBatch, SharedView};
use overlayd::worker::Datapath;

/// Batches looked at per input.
const MAX_BATCHES: usize = 16;

fuzz_target!(|data: &[u8]| {
    let engine = Engine::new(EngineConfig::new("fd00:99::1".parse().unwrap())).unwrap();
    let mut ctl = Controller::new(Datapath::without_io(engine), None);
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    ctl.join_fleet("s1".parse().unwrap(), FleetLayer::default(), tx, SharedView::default());
    let mut changes = Vec::new();
    let mut revision = 1;
    let mut batches = 0;
    for line in data.split(|&b| b == b'\n') {
        let full_read = match line {
            b"--" => false,
            b"==" => true,
            _ => {
                let text = String::from_utf8_lossy(line);
                let (key, value) = match text.split_once('\t') {
                    Some((k, v)) => (k, Some(v.as_bytes().to_vec())),
                    None => (&*text, None),
                };
                revision += 1;
                changes.push(Change {
                    key: key.to_string(),
                    value,
                    mod_revision: revision,
                });
                continue;
            }
        };
        apply(&mut ctl, std::mem::take(&mut changes), revision, full_read);
        batches += 1;
        if batches == MAX_BATCHES {
            return;
        }
    }
    apply(&mut ctl, changes, revision, false);
});

fn apply(ctl: &mut Controller<Datapath>, changes: Vec<Change>, revision: i64, full_read: bool) {
    // The prefixes a sled hosting VNIs 1 and 1701 reads.
    let positions: Positions = [
        vpc_prefix(api::Vni::new(1).unwrap()),
        vpc_prefix(api::Vni::new(1701).unwrap()),
        api::fleet::V2B_PREFIX.to_string(),
        api::fleet::sled_ports_prefix(&"s1".parse().unwrap()),
    ]
    .into_iter()
    .map(|p| (p, revision))
    .collect();
    ctl.apply_fleet(FleetBatch {
        cluster_id: 1,
        changes,
        positions,
        full_read,
    });
    let Outcome::Ok(Reply::V2p(records)) = ctl.handle(Request::DumpV2p) else {
        panic!("dump-v2p answered something else");
    };
    assert!(records.iter().all(|r| r.source == Source::Fleet));
    let mut engine: Vec<String> = ctl
        .dataplane()
        .engine()
        .dump_v2p()
        .iter()
        .map(|d| format!("{} {} {} {}", d.vni, d.ip, d.underlay, d.mac))
        .collect();
    let mut expected: Vec<String> = records
        .iter()
        .map(|r| format!("{} {} {} {}", r.entry.vni, r.entry.vpc_ip, r.entry.underlay_ip, r.entry.vpc_mac))
        .collect();
    engine.sort();
    expected.sort();
    assert_eq!(engine, expected, "the engine and the fleet layer disagree");
}
