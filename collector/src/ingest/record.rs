//! The record file: what `tokenscope record` writes and everything else can
//! replay exactly.
//!
//! Layout: an 8-byte magic, then a fixed 4 KiB header region holding a
//! little-endian u32 length and a [`FileHeader`] (prost), then frames, each a
//! varint length and an [`EventBatch`] (prost): in format 5 with timestamps as
//! deltas, repeated comms left out, sockets seen before written as references to a
//! per-file table and the plain socket I/Os and libcuda calls as columns, through one
//! zstd stream per file flushed at each frame (see `frame` and `columns`); format 4
//! without the columns, format 3 without the table, zstd per frame in format 2, plain
//! in format 1, all still read. The header is written first with
//! `complete = false` and rewritten in place when the recording ends, with the
//! final counters; a file cut off by a crash still reads up to its last whole
//! frame and says it is incomplete.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use prost::Message;

use super::model::Event;

mod ahead;
mod batch;
mod columns;
mod frame;

pub use ahead::ReadAhead;

pub const MAGIC: &[u8; 8] = b"TKSCOPE\x01";
/// What `protocol::print` is, as recordings name it (`FileHeader::prints`).
pub const PRINTS: &str = "xxh3-64";
/// 6: format 5, and a sniff's own fingerprint (0 from every recorder since be611d6)
/// kept in its event, not in the prints column (a third of that column was zeros). 5:
/// format 4, and the socket I/Os and libcuda calls that fit them as columns
/// (`columns`). 4: format 3, and sockets seen before left out or referred to in a
/// per-file table (the recorder's SSE prints became XXH3-64 with it:
/// `FileHeader::prints`). 3: delta timestamps, elided comms, one zstd stream across
/// frames. 2: each frame zstd on its own. 1: plain. All six are read.
pub const FORMAT_VERSION: u32 = 6;
/// Magic + header region; frames start here.
pub const HEADER_REGION: u64 = 4096;
const MAX_FRAME: u64 = 64 << 20;
const BATCH_EVENTS: usize = 1024;

#[derive(Clone, PartialEq, prost::Message)]
pub struct FileHeader {
    #[prost(uint32, tag = "1")]
    pub format_version: u32,
    /// Always "MONOTONIC": every ts_ns is CLOCK_MONOTONIC.
    #[prost(string, tag = "2")]
    pub clock: String,
    #[prost(string, tag = "3")]
    pub host: String,
    #[prost(string, tag = "4")]
    pub kernel: String,
    #[prost(string, tag = "5")]
    pub tokenscope_version: String,
    /// Probes attached, as `category:name`.
    #[prost(string, repeated, tag = "6")]
    pub probes: Vec<String>,
    /// Probes the kernel lacked, as `category:name: reason`.
    #[prost(string, repeated, tag = "7")]
    pub probes_skipped: Vec<String>,
    #[prost(uint64, tag = "8")]
    pub start_monotonic_ns: u64,
    /// Wall clock at start (Unix ns), to place the recording in time.
    #[prost(uint64, tag = "9")]
    pub start_realtime_ns: u64,
    #[prost(uint64, tag = "10")]
    pub end_monotonic_ns: u64,
    #[prost(message, optional, tag = "11")]
    pub counters: Option<Counters>,
    /// The recording ended cleanly and the counters are final.
    #[prost(bool, tag = "12")]
    pub complete: bool,
    #[prost(uint32, repeated, tag = "13")]
    pub filter_pids: Vec<u32>,
    #[prost(uint32, repeated, tag = "14")]
    pub filter_ports: Vec<u32>,
    /// Payload bytes the probes copied per I/O at most.
    #[prost(uint32, tag = "15")]
    pub payload_cap: u32,
    /// GPUs NVML reported, as `index: name (uuid)`.
    #[prost(string, repeated, tag = "16")]
    pub gpu_devices: Vec<String>,
    /// Why NVML sampling was off, when it was.
    #[prost(string, tag = "17")]
    pub nvml_note: String,
    /// NVML samples the sampler's queue had no room for.
    #[prost(uint64, tag = "18")]
    pub nvml_dropped: u64,
    /// CUPTI hook records received, and those the hooks dropped (their queue was full).
    #[prost(uint64, tag = "19")]
    pub cupti_received: u64,
    #[prost(uint64, tag = "20")]
    pub cupti_dropped: u64,
    /// TLS plaintext calls (OpenSSL uprobes) that could not be tied to a socket: the
    /// TLS session began before the recording and no socket I/O ran inside a call on
    /// it since. Their bytes are missing from the plaintext streams.
    #[prost(uint64, tag = "21")]
    pub tls_untied: u64,
    /// Where socket I/O events came from (`--io-source` name: sock, kprobe, syscall);
    /// empty in recordings older than the choice (all of them used `sock`).
    #[prost(string, tag = "22")]
    pub io_source: String,
    /// The host's boot (/proc/sys/kernel/random/boot_id): CLOCK_MONOTONIC restarts with
    /// it, so two recordings share a monotonic clock only with the same boot id.
    #[prost(string, tag = "23")]
    pub boot_id: String,
    /// The network namespace recorded (its inode): `record --netns`'s, else the
    /// recorder's own. Which "host" of a machine that holds several (pods, test
    /// namespaces).
    #[prost(uint64, tag = "24")]
    pub net_namespace: u64,
    /// Wall clock when the recording was sealed, taken with `end_monotonic_ns`: with the
    /// start pair, how the two clocks drifted over the recording.
    #[prost(uint64, tag = "25")]
    pub end_realtime_ns: u64,
    /// The hash of the SSE events' data and token texts in the events
    /// ([`PRINTS`], "xxh3-64", from the recorder of format 4 on); empty:
    /// FNV-1a (older recorders, and copies of their recordings). Prints of two hashes
    /// never match, so recordings of both are not joined.
    #[prost(string, tag = "26")]
    pub prints: String,
    /// How far out of time order the file's events came, at most: over every event,
    /// the newest time written before it less its own. Set when the recording
    /// completes (none in a file cut off, or older than the field). A replay holds
    /// events that long, not its default second (see `pipeline::Config::replay_of`):
    /// the same order, from a window that stays in the cache.
    #[prost(uint64, optional, tag = "27")]
    pub disorder_ns: Option<u64>,
}

#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct Counters {
    /// Records the probes tried to put in the ring buffer.
    #[prost(uint64, tag = "1")]
    pub submitted: u64,
    /// Of those, records the ring buffer had no room for.
    #[prost(uint64, tag = "2")]
    pub dropped: u64,
    /// Records user space read from the ring buffer.
    #[prost(uint64, tag = "3")]
    pub delivered: u64,
    /// Delivered records that failed to decode (counted, not written).
    #[prost(uint64, tag = "4")]
    pub decode_errors: u64,
    /// Events written to the file: delivered - decode_errors + gpu_samples +
    /// ring_readings.
    #[prost(uint64, tag = "5")]
    pub written: u64,
    /// NVML samples and CUPTI records written (they do not come through the ring buffer).
    #[prost(uint64, tag = "6")]
    pub gpu_samples: u64,
    /// Ring-buffer counter readings written (`RingCounters`, when the drops moved).
    #[prost(uint64, tag = "7")]
    pub ring_readings: u64,
}

/// A batch's plain (decompressed) bytes read by the reader's own decoder, which reads
/// socket I/O and libcuda events field by field and must give what prost gives, result
/// and error alike: for the fuzz target `record_batch`, which compares the two.
#[doc(hidden)]
pub fn decode_batch(plain: &[u8]) -> Result<EventBatch, prost::DecodeError> {
    batch::decode(plain)
}

/// A batch's plain bytes as the recorder writes them (lengths filled in after each
/// nested message, not computed ahead): for the fuzz target `record_batch`, which
/// holds them to prost's `encode`.
#[doc(hidden)]
pub fn encode_batch(batch: &EventBatch) -> Vec<u8> {
    let mut out = Vec::new();
    batch.encode_vec(&mut out);
    out
}

/// Frames of events as a recording of the current format packs and reads them (zstd
/// and CRC aside): for the fuzz target `record_batch`, which checks that every event
/// comes back exactly.
#[doc(hidden)]
pub fn repack_frames(frames: Vec<Vec<Event>>) -> Result<Vec<Vec<Event>>, String> {
    frame::repack(frames)
}

/// Batches' plain bytes unpacked in turn as the current format's frames: for the fuzz
/// target `record_batch` (what a crafted frame gives the reader: an error or events,
/// never a panic).
#[doc(hidden)]
pub fn unpack_batches(plains: &[&[u8]]) -> Result<Vec<Vec<Event>>, String> {
    frame::unpack_plain(plains)
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct EventBatch {
    #[prost(message, repeated, tag = "1")]
    pub events: Vec<Event>,
    /// Formats 3 and 4: the events' timestamps, each a zigzag delta from the one before,
    /// as a column of their own (packed varints compress better together than spread
    /// among the events); the events' own `ts_ns` is then 0 and takes no bytes.
    #[prost(uint64, repeated, tag = "2")]
    pub ts_deltas: Vec<u64>,
    /// Formats 3 and 4: the sniffs' hashes (fingerprints, SSE prints, body and prefix
    /// prints, in `frame::each_print`'s order), a column of their own: random bytes
    /// among the events would break the matches zstd finds in what repeats.
    #[prost(fixed64, repeated, tag = "3")]
    pub prints: Vec<u64>,
    /// Format 5: one byte per event, in order: whether it is the next of `events` or
    /// comes from `columns` (see `columns`).
    #[prost(bytes = "vec", tag = "4")]
    pub shapes: Vec<u8>,
    /// Format 5: the socket I/Os and libcuda calls that fit them, as columns.
    #[prost(bytes = "vec", tag = "5")]
    pub columns: Vec<u8>,
}

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    // `err`, not `source`: the reason is part of this one line, not a second cause.
    #[error("{path}: {err}")]
    Io { path: PathBuf, err: io::Error },
    #[error("{0}: not a tokenscope recording (bad magic)")]
    NotARecording(PathBuf),
    #[error(
        "{path}: recording format {found} is newer than this tokenscope reads ({FORMAT_VERSION})"
    )]
    UnsupportedVersion { path: PathBuf, found: u32 },
    #[error("{path}: corrupt header: {reason}")]
    CorruptHeader { path: PathBuf, reason: String },
    #[error("{path}: corrupt frame at byte {offset}: {reason}")]
    CorruptFrame {
        path: PathBuf,
        offset: u64,
        reason: String,
    },
    #[error("{path}: truncated at byte {offset}, but its header says the recording completed")]
    Truncated { path: PathBuf, offset: u64 },
}

/// Appends events in batches and seals the header on [`RecordWriter::finish`].
pub struct RecordWriter {
    path: PathBuf,
    out: BufWriter<File>,
    header: FileHeader,
    pending: Vec<Event>,
    encoder: frame::Encoder,
    frame: Vec<u8>,
    written: u64,
    /// Bytes in the file so far (header region and flushed frames).
    bytes: u64,
    /// The newest event time pushed, and how far behind it an event came at most
    /// (`FileHeader::disorder_ns`).
    newest_ns: u64,
    disorder_ns: u64,
}

/// Creates (or truncates) `path` readable and writable by its owner only (0600, also
/// when it already existed with looser modes): recordings and traces show who talked
/// to whom and when.
pub fn create_private(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    Ok(file)
}

impl RecordWriter {
    pub fn create(path: &Path, header: FileHeader) -> Result<Self, RecordError> {
        RecordWriter::create_format(path, header, FORMAT_VERSION)
    }

    /// A writer of `version` (3 or 4): older than the current one only for the tests
    /// that check such files still read.
    fn create_format(
        path: &Path,
        mut header: FileHeader,
        version: u32,
    ) -> Result<Self, RecordError> {
        let io_err = |source| RecordError::Io {
            path: path.to_path_buf(),
            err: source,
        };
        let file = create_private(path).map_err(io_err)?;
        let encoder = frame::Encoder::for_format(version, frame::ZSTD_LEVEL).map_err(io_err)?;
        header.format_version = version;
        header.complete = false;
        // Known only once every event is written (a copy's header may carry its source's).
        header.disorder_ns = None;
        let mut w = RecordWriter {
            path: path.to_path_buf(),
            out: BufWriter::new(file),
            header,
            pending: Vec::new(),
            encoder,
            frame: Vec::new(),
            written: 0,
            bytes: HEADER_REGION,
            newest_ns: 0,
            disorder_ns: 0,
        };
        w.write_header()?;
        Ok(w)
    }

    /// Ends zstd frames before `limit` plain bytes instead of the window (tests: many
    /// boundaries from few events). Before anything is pushed.
    #[cfg(test)]
    fn with_zstd_frame_limit(mut self, limit: usize) -> Self {
        assert_eq!(self.written, 0, "set before any frame");
        self.encoder = frame::Encoder::with_frame_limit(FORMAT_VERSION, frame::ZSTD_LEVEL, limit)
            .expect("a zstd encoder");
        self
    }

    pub fn push(&mut self, event: Event) -> Result<(), RecordError> {
        self.newest_ns = self.newest_ns.max(event.ts_ns);
        self.disorder_ns = self.disorder_ns.max(self.newest_ns - event.ts_ns);
        self.pending.push(event);
        if self.pending.len() >= BATCH_EVENTS {
            self.flush()?;
        }
        Ok(())
    }

    /// Writes pending events as one frame and flushes it to the file.
    pub fn flush(&mut self) -> Result<(), RecordError> {
        if !self.pending.is_empty() {
            self.written += self.pending.len() as u64;
            self.frame.clear();
            let events = std::mem::take(&mut self.pending);
            let mut spent = match self.encoder.frame(events, &mut self.frame) {
                Ok(spent) => spent,
                Err(e) => return Err(self.io(e)),
            };
            spent.clear(); // keeps its room for the next frame's events
            self.pending = spent;
            self.bytes += self.frame.len() as u64;
            self.out.write_all(&self.frame).map_err(|e| self.io(e))?;
        }
        self.out.flush().map_err(|e| self.io(e))
    }

    /// Rewrites the header in place (e.g. once the attached probes are known).
    pub fn update_header(
        &mut self,
        update: impl FnOnce(&mut FileHeader),
    ) -> Result<(), RecordError> {
        update(&mut self.header);
        self.header.complete = false;
        self.header.disorder_ns = None;
        self.write_header()
    }

    /// The file's size once what is pending is flushed (less those events).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn written(&self) -> u64 {
        self.written + self.pending.len() as u64
    }

    /// Writes what is pending, then rewrites the header with the final counters.
    pub fn finish(
        mut self,
        mut counters: Counters,
        end_monotonic_ns: u64,
    ) -> Result<FileHeader, RecordError> {
        self.flush()?;
        counters.written = self.written;
        self.header.counters = Some(counters);
        self.header.end_monotonic_ns = end_monotonic_ns;
        self.header.end_realtime_ns = tokenscope_clock::realtime_ns();
        self.header.disorder_ns = Some(self.disorder_ns);
        self.header.complete = true;
        self.write_header()?;
        self.out.get_ref().sync_all().map_err(|e| self.io(e))?;
        Ok(self.header)
    }

    fn write_header(&mut self) -> Result<(), RecordError> {
        let body = self.header.encode_to_vec();
        let room = HEADER_REGION as usize - MAGIC.len() - 4;
        if body.len() > room {
            return Err(RecordError::CorruptHeader {
                path: self.path.clone(),
                reason: format!(
                    "header of {} bytes does not fit its {room}-byte region",
                    body.len()
                ),
            });
        }
        let mut region = Vec::with_capacity(HEADER_REGION as usize);
        region.extend_from_slice(MAGIC);
        region.extend_from_slice(&(body.len() as u32).to_le_bytes());
        region.extend_from_slice(&body);
        region.resize(HEADER_REGION as usize, 0);
        let path = self.path.clone();
        let rewrite = |out: &mut BufWriter<File>| -> io::Result<()> {
            out.flush()?;
            let file = out.get_mut();
            let end = file.stream_position()?;
            file.seek(SeekFrom::Start(0))?;
            file.write_all(&region)?;
            file.seek(SeekFrom::Start(end.max(HEADER_REGION)))?;
            Ok(())
        };
        rewrite(&mut self.out).map_err(|err| RecordError::Io { path, err })
    }

    fn io(&self, source: io::Error) -> RecordError {
        RecordError::Io {
            path: self.path.clone(),
            err: source,
        }
    }
}

/// Where replayed events come from: one recording, or several read as one
/// (`ingest::hosts::Joined`). Batches come roughly in time order.
pub trait Source {
    fn header(&self) -> &FileHeader;
    /// The next batch of events, `Ok(None)` at the end.
    fn next_batch(&mut self) -> Result<Option<Vec<Event>>, RecordError>;
    /// A batch this source gave and the caller is done with, its events as they are: a
    /// source may write the next batch over them (`RecordReader::recycle`). Dropped by
    /// default.
    fn recycle(&mut self, _batch: Vec<Event>) {}
}

impl Source for RecordReader {
    fn header(&self) -> &FileHeader {
        &self.header
    }

    fn next_batch(&mut self) -> Result<Option<Vec<Event>>, RecordError> {
        RecordReader::next_batch(self)
    }

    fn recycle(&mut self, batch: Vec<Event>) {
        RecordReader::recycle(self, batch)
    }
}

/// Reads a recording batch by batch, so replay memory stays bounded.
pub struct RecordReader {
    path: PathBuf,
    input: BufReader<File>,
    offset: u64,
    len: u64,
    pub header: FileHeader,
    /// Set when the file ended inside a frame of a recording that never completed.
    pub cut_off_at: Option<u64>,
    decoding: frame::Decoding,
    /// A corrupt frame's offset: from format 3 on the frames after it cannot be decoded.
    failed_at: Option<u64>,
    /// A batch done with, for the next frame's events (`recycle`).
    recycled: Vec<Event>,
}

impl RecordReader {
    pub fn open(path: &Path) -> Result<Self, RecordError> {
        let io_err = |source| RecordError::Io {
            path: path.to_path_buf(),
            err: source,
        };
        let file = File::open(path).map_err(io_err)?;
        let len = file.metadata().map_err(io_err)?.len();
        let mut input = BufReader::new(file);
        let mut region = vec![0u8; HEADER_REGION as usize];
        let got = read_up_to(&mut input, &mut region).map_err(io_err)?;
        if got < MAGIC.len() || &region[..MAGIC.len()] != MAGIC {
            return Err(RecordError::NotARecording(path.to_path_buf()));
        }
        let corrupt = |reason: String| RecordError::CorruptHeader {
            path: path.to_path_buf(),
            reason,
        };
        if got < HEADER_REGION as usize {
            return Err(corrupt(format!(
                "file ends at byte {got}, inside the {HEADER_REGION}-byte header region"
            )));
        }
        let hlen = u32::from_le_bytes(region[8..12].try_into().expect("4 bytes")) as usize;
        let body = region
            .get(12..12 + hlen)
            .ok_or_else(|| corrupt(format!("header length {hlen} overruns its region")))?;
        let header = FileHeader::decode(body).map_err(|e| corrupt(e.to_string()))?;
        if header.format_version > FORMAT_VERSION {
            return Err(RecordError::UnsupportedVersion {
                path: path.to_path_buf(),
                found: header.format_version,
            });
        }
        if header.format_version == 0 {
            return Err(corrupt("format version 0".into()));
        }
        let decoding = frame::Decoding::for_format(header.format_version).map_err(io_err)?;
        Ok(RecordReader {
            path: path.to_path_buf(),
            input,
            offset: HEADER_REGION,
            len,
            header,
            cut_off_at: None,
            decoding,
            failed_at: None,
            recycled: Vec::new(),
        })
    }

    /// `batch`, which this reader gave and its caller is done with: the next frame's
    /// columnar events are written over its events where they lie, instead of each made
    /// from a default and dropped later. One is kept, the one with more room (the other
    /// is dropped).
    pub fn recycle(&mut self, batch: Vec<Event>) {
        if batch.capacity() > self.recycled.capacity() {
            self.recycled = batch;
        }
    }

    /// The next batch of events, `Ok(None)` at the end.
    pub fn next_batch(&mut self) -> Result<Option<Vec<Event>>, RecordError> {
        if let Some(at) = self.failed_at {
            let reason = "the frames after this corrupt one cannot be decoded".into();
            return Err(self.corrupt(at, reason));
        }
        if self.offset >= self.len {
            return Ok(None);
        }
        let start = self.offset;
        let frame_len = match read_varint(&mut self.input) {
            Ok((v, n)) => {
                self.offset += n;
                v
            }
            Err(VarintError::Eof) => return self.cut_off(start),
            Err(VarintError::Overlong) => {
                return Err(self.corrupt(start, "frame length is not a valid varint".into()))
            }
            Err(VarintError::Io(e)) => {
                return Err(RecordError::Io {
                    path: self.path.clone(),
                    err: e,
                })
            }
        };
        if frame_len > MAX_FRAME {
            return Err(self.corrupt(
                start,
                format!("frame length {frame_len} exceeds {MAX_FRAME}"),
            ));
        }
        if self.offset + frame_len > self.len {
            return self.cut_off(start);
        }
        let mut buf = vec![0u8; frame_len as usize];
        self.input
            .read_exact(&mut buf)
            .map_err(|e| RecordError::Io {
                path: self.path.clone(),
                err: e,
            })?;
        self.offset += frame_len;
        match self
            .decoding
            .events(buf, std::mem::take(&mut self.recycled))
        {
            Ok(events) => Ok(Some(events)),
            Err(reason) => {
                if self.header.format_version >= 3 {
                    self.failed_at = Some(start);
                }
                Err(self.corrupt(start, reason))
            }
        }
    }

    /// Reads every remaining event.
    pub fn read_all(&mut self) -> Result<Vec<Event>, RecordError> {
        let mut all = Vec::new();
        while let Some(batch) = self.next_batch()? {
            all.extend(batch);
        }
        Ok(all)
    }

    fn cut_off(&mut self, at: u64) -> Result<Option<Vec<Event>>, RecordError> {
        if self.header.complete {
            return Err(RecordError::Truncated {
                path: self.path.clone(),
                offset: at,
            });
        }
        self.cut_off_at = Some(at);
        self.offset = self.len;
        Ok(None)
    }

    fn corrupt(&self, offset: u64, reason: String) -> RecordError {
        RecordError::CorruptFrame {
            path: self.path.clone(),
            offset,
            reason,
        }
    }
}

fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..])? {
            0 => break,
            n => got += n,
        }
    }
    Ok(got)
}

enum VarintError {
    Eof,
    Overlong,
    Io(io::Error),
}

fn read_varint(r: &mut impl Read) -> Result<(u64, u64), VarintError> {
    let mut value = 0u64;
    for i in 0..10 {
        let mut b = [0u8; 1];
        match r.read(&mut b) {
            Ok(0) => return Err(VarintError::Eof),
            Ok(_) => {}
            Err(e) => return Err(VarintError::Io(e)),
        }
        value |= u64::from(b[0] & 0x7f) << (7 * i);
        if b[0] & 0x80 == 0 {
            return Ok((value, i as u64 + 1));
        }
    }
    Err(VarintError::Overlong)
}

/// `events` written as a finished recording at `path` under `header` (tests).
#[cfg(test)]
pub(crate) fn write_recording(path: &Path, header: &FileHeader, events: &[Event]) {
    let mut w = RecordWriter::create(path, header.clone()).expect("create");
    for e in events {
        w.push(e.clone()).expect("push");
    }
    w.finish(header.counters.unwrap_or_default(), header.end_monotonic_ns)
        .expect("finish");
}

#[cfg(test)]
#[path = "record_tests/mod.rs"]
mod tests;
