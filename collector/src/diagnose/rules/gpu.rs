//! Rule 10, read from NVML samples taken while the engine ran steps.

use std::collections::BTreeMap;

use super::{fig, fix, median, Draft};
use crate::diagnose::{ttft_point, Finding, Input};
use crate::ingest::model::NvmlSample;

/// NVML clock-throttle reasons that slow a busy GPU: SW power cap, HW slowdown,
/// SW thermal, HW thermal, HW power brake (nvmlClocksThrottleReason*).
const THROTTLE_MASK: u64 = 0x4 | 0x8 | 0x20 | 0x40 | 0x80;

/// Rule 10: NVML samples taken while the engine ran steps show clock throttling
/// (power or thermal) or low utilisation.
pub(super) fn gpu_throttled(input: &Input) -> Option<Finding> {
    let seen = Throttling::during_steps(input)?;
    let GapCuts {
        fastest,
        itl,
        weights,
    } = throttled_gap_cuts(input);
    let basis = if itl.is_empty() {
        "not estimated: the recording never saw this GPU run faster, and NVML does not say \
         how fast an unthrottled step would be"
    } else {
        "token gaps that ended while throttled shrink with the SM clock (compute-bound steps; \
         the fastest clock in the recording as the unthrottled one)"
    };
    let mut d = Draft {
        rule: 10,
        requests: &input.requests,
        weights: &weights,
        finding: seen.finding(),
        figures: vec![
            fig("samples during steps", seen.during.len() as f64, "samples"),
            fig("throttled samples", seen.throttled as f64, "samples"),
            fig("GPU utilisation p50", median(&seen.utils) as f64, "%"),
            fig("SM clock p50", median(&seen.clocks) as f64, "MHz"),
            fig("fastest SM clock seen", f64::from(fastest), "MHz"),
        ],
        basis,
        fix: vec![fix(
            "host",
            &[
                "nvidia-smi -q -d PERFORMANCE  # which throttle reason is active",
                "check cooling and the power limit (nvidia-smi -q -d POWER); low utilisation: the \
                 engine is host-bound (scheduling, tokenisation, a small batch)",
            ],
        )],
    }
    .diagnosis();
    // The evidence is the samples: their span, on the GPU they came from.
    let during = &seen.during;
    d.scope = format!("GPU {}", during[0].1.device);
    d.evidence.start_ns = during.first().map_or(0, |s| s.0);
    d.evidence.end_ns = during.last().map_or(0, |s| s.0);
    Some(Finding::itl_only(d, itl))
}

/// The NVML samples taken while the engine ran steps, and what they show.
struct Throttling<'a> {
    during: Vec<&'a (u64, NvmlSample)>,
    /// Samples with a throttle reason set, and the reasons' names.
    throttled: usize,
    reasons: Vec<&'static str>,
    utils: Vec<u64>,
    clocks: Vec<u64>,
}

impl<'a> Throttling<'a> {
    /// None unless at least 5 samples fell during steps and a fifth of them were
    /// throttled, or utilisation stayed under half.
    fn during_steps(input: &Input<'a>) -> Option<Throttling<'a>> {
        if input.steps.is_empty() || input.nvml.is_empty() {
            return None;
        }
        let running = |t: u64| {
            let k = input.steps.partition_point(|s| s.start_ns <= t);
            input.steps[..k].iter().rev().take(8).any(|s| s.end_ns >= t)
        };
        let during: Vec<&(u64, NvmlSample)> =
            input.nvml.iter().filter(|(t, _)| running(*t)).collect();
        if during.len() < 5 {
            return None;
        }
        let mut throttled = 0;
        let mut bits = 0u64;
        for (_, s) in &during {
            let r = s.throttle_reasons.unwrap_or(0) & THROTTLE_MASK;
            throttled += usize::from(r != 0);
            bits |= r;
        }
        let utils: Vec<u64> = during
            .iter()
            .filter_map(|(_, s)| s.gpu_util_pct.map(u64::from))
            .collect();
        let low_util = !utils.is_empty() && median(&utils) < 50;
        if throttled * 5 < during.len() && !low_util {
            return None;
        }
        let reasons = [
            (0x4, "SW power cap"),
            (0x8, "HW slowdown"),
            (0x20, "SW thermal"),
            (0x40, "HW thermal"),
            (0x80, "HW power brake"),
        ]
        .iter()
        .filter(|(bit, _)| bits & bit != 0)
        .map(|(_, n)| *n)
        .collect();
        let clocks = during
            .iter()
            .filter_map(|(_, s)| s.sm_clock_mhz.map(u64::from))
            .collect();
        Some(Throttling {
            during,
            throttled,
            reasons,
            utils,
            clocks,
        })
    }

    fn finding(&self) -> String {
        if self.throttled * 5 >= self.during.len() {
            format!(
                "{} of {} NVML samples taken during GPU steps show clock throttling ({}); SM clock p50 {} MHz",
                self.throttled,
                self.during.len(),
                self.reasons.join(", "),
                median(&self.clocks)
            )
        } else {
            format!(
                "GPU utilisation is {}% (p50) while the engine runs steps: the GPU waits on the host",
                median(&self.utils)
            )
        }
    }
}

/// How much shorter token gaps would have been unthrottled.
struct GapCuts {
    /// The fastest SM clock in the recording, taken as the unthrottled one.
    fastest: u32,
    /// ns cut per (request, gap), and per request.
    itl: BTreeMap<(usize, usize), i64>,
    weights: BTreeMap<usize, u64>,
}

/// Estimate, when the recording also saw the GPU faster: a compute-bound step scales
/// with the SM clock, so a token gap that ended while a throttled sample held shrinks
/// by 1 - clock / the fastest clock seen.
fn throttled_gap_cuts(input: &Input) -> GapCuts {
    let fastest = input
        .nvml
        .iter()
        .filter_map(|(_, s)| s.sm_clock_mhz)
        .max()
        .unwrap_or(0);
    let slowed = |t: u64| -> f64 {
        let k = input.nvml.partition_point(|(ts, _)| *ts <= t);
        let Some((_, s)) = k.checked_sub(1).map(|k| &input.nvml[k]) else {
            return 0.0;
        };
        match s.sm_clock_mhz {
            Some(c) if s.throttle_reasons.unwrap_or(0) & THROTTLE_MASK != 0 && fastest > 0 => {
                1.0 - f64::from(c) / f64::from(fastest)
            }
            _ => 0.0,
        }
    };
    let mut itl = BTreeMap::new();
    let mut weights = BTreeMap::new();
    for (i, r) in input.requests.iter().enumerate() {
        let Some(p) = ttft_point(r) else { continue };
        for (k, w) in p.token_ns.windows(2).enumerate() {
            let f = slowed(w[1]);
            if f > 0.0 {
                let cut = ((w[1] - w[0]) as f64 * f) as i64;
                itl.insert((i, k), cut);
                *weights.entry(i).or_insert(0u64) += cut as u64;
            }
        }
    }
    GapCuts {
        fastest,
        itl,
        weights,
    }
}
