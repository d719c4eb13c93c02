//! GPU tracks: steps rebuilt from libcuda calls, CUPTI spans, NVML counters.

use std::collections::{BTreeMap, HashMap};

use super::{Arg, Builder, Cat, Item, TrackKind};
use crate::gpu::GpuStep;
use crate::gpu::StepKind;
use crate::ingest::model::{GpuActivityKind, NvmlSample};
use crate::pipeline::CuptiSpan;

impl Builder {
    /// `steps`: those that begin in this window.
    pub(super) fn gpu_steps(&mut self, steps: &[GpuStep]) {
        let mut by_thread: BTreeMap<(u32, u32), Vec<&GpuStep>> = BTreeMap::new();
        for s in steps {
            by_thread.entry((s.pid, s.tid)).or_default().push(s);
        }
        for ((pid, tid), steps) in by_thread {
            let parent = self.process(pid, &steps[0].comm);
            let track = self.track(
                parent,
                format!("GPU steps (thread {tid})"),
                TrackKind::Plain,
            );
            let mut items = Vec::with_capacity(steps.len());
            for s in steps {
                let kind = step_name(s.kind);
                let args = self.args(vec![
                    ("kernel_launches", Arg::Int(i64::from(s.kernel_launches))),
                    ("graph_launches", Arg::Int(i64::from(s.graph_launches))),
                ]);
                items.push(self.slice(s.start_ns, s.end_ns, kind, Cat::Gpu, args));
                self.plan.gpu_steps += 1;
            }
            self.nest(track, items);
        }
        self.device_steps(steps);
    }

    /// GPU-timed steps on the device: a track per (process, device, stream) beside that
    /// stream's kernels, each step from its first record's start to its last one's end.
    fn device_steps(&mut self, steps: &[GpuStep]) {
        let mut by_stream: BTreeMap<(u32, u32, u32), Vec<&GpuStep>> = BTreeMap::new();
        for s in steps {
            if let Some(d) = s.device {
                by_stream
                    .entry((s.pid, d.device, d.stream))
                    .or_default()
                    .push(s);
            }
        }
        for ((pid, device, stream), steps) in by_stream {
            let parent = self.process(pid, &steps[0].comm);
            let track = self.track(
                parent,
                format!("GPU {device} stream {stream} steps (device time)"),
                TrackKind::Plain,
            );
            let mut items = Vec::with_capacity(steps.len());
            for s in steps {
                let Some(d) = s.device else { continue };
                let args = self.args(vec![
                    ("busy_ns", Arg::Int(d.busy_ns as i64)),
                    ("records", Arg::Int(i64::from(d.records))),
                    ("host_start_ns", Arg::Int(s.start_ns as i64)),
                ]);
                items.push(self.slice(
                    d.start_ns,
                    d.end_ns,
                    step_name(s.kind),
                    Cat::DeviceStep,
                    args,
                ));
            }
            self.nest(track, items);
        }
    }

    /// CUPTI spans (those that begin in this window): a track per (process, device,
    /// stream), NVTX ranges on their own.
    pub(super) fn cupti(&mut self, spans: &[CuptiSpan]) {
        let mut by_stream: BTreeMap<(u32, u32, u32, bool), Vec<Item>> = BTreeMap::new();
        let mut comms: HashMap<u32, &str> = HashMap::new();
        for a in spans {
            comms.entry(a.pid).or_insert(&a.comm);
            let kind = a.kind;
            let (label, cat) = match kind {
                GpuActivityKind::Kernel => ("kernel", Cat::Kernel),
                GpuActivityKind::Memcpy => ("memcpy", Cat::Kernel),
                GpuActivityKind::Graph => ("graph", Cat::Kernel),
                GpuActivityKind::Marker => ("nvtx", Cat::Nvtx),
                GpuActivityKind::Unknown => ("gpu activity", Cat::Kernel),
            };
            let name = if a.name.is_empty() { label } else { &a.name };
            let marker = kind == GpuActivityKind::Marker;
            let item = self.slice(a.start_ns, a.end_ns, name, cat, 0);
            by_stream
                .entry((a.pid, a.device, if marker { 0 } else { a.stream }, marker))
                .or_default()
                .push(item);
        }
        for ((pid, device, stream, marker), items) in by_stream {
            let parent = self.process(pid, comms.get(&pid).copied().unwrap_or(""));
            let name = if marker {
                format!("NVTX (GPU {device})")
            } else {
                format!("GPU {device} stream {stream}")
            };
            let track = self.track(parent, name, TrackKind::Plain);
            self.nest(track, items);
        }
    }

    /// NVML samples (those of this window, in time order): a counter track per
    /// device and field, grouped per device.
    pub(super) fn nvml(&mut self, samples: &[(u64, NvmlSample)]) {
        type Field = (
            &'static str,
            Option<&'static str>,
            fn(&NvmlSample) -> Option<f64>,
        );
        const FIELDS: [Field; 10] = [
            ("GPU utilization", Some("%"), |s| {
                s.gpu_util_pct.map(f64::from)
            }),
            ("memory utilization", Some("%"), |s| {
                s.mem_util_pct.map(f64::from)
            }),
            ("SM clock", Some("MHz"), |s| s.sm_clock_mhz.map(f64::from)),
            ("memory clock", Some("MHz"), |s| {
                s.mem_clock_mhz.map(f64::from)
            }),
            ("memory used", Some("bytes"), |s| {
                s.mem_used_bytes.map(|v| v as f64)
            }),
            ("power", Some("mW"), |s| s.power_mw.map(f64::from)),
            ("temperature", Some("C"), |s| s.temperature_c.map(f64::from)),
            ("throttle reasons", None, |s| {
                s.throttle_reasons.map(|v| v as f64)
            }),
            ("PCIe tx", Some("KB/s"), |s| s.pcie_tx_kbps.map(f64::from)),
            ("PCIe rx", Some("KB/s"), |s| s.pcie_rx_kbps.map(f64::from)),
        ];
        let mut tracks: HashMap<(u32, usize), u64> = HashMap::new();
        let mut groups: BTreeMap<u32, u64> = BTreeMap::new();
        for &(ts, ref s) in samples {
            for (f, (name, unit, get)) in FIELDS.iter().enumerate() {
                let Some(v) = get(s) else { continue };
                let track = match tracks.get(&(s.device, f)) {
                    Some(&t) => t,
                    None => {
                        let group = match groups.get(&s.device) {
                            Some(&g) => g,
                            None => {
                                let g = self.track(
                                    None,
                                    format!("GPU {} (NVML)", s.device),
                                    TrackKind::Plain,
                                );
                                groups.insert(s.device, g);
                                g
                            }
                        };
                        let t = self.track(
                            Some(group),
                            format!("GPU {} {name}", s.device),
                            TrackKind::Counter { unit: *unit },
                        );
                        tracks.insert((s.device, f), t);
                        t
                    }
                };
                self.counter(track, ts, v);
            }
        }
    }
}

fn step_name(kind: StepKind) -> &'static str {
    match kind {
        StepKind::Prefill => "prefill",
        StepKind::Decode => "decode",
        StepKind::Mixed => "mixed",
    }
}
