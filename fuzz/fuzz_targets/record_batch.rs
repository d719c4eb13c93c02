//! A record file's batch (`ingest::record`, after a frame's zstd and CRC): the reader's
//! own decoder, which reads socket I/O and libcuda events field by field and hands
//! everything else to prost, against prost's decoding of the same bytes. Results and
//! errors must be the same: a difference is a recording the report reads wrongly.
#![no_main]

use collector::ingest::record::{decode_batch, EventBatch};
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let ours = decode_batch(data).map_err(|e| e.to_string());
    let prost = EventBatch::decode(data).map_err(|e| e.to_string());
    assert_eq!(ours, prost, "the batch reader and prost disagree");
});
