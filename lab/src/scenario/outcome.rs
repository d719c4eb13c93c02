//! What a scenario measured: each stream as the client read it beside the engine's log,
//! and the one-line summary per scenario.

use std::net::SocketAddr;
use std::time::Duration;

use super::Scenario;
use crate::bench::Summary;

/// One stream as the client read it, beside the engine's log of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeasuredStream {
    pub response_id: String,
    pub client_port: u16,
    /// CLOCK_MONOTONIC ns of the client read that completed each token.
    pub client_read_ns: Vec<u64>,
    /// CLOCK_MONOTONIC ns at which the engine handed each token to the connection.
    pub engine_write_ns: Vec<u64>,
}

impl MeasuredStream {
    /// Gaps between consecutive tokens at the client.
    pub fn gaps_ns(&self) -> impl Iterator<Item = u64> + '_ {
        self.client_read_ns.windows(2).map(|w| w[1] - w[0])
    }

    /// Per token: client read minus engine hand-off.
    pub fn delays_ns(&self) -> impl Iterator<Item = u64> + '_ {
        self.client_read_ns
            .iter()
            .zip(&self.engine_write_ns)
            .map(|(r, w)| r.saturating_sub(*w))
    }
}

/// What a scenario measured.
#[derive(Debug, Clone)]
pub struct ScenarioOutcome {
    pub scenario: Scenario,
    /// One line: the set-up's key fact and what the client measured.
    pub summary: String,
    pub engine: SocketAddr,
    pub streams: Vec<MeasuredStream>,
    /// Segments the kernel retransmitted while the load ran, all sockets (RetransSegs).
    pub retransmits: Option<u64>,
    /// Segments the loss rule dropped (lossy only).
    pub dropped_segments: Option<u64>,
    /// The load's wall time.
    pub load_time: Duration,
    /// What the observer reported when the load finished.
    pub profile: Option<String>,
}

impl ScenarioOutcome {
    pub fn tokens(&self) -> usize {
        self.streams.iter().map(|s| s.client_read_ns.len()).sum()
    }

    /// Gaps between consecutive tokens of a stream at the client, all streams.
    pub fn gaps(&self) -> Summary {
        Summary::from_ns(self.streams.iter().flat_map(MeasuredStream::gaps_ns))
    }

    /// Client gaps in [lo_ms, hi_ms].
    pub fn gaps_between_ms(&self, lo_ms: f64, hi_ms: f64) -> usize {
        self.streams
            .iter()
            .flat_map(MeasuredStream::gaps_ns)
            .filter(|g| (lo_ms..=hi_ms).contains(&(*g as f64 / 1e6)))
            .count()
    }

    /// Engine hand-off to client read, all tokens.
    pub fn delays(&self) -> Summary {
        Summary::from_ns(self.streams.iter().flat_map(MeasuredStream::delays_ns))
    }

    /// The largest delay of a stream's last token, in ms.
    pub fn last_token_delay_ms(&self) -> f64 {
        self.streams
            .iter()
            .filter_map(|s| s.delays_ns().last())
            .max()
            .map_or(0.0, |ns| ns as f64 / 1e6)
    }

    /// The largest delay of a stream's first token, in ms.
    pub fn first_token_delay_ms(&self) -> f64 {
        self.streams
            .iter()
            .filter_map(|s| s.delays_ns().next())
            .max()
            .map_or(0.0, |ns| ns as f64 / 1e6)
    }

    pub(super) fn summarize(&self) -> String {
        let (gaps, delays) = (self.gaps(), self.delays());
        let head = format!(
            "{}: {} streams, {} tokens in {:.1} s",
            self.scenario,
            self.streams.len(),
            self.tokens(),
            self.load_time.as_secs_f64()
        );
        match self.scenario {
            Scenario::Nagle | Scenario::NagleFixed => format!(
                "{head}; {} of {} client gaps in 35-60 ms (p50 {:.1}, max {:.1} ms); \
                 engine->client delay max {:.1} ms",
                self.gaps_between_ms(35.0, 60.0),
                gaps.count,
                gaps.p50,
                gaps.max,
                delays.max
            ),
            Scenario::Lossy | Scenario::Lossless => format!(
                "{head}; {} segments dropped, {} retransmitted (kernel-wide); {} client gaps \
                 over 150 ms (p50 {:.1}, p99 {:.1}, max {:.1} ms)",
                self.dropped_segments.unwrap_or(0),
                self.retransmits
                    .map_or_else(|| "?".to_string(), |r| r.to_string()),
                self.gaps_between_ms(150.0, f64::INFINITY),
                gaps.p50,
                gaps.p99,
                gaps.max
            ),
            Scenario::SlowClient | Scenario::FastClient => format!(
                "{head}; engine->client delay first token {:.1} ms, p50 {:.1} ms, last token \
                 {:.1} ms",
                self.first_token_delay_ms(),
                delays.p50,
                self.last_token_delay_ms()
            ),
            // Summarised from the bench's report where they run (`run_lab_load`).
            _ => head,
        }
    }
}
