//! Rule 13: engine slot saturation, seen from sockets alone. Engines with a fixed number
//! of sequence slots (llama.cpp `-np N`, vLLM `--max-num-seqs`, TGI
//! `--max-concurrent-requests`) make the next request wait until a running one
//! finishes. With no GPU source there are no steps to show the queue (rule 6), but the
//! engine's writes do: it never streams more than N responses at once, and a waiting
//! request's first token follows another stream's last. When the engine has GPU steps,
//! rule 6 reads the queue from them and this rule stays silent.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::{fig, fix, median, ms, Draft, MIN_EVIDENCE};
use crate::diagnose::{Finding, Input};
use crate::stitch::PointKind;

/// Shortest wait for a slot worth a finding.
const WAIT_NS: u64 = 50_000_000;

/// One request as the engine served it.
#[derive(Clone, Copy)]
struct Stream {
    index: usize,
    /// The engine had the whole request.
    arrived_ns: u64,
    /// The engine's first and last token writes.
    first_ns: u64,
    last_ns: u64,
}

pub(super) fn slot_saturation(input: &Input) -> Option<Finding> {
    let timed: HashSet<u32> = input.steps.iter().map(|s| s.pid).collect();
    let mut by_engine: HashMap<u32, Vec<Stream>> = HashMap::new();
    for (index, r) in input.requests.iter().enumerate() {
        let Some(engine) = r.point(PointKind::EngineWrite) else {
            continue;
        };
        let (Some(&first_ns), Some(&last_ns), Some(arrived_ns)) = (
            engine.token_ns.first(),
            engine.token_ns.last(),
            r.engine_received_ns,
        ) else {
            continue;
        };
        if timed.contains(&engine.pid) || first_ns < arrived_ns {
            continue; // a GPU source times this engine's queue: rule 6
        }
        by_engine.entry(engine.pid).or_default().push(Stream {
            index,
            arrived_ns,
            first_ns,
            last_ns,
        });
    }
    // The engine with the most waiting (one finding per recording, as the other rules).
    let (ceiling, waits) = by_engine
        .values()
        .filter_map(|streams| waiting(streams))
        .max_by_key(|(_, w)| w.values().sum::<u64>())?;
    let reqs = &input.requests[..];
    if waits.len() < MIN_EVIDENCE || waits.len() * 10 < reqs.len() {
        return None;
    }
    let values: Vec<u64> = waits.values().copied().collect();
    let finding = format!(
        "{} requests waited {} ms (p50) for a free slot: the engine never streamed more than \
         {ceiling} responses at once, and each waiting request's first token followed another \
         stream's last",
        waits.len(),
        ms(median(&values))
    );
    let d = Draft {
        rule: 13,
        requests: reqs,
        weights: &waits,
        finding,
        figures: vec![
            fig("streams at once (most)", ceiling as f64, "streams"),
            fig("requests waiting", waits.len() as f64, "requests"),
            fig("wait p50", ms(median(&values)), "ms"),
        ],
        basis: "each waiting request would get a slot on arrival (its wait until another stream \
                ended goes; its own prefill stays)",
        fix: vec![
            fix(
                "llama.cpp",
                &["--parallel N (-np N): more slots (each gets ctx-size / N of the context)"],
            ),
            fix(
                "vLLM",
                &["--max-num-seqs (more sequences at once, if KV memory allows)"],
            ),
            fix(
                "TGI",
                &["--max-concurrent-requests, --max-batch-total-tokens"],
            ),
            fix("SGLang", &["--max-running-requests"]),
            fix("any", &["more replicas behind the proxy"]),
        ],
    }
    .diagnosis();
    Some(Finding {
        diagnosis: d,
        ttft: waits,
        ttft_added: BTreeMap::new(),
        itl: BTreeMap::new(),
        instead: None,
    })
}

/// One engine's streams: its ceiling (most streams at once), and the requests that waited
/// for a slot with how long (from arrival to the end of the stream whose slot they took).
///
/// A request waited when, between its arrival and its first token, the engine streamed
/// as many responses as it ever did (the ceiling was reached without it), and its first
/// token came within a start-up of another stream's end (it took that stream's slot).
fn waiting(streams: &[Stream]) -> Option<(usize, BTreeMap<usize, u64>)> {
    // Streams at once: +1 at a first token, -1 just after a last (ends first at a tie).
    let mut edges: Vec<(u64, i32)> = streams
        .iter()
        .flat_map(|s| [(s.first_ns, 1), (s.last_ns.saturating_add(1), -1)])
        .collect();
    edges.sort_unstable_by_key(|&(t, d)| (t, d));
    let levels: Vec<i32> = edges
        .iter()
        .scan(0, |level, (_, d)| {
            *level += d;
            Some(*level)
        })
        .collect();
    let ceiling = levels.iter().copied().max().filter(|&c| c > 0)?;
    // The most streams at once during [from, to).
    let most_during = |from: u64, to: u64| -> i32 {
        let start = edges.partition_point(|&(t, _)| t <= from);
        let at_from = start.checked_sub(1).map_or(0, |k| levels[k]);
        let end = edges.partition_point(|&(t, _)| t < to);
        levels[start..end.max(start)]
            .iter()
            .copied()
            .fold(at_from, i32::max)
    };
    let saturated: Vec<bool> = streams
        .iter()
        .map(|s| most_during(s.arrived_ns, s.first_ns) >= ceiling)
        .collect();
    // From a free slot to the first token: the engine's TTFT for requests that found one.
    let free: Vec<u64> = streams
        .iter()
        .zip(&saturated)
        .filter(|(_, &sat)| !sat)
        .map(|(s, _)| s.first_ns - s.arrived_ns)
        .collect();
    if free.is_empty() {
        return None;
    }
    let start_up = median(&free);
    // Out of slots, the requests that found none take far longer to their first token
    // than those that found one. An engine busy with prefill work (not out of slots)
    // gives every request about the same long TTFT, however long since another stream
    // ended: no wait for a slot there.
    let crowded: Vec<u64> = streams
        .iter()
        .zip(&saturated)
        .filter(|(_, &sat)| sat)
        .map(|(s, _)| s.first_ns - s.arrived_ns)
        .collect();
    if crowded.is_empty() || median(&crowded) < start_up.saturating_mul(2) {
        return Some((usize::try_from(ceiling).ok()?, BTreeMap::new()));
    }
    let mut ends: Vec<u64> = streams.iter().map(|s| s.last_ns).collect();
    ends.sort_unstable();
    let mut waits = BTreeMap::new();
    for (s, _) in streams.iter().zip(&saturated).filter(|(_, &sat)| sat) {
        // The last stream to end before this one's first token: the slot it took.
        let before = ends.partition_point(|&e| e < s.first_ns);
        let Some(&freed) = before.checked_sub(1).map(|i| &ends[i]) else {
            continue;
        };
        let wait = freed.saturating_sub(s.arrived_ns);
        if freed > s.arrived_ns
            && s.first_ns - freed <= start_up.saturating_mul(2).max(WAIT_NS / 5)
            && wait >= WAIT_NS
        {
            waits.insert(s.index, wait);
        }
    }
    Some((usize::try_from(ceiling).ok()?, waits))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn stream(index: usize, arrived_ms: u64, first_ms: u64, last_ms: u64) -> Stream {
        Stream {
            index,
            arrived_ns: arrived_ms * MS,
            first_ns: first_ms * MS,
            last_ns: last_ms * MS,
        }
    }

    #[test]
    fn two_slots_and_six_streams_wait_in_two_rounds() {
        // All six arrive at 0; prefill 20 ms, 500 ms of tokens; two at a time.
        let streams: Vec<Stream> = (0..6)
            .map(|i| {
                let round = i as u64 / 2;
                let start = round * 520;
                stream(i, 0, start + 20, start + 520)
            })
            .collect();
        let (ceiling, waits) = waiting(&streams).expect("an engine");
        assert_eq!(ceiling, 2);
        assert_eq!(
            waits.iter().map(|(&i, &w)| (i, w / MS)).collect::<Vec<_>>(),
            [(2, 520), (3, 520), (4, 1040), (5, 1040)],
            "the last four waited for the streams before them to end"
        );
    }

    #[test]
    fn enough_slots_or_a_closed_loop_load_is_no_wait() {
        // Six slots, six streams at once.
        let streams: Vec<Stream> = (0..6).map(|i| stream(i, 0, 20, 520)).collect();
        assert!(waiting(&streams).expect("an engine").1.is_empty());
        // A closed loop of two clients: each next request arrives after one ended.
        let streams: Vec<Stream> = (0..6)
            .map(|i| {
                let start = (i as u64 / 2) * 530;
                stream(i, start, start + 20, start + 520)
            })
            .collect();
        assert!(waiting(&streams).expect("an engine").1.is_empty());
    }

    #[test]
    fn an_engine_busy_with_prefill_is_not_out_of_slots() {
        // Eight clients in a closed loop on an engine whose prefill work queues: every
        // request takes 600 ms to its first token, whenever others end, and streams for
        // 770 ms, so no more than five stream at once (the lab engine's 40-token
        // chunked-prefill budget under 8 streams).
        let mut streams = Vec::new();
        for c in 0..8u64 {
            let mut t = c * 171;
            for _ in 0..6 {
                streams.push(stream(streams.len(), t, t + 600, t + 1370));
                t += 1370;
            }
        }
        let (ceiling, waits) = waiting(&streams).expect("an engine");
        assert!(ceiling < 8, "fewer stream at once than clients: {ceiling}");
        assert!(waits.is_empty(), "no slot wait: {waits:?}");
    }
}
