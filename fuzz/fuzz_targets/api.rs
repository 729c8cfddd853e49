//! The control API: arbitrary request lines through the JSON decoder and a
//! controller over an engine without I/O. See `api_check.rs` for what is checked.
#![no_main]

mod api_check;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    api_check::run(data);
});
