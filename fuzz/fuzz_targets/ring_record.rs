//! Ring-buffer records (`ingest::decode`): one record decoded alone (mode byte even),
//! or a sequence of records, each after a little-endian u16 length, through the
//! protocol `Decoder` that sniffs each I/O's payload in its socket's stream (odd).
#![no_main]

use collector::ingest::decode_record;
use collector::ingest::model::event::Body;
use collector::protocol::Decoder;
use libfuzzer_sys::fuzz_target;
use probe_ebpf::abi;
use tokenscope_fuzz::assert_sniff_redacted;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, mut rest)) = data.split_first() else {
        return;
    };
    if mode & 1 == 0 {
        if let Ok((event, payload)) = decode_record(rest) {
            match &event.body {
                Some(Body::Io(io)) => {
                    assert_eq!(payload.len(), io.captured as usize, "captured = payload");
                    assert!(payload.len() <= abi::PAYLOAD_MAX, "over the probe's cap");
                    assert!(
                        abi::IO_EVENT_HEAD_SIZE + payload.len() <= rest.len(),
                        "a payload past the record"
                    );
                }
                _ => assert!(payload.is_empty(), "only I/O records carry a payload"),
            }
        }
        return;
    }
    let mut decoder = Decoder::new();
    while rest.len() >= 2 {
        let len = usize::from(u16::from_le_bytes([rest[0], rest[1]]));
        let record = &rest[2..];
        let record = &record[..len.min(record.len())];
        rest = &rest[2 + record.len()..];
        if let Ok(event) = decoder.decode(record) {
            if let Some(Body::Io(io)) = &event.body {
                let sniff = io.sniff.as_ref().expect("every decoded I/O is sniffed");
                assert_sniff_redacted(sniff);
            }
        }
    }
});
