//! The scripted stand-in libnvidia-ml.so.1 (standin/nvml_standin.c), for tests
//! here and in the workspace. The script format is documented at the top of the C file.

use std::io;
use std::path::{Path, PathBuf};

/// Script file the stand-in reads when `TOKENSCOPE_NVML_SCRIPT` is unset.
pub const SIDECAR_SCRIPT: &str = "tokenscope-nvml.script";
/// Names a script file for every stand-in loaded in this process.
pub const SCRIPT_ENV: &str = "TOKENSCOPE_NVML_SCRIPT";
/// Non-empty: nvmlInit_v2 fails with NVML_ERROR_DRIVER_NOT_LOADED.
pub const FAIL_INIT_ENV: &str = "TOKENSCOPE_NVML_FAIL_INIT";

/// The stand-in as built into OUT_DIR.
pub fn standin_library() -> PathBuf {
    PathBuf::from(env!("TOKENSCOPE_NVML_STANDIN"))
}

/// Copies the stand-in into `dir` as libnvidia-ml.so.1 with `script` beside it.
///
/// The dynamic loader keeps one instance per file, so each copy has its own
/// state: tests in one process can each script their own devices.
pub fn scripted_copy(dir: &Path, script: &str) -> io::Result<PathBuf> {
    let lib = dir.join("libnvidia-ml.so.1");
    std::fs::copy(standin_library(), &lib)?;
    std::fs::write(dir.join(SIDECAR_SCRIPT), script)?;
    Ok(lib)
}
