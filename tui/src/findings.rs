//! GPU shares and diagnoses of the window: the costly part of a pass (attribution and
//! the report's rules run over every request and GPU step held; at 3k tokens/s with a
//! 60 s window, a few ms each). Made at most once a second and no more often than
//! `COST_FACTOR` times their own last cost, so they take at most 1/COST_FACTOR of a
//! core whatever the load (a dearer making waits longer; the diagnoses panel says how
//! old they are). Between makings each pass shows the last one's, its request
//! ids (the pipeline's) numbered as the pass's positions by request key; a request
//! newer than the last making gets its share at the next.

use std::sync::Arc;

use collector::diagnose::{self, Diagnosis};
use collector::gpu::GpuStep;
use collector::ingest::fast_hash::FastMap;
use collector::ingest::model::NvmlSample;
use collector::stitch::attribution::{self, GpuShare};
use collector::stitch::Request;

use crate::rows::RowKey;

const SECOND_NS: u64 = 1_000_000_000;
/// A making waits at least this many times its own cost: at most 0.5% of a core.
pub const COST_FACTOR: u64 = 200;

/// What the screen shows of a request's GPU share (`GpuShare` lists every stalled
/// gap with its culprits: tens of MB over a busy window, kept only this summed).
#[derive(Clone, Debug, PartialEq)]
pub struct Share {
    pub queue_ns: Option<u64>,
    pub prefill_steps: u32,
    pub prefill_ns: u64,
    pub decode_steps: u32,
    /// Decode gaps at the engine that other prompts' prefill stalled, the longest.
    pub stalls: usize,
    pub worst_stall_ns: u64,
    /// The requests whose prefill stalled it, by id, once each in id order.
    pub stalled_by: Vec<usize>,
}

impl Share {
    fn of(g: &GpuShare) -> Share {
        let mut stalled_by: Vec<usize> = g
            .stalled_by
            .iter()
            .flat_map(|s| s.requests.iter().copied())
            .collect();
        stalled_by.sort_unstable();
        stalled_by.dedup();
        // Kept a window long for every request: its room was every stall's culprits
        // before the dedup (a tenth of it used, 2.8 MB of top's peak).
        stalled_by.shrink_to_fit();
        Share {
            queue_ns: g.queue_ns,
            prefill_steps: g.prefill_steps,
            prefill_ns: g.prefill_ns,
            decode_steps: g.decode_steps,
            stalls: g.stalled_by.len(),
            worst_stall_ns: g.stalled_by.iter().map(|s| s.gap_ns).max().unwrap_or(0),
            stalled_by,
        }
    }
}

/// One making: request ids in it are the pipeline's (`Request::id`).
#[derive(Debug, Default)]
pub struct Made {
    /// Id -> request.
    keys: FastMap<usize, RowKey>,
    shares: FastMap<RowKey, Share>,
    /// Ids of the requests with a stalled gap (`Share::stalls`).
    stalled: Vec<usize>,
    /// Largest saving first.
    diagnoses: Vec<Diagnosis>,
    /// Wall time it was made at.
    wall_ns: u64,
}

pub struct Findings {
    made: Arc<Made>,
    made_wall_ns: Option<u64>,
    cost_ns: u64,
    /// The least time between makings.
    pub every_ns: u64,
}

impl Default for Findings {
    fn default() -> Findings {
        Findings {
            made: Arc::default(),
            made_wall_ns: None,
            cost_ns: 0,
            every_ns: SECOND_NS,
        }
    }
}

impl Findings {
    /// Whether a making is due at `wall_ns` (see the module doc).
    pub fn due(&self, wall_ns: u64) -> bool {
        self.made_wall_ns.is_none_or(|last| {
            wall_ns.saturating_sub(last) >= self.every_ns.max(self.cost_ns * COST_FACTOR)
        })
    }

    /// The next pass makes them again, whatever the time (the source ended).
    pub fn expire(&mut self) {
        self.made_wall_ns = None;
    }

    /// Joins `steps` to `requests` and runs the rules. The one clock read in the
    /// analysis: its cost sets when the next making is due. The rules read the window's
    /// requests where they are, GPU shares beside them (`diagnose::Input::shares`): no
    /// copy of the window (its token vectors were 12 MB at a peak of top's memory).
    pub fn make(
        &mut self,
        requests: &[Arc<Request>],
        keys: impl Iterator<Item = RowKey>,
        steps: &mut [GpuStep],
        nvml: &[(u64, NvmlSample)],
        wall_ns: u64,
    ) {
        let started = std::time::Instant::now();
        let requests: Vec<&Request> = requests.iter().map(|r| &**r).collect();
        let gpu = attribution::shares(&requests, steps);
        let row_keys: Vec<RowKey> = keys.collect();
        debug_assert_eq!(row_keys.len(), requests.len(), "a key per request");
        let shares = row_keys
            .iter()
            .zip(&gpu)
            .filter_map(|(k, g)| Some((k.clone(), Share::of(g.as_ref()?))))
            .collect();
        let keys = requests.iter().map(|r| r.id).zip(row_keys).collect();
        let stalled = requests
            .iter()
            .zip(&gpu)
            .filter(|(_, g)| g.as_ref().is_some_and(|g| !g.stalled_by.is_empty()))
            .map(|(r, _)| r.id)
            .collect();
        let diagnoses = diagnose::diagnose(&diagnose::Input {
            requests,
            steps,
            nvml,
            shares: &gpu,
        });
        self.made = Arc::new(Made {
            keys,
            shares,
            stalled,
            diagnoses,
            wall_ns,
        });
        self.made_wall_ns = Some(wall_ns);
        self.cost_ns = started.elapsed().as_nanos() as u64;
    }

    /// The last making as a pass at `wall_ns` shows it: `position` numbers the pass's
    /// requests.
    pub fn shown(&self, position: &FastMap<&RowKey, usize>, wall_ns: u64) -> Shown {
        Shown {
            age_ns: wall_ns.saturating_sub(self.made.wall_ns),
            now: self
                .made
                .keys
                .iter()
                .filter_map(|(&id, k)| Some((id, *position.get(k)?)))
                .collect(),
            made: Arc::clone(&self.made),
        }
    }
}

/// The last making, shared with the snapshots that show it, and its ids renumbered.
#[derive(Clone, Debug, Default)]
pub struct Shown {
    made: Arc<Made>,
    /// Id at the making -> position in this pass (absent: gone from the window).
    now: FastMap<usize, usize>,
    /// How long before the pass the making was made.
    pub age_ns: u64,
}

impl Shown {
    fn renumber(&self, ids: &[usize]) -> Vec<usize> {
        ids.iter()
            .filter_map(|id| self.now.get(id).copied())
            .collect()
    }

    /// Where this pass has the requests some of whose decode gaps waited on other
    /// requests' prefill: found by id (hashing each row's key into the shares, every
    /// pass, was 1.7% of top's samples).
    pub fn stalled_rows(&self) -> impl Iterator<Item = usize> + '_ {
        self.made
            .stalled
            .iter()
            .filter_map(|id| self.now.get(id).copied())
    }

    /// The request's GPU share, the requests that stalled it numbered as now.
    pub fn share(&self, key: &RowKey) -> Option<Share> {
        let mut share = self.made.shares.get(key)?.clone();
        share.stalled_by = self.renumber(&share.stalled_by);
        share.stalled_by.sort_unstable();
        Some(share)
    }

    /// The diagnoses, citing requests as numbered now (those gone no more).
    pub fn diagnoses(&self) -> Vec<Diagnosis> {
        self.made
            .diagnoses
            .iter()
            .map(|d| {
                let mut d = d.clone();
                d.evidence.request_ids = self.renumber(&d.evidence.request_ids);
                d
            })
            .collect()
    }
}
