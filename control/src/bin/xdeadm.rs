//! xdeadm: the admin tool. Talks to overlayd over its API socket, except for
//! `ra listen`, which runs on its own inside a guest.

use clap::Parser;
use control::cli::{render, render_as, Action, Cli};
use control::client::Client;
use control::ra_listen;
use std::process::ExitCode;
use std::time::Duration;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xdeadm: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<(), String> {
    let json = cli.json;
    match cli.command.action()? {
        Action::Call(request) => {
            let reply = Client::connect(&cli.socket)?.call(&request)?;
            if json {
                println!("{}", to_json(&reply)?);
            } else {
                print!("{}", render(&reply));
            }
        }
        Action::Show(request, show) => {
            let reply = Client::connect(&cli.socket)?.call(&request)?;
            print!("{}", render_as(show, &reply, json)?);
        }
        Action::RaListen { iface, timeout_s } => {
            let report = ra_listen::listen(&iface, Duration::from_secs(timeout_s))?;
            if json {
                println!("{}", to_json(&report)?);
            } else {
                print!("{report}");
            }
        }
    }
    Ok(())
}

fn to_json<T: serde::Serialize>(v: &T) -> Result<String, String> {
    serde_json::to_string_pretty(v).map_err(|e| format!("cannot print JSON: {e}"))
}
