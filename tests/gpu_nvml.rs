//! Privileged (it records): NVML sampling into the record file, against the
//! scripted stand-in libnvidia-ml.so.1. The recording must hold exactly the
//! scripted values, per device and in order; without a driver, one clear line.

mod common;

use std::process::Command;

use collector::ingest::model::{event::Body, NvmlSample};
use common::*;

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

#[test]
fn the_recording_holds_exactly_the_scripted_nvml_values() {
    let dir = tempfile::tempdir().expect("tempdir");
    let lib = nvml_sampler::standin::scripted_copy(dir.path(), SCRIPT).expect("stand-in copy");
    let path = dir.path().join("n.tsrec");
    let out = Command::new(BIN)
        .args([
            "record",
            "--port",
            "1",
            "--gpu",
            "off",
            "--nvml-interval",
            "20ms",
            "--duration",
            "500ms",
            "--nvml-lib",
        ])
        .arg(&lib)
        .arg("-o")
        .arg(&path)
        .output()
        .expect("run record");
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
    let dump = Command::new(BIN)
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
    let path = dir.path().join("n.tsrec");
    let out = Command::new(BIN)
        .args([
            "record",
            "--port",
            "1",
            "--gpu",
            "off",
            "--duration",
            "200ms",
            "--nvml-lib",
        ])
        .arg(dir.path().join("no-such-libnvidia-ml.so.1"))
        .arg("-o")
        .arg(&path)
        .output()
        .expect("run record");
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
