//! Service-level objectives: `ttft_p95=300ms`, `itl_p99=50ms`, checked against a
//! timeline's requests (TTFT and ITL read where the client-most observation point
//! saw tokens), each violated one listed with the diagnoses that would help it most.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

use super::{request_ttft, ttft_point, Diagnosis};
use crate::analyze::{Samples, Summary};
use crate::stitch::Request;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    Ttft,
    Itl,
    Tpot,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stat {
    P50,
    P90,
    P95,
    P99,
    P999,
    Max,
    Mean,
}

/// One objective: the metric's statistic stays at or under the limit.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Slo {
    pub metric: Metric,
    pub stat: Stat,
    pub limit_ns: u64,
    /// As written on the command line.
    pub text: String,
}

impl FromStr for Slo {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let usage = "expected METRIC_STAT=DURATION, e.g. ttft_p95=300ms or itl_p99=50ms \
                     (metrics: ttft, itl, tpot; stats: p50, p90, p95, p99, p999, max, mean; \
                     units: ns, us, ms, s)";
        let (name, value) = s.split_once('=').ok_or_else(|| format!("'{s}': {usage}"))?;
        let (metric, stat) = name
            .trim()
            .split_once('_')
            .ok_or_else(|| format!("'{s}': {usage}"))?;
        let metric = match metric.to_ascii_lowercase().as_str() {
            "ttft" => Metric::Ttft,
            "itl" => Metric::Itl,
            "tpot" => Metric::Tpot,
            other => return Err(format!("'{s}': unknown metric '{other}'; {usage}")),
        };
        let stat = match stat.to_ascii_lowercase().as_str() {
            "p50" => Stat::P50,
            "p90" => Stat::P90,
            "p95" => Stat::P95,
            "p99" => Stat::P99,
            "p999" => Stat::P999,
            "max" => Stat::Max,
            "mean" => Stat::Mean,
            other => return Err(format!("'{s}': unknown statistic '{other}'; {usage}")),
        };
        let limit =
            crate::duration::parse_latency(value).map_err(|e| format!("'{s}': {e}; {usage}"))?;
        Ok(Slo {
            metric,
            stat,
            limit_ns: u64::try_from(limit.as_nanos()).unwrap_or(u64::MAX),
            text: s.trim().to_string(),
        })
    }
}

impl fmt::Display for Slo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// An objective against what was measured.
#[derive(Clone, Debug, Serialize)]
pub struct SloResult {
    pub slo: Slo,
    /// None when the recording has no sample of the metric (counted as violated:
    /// a gate must not pass on no evidence).
    pub measured_ns: Option<u64>,
    pub samples: usize,
    pub met: bool,
    /// Rules (numbers) whose estimated saving on this metric is largest, first.
    pub top_diagnoses: Vec<u8>,
}

fn pick(s: &Summary, stat: Stat) -> u64 {
    match stat {
        Stat::P50 => s.p50_ns,
        Stat::P90 => s.p90_ns,
        Stat::P95 => s.p95_ns,
        Stat::P99 => s.p99_ns,
        Stat::P999 => s.p999_ns,
        Stat::Max => s.max_ns,
        Stat::Mean => s.mean_ns,
    }
}

pub fn samples(requests: &[Request], metric: Metric) -> Vec<u64> {
    match metric {
        Metric::Ttft => requests.iter().filter_map(request_ttft).collect(),
        Metric::Itl => requests
            .iter()
            .filter_map(ttft_point)
            .flat_map(|p| p.itl_ns())
            .collect(),
        Metric::Tpot => requests
            .iter()
            .filter_map(ttft_point)
            .map(|p| p.first_choice_ns())
            .filter(|t| t.len() > 1)
            .map(|t| (t[t.len() - 1] - t[0]) / (t.len() as u64 - 1))
            .collect(),
    }
}

pub fn check(slos: &[Slo], requests: &[Request], diagnoses: &[Diagnosis]) -> Vec<SloResult> {
    let mut c = Checker::new(slos);
    for r in requests {
        c.add(r);
    }
    c.finish(diagnoses)
}

/// The objectives checked against requests fed one at a time (each metric's samples in
/// bounded memory: see `analyze::Samples`).
pub struct Checker {
    slos: Vec<Slo>,
    samples: Vec<Samples>,
}

impl Checker {
    pub fn new(slos: &[Slo]) -> Checker {
        Checker {
            slos: slos.to_vec(),
            samples: vec![Samples::default(); slos.len()],
        }
    }

    pub fn add(&mut self, r: &Request) {
        for (slo, s) in self.slos.iter().zip(&mut self.samples) {
            s.extend(samples(std::slice::from_ref(r), slo.metric));
        }
    }

    /// Each objective, met or not, with the diagnoses that would help it most (a rule
    /// found in several windows counts once, by its largest saving).
    pub fn finish(&self, diagnoses: &[Diagnosis]) -> Vec<SloResult> {
        self.slos
            .iter()
            .zip(&self.samples)
            .map(|(slo, v)| {
                let measured = v.summary().map(|s| pick(&s, slo.stat));
                let met = measured.is_some_and(|m| m <= slo.limit_ns);
                let saving = |d: &Diagnosis| match slo.metric {
                    Metric::Ttft => d.saving.ttft_p95_ns.unwrap_or(0),
                    Metric::Itl | Metric::Tpot => d.saving.itl_p99_ns.unwrap_or(0),
                };
                let mut helpful: Vec<&Diagnosis> = diagnoses
                    .iter()
                    .filter(|d| saving(d) >= 1_000_000)
                    .collect();
                helpful.sort_by_key(|d| (std::cmp::Reverse(saving(d)), d.rule));
                let mut top: Vec<u8> = Vec::new();
                for d in helpful {
                    if top.len() < 3 && !top.contains(&d.rule) {
                        top.push(d.rule);
                    }
                }
                SloResult {
                    slo: slo.clone(),
                    measured_ns: measured,
                    samples: v.len(),
                    met,
                    top_diagnoses: if met { Vec::new() } else { top },
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_forms_an_sre_writes() {
        let s: Slo = "ttft_p95=300ms".parse().unwrap();
        assert_eq!(
            (s.metric, s.stat, s.limit_ns),
            (Metric::Ttft, Stat::P95, 300_000_000)
        );
        let s: Slo = "ITL_P99=0.05s".parse().unwrap();
        assert_eq!(
            (s.metric, s.stat, s.limit_ns),
            (Metric::Itl, Stat::P99, 50_000_000)
        );
        let s: Slo = "tpot_mean=1500us".parse().unwrap();
        assert_eq!(s.limit_ns, 1_500_000);
        for bad in [
            "ttft",
            "ttft_p95",
            "ttft_p95=300",
            "ttfb_p95=1ms",
            "ttft_p97=1ms",
            "ttft_p95=1h",
            "ttft_p95=x ms",
        ] {
            let e = bad.parse::<Slo>().unwrap_err();
            assert!(e.contains("ttft_p95=300ms"), "{bad}: {e}");
        }
    }
}
