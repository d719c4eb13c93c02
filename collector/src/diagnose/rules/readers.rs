//! Who held a token on a socket hop: the reading process, when it left another
//! stream's data unread meanwhile (rule 7 counts only the sender's holds).

use std::collections::HashMap;

use super::network::socket_hops;
use crate::stitch::Request;

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
    pub(super) fn of(reqs: &[Request]) -> Readers {
        let mut tokens: HashMap<u32, Vec<(u64, u64, usize)>> = HashMap::new();
        for (i, r) in reqs.iter().enumerate() {
            for hop in socket_hops(r) {
                let Some(p) = r.point(hop.to) else { continue };
                let v = tokens.entry(p.pid).or_default();
                for (&read, &d) in p.token_ns.iter().zip(&hop.delay_ns) {
                    v.push((read.saturating_sub(d), read, i));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnose::rules::network::nagle;
    use crate::diagnose::Input;
    use crate::stitch::request::Forward;
    use crate::stitch::{PointKind, Request};

    const MS: u64 = 1_000_000;

    /// A stream read by process 7: tokens sent at `sent`, each crossing the hop in `delay`.
    fn stream(id: usize, sent: &[u64], delay: &[u64]) -> Request {
        let read: Vec<u64> = sent.iter().zip(delay).map(|(s, d)| s + d).collect();
        let mut r = Request::at_point(id, PointKind::ClientRead, 7, "reader", read);
        r.forward.push(Forward {
            from: PointKind::EngineWrite,
            to: PointKind::ClientRead,
            delay_ns: delay.to_vec(),
        });
        r
    }

    /// 64 tokens 16 ms apart crossing in 0.2 ms, every 8th held 40 ms (a delayed ACK),
    /// the next two read with it (TCP delivers in order).
    fn held_stream() -> (Vec<u64>, Request) {
        let sent: Vec<u64> = (0..64).map(|k| 1_000 * MS + k * 16 * MS).collect();
        let delay: Vec<u64> = (0..64u64)
            .map(|k| match k % 8 {
                _ if k < 8 => MS / 5,
                0 => 40 * MS,
                1 => 24 * MS,
                2 => 8 * MS,
                _ => MS / 5,
            })
            .collect();
        let r = stream(0, &sent, &delay);
        (sent, r)
    }

    fn input(requests: &[Request]) -> Input<'_> {
        Input {
            requests,
            steps: &[],
            nvml: &[],
        }
    }

    #[test]
    fn held_segments_are_nagle_unless_the_reader_sat_on_another_streams_data() {
        let (sent, a) = held_stream();
        let alone = [a.clone()];
        let f = nagle(&input(&alone)).expect("a stream with 7 held tokens and nothing else");
        assert_eq!(f.diagnosis.evidence.figures[0].value, 7.0);

        // The same reader had another stream's token waiting through each hold: it was
        // busy (an event loop that reads every socket late), not held by the sender.
        let waiting: Vec<u64> = (1..8).map(|h| sent[h * 8] - MS).collect();
        let b = stream(1, &waiting, &vec![42 * MS; waiting.len()]);
        let busy = [a.clone(), b];
        assert!(nagle(&input(&busy)).is_none(), "a busy reader is not Nagle");
        let readers = Readers::of(&busy);
        let (from, to) = (sent[8], sent[8] + 40 * MS);
        assert!(readers.sat_on_other_data(7, 0, (from, to)));
        assert!(
            !readers.sat_on_other_data(7, 1, (from, to)),
            "not its own data"
        );
        assert!(
            !readers.sat_on_other_data(8, 0, (from, to)),
            "another reader"
        );

        // Another stream the reader read promptly does not excuse the hold.
        let prompt = stream(1, &waiting, &vec![MS / 5; waiting.len()]);
        assert!(nagle(&input(&[a, prompt])).is_some());
    }
}
