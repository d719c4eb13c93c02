//! Where events come from: a recording replayed on its own clock, or a live
//! recording (`collector::record::live::Live`) on a thread that is always stopped
//! (probes detached) before top returns, panics included.

use std::path::PathBuf;

use collector::ingest::hosts::Joined;
use collector::ingest::record::{FileHeader, RecordReader, Source};
use collector::ingest::Event;
pub use collector::record::live::Live;

use crate::state::Meta;

/// A recording played back: events are due when their time since the first
/// event is at most the replay position.
pub struct Replay {
    pub header: FileHeader,
    events: Vec<Event>,
    next: usize,
    /// Event time of the replay's start and of its last event.
    pub first_ns: u64,
    pub last_ns: u64,
}

impl Replay {
    /// One recording, or several hosts' joined on the first one's clock.
    pub fn open(paths: &[PathBuf]) -> anyhow::Result<Replay> {
        let mut reader: Box<dyn Source> = match paths {
            [one] => Box::new(RecordReader::open(one)?),
            _ => Box::new(Joined::open(paths)?),
        };
        let mut events = Vec::new();
        while let Some(batch) = reader.next_batch()? {
            events.extend(batch);
        }
        events.sort_by_key(|e| e.ts_ns);
        let header = reader.header().clone();
        let first_ns = events
            .first()
            .map_or(header.start_monotonic_ns, |e| e.ts_ns);
        let last_ns = events.last().map_or(first_ns, |e| e.ts_ns);
        Ok(Replay {
            header,
            events,
            next: 0,
            first_ns,
            last_ns,
        })
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

    /// Events due at replay position `clock_ns` (event time), not handed out before.
    pub fn due(&mut self, clock_ns: u64) -> Vec<Event> {
        let end = self.next + self.events[self.next..].partition_point(|e| e.ts_ns <= clock_ns);
        let batch = self.events[self.next..end].to_vec();
        self.next = end;
        batch
    }

    pub fn finished(&self) -> bool {
        self.next >= self.events.len()
    }
}
