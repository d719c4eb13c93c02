//! Builds the stand-in libcupti and the host program the tests load the hook with.
//! Without gcc the library still builds; the tests that need them then say so.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    for f in [
        "csrc/standin_cupti.c",
        "csrc/standin_records.h",
        "csrc/host.c",
    ] {
        println!("cargo:rerun-if-changed={f}");
    }
    let jobs: [(&str, &[&str], &str); 2] = [
        (
            "csrc/standin_cupti.c",
            &["-shared", "-fPIC", "-pthread"],
            "libcupti_standin.so",
        ),
        ("csrc/host.c", &["-ldl", "-pthread"], "cupti_host"),
    ];
    for (src, flags, name) in jobs {
        let target = out.join(name);
        let status = Command::new("gcc")
            .args(["-O1", "-g", "-Wall", "-Werror", "-o"])
            .arg(&target)
            .arg(src)
            .args(flags)
            .status();
        match status {
            Ok(s) if s.success() => {}
            other => println!("cargo:warning=gcc could not build {name} ({other:?}); CUPTI stand-in tests will fail"),
        }
    }
    println!("cargo:rustc-env=CUPTI_STANDIN_DIR={}", out.display());
}
