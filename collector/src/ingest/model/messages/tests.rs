//! The hand-written protobuf of `Sniff`, `Header` and the HTTP heads against prost's
//! derive: the same bytes written, the same values read back.

use prost::Message;

use crate::ingest::model::{
    sniff, BodyPrint, H2StreamSniff, Header, HttpRequestHead, HttpResponseHead, Sniff, SseEvent,
};

/// `Sniff` as prost's derive had it (its `sse` a `Vec`): the hand-written encoding
/// must write these bytes and read them back.
#[derive(Clone, PartialEq, prost::Message)]
struct Derived {
    #[prost(fixed64, tag = "1")]
    fingerprint: u64,
    #[prost(oneof = "sniff::Kind", tags = "10, 11, 12")]
    kind: Option<sniff::Kind>,
    #[prost(bool, tag = "20")]
    message_start: bool,
    #[prost(bool, tag = "21")]
    message_end: bool,
    #[prost(uint64, tag = "22")]
    body_bytes: u64,
    #[prost(message, optional, tag = "23")]
    body_print: Option<BodyPrint>,
    #[prost(message, repeated, tag = "24")]
    sse: Vec<SseEvent>,
    #[prost(bool, tag = "25")]
    unparsed: bool,
    #[prost(bool, tag = "26")]
    compressed: bool,
    #[prost(fixed64, repeated, tag = "27")]
    prefix_prints: Vec<u64>,
    #[prost(message, repeated, tag = "28")]
    h2_streams: Vec<H2StreamSniff>,
    #[prost(uint32, tag = "29")]
    h2_control_frames: u32,
    #[prost(uint32, tag = "30")]
    h2_errors: u32,
    #[prost(bool, tag = "31")]
    h2_preface: bool,
    #[prost(uint32, tag = "33")]
    limits: u32,
}

/// `Header` as prost's derive had it (`String`s).
#[derive(Clone, PartialEq, prost::Message)]
struct DerivedHeader {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(string, optional, tag = "2")]
    value: Option<String>,
}

#[test]
fn headers_are_written_and_read_as_prost_derive_did() {
    let long = "x".repeat(40); // past CompactString's inline 24 bytes
    for (name, value) in [
        ("content-type", Some("text/event-stream")),
        ("x-empty", Some("")),
        ("authorization", None),
        ("", None),
        (long.as_str(), Some(long.as_str())),
    ] {
        let ours = Header {
            name: name.into(),
            value: value.map(Into::into),
        };
        let theirs = DerivedHeader {
            name: name.into(),
            value: value.map(Into::into),
        }
        .encode_to_vec();
        assert_eq!(ours.encode_to_vec(), theirs, "{ours:?}");
        assert_eq!(ours.encoded_len(), theirs.len(), "{ours:?}");
        assert_eq!(Header::decode(&theirs[..]).expect("reads"), ours);
    }
    for bad in [&[0x0a, 0x02, 0xff, 0xfe][..], &[0x12, 0x05, b'a']] {
        let ours = Header::decode(bad).expect_err("damaged").to_string();
        let theirs = DerivedHeader::decode(bad).expect_err("damaged").to_string();
        assert_eq!(
            ours.replace("Header.", "DerivedHeader."),
            theirs,
            "{bad:x?}"
        );
    }
}

/// `HttpRequestHead` as prost's derive had it (`String`s).
#[derive(Clone, PartialEq, prost::Message)]
struct DerivedRequestHead {
    #[prost(string, tag = "1")]
    method: String,
    #[prost(string, tag = "2")]
    path: String,
    #[prost(bool, tag = "3")]
    has_query: bool,
    #[prost(string, tag = "4")]
    version: String,
    #[prost(message, repeated, tag = "5")]
    headers: Vec<DerivedHeader>,
    #[prost(bool, tag = "6")]
    complete: bool,
}

/// `HttpResponseHead` as prost's derive had it.
#[derive(Clone, PartialEq, prost::Message)]
struct DerivedResponseHead {
    #[prost(string, tag = "1")]
    version: String,
    #[prost(uint32, tag = "2")]
    status: u32,
    #[prost(message, repeated, tag = "3")]
    headers: Vec<DerivedHeader>,
    #[prost(bool, tag = "4")]
    complete: bool,
}

/// `ours` writes `theirs` (prost's derive's bytes), says their length, and reads back
/// from them.
fn written_and_read_as<M: Message + Default + PartialEq + std::fmt::Debug>(
    ours: &M,
    theirs: &[u8],
) {
    assert_eq!(ours.encode_to_vec(), theirs, "{ours:?}");
    assert_eq!(ours.encoded_len(), theirs.len(), "{ours:?}");
    assert_eq!(&M::decode(theirs).expect("reads"), ours);
}

#[test]
fn heads_are_written_and_read_as_prost_derive_did() {
    let long = format!("/v1/{}", "x".repeat(40)); // past CompactString's inline 24 bytes
    let headers = || {
        vec![
            Header {
                name: "host".into(),
                value: Some("api:8000".into()),
            },
            Header {
                name: "authorization".into(),
                value: None,
            },
        ]
    };
    let derived_headers = || {
        headers()
            .into_iter()
            .map(|h| DerivedHeader {
                name: h.name.into(),
                value: h.value.map(Into::into),
            })
            .collect::<Vec<_>>()
    };
    for (method, path, version, flags, with_headers) in [
        ("POST", "/v1/chat/completions", "HTTP/1.1", true, true),
        ("GET", long.as_str(), "HTTP/2", false, false),
        ("", "", "", false, false),
    ] {
        let (ours_headers, their_headers) = if with_headers {
            (headers(), derived_headers())
        } else {
            Default::default()
        };
        let status = if flags { 200 } else { 0 };
        let ours = HttpRequestHead {
            method: method.into(),
            path: path.into(),
            has_query: flags,
            version: version.into(),
            headers: ours_headers.clone(),
            complete: flags,
        };
        let theirs = DerivedRequestHead {
            method: method.into(),
            path: path.into(),
            has_query: flags,
            version: version.into(),
            headers: their_headers.clone(),
            complete: flags,
        };
        written_and_read_as(&ours, &theirs.encode_to_vec());
        let ours = HttpResponseHead {
            version: version.into(),
            status,
            headers: ours_headers,
            complete: flags,
        };
        let theirs = DerivedResponseHead {
            version: version.into(),
            status,
            headers: their_headers,
            complete: flags,
        };
        written_and_read_as(&ours, &theirs.encode_to_vec());
    }
    // Damaged bytes are the errors the derive gave: text that is not UTF-8, a length
    // past the end, a header cut short, a varint where a string goes.
    for bad in [
        &[0x0a, 0x02, 0xff, 0xfe][..],
        &[0x12, 0x05, b'a'],
        &[0x2a, 0x03, 0x0a, 0x05, b'h'],
        &[0x20, 0x01],
    ] {
        let ours = HttpRequestHead::decode(bad)
            .expect_err("damaged")
            .to_string();
        let theirs = DerivedRequestHead::decode(bad)
            .expect_err("damaged")
            .to_string();
        assert_eq!(
            ours.replace("HttpRequestHead.", "DerivedRequestHead.")
                .replace("Header.", "DerivedHeader."),
            theirs,
            "{bad:x?}"
        );
    }
    for bad in [&[0x0a, 0x02, 0xff, 0xfe][..], &[0x10, 0x80], &[0x0a, 0x01]] {
        let ours = HttpResponseHead::decode(bad)
            .expect_err("damaged")
            .to_string();
        let theirs = DerivedResponseHead::decode(bad)
            .expect_err("damaged")
            .to_string();
        assert_eq!(
            ours.replace("HttpResponseHead.", "DerivedResponseHead."),
            theirs,
            "{bad:x?}"
        );
    }
}

fn sse(n: u64) -> SseEvent {
    SseEvent {
        fingerprint: n,
        kind: 1,
        api: 2,
        choice: 3,
        token: 1,
        text_print: n << 40,
    }
}

fn derived(s: &Sniff) -> Derived {
    Derived {
        fingerprint: s.fingerprint,
        kind: s.kind.clone(),
        message_start: s.message_start,
        message_end: s.message_end,
        body_bytes: s.body_bytes,
        body_print: s.body_print,
        sse: s.sse.to_vec(),
        unparsed: s.unparsed,
        compressed: s.compressed,
        prefix_prints: s.prefix_prints.clone(),
        h2_streams: s.h2_streams.clone(),
        h2_control_frames: s.h2_control_frames,
        h2_errors: s.h2_errors,
        h2_preface: s.h2_preface,
        limits: s.limits,
    }
}

#[test]
fn sniffs_are_written_and_read_as_prost_derive_did() {
    // Every field set, none left to `..` (a field added must be set here, and
    // `Sniff::clear` is checked against it below).
    let full = Sniff {
        fingerprint: u64::MAX - 7,
        kind: Some(sniff::Kind::HttpResponse(Box::new(HttpResponseHead {
            version: "HTTP/1.1".into(),
            status: 200,
            headers: vec![Header {
                name: "content-type".into(),
                value: Some("text/event-stream".into()),
            }],
            complete: true,
        }))),
        message_start: true,
        message_end: true,
        body_bytes: 300,
        body_print: Some(BodyPrint {
            hash: 9,
            length: 1 << 20,
        }),
        sse: (1..=3).map(sse).collect(),
        unparsed: true,
        compressed: true,
        prefix_prints: vec![1, u64::MAX],
        h2_streams: vec![H2StreamSniff {
            stream_id: 3,
            sniff: Some(Sniff {
                sse: [sse(4)].into_iter().collect(),
                message_end: true,
                ..Sniff::default()
            }),
            ..H2StreamSniff::default()
        }],
        h2_control_frames: 2,
        h2_errors: 1,
        h2_preface: true,
        limits: 5,
    };
    let one_event = Sniff {
        sse: [sse(5)].into_iter().collect(),
        body_bytes: 120,
        ..Sniff::default()
    };
    // Cleared, a sniff is the default but for its vectors' room.
    let mut cleared = full.clone();
    cleared.clear();
    assert_eq!(cleared, Sniff::default());
    assert!(cleared.sse.capacity() >= 3 && cleared.prefix_prints.capacity() >= 2);
    assert!(cleared.h2_streams.capacity() >= 1);
    for s in [full, one_event, Sniff::default()] {
        let theirs = derived(&s).encode_to_vec();
        assert_eq!(s.encode_to_vec(), theirs, "{s:?}");
        assert_eq!(s.encoded_len(), theirs.len(), "{s:?}");
        assert_eq!(Sniff::decode(&theirs[..]).expect("reads"), s);
    }
    // A field this reading does not know is skipped, as the derive skipped it.
    let mut unknown = Sniff::default().encode_to_vec();
    prost::encoding::uint32::encode(40, &7, &mut unknown);
    assert_eq!(
        Sniff::decode(&unknown[..]).expect("reads"),
        Sniff::default()
    );
    // Damaged bytes are the errors the derive gave.
    for bad in [
        &[0xc2, 0x01, 5, 9][..],
        &[0xc2, 0x01, 2, 0x08, 0x80],
        &[0xa0, 0x01],
    ] {
        let ours = Sniff::decode(bad).expect_err("damaged").to_string();
        let theirs = Derived::decode(bad).expect_err("damaged").to_string();
        assert_eq!(ours.replace("Sniff.", "Derived."), theirs, "{bad:x?}");
    }
}
