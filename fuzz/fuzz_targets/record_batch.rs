//! A record file's batch (`ingest::record`, after a frame's zstd and CRC): the reader's
//! own decoder, which reads socket I/O and libcuda events field by field and hands
//! everything else to prost, against prost's decoding of the same bytes. Results and
//! errors must be the same: a difference is a recording the report reads wrongly.
//! Then the same bytes unpacked as frames of the current format (a crafted frame that
//! passed its CRC: an error or events, never a panic), and the events they decode to
//! written as two frames and read back, which must give every event exactly (the socket
//! table carries from one frame to the next; format 5 writes most I/Os as columns). And those events written by the
//! recorder's own batch writer: the bytes prost writes.
#![no_main]

use collector::ingest::record::{
    decode_batch, encode_batch, repack_frames, unpack_batches, EventBatch,
};
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let ours = decode_batch(data).map_err(|e| e.to_string());
    let prost = EventBatch::decode(data).map_err(|e| e.to_string());
    assert_eq!(ours, prost, "the batch reader and prost disagree");
    let _ = unpack_batches(&[data, data]);
    if let Ok(batch) = prost {
        assert!(
            encode_batch(&batch) == batch.encode_to_vec(),
            "the recorder's batch writer and prost disagree"
        );
        let mut first = batch.events;
        let second = first.split_off(first.len() / 2);
        let frames = vec![first, second];
        assert!(
            repack_frames(frames.clone()) == Ok(frames),
            "events written as frames do not read back exactly"
        );
    }
});
