//! A live recording: probes -> decode -> observer and record file(s), until a
//! signal, a duration, or an error. Used by `tokenscope record`, `top` and `agent`.

pub mod live;
pub mod sink;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::clock::{monotonic_ns, realtime_ns};
use crate::ingest::record::{Counters, FileHeader, RecordError};
use crate::ingest::Event;
use crate::probes::{ProbeConfig, ProbeError, Probes};
use crate::protocol::Decoder;
use sink::{Output, Sink};

/// How often pending events are drained for a live observer when the kernel has not
/// woken us: `top` and `agent` want them inside their pipeline's reorder window
/// (`pipeline::Config::live`, 200 ms: events merged from other threads, NVML samples,
/// come in up to a drain's length before the ring's events of their time). Each drain
/// starts cold (see `DRAIN_TO_FILE`): every 20 ms was ~375 us x 50 a second, ~1.9% of a
/// core of top's ~9% then.
pub const DRAIN_LIVE: Duration = Duration::from_millis(100);
/// The same when events only go to a file. Each drain starts with the recorder's
/// working set (parsers, compressor, socket tables) gone cold, the served processes
/// having run meanwhile, and that costs more than the events: on issue 17's load,
/// drains every 100 ms (and the probes' wake-up at 1 MiB pending) took 31% less CPU
/// than every 20 ms (256 KiB), 8 shared rounds; every 250 ms 12% less than 100 ms and
/// every 500 ms (the wake-up at 2 MiB) 10% less than 250 ms (two recorders on the
/// same 64-stream loads, both orders, 4 rounds each). The probes wake us sooner when
/// the ring fills faster (`probes::WAKEUP_BYTES`).
pub const DRAIN_TO_FILE: Duration = Duration::from_millis(500);
/// How often the file is flushed (at the end of a drain), bounding with the drain
/// interval what a crash loses.
const FLUSH_INTERVAL: Duration = Duration::from_millis(200);

#[derive(Clone, Debug)]
pub struct RecordOptions {
    pub probes: ProbeConfig,
    /// NVML sampling (None: off).
    pub nvml: Option<NvmlOptions>,
    /// Listen here for the CUPTI hook (engines started with CUDA_INJECTION64_PATH).
    pub cupti_socket: Option<PathBuf>,
    /// Stop after this long; `None` runs until SIGINT/SIGTERM.
    pub duration: Option<Duration>,
    pub output: Output,
}

impl RecordOptions {
    /// The TCP ports' traffic to `output`, until stopped; no GPU sources, the probes'
    /// defaults otherwise.
    pub fn ports(ports: Vec<u16>, output: Output) -> RecordOptions {
        RecordOptions {
            probes: ProbeConfig {
                ports,
                ..ProbeConfig::default()
            },
            nvml: None,
            cupti_socket: None,
            duration: None,
            output,
        }
    }
}

#[derive(Clone, Debug)]
pub struct NvmlOptions {
    /// The NVML library (default: the system's libnvidia-ml.so.1).
    pub lib: Option<PathBuf>,
    pub interval: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum RecordSessionError {
    #[error(transparent)]
    Probe(#[from] ProbeError),
    #[error(transparent)]
    Record(#[from] RecordError),
    #[error("CUPTI socket {0}: {1}")]
    Cupti(PathBuf, std::io::Error),
    #[error("installing signal handlers: {0}")]
    Signal(std::io::Error),
}

impl RecordSessionError {
    /// The kernel cannot host tokenscope (no BTF, no I/O source): exit status 2.
    pub fn is_unsupported_kernel(&self) -> bool {
        matches!(self, RecordSessionError::Probe(p) if p.is_unsupported_kernel())
    }
}

/// What a session reports while it runs.
pub trait RecordObserver {
    /// Probes are attached: traffic from now on is recorded.
    fn started(&mut self, probes: &Probes);
    /// Called per event (probes, NVML, CUPTI, ring readings), before it is written.
    fn event(&mut self, _event: &Event) {}
    /// Where events go instead of `event` when nothing is written (`Output::Discard`):
    /// an observer that keeps events has them decoded straight into this batch (an
    /// event is a few hundred bytes: each hop through a call was a copy), and gets
    /// them at `took`. None: `event` sees each.
    fn batch(&mut self) -> Option<&mut Vec<Event>> {
        None
    }
    /// Events were put in `batch` since the last call: hand them over.
    fn took(&mut self) {}
    /// A line about an optional source (e.g. NVML on or off, and why).
    fn note(&mut self, _line: &str) {}
    /// The kernel's counters so far (read about every 200 ms): submitted, dropped.
    fn counters(&mut self, _submitted: u64, _dropped: u64) {}
    /// How long events may wait in the ring buffer before they are drained (unless
    /// the probes wake us first): `DRAIN_LIVE` for an observer that shows them as
    /// they happen.
    fn drain_every(&self) -> Duration {
        DRAIN_TO_FILE
    }
}

impl RecordObserver for () {
    fn started(&mut self, _probes: &Probes) {}
}

/// Records until stopped and returns the sealed file header.
pub fn run(
    opts: &RecordOptions,
    observer: &mut dyn RecordObserver,
) -> Result<FileHeader, RecordSessionError> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop)).map_err(RecordSessionError::Signal)?;
    }
    // Create the file first: a bad path fails before anything touches the kernel.
    let mut writer = Sink::create(&opts.output, base_header(&opts.probes))?;
    let mut probes = Probes::load(&opts.probes)?;
    // What attaching freed too (the load gave back the BTF's room already): an
    // always-on recorder would otherwise carry it as RSS for its lifetime.
    crate::probes::give_back_freed_memory();
    writer.update_header(|h| {
        // The header has a fixed 4 KiB region: many libssl files make long lists.
        h.probes = within(&probes.attached, 2000);
        h.probes_skipped = within(&probes.skipped, 1200);
        h.io_source = probes.io_source.name().into();
        h.start_monotonic_ns = monotonic_ns();
        // Limited to one namespace (--netns): that one is the recording's host.
        if let Some(inode) = probes.netns {
            h.net_namespace = u64::from(inode);
        }
    })?;
    observer.started(&probes);
    let sampler = start_nvml(opts.nvml.as_ref(), &mut writer, observer)?;
    let cupti = start_cupti(opts.cupti_socket.as_deref(), observer)?;

    let started = Instant::now();
    let mut counters = Counters::default();
    // Drops in the last ring reading written.
    let mut ring_dropped = 0;
    let mut decoder = Decoder::new();
    let drain_every = observer.drain_every();
    let mut last_flush = Instant::now();
    let mut failure = None;
    while !stop.load(Ordering::Relaxed) && opts.duration.is_none_or(|d| started.elapsed() < d) {
        probes.wait(drain_every);
        if let Err(e) = drain_into(
            &mut probes,
            &mut decoder,
            &mut writer,
            &mut counters,
            observer,
        ) {
            failure = Some(e);
            break;
        }
        if let Err(e) = drain_cupti(cupti.as_ref(), &mut writer, &mut counters, observer) {
            failure = Some(e);
            break;
        }
        if let Err(e) = drain_nvml(sampler.as_ref(), &mut writer, &mut counters, observer) {
            failure = Some(e);
            break;
        }
        if last_flush.elapsed() >= FLUSH_INTERVAL {
            if let Ok((submitted, dropped)) = probes.counters() {
                observer.counters(submitted, dropped);
                let reading = (submitted, dropped);
                if let Err(e) = write_ring_reading(
                    &mut writer,
                    &mut counters,
                    &mut ring_dropped,
                    reading,
                    observer,
                ) {
                    failure = Some(e);
                    break;
                }
            }
            if let Err(e) = writer.flush(&counters, monotonic_ns()) {
                failure = Some(e);
                break;
            }
            last_flush = Instant::now();
        }
    }
    // Detach first so the final drain sees everything ever submitted.
    probes.detach();
    if let Some(e) = failure {
        return Err(e.into());
    }
    // A program that was mid-run when detached may still submit; drain until
    // every submitted record is accounted for (or give up after ~100 ms).
    for _ in 0..100 {
        drain_into(
            &mut probes,
            &mut decoder,
            &mut writer,
            &mut counters,
            observer,
        )?;
        let (submitted, dropped) = probes.counters()?;
        counters.submitted = submitted;
        counters.dropped = dropped;
        if counters.delivered + dropped >= submitted {
            break;
        }
        probes.wait(Duration::from_millis(1));
    }
    // The last reading: drops after the last one written, while the probes detached.
    let reading = (counters.submitted, counters.dropped);
    write_ring_reading(
        &mut writer,
        &mut counters,
        &mut ring_dropped,
        reading,
        observer,
    )?;
    let tls_untied = probes.tls_untied()?;
    writer.update_header(|h| h.tls_untied = tls_untied)?;
    drop(probes);
    if let Some(listener) = &cupti {
        // Hooks that already hung up may still have bytes in flight to the listener.
        listener.wait_until(Duration::from_millis(500), |s| s.closed >= s.connections);
        drain_cupti(Some(listener), &mut writer, &mut counters, observer)?;
        let stats = listener.stats();
        writer.update_header(|h| {
            h.cupti_received = stats.records_received;
            h.cupti_dropped = stats.records_dropped;
        })?;
        if stats.refused + stats.oversized > 0 {
            observer.note(&format!(
                "CUPTI: {} hook connections refused (not this user or root), {} ended at the {} MiB message limit",
                stats.refused,
                stats.oversized,
                tokenscope_cupti_hook::MAX_MESSAGE_BYTES >> 20
            ));
        }
    }
    if let Some(sampler) = sampler {
        drain_nvml(Some(&sampler), &mut writer, &mut counters, observer)?;
        let dropped = sampler.dropped();
        sampler.stop();
        writer.update_header(|h| h.nvml_dropped = dropped)?;
    }
    observer.took();
    Ok(writer.finish(counters, monotonic_ns())?)
}

/// Starts NVML sampling when asked; without a driver that is a note, not a failure.
fn start_nvml(
    opts: Option<&NvmlOptions>,
    writer: &mut Sink,
    observer: &mut dyn RecordObserver,
) -> Result<Option<nvml_sampler::Sampler>, RecordError> {
    let Some(opts) = opts else { return Ok(None) };
    match nvml_sampler::Sampler::start(opts.lib.as_deref(), opts.interval) {
        Ok(sampler) => {
            let devices: Vec<String> = sampler
                .devices()
                .iter()
                .map(|d| format!("{}: {} ({})", d.index, d.name, d.uuid))
                .collect();
            observer.note(&format!(
                "NVML: sampling {} GPU(s) every {:?}",
                devices.len(),
                opts.interval
            ));
            writer.update_header(|h| h.gpu_devices = devices)?;
            Ok(Some(sampler))
        }
        Err(e) => {
            let line = e.to_string();
            observer.note(&format!("NVML off: {line}"));
            writer.update_header(|h| h.nvml_note = line)?;
            Ok(None)
        }
    }
}

/// Binds the socket the CUPTI hook streams to, and says how to start an engine with it.
fn start_cupti(
    socket: Option<&std::path::Path>,
    observer: &mut dyn RecordObserver,
) -> Result<Option<tokenscope_cupti_hook::HookListener>, RecordSessionError> {
    let Some(socket) = socket else {
        return Ok(None);
    };
    let listener = tokenscope_cupti_hook::HookListener::bind(socket)
        .map_err(|e| RecordSessionError::Cupti(socket.to_path_buf(), e))?;
    let hook = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join("libtokenscope_cupti_hook.so")))
        .map_or_else(
            || "libtokenscope_cupti_hook.so".into(),
            |p| p.display().to_string(),
        );
    observer.note(&format!(
        "CUPTI: listening on {}; start the engine with CUDA_INJECTION64_PATH={hook} TOKENSCOPE_CUPTI_SOCKET={}",
        socket.display(),
        socket.display()
    ));
    Ok(Some(listener))
}

fn drain_cupti(
    listener: Option<&tokenscope_cupti_hook::HookListener>,
    writer: &mut Sink,
    counters: &mut Counters,
    observer: &mut dyn RecordObserver,
) -> Result<(), RecordError> {
    use crate::ingest::model::{event::Body, GpuActivity, GpuActivityKind};
    use tokenscope_cupti_hook::GpuActivity as Hook;
    let Some(listener) = listener else {
        return Ok(());
    };
    for a in listener.drain() {
        let (pid, g) = match a {
            Hook::Kernel { pid, kernel: k } => (
                pid,
                GpuActivity {
                    kind: GpuActivityKind::Kernel as i32,
                    start_ns: k.start_ns,
                    end_ns: k.end_ns,
                    device: k.device_id,
                    stream: k.stream_id,
                    correlation_id: k.correlation_id,
                    name: k.name,
                    bytes: 0,
                    graph_id: k.graph_id,
                },
            ),
            Hook::Memcpy { pid, memcpy: m } => (
                pid,
                GpuActivity {
                    kind: GpuActivityKind::Memcpy as i32,
                    start_ns: m.start_ns,
                    end_ns: m.end_ns,
                    device: m.device_id,
                    stream: m.stream_id,
                    correlation_id: m.correlation_id,
                    name: String::new(),
                    bytes: m.bytes,
                    graph_id: m.graph_id,
                },
            ),
            Hook::Graph { pid, graph: g } => (
                pid,
                GpuActivity {
                    kind: GpuActivityKind::Graph as i32,
                    start_ns: g.start_ns,
                    end_ns: g.end_ns,
                    device: g.device_id,
                    stream: g.stream_id,
                    correlation_id: g.correlation_id,
                    name: String::new(),
                    bytes: 0,
                    graph_id: g.graph_id,
                },
            ),
            Hook::Marker { pid, marker: m } => (
                pid,
                GpuActivity {
                    kind: GpuActivityKind::Marker as i32,
                    start_ns: m.start_ns,
                    end_ns: m.end_ns,
                    name: m.name,
                    ..Default::default()
                },
            ),
        };
        counters.gpu_samples += 1;
        emit(
            writer,
            observer,
            Event {
                ts_ns: g.start_ns,
                pid,
                tid: 0,
                cpu: 0,
                comm: Default::default(),
                body: Some(Body::Gpu(g)),
            },
        )?;
    }
    Ok(())
}

/// Writes the ring buffer's counters when its drops moved since the last reading
/// written: the recording then tells when events were lost, not only how many.
fn write_ring_reading(
    writer: &mut Sink,
    counters: &mut Counters,
    last_dropped: &mut u64,
    (submitted, dropped): (u64, u64),
    observer: &mut dyn RecordObserver,
) -> Result<(), RecordError> {
    if dropped <= *last_dropped {
        return Ok(());
    }
    *last_dropped = dropped;
    counters.ring_readings += 1;
    emit(
        writer,
        observer,
        Event {
            ts_ns: monotonic_ns(),
            pid: 0,
            tid: 0,
            cpu: 0,
            comm: Default::default(),
            body: Some(crate::ingest::model::event::Body::Ring(
                crate::ingest::model::RingCounters { submitted, dropped },
            )),
        },
    )
}

/// Hands an event to the observer, then to the sink; to the observer alone (by value)
/// when the sink writes nothing.
fn emit(
    writer: &mut Sink,
    observer: &mut dyn RecordObserver,
    event: Event,
) -> Result<(), RecordError> {
    if writer.discards() {
        writer.count_discarded(1);
        match observer.batch() {
            Some(batch) => batch.push(event),
            None => observer.event(&event),
        }
        return Ok(());
    }
    observer.event(&event);
    writer.push(event)
}

fn drain_nvml(
    sampler: Option<&nvml_sampler::Sampler>,
    writer: &mut Sink,
    counters: &mut Counters,
    observer: &mut dyn RecordObserver,
) -> Result<(), RecordError> {
    let Some(sampler) = sampler else {
        return Ok(());
    };
    for s in sampler.drain() {
        counters.gpu_samples += 1;
        emit(
            writer,
            observer,
            Event {
                ts_ns: s.ts_ns,
                pid: 0,
                tid: 0,
                cpu: 0,
                comm: Default::default(),
                body: Some(crate::ingest::model::event::Body::Nvml(
                    crate::ingest::model::NvmlSample {
                        device: s.device,
                        gpu_util_pct: s.gpu_util_pct,
                        mem_util_pct: s.mem_util_pct,
                        sm_clock_mhz: s.sm_clock_mhz,
                        mem_clock_mhz: s.mem_clock_mhz,
                        mem_used_bytes: s.mem_used_bytes,
                        power_mw: s.power_mw,
                        temperature_c: s.temperature_c,
                        throttle_reasons: s.throttle_reasons,
                        pcie_tx_kbps: s.pcie_tx_kbps,
                        pcie_rx_kbps: s.pcie_rx_kbps,
                    },
                )),
            },
        )?;
    }
    Ok(())
}

fn drain_into(
    probes: &mut Probes,
    decoder: &mut Decoder,
    writer: &mut Sink,
    counters: &mut Counters,
    observer: &mut dyn RecordObserver,
) -> Result<(), RecordError> {
    if writer.discards() {
        if let Some(batch) = observer.batch() {
            let before = batch.len();
            counters.delivered += probes.drain(|raw| {
                if decoder.decode_into(raw, batch).is_err() {
                    counters.decode_errors += 1;
                }
            });
            writer.count_discarded((batch.len() - before) as u64);
            observer.took();
            return Ok(());
        }
    }
    let mut result = Ok(());
    counters.delivered += probes.drain(|raw| match decoder.decode(raw) {
        Ok(ev) => {
            if result.is_ok() {
                result = emit(writer, observer, ev);
            } else {
                observer.event(&ev);
            }
        }
        Err(_) => counters.decode_errors += 1,
    });
    result
}

/// The first entries of `list` that fit in `budget` bytes, and a last one counting the rest.
fn within(list: &[String], budget: usize) -> Vec<String> {
    let mut used = 0;
    let mut kept = Vec::new();
    for (i, entry) in list.iter().enumerate() {
        used += entry.len() + 2;
        if used > budget {
            kept.push(format!("... and {} more", list.len() - i));
            break;
        }
        kept.push(entry.clone());
    }
    kept
}

fn base_header(cfg: &ProbeConfig) -> FileHeader {
    let (host, kernel) = uname();
    FileHeader {
        clock: "MONOTONIC".into(),
        host,
        kernel,
        tokenscope_version: env!("CARGO_PKG_VERSION").into(),
        start_monotonic_ns: monotonic_ns(),
        start_realtime_ns: realtime_ns(),
        filter_pids: cfg.pids.clone(),
        filter_ports: cfg.ports.iter().map(|p| u32::from(*p)).collect(),
        payload_cap: cfg.payload_cap,
        boot_id: std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
        net_namespace: net_namespace().unwrap_or(0),
        prints: crate::ingest::record::PRINTS.into(),
        ..Default::default()
    }
}

/// This process's network namespace inode (`net:[4026531840]`).
fn net_namespace() -> Option<u64> {
    let link = std::fs::read_link("/proc/self/ns/net").ok()?;
    let text = link.to_str()?;
    text.strip_prefix("net:[")?.strip_suffix(']')?.parse().ok()
}

fn uname() -> (String, String) {
    // SAFETY: utsname is plain data; uname fills it.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out-pointer to a utsname.
    if unsafe { libc::uname(&mut u) } != 0 {
        return (String::new(), String::new());
    }
    let field = |f: &[libc::c_char]| {
        let bytes: Vec<u8> = f
            .iter()
            .take_while(|c| **c != 0)
            .map(|c| *c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    (field(&u.nodename), field(&u.release))
}

#[cfg(test)]
mod tests {
    use super::{base_header, within};

    #[test]
    fn a_recording_says_which_boot_and_network_namespace_it_was_taken_in() {
        let h = base_header(&crate::probes::ProbeConfig::default());
        assert_eq!(h.boot_id.len(), 36, "a UUID: {:?}", h.boot_id);
        let ns = std::fs::read_link("/proc/self/ns/net").unwrap();
        assert_eq!(
            ns.to_str().unwrap(),
            format!("net:[{}]", h.net_namespace),
            "the recorder's network namespace"
        );
    }

    #[test]
    fn long_probe_lists_are_cut_and_the_rest_counted() {
        let list: Vec<String> = (0..100)
            .map(|i| format!("uprobe:SSL_write@/lib/{i:03}"))
            .collect();
        let kept = within(&list, 300);
        assert!(kept.iter().map(|e| e.len() + 2).sum::<usize>() <= 300 + 20);
        let shown = kept.len() - 1;
        assert_eq!(
            kept.last().unwrap(),
            &format!("... and {} more", 100 - shown)
        );
        assert_eq!(&kept[..shown], &list[..shown]);
        assert_eq!(
            within(&list[..2], 300),
            list[..2].to_vec(),
            "short lists stay whole"
        );
    }
}
