//! Compiles the BPF programs `src/*.bpf.c` with clang into `$OUT_DIR/*.bpf.o`: the
//! XDP steering program and the underlay tunnel tap's redirect.
//!
//! C + clang rather than aya-ebpf: the toolchain comes from Debian packages
//! (`clang`, `llvm`, `libbpf-dev`), so the object is reproducible without a
//! nightly Rust toolchain or a pinned `bpf-linker`. See docs/io.md.

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    for name in ["steer", "tunnel_redirect"] {
        compile(name);
    }
}

/// Compiles `src/NAME.bpf.c` into `$OUT_DIR/NAME.bpf.o`.
fn compile(name: &str) {
    let src = format!("src/{name}.bpf.c");
    println!("cargo:rerun-if-changed={src}");
    println!("cargo:rerun-if-env-changed=CLANG");
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"))
        .join(format!("{name}.bpf.o"));
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".to_string());
    let result = Command::new(&clang)
        .args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror"])
        .arg("-I/usr/include/x86_64-linux-gnu")
        .arg("-c")
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .status();
    match result {
        Ok(status) if status.success() => {}
        Ok(status) => panic!(
            "`{clang}` failed to compile {src} ({status}); the BPF headers come from \
             Debian's libbpf-dev (bpf/bpf_helpers.h) and linux-libc-dev"
        ),
        Err(e) => panic!(
            "cannot run `{clang}` to build the BPF programs ({e}): install clang, llvm and \
             libbpf-dev (apt-get install clang llvm libbpf-dev) or set CLANG to a clang binary"
        ),
    }
}
