use super::*;
use crate::ingest::model::{SseEvent, SseKind, TlsRecords};

fn sse_event(i: usize) -> String {
    format!("data: {{\"id\":\"cmpl-1\",\"choices\":[{{\"index\":0,\"text\":\" tok{i}\"}}]}}\n\n")
}

/// A chunked SSE response as an engine sends it: one chunk per event, then [DONE].
fn chunked_sse_response(events: usize) -> Vec<u8> {
    let mut out = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
    let mut bodies: Vec<String> = (0..events).map(sse_event).collect();
    bodies.push("data: [DONE]\n\n".into());
    for b in bodies {
        out.extend_from_slice(format!("{:x}\r\n{b}\r\n", b.len()).as_bytes());
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

fn request(body: &str, extra_header: &str) -> Vec<u8> {
    format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\n{extra_header}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Feeds `pieces` as fully captured I/Os; returns each I/O's sniff.
fn feed_all(pieces: &[&[u8]]) -> Vec<Sniff> {
    let mut p = StreamParser::default();
    pieces.iter().map(|b| p.feed(b, b.len() as u64)).collect()
}

fn events(sniffs: &[Sniff]) -> Vec<SseEvent> {
    sniffs.iter().flat_map(|s| s.sse.clone()).collect()
}

#[test]
fn sse_response_split_at_every_byte_offset() {
    let stream = chunked_sse_response(3);
    let whole = feed_all(&[&stream]);
    let expect = events(&whole);
    let kinds: Vec<SseKind> = expect.iter().map(|e| e.kind()).collect();
    assert_eq!(
        kinds,
        vec![
            SseKind::Choice,
            SseKind::Choice,
            SseKind::Choice,
            SseKind::Done
        ]
    );
    assert!(
        whole[0].message_start && whole[0].message_end,
        "one I/O holds the whole message"
    );
    assert!(matches!(whole[0].kind, Some(sniff::Kind::HttpResponse(_))));
    for cut in 1..stream.len() {
        let two = feed_all(&[&stream[..cut], &stream[cut..]]);
        assert_eq!(events(&two), expect, "split at byte {cut}");
        assert!(
            two[0].message_start,
            "split at {cut}: the first I/O starts the message"
        );
        assert!(
            two[1].message_end && !two[0].message_end,
            "split at {cut}: the message ends in the second I/O"
        );
        assert!(
            two.iter().all(|s| !s.unparsed),
            "split at {cut}: nothing unparsed"
        );
    }
}

#[test]
fn several_events_in_one_write_and_keep_alive_messages() {
    let one = chunked_sse_response(2);
    let both: Vec<u8> = [one.clone(), one.clone()].concat();
    let s = feed_all(&[&both]);
    assert_eq!(s[0].sse.len(), 6, "two responses of 2 tokens + [DONE] each");
    // Per-event writes after the head: one event per I/O.
    let head_end = one.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let mut pieces: Vec<&[u8]> = vec![&one[..head_end]];
    let mut at = head_end;
    for _ in 0..3 {
        let len_line_end = at + one[at..].windows(2).position(|w| w == b"\r\n").unwrap() + 2;
        let size =
            usize::from_str_radix(std::str::from_utf8(&one[at..len_line_end - 2]).unwrap(), 16)
                .unwrap();
        let end = len_line_end + size + 2;
        pieces.push(&one[at..end]);
        at = end;
    }
    pieces.push(&one[at..]);
    let s = feed_all(&pieces);
    let per_io: Vec<usize> = s.iter().map(|x| x.sse.len()).collect();
    assert_eq!(per_io, vec![0, 1, 1, 1, 0], "one event per write");
    assert!(s.last().unwrap().message_end);
}

#[test]
fn request_body_print_survives_header_rewrites_and_splits() {
    let body = format!(
        "{{\"prompt\":\"{}\",\"max_tokens\":8}}",
        "word ".repeat(400)
    );
    let a = request(&body, "Authorization: Bearer x\r\n");
    let b = request(&body, "X-Forwarded-For: 127.0.0.1\r\nConnection: close\r\n");
    let pa = feed_all(&[&a])
        .into_iter()
        .find_map(|s| s.body_print)
        .expect("a print");
    assert_eq!(pa.length, body.len() as u64);
    for cut in [1, 10, 100, a.len() / 2, a.len() - 1] {
        let pb = feed_all(&[&b[..cut.min(b.len() - 1)], &b[cut.min(b.len() - 1)..]])
            .into_iter()
            .find_map(|s| s.body_print);
        assert_eq!(pb, Some(pa), "same body, other headers, split at {cut}");
    }
    let other = request(&body.replacen("word", "WORD", 1), "");
    let po = feed_all(&[&other])
        .into_iter()
        .find_map(|s| s.body_print)
        .expect("print");
    assert_ne!(po, pa, "bodies that differ in their first KiB differ");
    // Known limit: bodies equal in length and first KiB (a shared prompt prefix) print alike;
    // the stitcher breaks such ties by time order.
    let tail = request(&body.replace("max_tokens\":8", "max_tokens\":9"), "");
    assert_eq!(
        feed_all(&[&tail]).into_iter().find_map(|s| s.body_print),
        Some(pa)
    );
}

#[test]
fn uncaptured_bytes_keep_the_place_when_framing_allows() {
    let body = "x".repeat(10_000);
    let req = request(&body, "");
    let mut p = StreamParser::default();
    let s = p.feed(&req[..4000], req.len() as u64);
    assert!(
        s.message_start && s.message_end && !s.unparsed,
        "Content-Length lets the parser skip the unseen tail"
    );
    assert_eq!(s.body_print.map(|b| b.length), Some(10_000));
    let next = request("{}", "");
    let s = p.feed(&next, next.len() as u64);
    assert!(
        s.message_start && s.message_end,
        "the next request on the connection parses"
    );
}

#[test]
fn lost_chunk_framing_is_unparsed_then_resyncs() {
    let stream = chunked_sse_response(50);
    let mut p = StreamParser::default();
    let s = p.feed(&stream[..300], stream.len() as u64 - 10);
    assert!(
        s.unparsed,
        "uncaptured bytes spanning chunk framing lose the place"
    );
    let s = p.feed(b"\r\n0\r\n\r\n", 7);
    assert!(
        s.unparsed && s.sse.is_empty(),
        "the tail of a lost message is not read as a message"
    );
    let again = chunked_sse_response(1);
    let s = p.feed(&again, again.len() as u64);
    assert_eq!(s.sse.len(), 2, "a new message at an I/O start resyncs");
    assert!(!s.unparsed);
}

/// A gzip SSE response as a compressing gateway writes it: the head, then compressed
/// chunks, one event per entry of `flush_after`: whether the compressor flushed after it.
fn gzip_sse_pieces(flush_after: &[bool]) -> Vec<Vec<u8>> {
    use flate2::{write::GzEncoder, Compression};
    use std::io::Write;
    let mut pieces = vec![b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec()];
    let mut enc = GzEncoder::new(Vec::new(), Compression::default());
    let chunk = |data: &[u8]| {
        let mut c = format!("{:x}\r\n", data.len()).into_bytes();
        c.extend_from_slice(data);
        c.extend_from_slice(b"\r\n");
        c
    };
    for (i, &flush) in flush_after.iter().enumerate() {
        enc.write_all(sse_event(i).as_bytes()).unwrap();
        if flush {
            enc.flush().unwrap();
            let out = std::mem::take(enc.get_mut());
            pieces.push(chunk(&out));
        }
    }
    enc.write_all(b"data: [DONE]\n\n").unwrap();
    let mut last = chunk(&enc.finish().unwrap());
    last.extend_from_slice(b"0\r\n\r\n");
    pieces.push(last);
    pieces
}

#[test]
fn gzip_event_stream_is_inflated_and_events_land_where_the_gateway_let_them_out() {
    // The gateway holds events 0-2 until its flush, lets 3 out alone, then the rest at the end.
    let pieces = gzip_sse_pieces(&[false, false, true, true, false, false]);
    let refs: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
    let sniffs = feed_all(&refs);
    assert!(sniffs[0].compressed);
    let per_io: Vec<usize> = sniffs.iter().map(|s| s.sse.len()).collect();
    assert_eq!(
        per_io,
        vec![0, 3, 1, 3],
        "3 held, 1 alone, 2 + [DONE] at the end"
    );
    assert!(sniffs.last().unwrap().message_end);
    // The same events as the uncompressed stream, fingerprint for fingerprint.
    let plain = chunked_sse_response(6);
    let plain_events = events(&feed_all(&[&plain]));
    let plain_prints: Vec<u64> = plain_events.iter().map(|e| e.fingerprint).collect();
    let inflated: Vec<u64> = events(&sniffs).iter().map(|e| e.fingerprint).collect();
    assert_eq!(inflated, plain_prints);
    // Split at every byte of the first compressed chunk: nothing changes.
    for cut in 1..pieces[1].len() {
        let (a, b) = pieces[1].split_at(cut);
        let mut split: Vec<&[u8]> = vec![&pieces[0], a, b];
        split.extend(pieces[2..].iter().map(Vec::as_slice));
        let got: Vec<u64> = events(&feed_all(&split))
            .iter()
            .map(|e| e.fingerprint)
            .collect();
        assert_eq!(got, plain_prints, "cut at {cut}");
    }
}

#[test]
fn corrupt_gzip_and_other_encodings_hide_events_without_failing() {
    let head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n";
    let mut p = StreamParser::default();
    assert!(p.feed(head, head.len() as u64).compressed);
    let s = p.feed(b"a\r\nnot gzip!!\r\n", 15);
    assert!(s.sse.is_empty() && s.body_bytes == 10);
    let s = p.feed(b"0\r\n\r\n", 5);
    assert!(
        s.message_end && !s.unparsed,
        "the framing still ends the message"
    );

    let br = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Encoding: br\r\nContent-Length: 4\r\n\r\ndata";
    let s = feed_all(&[br]);
    assert!(s[0].compressed && s[0].sse.is_empty() && s[0].message_end);
}

#[test]
fn tls_records_across_io_boundaries() {
    // ClientHello (40 bytes body) split so its header straddles two I/Os, then two app-data records.
    let mut stream = vec![22, 3, 1, 0, 40, 1];
    stream.extend(vec![0u8; 39]);
    stream.extend([23, 3, 3, 0, 20]);
    stream.extend(vec![0xaa; 20]);
    stream.extend([23, 3, 3, 0, 30]);
    stream.extend(vec![0xbb; 30]);
    let whole: Vec<u32> = feed_all(&[&stream])
        .iter()
        .flat_map(records)
        .map(|r| r.content_type)
        .collect();
    assert_eq!(whole, vec![22, 23, 23]);
    for cut in 1..stream.len() {
        let got: Vec<u32> = feed_all(&[&stream[..cut], &stream[cut..]])
            .iter()
            .flat_map(records)
            .map(|r| r.content_type)
            .collect();
        assert_eq!(got, whole, "split at {cut}");
    }
    let first = feed_all(&[&stream]);
    assert_eq!(records(&first[0])[0].handshake_type, Some(1), "ClientHello");
}

fn records(s: &Sniff) -> Vec<crate::ingest::model::TlsRecord> {
    match &s.kind {
        Some(sniff::Kind::Tls(TlsRecords { records })) => records.clone(),
        _ => Vec::new(),
    }
}

#[test]
fn garbage_and_other_protocols_are_unparsed_never_panic() {
    let s = feed_all(&[b"\x00\x01\x02garbage", b"SSH-2.0-OpenSSH_9.2\r\n"]);
    assert!(s.iter().all(|x| x.unparsed), "{s:?}");
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut p = StreamParser::default();
    for _ in 0..2000 {
        let len = (seed % 300) as usize;
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect();
        let _ = p.feed(&bytes, len as u64 + seed % 3);
    }
    // Random cuts of a real stream also never panic.
    let stream = chunked_sse_response(20);
    for cut in (0..stream.len()).step_by(7) {
        let mut p = StreamParser::default();
        let _ = p.feed(&stream[..cut], stream.len() as u64);
        let _ = p.feed(&stream[cut..], (stream.len() - cut) as u64 / 2);
    }
}

#[test]
fn event_stream_resumes_after_an_uncaptured_tail() {
    let stream = chunked_sse_response(40);
    let head_end = stream.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let mut p = StreamParser::default();
    p.feed(&stream[..head_end], head_end as u64);
    // A 10-event write of which only the first 300 bytes were captured.
    let ten: Vec<u8> = (0..10)
        .flat_map(|i| {
            let e = sse_event(i);
            format!("{:x}\r\n{e}\r\n", e.len()).into_bytes()
        })
        .collect();
    let s = p.feed(&ten[..300], ten.len() as u64);
    assert!(s.unparsed, "the tail went uncaptured");
    let one = {
        let e = sse_event(10);
        format!("{:x}\r\n{e}\r\n", e.len()).into_bytes()
    };
    let s = p.feed(&one, one.len() as u64);
    assert_eq!(s.sse.len(), 1, "the next chunk resumes the event stream");
    assert!(!s.unparsed);
    let end = b"0\r\n\r\n";
    let s = p.feed(end, 5);
    assert!(s.message_end, "and it ends with the final chunk");
}

#[test]
fn request_bodies_that_share_a_prefix_share_its_whole_kib_prints() {
    let system = "s".repeat(3000);
    let a = request(&format!("{system}question one {}", "a".repeat(2000)), "");
    let b = request(
        &format!("{system}another question {}", "b".repeat(2000)),
        "",
    );
    let prints = |bytes: &[u8]| -> Vec<u64> {
        let whole = feed_all(&[bytes]);
        let ended = whole
            .iter()
            .find(|s| s.message_end)
            .expect("the request ends");
        // The same prints however the body is split into I/Os.
        for cut in [1, 100, 1023, 1024, 1025, bytes.len() - 1] {
            let (x, y) = bytes.split_at(cut);
            let split = feed_all(&[x, y]);
            let got = split.iter().find(|s| s.message_end).unwrap();
            assert_eq!(got.prefix_prints, ended.prefix_prints, "cut at {cut}");
        }
        ended.prefix_prints.clone()
    };
    let (pa, pb) = (prints(&a), prints(&b));
    assert_eq!(pa.len(), 4, "4 whole KiB of a 5,013-byte body");
    let shared = pa.iter().zip(&pb).take_while(|(x, y)| x == y).count();
    assert_eq!(
        shared, 2,
        "3,000 shared bytes: the first 2 KiB match, the third not"
    );

    // Bytes that went uncaptured end the prefix; what was whole before stays.
    let mut p = StreamParser::default();
    let head_end = a.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let cut = head_end + 2500;
    p.feed(&a[..cut], cut as u64);
    let s = p.feed(&[], (a.len() - cut) as u64);
    assert!(s.message_end);
    assert_eq!(s.prefix_prints, pa[..2].to_vec());
}

#[test]
fn bytes_lost_inside_an_event_drop_that_event_only() {
    let text: String = (0..4).map(sse_event).collect();
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n",
        text.len()
    );
    let stream = [head.as_bytes(), text.as_bytes()].concat();
    let whole = events(&feed_all(&[&stream]));
    // Ten bytes inside the second event go uncaptured.
    let gap_at = head.len() + sse_event(0).len() + 10;
    let mut p = StreamParser::default();
    let a = p.feed(&stream[..gap_at], gap_at as u64 + 10);
    let b = p.feed(&stream[gap_at + 10..], (stream.len() - gap_at - 10) as u64);
    assert!(!a.unparsed && !b.unparsed && b.message_end);
    let got = events(&[a, b]);
    assert_eq!(
        got,
        vec![whole[0], whole[2], whole[3]],
        "no event made of the tail"
    );
}

#[test]
fn a_gzip_bomb_is_inflated_to_the_limit_then_cut_and_counted() {
    use flate2::{write::GzEncoder, Compression};
    use std::io::Write;
    // 64 MiB of token events, compressed to a few hundred KiB, in 4 KiB chunks.
    let mut enc = GzEncoder::new(Vec::new(), Compression::best());
    let event = sse_event(1);
    let mut inflated = 0;
    while inflated < 64 << 20 {
        enc.write_all(event.as_bytes()).unwrap();
        inflated += event.len();
    }
    let body = enc.finish().unwrap();
    let mut p = StreamParser::default();
    let head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n";
    let mut sniffs = vec![p.feed(head, head.len() as u64)];
    for piece in body.chunks(4096) {
        let mut io = format!("{:x}\r\n", piece.len()).into_bytes();
        io.extend_from_slice(piece);
        io.extend_from_slice(b"\r\n");
        sniffs.push(p.feed(&io, io.len() as u64));
    }
    const MAX_INFLATED_BYTES: u64 = crate::protocol::MAX_INFLATED_BYTES;
    let cut = |s: &&Sniff| s.hits().eq([Limit::Inflate]);
    let cuts = sniffs.iter().filter(cut).count();
    assert_eq!(cuts, 1, "cut once, where the limit was reached");
    let at = sniffs.iter().position(|s| cut(&s)).unwrap();
    let tokens = events(&sniffs)
        .iter()
        .filter(|e| e.kind() == SseKind::Choice)
        .count();
    let read = (tokens * event.len()) as u64;
    assert!(
        read <= MAX_INFLATED_BYTES && read > MAX_INFLATED_BYTES - (300 << 10),
        "events up to the limit are read ({read} bytes of events), none past it"
    );
    assert!(
        sniffs[at + 1..].iter().all(|s| s.sse.is_empty()),
        "nothing after the cut"
    );
    assert!(at < sniffs.len() - 1, "the cut came well before the end");
}

#[test]
fn a_head_past_its_limit_ends_parsing_and_names_the_limit() {
    let mut p = StreamParser::default();
    let mut head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n".to_vec();
    let line = b"x-filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n";
    let mut hits = Vec::new();
    while head.len() <= MAX_HEAD + line.len() {
        head.extend_from_slice(line);
    }
    for piece in head.chunks(4096) {
        hits.extend(p.feed(piece, piece.len() as u64).hits());
    }
    assert_eq!(hits, [Limit::HttpHead], "named once, where it was passed");
    let after = p.feed(b"\r\n\r\n", 4);
    assert!(after.kind.is_none(), "nothing is parsed past the limit");
}

#[test]
fn an_event_past_its_limit_is_counted_and_the_stream_goes_on() {
    let mut stream = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n".to_vec();
    let long = format!(
        "data: {{\"x\":\"{}\"}}\n\n",
        "a".repeat(crate::protocol::limits::MAX_SSE_EVENT)
    );
    stream.extend_from_slice(long.as_bytes());
    stream.extend_from_slice(sse_event(1).as_bytes());
    let sniffs = feed_all(&stream.chunks(1000).collect::<Vec<_>>());
    let hits: Vec<Limit> = sniffs.iter().flat_map(Sniff::hits).collect();
    assert_eq!(hits, [Limit::SseEvent]);
    let tokens = events(&sniffs)
        .iter()
        .filter(|e| e.kind() == SseKind::Choice)
        .count();
    assert_eq!(tokens, 1, "the event after the long one is read");
}

/// Found by the gzip fuzz target: uncaptured tails of 2^62 bytes, four of them, then
/// a captured byte, overflowed the body's byte count (a panic with overflow checks, a
/// wrong count without).
#[test]
fn uncaptured_bytes_past_u64_saturate_the_body_count() {
    let mut p = StreamParser::default();
    let head =
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Encoding: gzip\r\n\r\n";
    p.feed(head, head.len() as u64);
    for _ in 0..4 {
        let s = p.feed(b"", 1 << 62);
        assert_eq!(s.body_bytes, 1 << 62, "each I/O counts its own bytes");
    }
    let s = p.feed(b"\x1f", 1);
    assert_eq!(s.body_bytes, 1, "a captured byte after the saturated total");
}
