//! With the `standin` feature, builds the scripted stand-in libnvidia-ml.so.1
//! (standin/nvml_standin.c) into OUT_DIR for tests here and in the workspace.

use std::env;
use std::path::PathBuf;

const STANDIN_SOURCE: &str = "standin/nvml_standin.c";
/// The soname the real driver library carries, so loaders treat the stand-in alike.
const STANDIN_SONAME: &str = "libnvidia-ml.so.1";
/// Directory holding NVIDIA's nvml.h (PyPI nvidia-nvml-dev-cu12): when set, the
/// stand-in is compiled against it so every prototype and layout is checked.
const NVML_H_DIR_VAR: &str = "TOKENSCOPE_NVML_H_DIR";

fn main() {
    println!("cargo:rerun-if-changed={STANDIN_SOURCE}");
    println!("cargo:rerun-if-env-changed={NVML_H_DIR_VAR}");
    if env::var_os("CARGO_FEATURE_STANDIN").is_none() {
        return;
    }
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let output = out_dir.join(STANDIN_SONAME);
    let compiler = cc::Build::new().get_compiler();
    let mut cmd = compiler.to_command();
    cmd.args(["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror"])
        .args(["-shared", "-fPIC", "-fvisibility=hidden"])
        .arg(format!("-Wl,-soname,{STANDIN_SONAME}"));
    if let Some(dir) = env::var_os(NVML_H_DIR_VAR) {
        cmd.arg("-DSTANDIN_WITH_NVML_H").arg("-I").arg(dir);
    }
    cmd.arg("-o").arg(&output).arg(STANDIN_SOURCE).arg("-ldl");
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("cannot run the C compiler for the NVML stand-in: {e}"));
    assert!(
        status.success(),
        "compiling the NVML stand-in ({STANDIN_SOURCE}) failed: {status}"
    );
    println!(
        "cargo:rustc-env=TOKENSCOPE_NVML_STANDIN={}",
        output.display()
    );
}
