//! `import-port`'s decoder: arbitrary bytes read as a port's export (the file
//! `export-port` writes, through `PortExport::read` as `xdeadm` reads it) and,
//! when they decode, imported by a controller over an
//! engine without I/O, with `api_check`'s checks: no panic, an answer that survives
//! the wire, a refusal that changes nothing, state and engine that agree after an
//! accepted import.
#![no_main]

// Shared with the `api` target, which reads request lines (`run`).
#[allow(dead_code)]
mod api_check;

use api::{PortExport, PortImport, Request};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(export) = PortExport::read(data) {
        api_check::run_requests([Request::ImportPort(Box::new(PortImport {
            export,
            netns: None,
            attach: None,
            vhost_user: None,
        }))]);
    }
});
