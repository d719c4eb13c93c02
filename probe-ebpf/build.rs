//! Compiles src/bpf/tokenscope.bpf.c with clang (CO-RE, libbpf headers) into
//! $OUT_DIR/tokenscope.bpf.o. Without clang (or with TOKENSCOPE_SKIP_BPF=1) an
//! empty stub is written instead so `cargo check`, clippy and the pure tests
//! still build; the loader then says plainly that the probes were not built.

use std::path::{Path, PathBuf};
use std::process::Command;

const SOURCES: &[&str] = &[
    "src/bpf/tokenscope.bpf.c",
    "src/bpf/tokenscope.h",
    "src/bpf/kernel.h",
    "src/bpf/common.bpf.h",
    "src/bpf/conn.bpf.h",
    "src/bpf/io.bpf.h",
    "src/bpf/gpu.bpf.h",
    "src/bpf/tls.bpf.h",
];

/// Where a clang would be installed (Debian's clang-19 links itself into /usr/bin).
const CLANG_DIRS: &[&str] = &["/usr/bin", "/usr/local/bin"];

fn main() {
    for s in SOURCES {
        println!("cargo:rerun-if-changed={s}");
    }
    println!("cargo:rerun-if-env-changed=TOKENSCOPE_SKIP_BPF");
    println!("cargo:rerun-if-env-changed=TOKENSCOPE_CLANG");
    println!("cargo::rustc-check-cfg=cfg(tokenscope_probes_stub)");

    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let obj = out.join("tokenscope.bpf.o");
    if std::env::var_os("TOKENSCOPE_SKIP_BPF").is_some() {
        return stub(&obj, "TOKENSCOPE_SKIP_BPF is set");
    }
    let Some(clang) = find_clang() else {
        // Built again once clang is installed (`cargo xtask setup` after a first build),
        // or the stub would stay in this target directory for good.
        for dir in CLANG_DIRS {
            if Path::new(dir).is_dir() {
                println!("cargo:rerun-if-changed={dir}");
            }
        }
        return stub(&obj, "clang not found (run `cargo xtask setup`)");
    };
    let arch = match std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() {
        Ok("x86_64") => "x86",
        Ok("aarch64") => "arm64",
        Ok(other) => panic!("tokenscope probes: unsupported target arch {other}"),
        Err(_) => "x86",
    };
    let multiarch = format!(
        "/usr/include/{}-linux-gnu",
        std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_else(|_| "x86_64".into())
    );
    let status = Command::new(&clang)
        .args(["-target", "bpf", "-g", "-O2", "-Wall", "-Werror"])
        .arg(format!("-D__TARGET_ARCH_{arch}"))
        .arg("-Isrc/bpf")
        .arg(format!("-I{multiarch}"))
        .args(["-c", "src/bpf/tokenscope.bpf.c", "-o"])
        .arg(&obj)
        .status()
        .unwrap_or_else(|e| panic!("running {clang}: {e}"));
    assert!(
        status.success(),
        "{clang} failed to compile the eBPF programs"
    );
}

fn find_clang() -> Option<String> {
    if let Ok(c) = std::env::var("TOKENSCOPE_CLANG") {
        return Some(c);
    }
    ["clang-19", "clang"]
        .into_iter()
        .find(|c| {
            Command::new(c)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .map(str::to_string)
}

fn stub(obj: &Path, why: &str) {
    println!("cargo:warning=tokenscope eBPF probes not built: {why}");
    println!("cargo:rustc-cfg=tokenscope_probes_stub");
    std::fs::write(obj, b"").expect("write stub object");
}
