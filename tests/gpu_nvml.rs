//! Privileged (it records): NVML sampling into the record file, against the
//! scripted stand-in libnvidia-ml.so.1. The recording must hold exactly the
//! scripted values, per device and in order; without a driver, one clear line.
//! The driver-not-loaded path also runs against Debian's real libnvidia-ml1,
//! fetched from deb.debian.org and checked against the signed archive index.

#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

use std::path::{Path, PathBuf};
use std::process::Command;

use collector::ingest::model::{event::Body, NvmlSample};
use test_support::*;

const SCRIPT: &str = "\
devices 2
name 0 Stand-in H200
uuid 0 GPU-00000000-0000-0000-0000-000000000000
name 1 Stand-in L4
uuid 1 GPU-11111111-1111-1111-1111-111111111111
row 0 10 5  1980 2619 1073741824 410000 41 0x0  1200  3400
row 0 95 60 1965 2619 2147483648 652000 63 0x4  88000 1000
row 0 97 61 1755 2619 2147483648 700123 71 0x44 -     -
row 1 -  -  2040 6251 4096       -      38 0x0  10    20
row 1 50 30 2040 6251 8192       71000  -  0x20 30    40
";

fn expected(device: u32, k: usize) -> NvmlSample {
    let rows: [[Option<u64>; 10]; 3] = if device == 0 {
        [
            [
                Some(10),
                Some(5),
                Some(1980),
                Some(2619),
                Some(1 << 30),
                Some(410000),
                Some(41),
                Some(0),
                Some(1200),
                Some(3400),
            ],
            [
                Some(95),
                Some(60),
                Some(1965),
                Some(2619),
                Some(2 << 30),
                Some(652000),
                Some(63),
                Some(4),
                Some(88000),
                Some(1000),
            ],
            [
                Some(97),
                Some(61),
                Some(1755),
                Some(2619),
                Some(2 << 30),
                Some(700123),
                Some(71),
                Some(0x44),
                None,
                None,
            ],
        ]
    } else {
        let second = [
            Some(50),
            Some(30),
            Some(2040),
            Some(6251),
            Some(8192),
            Some(71000),
            None,
            Some(0x20),
            Some(30),
            Some(40),
        ];
        [
            [
                None,
                None,
                Some(2040),
                Some(6251),
                Some(4096),
                None,
                Some(38),
                Some(0),
                Some(10),
                Some(20),
            ],
            second,
            second,
        ]
    };
    let r = rows[k.min(2)];
    let u = |i: usize| r[i].map(|v| v as u32);
    NvmlSample {
        device,
        gpu_util_pct: u(0),
        mem_util_pct: u(1),
        sm_clock_mhz: u(2),
        mem_clock_mhz: u(3),
        mem_used_bytes: r[4],
        power_mw: u(5),
        temperature_c: u(6),
        throttle_reasons: r[7],
        pcie_tx_kbps: u(8),
        pcie_rx_kbps: u(9),
    }
}

/// `tokenscope record` of nothing (port 1, no GPU probes) for `duration`, sampling NVML
/// every 20 ms through `lib`: the recording's path and the command's output.
fn record_nvml(dir: &Path, lib: &Path, duration: &str) -> (PathBuf, std::process::Output) {
    let path = dir.join("n.tsrec");
    let out = Command::new(profiler())
        .args([
            "record",
            "--port",
            "1",
            "--gpu",
            "off",
            "--nvml-interval",
            "20ms",
        ])
        .args(["--duration", duration, "--nvml-lib"])
        .arg(lib)
        .arg("-o")
        .arg(&path)
        .output()
        .expect("run record");
    (path, out)
}

#[test]
fn the_recording_holds_exactly_the_scripted_nvml_values() {
    let dir = tempfile::tempdir().expect("tempdir");
    let lib = standin::nvml::scripted_copy(dir.path(), SCRIPT).expect("stand-in copy");
    let (path, out) = record_nvml(dir.path(), &lib, "500ms");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("NVML: sampling 2 GPU(s)"), "{stderr}");
    let (header, events) = read_recording(&path);
    assert_eq!(
        header.gpu_devices,
        [
            "0: Stand-in H200 (GPU-00000000-0000-0000-0000-000000000000)",
            "1: Stand-in L4 (GPU-11111111-1111-1111-1111-111111111111)"
        ]
    );
    for device in [0, 1] {
        let samples: Vec<&NvmlSample> = events
            .iter()
            .filter_map(|e| match &e.body {
                Some(Body::Nvml(n)) if n.device == device => Some(n),
                _ => None,
            })
            .collect();
        assert!(
            samples.len() >= 5,
            "device {device}: {} samples in 500 ms at 20 ms",
            samples.len()
        );
        for (k, s) in samples.iter().enumerate() {
            assert_eq!(**s, expected(device, k), "device {device} sample {k}");
        }
    }
    let dump = Command::new(profiler())
        .arg("dump")
        .arg(&path)
        .output()
        .expect("dump");
    assert!(
        String::from_utf8_lossy(&dump.stdout)
            .contains("nvml gpu0 util 95% mem-util 60% sm 1965 MHz"),
        "dump shows the series"
    );
}

#[test]
fn without_a_driver_nvml_is_one_line_and_recording_goes_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (path, out) = record_nvml(
        dir.path(),
        &dir.path().join("no-such-libnvidia-ml.so.1"),
        "200ms",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "recording goes on without NVML: {stderr}"
    );
    let lines: Vec<&str> = stderr.lines().filter(|l| l.contains("NVML")).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].contains("NVML off: NVML not available"),
        "{stderr}"
    );
    let (header, _) = read_recording(&path);
    assert!(header.complete && header.nvml_note.contains("not available"));
}

#[test]
fn debians_real_libnvidia_ml_without_a_driver_says_driver_not_loaded() {
    if Path::new(NVIDIA_DRIVER_PROC).exists() {
        // With the kernel module loaded, nvmlInit reaches the driver: another path.
        eprintln!("not run: {NVIDIA_DRIVER_PROC} exists, the NVIDIA driver is loaded here");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let lib = debian_libnvidia_ml(dir.path());
    let (path, out) = record_nvml(dir.path(), &lib, "500ms");
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stderr}");
    assert!(
        out.status.success(),
        "recording goes on without a driver: {stderr}"
    );
    let lines: Vec<&str> = stderr.lines().filter(|l| l.contains("NVML")).collect();
    assert_eq!(lines.len(), 1, "one NVML line: {stderr}");
    // The library loaded and nvmlInit_v2 answered NVML_ERROR_DRIVER_NOT_LOADED.
    assert!(
        lines[0].contains(
            "NVML off: driver not loaded / NVML init failed: NVIDIA driver is not loaded"
        ),
        "the real library says the driver is not loaded: {stderr}"
    );
    let (header, events) = read_recording(&path);
    assert!(header.complete, "the recording completed");
    assert!(
        header.nvml_note.contains("NVIDIA driver is not loaded"),
        "header note: {}",
        header.nvml_note
    );
    assert!(header.gpu_devices.is_empty(), "{:?}", header.gpu_devices);
    let nvml = events
        .iter()
        .filter(|e| matches!(e.body, Some(Body::Nvml(_))))
        .count();
    assert_eq!(nvml, 0, "no NVML samples without a driver");
}

/// Present only while the NVIDIA kernel module is loaded.
const NVIDIA_DRIVER_PROC: &str = "/proc/driver/nvidia";
const DEBIAN_MIRROR: &str = "http://deb.debian.org/debian";
const DEBIAN_SUITE: &str = "bookworm";
const DEBIAN_KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";
const NVML_PACKAGE: &str = "libnvidia-ml1";

/// Debian's libnvidia-ml.so.1, extracted into `dir`. The .deb is cached under
/// the target dir; every byte is checked: InRelease by gpgv against Debian's
/// keyring, then Packages.xz by its SHA256 there, then the .deb by its SHA256
/// in Packages. Any failure panics: this test never passes without the real library.
fn debian_libnvidia_ml(dir: &Path) -> PathBuf {
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("debian-libnvidia-ml");
    std::fs::create_dir_all(&cache).expect("create the .deb cache dir");
    let arch = String::from_utf8(tool(
        Command::new("dpkg").arg("--print-architecture"),
        "dpkg --print-architecture",
    ))
    .expect("dpkg prints UTF-8");
    let index = format!("non-free/binary-{}/Packages.xz", arch.trim());
    let suite = format!("{DEBIAN_MIRROR}/dists/{DEBIAN_SUITE}");

    let in_release = dir.join("InRelease");
    fetch(&format!("{suite}/InRelease"), &in_release);
    let release = String::from_utf8(tool(
        Command::new("gpgv")
            .arg("--keyring")
            .arg(DEBIAN_KEYRING)
            .args(["--output", "-"])
            .arg(&in_release),
        "gpgv InRelease (needs gpgv and debian-archive-keyring)",
    ))
    .expect("InRelease is UTF-8");
    let index_sha = release_sha256(&release, &index)
        .unwrap_or_else(|| panic!("{DEBIAN_SUITE} InRelease lists no SHA256 for {index}"));
    let packages_xz = dir.join("Packages.xz");
    fetch(&format!("{suite}/{index}"), &packages_xz);
    assert_eq!(
        sha256(&packages_xz),
        index_sha,
        "{index} does not match InRelease"
    );
    let packages = String::from_utf8(tool(
        Command::new("xz").arg("-dc").arg(&packages_xz),
        "xz -dc Packages.xz",
    ))
    .expect("Packages is UTF-8");

    let stanza = packages
        .split("\n\n")
        .find(|s| s.lines().any(|l| l == format!("Package: {NVML_PACKAGE}")))
        .unwrap_or_else(|| panic!("{index} of {DEBIAN_SUITE} has no {NVML_PACKAGE}"));
    let field = |name: &str| {
        stanza
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(": "))
            .unwrap_or_else(|| panic!("{NVML_PACKAGE} stanza lacks {name}: {stanza}"))
    };
    let (filename, deb_sha) = (field("Filename"), field("SHA256"));
    let deb = cache.join(filename.rsplit('/').next().expect("Filename has a name"));
    if !deb.exists() || sha256(&deb) != deb_sha {
        let part = deb.with_extension("part");
        fetch(&format!("{DEBIAN_MIRROR}/{filename}"), &part);
        assert_eq!(sha256(&part), deb_sha, "{filename} does not match Packages");
        std::fs::rename(&part, &deb).expect("move the .deb into the cache");
    }
    eprintln!(
        "{NVML_PACKAGE} {} ({} bytes) from {}",
        field("Version"),
        field("Size"),
        deb.display()
    );

    let root = dir.join("deb");
    tool(
        Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root),
        "dpkg-deb -x",
    );
    let lib = find_file(&root, "libnvidia-ml.so.1")
        .unwrap_or_else(|| panic!("{filename} holds no libnvidia-ml.so.1"));
    eprintln!("real libnvidia-ml: {}", lib.display());
    lib
}

/// Runs a host tool and returns its stdout; panics with its stderr when it fails.
fn tool(cmd: &mut Command, what: &str) -> Vec<u8> {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: could not run: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn fetch(url: &str, to: &Path) {
    tool(
        Command::new("curl")
            .args(["-fsSL", "--retry", "3", "-o"])
            .arg(to)
            .arg(url),
        &format!("download of {url} (the test needs deb.debian.org)"),
    );
}

fn sha256(path: &Path) -> String {
    let out = tool(Command::new("sha256sum").arg(path), "sha256sum");
    let out = String::from_utf8(out).expect("sha256sum prints UTF-8");
    out.split_whitespace()
        .next()
        .expect("sha256sum prints a hash")
        .to_string()
}

/// The SHA256 that a Release file's `SHA256:` section gives for `path`.
fn release_sha256(release: &str, path: &str) -> Option<String> {
    release
        .lines()
        .skip_while(|l| *l != "SHA256:")
        .skip(1)
        .take_while(|l| l.starts_with(' '))
        .find_map(|l| match l.split_whitespace().collect::<Vec<_>>()[..] {
            [hash, _size, p] if p == path => Some(hash.to_string()),
            _ => None,
        })
}

/// The first file or link named `name` under `root`.
fn find_file(root: &Path, name: &str) -> Option<PathBuf> {
    for entry in std::fs::read_dir(root).ok()?.flatten() {
        let path = entry.path();
        if entry.file_name() == name {
            return Some(path);
        }
        if entry.file_type().ok()?.is_dir() {
            if let Some(found) = find_file(&path, name) {
                return Some(found);
            }
        }
    }
    None
}
