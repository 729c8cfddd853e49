//! Any byte string given to `wire::dns::parse_names` (the value of DHCPv4 option
//! 119 or DHCPv6 option 24, compression pointers and all) must be decoded or
//! refused without a panic or an endless walk; a list it decodes whose names are
//! all valid to send must come back the same through `emit_names` and
//! `parse_names` again (no pointers then: every name written out in full).
#![no_main]

use libfuzzer_sys::fuzz_target;
use wire::dns::{emit_names, names_len, parse_names};

fuzz_target!(|data: &[u8]| {
    let Ok(names) = parse_names(data) else {
        return;
    };
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let Ok(len) = names_len(&refs) else {
        return;
    };
    let mut buf = vec![0u8; len];
    assert_eq!(emit_names(&mut buf, &refs), Ok(len));
    assert_eq!(parse_names(&buf).as_ref(), Ok(&names));
});
