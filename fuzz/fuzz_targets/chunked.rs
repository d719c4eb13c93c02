//! HTTP/1.x body framing (`protocol::body`): chunked (and Content-Length) bodies fed
//! in pieces with bytes gone uncaptured between them. Fed whole or cut anywhere, a
//! body must decode to the same content.
#![no_main]

use collector::protocol::body::{BodyReader, Chunk};
use libfuzzer_sys::fuzz_target;
use tokenscope_fuzz::{ios, Io};

/// What one decoding saw: the content, whether the body ended, and the bytes
/// (framing included) it used.
#[derive(Debug, PartialEq)]
struct Decoded {
    content: Vec<u8>,
    ended: bool,
    used: u64,
}

/// Decodes the body in `data`'s I/Os (`pieces`) or in one piece of all their captured
/// bytes; `None` on a framing error or once bytes went uncaptured (the content then
/// has a hole and compares with nothing).
fn decode(mode: u8, data: &[u8], pieces: bool) -> Option<Decoded> {
    let mut reader = match mode % 4 {
        0 | 1 => BodyReader::Chunked(Chunk::Size(Vec::new())),
        2 => BodyReader::Length(u64::from(mode)),
        _ => BodyReader::Length(u64::MAX - u64::from(mode)),
    };
    let ios = ios(data);
    let whole: Vec<u8> = ios.iter().flat_map(|io| io.captured.to_vec()).collect();
    let single = [Io {
        captured: &whole,
        uncaptured: 0,
    }];
    let ios: &[Io] = if pieces { &ios } else { &single };
    let mut out = Decoded {
        content: Vec::new(),
        ended: false,
        used: 0,
    };
    let mut holes = false;
    for io in ios {
        let content = &mut out.content;
        let p = reader
            .feed(io.captured, &mut |c| content.extend_from_slice(c))
            .ok()?;
        assert!(
            p.consumed <= io.captured.len(),
            "consumed {} of {}",
            p.consumed,
            io.captured.len()
        );
        out.used += p.consumed as u64;
        assert!(
            out.content.len() as u64 <= out.used,
            "more content than bytes"
        );
        if p.ended {
            out.ended = true;
            break;
        }
        if io.uncaptured > 0 {
            holes = true;
            if reader.skip(io.uncaptured).ok()? {
                break;
            }
        }
    }
    (!holes).then_some(out)
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let split = decode(mode, rest, true);
    let whole = decode(mode, rest, false);
    if let (Some(split), Some(whole)) = (split, whole) {
        assert_eq!(
            split, whole,
            "a body cut into pieces decodes as it does whole"
        );
    }
});
