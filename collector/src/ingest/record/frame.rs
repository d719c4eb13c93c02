//! How a frame's events become bytes, per format.
//!
//! Format 6: format 5, and the sniffs' own fingerprints left in their events (written
//! there when not 0; none is since be611d6), not in the prints column: that column is
//! then only the SSE, body and prefix prints (`each_print`).
//!
//! Format 5: format 4, and the events that fit them as columns (`columns`).
//!
//! Format 4: format 3, and an event's socket seen before in the file left out or
//! written as a reference to a per-file table (see `SockTable`).
//!
//! Format 3: the events' timestamps as zigzag deltas from the previous event of the
//! frame and the sniffs' hashes, each in a column of their own (`EventBatch::ts_deltas`,
//! `prints`), and a comm left out when the thread's previous event in the frame had the
//! same; the batch then goes through one zstd stream per file, flushed at each frame,
//! so a frame is compressed against the frames before it (small live frames compress
//! almost as well as large ones). A frame therefore decodes only after the ones before
//! it: every reader reads a recording from its start. A CRC-32 of the compressed bytes
//! leads each frame, so damage is reported before it reaches the stream (zstd checks
//! its own content only when a stream ends). Format 2: each frame zstd on its
//! own, events as they are. Format 1: plain.

use std::io::{self, Write};

use zstd::stream::raw::{Decoder, InBuffer, Operation, OutBuffer};
use zstd::zstd_safe::{CParameter, DParameter, ParamSwitch};

use super::batch::{unzigzag, zigzag};
use super::columns::Columns;
use super::{EventBatch, MAX_FRAME};
use crate::ingest::fast_hash::FastMap;
use crate::ingest::model::event::Body;
use crate::ingest::model::{Event, Sniff, SockIo};

/// zstd's level for frames: 1, its fastest strategy. On issue 17's load (format 4, two
/// recorders on the same 20 s, three rounds) it took 7% less of the recorder's CPU
/// than level 3 (its default) for files 1.4% larger (44.8 -> 45.7 B per token).
pub(super) const ZSTD_LEVEL: i32 = 1;
/// The stream's window (1 MiB): a second or more of events at a few thousand tokens
/// per second, enough to reach the frames just before; it bounds the recorder's and
/// each reader's memory, and readers refuse a stream that asks for more.
const WINDOW_LOG: u32 = 20;
/// Marks a stored comm that is written out although it may look elided (an empty
/// comm, or one that begins with this byte): the reader drops one.
const COMM_ESCAPE: char = '\0';

/// A zstd frame of the stream ends before its input passes this (the window), and the
/// next record frame starts a new one: the streaming encoder keeps its input in a
/// buffer of window + block size that wraps every ~1.1 MiB, and from the first wrap on
/// compresses in its slower extDict mode (half of zstd's instructions on issue 17's
/// load). Ending frames first: 2.6% fewer instructions on the recorder's path, files
/// 0.9% larger (matches do not reach into the frame before; ring_replay, 83,672
/// records). Readers need nothing new: a zstd stream may hold many frames.
const ZSTD_FRAME_INPUT: usize = 1 << WINDOW_LOG;

mod socks;
mod stable;
use socks::{sock_of, SockTable};
#[cfg(test)]
pub(super) use socks::{FD_KEYS, SOCK_SLOTS};
use stable::{unpack_stable, StableOut, STABLE_ROOM};

/// The writing side of formats 3 and 4: one per file.
pub(super) struct Encoder {
    zstd: zstd::stream::write::Encoder<'static, Vec<u8>>,
    level: i32,
    /// Plain bytes in the current zstd frame, and where it is ended.
    frame_input: usize,
    frame_limit: usize,
    plain: Vec<u8>,
    packer: Packer,
    ts_deltas: Vec<u64>,
    prints: Vec<u64>,
    /// Format 5's columns (None: formats 3 and 4).
    columns: Option<Box<Columns>>,
}

impl Encoder {
    /// `version` 3 or 4 (3 for tests that check older files still read).
    pub(super) fn for_format(version: u32, level: i32) -> io::Result<Encoder> {
        Encoder::with_frame_limit(version, level, ZSTD_FRAME_INPUT)
    }

    /// `for_format` with zstd frames ended before `frame_limit` plain bytes (tests cross
    /// many boundaries with few events).
    pub(super) fn with_frame_limit(
        version: u32,
        level: i32,
        frame_limit: usize,
    ) -> io::Result<Encoder> {
        Ok(Encoder {
            zstd: zstd_encoder(level)?,
            level,
            frame_input: 0,
            frame_limit,
            plain: Vec::new(),
            packer: Packer::for_format(version),
            ts_deltas: Vec::new(),
            prints: Vec::new(),
            columns: (version >= 5).then(Box::default),
        })
    }

    /// Appends `events` as one frame (length varint, CRC-32, zstd bytes) to `out`; the
    /// events come back packed (timestamps, hashes and comms moved out), for the caller
    /// to drop.
    pub(super) fn frame(
        &mut self,
        events: Vec<Event>,
        out: &mut Vec<u8>,
    ) -> io::Result<Vec<Event>> {
        let mut batch = EventBatch {
            events,
            ts_deltas: std::mem::take(&mut self.ts_deltas),
            prints: std::mem::take(&mut self.prints),
            ..EventBatch::default()
        };
        self.packer.pack(&mut batch);
        self.plain.clear();
        match &mut self.columns {
            Some(columns) => columns.encode(&batch, &mut self.plain),
            None => batch.encode_vec(&mut self.plain),
        }
        // The old zstd frame's end (its last block mark and checksum) leads this record
        // frame's bytes; a reader finishes that frame and begins the next in one go.
        let mut epilogue = None;
        if self.frame_input > 0 && self.frame_input + self.plain.len() > self.frame_limit {
            let old = std::mem::replace(&mut self.zstd, zstd_encoder(self.level)?);
            epilogue = Some(old.finish()?);
            self.frame_input = 0;
        }
        self.frame_input += self.plain.len();
        self.zstd.write_all(&self.plain)?;
        self.zstd.flush()?;
        let packed = self.zstd.get_mut();
        if let Some(mut epilogue) = epilogue {
            epilogue.extend_from_slice(packed);
            *packed = epilogue;
        }
        prost::encoding::encode_varint(packed.len() as u64 + 4, out);
        out.extend_from_slice(&crc32(packed).to_le_bytes());
        out.extend_from_slice(packed);
        packed.clear();
        self.ts_deltas = batch.ts_deltas;
        self.prints = batch.prints;
        Ok(batch.events)
    }
}

fn zstd_encoder(level: i32) -> io::Result<zstd::stream::write::Encoder<'static, Vec<u8>>> {
    let mut zstd = zstd::stream::write::Encoder::new(Vec::new(), level)?;
    zstd.window_log(WINDOW_LOG)?;
    // Literals stored as they are, not Huffman-coded: most of a frame's literals are
    // the prints column's hashes, which Huffman codes barely shrink, and decoding those
    // codes was 5% of reading. On issue 17's bench recording: 3.5% more bytes
    // (3.47 -> 3.59 MB), a one-core `report` 2.4% fewer instructions, and writing
    // cheaper too (the lab's `replicate`: 1,905 M -> 1,862 M instructions).
    zstd.set_parameter(CParameter::LiteralCompressionMode(ParamSwitch::Disable))?;
    Ok(zstd)
}

/// A frame's events packed into their batch (what `unpack_events` undoes), with what
/// it keeps between frames.
struct Packer {
    /// Thread id -> its previous event's index in the frame being packed.
    last_of_tid: FastMap<u32, usize>,
    elide: Vec<bool>,
    /// Format 4's table (None: format 3).
    socks: Option<SockTable>,
    /// The sniffs' own fingerprints go to the prints column (formats 3 to 5).
    fingerprints: Fingerprints,
}

impl Packer {
    fn for_format(version: u32) -> Packer {
        Packer {
            last_of_tid: FastMap::default(),
            elide: Vec::new(),
            socks: (version >= 4).then(SockTable::default),
            fingerprints: Fingerprints::of_format(version),
        }
    }

    fn pack(&mut self, batch: &mut EventBatch) {
        let events = &mut batch.events;
        batch.ts_deltas.clear();
        batch.prints.clear();
        // Which comms repeat their thread's previous one, decided before any is touched.
        self.last_of_tid.clear();
        self.elide.clear();
        for (i, e) in events.iter().enumerate() {
            let prev = self.last_of_tid.insert(e.tid, i);
            self.elide
                .push(prev.is_some_and(|j| events[j].comm == e.comm));
        }
        let mut prev_ts = 0u64;
        for (e, &elide) in events.iter_mut().zip(&self.elide) {
            let ts = std::mem::take(&mut e.ts_ns);
            batch
                .ts_deltas
                .push(zigzag(ts.wrapping_sub(prev_ts) as i64));
            prev_ts = ts;
            each_print(e, self.fingerprints, &mut |p| {
                batch.prints.push(std::mem::take(p))
            });
            if elide {
                e.comm.clear();
            } else if e.comm.is_empty() || e.comm.starts_with(COMM_ESCAPE) {
                e.comm.insert(0, COMM_ESCAPE);
            }
            if let (Some(table), Some((sock, fd))) = (&mut self.socks, sock_of(e)) {
                table.pack(sock, fd);
            }
        }
    }
}

/// Frames through the current format's packing, protobuf and the reader's own
/// decoding and unpacking, without zstd and CRC (format 3's, unchanged): what a
/// recording of these frames reads back as, for the fuzz target `record_batch`.
pub(super) fn repack(frames: Vec<Vec<Event>>) -> Result<Vec<Vec<Event>>, String> {
    let mut packer = Packer::for_format(super::FORMAT_VERSION);
    let mut columns = Columns::default();
    let mut last_of_tid = FastMap::default();
    let mut socks = SockTable::default();
    let mut plain = Vec::new();
    frames
        .into_iter()
        .map(|events| {
            let mut batch = EventBatch {
                events,
                ..EventBatch::default()
            };
            packer.pack(&mut batch);
            plain.clear();
            columns.encode(&batch, &mut plain);
            let batch = unpack_events(
                &plain,
                Vec::new(),
                &mut last_of_tid,
                Some(&mut socks),
                packer.fingerprints,
            )?;
            Ok(batch.events)
        })
        .collect()
}

/// `batch` packed as the first frame of a file of the current format.
#[cfg(test)]
pub(super) fn pack_for_tests(batch: &mut EventBatch) {
    Packer::for_format(super::FORMAT_VERSION).pack(batch);
}

/// Batches as a frame of the current format holds them once out of zstd, unpacked in
/// turn: for the fuzz target `record_batch` (what a crafted frame that passes its CRC
/// gives the reader; an error, never a panic).
pub(super) fn unpack_plain(plains: &[&[u8]]) -> Result<Vec<Vec<Event>>, String> {
    let mut last_of_tid = FastMap::default();
    let mut socks = SockTable::default();
    let fingerprints = Fingerprints::of_format(super::FORMAT_VERSION);
    plains
        .iter()
        .map(|plain| {
            let batch = unpack_events(
                plain,
                Vec::new(),
                &mut last_of_tid,
                Some(&mut socks),
                fingerprints,
            )?;
            Ok(batch.events)
        })
        .collect()
}

/// The reading side of a recording's frames, by format.
pub(super) enum Decoding {
    Plain,
    PerFrame,
    Stream {
        zstd: Box<Decoder<'static>>,
        last_of_tid: FastMap<u32, usize>,
        /// The frame being read, unpacked (its room kept for the next); from format 6
        /// on, the whole zstd frame it belongs to so far (see `unpack_stable`).
        plain: Vec<u8>,
        /// Format 6 on: zstd writes into `plain` directly (`unpack_stable`), and the
        /// last call ended a zstd frame.
        stable: Option<StableOut>,
        /// Format 4's table (None: format 3).
        socks: Option<Box<SockTable>>,
        fingerprints: Fingerprints,
    },
}

impl Decoding {
    pub(super) fn for_format(version: u32) -> io::Result<Decoding> {
        Ok(match version {
            1 => Decoding::Plain,
            2 => Decoding::PerFrame,
            _ => {
                let mut zstd = Decoder::new()?;
                zstd.set_parameter(DParameter::WindowLogMax(WINDOW_LOG))?;
                let stable = (version >= 6).then(|| StableOut::new(STABLE_ROOM));
                if stable.is_some() {
                    zstd.set_parameter(DParameter::StableOutBuffer(true))?;
                }
                Decoding::Stream {
                    zstd: Box::new(zstd),
                    last_of_tid: FastMap::default(),
                    plain: Vec::new(),
                    stable,
                    socks: (version >= 4).then(Box::default),
                    fingerprints: Fingerprints::of_format(version),
                }
            }
        })
    }

    /// A frame's events from its bytes (without the length varint). `recycled`: a batch
    /// done with, whose events the frame's columnar ones are written over (see
    /// `columns::expand`); empty for none.
    pub(super) fn events(
        &mut self,
        bytes: Vec<u8>,
        recycled: Vec<Event>,
    ) -> Result<Vec<Event>, String> {
        let decoded = match self {
            Decoding::Plain => super::batch::decode(&bytes),
            Decoding::PerFrame => super::batch::decode(&unpack_alone(&bytes)?),
            Decoding::Stream {
                zstd,
                plain,
                stable,
                last_of_tid,
                socks,
                fingerprints,
            } => {
                let (crc, packed) = bytes
                    .split_first_chunk::<4>()
                    .ok_or("a frame shorter than its checksum")?;
                if u32::from_le_bytes(*crc) != crc32(packed) {
                    return Err("checksum mismatch: the frame's bytes are damaged".into());
                }
                let frame = match stable {
                    Some(stable) => unpack_stable(zstd, packed, plain, stable)?,
                    None => {
                        unpack_in_stream(zstd, packed, plain)?;
                        0..plain.len()
                    }
                };
                let batch = unpack_events(
                    &plain[frame],
                    recycled,
                    last_of_tid,
                    socks.as_deref_mut(),
                    *fingerprints,
                )?;
                return Ok(batch.events);
            }
        };
        Ok(decoded.map_err(|e| e.to_string())?.events)
    }
}

/// Undoes `Encoder::pack`.
fn unpack_events(
    plain: &[u8],
    recycled: Vec<Event>,
    last_of_tid: &mut FastMap<u32, usize>,
    mut socks: Option<&mut SockTable>,
    fingerprints: Fingerprints,
) -> Result<EventBatch, String> {
    let (mut batch, spans) = super::batch::decode_in_place(plain).map_err(|e| e.to_string())?;
    let (shapes, columns) = (&plain[spans.shapes], &plain[spans.columns]);
    super::columns::expand(&mut batch, shapes, columns, recycled)?;
    let events = &mut batch.events;
    if batch.ts_deltas.len() != events.len() {
        return Err(format!(
            "{} timestamps for {} events",
            batch.ts_deltas.len(),
            events.len()
        ));
    }
    last_of_tid.clear();
    let mut prints = batch.prints.iter();
    let mut short = false;
    let mut prev_ts = 0u64;
    for (i, &delta) in batch.ts_deltas.iter().enumerate() {
        // The events before (a thread's last comm) and this one, one bounds check.
        let (before, rest) = events.split_at_mut(i);
        let Some(e) = rest.first_mut() else { break };
        each_print(e, fingerprints, &mut |p| match prints.next() {
            Some(v) => *p = *v,
            None => short = true,
        });
        let ts = prev_ts.wrapping_add(unzigzag(delta) as u64);
        e.ts_ns = ts;
        prev_ts = ts;
        // One lookup of the thread's last event (an entry: this is per event).
        let last = last_of_tid.entry(e.tid).or_insert(i);
        let j = std::mem::replace(last, i);
        if e.comm.is_empty() {
            if let Some(prev) = before.get(j) {
                e.comm = prev.comm.clone();
            }
        } else if e.comm.starts_with(COMM_ESCAPE) {
            e.comm.remove(0);
        }
        if let (Some(table), Some((sock, fd))) = (&mut socks, sock_of(e)) {
            table.unpack(sock, fd)?;
        }
    }
    if short || prints.next().is_some() {
        let n = batch.prints.len();
        return Err(format!("{n} sniff hashes do not fit the frame's events"));
    }
    Ok(batch)
}

/// Whether the sniffs' own fingerprints are in the prints column (formats 3 to 5) or
/// left in their events (format 6 on).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Fingerprints {
    InPrints,
    InEvents,
}

impl Fingerprints {
    fn of_format(version: u32) -> Fingerprints {
        if version >= 6 {
            Fingerprints::InEvents
        } else {
            Fingerprints::InPrints
        }
    }
}

/// Every hash of an event that goes to the prints column, in a fixed order (the
/// column's).
fn each_print(e: &mut Event, fingerprints: Fingerprints, f: &mut impl FnMut(&mut u64)) {
    if let Some(Body::Io(SockIo {
        sniff: Some(sniff), ..
    })) = &mut e.body
    {
        sniff_prints(sniff, fingerprints, f);
    }
}

/// A sniff's hashes, then each HTTP/2 stream's in turn. Its own are walked inline (an
/// event's one or two: a call per event, through the recursion, was 50 instructions);
/// the streams', rare, in `stream_prints`.
#[inline(always)]
fn sniff_prints<F: FnMut(&mut u64)>(s: &mut Sniff, fingerprints: Fingerprints, f: &mut F) {
    if fingerprints == Fingerprints::InPrints {
        f(&mut s.fingerprint);
    }
    for x in &mut s.sse {
        f(&mut x.fingerprint);
        f(&mut x.text_print);
    }
    if let Some(b) = &mut s.body_print {
        f(&mut b.hash);
    }
    s.prefix_prints.iter_mut().for_each(&mut *f);
    for h in &mut s.h2_streams {
        if let Some(inner) = &mut h.sniff {
            stream_prints(inner, fingerprints, f);
        }
    }
}

/// `sniff_prints` of an HTTP/2 stream's sniff.
#[inline(never)]
fn stream_prints<F: FnMut(&mut u64)>(s: &mut Sniff, fingerprints: Fingerprints, f: &mut F) {
    sniff_prints(s, fingerprints, f)
}

fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = flate2::Crc::new();
    crc.update(bytes);
    crc.sum()
}

/// A format 2 frame's batch from its zstd bytes, never more than `MAX_FRAME` of it (a
/// frame that claims more is corrupt, not a reason to allocate).
fn unpack_alone(packed: &[u8]) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let decoder = zstd::stream::read::Decoder::new(packed).map_err(|e| format!("zstd: {e}"))?;
    let mut out = Vec::new();
    decoder
        .take(MAX_FRAME + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("zstd: {e}"))?;
    if out.len() as u64 > MAX_FRAME {
        return Err(format!("a frame unpacks to more than {MAX_FRAME} bytes"));
    }
    Ok(out)
}

/// A format 3 frame's batch, into `out`: its bytes run through the file's stream
/// straight into `out`'s room, never more than `MAX_FRAME` out.
fn unpack_in_stream(
    zstd: &mut Decoder<'static>,
    packed: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), String> {
    out.clear();
    let mut input = InBuffer::around(packed);
    loop {
        out.reserve(64 << 10);
        let (before, room) = (out.len(), out.capacity() - out.len());
        let mut output = OutBuffer::around_pos(out, before);
        zstd.run(&mut input, &mut output)
            .map_err(|e| format!("zstd: {e}"))?;
        let got = output.pos() - before;
        if out.len() as u64 > MAX_FRAME {
            return Err(format!("a frame unpacks to more than {MAX_FRAME} bytes"));
        }
        // Done once all input is taken and the decoder had no more to give.
        if input.pos() == packed.len() && got < room {
            return Ok(());
        }
    }
}
