//! Who held a token on a socket hop: the reading process, when it left another
//! stream's data unread meanwhile (rule 7 counts only the sender's holds).

use std::collections::HashMap;

use crate::stitch::request::Forward;
use crate::stitch::{PointKind, Request};

/// Every token each process read on a socket hop: when it was sent and read, and whose.
/// A token held on its way to a reader that meanwhile left another stream's token
/// unread (sent before the hold began, read after it ended) was held by the reader, not
/// by Nagle: a process whose event loop is busy (a CPU-bound gateway) reads every
/// socket late at once, where a held segment delays one connection.
pub(super) struct Readers {
    /// Reader pid -> its tokens sorted by send time, each with the latest read so far.
    by_pid: HashMap<u32, Vec<SoFar>>,
}

/// A token's send time, and of the tokens sent until then the latest read (time,
/// request) and the latest read of another request than that one's.
type SoFar = (u64, (u64, usize), (u64, usize));

impl Readers {
    /// The tokens of the readers `wanted` picks.
    #[cfg(test)]
    pub(super) fn of(reqs: &[&Request], wanted: impl Fn(u32) -> bool) -> Readers {
        Readers::without(reqs, wanted, &HashMap::new())
    }

    /// The same, leaving out each request's tokens sent within its `held` windows (the
    /// sender held them: they were never waiting at the reader, so they say nothing of
    /// its being busy; a process that reads many Nagle-held streams at once would
    /// otherwise look busy to each).
    pub(super) fn without(
        reqs: &[&Request],
        wanted: impl Fn(u32) -> bool,
        held: &HashMap<usize, Vec<(u64, u64)>>,
    ) -> Readers {
        let none = Vec::new();
        let mut tokens: HashMap<u32, Vec<(u64, u64, usize)>> = HashMap::new();
        for (i, r) in reqs.iter().enumerate() {
            for hop in socket_hops(r) {
                let Some(p) = r.points.get(hop.to_point).filter(|p| wanted(p.pid)) else {
                    continue;
                };
                let v = tokens.entry(p.pid).or_default();
                let windows = held.get(&i).unwrap_or(&none);
                for (&read, d) in p.token_ns.iter().zip(hop.delays(&r.points)) {
                    let sent = read.saturating_sub(d);
                    if !windows.iter().any(|&(a, b)| sent >= a && sent <= b) {
                        v.push((sent, read, i));
                    }
                }
            }
        }
        let by_pid = tokens
            .into_iter()
            .map(|(pid, mut v)| {
                v.sort_unstable();
                let (mut best, mut second) = ((0, usize::MAX), (0, usize::MAX));
                let prefix = v
                    .into_iter()
                    .map(|(sent, read, i)| {
                        if read > best.0 {
                            if best.1 != i {
                                second = best;
                            }
                            best = (read, i);
                        } else if read > second.0 && best.1 != i {
                            second = (read, i);
                        }
                        (sent, best, second)
                    })
                    .collect();
                (pid, prefix)
            })
            .collect();
        Readers { by_pid }
    }

    /// `pid` had a token of a request other than `own` waiting through `(from, to)`.
    pub(super) fn sat_on_other_data(&self, pid: u32, own: usize, (from, to): (u64, u64)) -> bool {
        let Some(v) = self.by_pid.get(&pid) else {
            return false;
        };
        let k = v.partition_point(|t| t.0 < from);
        let Some(&(_, best, second)) = k.checked_sub(1).and_then(|k| v.get(k)) else {
            return false;
        };
        let latest_other = if best.1 != own { best.0 } else { second.0 };
        latest_other >= to
    }
}

/// The TCP hops of a request: sender's write -> receiver's read of the same tokens.
pub(super) fn socket_hops(r: &Request) -> impl Iterator<Item = &Forward> {
    r.forward.iter().filter(|f| {
        matches!(
            (f.from, f.to),
            (PointKind::EngineWrite, PointKind::ProxyRead)
                | (PointKind::ProxyWrite, PointKind::ClientRead)
                | (PointKind::EngineWrite, PointKind::ClientRead)
        )
    })
}
