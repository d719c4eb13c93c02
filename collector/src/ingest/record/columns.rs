//! Format 5: a frame's plain socket I/Os and libcuda calls as columns rather than as
//! protobuf messages. Those two kinds are nearly every event of a recording, and
//! reading each one field by field, a key, a branch and a value per field, was half of
//! a replay's instructions (1,100 per event). On issue 17's bench recording 96% of the
//! events go to the columns; the rest are each thread's first event of a frame (its
//! comm), sockets seen first and HTTP heads. Here each
//! field of such an event is one varint in a column of its own, read in a fixed
//! order with no key, and what is rare (an HTTP head, TLS records, HTTP/2 streams, a
//! comm written out, a socket written whole, any value out of the columns' ranges) stays
//! a whole event (`EventBatch::events`), so every event still reads back exactly.
//!
//! A batch's `shapes` holds one byte per event in order: `WHOLE` (the next of
//! `events`), `IO` or `CUDA` (the next values of the columns). `columns` holds the
//! columns in `Column` order, each a varint length and its varints. Timestamps, comms,
//! prints and sockets are then packed and unpacked as in format 4 (`frame`): a
//! columnar event is one whose comm is left out, whose prints went to the prints
//! column and whose socket is left out or a reference.

use prost::encoding::{bytes, encode_key, encode_varint, encoded_len_varint, WireType};

use super::batch::{unzigzag, varint, zigzag};
use super::EventBatch;
use crate::ingest::model::event::Body;
use crate::ingest::model::{BodyPrint, CudaCall, Event, Sniff, Sock, SockIo, SseEvent};

/// An event of `EventBatch::events`.
const WHOLE: u8 = 0;
/// A socket I/O from the columns.
const IO: u8 = 1;
/// A libcuda call from the columns.
const CUDA: u8 = 2;

/// The columns, in the order a batch holds them.
#[derive(Clone, Copy)]
enum Column {
    Pid,
    Tid,
    Cpu,
    /// Direction | syscall << 2.
    IoKind,
    /// `io_flags`.
    IoFlags,
    /// 0: left out (the fd's last socket); n: a reference to slot n - 1.
    Sock,
    /// Zigzag.
    Fd,
    Bytes,
    /// When it differs from `Bytes`.
    Captured,
    BodyBytes,
    /// How many SSE events, when more than one.
    SseCount,
    /// Kind | token << 2 | (choice != 0) << 4 | api << 5.
    Sse,
    Choice,
    BodyLength,
    Limits,
    /// Entry | per-thread stream << 1 | api << 2.
    Cuda,
    CudaStream,
    CudaBytes,
    /// Zigzag.
    CudaResult,
}

const COLUMNS: usize = Column::CudaResult as usize + 1;

/// `IoFlags` bits.
mod io_flags {
    pub(super) const PAYLOAD_FAULT: u64 = 1;
    pub(super) const SNIFF: u64 = 1 << 1;
    pub(super) const MESSAGE_START: u64 = 1 << 2;
    pub(super) const MESSAGE_END: u64 = 1 << 3;
    pub(super) const UNPARSED: u64 = 1 << 4;
    pub(super) const COMPRESSED: u64 = 1 << 5;
    pub(super) const BODY_PRINT: u64 = 1 << 6;
    pub(super) const LIMITS: u64 = 1 << 7;
    pub(super) const BODY_BYTES: u64 = 1 << 8;
    pub(super) const ONE_SSE: u64 = 1 << 9;
    pub(super) const MANY_SSE: u64 = 1 << 10;
    pub(super) const CAPTURED_ALL: u64 = 1 << 11;
    pub(super) const ALL: u64 = (1 << 12) - 1;
}

/// The writing side: a frame's shapes and columns, their room kept for the next frame.
#[derive(Default)]
pub(super) struct Columns {
    shapes: Vec<u8>,
    columns: [Vec<u8>; COLUMNS],
}

impl Columns {
    /// `batch` (packed) as a format 5 batch's bytes, into `out`: the events that do not
    /// fit the columns as whole events, then the timestamps, prints, shapes and columns,
    /// in tag order as prost writes a batch.
    pub(super) fn encode(&mut self, batch: &EventBatch, out: &mut Vec<u8>) {
        self.shapes.clear();
        self.columns.iter_mut().for_each(Vec::clear);
        for e in &batch.events {
            let shape = self.put(e);
            if shape == WHOLE {
                e.encode_in_batch(out);
            }
            self.shapes.push(shape);
        }
        EventBatch::encode_columns(&batch.ts_deltas, &batch.prints, out);
        if self.shapes.is_empty() {
            return;
        }
        bytes::encode(4, &self.shapes, out);
        let len: usize = self
            .columns
            .iter()
            .map(|c| c.len() + encoded_len_varint(c.len() as u64))
            .sum();
        encode_key(5, WireType::LengthDelimited, out);
        encode_varint(len as u64, out);
        for c in &self.columns {
            encode_varint(c.len() as u64, out);
            out.extend_from_slice(c);
        }
    }

    /// `e` into the columns and its shape, or `WHOLE` (nothing written) when it does not
    /// fit them.
    fn put(&mut self, e: &Event) -> u8 {
        if e.ts_ns != 0 || !e.comm.is_empty() {
            return WHOLE;
        }
        let shape = match &e.body {
            Some(Body::Io(io)) if io_fits(io) => IO,
            Some(Body::Cuda(c)) if (0..1 << 20).contains(&c.api) => CUDA,
            _ => return WHOLE,
        };
        self.push(Column::Pid, u64::from(e.pid));
        self.push(Column::Tid, u64::from(e.tid));
        self.push(Column::Cpu, u64::from(e.cpu));
        match &e.body {
            Some(Body::Io(io)) => self.put_io(io),
            Some(Body::Cuda(c)) => {
                let word = u64::from(c.entry) | u64::from(c.per_thread_stream) << 1;
                self.push(Column::Cuda, word | (c.api as u64) << 2);
                self.push(Column::CudaStream, c.stream);
                self.push(Column::CudaBytes, c.bytes);
                self.push(Column::CudaResult, zigzag(c.result));
            }
            _ => unreachable!("shape chosen above"),
        }
        shape
    }

    fn put_io(&mut self, io: &SockIo) {
        use io_flags::*;
        let mut flags = if io.payload_fault { PAYLOAD_FAULT } else { 0 };
        if u64::from(io.captured) == io.bytes {
            flags |= CAPTURED_ALL;
        }
        if let Some(s) = &io.sniff {
            flags |= SNIFF;
            for (set, bit) in [
                (s.message_start, MESSAGE_START),
                (s.message_end, MESSAGE_END),
                (s.unparsed, UNPARSED),
                (s.compressed, COMPRESSED),
                (s.body_print.is_some(), BODY_PRINT),
                (s.limits != 0, LIMITS),
                (s.body_bytes != 0, BODY_BYTES),
                (s.sse.len() == 1, ONE_SSE),
                (s.sse.len() > 1, MANY_SSE),
            ] {
                if set {
                    flags |= bit;
                }
            }
        }
        self.push(Column::IoKind, (io.dir | io.syscall << 2) as u64);
        self.push(Column::IoFlags, flags);
        let sock = io.sock.as_ref().map_or(0, |s| s.skaddr + 1);
        self.push(Column::Sock, sock);
        self.push(Column::Fd, zigzag(i64::from(io.fd)));
        self.push(Column::Bytes, io.bytes);
        if flags & CAPTURED_ALL == 0 {
            self.push(Column::Captured, u64::from(io.captured));
        }
        let Some(s) = &io.sniff else { return };
        if s.body_bytes != 0 {
            self.push(Column::BodyBytes, s.body_bytes);
        }
        if s.sse.len() > 1 {
            self.push(Column::SseCount, s.sse.len() as u64);
        }
        for x in &s.sse {
            let word = x.kind | x.token << 2 | i32::from(x.choice != 0) << 4 | x.api << 5;
            self.push(Column::Sse, word as u64);
            if x.choice != 0 {
                self.push(Column::Choice, u64::from(x.choice));
            }
        }
        if let Some(b) = &s.body_print {
            self.push(Column::BodyLength, b.length);
        }
        if s.limits != 0 {
            self.push(Column::Limits, u64::from(s.limits));
        }
    }

    fn push(&mut self, column: Column, value: u64) {
        encode_varint(value, &mut self.columns[column as usize]);
    }
}

/// Whether a packed socket I/O fits the columns: its socket left out or a reference,
/// its sniff (if any) without a head, TLS records, HTTP/2 or prefix prints, its prints
/// in the prints column, and its enums and flags in their columns' bits.
fn io_fits(io: &SockIo) -> bool {
    let sock = match &io.sock {
        None => true,
        Some(s) => {
            s.skaddr < u64::from(u32::MAX)
                && s.saddr.is_empty()
                && s.daddr.is_empty()
                && s.sport == 0
                && s.dport == 0
        }
    };
    let sniff = io.sniff.as_ref().is_none_or(|s| {
        s.fingerprint == 0
            && s.kind.is_none()
            && s.prefix_prints.is_empty()
            && s.h2_streams.is_empty()
            && s.h2_control_frames == 0
            && s.h2_errors == 0
            && !s.h2_preface
            && s.body_print.is_none_or(|b| b.hash == 0)
            && s.sse.iter().all(|x| {
                x.fingerprint == 0
                    && x.text_print == 0
                    && (0..4).contains(&x.kind)
                    && (0..4).contains(&x.token)
                    && (0..1 << 20).contains(&x.api)
            })
    });
    sock && sniff && (0..4).contains(&io.dir) && (0..1 << 20).contains(&io.syscall)
}

/// The reading side: a format 5 batch's events in order, the columnar ones made from
/// the columns, into `batch.events`. A batch without shapes (every older format's) is
/// left as it is. `recycled`: events of a batch done with (`Source::recycle`), written
/// over where they lie rather than made anew and dropped (a default written and drop
/// glue run per event otherwise: on issue 17's bench recording, recycling takes a
/// one-core `report` from 990 M instructions to 953 M, and its L2 misses in
/// cachegrind's model from 6.4 M to 5.2 M); empty for a batch of new events.
/// `shapes` and `columns`: the batch's, where they lie in the frame's bytes
/// (`batch::decode_in_place`).
pub(super) fn expand(
    batch: &mut EventBatch,
    shapes: &[u8],
    columns: &[u8],
    mut recycled: Vec<Event>,
) -> Result<(), String> {
    if shapes.is_empty() {
        if !columns.is_empty() {
            return Err("columns without shapes".into());
        }
        return Ok(());
    }
    let mut reader = Reader::new(columns)?;
    let mut whole = std::mem::take(&mut batch.events).into_iter();
    let n = shapes.len();
    recycled.truncate(n);
    recycled.reserve(n - recycled.len());
    let mut events = recycled;
    let reused = events.len();
    for (k, &shape) in shapes.iter().enumerate() {
        if shape == WHOLE {
            let e = whole
                .next()
                .ok_or("the shapes name more whole events than the frame holds")?;
            if k < reused {
                events[k] = e;
            } else {
                events.push(e);
            }
            continue;
        }
        // Made in place: an event is ~330 bytes, and each move of one a copy.
        if k >= reused {
            events.push(Event::default());
        }
        let e = &mut events[k];
        match shape {
            IO => reader.io(e)?,
            CUDA => reader.cuda(e)?,
            other => return Err(format!("an event of shape {other}")),
        }
    }
    if whole.next().is_some() {
        return Err("whole events the shapes do not name".into());
    }
    if let Some(c) = reader.columns.iter().position(|c| !c.is_empty()) {
        return Err(format!(
            "values left in column {c} after the frame's events"
        ));
    }
    batch.events = events;
    Ok(())
}

struct Reader<'a> {
    columns: [&'a [u8]; COLUMNS],
    /// The first column that ran out, held a bad varint or a value out of its range:
    /// checked once per event, not per value (a `Result` per value was 40 instructions
    /// of the 60 a value took).
    bad: Option<usize>,
}

impl<'a> Reader<'a> {
    fn new(mut blob: &'a [u8]) -> Result<Reader<'a>, String> {
        let mut columns = [&[][..]; COLUMNS];
        for (i, c) in columns.iter_mut().enumerate() {
            let len = varint(&mut blob)
                .and_then(|n| usize::try_from(n).ok())
                .filter(|&n| n <= blob.len())
                .ok_or_else(|| format!("column {i}'s length runs past the frame"))?;
            (*c, blob) = blob.split_at(len);
        }
        if !blob.is_empty() {
            return Err(format!("{} bytes after the frame's columns", blob.len()));
        }
        Ok(Reader { columns, bad: None })
    }

    /// The event just read, or what was wrong with its values.
    fn checked(&self) -> Result<(), String> {
        match self.bad {
            None => Ok(()),
            Some(c) => Err(format!(
                "column {c} ends before the frame's events, or holds a bad varint or a \
                 value out of its range"
            )),
        }
    }

    #[inline(always)]
    fn take(&mut self, column: Column) -> u64 {
        match varint(&mut self.columns[column as usize]) {
            Some(v) => v,
            None => {
                self.bad.get_or_insert(column as usize);
                0
            }
        }
    }

    #[inline(always)]
    fn take_u32(&mut self, column: Column) -> u32 {
        let v = self.take(column);
        self.narrow(v, column)
    }

    #[inline(always)]
    fn narrow<T: TryFrom<i64> + Default>(&mut self, v: impl TryInto<i64>, column: Column) -> T {
        match v.try_into().ok().and_then(|v| T::try_from(v).ok()) {
            Some(v) => v,
            None => {
                self.bad.get_or_insert(column as usize);
                T::default()
            }
        }
    }

    /// The head of a columnar event (its comm left out: unpacking copies the thread's;
    /// its time comes from the timestamps column), whatever `e` held before.
    #[inline(always)]
    fn head(&mut self, e: &mut Event) {
        e.comm.clear();
        e.pid = self.take_u32(Column::Pid);
        e.tid = self.take_u32(Column::Tid);
        e.cpu = self.take_u32(Column::Cpu);
    }

    /// A socket I/O into `e`, a default event or a recycled one of any kind: every field
    /// is written (a recycled I/O's vectors keep their room).
    fn io(&mut self, e: &mut Event) -> Result<(), String> {
        use io_flags::*;
        self.head(e);
        let kind = self.take(Column::IoKind);
        let flags = self.take(Column::IoFlags);
        if kind >= 1 << 22 || flags & !ALL != 0 {
            return Err(format!("a socket I/O of kind {kind:#x}, flags {flags:#x}"));
        }
        if !matches!(e.body, Some(Body::Io(_))) {
            e.body = Some(Body::Io(SockIo::default()));
        }
        let Some(Body::Io(io)) = &mut e.body else {
            unreachable!("set above")
        };
        // Every field written (the recycled-batch test sets each one in the batch it
        // recycles).
        io.dir = (kind & 3) as i32;
        io.syscall = (kind >> 2) as i32;
        io.payload_fault = flags & PAYLOAD_FAULT != 0;
        io.sock = match self.take(Column::Sock) {
            0 => None,
            n => Some(Sock {
                skaddr: n - 1,
                ..Sock::default()
            }),
        };
        let fd = unzigzag(self.take(Column::Fd));
        io.fd = self.narrow(fd, Column::Fd);
        io.bytes = self.take(Column::Bytes);
        io.captured = if flags & CAPTURED_ALL != 0 {
            self.narrow(io.bytes, Column::Bytes)
        } else {
            self.take_u32(Column::Captured)
        };
        if flags & SNIFF != 0 {
            let s = match &mut io.sniff {
                Some(s) => {
                    prost::Message::clear(s);
                    s
                }
                none => none.insert(Sniff::default()),
            };
            self.sniff(flags, s);
        } else {
            io.sniff = None;
        }
        self.checked()
    }

    fn sniff(&mut self, flags: u64, s: &mut Sniff) {
        use io_flags::*;
        s.message_start = flags & MESSAGE_START != 0;
        s.message_end = flags & MESSAGE_END != 0;
        s.unparsed = flags & UNPARSED != 0;
        s.compressed = flags & COMPRESSED != 0;
        if flags & BODY_BYTES != 0 {
            s.body_bytes = self.take(Column::BodyBytes);
        }
        let events = if flags & MANY_SSE != 0 {
            let n = self.take(Column::SseCount);
            // Each event takes a byte of its column at least: a count past that is damage,
            // not an allocation to make.
            if n > self.columns[Column::Sse as usize].len() as u64 {
                self.bad.get_or_insert(Column::SseCount as usize);
                0
            } else {
                n as usize
            }
        } else {
            usize::from(flags & ONE_SSE != 0)
        };
        for _ in 0..events {
            let word = self.take(Column::Sse);
            if word >= 1 << 25 {
                self.bad.get_or_insert(Column::Sse as usize);
            }
            let choice = if word & 1 << 4 != 0 {
                self.take_u32(Column::Choice)
            } else {
                0
            };
            s.sse.push(SseEvent {
                kind: (word & 3) as i32,
                token: (word >> 2 & 3) as i32,
                api: (word >> 5 & 0xf_ffff) as i32,
                choice,
                ..SseEvent::default()
            });
        }
        if flags & BODY_PRINT != 0 {
            s.body_print = Some(BodyPrint {
                hash: 0,
                length: self.take(Column::BodyLength),
            });
        }
        if flags & LIMITS != 0 {
            s.limits = self.take_u32(Column::Limits);
        }
    }

    /// A libcuda call into `e` (a default event or a recycled one).
    fn cuda(&mut self, e: &mut Event) -> Result<(), String> {
        self.head(e);
        let word = self.take(Column::Cuda);
        if word >= 1 << 22 {
            return Err(format!("a libcuda call of word {word:#x}"));
        }
        e.body = Some(Body::Cuda(CudaCall {
            entry: word & 1 != 0,
            per_thread_stream: word & 2 != 0,
            api: (word >> 2) as i32,
            stream: self.take(Column::CudaStream),
            bytes: self.take(Column::CudaBytes),
            result: unzigzag(self.take(Column::CudaResult)),
        }));
        self.checked()
    }
}
