//! Privileged: a real Prometheus server (Debian's package) scrapes `tokenscope agent`
//! while the lab's chain (engine, nginx, bench) runs, untuned then tuned, each side
//! watched by its own agent. PromQL's `histogram_quantile(0.95, ...)` of the
//! client-read TTFT lands within one bucket of bench's own TTFT p95 for the same
//! requests, and the diagnosis gauges show the untuned side's rules (1-5) and none of
//! them on the tuned side. The in-flight gauge rose during the load (at each process to
//! no more than the bench's streams: a request that ended and waits its settle is no
//! longer in flight) and is back to none after it.

#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

use std::time::Duration;

use test_support::agent::{sample_value, Agent, Prometheus};
use test_support::{free_ports, runtime};
use tokenscope_agent::metrics::TTFT_BUCKETS;
use tokenscope_lab::demo::{self, DemoConfig, DemoObserver};
use tokenscope_lab::scenario::Scenario;

/// Starts the side's agent on the engine's and proxy's ports once they listen, and
/// waits (after the load) until it observed every request and diagnosed them.
struct Watch {
    metrics_port: u16,
    agent: Option<Agent>,
    requests: u64,
}

impl DemoObserver for Watch {
    fn ready(&mut self, _tuned: bool, engine: std::net::SocketAddr, proxy: std::net::SocketAddr) {
        let (e, p) = (engine.port().to_string(), proxy.port().to_string());
        self.agent = Some(Agent::start_on(
            self.metrics_port,
            &[
                "--port",
                &e,
                "--port",
                &p,
                "--diagnose-every",
                "2s",
                "--window",
                "5m",
                "--nvml",
                "off",
            ],
        ));
    }

    fn finished(&mut self, _tuned: bool) -> Option<String> {
        None
    }
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    let rank = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64)
}

/// The index of the bucket holding `v` (upper edges; past the last: its count).
fn bucket(v: f64) -> usize {
    TTFT_BUCKETS.partition_point(|&edge| edge < v)
}

struct Side {
    bench_p95: f64,
    promql_p95: f64,
    rules: Vec<u64>,
}

fn side(prom: &Prometheus, tuned: bool, metrics_port: u16) -> Side {
    let rt = runtime();
    let scenario = if tuned {
        Scenario::TunedPlain
    } else {
        Scenario::Untuned
    };
    let cfg = DemoConfig {
        // Only bench's own requests cross the chain: the agent counts exactly them.
        warmup_requests: 0,
        ..scenario
            .demo_config()
            .expect("a scenario of the demo's chain")
    };
    let mut watch = Watch {
        metrics_port,
        agent: None,
        requests: 0,
    };
    let outcome = rt
        .block_on(demo::run_observed(&cfg, &mut watch))
        .expect("the lab chain ran");
    let records = &outcome.bench.records;
    assert!(
        records.iter().all(|r| r.ok),
        "every bench request succeeded"
    );
    watch.requests = records.len() as u64;
    let mut ttfts: Vec<f64> = records
        .iter()
        .map(|r| r.ttft_ns().expect("ttft") as f64 / 1e9)
        .collect();
    ttfts.sort_by(f64::total_cmp);
    let bench_p95 = percentile(&ttfts, 0.95);

    let instance = format!("instance=\"127.0.0.1:{metrics_port}\"");
    // Every request observed at the client, and scraped.
    let n = watch.requests as f64;
    prom.wait_for(
        &format!("sum(tokenscope_ttft_seconds_count{{{instance},point=\"client_read\"}})"),
        Duration::from_secs(60),
        |v| v >= n,
    );
    // A diagnosis pass after the last request, scraped: the gauges are the whole run's.
    let passes = format!("tokenscope_diagnosis_passes_total{{{instance}}}");
    let seen = prom.wait_for(&passes, Duration::from_secs(10), |_| true);
    prom.wait_for(&passes, Duration::from_secs(30), |v| v > seen);
    let promql_p95 = prom.wait_for(
        &format!(
            "histogram_quantile(0.95, sum by (le) (tokenscope_ttft_seconds_bucket{{{instance},point=\"client_read\"}}))"
        ),
        Duration::from_secs(10),
        f64::is_finite,
    );
    // Requests in flight, per serving process (nginx and the engine each serve every
    // stream): seen during the load (Prometheus scraped every second of it), never more
    // than the bench's streams at one process, and none left once every request ended.
    let in_flight = format!("max(tokenscope_in_flight_streams{{{instance}}})");
    let peak = prom.wait_for(
        &format!("max_over_time(({in_flight})[10m:1s])"),
        Duration::from_secs(10),
        f64::is_finite,
    );
    let concurrency = cfg.concurrency as f64;
    assert!(
        peak >= 1.0 && peak <= concurrency,
        "the in-flight gauge of one process peaked at {peak} during a load of {concurrency} streams"
    );
    let after = prom.wait_for(
        &format!("({in_flight}) or vector(0)"),
        Duration::from_secs(10),
        |v| v == 0.0,
    );
    assert_eq!(after, 0.0, "no request stays in flight after the load");
    let mut rules: Vec<u64> = prom
        .query(&format!(
            "tokenscope_diagnosis_saving_seconds{{{instance}}}"
        ))
        .iter()
        .filter(|r| sample_value(r).is_some())
        .filter_map(|r| r["metric"]["rule"].as_str()?.parse().ok())
        .collect();
    rules.sort_unstable();
    rules.dedup();
    // Exemplars: a request's trace id beside its TTFT, stored by Prometheus.
    let trace_ids: Vec<String> = prom
        .exemplars(&format!("tokenscope_ttft_seconds_bucket{{{instance}}}"))
        .iter()
        .flat_map(|series| series["exemplars"].as_array().cloned().unwrap_or_default())
        .filter_map(|e| Some(e["labels"]["trace_id"].as_str()?.to_string()))
        .collect();
    assert!(
        !trace_ids.is_empty()
            && trace_ids
                .iter()
                .all(|t| t.len() == 32 && t.bytes().all(|b| b.is_ascii_hexdigit())),
        "TTFT exemplars carry 32-hex trace ids: {trace_ids:?}"
    );
    let agent = watch.agent.take().expect("the agent ran");
    let text = agent.metrics();
    for line in text
        .lines()
        .filter(|l| l.starts_with("tokenscope_requests_total"))
    {
        println!("{line}");
    }
    let requests = test_support::agent::metric_sum(&text, "tokenscope_requests_total");
    // Live drains (every 100 ms) and merged sources stay inside the 200 ms reorder window.
    let late = "tokenscope_late_events_total";
    assert!(
        text.lines().any(|l| l.starts_with(late)),
        "{late} exported:\n{text}"
    );
    assert_eq!(
        test_support::agent::metric_sum(&text, late),
        0.0,
        "no event came later than the reorder window"
    );
    let stderr = agent.stop();
    println!(
        "{}: {} bench requests, agent counted {requests}; TTFT p95 bench {:.3} s, PromQL {:.3} s; \
         in flight at most {peak}; diagnosis gauges: rules {rules:?}\n{stderr}",
        if tuned { "tuned" } else { "untuned" },
        records.len(),
        bench_p95,
        promql_p95
    );
    assert_eq!(
        requests, n,
        "the agent counted each bench request once (no extra, none missing)"
    );
    Side {
        bench_p95,
        promql_p95,
        rules,
    }
}

#[test]
fn prometheus_sees_the_benchs_ttft_p95_within_a_bucket_and_the_untuned_diagnoses_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ports: [u16; 2] = free_ports();
    let prom = Prometheus::start(dir.path(), &ports);
    let untuned = side(&prom, false, ports[0]);
    let tuned = side(&prom, true, ports[1]);
    for (name, s) in [("untuned", &untuned), ("tuned", &tuned)] {
        let (b, p) = (bucket(s.bench_p95), bucket(s.promql_p95));
        assert!(
            b.abs_diff(p) <= 1,
            "{name}: PromQL TTFT p95 {:.3} s (bucket {p}) is more than one bucket from bench's \
             {:.3} s (bucket {b}); edges {TTFT_BUCKETS:?}",
            s.promql_p95,
            s.bench_p95
        );
    }
    for rule in 1..=5 {
        assert!(
            untuned.rules.contains(&rule),
            "untuned: rule {rule} has a diagnosis gauge: {:?}",
            untuned.rules
        );
    }
    let left: Vec<&u64> = tuned.rules.iter().filter(|r| **r <= 5).collect();
    assert!(
        left.is_empty(),
        "tuned: none of rules 1-5 has a gauge: {:?}",
        tuned.rules
    );
}
