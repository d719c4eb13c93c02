//! OTLP/HTTP protobuf trace export: every finished request as one trace (see `spans`),
//! batched and sent from a thread of its own (see `worker`) to an OpenTelemetry
//! Collector. The agent never waits on it: a full queue drops and counts.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use collector::stitch::Request;

mod http;
pub(crate) mod ids;
pub mod proto;
mod spans;
mod worker;

use proto::KeyValue;
use spans::Clock;
use worker::{Settings, Shared};

/// Where and how spans are sent.
#[derive(Clone, Debug)]
pub struct OtlpConfig {
    /// `http://HOST:PORT/v1/traces` (a URL without a path gets `/v1/traces`).
    pub endpoint: String,
    /// Spans waiting to be sent at most; past it new spans are dropped and counted.
    pub queue_spans: usize,
    /// Spans per export request at most.
    pub batch_spans: usize,
    /// A batch leaves at least this often when spans wait.
    pub batch_delay: Duration,
    /// One export request's time limit.
    pub timeout: Duration,
    /// `service.name` of the resource.
    pub service_name: String,
    /// `host.name` of the resource.
    pub host_name: String,
}

/// What the exporter did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OtlpStats {
    /// Requests whose root span the collector took.
    pub requests_exported: u64,
    pub spans_exported: u64,
    /// Spans that never reached the collector: the queue was full, the collector
    /// refused their batch (or rejected them), or shutdown's deadline passed.
    pub spans_dropped: u64,
    /// Export requests that failed (each retry counts).
    pub export_failures: u64,
}

/// Waits this long past shutdown's deadline for the thread to finish the request it is
/// in (each is cut at the deadline; name resolution is not).
const SHUTDOWN_GRACE: Duration = Duration::from_millis(200);

pub struct Exporter {
    shared: Arc<Shared>,
    clock: Clock,
    thread: Option<JoinHandle<()>>,
}

impl Exporter {
    /// Checks the endpoint and starts the exporter's thread.
    pub fn start(cfg: OtlpConfig) -> anyhow::Result<Exporter> {
        let endpoint = http::Endpoint::parse(&cfg.endpoint)?;
        anyhow::ensure!(
            cfg.queue_spans > 0 && cfg.batch_spans > 0,
            "OTLP queue and batch sizes must be at least 1 span"
        );
        let resource = vec![
            KeyValue::str("service.name", cfg.service_name),
            KeyValue::str("service.version", env!("CARGO_PKG_VERSION")),
            KeyValue::str("host.name", cfg.host_name),
            KeyValue::str("telemetry.sdk.name", "tokenscope"),
            KeyValue::str("telemetry.sdk.language", "rust"),
        ];
        let shared = Arc::new(Shared::new(Settings {
            endpoint,
            queue_spans: cfg.queue_spans,
            batch_spans: cfg.batch_spans,
            batch_delay: cfg.batch_delay,
            timeout: cfg.timeout,
            resource,
        }));
        let s = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("otlp-export".into())
            .spawn(move || worker::run(&s))
            .map_err(|e| anyhow::anyhow!("starting the OTLP export thread: {e}"))?;
        Ok(Exporter {
            shared,
            clock: Clock::now(),
            thread: Some(thread),
        })
    }

    /// Queues a finished request's spans; never blocks (a full queue drops them, counted).
    /// Their trace is the one the request's `traceparent` names, else a random one.
    pub fn export(&self, request: &Request) {
        self.shared
            .push(spans::request_spans(request, self.clock, None));
    }

    /// `export` in trace `trace_id`, the id the agent also gives the request's metric
    /// exemplars (`trace::trace_id`), so a histogram bucket links to this very trace.
    pub fn export_in_trace(&self, request: &Request, trace_id: [u8; 16]) {
        let spans = spans::request_spans(request, self.clock, Some(trace_id));
        self.shared.push(spans);
    }

    pub fn stats(&self) -> OtlpStats {
        self.shared.stats()
    }

    /// Why the last export request failed, if one has (for a line in the agent's log).
    pub fn last_error(&self) -> Option<String> {
        self.shared.last_error()
    }

    /// Sends what is queued, waiting at most `deadline`; what is left then is dropped.
    pub fn shutdown(mut self, deadline: Duration) -> OtlpStats {
        let done = self.shared.close(Instant::now() + deadline, SHUTDOWN_GRACE);
        if let Some(t) = self.thread.take().filter(|_| done) {
            let _ = t.join();
        }
        self.shared.stats()
    }
}

/// An exporter dropped without `shutdown` stops its thread without waiting for it.
impl Drop for Exporter {
    fn drop(&mut self) {
        self.shared.stop_soon();
    }
}

#[cfg(test)]
mod tests;
