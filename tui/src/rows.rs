//! What the screen shows, derived once per pass over the window: one
//! row per request, TTFT over time, the GPU summary (ITL per route: `routes`). Render
//! reads these and computes nothing heavy.

use std::collections::BTreeMap;
use std::sync::Arc;

use collector::analyze::summarize;
use collector::ingest::model::NvmlSample;
use collector::stitch::{PointKind, Request};

/// Identifies a request across passes (request ids are positions, which move).
/// Rows are copied out of the window every pass: their text is shared, not copied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowKey {
    pub client_addr: Arc<str>,
    pub first_byte_ns: u64,
}

/// By the time alone (a nanosecond time nearly never repeats in a window; equal keys
/// still hash the same): every pass maps every row's key, and hashing the address's
/// text was most of it.
impl std::hash::Hash for RowKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.first_byte_ns.hash(state);
    }
}

impl RowKey {
    pub fn of(r: &Request) -> RowKey {
        RowKey {
            client_addr: r.client_addr.as_str().into(),
            first_byte_ns: r.first_byte_ns,
        }
    }
}

/// One line of the request table.
#[derive(Clone, Debug)]
pub struct Row {
    pub key: RowKey,
    /// Index into `State::requests`.
    pub index: usize,
    pub start_ns: u64,
    pub route: Arc<str>,
    /// The streaming API (`openai-chat`, `anthropic`, ...; see `Request::api`).
    pub api: Option<&'static str>,
    /// `addr comm` of the client end.
    pub client: Arc<str>,
    pub status: Option<u32>,
    /// TTFT at the first point (the client's read when the client is traced).
    pub ttft_first_ns: Option<u64>,
    pub ttft_engine_ns: Option<u64>,
    /// ITL at the first point.
    pub itl_p50_ns: Option<u64>,
    pub itl_p99_ns: Option<u64>,
    pub tokens: usize,
    /// Decode rate at the first point: (tokens - 1) / (last - first token).
    pub tokens_per_s: Option<f64>,
    pub new_connection: bool,
    pub tls: bool,
    pub coalesced: bool,
    /// Some of its decode gaps at the engine waited on other requests' prefill.
    pub stalled: bool,
    /// One stream of an HTTP/2 connection (filterable as `http2`).
    pub http2: bool,
    /// No end of response yet (live: still streaming; replay: cut off).
    pub open: bool,
}

impl Row {
    pub fn from_request(index: usize, r: &Request) -> Row {
        let first = r.first_point();
        let gaps: Vec<u64> = first.map_or_else(Vec::new, |p| p.itl_ns());
        let itl = summarize(&gaps);
        let tokens = r.tokens();
        let tokens_per_s = first.and_then(|p| {
            let (a, b) = (p.token_ns.first()?, p.token_ns.last()?);
            (b > a).then(|| (p.token_ns.len() - 1) as f64 * 1e9 / (b - a) as f64)
        });
        Row {
            key: RowKey::of(r),
            index,
            start_ns: r.start_ns,
            route: r.route().into(),
            api: r.api,
            client: format!("{} {}", r.client_addr, r.client_comm).into(),
            status: r.status,
            ttft_first_ns: first.and_then(|p| p.ttft_ns),
            ttft_engine_ns: r.point(PointKind::EngineWrite).and_then(|p| p.ttft_ns),
            itl_p50_ns: itl.map(|s| s.p50_ns),
            itl_p99_ns: itl.map(|s| s.p99_ns),
            tokens,
            tokens_per_s,
            new_connection: r.new_connection,
            tls: r.tls,
            coalesced: r.coalesced,
            stalled: r.gpu.as_ref().is_some_and(|g| !g.stalled_by.is_empty()),
            http2: r.http2,
            open: r.truncated,
        }
    }

    /// Four columns: N(ew connection) T(LS) C(oalesced) S(talled); `·` when not.
    pub fn flags(&self) -> String {
        [
            (self.new_connection, 'N'),
            (self.tls, 'T'),
            (self.coalesced, 'C'),
            (self.stalled, 'S'),
        ]
        .iter()
        .map(|&(on, c)| if on { c } else { '·' })
        .collect()
    }

    /// Whether the (lower-case) filter text matches: route, API, client, status or a
    /// flag name.
    pub fn matches(&self, needle: &str) -> bool {
        if needle.is_empty() {
            return true;
        }
        let status = self.status.map_or_else(String::new, |s| s.to_string());
        let flag_words = [
            (self.new_connection, "new-conn"),
            (self.tls, "tls"),
            (self.coalesced, "coalesced"),
            (self.stalled, "stalled"),
            (self.http2, "http2"),
            (self.open, "open"),
        ];
        self.route.to_lowercase().contains(needle)
            || self.api.is_some_and(|a| a.contains(needle))
            || self.client.to_lowercase().contains(needle)
            || status.contains(needle)
            || flag_words
                .iter()
                .any(|(on, word)| *on && word.contains(needle))
    }
}

/// TTFT (first point) percentiles of the requests that started in one window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TtftWindow {
    pub start_ns: u64,
    pub count: usize,
    pub p50_ns: u64,
    pub p99_ns: u64,
}

pub fn ttft_over_time(rows: &[Row], width_ns: u64) -> Vec<TtftWindow> {
    let mut groups: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for r in rows {
        if let Some(t) = r.ttft_first_ns {
            groups
                .entry(r.start_ns / width_ns * width_ns)
                .or_default()
                .push(t);
        }
    }
    groups
        .into_iter()
        .filter_map(|(start_ns, v)| {
            let s = summarize(&v)?;
            Some(TtftWindow {
                start_ns,
                count: s.count,
                p50_ns: s.p50_ns,
                p99_ns: s.p99_ns,
            })
        })
        .collect()
}

/// The latest NVML reading of one device.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuReading {
    pub device: u32,
    pub ts_ns: u64,
    pub util_pct: Option<u32>,
    pub sm_clock_mhz: Option<u32>,
    pub mem_used_bytes: Option<u64>,
    pub power_mw: Option<u32>,
}

/// Latest NVML sample per device, if the recording has any.
pub fn latest_gpu<'a>(samples: impl IntoIterator<Item = &'a (u64, NvmlSample)>) -> Vec<GpuReading> {
    let mut latest: BTreeMap<u32, GpuReading> = BTreeMap::new();
    for (ts_ns, s) in samples {
        if latest.get(&s.device).is_some_and(|g| g.ts_ns > *ts_ns) {
            continue;
        }
        latest.insert(
            s.device,
            GpuReading {
                device: s.device,
                ts_ns: *ts_ns,
                util_pct: s.gpu_util_pct,
                sm_clock_mhz: s.sm_clock_mhz,
                mem_used_bytes: s.mem_used_bytes,
                power_mw: s.power_mw,
            },
        );
    }
    latest.into_values().collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn filter_matches_route_status_and_flag_names() {
        let mut r = bare_request();
        r.status = Some(200);
        r.coalesced = true;
        let row = Row::from_request(0, &r);
        assert!(row.matches("completions"), "route");
        assert!(row.matches("200"), "status");
        assert!(row.matches("coal"), "flag name");
        assert!(!row.matches("stalled"), "a flag it does not have");
        assert_eq!(row.flags(), "··C·");
    }

    pub(crate) fn bare_request() -> Request {
        Request::at_point(0, PointKind::ClientRead, 1, "bench", Vec::new())
    }
}
