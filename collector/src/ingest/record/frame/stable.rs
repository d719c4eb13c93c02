//! Format 6 on: zstd writes each zstd frame straight into the reader's buffer.

use zstd::stream::raw::{Decoder, InBuffer, Operation, OutBuffer};

use super::{MAX_FRAME, WINDOW_LOG};

/// Reading format 6 on, whose writers end a zstd frame before its input passes the
/// window (`ZSTD_FRAME_INPUT`) unless a single record frame is larger: zstd writes
/// straight into the frame's buffer (`StableOutBuffer`), with no window of its own to
/// copy out of (that copy was 1.6% of a one-core `report`'s instructions on issue 17's
/// bench recording, and half of what reading wrote to memory).
pub(in crate::ingest::record) struct StableOut {
    /// The last call ended a zstd frame: the next starts over at the buffer's start.
    frame_ended: bool,
    /// The buffer's room (`STABLE_ROOM`; tests pass less).
    room: usize,
}

impl StableOut {
    pub(super) fn new(room: usize) -> StableOut {
        StableOut {
            frame_ended: true,
            room,
        }
    }
}

/// Room for one zstd frame written straight into: a record frame at most, after
/// what is left of a window's worth. Reserved once and touched only as far as a frame
/// reaches (a megabyte, with the recorder's frames).
pub(super) const STABLE_ROOM: usize = MAX_FRAME as usize + (1 << WINDOW_LOG);

/// A record frame's bytes through the file's stream, written by zstd into `buf` after
/// what its zstd frame already wrote there (zstd reads its matches back from there:
/// nothing before the end may change while the frame goes on); where they lie in it.
/// `buf` never moves: its room is reserved before the first frame, and zstd refuses a
/// frame that would pass it (a damaged or foreign file: an error, nothing overwritten).
pub(super) fn unpack_stable(
    zstd: &mut Decoder<'static>,
    packed: &[u8],
    buf: &mut Vec<u8>,
    stable: &mut StableOut,
) -> Result<std::ops::Range<usize>, String> {
    if buf.capacity() < stable.room {
        // Before the first frame only: zstd holds no pointer into the buffer yet.
        *buf = Vec::with_capacity(stable.room);
    }
    if stable.frame_ended {
        start_over(zstd, buf)?;
    }
    let mut start = buf.len();
    let mut input = InBuffer::around(packed);
    loop {
        let (read, wrote) = (input.pos(), buf.len());
        let hint = {
            let mut output = OutBuffer::around_pos(buf, wrote);
            zstd.run(&mut input, &mut output)
                .map_err(|e| format!("zstd: {e}"))?
        };
        let moved = input.pos() != read || buf.len() != wrote;
        if !moved {
            // All taken and all written (a call with nothing to do says nothing new).
            if input.pos() == packed.len() {
                return Ok(start..buf.len());
            }
            return Err("zstd: the stream stopped with bytes of the frame left".into());
        }
        stable.frame_ended = hint == 0;
        // A zstd frame ended (the writer ends one at the head of the next record frame's
        // bytes): the next begins at the buffer's start, unless this record frame
        // already wrote some of its bytes, which stay where they are.
        if stable.frame_ended && buf.len() == start {
            start_over(zstd, buf)?;
            start = 0;
        }
        if (buf.len() - start) as u64 > MAX_FRAME {
            return Err(format!("a frame unpacks to more than {MAX_FRAME} bytes"));
        }
    }
}

/// The next zstd frame at the buffer's start, once the last one ended. zstd lets the
/// buffer change only on a new session, which it begins on the call after a frame's end
/// (and a call with nothing to read has begun it already): the session is begun anew.
fn start_over(zstd: &mut Decoder<'static>, buf: &mut Vec<u8>) -> Result<(), String> {
    zstd.reinit().map_err(|e| format!("zstd: {e}"))?;
    buf.clear();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    use zstd::zstd_safe::DParameter;

    use crate::ingest::record::frame::{zstd_encoder, ZSTD_LEVEL};

    /// Bytes that compress somewhat (repeats with changes), as a frame's would.
    fn plain(seed: u64, len: usize) -> Vec<u8> {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..len)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                if i % 7 < 4 {
                    (i % 61) as u8
                } else {
                    x as u8
                }
            })
            .collect()
    }

    fn stable_decoder() -> Decoder<'static> {
        let mut zstd = Decoder::new().expect("decoder");
        zstd.set_parameter(DParameter::StableOutBuffer(true))
            .expect("stable");
        zstd
    }

    /// Record frames' bytes in the three layouts a stream can hold, each read back
    /// exactly: the writer's (a zstd frame across record frames, ended at the head of
    /// the next one's bytes), a zstd frame ended at a record frame's end, and a record
    /// frame whose bytes span two zstd frames.
    #[test]
    fn written_straight_into_the_buffer_every_layout_reads_back() {
        let plains: Vec<Vec<u8>> = (0..40).map(|k| plain(k, 500 + 97 * k as usize)).collect();
        let mut packed: Vec<Vec<u8>> = Vec::new();
        // The writer's layout, a new zstd frame every ~8 KiB of input.
        let mut enc = zstd_encoder(ZSTD_LEVEL).expect("encoder");
        let mut input = 0;
        for p in &plains[..20] {
            let mut epilogue = None;
            if input > 0 && input + p.len() > 8 << 10 {
                let old = std::mem::replace(&mut enc, zstd_encoder(ZSTD_LEVEL).expect("encoder"));
                epilogue = Some(old.finish().expect("finish"));
                input = 0;
            }
            input += p.len();
            enc.write_all(p).expect("write");
            enc.flush().expect("flush");
            let mut bytes = epilogue.unwrap_or_default();
            bytes.append(enc.get_mut());
            packed.push(bytes);
        }
        let ended = enc.finish().expect("finish");
        // The last one's end leads a record frame that is a whole zstd frame.
        let mut whole = ended;
        whole.extend(zstd::bulk::compress(&plains[20], 1).expect("zstd"));
        packed.push(whole);
        // Whole zstd frames, each ending with its record frame.
        for p in &plains[21..30] {
            packed.push(zstd::bulk::compress(p, 3).expect("zstd"));
        }
        // Two whole zstd frames in each.
        for p in &plains[30..] {
            let (a, b) = p.split_at(p.len() / 3);
            let mut bytes = zstd::bulk::compress(a, 1).expect("zstd");
            bytes.extend(zstd::bulk::compress(b, 1).expect("zstd"));
            packed.push(bytes);
        }
        let mut zstd = stable_decoder();
        let mut buf = Vec::new();
        let mut stable = StableOut::new(1 << 20);
        for (k, (bytes, want)) in packed.iter().zip(&plains).enumerate() {
            let got = unpack_stable(&mut zstd, bytes, &mut buf, &mut stable)
                .unwrap_or_else(|e| panic!("record frame {k}: {e}"));
            assert!(buf[got] == want[..], "record frame {k}");
        }
        // The writer's frames never moved the buffer, and it holds one zstd frame: 8 KiB
        // and a record frame, not the 120 KiB written.
        assert!(
            buf.capacity() == 1 << 20 && buf.len() < 16 << 10,
            "{}",
            buf.len()
        );
    }

    /// A zstd frame that would pass the buffer's room is an error, with nothing written
    /// past it; so is a frame cut inside a block.
    #[test]
    fn a_frame_past_the_room_or_cut_short_is_an_error() {
        let big = zstd::bulk::compress(&plain(1, 10_000), 1).expect("zstd");
        let mut buf = Vec::new();
        let mut stable = StableOut::new(4096);
        let err = unpack_stable(&mut stable_decoder(), &big, &mut buf, &mut stable)
            .expect_err("past the room");
        assert!(err.starts_with("zstd:"), "{err}");
        assert!(buf.capacity() == 4096 && buf.len() <= 4096);
        let cut = &big[..big.len() / 2];
        let mut stable = StableOut::new(1 << 20);
        let read = unpack_stable(&mut stable_decoder(), cut, &mut Vec::new(), &mut stable);
        assert!(
            read.is_ok_and(|r| r.len() < 10_000),
            "a cut frame gives what it holds"
        );
    }
}
