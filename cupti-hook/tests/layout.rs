//! The hand-written bindings and the stand-in's record layouts against the real cupti.h:
//! layout_check.c static-asserts the stand-in (gcc fails the build on a mismatch) and prints
//! CUPTI's offsets and constants, which must equal the Rust mirror's.

#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

#[path = "common/wheel.rs"]
mod wheel;

use std::collections::HashMap;
use std::process::Command;

use tokenscope_cupti_hook::bindings::{CONSTANTS, RECORD_LAYOUT};

/// nvcc's crt/host_defines.h is not in the runtime wheel; host-only C needs its macros empty.
const HOST_DEFINES_SHIM: &str = "#define __device_builtin__\n#define __device_builtin_texture_type__\n#define __device_builtin_surface_type__\n#define __cudart_builtin__\n#define __host__\n#define __device__\n#define __align__(n) __attribute__((aligned(n)))\n#define CUDARTAPI\n#define __location__(a)\n#define __builtin_align__(a) __align__(a)\n";

#[test]
fn bindings_and_standin_match_the_real_cupti_headers() {
    let wheel = wheel::cupti_wheel();
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("crt")).unwrap();
    std::fs::write(dir.path().join("crt/host_defines.h"), HOST_DEFINES_SHIM).unwrap();
    let csrc = concat!(env!("CARGO_MANIFEST_DIR"), "/csrc");
    let exe = dir.path().join("layout_check");
    let out = Command::new("gcc")
        .arg("-Wall")
        .arg(format!("-I{}", dir.path().display()))
        .arg(format!("-I{}", wheel.cupti_include().display()))
        .arg(format!("-I{}", wheel.cuda_include().display()))
        .arg(format!("-I{csrc}"))
        .arg(format!("{csrc}/layout_check.c"))
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("run gcc");
    assert!(
        out.status.success(),
        "stand-in record layouts differ from cupti.h:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(&exe).output().expect("run layout_check");
    assert!(out.status.success(), "layout_check failed");
    let real: HashMap<String, u64> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (k, v) = l.split_once(' ').expect("NAME VALUE");
            (k.to_string(), v.parse().expect("number"))
        })
        .collect();
    assert_eq!(
        real.get("CUpti_ActivityKernel9.sizeof"),
        Some(&208),
        "CUpti_ActivityKernel9 is 208 bytes"
    );
    for (name, offset) in RECORD_LAYOUT {
        assert_eq!(
            real.get(*name),
            Some(&(*offset as u64)),
            "{name}: Rust mirror vs cupti.h"
        );
    }
    for (name, value) in CONSTANTS {
        assert_eq!(
            real.get(*name),
            Some(&u64::from(*value)),
            "{name}: Rust constant vs cupti.h"
        );
    }
}

#[test]
fn real_libcupti_exports_every_entry_point_the_hook_resolves() {
    let wheel = wheel::cupti_wheel();
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(wheel.libcupti())
        .output()
        .expect("run nm");
    assert!(
        out.status.success(),
        "nm -D failed on {}",
        wheel.libcupti().display()
    );
    let listing = String::from_utf8_lossy(&out.stdout);
    // Lines read "ADDR T name@@libcupti.so.12": keep the name.
    let exported: Vec<&str> = listing
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .map(|s| s.split('@').next().unwrap_or(s))
        .collect();
    for sym in tokenscope_cupti_hook::inject::CUPTI_SYMBOLS {
        assert!(exported.contains(sym), "libcupti.so.12 lacks {sym}");
    }
}
