//! The Prometheus side: every finished request observed once into histograms per
//! observation point, hop and stage; counters of what the recording saw; a gauge per
//! active diagnosis with its estimated saving. Encoded as OpenMetrics text by the
//! Prometheus project's own client (exemplars carry a slow request's trace id).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

use collector::diagnose::Diagnosis;
use collector::stitch::{PointKind, Request};
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::exemplar::HistogramWithExemplars;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

/// TTFT bucket edges (s): 10 ms steps where interactive TTFTs live, up to a minute.
pub const TTFT_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.75, 1.0, 1.25, 1.5, 2.0,
    2.5, 3.0, 4.0, 5.0, 6.0, 7.5, 10.0, 12.5, 15.0, 20.0, 30.0, 60.0,
];
/// ITL / TPOT / forward-delay edges (s): resolve 20 ms inter-token gaps (5 ms steps
/// around them), stalls up to seconds.
pub const ITL_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.05, 0.075, 0.1,
    0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0,
];
/// Stage edges (s): sub-millisecond handshakes to minute-long queues.
pub const STAGE_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0, 60.0,
];

/// Routes past this many distinct ones are labelled `other` (`--max-routes`).
pub const DEFAULT_MAX_ROUTES: usize = 50;
const OTHER: &str = "other";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)] // label values as Prometheus users write them
pub enum Point {
    client_read,
    proxy_write,
    proxy_read,
    engine_write,
}

impl From<PointKind> for Point {
    fn from(k: PointKind) -> Point {
        match k {
            PointKind::ClientRead => Point::client_read,
            PointKind::ProxyWrite => Point::proxy_write,
            PointKind::ProxyRead => Point::proxy_read,
            PointKind::EngineWrite => Point::engine_write,
        }
    }
}

/// TTFT and ITL: where it was seen, for which route, served by which process, in
/// which streaming API.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PointLabels {
    pub point: Point,
    pub route: String,
    pub server: String,
    pub api: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    pub route: String,
    pub server: String,
    pub api: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub route: String,
    pub server: String,
    pub api: String,
    pub status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HopLabels {
    /// `engine_write->proxy_read`, ...
    pub hop: String,
    pub route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabels {
    pub stage: &'static str,
    pub route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ServerLabels {
    pub server: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DiagnosisLabels {
    /// The rule's number and key (`2`, `proxy_buffering`).
    pub rule: String,
    pub key: &'static str,
    /// Where the evidence comes from (process, port, route).
    pub scope: String,
    /// The statistic the saving is of: `ttft_p95` or `itl_p99`.
    pub stat: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TraceLabel {
    pub trace_id: String,
}

type Hist = HistogramWithExemplars<TraceLabel>;
type PointHist = Family<PointLabels, Hist, fn() -> Hist>;

fn ttft_hist() -> Hist {
    HistogramWithExemplars::new(TTFT_BUCKETS.iter().copied())
}
fn itl_hist() -> Histogram {
    Histogram::new(ITL_BUCKETS.iter().copied())
}
fn tpot_hist() -> Hist {
    HistogramWithExemplars::new(ITL_BUCKETS.iter().copied())
}
fn stage_hist() -> Histogram {
    Histogram::new(STAGE_BUCKETS.iter().copied())
}

/// Everything `/metrics` serves.
pub struct Metrics {
    registry: Registry,
    ttft: PointHist,
    itl: Family<PointLabels, Histogram, fn() -> Histogram>,
    tpot: Family<RouteLabels, Hist, fn() -> Hist>,
    forward: Family<HopLabels, Histogram, fn() -> Histogram>,
    stage: Family<StageLabels, Histogram, fn() -> Histogram>,
    requests: Family<RequestLabels, Counter>,
    tokens: Family<RouteLabels, Counter>,
    in_flight: Family<ServerLabels, Gauge>,
    diagnoses: Family<DiagnosisLabels, Gauge<f64, AtomicU64>>,
    pub events: Counter,
    /// Diagnosis passes made (each replaces the diagnosis gauges).
    pub diagnosis_passes: Counter,
    pub ring_dropped: Counter,
    pub unparsed_ios: Counter,
    pub late_events: Counter,
    pub otlp_requests: Counter,
    pub otlp_spans: Counter,
    pub otlp_dropped: Counter,
    pub otlp_failures: Counter,
    routes: Mutex<HashSet<String>>,
    pub max_routes: usize,
    /// Process names by pid (a thread's comm names a worker thread, not the server).
    names: Mutex<HashMap<u32, String>>,
}

impl Metrics {
    pub fn new(max_routes: usize) -> Metrics {
        let mut registry = Registry::with_prefix("tokenscope");
        let m = Metrics {
            ttft: Family::new_with_constructor(ttft_hist),
            itl: Family::new_with_constructor(itl_hist),
            tpot: Family::new_with_constructor(tpot_hist),
            forward: Family::new_with_constructor(itl_hist),
            stage: Family::new_with_constructor(stage_hist),
            requests: Family::default(),
            tokens: Family::default(),
            in_flight: Family::default(),
            diagnoses: Family::default(),
            events: Counter::default(),
            diagnosis_passes: Counter::default(),
            ring_dropped: Counter::default(),
            unparsed_ios: Counter::default(),
            late_events: Counter::default(),
            otlp_requests: Counter::default(),
            otlp_spans: Counter::default(),
            otlp_dropped: Counter::default(),
            otlp_failures: Counter::default(),
            routes: Mutex::new(HashSet::new()),
            max_routes,
            names: Mutex::new(HashMap::new()),
            registry: Registry::default(),
        };
        registry.register_with_unit(
            "ttft",
            "Time to first token per observation point: request start (connect() when it opened its connection, else its first byte) to the first token seen there",
            Unit::Seconds,
            m.ttft.clone(),
        );
        registry.register_with_unit(
            "itl",
            "Inter-token latency per observation point: gaps between consecutive tokens (0: the same read)",
            Unit::Seconds,
            m.itl.clone(),
        );
        registry.register_with_unit(
            "tpot",
            "Time per output token at the client-most point: (last - first token) / (tokens - 1)",
            Unit::Seconds,
            m.tpot.clone(),
        );
        registry.register_with_unit(
            "forward_delay",
            "Delay of each token between adjacent observation points (a hop)",
            Unit::Seconds,
            m.forward.clone(),
        );
        registry.register_with_unit(
            "stage",
            "Stages of a request: connect, tls, upload, gateway, subrequest, engine_wait, gateway_ttft, queue, prefill, decode",
            Unit::Seconds,
            m.stage.clone(),
        );
        registry.register(
            "requests",
            "Finished requests (streams) seen",
            m.requests.clone(),
        );
        registry.register(
            "tokens",
            "Token events at the client-most point",
            m.tokens.clone(),
        );
        registry.register(
            "in_flight_streams",
            "Requests a process accepted and has not answered in full, by that process",
            m.in_flight.clone(),
        );
        registry.register_with_unit(
            "diagnosis_saving",
            "Active diagnoses over the last window, each with its estimated saving of the statistic named",
            Unit::Seconds,
            m.diagnoses.clone(),
        );
        let counters = [
            ("events", "Events recorded", &m.events),
            (
                "diagnosis_passes",
                "Passes of the diagnosis rules over the window (each replaces the gauges)",
                &m.diagnosis_passes,
            ),
            (
                "ring_dropped_events",
                "Events the kernel ring buffer had no room for",
                &m.ring_dropped,
            ),
            (
                "unparsed_ios",
                "Socket I/Os whose bytes were neither HTTP nor TLS",
                &m.unparsed_ios,
            ),
            (
                "late_events",
                "Events later than the reorder window (used out of order)",
                &m.late_events,
            ),
            (
                "otlp_requests_exported",
                "Requests whose spans reached the OTLP endpoint",
                &m.otlp_requests,
            ),
            (
                "otlp_spans_exported",
                "Spans the OTLP endpoint accepted",
                &m.otlp_spans,
            ),
            (
                "otlp_spans_dropped",
                "Spans dropped: the export queue was full (endpoint down or slow) or shutdown came first",
                &m.otlp_dropped,
            ),
            (
                "otlp_export_failures",
                "Export requests that failed (and were retried)",
                &m.otlp_failures,
            ),
        ];
        for (name, help, counter) in counters {
            registry.register(name, help, counter.clone());
        }
        Metrics { registry, ..m }
    }

    /// The route label: the request's path (no query string is ever kept), or `other`
    /// past the cap.
    fn route(&self, r: &Request) -> String {
        let mut known = self.routes.lock().unwrap_or_else(|e| e.into_inner());
        if known.contains(&r.path) {
            return r.path.clone();
        }
        if known.len() < self.max_routes {
            known.insert(r.path.clone());
            return r.path.clone();
        }
        OTHER.to_string()
    }

    /// A finished request, observed once. `trace_id`: the hex id of its OTLP trace
    /// (the exemplar on its TTFT and TPOT).
    pub fn observe(&self, r: &Request, trace_id: Option<&str>) {
        let route = self.route(r);
        let server = self.server(r);
        let api = r.api.unwrap_or("unknown").to_string();
        let exemplar = || {
            trace_id.map(|t| TraceLabel {
                trace_id: t.to_string(),
            })
        };
        self.requests
            .get_or_create(&RequestLabels {
                route: route.clone(),
                server: server.clone(),
                api: api.clone(),
                status: r.status.map_or_else(|| "none".into(), |s| s.to_string()),
            })
            .inc();
        let route_labels = RouteLabels {
            route: route.clone(),
            server: server.clone(),
            api: api.clone(),
        };
        self.tokens
            .get_or_create(&route_labels)
            .inc_by(r.tokens() as u64);
        if let Some(t) = r.tpot_ns() {
            self.tpot
                .get_or_create(&route_labels)
                .observe(secs(t), exemplar());
        }
        for p in &r.points {
            let labels = PointLabels {
                point: p.kind.into(),
                route: route.clone(),
                server: server.clone(),
                api: api.clone(),
            };
            if let Some(t) = p.ttft_ns {
                self.ttft
                    .get_or_create(&labels)
                    .observe(secs(t), exemplar());
            }
            let itl = self.itl.get_or_create(&labels);
            for gap in p.itl_ns() {
                itl.observe(secs(gap));
            }
        }
        for f in &r.forward {
            let hop = self.forward.get_or_create(&HopLabels {
                hop: format!("{}->{}", label(f.from), label(f.to)),
                route: route.clone(),
            });
            for d in f.delays(&r.points) {
                hop.observe(secs(d));
            }
        }
        for (stage, ns) in stages(r) {
            self.stage
                .get_or_create(&StageLabels {
                    stage,
                    route: route.clone(),
                })
                .observe(secs(ns));
        }
    }

    /// The process that served it (the engine-most point's), by its name.
    fn server(&self, r: &Request) -> String {
        match r.points.last() {
            Some(p) => self.process_name(p.pid, &p.comm),
            None => "unknown".into(),
        }
    }

    /// A process by its name: the main thread's comm, read once per pid; the thread's
    /// own (`comm`) when the process is gone.
    fn process_name(&self, pid: u32, comm: &str) -> String {
        let mut names = self.names.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(name) = names.get(&pid) {
            return name.clone();
        }
        let name = std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .map(|s| s.trim().to_string())
            .ok()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| comm.to_string());
        if names.len() >= 4096 {
            // Pids are reused over weeks: start over rather than grow.
            names.clear();
        }
        names.insert(pid, name.clone());
        name
    }

    /// Streams in flight now, by the process serving them: `(pid, comm)` per request
    /// (`Pipeline::serving`).
    pub fn set_in_flight<'a>(&self, serving: impl Iterator<Item = (u32, &'a str)>) {
        self.in_flight.clear();
        for (pid, comm) in serving {
            self.in_flight
                .get_or_create(&ServerLabels {
                    server: self.process_name(pid, comm),
                })
                .inc();
        }
    }

    /// The diagnoses of the last window replace the previous ones.
    pub fn set_diagnoses(&self, diagnoses: &[Diagnosis]) {
        self.diagnoses.clear();
        self.diagnosis_passes.inc();
        for d in diagnoses {
            let s = &d.saving;
            let mut stats = vec![("ttft_p95", s.ttft_p95_ns), ("itl_p99", s.itl_p99_ns)];
            stats.retain(|(_, v)| v.is_some());
            if stats.is_empty() {
                // Active with no estimate: shown, at zero.
                stats.push(("ttft_p95", Some(0)));
            }
            for (stat, ns) in stats {
                self.diagnoses
                    .get_or_create(&DiagnosisLabels {
                        rule: d.rule.to_string(),
                        key: d.key,
                        scope: d.scope.clone(),
                        stat,
                    })
                    .set(secs(ns.unwrap_or(0)));
            }
        }
    }

    /// `/metrics` as OpenMetrics text.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

fn label(k: PointKind) -> &'static str {
    match k {
        PointKind::ClientRead => "client_read",
        PointKind::ProxyWrite => "proxy_write",
        PointKind::ProxyRead => "proxy_read",
        PointKind::EngineWrite => "engine_write",
    }
}

/// The stages that apply to a request, as the report names them.
pub fn stages(r: &Request) -> Vec<(&'static str, u64)> {
    let s = &r.stages;
    let mut out: Vec<(&'static str, u64)> = [
        ("connect", s.connect_ns),
        ("tls", s.tls_ns),
        ("upload", s.upload_ns),
        ("gateway", s.gateway_ns),
        ("subrequest", s.subrequest_ns),
        ("engine_wait", s.upstream_wait_ns),
        ("gateway_ttft", s.gateway_ttft_ns),
    ]
    .into_iter()
    .filter_map(|(name, v)| Some((name, v?)))
    .collect();
    if let Some(g) = &r.gpu {
        out.extend(g.queue_ns.map(|q| ("queue", q)));
        if g.prefill_steps > 0 {
            out.push(("prefill", g.prefill_ns));
        }
        let decode = r.point(PointKind::EngineWrite).and_then(|p| {
            let (first, last) = (p.token_ns.first()?, p.token_ns.last()?);
            (g.decode_steps > 0).then(|| last - first)
        });
        out.extend(decode.map(|d| ("decode", d)));
    }
    out
}

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_lands_in_its_point_histograms_and_routes_past_the_cap_are_other() {
        let m = Metrics::new(1);
        let mut a = Request::at_point(
            0,
            PointKind::ClientRead,
            // No such process: the thread's comm names it.
            u32::MAX - 1,
            "curl",
            vec![1_000_000_000, 1_020_000_000],
        );
        a.points[0].ttft_ns = Some(250_000_000);
        a.path = "/v1/chat/completions".into();
        let mut b = a.clone();
        b.path = "/v1/other/route".into();
        m.observe(&a, Some("4bf92f3577b34da6a3ce929d0e0e4736"));
        m.observe(&b, None);
        let text = m.encode();
        assert!(
            text.contains(
                r#"tokenscope_ttft_seconds_bucket{le="0.25",point="client_read",route="/v1/chat/completions",server="curl",api="unknown"} 1 # {trace_id="4bf92f3577b34da6a3ce929d0e0e4736"} 0.25"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"tokenscope_itl_seconds_bucket{le="0.02",point="client_read",route="other",server="curl",api="unknown"} 1"#),
            "{text}"
        );
        assert!(text.contains(r#"tokenscope_requests_total{route="other""#));
        assert!(text.ends_with("# EOF\n"));
    }
}
