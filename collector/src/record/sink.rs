//! Where a live recording's events go: one file, a directory of rotating files
//! (the agent: a bad minute can be replayed later, and the disk stays bounded), or
//! nowhere (the views that only watch). Each rotated file is a whole recording:
//! the session's header, its own counters, sealed when the next one starts.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use crate::ingest::record::{Counters, FileHeader, RecordError, RecordWriter, FORMAT_VERSION};
use crate::ingest::Event;

/// What a recording session writes.
#[derive(Clone, Debug, PartialEq)]
pub enum Output {
    /// One file, sealed when the session ends (`tokenscope record -o FILE`).
    File(PathBuf),
    /// Files in a directory, a new one every `file_age` or `file_bytes`; the oldest
    /// go once the directory's recordings pass `max_bytes` or `max_age`.
    Rotate(Rotation),
    /// Nothing kept: events go to the observer only.
    Discard,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Rotation {
    pub dir: PathBuf,
    /// The directory's recordings together (the file being written included).
    pub max_bytes: u64,
    /// Recordings whose last event is older than this are removed.
    pub max_age: Duration,
    /// A file is sealed and the next begun at this size...
    pub file_bytes: u64,
    /// ...or this age, whichever comes first.
    pub file_age: Duration,
}

impl Rotation {
    /// Files of a tenth of the budget (at least 1 MiB), a minute each at most.
    pub fn new(dir: PathBuf, max_bytes: u64, max_age: Duration) -> Rotation {
        Rotation {
            dir,
            max_bytes,
            max_age,
            file_bytes: (max_bytes / 10).max(1 << 20),
            file_age: Duration::from_secs(60).min(max_age),
        }
    }
}

/// The prefix and suffix of rotated files' names (`tokenscope-20261202T061500Z-0003.tsrec`).
pub const ROTATED_PREFIX: &str = "tokenscope-";
pub const ROTATED_SUFFIX: &str = ".tsrec";

pub(crate) struct Sink {
    header: FileHeader,
    kind: Kind,
}

enum Kind {
    File(RecordWriter),
    Rotate(Rotator),
    Discard { written: u64 },
}

struct Rotator {
    cfg: Rotation,
    current: RecordWriter,
    opened: Instant,
    /// The session's counters when the current file began (each file gets its own).
    base: Counters,
    seq: u32,
}

impl Sink {
    /// Creates the first file (a bad path fails before anything touches the kernel).
    pub(crate) fn create(output: &Output, mut header: FileHeader) -> Result<Sink, RecordError> {
        header.format_version = FORMAT_VERSION;
        let kind = match output {
            Output::File(path) => Kind::File(RecordWriter::create(path, header.clone())?),
            Output::Rotate(cfg) => {
                std::fs::create_dir_all(&cfg.dir).map_err(|err| RecordError::Io {
                    path: cfg.dir.clone(),
                    err,
                })?;
                let current = RecordWriter::create(&rotated_path(&cfg.dir, 0), header.clone())?;
                Kind::Rotate(Rotator {
                    cfg: cfg.clone(),
                    current,
                    opened: Instant::now(),
                    base: Counters::default(),
                    seq: 0,
                })
            }
            Output::Discard => Kind::Discard { written: 0 },
        };
        Ok(Sink { header, kind })
    }

    pub(crate) fn push(&mut self, event: Event) -> Result<(), RecordError> {
        match &mut self.kind {
            Kind::File(w) => w.push(event),
            Kind::Rotate(r) => r.current.push(event),
            Kind::Discard { written } => {
                *written += 1;
                Ok(())
            }
        }
    }

    /// Nothing is kept (`Output::Discard`): events need not be handed over.
    pub(crate) fn discards(&self) -> bool {
        matches!(self.kind, Kind::Discard { .. })
    }

    /// Counts an event a discarding sink was not handed (see `discards`).
    pub(crate) fn count_discarded(&mut self, n: u64) {
        if let Kind::Discard { written } = &mut self.kind {
            *written += n;
        }
    }

    /// Writes what is pending; a rotating sink also begins the next file when the
    /// current one is full or old (`counters`: the session's so far).
    pub(crate) fn flush(&mut self, counters: &Counters, now_ns: u64) -> Result<(), RecordError> {
        match &mut self.kind {
            Kind::File(w) => w.flush(),
            Kind::Rotate(r) => {
                r.current.flush()?;
                if r.current.bytes() >= r.cfg.file_bytes || r.opened.elapsed() >= r.cfg.file_age {
                    r.rotate(&self.header, counters, now_ns)?;
                }
                Ok(())
            }
            Kind::Discard { .. } => Ok(()),
        }
    }

    pub(crate) fn update_header(
        &mut self,
        update: impl FnOnce(&mut FileHeader),
    ) -> Result<(), RecordError> {
        update(&mut self.header);
        let header = self.header.clone();
        let set = |h: &mut FileHeader| {
            let keep = (h.start_monotonic_ns, h.start_realtime_ns);
            *h = header;
            (h.start_monotonic_ns, h.start_realtime_ns) = keep;
        };
        match &mut self.kind {
            Kind::File(w) => w.update_header(|h| *h = self.header.clone()),
            Kind::Rotate(r) if r.seq == 0 => r.current.update_header(|h| *h = self.header.clone()),
            Kind::Rotate(r) => r.current.update_header(set),
            Kind::Discard { .. } => Ok(()),
        }
    }

    /// Seals the last file; the header as sealed (with the session's counters).
    pub(crate) fn finish(
        self,
        counters: Counters,
        end_monotonic_ns: u64,
    ) -> Result<FileHeader, RecordError> {
        match self.kind {
            Kind::File(w) => w.finish(counters, end_monotonic_ns),
            Kind::Rotate(r) => {
                let mut sealed = r
                    .current
                    .finish(minus(counters, r.base), end_monotonic_ns)?;
                sealed.counters = Some(counters);
                sealed.start_monotonic_ns = self.header.start_monotonic_ns;
                sealed.start_realtime_ns = self.header.start_realtime_ns;
                Ok(sealed)
            }
            Kind::Discard { written } => {
                let mut header = self.header;
                header.counters = Some(Counters {
                    written,
                    ..counters
                });
                header.end_monotonic_ns = end_monotonic_ns;
                header.end_realtime_ns = crate::clock::realtime_ns();
                header.complete = true;
                Ok(header)
            }
        }
    }
}

impl Rotator {
    fn rotate(
        &mut self,
        header: &FileHeader,
        counters: &Counters,
        now_ns: u64,
    ) -> Result<(), RecordError> {
        self.seq += 1;
        let mut next = header.clone();
        next.start_monotonic_ns = now_ns;
        next.start_realtime_ns = crate::clock::realtime_ns();
        let next = RecordWriter::create(&rotated_path(&self.cfg.dir, self.seq), next)?;
        let done = std::mem::replace(&mut self.current, next);
        // This file's own counters: a drop before it began is not its loss.
        let mut own = minus(*counters, self.base);
        own.written = 0;
        done.finish(own, now_ns)?;
        self.base = *counters;
        self.opened = Instant::now();
        prune(&self.cfg, &rotated_path(&self.cfg.dir, self.seq));
        Ok(())
    }
}

fn minus(a: Counters, b: Counters) -> Counters {
    Counters {
        submitted: a.submitted.saturating_sub(b.submitted),
        dropped: a.dropped.saturating_sub(b.dropped),
        delivered: a.delivered.saturating_sub(b.delivered),
        decode_errors: a.decode_errors.saturating_sub(b.decode_errors),
        written: a.written.saturating_sub(b.written),
        gpu_samples: a.gpu_samples.saturating_sub(b.gpu_samples),
        ring_readings: a.ring_readings.saturating_sub(b.ring_readings),
    }
}

/// `DIR/tokenscope-<UTC time>-<seq>.tsrec`: names sort in the order they were written.
fn rotated_path(dir: &Path, seq: u32) -> PathBuf {
    let secs = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    dir.join(format!(
        "{ROTATED_PREFIX}{}-{seq:04}{ROTATED_SUFFIX}",
        utc_stamp(secs)
    ))
}

/// `YYYYMMDDTHHMMSSZ` (proleptic Gregorian, from days since 1970-01-01).
fn utc_stamp(secs: u64) -> String {
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// Removes the oldest rotated recordings past the directory's budget or age (never
/// `current`). Files it cannot read or remove are left, not fatal.
fn prune(cfg: &Rotation, current: &Path) {
    let Ok(entries) = std::fs::read_dir(&cfg.dir) else {
        return;
    };
    let mut files: Vec<(PathBuf, u64, SystemTime)> = entries
        .filter_map(Result::ok)
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with(ROTATED_PREFIX) && name.ends_with(ROTATED_SUFFIX)
        })
        .filter_map(|e| {
            let meta = e.metadata().ok()?;
            Some((e.path(), meta.len(), meta.modified().ok()?))
        })
        .collect();
    files.sort();
    let mut total: u64 = files.iter().map(|f| f.1).sum();
    let now = SystemTime::now();
    for (path, len, modified) in files {
        if path == current {
            continue;
        }
        let old = now
            .duration_since(modified)
            .is_ok_and(|age| age > cfg.max_age);
        if (total > cfg.max_bytes || old) && std::fs::remove_file(&path).is_ok() {
            total -= len;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingest::record::RecordReader;

    fn event(i: u64) -> Event {
        Event {
            ts_ns: i,
            pid: 1,
            tid: 1,
            cpu: 0,
            // 200 bytes frames cannot compress away (files must fill to rotate).
            comm: (0..25)
                .map(|k| format!("{:08x}", noise(i * 25 + k)))
                .collect(),
            body: None,
        }
    }

    /// splitmix64's output function: a different-looking word for every input.
    fn noise(x: u64) -> u32 {
        let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) as u32
    }

    #[test]
    fn utc_stamps_match_known_dates() {
        assert_eq!(utc_stamp(0), "19700101T000000Z");
        assert_eq!(utc_stamp(951_782_400), "20000229T000000Z");
        assert_eq!(utc_stamp(1_796_191_261), "20261202T060101Z");
    }

    #[test]
    fn rotated_files_each_read_back_whole_and_the_budget_holds() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = Rotation {
            dir: dir.path().join("rec"),
            max_bytes: 200_000,
            max_age: Duration::from_secs(3600),
            file_bytes: 50_000,
            file_age: Duration::from_secs(3600),
        };
        let mut sink = Sink::create(&Output::Rotate(cfg.clone()), FileHeader::default()).unwrap();
        sink.update_header(|h| h.io_source = "sock".into()).unwrap();
        let mut counters = Counters::default();
        for i in 0..10_000u64 {
            sink.push(event(i)).unwrap();
            counters.delivered += 1;
            if i % 100 == 99 {
                sink.flush(&counters, i).unwrap();
            }
        }
        let sealed = sink.finish(counters, 10_000).unwrap();
        assert_eq!(sealed.counters.unwrap().delivered, 10_000);
        let mut names: Vec<PathBuf> = std::fs::read_dir(&cfg.dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        names.sort();
        let total: u64 = names
            .iter()
            .map(|p| std::fs::metadata(p).unwrap().len())
            .sum();
        assert!(names.len() >= 3, "{names:?}");
        assert!(
            total <= cfg.max_bytes + cfg.file_bytes + 100_000,
            "{total} bytes kept"
        );
        // Every kept file is a sealed recording of consecutive events, the newest last.
        let mut last_seen = None;
        for path in &names {
            let mut r = RecordReader::open(path).unwrap();
            assert!(r.header.complete, "{path:?} sealed");
            assert_eq!(
                r.header.io_source, "sock",
                "{path:?} has the session's header"
            );
            let events = r.read_all().unwrap();
            assert_eq!(
                r.header.counters.unwrap().delivered,
                events.len() as u64,
                "{path:?}: its own counters"
            );
            // (The last file is empty when a rotation fell on the last flush.)
            if let (Some(prev), Some(first)) = (last_seen, events.first()) {
                assert_eq!(first.ts_ns, prev + 1, "{path:?} follows the last file");
            }
            last_seen = events.last().map(|e| e.ts_ns).or(last_seen);
        }
        assert_eq!(last_seen, Some(9_999));
    }

    #[test]
    fn a_discarding_sink_counts_what_it_let_go() {
        let mut sink = Sink::create(&Output::Discard, FileHeader::default()).unwrap();
        sink.push(event(1)).unwrap();
        let header = sink.finish(Counters::default(), 5).unwrap();
        assert_eq!(header.counters.unwrap().written, 1);
        assert!(header.complete);
    }
}
