//! The `api` fuzz target's corpus, replayed with the target's own checks: the seeds
//! (one per request type, each preceded by what it needs) and every input kept from
//! fuzzing campaigns (`fuzz/regressions/api`). See `fuzz/fuzz_targets/api_check.rs`.

#[path = "../../../fuzz/fuzz_targets/api_check.rs"]
mod api_check;

use api::protocol::decode_request;
use api::Request;
use std::path::{Path, PathBuf};

fn corpus(dir: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz")
        .join(dir);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            (p, bytes)
        })
        .collect();
    files.sort();
    files
}

/// A number per request type; no wildcard, so a new type does not compile until
/// it is counted here (and then needs a seed).
fn kind(r: &Request) -> usize {
    match r {
        Request::CreatePort(_) => 0,
        Request::DeletePort { .. } => 1,
        Request::ListPorts => 2,
        Request::SetV2p { .. } => 3,
        Request::ClearV2p { .. } => 4,
        Request::DumpV2p => 5,
        Request::AddRouterEntry { .. } => 6,
        Request::DelRouterEntry { .. } => 7,
        Request::DumpRoutes { .. } => 8,
        Request::AddFwRule { .. } => 9,
        Request::RmFwRule { .. } => 10,
        Request::SetFwRules { .. } => 11,
        Request::DumpLayer { .. } => 12,
        Request::DumpUft { .. } => 13,
        Request::ClearUft { .. } => 14,
        Request::Stats { .. } => 15,
        Request::Mtu { .. } => 16,
        Request::Ra { .. } => 17,
        Request::ListLayers { .. } => 18,
        Request::DumpTcpFlows { .. } => 19,
        Request::RmFwRuleId { .. } => 20,
        // Answered by the daemon with I/O only: refused here, so seeded in
        // 18-all.jsonl (which need not be accepted whole).
        Request::Doctor => 21,
        Request::PathCheck { .. } => 22,
        Request::Workers => 23,
        Request::Capture(_) => 24,
        Request::SetV2b { .. } => 25,
        Request::ClearV2b { .. } => 26,
        Request::DumpV2b => 27,
        Request::SetExternalIps { .. } => 28,
        Request::ListFwRules { .. } => 29,
        Request::PausePort { .. } => 30,
        Request::ResumePort { .. } => 31,
        Request::SetPortLimits { .. } => 32,
        Request::AllowCidr { .. } => 33,
        Request::RemoveCidr { .. } => 34,
        Request::FleetStatus => 35,
        // Refused by a daemon outside a fleet: seeded in 18-all.jsonl.
        Request::FleetResync => 36,
        Request::FleetAdopt => 37,
        Request::ClearLft { .. } => 38,
        // Answered by the daemon with its configuration only: seeded in
        // 18-all.jsonl.
        Request::CheckSled(_) => 39,
        Request::ExportPort { .. } => 40,
        Request::ImportPort(_) => 41,
    }
}
const KINDS: usize = 42;

/// Every seed decodes line by line, every request type has a seed, and each
/// single-type seed is accepted whole, so fuzzing starts from requests that reach
/// the controller's deepest paths rather than from refusals.
#[test]
fn seeds_cover_every_request_and_are_accepted() {
    let mut seen = [false; KINDS];
    for (path, bytes) in corpus("seeds/api") {
        let text = String::from_utf8(bytes.clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for l in &lines {
            let r = decode_request(l.as_bytes())
                .unwrap_or_else(|e| panic!("{}: {e}: {l}", path.display()));
            seen[kind(&r)] = true;
        }
        let accepted = api_check::run(&bytes);
        if !path.ends_with("18-all.jsonl") {
            assert_eq!(
                accepted,
                lines.len(),
                "{} not accepted whole",
                path.display()
            );
        }
    }
    let missing: Vec<usize> = (0..KINDS).filter(|&k| !seen[k]).collect();
    assert!(
        missing.is_empty(),
        "request types without a seed: {missing:?}"
    );
}

/// Inputs kept from fuzzing (anything that once failed, and the minimised corpus
/// of a campaign) still pass every check.
#[test]
fn kept_inputs_pass_the_checks() {
    let kept = corpus("regressions/api");
    for (path, bytes) in &kept {
        eprintln!("{}", path.display());
        api_check::run(bytes);
    }
}

/// The `port_import` target's seeds are exports a daemon imports whole (so fuzzing
/// starts from inputs that reach the engine's import), through the same checks.
#[test]
fn port_import_seeds_are_imported() {
    for (path, bytes) in corpus("seeds/port_import") {
        let export: api::PortExport =
            serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let import = api::PortImport {
            export,
            netns: None,
            attach: None,
            vhost_user: None,
        };
        let accepted = api_check::run_requests([Request::ImportPort(Box::new(import))]);
        assert_eq!(accepted, 1, "{} is refused", path.display());
    }
}
