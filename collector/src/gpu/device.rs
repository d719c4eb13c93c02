//! Steps timed on the device: the CUPTI records (kernels, graph launches, copies) an
//! engine's hook sent, joined to the steps its libcuda calls make. CUPTI's correlation
//! ids name the API call of each record, but the uprobes see no ids, so a record joins
//! the step of its process during which it started: a step begins with its first launch
//! (no work of it can start earlier) and ends when the synchronisation that waits for its
//! work returns (none of it can start later).

use std::collections::{HashMap, VecDeque};

use serde::Serialize;

use super::GpuStep;

/// A step's work as the device ran it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DeviceTime {
    /// The first record's start and the last one's end.
    pub start_ns: u64,
    pub end_ns: u64,
    /// Time some record of the step ran (their union): below `end - start` when the
    /// device waited for the host between launches.
    pub busy_ns: u64,
    pub records: u32,
    /// Where its first record ran.
    pub device: u32,
    pub stream: u32,
}

/// Records kept per process while no step has claimed them: a hook without uprobes (or a
/// process whose steps the probes miss) must not grow the pipeline without bound.
const KEPT_PER_PID: usize = 65_536;
/// Closed steps a late record is looked for in (the latest first).
const LATE_STEPS: usize = 64;

/// A record's device span and where it ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Span {
    start: u64,
    end: u64,
    device: u32,
    stream: u32,
}

/// Device spans waiting for their step, per process, in arrival (time) order.
#[derive(Debug, Default)]
pub struct StepTimer {
    pending: HashMap<u32, VecDeque<Span>>,
    /// Records no step claimed: started before the step they would belong to was seen, or
    /// pushed out by `KEPT_PER_PID`.
    pub unjoined: u64,
}

impl StepTimer {
    /// A kernel, graph or copy record of `pid` (device time, CLOCK_MONOTONIC). One that
    /// arrives after its step was closed (CUPTI hands buffers over late; a replay's
    /// reorder window may not cover it) joins that step among the latest `closed` ones.
    pub fn record(
        &mut self,
        pid: u32,
        (device, stream): (u32, u32),
        (start_ns, end_ns): (u64, u64),
        closed: &mut [GpuStep],
    ) {
        let end_ns = end_ns.max(start_ns);
        // `closed` is in closing order: a record that started after the last step closed
        // (the usual case, records in time order) is no late one, and skips the scan.
        let late = closed.last().is_some_and(|s| start_ns <= s.end_ns);
        if let Some(step) = closed
            .iter_mut()
            .rev()
            .take(if late { LATE_STEPS } else { 0 })
            .find(|s| s.pid == pid && s.start_ns <= start_ns && start_ns <= s.end_ns)
        {
            let d = step.device.get_or_insert(DeviceTime {
                start_ns,
                end_ns: start_ns,
                device,
                stream,
                ..Default::default()
            });
            d.busy_ns += end_ns.saturating_sub(start_ns.max(d.end_ns));
            d.start_ns = d.start_ns.min(start_ns);
            d.end_ns = d.end_ns.max(end_ns);
            d.records += 1;
            return;
        }
        let q = self.pending.entry(pid).or_default();
        if q.len() == KEPT_PER_PID {
            q.pop_front();
            self.unjoined += 1;
        }
        q.push_back(Span {
            start: start_ns,
            end: end_ns,
            device,
            stream,
        });
    }

    /// Gives `step` the device time of its process's records that started within it;
    /// records that started before it are let go (they had no step).
    pub fn time(&mut self, step: &mut GpuStep) {
        let Some(q) = self.pending.get_mut(&step.pid) else {
            return;
        };
        let mut spans = Vec::new();
        let mut kept = VecDeque::with_capacity(q.len());
        for span in q.drain(..) {
            if span.start < step.start_ns {
                self.unjoined += 1;
            } else if span.start <= step.end_ns {
                spans.push(span);
            } else {
                kept.push_back(span);
            }
        }
        *q = kept;
        step.device = device_time(&mut spans);
    }
}

/// First start, last end and the union's length of `spans`.
fn device_time(spans: &mut [Span]) -> Option<DeviceTime> {
    spans.sort_unstable();
    let first = *spans.first()?;
    let start_ns = first.start;
    let (mut busy, mut end_ns) = (0, start_ns);
    let mut open: Option<(u64, u64)> = None;
    for &Span {
        start: s, end: e, ..
    } in spans.iter()
    {
        end_ns = end_ns.max(e);
        open = match open {
            Some((a, b)) if s <= b => Some((a, b.max(e))),
            Some((a, b)) => {
                busy += b - a;
                Some((s, e))
            }
            None => Some((s, e)),
        };
    }
    if let Some((a, b)) = open {
        busy += b - a;
    }
    Some(DeviceTime {
        start_ns,
        end_ns,
        busy_ns: busy,
        records: spans.len() as u32,
        device: first.device,
        stream: first.stream,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::StepKind;

    fn step(pid: u32, start_ns: u64, end_ns: u64) -> GpuStep {
        GpuStep {
            pid,
            tid: pid,
            comm: "engine".into(),
            start_ns,
            end_ns,
            kind: StepKind::Prefill,
            kernel_launches: 1,
            graph_launches: 0,
            copied_bytes: 4,
            device: None,
        }
    }

    #[test]
    fn a_step_takes_the_records_that_started_within_it_and_counts_the_gaps() {
        let mut t = StepTimer::default();
        let at = (0, 7);
        t.record(7, at, (50, 90), &mut []); // before the step: no step had it
        t.record(7, at, (110, 150), &mut []);
        t.record(7, at, (140, 160), &mut []); // overlaps the first
        t.record(7, at, (180, 200), &mut []); // 20 ns idle before it
        t.record(8, at, (120, 130), &mut []); // another process
        t.record(7, (0, 8), (260, 270), &mut []); // the next step's, on another stream
        let mut s = step(7, 100, 210);
        t.time(&mut s);
        assert_eq!(
            s.device,
            Some(DeviceTime {
                start_ns: 110,
                end_ns: 200,
                busy_ns: 50 + 20,
                records: 3,
                device: 0,
                stream: 7,
            })
        );
        assert_eq!(t.unjoined, 1);
        let mut next = step(7, 250, 300);
        t.time(&mut next);
        assert_eq!(
            next.device.map(|d| (d.start_ns, d.end_ns)),
            Some((260, 270))
        );
        let mut none = step(9, 0, 1_000);
        t.time(&mut none);
        assert_eq!(none.device, None, "no records: CPU-timed");
        // Records that come after their step closed join it there.
        let mut closed = [s.clone(), next];
        t.record(7, at, (205, 208), &mut closed);
        t.record(7, at, (280, 290), &mut closed);
        assert_eq!(
            closed[0].device.map(|d| (d.end_ns, d.busy_ns, d.records)),
            Some((208, 73, 4))
        );
        assert_eq!(
            closed[1].device.map(|d| (d.end_ns, d.busy_ns, d.records)),
            Some((290, 20, 2))
        );
    }
}
