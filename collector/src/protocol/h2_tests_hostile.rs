//! HTTP/2 input that is malformed, oversized, unusual or random: counted and
//! skipped, never a panic, never taken for something it is not.

use super::*;
use crate::protocol::limits::Limit;

#[test]
fn malformed_frames_are_counted_and_skipped() {
    let hpack_head = [0x88]; // :status 200
    let cases: Vec<(&str, Vec<u8>, u32)> = vec![
        ("PING of 7 bytes", frame(PING, 0, 0, b"1234567"), 1),
        ("SETTINGS of 5 bytes", frame(SETTINGS, 0, 0, b"12345"), 1),
        (
            "SETTINGS ack with a payload",
            frame(SETTINGS, ACK, 0, &[0; 6]),
            1,
        ),
        ("WINDOW_UPDATE of 3", frame(WINDOW_UPDATE, 0, 0, b"123"), 1),
        ("RST_STREAM on 0", frame(RST_STREAM, 0, 0, &[0; 4]), 1),
        ("unknown type", frame(0x0b, 0, 1, b"whatever"), 1),
        ("DATA on stream 0", frame(DATA, 0, 0, b"data: x\n\n"), 1),
        (
            "HEADERS on stream 0",
            frame(HEADERS, END_HEADERS, 0, &hpack_head),
            1,
        ),
        ("padded DATA, no room", frame(DATA, PADDED, 1, b""), 1),
        (
            "padding past the payload",
            frame(DATA, PADDED, 1, &[9, b'a', b'b']),
            1,
        ),
        (
            "HEADERS padding past the payload",
            frame(HEADERS, PADDED | END_HEADERS, 1, &[9, 0x88]),
            1,
        ),
        (
            "HEADERS priority cut",
            frame(HEADERS, PRIORITY_FLAG | END_HEADERS, 1, &[0, 0]),
            1,
        ),
        (
            "CONTINUATION without HEADERS",
            frame(CONTINUATION, END_HEADERS, 1, &hpack_head),
            1,
        ),
        (
            "truncated HPACK integer",
            frame(HEADERS, END_HEADERS, 1, &[0xff, 0x80]),
            1,
        ),
        (
            "truncated HPACK string",
            frame(HEADERS, END_HEADERS, 1, &[0x40, 0x0a, b'a']),
            1,
        ),
        (
            "Huffman garbage",
            frame(HEADERS, END_HEADERS, 1, &[0x40, 0x81, 0xff, 0x01, b'v']),
            1,
        ),
        ("index 0", frame(HEADERS, END_HEADERS, 1, &[0x80]), 1),
        (
            "index past a known table",
            frame(HEADERS, END_HEADERS, 1, &[0x88, 0xbe]),
            1,
        ),
        (
            "HEADERS interrupted by DATA",
            [frame(HEADERS, 0, 1, &hpack_head), frame(DATA, 0, 1, b"x")].concat(),
            1,
        ),
    ];
    for (what, frames, errors) in cases {
        let (sniffs, sum) = server_with(&frames);
        assert_eq!(sum.errors, errors, "{what}: {sniffs:?}");
        assert_eq!(sum.control, 2, "{what}: SETTINGS and the PING after it");
        assert_eq!(sum.unparsed, 0, "{what}: framing kept");
    }
}

#[test]
fn oversized_header_block_is_dropped_with_the_table() {
    let mut frames = frame(HEADERS, END_HEADERS, 1, &insert("x-a", "1")); // dynamic 62
    frames.extend(frame(HEADERS, END_STREAM, 3, &[0x88]));
    for _ in 0..5 {
        frames.extend(frame(CONTINUATION, 0, 3, &vec![0x88; 16 << 10]));
    }
    frames.extend(frame(CONTINUATION, END_HEADERS, 3, &[0x88]));
    frames.extend(frame(HEADERS, END_HEADERS | END_STREAM, 5, &[0x88, 0xbe]));
    let (sniffs, sum) = server_with(&frames);
    assert_eq!(sum.errors, 1);
    assert_eq!(hits(&sniffs), [Limit::H2HeaderBlock], "the limit is named");
    assert!(sum
        .streams
        .get(&3)
        .is_none_or(|s| s.heads.is_empty() && s.ends == 0));
    assert_eq!(
        sum.streams[&5].unknown, 1,
        "62 is unknown once a block was dropped"
    );
    // A single HEADERS frame over the limit, too.
    let big = frame(HEADERS, END_HEADERS, 1, &vec![0x88; MAX_BLOCK + 300]);
    let (sniffs, sum) = server_with(&big);
    assert_eq!(sum.errors, 1);
    assert_eq!(hits(&sniffs), [Limit::H2HeaderBlock]);
}

fn hits(sniffs: &[Sniff]) -> Vec<Limit> {
    sniffs.iter().flat_map(Sniff::hits).collect()
}

#[test]
fn informational_head_then_final_head_then_trailers() {
    let mut early = settings(&[]);
    early.extend(frame(
        HEADERS,
        END_HEADERS,
        1,
        &[0x48, 0x03, b'1', b'0', b'3'],
    )); // :status 103
    let mut frames = frame(HEADERS, END_HEADERS, 1, &[0x88]);
    frames.extend(frame(DATA, 0, 1, b"hello"));
    frames.extend(frame(
        HEADERS,
        END_HEADERS | END_STREAM,
        1,
        &insert("grpc-status", "0"),
    ));
    let sum = summarize(&feed(&[&early, &frames]));
    let st = &sum.streams[&1];
    let statuses: Vec<u32> = st
        .heads
        .iter()
        .map(|k| match k {
            sniff::Kind::HttpResponse(h) => h.status,
            _ => 0,
        })
        .collect();
    assert_eq!(statuses, [103, 200], "trailers are no head");
    assert_eq!(
        (st.starts, st.ends, st.body_bytes, sum.errors),
        (1, 1, 5, 0)
    );
    // In one I/O the final head is the one reported.
    let one = summarize(&feed(&[&[early, frames].concat()]));
    assert_eq!(one.streams[&1].heads.len(), 1);
    assert_eq!(one.streams[&1].starts, 1);
}

#[test]
fn gzip_event_streams_are_inflated_other_encodings_hidden() {
    use flate2::{write::GzEncoder, Compression};
    use std::io::Write;
    let mut gz = GzEncoder::new(Vec::new(), Compression::default());
    gz.write_all(token(1, 0).as_bytes()).unwrap();
    gz.flush().unwrap();
    let first = std::mem::take(gz.get_mut());
    gz.write_all(b"data: [DONE]\n\n").unwrap();
    let last = gz.finish().unwrap();
    let head = |enc: &str| {
        let mut h = vec![0x88, 0x5f]; // content-type (31), indexed
        h.extend(raw_string("text/event-stream"));
        h.push(0x5a); // content-encoding (26), indexed
        h.extend(raw_string(enc));
        h
    };
    let mut frames = frame(HEADERS, END_HEADERS, 1, &head("gzip"));
    frames.extend(frame(DATA, 0, 1, &first));
    frames.extend(frame(DATA, END_STREAM, 1, &last));
    frames.extend(frame(HEADERS, END_HEADERS, 3, &head("br")));
    frames.extend(frame(DATA, END_STREAM, 3, b"\x1b\x00data"));
    let (_, sum) = server_with(&frames);
    let kinds: Vec<SseKind> = sum.streams[&1].events.iter().map(|e| e.kind()).collect();
    assert_eq!(kinds, [SseKind::Choice, SseKind::Done]);
    assert!(sum.streams[&1].compressed && sum.streams[&3].compressed);
    assert!(sum.streams[&3].events.is_empty() && sum.streams[&3].ends == 1);
}

#[test]
fn push_promise_keeps_the_table_in_step() {
    let mut promise = 2u32.to_be_bytes().to_vec();
    promise.extend(insert("x-pushed", "yes"));
    promise.extend([0x82, 0x84]); // :method GET, :path /
    let mut frames = frame(PUSH_PROMISE, END_HEADERS, 1, &promise);
    frames.extend(frame(HEADERS, END_HEADERS | END_STREAM, 1, &[0x88, 0xbe]));
    let (_, sum) = server_with(&frames);
    assert_eq!((sum.errors, sum.control), (0, 3));
    assert_eq!(sum.streams[&1].unknown, 0, "62 is the promise's entry");
    assert!(
        !sum.streams.contains_key(&2),
        "a promise is not an exchange"
    );
}

#[test]
fn open_streams_are_capped() {
    let mut p = StreamParser::default();
    let mut sum = summarize(&[p.feed(&settings(&[]), 9)]);
    let mut cut = Vec::new();
    for id in 0..(MAX_STREAMS as u32 + 4) {
        let f = frame(HEADERS, END_HEADERS, 2 * id + 1, &[0x88]);
        let sniff = p.feed(&f, f.len() as u64);
        sum.errors += sniff.h2_errors;
        cut.extend(sniff.hits());
    }
    assert_eq!(sum.errors, 4, "the four oldest were dropped");
    assert_eq!(cut, [Limit::H2Streams; 4], "each drop names the limit");
    // Closed streams are released: no error however many come and go.
    let mut p = StreamParser::default();
    p.feed(&settings(&[]), 9);
    let mut errors = 0;
    for id in 0..10_000u32 {
        let f = frame(HEADERS, END_HEADERS | END_STREAM, 100_001 + 2 * id, &[0x88]);
        errors += p.feed(&f, f.len() as u64).h2_errors;
    }
    assert_eq!(errors, 0);
}

#[test]
fn preface_prefixes_wait_and_http1_still_parses() {
    let req = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}";
    for cut in 1..4 {
        let s = feed(&[&req[..cut], &req[cut..]]);
        // "P" waits for the next I/O; "PO" and "POS" are no preface.
        assert_eq!(
            (s[0].message_start, s[1].message_start),
            (cut > 1, cut == 1),
            "cut {cut}"
        );
        assert!(s[1].message_end && !s[0].unparsed && !s[1].unparsed);
        assert!(matches!(s[1].kind, Some(sniff::Kind::HttpRequest(_))));
        assert!(s.iter().all(|x| !x.h2_preface && x.h2_streams.is_empty()));
    }
    let pri = b"PRI * HTTP/1.1\r\n\r\n"; // not the preface: an HTTP/1 request of method PRI
    let s = feed(&[&pri[..3], &pri[3..]]);
    assert!(!s[1].h2_preface && s[1].message_start && s[1].message_end);
    // A preface that goes wrong after its first bytes committed to HTTP/2.
    let bad = b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n";
    let s = feed(&[&bad[..10], &bad[10..]]);
    assert!(s[0].h2_preface && !s[0].unparsed);
    assert!(
        s[1].h2_errors == 1 && s[1].unparsed,
        "the preface did not match"
    );
}

#[test]
fn http1_tls_and_garbage_are_never_taken_for_frames() {
    let http1 = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
    let tls = [22, 3, 1, 0, 4, 1, 0, 0, 0];
    for bytes in [
        &http1[..],
        &tls[..],
        b"\x00\x01\x02garbage",
        b"SSH-2.0-OpenSSH\r\n",
    ] {
        let s = feed(&[bytes]);
        assert!(!s[0].h2_preface && s[0].h2_streams.is_empty() && s[0].h2_control_frames == 0);
    }
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut taken = 0;
    for _ in 0..20_000 {
        let len = 9 + (next() % 300) as usize;
        let bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        let cut = next() % 2 == 0;
        taken += usize::from(looks_like_frames(&bytes, cut) || starts_server_preface(&bytes));
    }
    assert_eq!(taken, 0, "random bytes read as frames");
    // While a real run of frames is found, cut or not.
    let s = server_stream(false);
    let from = find_frame(&s, DATA, 1, 0);
    assert!(looks_like_frames(&s[from..], false));
    assert!(!looks_like_frames(&s[from..s.len() - 3], false));
    assert!(looks_like_frames(&s[from..s.len() - 3], true));
}

#[test]
fn mutated_streams_never_panic_and_count_their_errors() {
    let samples = [
        client_stream(false),
        client_stream(true),
        server_stream(false),
        server_stream(true),
    ];
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    // Random damage: flips, inserts, deletes, random cuts and uncaptured tails.
    for round in 0..3000 {
        let mut s = samples[round % samples.len()].clone();
        for _ in 0..1 + next() % 4 {
            let at = (next() as usize) % s.len();
            match next() % 3 {
                0 => s[at] ^= 1 << (next() % 8),
                1 => s.insert(at, next() as u8),
                _ => {
                    s.remove(at);
                }
            }
        }
        let mut p = StreamParser::default();
        let mut at = 0;
        while at < s.len() {
            let n = 1 + (next() as usize) % 700;
            let end = (at + n).min(s.len());
            let lost = if next() % 8 == 0 { next() % 64 } else { 0 };
            let _ = p.feed(&s[at..end], (end - at) as u64 + lost);
            at = end;
        }
    }
    // Targeted damage: each frame in turn given an unknown type is counted, and the
    // framing (lengths untouched) holds.
    for sample in &samples {
        // A server's first SETTINGS is how its stream is known: start after it.
        let mut at = if sample.starts_with(PREFACE) {
            PREFACE.len()
        } else {
            9 + frame_len(sample, 0)
        };
        while at < sample.len() {
            let mut s = sample.clone();
            s[at + 3] = 0x0a + (at % 200) as u8;
            let sum = summarize(&feed(&[&s]));
            assert!(
                sum.errors >= 1 && sum.unparsed == 0,
                "frame at {at}: {sum:?}"
            );
            at += FRAME_HEADER + frame_len(sample, at);
        }
    }
}
