//! Builds the stand-in CUDA driver (cuda/libcuda.c) into OUT_DIR/libcuda.so.1;
//! the crate embeds the bytes and writes them to a directory it controls at run time.
use std::path::PathBuf;
use std::process::Command;

fn main() {
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let so = out.join("libcuda.so.1");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let status = Command::new(&cc)
        .args([
            "-shared",
            "-fPIC",
            "-O2",
            "-g",
            "-fno-inline-functions",
            // The probed entry points are assembly (the driver's guard, then a jump);
            // the C functions keep a frame so that none starts with a `lock`
            // instruction, which x86 uprobes refuse (ENOTSUPP), should one be probed.
            "-fno-omit-frame-pointer",
            "-fno-shrink-wrap",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-Wl,-soname,libcuda.so.1",
            "-o",
        ])
        .arg(&so)
        .arg("cuda/libcuda.c")
        .arg("-lpthread")
        .status()
        .unwrap_or_else(|e| {
            panic!("cannot run the C compiler `{cc}` to build the stand-in libcuda: {e}")
        });
    assert!(
        status.success(),
        "building cuda/libcuda.c with `{cc}` failed"
    );
    println!("cargo:rerun-if-changed=cuda/libcuda.c");
    println!("cargo:rerun-if-env-changed=CC");
}
