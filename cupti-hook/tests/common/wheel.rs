//! The real CUPTI from PyPI (nvidia-cuda-cupti-cu12 ships cupti*.h and lib/libcupti.so.12,
//! nvidia-cuda-runtime-cu12 ships cuda.h), fetched once into a cache dir at test time.
//! Nothing NVIDIA ships is committed. TOKENSCOPE_CUPTI_WHEEL_DIR points at an existing cache.

use std::path::{Path, PathBuf};
use std::process::Command;

const WHEELS: [&str; 2] = [
    "nvidia-cuda-cupti-cu12==12.9.79",
    "nvidia-cuda-runtime-cu12==12.9.79",
];

pub(crate) struct CuptiWheel {
    pub root: PathBuf,
}

impl CuptiWheel {
    pub(crate) fn cupti_include(&self) -> PathBuf {
        self.root.join("nvidia/cuda_cupti/include")
    }
    pub(crate) fn cuda_include(&self) -> PathBuf {
        self.root.join("nvidia/cuda_runtime/include")
    }
    pub(crate) fn libcupti(&self) -> PathBuf {
        self.root.join("nvidia/cuda_cupti/lib/libcupti.so.12")
    }
}

/// Downloads and unpacks the wheels unless the cache already holds them; panics with the
/// reason when it cannot (these tests need PyPI or a filled cache).
pub(crate) fn cupti_wheel() -> CuptiWheel {
    let root = std::env::var_os("TOKENSCOPE_CUPTI_WHEEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_TARGET_TMPDIR")).join("cupti-wheel"));
    let wheel = CuptiWheel { root: root.clone() };
    let ready = wheel.libcupti().exists()
        && wheel.cupti_include().join("cupti.h").exists()
        && wheel.cuda_include().join("cuda.h").exists();
    if ready {
        return wheel;
    }
    // Tests run in parallel: download into a private dir, then move into place.
    let staging = root.with_extension(format!("staging-{}", std::process::id()));
    std::fs::create_dir_all(&staging).expect("create wheel staging dir");
    let status = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--quiet",
            "--disable-pip-version-check",
            "-d",
        ])
        .arg(&staging)
        .args(WHEELS)
        .status()
        .expect("run python3 -m pip");
    assert!(
        status.success(),
        "pip download of {WHEELS:?} failed (needs PyPI or TOKENSCOPE_CUPTI_WHEEL_DIR)"
    );
    let unpacked = staging.join("unpacked");
    for entry in std::fs::read_dir(&staging).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "whl") {
            let status = Command::new("python3")
                .args(["-m", "zipfile", "-e"])
                .arg(&path)
                .arg(&unpacked)
                .status()
                .expect("run python3 -m zipfile");
            assert!(status.success(), "unzip {} failed", path.display());
        }
    }
    if std::fs::rename(&unpacked, &root).is_err() {
        // Another test got there first; use theirs.
        assert!(
            root.exists(),
            "could not move the unpacked wheels into {}",
            root.display()
        );
    }
    let _ = std::fs::remove_dir_all(&staging);
    assert!(
        wheel.libcupti().exists(),
        "wheel lacks lib/libcupti.so.12 at {}",
        wheel.libcupti().display()
    );
    wheel
}
