//! The sampler against the scripted stand-in libnvidia-ml.so.1: what NVML says is
//! what gets recorded, and every way NVML can be missing ends in one clear line.

#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use nvml_sampler::standin::scripted_copy;
use nvml_sampler::{DeviceInfo, NvmlError, NvmlSample, Sampler};
use tokenscope_clock::monotonic_ns;

/// Long enough for a loaded 2-core machine; only a broken sampler waits this out.
const PATIENCE: Duration = Duration::from_secs(60);

/// Two devices, four rows each; `-` is a query NVML refuses on that device.
const TWO_DEVICES: &str = "\
# dev gpu mem sm   memclk used        power  temp throttle tx    rx
devices 2
name 0 Stand-in H200 SXM
uuid 0 GPU-11111111-2222-3333-4444-555555555555
name 1 Stand-in L4
uuid 1 GPU-66666666-7777-8888-9999-000000000000
row 0 10  5   1980 2619   1073741824  410000 41  0x0   1200  3400
row 0 95  60  1965 2619   70000000000 652000 63  0x4   88000 1000
row 0 97  61  1755 2619   70000000512 700123 71  0x44  -     -
row 0 0   0   345  2619   70000000512 98000  55  0x1   0     7
row 1 -   -   2040 6251   4096        -      38  0x0   10    20
row 1 50  30  2040 6251   8192        71000  -   -     30    40
row 1 51  31  2010 6251   16384       72000  39  0x20  50    60
row 1 52  32  -    -      -           73000  40  0x100 70    80
";

fn row(device: u32, v: [Option<u64>; 10]) -> NvmlSample {
    let u32_of = |x: Option<u64>| x.map(|x| u32::try_from(x).expect("script value fits u32"));
    NvmlSample {
        ts_ns: 0,
        device,
        gpu_util_pct: u32_of(v[0]),
        mem_util_pct: u32_of(v[1]),
        sm_clock_mhz: u32_of(v[2]),
        mem_clock_mhz: u32_of(v[3]),
        mem_used_bytes: v[4],
        power_mw: u32_of(v[5]),
        temperature_c: u32_of(v[6]),
        throttle_reasons: v[7],
        pcie_tx_kbps: u32_of(v[8]),
        pcie_rx_kbps: u32_of(v[9]),
    }
}

/// TWO_DEVICES as the sampler must record it (ts_ns left 0).
#[rustfmt::skip]
fn expected_rows() -> BTreeMap<u32, Vec<NvmlSample>> {
    let s = Some;
    let n = None;
    BTreeMap::from([
        (0, vec![
            row(0, [s(10), s(5),  s(1980), s(2619), s(1 << 30),         s(410_000), s(41), s(0),    s(1200),   s(3400)]),
            row(0, [s(95), s(60), s(1965), s(2619), s(70_000_000_000),  s(652_000), s(63), s(0x4),  s(88_000), s(1000)]),
            row(0, [s(97), s(61), s(1755), s(2619), s(70_000_000_512),  s(700_123), s(71), s(0x44), n,         n]),
            row(0, [s(0),  s(0),  s(345),  s(2619), s(70_000_000_512),  s(98_000),  s(55), s(0x1),  s(0),      s(7)]),
        ]),
        (1, vec![
            row(1, [n,     n,     s(2040), s(6251), s(4096),            n,          s(38), s(0),     s(10), s(20)]),
            row(1, [s(50), s(30), s(2040), s(6251), s(8192),            s(71_000),  n,     n,        s(30), s(40)]),
            row(1, [s(51), s(31), s(2010), s(6251), s(16384),           s(72_000),  s(39), s(0x20),  s(50), s(60)]),
            row(1, [s(52), s(32), n,       n,       n,                  s(73_000),  s(40), s(0x100), s(70), s(80)]),
        ]),
    ])
}

/// Drains until every device has at least `per_device` samples; panics after PATIENCE.
fn collect(sampler: &Sampler, per_device: usize) -> BTreeMap<u32, Vec<NvmlSample>> {
    let deadline = Instant::now() + PATIENCE;
    let mut by_device: BTreeMap<u32, Vec<NvmlSample>> = sampler
        .devices()
        .iter()
        .map(|d| (d.index, Vec::new()))
        .collect();
    while by_device.values().any(|s| s.len() < per_device) {
        assert!(
            Instant::now() < deadline,
            "expected {per_device} samples per device within {PATIENCE:?}, got {:?}",
            by_device
                .iter()
                .map(|(d, s)| (*d, s.len()))
                .collect::<Vec<_>>()
        );
        for sample in sampler.drain() {
            by_device
                .get_mut(&sample.device)
                .unwrap_or_else(|| panic!("sample for unlisted device {}", sample.device))
                .push(sample);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    by_device
}

fn start_scripted(dir: &Path, script: &str, interval: Duration) -> Sampler {
    let lib = scripted_copy(dir, script).expect("copy the stand-in into a temp dir");
    Sampler::start(Some(&lib), interval).expect("the stand-in initialises")
}

#[test]
fn records_exactly_the_scripted_values_for_two_devices() {
    let dir = tempfile::tempdir().unwrap();
    let before = monotonic_ns();
    let sampler = start_scripted(dir.path(), TWO_DEVICES, Duration::from_millis(10));
    assert_eq!(
        sampler.devices(),
        vec![
            DeviceInfo {
                index: 0,
                name: "Stand-in H200 SXM".into(),
                uuid: "GPU-11111111-2222-3333-4444-555555555555".into()
            },
            DeviceInfo {
                index: 1,
                name: "Stand-in L4".into(),
                uuid: "GPU-66666666-7777-8888-9999-000000000000".into()
            },
        ],
        "devices as the script names them"
    );
    let recorded = collect(&sampler, 7);
    sampler.stop();
    let after = monotonic_ns();

    for (device, expected) in expected_rows() {
        let samples = &recorded[&device];
        for (k, sample) in samples.iter().enumerate() {
            // Past the script's end its last row holds.
            let want = NvmlSample {
                ts_ns: sample.ts_ns,
                ..expected[k.min(expected.len() - 1)]
            };
            assert_eq!(
                *sample,
                want,
                "device {device} sample {k} is scripted row {}",
                k.min(3)
            );
            assert!(
                (before..=after).contains(&sample.ts_ns),
                "device {device} sample {k}: ts {} is CLOCK_MONOTONIC within the run [{before}, {after}]",
                sample.ts_ns
            );
        }
        assert!(
            samples.windows(2).all(|w| w[0].ts_ns < w[1].ts_ns),
            "device {device}: timestamps increase"
        );
    }
}

#[test]
fn samples_no_faster_than_the_interval() {
    let dir = tempfile::tempdir().unwrap();
    let interval = Duration::from_millis(25);
    let started = Instant::now();
    let sampler = start_scripted(dir.path(), TWO_DEVICES, interval);
    let mut recorded = collect(&sampler, 6);
    sampler.stop();
    let elapsed = started.elapsed();
    let ticks_possible = (elapsed.as_nanos() / interval.as_nanos()) as usize + 1;
    for (device, samples) in &mut recorded {
        assert!(
            samples.len() <= ticks_possible,
            "device {device}: {} samples in {elapsed:?} is more than one per {interval:?}",
            samples.len()
        );
    }
}

#[test]
fn full_queue_drops_and_counts_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let lib = scripted_copy(dir.path(), TWO_DEVICES).unwrap();
    let sampler = Sampler::start_with_capacity(Some(&lib), Duration::from_millis(1), 3)
        .expect("the stand-in initialises");
    let deadline = Instant::now() + PATIENCE;
    while sampler.dropped() == 0 {
        assert!(Instant::now() < deadline, "a queue of 3 never overflowed");
        std::thread::sleep(Duration::from_millis(5));
    }
    let held = sampler.drain();
    assert!(
        held.len() <= 3,
        "the queue held {} samples, capacity 3",
        held.len()
    );
    assert_eq!(held[0].device, 0, "the oldest samples are kept");
    sampler.stop();
}

#[test]
fn refused_init_is_one_driver_not_loaded_line() {
    let dir = tempfile::tempdir().unwrap();
    let lib = scripted_copy(dir.path(), "devices 1\nfail_init 9\n").unwrap();
    let err = Sampler::start(Some(&lib), Duration::from_millis(10))
        .err()
        .expect("nvmlInit_v2 returning DRIVER_NOT_LOADED fails the start");
    assert!(
        matches!(err, NvmlError::InitFailed(_)),
        "init failure, got {err:?}"
    );
    assert_eq!(
        err.to_string(),
        "driver not loaded / NVML init failed: NVIDIA driver is not loaded"
    );
}

#[test]
fn missing_library_is_one_not_available_line() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("libnvidia-ml.so.1");
    let err = Sampler::start(Some(&missing), Duration::from_millis(10))
        .err()
        .expect("no library, no sampler");
    let line = err.to_string();
    assert!(
        matches!(err, NvmlError::NotAvailable(_)),
        "not available, got {err:?}"
    );
    assert!(
        line.starts_with(
            "NVML not available: libnvidia-ml.so.1 could not be loaded (no NVIDIA driver?): "
        ) && line.contains(&*missing.to_string_lossy())
            && !line.contains('\n'),
        "one line naming the path, got {line:?}"
    );
}

#[test]
fn a_library_that_is_not_nvml_is_not_available() {
    // libm is always there and exports no nvmlInit_v2.
    let err = Sampler::start(Some(Path::new("libm.so.6")), Duration::from_millis(10))
        .err()
        .expect("libm is not NVML");
    assert!(
        err.to_string().starts_with("NVML not available: ")
            && err.to_string().contains("nvmlInit_v2"),
        "names the missing entry point, got {err}"
    );
}

#[test]
fn system_library_starts_or_says_why_in_one_line() {
    // Without an NVIDIA driver (the build machines) this is the user's "no driver" line.
    match Sampler::start(None, Duration::from_millis(100)) {
        Ok(sampler) => sampler.stop(),
        Err(err @ (NvmlError::NotAvailable(_) | NvmlError::InitFailed(_))) => {
            assert!(!err.to_string().contains('\n'), "one line, got {err}")
        }
        Err(other) => panic!("the system NVML either starts or is missing/refused, got {other}"),
    }
}
