//! `tokenscope agent`: its options and the thin call into `tokenscope_agent`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use collector::record::sink::{Output, Rotation};
use tokenscope_agent::otlp::OtlpConfig;
use tokenscope_agent::{AgentOptions, Started};

use crate::probe_args::ProbeArgs;

pub const AFTER_HELP: &str = "\
Examples:
  tokenscope agent --port 8000 --port 443                      # metrics on 127.0.0.1:9464
  tokenscope agent --metrics-listen 0.0.0.0:9464 --otlp-endpoint http://127.0.0.1:4318
  tokenscope agent --port 443 --record-dir /var/lib/tokenscope --max-size 2G --max-age 6h
      # ...a bad minute later: tokenscope report /var/lib/tokenscope/tokenscope-<time>-*.tsrec

Metrics (OpenMetrics text at /metrics, prefix tokenscope_): ttft_seconds and itl_seconds per
observation point (client_read, proxy_write, proxy_read, engine_write), tpot_seconds,
forward_delay_seconds per hop, stage_seconds (connect, tls, upload, gateway, engine_wait,
gateway_ttft, queue, prefill, decode), requests_total, tokens_total, in_flight_streams,
diagnosis_saving_seconds (one series per active diagnosis over --window),
diagnosis_passes_total, events_total, ring_dropped_events_total, unparsed_ios_total,
otlp_*_total. Labels: route (the path; past --max-routes distinct ones, `other`), server
(the serving process), api, point or hop or stage.
Exemplars on TTFT and TPOT carry the request's trace id.

OTLP (HTTP/protobuf): one trace per request, spans per stage and per hop, token arrivals as
span events (first, last, the largest gaps). A request that carried a W3C traceparent header
joins that trace. The export queue is bounded: when the endpoint is down, spans are dropped
and counted (otlp_spans_dropped_total), never held without bound.

Memory: requests leave once finished and observed; what stays is what is in flight plus the
diagnosis window. Privileges as `record`: root, or CAP_BPF + CAP_PERFMON (+ CAP_SYS_ADMIN for
uprobes); see deploy/ for a systemd unit and a Kubernetes DaemonSet.";

#[derive(Args, Debug)]
pub struct AgentArgs {
    #[command(flatten)]
    probes: ProbeArgs,
    /// Serve Prometheus metrics at http://ADDR/metrics (`off`: none).
    #[arg(long, default_value = "127.0.0.1:9464", value_name = "ADDR", value_parser = parse_listen)]
    metrics_listen: Listen,
    /// Send OTLP traces here (HTTP/protobuf, e.g. http://127.0.0.1:4318 of an
    /// OpenTelemetry Collector; `/v1/traces` is added when the URL has no path).
    #[arg(long, value_name = "URL")]
    otlp_endpoint: Option<String>,
    /// Spans waiting for the OTLP endpoint at most; past it new ones are dropped and counted.
    #[arg(long, default_value_t = 8192, value_name = "N")]
    otlp_queue_spans: usize,
    /// `service.name` of the exported spans.
    #[arg(long, default_value = "tokenscope", value_name = "NAME")]
    service_name: String,
    /// Keep rotating recordings in this directory (replay them with report, top
    /// --replay, export).
    #[arg(long, value_name = "DIR")]
    record_dir: Option<PathBuf>,
    /// The directory's recordings together at most (e.g. 500M, 2G); the oldest go first.
    #[arg(long, default_value = "1G", value_name = "SIZE", value_parser = parse_size, requires = "record_dir")]
    max_size: u64,
    /// Recordings older than this are removed (e.g. 30m, 6h).
    #[arg(long, default_value = "1h", value_parser = collector::duration::parse, value_name = "D", requires = "record_dir")]
    max_age: Duration,
    /// Diagnoses run over the requests finished this recently...
    #[arg(long, default_value = "60s", value_parser = collector::duration::parse, value_name = "D")]
    window: Duration,
    /// ...this often (their gauges change no faster).
    #[arg(long, default_value = "10s", value_parser = collector::duration::parse, value_name = "D")]
    diagnose_every: Duration,
    /// Distinct routes (paths) labelled before the rest become `other`.
    #[arg(long, default_value_t = tokenscope_agent::metrics::DEFAULT_MAX_ROUTES, value_name = "N")]
    max_routes: usize,
    /// Stop after this long (default: until SIGINT or SIGTERM).
    #[arg(short, long, value_parser = collector::duration::parse, value_name = "D")]
    duration: Option<Duration>,
}

#[derive(Clone, Debug)]
enum Listen {
    At(SocketAddr),
    Off,
}

fn parse_listen(s: &str) -> Result<Listen, String> {
    if s == "off" {
        return Ok(Listen::Off);
    }
    s.parse()
        .map(Listen::At)
        .map_err(|_| format!("not an address: {s} (e.g. 127.0.0.1:9464, [::]:9464, or off)"))
}

/// `500M`, `2G`, `1048576`: bytes (K, M, G, T are powers of 1024).
fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (digits, shift) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => return Err(format!("{s}: unknown unit {c} (K, M, G or T)")),
            };
            (&t[..i], shift)
        }
        _ => (t, 0),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("not a size: {s} (e.g. 500M, 2G)"))?;
    n.checked_mul(1 << shift)
        .filter(|&b| b >= 1 << 20)
        .ok_or_else(|| format!("{s}: a size from 1M up"))
}

pub fn agent(args: AgentArgs) -> anyhow::Result<ExitCode> {
    let output = match &args.record_dir {
        Some(dir) => Output::Rotate(Rotation::new(dir.clone(), args.max_size, args.max_age)),
        None => Output::Discard,
    };
    let (record, gpu_note) = args.probes.record_options(args.duration, output);
    let otlp = args.otlp_endpoint.as_ref().map(|endpoint| OtlpConfig {
        endpoint: endpoint.clone(),
        queue_spans: args.otlp_queue_spans,
        batch_spans: 512,
        batch_delay: Duration::from_secs(1),
        timeout: Duration::from_secs(10),
        service_name: args.service_name.clone(),
        host_name: hostname(),
    });
    let opts = AgentOptions {
        record,
        metrics_listen: match args.metrics_listen {
            Listen::At(a) => Some(a),
            Listen::Off => None,
        },
        otlp,
        window: args.window,
        diagnose_every: args.diagnose_every,
        max_routes: args.max_routes,
    };
    let quit = collector::record::live::quit_flag().context("signal handler")?;
    let endpoint = args.otlp_endpoint.clone();
    let record_dir = args.record_dir.clone();
    let summary = tokenscope_agent::run(opts, &quit, &mut |s: &Started| {
        if let Some(note) = gpu_note {
            eprintln!("tokenscope agent: {note}");
        }
        for line in &s.probe_lines {
            eprintln!("tokenscope agent: {line}");
        }
        let mut line = format!(
            "tokenscope agent: attached {} probes ({} skipped)",
            s.probes_attached, s.probes_skipped
        );
        if let Some(addr) = s.metrics {
            line += &format!("; metrics at http://{addr}/metrics");
        }
        if let Some(e) = &endpoint {
            line += &format!("; OTLP to {e}");
        }
        if let Some(d) = &record_dir {
            line += &format!("; recording to {}", d.display());
        }
        eprintln!("{line}");
    })
    .context("agent")?;
    eprintln!(
        "tokenscope agent: stopped: {} requests, {} events, {} dropped by the ring buffer; OTLP: {} spans sent, {} dropped",
        summary.requests,
        summary.events,
        summary.dropped,
        summary.otlp.spans_exported,
        summary.otlp.spans_dropped
    );
    Ok(ExitCode::SUCCESS)
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_read_with_units_and_refuse_the_absurd() {
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("500m"), Ok(500 << 20));
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
        assert!(parse_size("10").is_err());
        assert!(parse_size("5X").is_err());
        assert!(parse_size("99999999999T").is_err());
    }
}
