//! The trace's bytes on their way to the file. Packets are gathered as a Trace message
//! (each packet field 1) and written in bundles of about `BUNDLE_BYTES`: deflated, a
//! bundle is one TracePacket whose `compressed_packets` (field 50) holds it in zlib
//! format, as Perfetto's own service writes a trace configured with
//! `compression_type: COMPRESSION_TYPE_DEFLATE`. Trace processor (the UI, the Python
//! bindings, traceconv) expands a bundle and reads each packet in its place, so the
//! sequences, interning and the incremental clock run across bundles unchanged.
//! Bundles are deflated on a thread of their own (`Deflater`) while the next ones are
//! encoded, and by the encoding thread too whenever that thread is behind; they are
//! written in the order they were made: the same bytes as deflating each in turn.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::sync::mpsc;
use std::thread::JoinHandle;

use flate2::{Compress, FlushCompress, Status};

use super::wire::varint;

/// TracePacket.compressed_packets.
const COMPRESSED_PACKETS: u64 = 50;
/// Packets gathered before a bundle is written. Measured (zlib level 1) on a replayed
/// recording: 6 KB bundles cost 11 B of trace per token event, 24 KB 10 B, 100 KB and
/// more 9.7 B; trace processor holds one expanded bundle at a time.
const BUNDLE_BYTES: usize = 128 * 1024;
/// zlib's level. zlib-rs on the x30 fixture replay (5.80 MB of packets), best CPU of
/// five exports: level 1 0.24 s and 1.90 MB, 2 0.23 s 1.51 MB, 3 0.24 s 1.42 MB, 6
/// 0.30 s 1.26 MB (miniz_oxide: 0.24 s 1.70 MB at 1, 0.28 s 1.36 MB at 3). With one
/// window the packets are encoded after the last event, and the export then waits for
/// the deflating thread: on the bench recording (9.2 MB of packets, encoded in 23 ms)
/// deflating took 52 ms at level 3 and 39 at level 2, for 2.58 and 2.64 MB (1 gives
/// 3.44 MB, over a third of the packets' bytes).
const LEVEL: u32 = 2;

/// How the trace's packets reach the file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Compression {
    /// Bundles of packets deflated into `compressed_packets` (under a third of the
    /// bytes); what `tokenscope export` writes by default.
    #[default]
    Deflate,
    /// Every packet at the top level of the file, for readers that decode the
    /// protobuf themselves without expanding `compressed_packets`.
    None,
}

pub(super) struct Bundles<'a> {
    out: &'a mut dyn Write,
    /// Encoded packets not yet written, each as a Trace.packet field.
    pending: Vec<u8>,
    deflater: Option<Deflater>,
    /// Bytes written to `out`.
    pub(super) written: u64,
    /// Bytes of the packets before compression (`written` when there is none).
    pub(super) encoded: u64,
    /// Bundles written (0 without compression).
    pub(super) bundles: u64,
}

impl<'a> Bundles<'a> {
    pub(super) fn new(out: &'a mut dyn Write, compression: Compression) -> Self {
        let deflater = match compression {
            Compression::Deflate => Some(Deflater::default()),
            Compression::None => None,
        };
        Bundles {
            out,
            pending: Vec::with_capacity(BUNDLE_BYTES + 4096),
            deflater,
            written: 0,
            encoded: 0,
            bundles: 0,
        }
    }

    /// Where the next packet is encoded: append the field's key, its length and the
    /// packet, then call `packet_done`.
    pub(super) fn buf(&mut self) -> &mut Vec<u8> {
        &mut self.pending
    }

    /// One packet more in `buf`: writes the bundle once it is full.
    pub(super) fn packet_done(&mut self) -> io::Result<()> {
        if self.pending.len() >= BUNDLE_BYTES {
            self.write_pending()?;
        }
        Ok(())
    }

    /// Writes what is pending and flushes.
    pub(super) fn finish(&mut self) -> io::Result<()> {
        self.write_pending()?;
        while self.deflater.as_ref().is_some_and(|d| !d.order.is_empty()) {
            self.write_deflated(true)?;
        }
        self.out.flush()
    }

    fn write_pending(&mut self) -> io::Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        self.encoded += self.pending.len() as u64;
        let Some(d) = self.deflater.as_mut() else {
            self.out.write_all(&self.pending)?;
            self.written += self.pending.len() as u64;
            self.pending.clear();
            return Ok(());
        };
        let spare = d
            .spare
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(BUNDLE_BYTES + 4096));
        let bundle = std::mem::replace(&mut self.pending, spare);
        if d.thread.is_some() && d.in_flight() < IN_FLIGHT {
            d.send(bundle)?;
        } else {
            // The thread has its hands full (or there is none): this one is deflated
            // here rather than waited for.
            let own = d.own.get_or_insert_with(compressor);
            let deflated = deflate(own, &bundle)?;
            d.done(deflated, bundle);
        }
        // Those done are written now; past `QUEUED` this waits for the oldest.
        let full = d.order.len() > QUEUED;
        self.write_deflated(full)
    }

    /// Writes the bundles deflated so far, in the order they were made; `wait`: at
    /// least the oldest one, waiting for it.
    fn write_deflated(&mut self, mut wait: bool) -> io::Result<()> {
        let Some(d) = self.deflater.as_mut() else {
            return Ok(());
        };
        while let Some(front) = d.order.front_mut() {
            let deflated = match front.take() {
                Some(deflated) => deflated,
                None => {
                    let Some((deflated, mut buf)) = d.receive(wait)? else {
                        return Ok(());
                    };
                    buf.clear();
                    d.spare.push(buf);
                    deflated
                }
            };
            d.order.pop_front();
            wait = false;
            // Trace.packet { compressed_packets: the deflated bundle }.
            let mut head = Vec::with_capacity(24);
            let inner = deflated.len() as u64;
            varint(&mut head, 1 << 3 | 2);
            varint(&mut head, 2 + varint_len(inner) + inner);
            varint(&mut head, COMPRESSED_PACKETS << 3 | 2);
            varint(&mut head, inner);
            self.out.write_all(&head)?;
            self.out.write_all(&deflated)?;
            self.written += head.len() as u64 + inner;
            self.bundles += 1;
        }
        Ok(())
    }
}

/// Bundles deflated while the next ones are laid out and encoded: zlib is a quarter
/// of an export's work (callgrind, a bench recording), on its own thread here.
const IN_FLIGHT: usize = 3;
/// Bundles made and not yet written, at most (beyond, the oldest is waited for).
const QUEUED: usize = 4 * IN_FLIGHT;

/// zlib on a thread of its own: bundles go in one at a time and come back deflated in
/// the same order (one thread, two queues), each with its emptied buffer for reuse.
/// When the thread has `IN_FLIGHT` bundles already, the caller deflates the next one
/// itself: with one window, every packet is encoded after the last event, and the
/// encoding (23 ms on the bench recording) outran zlib (39 ms), then waited for it.
struct Deflater {
    to: Option<mpsc::SyncSender<Vec<u8>>>,
    from: mpsc::Receiver<io::Result<(Vec<u8>, Vec<u8>)>>,
    thread: Option<JoinHandle<()>>,
    /// Bundles in the order made, not yet written: None while on the thread (sent, not
    /// yet received), else deflated by the caller.
    order: VecDeque<Option<Vec<u8>>>,
    /// zlib for the bundles deflated by the caller.
    own: Option<Compress>,
    /// Buffers back from the thread for the next bundles.
    spare: Vec<Vec<u8>>,
}

fn compressor() -> Compress {
    Compress::new(flate2::Compression::new(LEVEL), true)
}

impl Default for Deflater {
    fn default() -> Deflater {
        let (to, inbox) = mpsc::sync_channel::<Vec<u8>>(IN_FLIGHT);
        let (outbox, from) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("tokenscope-deflate".into())
            .spawn(move || {
                let mut c = compressor();
                for bundle in inbox {
                    let deflated = deflate(&mut c, &bundle).map(|d| (d, bundle));
                    if outbox.send(deflated).is_err() {
                        return;
                    }
                }
            })
            .ok();
        Deflater {
            to: Some(to),
            from,
            thread,
            order: VecDeque::new(),
            own: None,
            spare: Vec::new(),
        }
    }
}

impl Deflater {
    fn send(&mut self, bundle: Vec<u8>) -> io::Result<()> {
        let sent = self.to.as_ref().is_some_and(|to| to.send(bundle).is_ok());
        if !sent {
            return Err(self.stopped());
        }
        self.order.push_back(None);
        Ok(())
    }

    /// Bundles on the thread.
    fn in_flight(&self) -> usize {
        self.order.iter().filter(|b| b.is_none()).count()
    }

    /// A bundle deflated by the caller, in its place in the order.
    fn done(&mut self, deflated: Vec<u8>, mut bundle: Vec<u8>) {
        bundle.clear();
        self.spare.push(bundle);
        self.order.push_back(Some(deflated));
    }

    /// The oldest bundle deflated (`wait`: waiting for it), or None yet.
    fn receive(&mut self, wait: bool) -> io::Result<Option<(Vec<u8>, Vec<u8>)>> {
        let got = if wait {
            self.from.recv().ok()
        } else {
            match self.from.try_recv() {
                Ok(got) => Some(got),
                Err(mpsc::TryRecvError::Empty) => return Ok(None),
                Err(mpsc::TryRecvError::Disconnected) => None,
            }
        };
        let Some(got) = got else {
            return Err(self.stopped());
        };
        got.map(Some)
    }

    fn stopped(&self) -> io::Error {
        let why = if self.thread.is_none() {
            "could not be started"
        } else {
            "stopped"
        };
        io::Error::other(format!("the thread deflating the trace {why}"))
    }
}

impl Drop for Deflater {
    fn drop(&mut self) {
        // Closing its queue ends the thread once it is done with what it has.
        self.to = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One bundle in zlib format.
fn deflate(c: &mut Compress, bundle: &[u8]) -> io::Result<Vec<u8>> {
    c.reset();
    let mut deflated = Vec::new();
    loop {
        // compress_vec fills only the spare capacity: grow it until the stream ends.
        deflated.reserve(bundle.len() / 4 + 64);
        let read = c.total_in() as usize;
        let status = c
            .compress_vec(&bundle[read..], &mut deflated, FlushCompress::Finish)
            .map_err(io::Error::other)?;
        if status == Status::StreamEnd {
            return Ok(deflated);
        }
    }
}

fn varint_len(v: u64) -> u64 {
    u64::from((64 - (v | 1).leading_zeros()).div_ceil(7))
}

/// The trace's packets as written before compression: each bundle inflated in its
/// place (what trace processor reads). Errors name the packet that fails.
#[cfg(test)]
pub(super) fn expand(file: &[u8]) -> Result<Vec<u8>, String> {
    use perfetto_protos::trace::Trace;
    use protobuf::Message;
    let trace = Trace::parse_from_bytes(file).map_err(|e| format!("not a Trace: {e}"))?;
    let mut out = Vec::new();
    for (i, p) in trace.packet.iter().enumerate() {
        if !p.has_compressed_packets() {
            varint(&mut out, 1 << 3 | 2);
            p.write_length_delimited_to_vec(&mut out)
                .map_err(|e| format!("packet {i}: {e}"))?;
            continue;
        }
        std::io::Read::read_to_end(
            &mut flate2::read::ZlibDecoder::new(p.compressed_packets()),
            &mut out,
        )
        .map_err(|e| format!("packet {i}: the bundle does not inflate: {e}"))?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bundle_is_a_packet_whose_compressed_packets_inflate_to_the_packets_written() {
        // With the deflating thread (and the caller deflating whenever it is behind),
        // and without one (every bundle deflated by the caller): the same file.
        let with = bundled(false);
        assert!(with == bundled(true), "the same bytes without the thread");
    }

    fn bundled(without_thread: bool) -> Vec<u8> {
        use perfetto_protos::trace::Trace;
        use perfetto_protos::trace_packet::TracePacket;
        use protobuf::Message;
        let mut plain = Vec::new();
        let mut file = Vec::new();
        let mut b = Bundles::new(&mut file, Compression::Deflate);
        if without_thread {
            let d = b.deflater.as_mut().expect("deflating");
            d.to = None;
            d.thread.take().expect("a thread").join().expect("it ends");
        }
        // Enough packets for more bundles than are deflated at once (their order
        // across the deflating thread) and a part-filled last one.
        for i in 0..120_000u32 {
            let mut p = TracePacket::new();
            p.set_trusted_packet_sequence_id(1 + i % 3);
            p.set_timestamp(u64::from(i) * 1000);
            for out in [&mut plain, b.buf()] {
                varint(out, 1 << 3 | 2);
                p.write_length_delimited_to_vec(out).expect("encode");
            }
            b.packet_done().expect("write");
        }
        b.finish().expect("finish");
        let (bundles, encoded, written) = (b.bundles, b.encoded, b.written);
        assert_eq!(written, file.len() as u64);
        assert_eq!(encoded, plain.len() as u64);
        assert!(
            bundles > 2 * IN_FLIGHT as u64,
            "{bundles} bundles for {} bytes",
            plain.len()
        );
        assert!(
            written * 2 < encoded,
            "regular packets deflate to under half: {written} of {encoded} bytes"
        );
        let trace = Trace::parse_from_bytes(&file).expect("the file is a Trace");
        assert_eq!(trace.packet.len() as u64, bundles, "one packet per bundle");
        let expanded = expand(&file).expect("bundles expand");
        assert!(expanded == plain, "the packets written, byte for byte");
        file
    }

    #[test]
    fn without_compression_the_packets_are_written_as_they_are() {
        let mut file = Vec::new();
        let mut b = Bundles::new(&mut file, Compression::None);
        b.buf().extend_from_slice(&[0x0a, 0x02, 0x40, 0x01]);
        b.packet_done().expect("write");
        b.finish().expect("finish");
        assert_eq!((b.written, b.encoded, b.bundles), (4, 4, 0));
        assert_eq!(file, [0x0a, 0x02, 0x40, 0x01]);
    }

    #[test]
    fn varint_lengths() {
        for v in [0, 1, 127, 128, 16_383, 16_384, u64::MAX] {
            let mut out = Vec::new();
            varint(&mut out, v);
            assert_eq!(varint_len(v), out.len() as u64, "{v}");
        }
    }
}
