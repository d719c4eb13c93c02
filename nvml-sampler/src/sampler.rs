//! The sampling thread and the queue it fills.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nvml_wrapper::enum_wrappers::device::{Clock, PcieUtilCounter, TemperatureSensor};
use nvml_wrapper::{Device, Nvml};

use tokenscope_clock::monotonic_ns;

use crate::{DeviceInfo, NvmlError, NvmlSample};

/// How often every device is read unless the caller says otherwise.
pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(100);
/// Samples held until `drain`: 8 devices at 100 ms fill it in about 3.5 minutes.
pub const QUEUE_CAPACITY: usize = 16_384;
/// A zero interval would spin a core; sampling faster than this says nothing more.
const MIN_INTERVAL: Duration = Duration::from_millis(1);
const THREAD_NAME: &str = "nvml-sampler";

/// Samples every NVML device on its own thread until stopped or dropped.
pub struct Sampler {
    samples: Mutex<Receiver<NvmlSample>>,
    devices: Vec<DeviceInfo>,
    dropped: Arc<AtomicU64>,
    /// Dropping it wakes and ends the thread at once (no sleep to wait out).
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Sampler {
    /// Initialises NVML from `lib` (default: the system's libnvidia-ml.so.1), lists
    /// the devices and starts sampling all of them every `interval`.
    pub fn start(lib: Option<&Path>, interval: Duration) -> Result<Sampler, NvmlError> {
        Self::start_with_capacity(lib, interval, QUEUE_CAPACITY)
    }

    /// As `start`, holding at most `capacity` undrained samples (more are dropped and counted).
    pub fn start_with_capacity(
        lib: Option<&Path>,
        interval: Duration,
        capacity: usize,
    ) -> Result<Sampler, NvmlError> {
        let mut builder = Nvml::builder();
        if let Some(lib) = lib {
            builder.lib_path(lib.as_os_str());
        }
        let nvml = builder.init().map_err(NvmlError::from_init)?;
        let count = nvml
            .device_count()
            .map_err(NvmlError::query("device count"))?;
        // A device NVML will not hand out is left out; the others are still sampled.
        let devices: Vec<DeviceInfo> = (0..count)
            .filter_map(|index| {
                nvml.device_by_index(index)
                    .ok()
                    .map(|d| describe(index, &d))
            })
            .collect();

        let (sample_tx, sample_rx) = mpsc::sync_channel(capacity.max(1));
        let (stop_tx, stop_rx) = mpsc::channel();
        let dropped = Arc::new(AtomicU64::new(0));
        let run = SamplingRun {
            nvml,
            indices: devices.iter().map(|d| d.index).collect(),
            interval: interval.max(MIN_INTERVAL),
            samples: sample_tx,
            dropped: Arc::clone(&dropped),
            stop: stop_rx,
        };
        let thread = std::thread::Builder::new()
            .name(THREAD_NAME.into())
            .spawn(move || run.run())?;
        Ok(Sampler {
            samples: Mutex::new(sample_rx),
            devices,
            dropped,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    /// Every sample taken since the last drain, oldest first.
    pub fn drain(&self) -> Vec<NvmlSample> {
        let samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        samples.try_iter().collect()
    }

    /// The devices being sampled, as found at start.
    pub fn devices(&self) -> Vec<DeviceInfo> {
        self.devices.clone()
    }

    /// Samples lost because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Ends sampling and waits for the thread; undrained samples are discarded.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.take();
        if let Some(thread) = self.thread.take() {
            // A panic on the sampling thread has already been reported by the panic hook.
            let _ = thread.join();
        }
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn describe(index: u32, device: &Device<'_>) -> DeviceInfo {
    DeviceInfo {
        index,
        name: device.name().unwrap_or_default(),
        uuid: device.uuid().unwrap_or_default(),
    }
}

/// What the sampling thread owns.
struct SamplingRun {
    nvml: Nvml,
    indices: Vec<u32>,
    interval: Duration,
    samples: SyncSender<NvmlSample>,
    dropped: Arc<AtomicU64>,
    stop: Receiver<()>,
}

impl SamplingRun {
    fn run(self) {
        let devices: Vec<(u32, Device<'_>)> = self
            .indices
            .iter()
            .filter_map(|&i| self.nvml.device_by_index(i).ok().map(|d| (i, d)))
            .collect();
        let mut tick = Instant::now();
        loop {
            for (index, device) in &devices {
                if self.samples.try_send(read(*index, device)).is_err() {
                    self.dropped.fetch_add(1, Ordering::Relaxed);
                }
            }
            // Ticks stay on the start's grid; ticks missed while late are skipped, not burst.
            let now = Instant::now();
            tick += self.interval;
            while tick <= now {
                tick += self.interval;
            }
            match self.stop.recv_timeout(tick - now) {
                Err(RecvTimeoutError::Timeout) => continue,
                Ok(()) | Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        // `devices` borrow `nvml`; NVML shuts down (nvmlShutdown) when it drops after them.
        drop(devices);
    }
}

/// One reading of every counter; a query NVML refuses leaves its field `None`.
fn read(index: u32, device: &Device<'_>) -> NvmlSample {
    let ts_ns = monotonic_ns();
    let utilization = device.utilization_rates().ok();
    NvmlSample {
        ts_ns,
        device: index,
        gpu_util_pct: utilization.as_ref().map(|u| u.gpu),
        mem_util_pct: utilization.as_ref().map(|u| u.memory),
        sm_clock_mhz: device.clock_info(Clock::SM).ok(),
        mem_clock_mhz: device.clock_info(Clock::Memory).ok(),
        mem_used_bytes: device.memory_info().ok().map(|m| m.used),
        power_mw: device.power_usage().ok(),
        temperature_c: device.temperature(TemperatureSensor::Gpu).ok(),
        throttle_reasons: device.current_throttle_reasons().ok().map(|r| r.bits()),
        pcie_tx_kbps: device.pcie_throughput(PcieUtilCounter::Send).ok(),
        pcie_rx_kbps: device.pcie_throughput(PcieUtilCounter::Receive).ok(),
    }
}

// The recorder drives the sampler from async tasks and shares it across threads.
const _: fn() = || {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Sampler>();
};
