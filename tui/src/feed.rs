//! Where events come from: a recording replayed on its own clock, or a live
//! recording (`collector::record::live::Live`) on a thread that is always stopped
//! (probes detached) before top returns, panics included.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::path::PathBuf;

use collector::ingest::hosts::Joined;
use collector::ingest::record::{FileHeader, ReadAhead, RecordError, RecordReader, Source};
use collector::ingest::Event;
pub use collector::record::live::Live;

use crate::state::Meta;

/// A recording played back, read as it plays: events are due when their time is at
/// most the replay position. Memory holds what was read ahead (`LOOKAHEAD_NS` of
/// events past the position), not the recording: an hour at thousands of tokens per
/// second is tens of millions of events, which `top --replay` held whole (and copied
/// once more at `--speed 0`) before.
pub struct Replay {
    pub header: FileHeader,
    reader: Box<dyn Source + Send>,
    /// Read and not yet handed out, earliest first.
    ahead: BinaryHeap<Reverse<Ahead>>,
    /// Arrival numbers: equal times go in file order.
    seq: u64,
    /// The latest event time read.
    read_ns: u64,
    /// The reader has nothing more (its end, or `error`).
    drained: bool,
    /// Why reading stopped early, once every event before it was handed out.
    error: Option<RecordError>,
    /// Event time of the replay's first event, and the latest handed out (the last
    /// event's once `finished`).
    pub first_ns: u64,
    pub last_ns: u64,
}

/// Events are written in the order the recorder drained them: per-CPU buffers, so a
/// little out of time order. An event is handed out once events this much later were
/// read (the pipeline's own reorder window for replays, `Config::replay`), in time order.
const LOOKAHEAD_NS: u64 = 1_000_000_000;

struct Ahead {
    ts_ns: u64,
    seq: u64,
    event: Event,
}

impl PartialEq for Ahead {
    fn eq(&self, other: &Ahead) -> bool {
        (self.ts_ns, self.seq) == (other.ts_ns, other.seq)
    }
}

impl Eq for Ahead {}

impl PartialOrd for Ahead {
    fn partial_cmp(&self, other: &Ahead) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Ahead {
    fn cmp(&self, other: &Ahead) -> std::cmp::Ordering {
        (self.ts_ns, self.seq).cmp(&(other.ts_ns, other.seq))
    }
}

impl Replay {
    /// One recording, or several hosts' joined on the first one's clock. A recording
    /// that cannot be read from its start fails here; one damaged further on plays up
    /// to the damage (`error`).
    pub fn open(paths: &[PathBuf]) -> anyhow::Result<Replay> {
        let source: Box<dyn Source + Send> = match paths {
            [one] => Box::new(RecordReader::open(one)?),
            _ => Box::new(Joined::open(paths)?),
        };
        // Decoded on its own thread a few frames ahead (`--speed 0` plays at the
        // pipeline's rate, not the pipeline's plus decoding's).
        let reader: Box<dyn Source + Send> = Box::new(ReadAhead::spawn(source)?);
        let header = reader.header().clone();
        let mut replay = Replay {
            header,
            reader,
            ahead: BinaryHeap::new(),
            seq: 0,
            read_ns: 0,
            drained: false,
            error: None,
            first_ns: 0,
            last_ns: 0,
        };
        // The first event: the earliest of the first window read.
        while !replay.drained
            && replay
                .ahead
                .peek()
                .is_none_or(|a| replay.read_ns < a.0.ts_ns.saturating_add(LOOKAHEAD_NS))
        {
            replay.read_batch();
        }
        if let Some(e) = replay.error.take() {
            return Err(e.into());
        }
        replay.first_ns = replay
            .ahead
            .peek()
            .map_or(replay.header.start_monotonic_ns, |a| a.0.ts_ns);
        replay.last_ns = replay.first_ns;
        Ok(replay)
    }

    /// One batch more into `ahead`; a reading error ends the reading (kept in `error`).
    fn read_batch(&mut self) {
        match self.reader.next_batch() {
            Ok(Some(batch)) => {
                for event in batch {
                    self.read_ns = self.read_ns.max(event.ts_ns);
                    self.seq += 1;
                    self.ahead.push(Reverse(Ahead {
                        ts_ns: event.ts_ns,
                        seq: self.seq,
                        event,
                    }));
                }
            }
            Ok(None) => self.drained = true,
            Err(e) => {
                self.drained = true;
                self.error = Some(e);
            }
        }
    }

    /// Events due at replay position `clock_ns` (event time), not handed out before.
    pub fn due(&mut self, clock_ns: u64) -> Vec<Event> {
        self.due_at_most(clock_ns, usize::MAX)
    }

    /// As `due`, `max` events at most (the rest stay due). Reads only as far as
    /// those need: an event goes once `LOOKAHEAD_NS` past it was read.
    pub fn due_at_most(&mut self, clock_ns: u64, max: usize) -> Vec<Event> {
        let mut out = Vec::new();
        while out.len() < max {
            let due = self
                .ahead
                .peek()
                .map(|a| a.0.ts_ns)
                .filter(|&ts| ts <= clock_ns);
            // What to have read a window past: the earliest due event, or, with none
            // read, the clock (something unread may be due).
            let wanted = due.unwrap_or(clock_ns);
            if !self.drained && self.read_ns < wanted.saturating_add(LOOKAHEAD_NS) {
                // An error ends the reading; what was read still goes out.
                self.read_batch();
                continue;
            }
            if due.is_none() {
                break;
            }
            let Reverse(a) = self.ahead.pop().expect("peeked");
            self.last_ns = self.last_ns.max(a.ts_ns);
            out.push(a.event);
        }
        out
    }

    /// Every event was handed out (or every one before the damage, see `error`).
    pub fn finished(&self) -> bool {
        self.drained && self.ahead.is_empty()
    }

    /// Events read and not yet handed out: what the replay holds.
    pub fn held(&self) -> usize {
        self.ahead.len()
    }

    /// Why the replay stopped before the recording's end, once it did.
    pub fn error(&self) -> Option<&RecordError> {
        self.error.as_ref().filter(|_| self.finished())
    }

    pub fn meta(&self, paths: &[PathBuf], speed: f64) -> Meta {
        let h = &self.header;
        let name = paths
            .iter()
            .map(|path| {
                path.file_name().map_or_else(
                    || path.display().to_string(),
                    |n| n.to_string_lossy().into(),
                )
            })
            .collect::<Vec<String>>()
            .join(" + ");
        let speed = if speed == 0.0 {
            "at once".to_string()
        } else {
            format!("×{speed}")
        };
        Meta {
            host: h.host.clone(),
            source: format!("replay {name} {speed}"),
            probes_attached: h.probes.len(),
            probes_skipped: h.probes_skipped.len(),
            dropped: h.counters.map(|c| c.dropped),
            start_ns: self.first_ns,
        }
    }
}
