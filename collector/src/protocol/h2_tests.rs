use std::collections::BTreeMap;

use super::*;
use crate::ingest::model::{BodyPrint, SseEvent, SseKind};
use crate::protocol::sse::SseSplitter;
use crate::protocol::stream::StreamParser;

const SECRETS: [&str; 5] = ["SECRETQ", "sk-SECRET", "SECRETC", "SECRETK", "SECRETS"];

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = len.to_be_bytes()[1..].to_vec();
    f.extend([kind, flags]);
    f.extend(stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// A PADDED frame: pad length byte, payload, `pad` zero bytes.
fn padded(kind: u8, flags: u8, stream: u32, payload: &[u8], pad: u8) -> Vec<u8> {
    let mut p = vec![pad];
    p.extend_from_slice(payload);
    p.extend(vec![0; usize::from(pad)]);
    frame(kind, flags | PADDED, stream, &p)
}

fn settings(entries: &[(u16, u32)]) -> Vec<u8> {
    let p: Vec<u8> = entries
        .iter()
        .flat_map(|(k, v)| k.to_be_bytes().into_iter().chain(v.to_be_bytes()))
        .collect();
    frame(SETTINGS, 0, 0, &p)
}

/// HPACK with Huffman-coded strings (loona-hpack's encoder never Huffman-codes):
/// table hits are indexed, secrets never indexed, the rest inserted.
#[derive(Default)]
struct HuffmanEncoder {
    table: Vec<(String, String)>, // newest first
}

impl HuffmanEncoder {
    fn string(out: &mut Vec<u8>, s: &str) {
        let mut coded = Vec::new();
        httlib_huffman::encode(s.as_bytes(), &mut coded).unwrap();
        let mut len = loona_hpack::encoder::encode_integer(coded.len(), 7);
        len[0] |= 0x80;
        out.extend(len);
        out.extend(coded);
    }

    fn encode(&mut self, fields: &[(&str, &str)]) -> Vec<u8> {
        let mut out = Vec::new();
        for &(n, v) in fields {
            let hit = self.table.iter().position(|(a, b)| a == n && b == v);
            if let Some(pos) = hit {
                let mut idx = loona_hpack::encoder::encode_integer(62 + pos, 7);
                idx[0] |= 0x80;
                out.extend(idx);
                continue;
            }
            let secret = ["authorization", "cookie", "x-api-key", "set-cookie"].contains(&n);
            out.push(if secret { 0x10 } else { 0x40 });
            Self::string(&mut out, n);
            Self::string(&mut out, v);
            if !secret {
                self.table.insert(0, (n.to_string(), v.to_string()));
            }
        }
        out
    }
}

/// Encodes header blocks one way or the other, with the connection's table.
enum Hpack {
    Literal(loona_hpack::Encoder<'static>),
    Huffman(HuffmanEncoder),
}

impl Hpack {
    fn new(huffman: bool) -> Self {
        if huffman {
            Hpack::Huffman(HuffmanEncoder::default())
        } else {
            Hpack::Literal(loona_hpack::Encoder::new())
        }
    }

    fn encode(&mut self, fields: &[(&str, &str)]) -> Vec<u8> {
        match self {
            Hpack::Literal(e) => e.encode(fields.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes()))),
            Hpack::Huffman(e) => e.encode(fields),
        }
    }
}

fn request_fields<'a>(path: &'a str, length: Option<&'a str>) -> Vec<(&'a str, &'a str)> {
    let mut f = vec![
        (":method", "POST"),
        (":scheme", "https"),
        (":path", path),
        (":authority", "api.example.com"),
        ("authorization", "Bearer sk-SECRET"),
        ("cookie", "session=SECRETC"),
        ("x-api-key", "SECRETK"),
        ("content-type", "application/json"),
    ];
    if let Some(l) = length {
        f.push(("content-length", l));
    }
    f
}

/// A chat request body of `n` prompt words (over a KiB, so the print is of its first KiB).
fn body(tag: &str) -> String {
    format!(
        "{{\"model\":\"m\",\"stream\":true,\"messages\":[{{\"role\":\"user\",\"content\":\"{tag} {}\"}}]}}",
        "word ".repeat(300)
    )
}

/// Client: preface, SETTINGS, WINDOW_UPDATE, two POSTs on streams 1 and 3 with
/// bodies over DATA frames (one padded); stream 3's head is HEADERS + CONTINUATION.
fn client_stream(huffman: bool) -> Vec<u8> {
    let mut enc = Hpack::new(huffman);
    let (b1, b3) = (body("one"), body("three"));
    let len1 = b1.len().to_string();
    let mut s = PREFACE.to_vec();
    s.extend(settings(&[(2, 0), (4, 65535)]));
    s.extend(frame(WINDOW_UPDATE, 0, 0, &1_000_000u32.to_be_bytes()));
    let h1 = enc.encode(&request_fields(
        "/v1/chat/completions?key=SECRETQ",
        Some(&len1),
    ));
    s.extend(frame(HEADERS, END_HEADERS, 1, &h1));
    let h3 = enc.encode(&request_fields("/v1/chat/completions", None));
    let (a, b) = h3.split_at(h3.len() / 2);
    s.extend(padded(
        HEADERS,
        PRIORITY_FLAG,
        3,
        &[&[0, 0, 0, 0, 16][..], a].concat(),
        3,
    ));
    s.extend(frame(CONTINUATION, END_HEADERS, 3, b));
    let (b1a, b1b) = b1.as_bytes().split_at(700);
    let (b3a, b3b) = b3.as_bytes().split_at(1100);
    s.extend(padded(DATA, 0, 1, b1a, 17));
    s.extend(frame(DATA, 0, 3, b3a));
    s.extend(frame(DATA, END_STREAM, 1, b1b));
    s.extend(frame(DATA, 0, 3, b3b));
    s.extend(frame(DATA, END_STREAM, 3, b""));
    s
}

fn token(stream: u32, i: usize) -> String {
    format!("data: {{\"id\":\"c{stream}\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\" t{i}\"}}}}]}}\n\n")
}

fn response_fields() -> Vec<(&'static str, &'static str)> {
    vec![
        (":status", "200"),
        ("content-type", "text/event-stream"),
        ("server", "engine"),
        ("set-cookie", "SECRETS"),
    ]
}

/// Server: SETTINGS, SETTINGS ack, WINDOW_UPDATE, PING, two interleaved SSE
/// responses on 1 and 3 (events split mid-event across frames), a RST on 5.
fn server_stream(huffman: bool) -> Vec<u8> {
    let mut enc = Hpack::new(huffman);
    let mut s = settings(&[(3, 100), (5, 16384)]);
    s.extend(frame(SETTINGS, ACK, 0, b""));
    s.extend(frame(WINDOW_UPDATE, 0, 0, &65535u32.to_be_bytes()));
    s.extend(frame(PING, 0, 0, b"pingpong"));
    s.extend(frame(
        HEADERS,
        END_HEADERS,
        1,
        &enc.encode(&response_fields()),
    ));
    s.extend(frame(
        HEADERS,
        END_HEADERS,
        3,
        &enc.encode(&response_fields()),
    ));
    let text = |stream: u32| -> String { (0..3).map(|i| token(stream, i)).collect() };
    let (t1, t3) = (text(1), text(3));
    // Frames cut at arbitrary places, events spanning frames.
    let cuts1 = [0, 40, 150, t1.len()];
    let cuts3 = [0, 90, 91, t3.len()];
    for w in 0..3 {
        s.extend(frame(DATA, 0, 1, &t1.as_bytes()[cuts1[w]..cuts1[w + 1]]));
        s.extend(frame(DATA, 0, 3, &t3.as_bytes()[cuts3[w]..cuts3[w + 1]]));
    }
    s.extend(frame(RST_STREAM, 0, 5, &8u32.to_be_bytes()));
    s.extend(padded(DATA, END_STREAM, 1, b"data: [DONE]\n\n", 4));
    s.extend(frame(WINDOW_UPDATE, 0, 3, &100u32.to_be_bytes()));
    s.extend(frame(DATA, END_STREAM, 3, b"data: [DONE]\n\n"));
    s.extend(frame(PING, ACK, 0, b"pingpong"));
    s
}

/// What a stream did over all I/Os: what must not depend on how bytes were cut.
#[derive(Debug, Default, PartialEq, Clone)]
struct StreamSummary {
    heads: Vec<sniff::Kind>,
    starts: u32,
    ends: u32,
    events: Vec<SseEvent>,
    body_bytes: u64,
    body_print: Option<BodyPrint>,
    prefix_prints: Vec<u64>,
    reset: bool,
    attached: bool,
    unknown: u32,
    compressed: bool,
}

#[derive(Debug, Default, PartialEq, Clone)]
struct Summary {
    streams: BTreeMap<u32, StreamSummary>,
    control: u32,
    errors: u32,
    prefaces: u32,
    unparsed: u32,
}

fn summarize(sniffs: &[Sniff]) -> Summary {
    let mut sum = Summary::default();
    for s in sniffs {
        assert!(
            s.kind.is_none() && !s.message_start && !s.message_end,
            "h2 I/Os carry no top-level message facts: {s:?}"
        );
        sum.control += s.h2_control_frames;
        sum.errors += s.h2_errors;
        sum.prefaces += u32::from(s.h2_preface);
        sum.unparsed += u32::from(s.unparsed);
        let mut seen = std::collections::HashSet::new();
        for e in &s.h2_streams {
            assert!(seen.insert(e.stream_id), "one entry per stream per I/O");
            let st = sum.streams.entry(e.stream_id).or_default();
            st.reset |= e.reset;
            st.attached |= e.attached_mid;
            st.unknown += e.unknown_headers;
            let Some(i) = e.sniff.as_ref() else { continue };
            st.heads.extend(i.kind.clone());
            st.starts += u32::from(i.message_start);
            st.ends += u32::from(i.message_end);
            st.events.extend(i.sse.iter().copied());
            st.body_bytes += i.body_bytes;
            st.body_print = st.body_print.or(i.body_print);
            st.prefix_prints.extend(i.prefix_prints.iter().copied());
            st.compressed |= i.compressed;
        }
    }
    sum
}

fn feed(pieces: &[&[u8]]) -> Vec<Sniff> {
    let mut p = StreamParser::default();
    pieces.iter().map(|b| p.feed(b, b.len() as u64)).collect()
}

fn assert_private(sniffs: &[Sniff]) {
    let text = format!("{sniffs:?}");
    for secret in SECRETS {
        assert!(!text.contains(secret), "{secret} leaked: {text}");
    }
}

fn request_head(sum: &Summary, stream: u32) -> HttpRequestHead {
    match sum.streams[&stream].heads.as_slice() {
        [sniff::Kind::HttpRequest(h)] => (**h).clone(),
        other => panic!("stream {stream}: {other:?}"),
    }
}

use crate::ingest::model::{Header, HttpRequestHead};

/// The HTTP/1.1 request with the same body: the print a proxy's upstream hop shows.
fn http1_prints(body: &str) -> (Option<BodyPrint>, Vec<u64>) {
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: up\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let s = feed(&[req.as_bytes()]);
    (s[0].body_print, s[0].prefix_prints.clone())
}

#[test]
fn client_requests_decode_with_redacted_heads() {
    for huffman in [false, true] {
        let stream = client_stream(huffman);
        let sniffs = feed(&[&stream]);
        assert_private(&sniffs);
        let sum = summarize(&sniffs);
        assert_eq!(
            (sum.prefaces, sum.control, sum.errors),
            (1, 2, 0),
            "{huffman}"
        );
        let h1 = request_head(&sum, 1);
        assert_eq!(
            (h1.method.as_str(), h1.path.as_str(), h1.version.as_str()),
            ("POST", "/v1/chat/completions", "HTTP/2")
        );
        assert!(h1.has_query && h1.complete);
        let expect_headers = |len: Option<String>| {
            let mut h = vec![
                Header {
                    name: "host".into(),
                    value: Some("api.example.com".into()),
                },
                Header {
                    name: "authorization".into(),
                    value: None,
                },
                Header {
                    name: "cookie".into(),
                    value: None,
                },
                Header {
                    name: "x-api-key".into(),
                    value: None,
                },
                Header {
                    name: "content-type".into(),
                    value: Some("application/json".into()),
                },
            ];
            h.extend(len.map(|l| Header {
                name: "content-length".into(),
                value: Some(l.into()),
            }));
            h
        };
        assert_eq!(
            h1.headers,
            expect_headers(Some(body("one").len().to_string()))
        );
        let h3 = request_head(&sum, 3);
        assert!(!h3.has_query && h3.path == "/v1/chat/completions");
        assert_eq!(h3.headers, expect_headers(None));
        for (id, tag) in [(1, "one"), (3, "three")] {
            let st = &sum.streams[&id];
            assert_eq!((st.starts, st.ends, st.attached), (1, 1, false));
            assert_eq!(st.body_bytes, body(tag).len() as u64);
            let (print, prefixes) = http1_prints(&body(tag));
            assert_eq!(st.body_print, print, "stream {id}: same print as HTTP/1.1");
            assert_eq!(st.prefix_prints, prefixes);
        }
    }
}

fn expected_events(stream: u32) -> Vec<SseEvent> {
    let text: String = (0..3).map(|i| token(stream, i)).collect::<String>() + "data: [DONE]\n\n";
    SseSplitter::new().feed(text.as_bytes())
}

#[test]
fn server_responses_give_events_per_stream() {
    for huffman in [false, true] {
        let stream = server_stream(huffman);
        let sniffs = feed(&[&stream]);
        assert_private(&sniffs);
        let sum = summarize(&sniffs);
        // SETTINGS, ack, WINDOW_UPDATE, PING, stream WINDOW_UPDATE, PING ack.
        assert_eq!((sum.prefaces, sum.control, sum.errors), (1, 6, 0));
        for id in [1, 3] {
            let st = &sum.streams[&id];
            let [sniff::Kind::HttpResponse(h)] = st.heads.as_slice() else {
                panic!("{st:?}")
            };
            assert_eq!(
                (h.status, h.version.as_str(), h.complete),
                (200, "HTTP/2", true)
            );
            let names: Vec<(&str, Option<&str>)> = h
                .headers
                .iter()
                .map(|x| (x.name.as_str(), x.value.as_deref()))
                .collect();
            assert_eq!(
                names,
                vec![
                    ("content-type", Some("text/event-stream")),
                    ("server", Some("engine")),
                    ("set-cookie", None)
                ]
            );
            assert_eq!((st.starts, st.ends), (1, 1));
            assert_eq!(st.events, expected_events(id), "stream {id}");
            let kinds: Vec<SseKind> = st.events.iter().map(|e| e.kind()).collect();
            assert_eq!(
                kinds,
                [
                    SseKind::Choice,
                    SseKind::Choice,
                    SseKind::Choice,
                    SseKind::Done
                ]
            );
        }
        assert_ne!(sum.streams[&1].events, sum.streams[&3].events);
        let rst = &sum.streams[&5];
        assert!(rst.reset && !rst.attached && rst.heads.is_empty());
    }
}

/// The same summary however the stream is cut into two or three I/Os.
fn assert_split_invariant(stream: &[u8]) {
    let whole = summarize(&feed(&[stream]));
    for cut in 1..stream.len() {
        let sniffs = feed(&[&stream[..cut], &stream[cut..]]);
        assert_private(&sniffs);
        assert_eq!(summarize(&sniffs), whole, "cut at {cut}");
    }
    let n = stream.len();
    for a in (1..n).step_by(37) {
        for b in (a + 1..n).step_by(53) {
            let sniffs = feed(&[&stream[..a], &stream[a..b], &stream[b..]]);
            assert_eq!(summarize(&sniffs), whole, "cuts at {a}, {b}");
        }
    }
}

#[test]
fn client_stream_split_anywhere() {
    assert_split_invariant(&client_stream(false));
    assert_split_invariant(&client_stream(true));
}

#[test]
fn server_stream_split_anywhere() {
    assert_split_invariant(&server_stream(false));
    assert_split_invariant(&server_stream(true));
}

#[test]
fn h2c_prior_knowledge_reads_the_same() {
    // Cleartext h2c with prior knowledge is byte-for-byte what TLS plaintext shows.
    let stream = client_stream(false);
    let mut p = StreamParser::default();
    let first = p.feed(&stream[..PREFACE.len()], PREFACE.len() as u64);
    assert!(first.h2_preface && !first.unparsed && first.kind.is_none());
    let rest = p.feed(
        &stream[PREFACE.len()..],
        (stream.len() - PREFACE.len()) as u64,
    );
    assert_eq!(summarize(&[first, rest]), summarize(&feed(&[&stream])));
}

fn raw_string(s: &str) -> Vec<u8> {
    let mut out = loona_hpack::encoder::encode_integer(s.len(), 7);
    out.extend_from_slice(s.as_bytes());
    out
}

/// A literal with incremental indexing and a new name.
fn insert(name: &str, value: &str) -> Vec<u8> {
    [vec![0x40], raw_string(name), raw_string(value)].concat()
}

#[test]
fn joined_mid_connection_resolves_only_entries_inserted_after_the_join() {
    // Before the recording: the server inserted "server: engine-a" (dynamic 62).
    // The first captured I/O is a DATA frame of stream 7, an event stream under way.
    let mut io1 = frame(DATA, 0, 7, token(7, 4).as_bytes());
    io1.extend(frame(DATA, 0, 7, b"data: [DON"));
    // Stream 9 opens: 62 (from before the join), then two new entries.
    let mut h9 = vec![0x88, 0xbe, 0x5f]; // :status 200; 62; content-type (31), indexed
    h9.extend(raw_string("text/event-stream"));
    h9.extend(insert("server", "engine-b"));
    let mut io2 = frame(HEADERS, END_HEADERS, 9, &h9);
    // Stream 11: :status 200, 63 (content-type, after the join), 62 (server, after), 64 (before).
    io2.extend(frame(HEADERS, END_HEADERS, 11, &[0x88, 0xbf, 0xbe, 0xc0]));
    io2.extend(frame(DATA, END_STREAM, 11, token(11, 0).as_bytes()));
    io2.extend(frame(DATA, END_STREAM, 7, b"E]\n\n"));
    let sniffs = feed(&[&io1, &io2]);
    assert!(
        !sniffs[0].h2_preface && !sniffs[0].unparsed,
        "{:?}",
        sniffs[0]
    );
    let sum = summarize(&sniffs);
    assert_eq!(sum.errors, 0, "joining is not an error");

    let s7 = &sum.streams[&7];
    assert!(s7.attached && s7.heads.is_empty() && s7.starts == 0 && s7.ends == 1);
    let kinds: Vec<SseKind> = s7.events.iter().map(|e| e.kind()).collect();
    assert_eq!(
        kinds,
        [SseKind::Choice, SseKind::Done],
        "an attached event stream is still timed"
    );

    let head = |id: u32| match sum.streams[&id].heads.as_slice() {
        [sniff::Kind::HttpResponse(h)] => (**h).clone(),
        other => panic!("{other:?}"),
    };
    let (h9, h11) = (head(9), head(11));
    let pairs = |h: &crate::ingest::model::HttpResponseHead| -> Vec<(String, Option<String>)> {
        h.headers
            .iter()
            .map(|x| (x.name.to_string(), x.value.as_ref().map(|v| v.to_string())))
            .collect()
    };
    let expect = vec![
        (
            "content-type".to_string(),
            Some("text/event-stream".to_string()),
        ),
        ("server".to_string(), Some("engine-b".to_string())),
    ];
    assert_eq!(pairs(&h9), expect);
    assert_eq!(
        pairs(&h11),
        expect,
        "entries inserted after the join resolve exactly"
    );
    assert!(!h9.complete && !h11.complete, "a field went unread");
    assert_eq!((sum.streams[&9].unknown, sum.streams[&11].unknown), (1, 1));
    assert!(!pairs(&h11)
        .iter()
        .any(|(_, v)| v.as_deref() == Some("engine-a")));
    assert!(!sum.streams[&9].attached && sum.streams[&9].starts == 1);
    assert_eq!(sum.streams[&11].events.len(), 1);
}

#[test]
fn attached_stream_that_starts_mid_event_counts_bytes_until_an_event_starts() {
    let mut s = frame(DATA, 0, 5, b"ices\":[]}\n\n");
    s.extend(frame(DATA, 0, 5, b"da"));
    s.extend(frame(DATA, 0, 5, token(5, 1).as_bytes()));
    s.extend(frame(DATA, END_STREAM, 5, b"data: [DONE]\n\n"));
    let whole = summarize(&feed(&[&s]));
    let st = &whole.streams[&5];
    assert!(st.attached && st.ends == 1);
    assert_eq!(st.body_bytes, (11 + 2 + token(5, 1).len() + 14) as u64);
    let kinds: Vec<SseKind> = st.events.iter().map(|e| e.kind()).collect();
    assert_eq!(
        kinds,
        [SseKind::Choice, SseKind::Done],
        "nothing made of the partial event"
    );
    // Not a split-invariance of detection (the first I/O must hold whole frames), but
    // once attached, any cut gives the same.
    let first = 20;
    for cut in first + 1..s.len() {
        assert_eq!(
            summarize(&feed(&[&s[..first], &s[first..cut], &s[cut..]])),
            whole
        );
    }
}

#[test]
fn uncaptured_bytes_inside_data_are_skipped_exactly() {
    let stream = server_stream(false);
    let whole = summarize(&feed(&[&stream]));
    // The third DATA frame of stream 1 (its second event's tail and the third event).
    let at = find_frame(&stream, DATA, 1, 1);
    let payload = at + FRAME_HEADER;
    let mut p = StreamParser::default();
    // Frame bytes 5..20 are inside the first event's tail (the frame starts at its byte 40).
    let a = p.feed(&stream[..payload + 5], (payload + 20) as u64);
    let b = p.feed(
        &stream[payload + 20..],
        (stream.len() - payload - 20) as u64,
    );
    assert!(!a.unparsed && !b.unparsed, "the place is kept");
    let sum = summarize(&[a, b]);
    let s1 = &sum.streams[&1];
    assert_eq!(
        s1.body_bytes, whole.streams[&1].body_bytes,
        "skipped bytes still count"
    );
    assert_eq!(s1.ends, 1);
    // The event cut by the gap is dropped, the rest are exact.
    let want: Vec<SseEvent> = whole.streams[&1]
        .events
        .iter()
        .copied()
        .filter(|e| !s1.events.contains(e))
        .collect();
    assert_eq!(want.len(), 1, "exactly the cut event is lost: {s1:?}");
    assert_eq!(
        sum.streams[&3], whole.streams[&3],
        "other streams untouched"
    );
    // Uncaptured bytes ending exactly at a frame's end keep the place too.
    let next = at + FRAME_HEADER + frame_len(&stream, at);
    let mut p = StreamParser::default();
    let a = p.feed(&stream[..payload], next as u64);
    let b = p.feed(&stream[next..], (stream.len() - next) as u64);
    assert!(!a.unparsed && !b.unparsed);
}

/// Offset of the `nth` frame of `kind` on `stream` (the stream must start at a frame).
fn find_frame(s: &[u8], kind: u8, stream: u32, nth: usize) -> usize {
    let mut at = if s.starts_with(PREFACE) {
        PREFACE.len()
    } else {
        0
    };
    let mut seen = 0;
    loop {
        let h = FrameHead::read(&s[at..]).expect("a frame");
        if h.kind == kind && h.stream == stream {
            if seen == nth {
                return at;
            }
            seen += 1;
        }
        at += FRAME_HEADER + h.len as usize;
    }
}

fn frame_len(s: &[u8], at: usize) -> usize {
    FrameHead::read(&s[at..]).unwrap().len as usize
}

#[test]
fn uncaptured_bytes_inside_a_header_block_lose_sync_until_frames_start_an_io() {
    let stream = server_stream(false);
    let whole = summarize(&feed(&[&stream]));
    let at = find_frame(&stream, HEADERS, 3, 0);
    let end = at + FRAME_HEADER + frame_len(&stream, at);
    let mut p = StreamParser::default();
    let a = p.feed(&stream[..at + 12], end as u64);
    assert!(a.unparsed, "the header block was cut");
    // An I/O that does not start at a frame stays unparsed.
    let junk = p.feed(b"ata: x\n\n", 8);
    assert!(junk.unparsed && junk.h2_streams.is_empty());
    let b = p.feed(&stream[end..], (stream.len() - end) as u64);
    assert!(!b.unparsed, "resynchronised on frames");
    let sum = summarize(&[a, junk, b]);
    assert_eq!(sum.streams[&1], whole.streams[&1], "stream 1 read on");
    let s3 = &sum.streams[&3];
    assert!(s3.attached && s3.heads.is_empty(), "no head is invented");
    assert_eq!(
        s3.events, whole.streams[&3].events,
        "its frames start at events"
    );
    // The table is lost: a block that references it now reads as unknown.
    let mut after = frame(HEADERS, END_HEADERS | END_STREAM, 13, &[0x88, 0xbe]);
    after.extend(frame(PING, 0, 0, b"12345678"));
    let c = p.feed(&after, after.len() as u64);
    assert_eq!(c.h2_streams[0].unknown_headers, 1);
    assert_eq!(c.h2_control_frames, 1);
}

/// A parser past a server's SETTINGS, then `frames`: (errors, control, unparsed).
fn server_with(frames: &[u8]) -> (Vec<Sniff>, Summary) {
    let mut s = settings(&[]);
    s.extend_from_slice(frames);
    s.extend(frame(PING, 0, 0, b"12345678")); // still in step afterwards
    let sniffs = feed(&[&s]);
    let sum = summarize(&sniffs);
    (sniffs, sum)
}

#[path = "h2_tests_hostile.rs"]
mod hostile;
