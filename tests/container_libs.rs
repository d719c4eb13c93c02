//! Privileged: a process in another mount namespace (as a container is) maps a libssl
//! that exists only in its own root. `--tls auto` finds it through /proc/PID/root and
//! puts the plaintext uprobes on it; the host path of the same name does not exist.

#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use test_support::{read_recording, Recorder};

/// The system's libssl (Debian's multiarch path, else what the loader cache says).
fn system_libssl() -> PathBuf {
    let debian = PathBuf::from("/usr/lib/x86_64-linux-gnu/libssl.so.3");
    if debian.exists() {
        return debian;
    }
    let out = Command::new("ldconfig")
        .arg("-p")
        .output()
        .expect("ldconfig");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.trim_start().starts_with("libssl.so.3"))
        .and_then(|l| l.rsplit(" => ").next())
        .map(PathBuf::from)
        .expect("a libssl.so.3 on this machine")
}

/// Kills the namespaced process when the test ends.
struct Contained(std::process::Child);

impl Drop for Contained {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_libssl_only_inside_another_mount_namespace_is_found_and_probed_through_its_root() {
    let dir = tempfile::tempdir().expect("tempdir");
    let private = dir.path().join("container-lib");
    std::fs::create_dir(&private).expect("mkdir");
    let lib = private.join("libssl.so.3");
    // A private tmpfs over `private` in a new mount namespace: the copy exists there only.
    let script = format!(
        "mount -t tmpfs none {p} && cp {sys} {lib} && exec env LD_PRELOAD={lib} sleep 120",
        p = private.display(),
        sys = system_libssl().display(),
        lib = lib.display()
    );
    let child = Contained(
        Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &script])
            .stdin(Stdio::null())
            .spawn()
            .expect("unshare (util-linux)"),
    );
    let pid = child.0.id();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .is_ok_and(|m| m.contains(lib.to_str().expect("utf-8")))
    {
        assert!(
            Instant::now() < deadline,
            "the namespaced process never mapped {lib:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        !lib.exists(),
        "the copy is not visible from the host's namespace"
    );

    let through_root = PathBuf::from(format!("/proc/{pid}/root{}", lib.display()));
    let found = collector::probes::find_libssl(&[pid]);
    assert!(
        found.contains(&through_root),
        "found through its root: {through_root:?} in {found:?}"
    );

    let rec_dir = tempfile::tempdir().expect("tempdir");
    let rec = Recorder::start(rec_dir.path(), &["-p", &pid.to_string(), "--gpu", "off"]);
    let path = rec.path.clone();
    rec.stop();
    let (header, _) = read_recording(&path);
    let probed = format!("uprobe:SSL_read@{}", through_root.display());
    assert!(
        header.probes.iter().any(|p| p == &probed),
        "{probed} attached: {:?}",
        header.probes
    );
}
