//! overlayd: the per-sled daemon. See docs/operating.md.

#![forbid(unsafe_code)]

use clap::Parser;
use overlayd::config::{DaemonArgs, DaemonConfig, LogFormat};
use std::process::ExitCode;

fn main() -> ExitCode {
    let args = DaemonArgs::parse();
    let cfg = match DaemonConfig::resolve(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("overlayd: {e}");
            return ExitCode::FAILURE;
        }
    };
    let filter = tracing_subscriber::EnvFilter::try_new(&cfg.log_level).unwrap_or_else(|e| {
        eprintln!(
            "overlayd: invalid --log-level {:?} ({e}); using info",
            cfg.log_level
        );
        tracing_subscriber::EnvFilter::new("info")
    });
    let log = tracing_subscriber::fmt().with_env_filter(filter);
    match cfg.log_format {
        LogFormat::Text => log.init(),
        LogFormat::Json => log.json().init(),
    }
    match overlayd::daemon::run(&cfg) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("overlayd: {e}");
            ExitCode::FAILURE
        }
    }
}
