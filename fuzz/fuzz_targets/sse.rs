//! Server-sent events and NDJSON splitting (`protocol::sse`), which hands each event
//! to the API shape classifier. The events must not depend on where the stream was
//! cut (nor on whether whole events are read in place or byte by byte); bytes gone
//! uncaptured drop the event in progress.
#![no_main]

use collector::ingest::model::SseEvent;
use collector::protocol::sse::SseSplitter;
use libfuzzer_sys::fuzz_target;
use tokenscope_fuzz::ios;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let splitter = || {
        if mode & 1 == 1 {
            SseSplitter::ndjson()
        } else {
            SseSplitter::new()
        }
    };
    let ios = ios(rest);
    let mut cut = splitter();
    let mut events: Vec<SseEvent> = Vec::new();
    let mut holes = false;
    for io in &ios {
        events.extend(cut.feed(io.captured));
        if io.uncaptured > 0 {
            cut.reset();
            holes = true;
        }
    }
    let bytes: usize = ios.iter().map(|io| io.captured.len()).sum();
    assert!(
        events.len() <= bytes,
        "{} events from {bytes} bytes",
        events.len()
    );
    if !holes {
        let whole: Vec<u8> = ios.iter().flat_map(|io| io.captured.to_vec()).collect();
        assert_eq!(
            splitter().feed(&whole),
            events,
            "the same events whatever the cuts"
        );
        // One byte at a time never has a whole event in hand: the byte-wise path
        // alone, against the in-place reading of whole events above.
        let mut bytewise = splitter();
        let one_by_one: Vec<SseEvent> = whole
            .iter()
            .flat_map(|b| bytewise.feed(std::slice::from_ref(b)))
            .collect();
        assert_eq!(one_by_one, events, "byte by byte as in pieces");
    }
});
