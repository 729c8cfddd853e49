//! soak: the standard rack under mixed traffic for a long time (see `e2e::soak`),
//! checking that memory stays flat, tables stay bounded and counters agree.
//!
//! Run through `scripts/soak.sh`, which builds in release mode and sets
//! OVERLAYD_BIN/XDEADM_BIN; `soak --help` lists the options. The same binary runs
//! the workloads inside the guests (`soak churn-client ...`, see `e2e::soak::load`).
//!
//! Exit status: 0 when every check passed, 1 when any failed (all are reported),
//! 2 for a bad command line.

use e2e::soak::{self, Options, Parsed, USAGE};
use std::process::ExitCode;

fn main() -> ExitCode {
    let opts = match Options::parse(std::env::args().skip(1)) {
        Ok(Parsed::Run(o)) => o,
        Ok(Parsed::Help) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Ok(Parsed::Workload(args)) => {
            return match soak::workload(&args) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("soak {}: {e}", args[0]);
                    ExitCode::FAILURE
                }
            };
        }
        Err(e) => {
            eprintln!("soak: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let outcome = match soak::run(&opts) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("soak: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("{}", soak::summary(&outcome));
    if let Some(path) = &opts.out {
        let written = serde_json::to_string_pretty(&outcome.json)
            .map_err(|e| e.to_string())
            .and_then(|text| std::fs::write(path, text + "\n").map_err(|e| e.to_string()));
        if let Err(e) = written {
            eprintln!("soak: writing {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        println!("results: {}", path.display());
    }
    if outcome.failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
