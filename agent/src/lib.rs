//! `tokenscope agent`: always on. Records with the same probes as `record` and `top`,
//! stitches as it goes (a request leaves memory once it finished and was observed),
//! and serves what it sees as Prometheus metrics and OTLP traces; optionally keeps
//! rotating recordings so a bad minute can be replayed with `report`, `top --replay`
//! and `export`.

pub mod metrics;
pub mod otlp;
pub mod serve;
pub mod trace;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use collector::clock::monotonic_ns;
use collector::diagnose;
use collector::gpu::GpuStep;
use collector::ingest::model::NvmlSample;
use collector::pipeline::{Config, Open, Pipeline};
use collector::record::live::Live;
use collector::record::RecordOptions;
use collector::stitch::{attribution, Request};

use metrics::Metrics;
use otlp::{Exporter, OtlpConfig, OtlpStats};

/// How often the recording's events are taken and the pipeline advanced.
const POLL: Duration = Duration::from_millis(100);

pub struct AgentOptions {
    /// Probes, NVML, CUPTI, and where the recording goes (a rotating directory or none).
    pub record: RecordOptions,
    pub metrics_listen: Option<SocketAddr>,
    pub otlp: Option<OtlpConfig>,
    /// Diagnoses run over the requests finished this recently...
    pub window: Duration,
    /// ...this often.
    pub diagnose_every: Duration,
    /// Distinct routes labelled before the rest become `other`.
    pub max_routes: usize,
}

/// What the agent did, for its last line.
#[derive(Debug, Default)]
pub struct Summary {
    pub requests: u64,
    pub events: u64,
    pub dropped: u64,
    pub otlp: OtlpStats,
}

/// Runs until `quit` is set (SIGINT/SIGTERM) or the recording stops; `started` is
/// called once the probes are attached, with the metrics address.
pub fn run(
    opts: AgentOptions,
    quit: &AtomicBool,
    started: &mut dyn FnMut(&Started),
) -> anyhow::Result<Summary> {
    let metrics = Arc::new(Metrics::new(opts.max_routes));
    // Bind and connect what can fail on a typo before touching the kernel.
    let server = opts
        .metrics_listen
        .map(|addr| serve::Server::start(addr, Arc::clone(&metrics)))
        .transpose()?;
    let exporter = opts.otlp.clone().map(Exporter::start).transpose()?;
    let mut live = Live::start(opts.record).context("starting the recording")?;
    let (attached, skipped) = live
        .wait_started(Duration::from_secs(60))
        .context("record")?;
    started(&Started {
        probes_attached: attached,
        probes_skipped: skipped,
        probe_lines: live.probe_lines(),
        metrics: server.as_ref().map(|s| s.addr),
    });
    let mut agent = Agent {
        // Requests in flight are counted from the connections (`Pipeline::serving`),
        // never built.
        pipeline: Pipeline::new(
            Config {
                open: Open::Never,
                ..Config::live()
            },
            false,
        ),
        metrics: &metrics,
        exporter: exporter.as_ref(),
        window_ns: opts.window.as_nanos() as u64,
        done: VecDeque::new(),
        steps: VecDeque::new(),
        nvml: VecDeque::new(),
        summary: Summary::default(),
        counted: Counted::default(),
        salt: trace::salt(),
        said_otlp: None,
    };
    let mut last_diagnosis = Instant::now();
    while !quit.load(Ordering::Relaxed) && !live.finished() {
        std::thread::sleep(POLL);
        for batch in live.take_batches() {
            agent.feed(batch);
        }
        agent.pipeline.tick(monotonic_ns());
        agent.collect();
        agent.count(live.dropped());
        for note in live.take_notes() {
            eprintln!("tokenscope agent: {note}");
        }
        if last_diagnosis.elapsed() >= opts.diagnose_every {
            last_diagnosis = Instant::now();
            agent.diagnose();
        }
    }
    let ended = live.stop();
    for batch in live.take_batches() {
        agent.feed(batch);
    }
    agent.pipeline.flush();
    agent.collect();
    agent.count(live.dropped());
    let mut summary = std::mem::take(&mut agent.summary);
    if let Some(exporter) = exporter {
        summary.otlp = exporter.shutdown(Duration::from_secs(5));
    }
    drop(server);
    match ended {
        Some(Err(e)) => Err(anyhow::Error::new(e).context("record")),
        _ => Ok(summary),
    }
}

/// What the agent reports once its probes are attached.
pub struct Started {
    pub probes_attached: usize,
    pub probes_skipped: usize,
    /// The I/O source, then each probe skipped and why.
    pub probe_lines: Vec<String>,
    pub metrics: Option<SocketAddr>,
}

struct Agent<'a> {
    pipeline: Pipeline,
    metrics: &'a Metrics,
    exporter: Option<&'a Exporter>,
    window_ns: u64,
    /// Finished requests of the diagnosis window, with their GPU share.
    done: VecDeque<Request>,
    /// GPU steps and NVML samples of the window (and the attribution's look-back).
    steps: VecDeque<GpuStep>,
    nvml: VecDeque<(u64, NvmlSample)>,
    summary: Summary,
    counted: Counted,
    salt: u64,
    /// When the last OTLP failure was printed.
    said_otlp: Option<Instant>,
}

/// Cumulative figures already added to the counters (they are read as totals).
#[derive(Default)]
struct Counted {
    dropped: u64,
    unparsed: u64,
    late: u64,
    otlp: OtlpStats,
}

impl Agent<'_> {
    fn feed(&mut self, events: Vec<collector::ingest::Event>) {
        self.metrics.events.inc_by(events.len() as u64);
        self.summary.events += events.len() as u64;
        self.pipeline.push_batch(events);
    }

    /// Takes what the pipeline finished: steps and samples join the window; each
    /// request gets its GPU share, is observed once (metrics, OTLP) and joins the window.
    fn collect(&mut self) {
        let out = self.pipeline.take();
        self.steps.extend(out.steps);
        self.nvml.extend(out.nvml);
        let mut requests = out.requests;
        if !requests.is_empty() {
            self.attribute(&mut requests);
        }
        for r in requests {
            let trace_id = trace::trace_id(&r, self.salt);
            self.metrics.observe(&r, Some(&trace::hex(&trace_id)));
            if let Some(x) = self.exporter {
                // The same trace the exemplar names.
                x.export_in_trace(&r, trace_id);
            }
            self.summary.requests += 1;
            self.done.push_back(r);
        }
        self.metrics.set_in_flight(self.pipeline.serving());
        bump(
            &self.metrics.unparsed_ios,
            &mut self.counted.unparsed,
            out.unparsed_ios,
        );
        bump(
            &self.metrics.late_events,
            &mut self.counted.late,
            out.late_events,
        );
        self.evict();
    }

    /// Joins the steps that ran while these requests were open.
    fn attribute(&self, requests: &mut [Request]) {
        let from = requests.iter().map(|r| r.start_ns).min().unwrap_or(0);
        let mut steps: Vec<GpuStep> = self
            .steps
            .iter()
            .filter(|s| s.end_ns >= from)
            .cloned()
            .collect();
        steps.sort_by_key(|s| s.start_ns);
        attribution::attribute(requests, &mut steps);
    }

    fn count(&mut self, dropped: Option<u64>) {
        if let Some(d) = dropped {
            self.summary.dropped = d;
            bump(&self.metrics.ring_dropped, &mut self.counted.dropped, d);
        }
        if let Some(x) = self.exporter {
            let now = x.stats();
            let was = self.counted.otlp;
            let m = self.metrics;
            m.otlp_requests
                .inc_by(now.requests_exported.saturating_sub(was.requests_exported));
            m.otlp_spans
                .inc_by(now.spans_exported.saturating_sub(was.spans_exported));
            m.otlp_dropped
                .inc_by(now.spans_dropped.saturating_sub(was.spans_dropped));
            m.otlp_failures
                .inc_by(now.export_failures.saturating_sub(was.export_failures));
            self.counted.otlp = now;
            // An endpoint that fails says so, once a minute at most, not per retry.
            let due = self
                .said_otlp
                .is_none_or(|t| t.elapsed() >= Duration::from_secs(60));
            if now.export_failures > was.export_failures && due {
                if let Some(e) = x.last_error() {
                    eprintln!(
                        "tokenscope agent: OTLP export failing ({e}); retrying, spans past the queue are dropped and counted"
                    );
                    self.said_otlp = Some(Instant::now());
                }
            }
        }
    }

    /// Lets go of what fell out of the window (memory: what is in flight plus it).
    fn evict(&mut self) {
        let cutoff = self.pipeline.released_ns().saturating_sub(self.window_ns);
        while self
            .done
            .front()
            .is_some_and(|r| r.end_ns.unwrap_or(r.start_ns) < cutoff)
        {
            self.done.pop_front();
        }
        while self.steps.front().is_some_and(|s| s.end_ns < cutoff) {
            self.steps.pop_front();
        }
        while self.nvml.front().is_some_and(|(t, _)| *t < cutoff) {
            self.nvml.pop_front();
        }
    }

    fn diagnose(&self) {
        // In the order their chains started, as a report has them; borrowed, not copied
        // (a window of token vectors), and with the pipeline's ids, which the GPU
        // shares' culprits name (renumbered copies no longer matched them).
        let mut requests: Vec<&Request> = self.done.iter().collect();
        requests.sort_by_key(|r| r.order);
        let steps: Vec<GpuStep> = self.steps.iter().cloned().collect();
        let nvml: Vec<(u64, NvmlSample)> = self.nvml.iter().cloned().collect();
        let found = diagnose::diagnose(&diagnose::Input {
            requests,
            steps: &steps,
            nvml: &nvml,
            shares: &[],
        });
        self.metrics.set_diagnoses(&found);
    }
}

/// Adds to `counter` what a running total grew by since it was last seen.
fn bump(counter: &prometheus_client::metrics::counter::Counter, seen: &mut u64, total: u64) {
    counter.inc_by(total.saturating_sub(*seen));
    *seen = (*seen).max(total);
}
