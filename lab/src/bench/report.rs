//! Percentile summaries of TTFT, TPOT, ITL and e2e (DESIGN.md section 2), as text and JSON.
use std::fmt;

use collector::analyze::summarize;
use serde::Serialize;

use super::record::RequestRecord;

/// Distribution of one metric in milliseconds; percentiles by linear interpolation
/// (numpy's default, as vllm bench serve computes them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Summary {
    pub count: usize,
    pub p50: f64,
    pub p90: f64,
    pub p95: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
    pub mean: f64,
}

impl Summary {
    /// The profiler's percentiles (`collector::analyze`, whole ns), shown in ms.
    pub fn from_ns(samples: impl IntoIterator<Item = u64>) -> Summary {
        let ns: Vec<u64> = samples.into_iter().collect();
        let Some(s) = summarize(&ns) else {
            return Summary::default();
        };
        let ms = |ns: u64| ns as f64 / 1e6;
        Summary {
            count: s.count,
            p50: ms(s.p50_ns),
            p90: ms(s.p90_ns),
            p95: ms(s.p95_ns),
            p99: ms(s.p99_ns),
            p999: ms(s.p999_ns),
            max: ms(s.max_ns),
            // The exact mean, not summarize's whole-ns one.
            mean: ns.iter().map(|&n| ms(n)).sum::<f64>() / ns.len() as f64,
        }
    }
}

/// The bench's result in numbers.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct BenchReport {
    pub requests: usize,
    pub ok: usize,
    pub failed: usize,
    /// Requests that had to open a new connection (the first of each worker included).
    pub new_connections: usize,
    /// New connections a worker had to open because the server closed its previous one.
    pub reconnects: usize,
    pub workers: usize,
    pub duration_s: f64,
    pub output_tokens: usize,
    /// Token events that arrived in the same socket read as the token before them.
    pub coalesced_tokens: usize,
    pub ttft_ms: Summary,
    pub ttft_server_ms: Summary,
    pub tpot_ms: Summary,
    pub itl_ms: Summary,
    pub e2e_ms: Summary,
}

impl BenchReport {
    pub fn from_records(
        records: &[RequestRecord],
        workers: usize,
        duration_ns: u64,
    ) -> BenchReport {
        let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.ok).collect();
        BenchReport {
            requests: records.len(),
            ok: ok.len(),
            failed: records.len() - ok.len(),
            new_connections: records.iter().filter(|r| r.new_connection).count(),
            reconnects: reconnects(records),
            workers,
            duration_s: duration_ns as f64 / 1e9,
            output_tokens: ok.iter().map(|r| r.output_tokens()).sum(),
            coalesced_tokens: ok.iter().map(|r| r.coalesced_tokens()).sum(),
            ttft_ms: Summary::from_ns(ok.iter().filter_map(|r| r.ttft_ns())),
            ttft_server_ms: Summary::from_ns(ok.iter().filter_map(|r| r.ttft_server_ns())),
            tpot_ms: Summary::from_ns(ok.iter().filter_map(|r| r.tpot_ns())),
            itl_ms: Summary::from_ns(ok.iter().flat_map(|r| r.itl_ns())),
            e2e_ms: Summary::from_ns(ok.iter().map(|r| r.e2e_ns())),
        }
    }
}

/// Requests that opened a connection although their worker had sent one before.
fn reconnects(records: &[RequestRecord]) -> usize {
    let mut seen = std::collections::HashSet::new();
    let mut sorted: Vec<&RequestRecord> = records.iter().collect();
    sorted.sort_by_key(|r| r.request_start_ns);
    sorted
        .into_iter()
        .filter(|r| !seen.insert(r.worker) && r.new_connection)
        .count()
}

impl fmt::Display for BenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "requests: {} ok, {} failed in {:.1} s ({:.2} req/s, {:.0} output tokens/s), {} workers",
            self.ok,
            self.failed,
            self.duration_s,
            self.ok as f64 / self.duration_s.max(1e-9),
            self.output_tokens as f64 / self.duration_s.max(1e-9),
            self.workers
        )?;
        writeln!(
            f,
            "connections: {} of {} requests opened a new connection ({} because the server \
             closed the previous one)",
            self.new_connections, self.requests, self.reconnects
        )?;
        writeln!(
            f,
            "coalescing: {} of {} token events arrived in the same read as the previous token",
            self.coalesced_tokens, self.output_tokens
        )?;
        writeln!(
            f,
            "{:<12} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "metric (ms)", "count", "p50", "p90", "p95", "p99", "p99.9", "max", "mean"
        )?;
        for (name, s) in [
            ("TTFT", &self.ttft_ms),
            ("TTFT server", &self.ttft_server_ms),
            ("TPOT", &self.tpot_ms),
            ("ITL", &self.itl_ms),
            ("E2E", &self.e2e_ms),
        ] {
            writeln!(
                f,
                "{:<12} {:>7} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
                name, s.count, s.p50, s.p90, s.p95, s.p99, s.p999, s.max, s.mean
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_like_numpy() {
        let s = Summary::from_ns((1..=10).map(|ms| ms * 1_000_000));
        assert_eq!(s.p50, 5.5, "median of 1..10 ms");
        assert!((s.p90 - 9.1).abs() < 1e-9, "p90 of 1..10 ms is 9.1");
        assert_eq!(s.max, 10.0);
        let s = Summary::from_ns([1_000_000, 3_000_000]);
        assert_eq!((s.count, s.mean, s.max), (2, 2.0, 3.0));
    }
}
