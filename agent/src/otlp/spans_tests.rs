use std::collections::HashSet;

use collector::stitch::attribution::GpuShare;
use collector::stitch::request::Forward;
use collector::stitch::{ChainSpans, PointKind, Request};
use prost::Message;

use super::*;
use crate::otlp::proto::{ExportTraceServiceRequest, ResourceSpans, ScopeSpans, Value};

const MS: u64 = 1_000_000;
/// Unix time = monotonic + this, in these tests.
const OFFSET: i128 = 1_700_000_000_000_000_000;
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// A request through nothing but the engine, seen where the client read it and where
/// the engine wrote it: connect 1 ms, upload 2 ms, engine wait 40 ms (queue 10, prefill
/// 30), 20 tokens every 5 ms with three long gaps (at tokens 5, 12, 17: 50, 30, 70 ms).
fn request() -> Request {
    let start = 1_000 * MS;
    let mut engine_tokens = Vec::new();
    let mut t = start + 43 * MS;
    for i in 0..20 {
        t += match i {
            0 => 0,
            5 => 50 * MS,
            12 => 30 * MS,
            17 => 70 * MS,
            _ => 5 * MS,
        };
        engine_tokens.push(t);
    }
    let client_tokens: Vec<u64> = engine_tokens.iter().map(|t| t + MS / 10).collect();
    let mut r = Request::at_point(7, PointKind::ClientRead, 4242, "bench", client_tokens);
    r.start_ns = start;
    r.first_byte_ns = start + MS;
    r.host = Some("127.0.0.1:8000".into());
    r.status = Some(200);
    r.api = Some("openai-completions");
    r.new_connection = true;
    r.end_ns = Some(engine_tokens[19] + MS);
    r.engine_received_ns = Some(start + 3 * MS);
    r.stages.connect_ns = Some(MS);
    r.stages.upload_ns = Some(2 * MS);
    r.stages.upstream_wait_ns = Some(40 * MS);
    r.spans = Some(ChainSpans {
        connect: Some((start, start + MS)),
        upload: Some((start + MS, start + 3 * MS)),
        ..ChainSpans::default()
    });
    r.gpu = Some(GpuShare {
        queue_ns: Some(10 * MS),
        prefill_steps: 1,
        prefill_ns: 25 * MS,
        decode_steps: 19,
        ..GpuShare::default()
    });
    r.points[0].ttft_ns = Some(43 * MS + MS / 10);
    let mut engine = r.points[0].clone();
    engine.kind = PointKind::EngineWrite;
    engine.comm = "lab-engine".into();
    engine.pid = 99;
    engine.ttft_ns = Some(43 * MS);
    engine.token_ns = engine_tokens;
    r.points.push(engine);
    r.forward = vec![Forward::between(&r.points, 0)];
    r
}

fn spans(r: &Request) -> Vec<Span> {
    request_spans(r, Clock::with_offset(OFFSET), None)
}

fn unix(mono: u64) -> u64 {
    (i128::from(mono) + OFFSET) as u64
}

fn named<'a>(spans: &'a [Span], name: &str) -> &'a Span {
    spans
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("a span named {name:?} among {:?}", names(spans)))
}

fn names(spans: &[Span]) -> Vec<&str> {
    spans.iter().map(|s| s.name.as_str()).collect()
}

fn attr<'a>(s: &'a Span, key: &str) -> Option<&'a Value> {
    s.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.as_ref())
}

fn duration(s: &Span) -> u64 {
    s.end_time_unix_nano - s.start_time_unix_nano
}

#[test]
fn one_trace_per_request_with_the_root_first_and_every_child_under_a_span_of_it() {
    let s = spans(&request());
    assert_eq!(
        names(&s),
        [
            "POST /v1/completions",
            "connect",
            "upload",
            "engine wait",
            "queue",
            "prefill",
            "decode",
            "client read",
            "engine write"
        ],
        "root, stages in time order, then a span per point"
    );
    let root = &s[0];
    assert_eq!(root.kind, SpanKind::Server as i32);
    assert!(
        root.parent_span_id.is_empty(),
        "no traceparent: a root of its own"
    );
    assert_eq!(root.trace_id.len(), 16);
    assert_ne!(root.trace_id, vec![0; 16]);
    let ids: HashSet<&[u8]> = s.iter().map(|x| x.span_id.as_slice()).collect();
    assert_eq!(ids.len(), s.len(), "span ids are unique");
    for x in &s {
        assert_eq!(x.trace_id, root.trace_id, "{}: the request's trace", x.name);
        assert_eq!(x.span_id.len(), 8);
        assert_ne!(x.span_id, vec![0; 8], "{}: a non-zero span id", x.name);
        if x.span_id != root.span_id {
            assert!(
                ids.contains(x.parent_span_id.as_slice()),
                "{}: its parent is a span of the trace",
                x.name
            );
            assert!(
                x.start_time_unix_nano >= root.start_time_unix_nano
                    && x.end_time_unix_nano <= root.end_time_unix_nano,
                "{} lies inside the root",
                x.name
            );
        }
    }
    let wait = named(&s, "engine wait");
    for n in ["queue", "prefill"] {
        assert_eq!(
            named(&s, n).parent_span_id,
            wait.span_id,
            "{n} is part of the engine wait"
        );
    }
    for n in [
        "connect",
        "upload",
        "engine wait",
        "decode",
        "client read",
        "engine write",
    ] {
        assert_eq!(
            named(&s, n).parent_span_id,
            root.span_id,
            "{n} hangs under the root"
        );
    }
    let other = spans(&request());
    assert_ne!(
        other[0].trace_id, root.trace_id,
        "each request its own trace"
    );
    let given = request_spans(&request(), Clock::with_offset(OFFSET), Some([9; 16]));
    assert!(
        given.iter().all(|x| x.trace_id == [9; 16]),
        "the trace the agent chose"
    );
}

#[test]
fn stages_lie_where_the_stitcher_placed_them_and_last_as_long_as_the_report_says() {
    let r = request();
    let s = spans(&r);
    let start = r.start_ns;
    let root = &s[0];
    assert_eq!(root.start_time_unix_nano, unix(start));
    assert_eq!(
        root.end_time_unix_nano,
        unix(r.end_ns.expect("end")),
        "the root ends at the request's end"
    );
    let at = |name: &str| {
        let x = named(&s, name);
        (x.start_time_unix_nano - unix(start), duration(x))
    };
    assert_eq!(at("connect"), (0, MS));
    assert_eq!(at("upload"), (MS, 2 * MS));
    assert_eq!(
        at("engine wait"),
        (3 * MS, 40 * MS),
        "= stages.upstream_wait_ns"
    );
    assert_eq!(at("queue"), (3 * MS, 10 * MS), "= gpu.queue_ns");
    assert_eq!(at("prefill"), (13 * MS, 30 * MS));
    let engine = &r.points[1].token_ns;
    assert_eq!(at("decode"), (43 * MS, engine[19] - engine[0]));
    let client = &r.points[0].token_ns;
    assert_eq!(
        at("client read"),
        (0, client[19] - start),
        "request start -> last token"
    );

    // Without positions, connect and upload still lie where their lengths put them.
    let mut unplaced = r.clone();
    unplaced.spans = None;
    let s = spans(&unplaced);
    let at = |name: &str| {
        let x = named(&s, name);
        (x.start_time_unix_nano - unix(start), duration(x))
    };
    assert_eq!(at("connect"), (0, MS), "from the request's start");
    assert_eq!(at("upload"), (MS, 2 * MS), "from its first byte");
}

#[test]
fn a_traceparent_puts_the_spans_in_the_callers_trace_under_its_span() {
    let mut r = request();
    r.trace_parent = Some(TRACEPARENT.into());
    let s = spans(&r);
    let trace = [
        0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47,
        0x36,
    ];
    for x in &s {
        assert_eq!(x.trace_id, trace, "{}: the caller's trace", x.name);
    }
    assert_eq!(
        s[0].parent_span_id,
        [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7],
        "the root's parent is the caller's span"
    );
    assert_eq!(s[0].flags, 0x301, "sampled, with a remote parent");
    assert_eq!(s[1].flags, 0x101, "sampled, with a local parent");
}

#[test]
fn tokens_are_summed_up_as_first_last_and_the_three_longest_gaps() {
    let r = request();
    let s = spans(&r);
    let engine = named(&s, "engine write");
    let t = &r.points[1].token_ns;
    let got: Vec<(&str, u64)> = engine
        .events
        .iter()
        .map(|e| (e.name.as_str(), e.time_unix_nano))
        .collect();
    assert_eq!(
        got,
        [
            ("first_token", unix(t[0])),
            ("gap", unix(t[5])),
            ("gap", unix(t[12])),
            ("gap", unix(t[17])),
            ("last_token", unix(t[19])),
        ],
        "5 events for 20 tokens, in time order, each gap at the token that ended it"
    );
    let gap_s: Vec<f64> = engine.events[1..4]
        .iter()
        .map(|e| {
            match e.attributes[0]
                .value
                .as_ref()
                .and_then(|v| v.value.as_ref())
            {
                Some(Value::DoubleValue(g)) => *g,
                other => panic!("a gap's length in seconds, got {other:?}"),
            }
        })
        .collect();
    assert_eq!(gap_s, [0.05, 0.03, 0.07], "the three long gaps, in seconds");
    assert!(
        s.iter().all(|x| x.events.len() <= 5),
        "never one event per token"
    );
    let stages_have_none = s
        .iter()
        .filter(|x| attr(x, "tokenscope.point").is_none())
        .all(|x| x.events.is_empty());
    assert!(stages_have_none, "events only on the points' spans");

    // A short stream has no gaps to tell; several choices have gaps only within each.
    let mut p = r.points[0].clone();
    p.token_ns = vec![10, 20, 25, 100];
    p.token_choice = vec![0, 1, 0, 1];
    assert_eq!(
        gaps(&p),
        [(25, 15), (100, 80)],
        "per choice, at the token that ended it"
    );
    p.token_ns.truncate(1);
    p.token_choice.clear();
    let names: Vec<String> = token_events(&p, Clock::with_offset(0))
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, ["first_token", "last_token"]);
}

#[test]
fn attributes_follow_the_genai_and_http_conventions_and_tokenscope_names_the_rest() {
    let r = request();
    let s = spans(&r);
    let root = &s[0];
    let str_of = |x: &Span, k: &str| match attr(x, k) {
        Some(Value::StringValue(v)) => v.clone(),
        other => panic!("{}: {k} is a string, got {other:?}", x.name),
    };
    let int_of = |x: &Span, k: &str| match attr(x, k) {
        Some(Value::IntValue(v)) => *v,
        other => panic!("{}: {k} is an int, got {other:?}", x.name),
    };
    let f64_of = |x: &Span, k: &str| match attr(x, k) {
        Some(Value::DoubleValue(v)) => *v,
        other => panic!("{}: {k} is a double, got {other:?}", x.name),
    };
    assert_eq!(str_of(root, "gen_ai.operation.name"), "text_completion");
    assert_eq!(str_of(root, "http.request.method"), "POST");
    assert_eq!(str_of(root, "url.path"), "/v1/completions");
    assert_eq!(str_of(root, "server.address"), "127.0.0.1");
    assert_eq!(int_of(root, "server.port"), 8000);
    assert_eq!(int_of(root, "http.response.status_code"), 200);
    assert_eq!(str_of(root, "tokenscope.api"), "openai-completions");
    assert_eq!(int_of(root, "tokenscope.tokens"), 20);
    assert_eq!(
        int_of(root, "tokenscope.start_monotonic_ns"),
        r.start_ns as i64
    );
    assert_eq!(
        attr(root, "tokenscope.new_connection"),
        Some(&Value::BoolValue(true))
    );
    assert_eq!(
        attr(root, "tokenscope.truncated"),
        Some(&Value::BoolValue(false))
    );
    let ttft = 0.0431;
    assert!((f64_of(root, "gen_ai.response.time_to_first_chunk") - ttft).abs() < 1e-12);
    assert!(
        (f64_of(root, "tokenscope.ttft_s") - ttft).abs() < 1e-12,
        "the client's TTFT"
    );
    assert!((f64_of(root, "tokenscope.itl_p50_s") - 0.005).abs() < 1e-12);
    assert!(f64_of(root, "tokenscope.itl_p99_s") > 0.06);
    assert_eq!(root.status, None, "a 200 that ended well");

    let engine = named(&s, "engine write");
    assert_eq!(str_of(engine, "tokenscope.point"), "engine write");
    assert_eq!(str_of(engine, "tokenscope.comm"), "lab-engine");
    assert!((f64_of(engine, "tokenscope.ttft_s") - 0.043).abs() < 1e-12);
    let client = named(&s, "client read");
    assert!((f64_of(client, "tokenscope.forward_p50_s") - 0.0001).abs() < 1e-12);

    let mut chat = r.clone();
    chat.api = Some("openai-chat");
    chat.path = "/v1/chat/completions".into();
    chat.status = Some(503);
    chat.host = Some("api.example.com".into());
    let s = spans(&chat);
    assert_eq!(str_of(&s[0], "gen_ai.operation.name"), "chat");
    assert_eq!(str_of(&s[0], "server.address"), "api.example.com");
    assert!(
        attr(&s[0], "server.port").is_none(),
        "a Host without a port has none"
    );
    let status = s[0].status.as_ref().expect("a 503 is an error");
    assert_eq!(status.code, StatusCode::Error as i32);
}

#[test]
fn a_batch_of_spans_survives_protobuf_encoding_unchanged() {
    let s = spans(&request());
    let req = ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: None,
            scope_spans: vec![ScopeSpans {
                scope: None,
                spans: s.clone(),
            }],
            schema_url: String::new(),
        }],
    };
    let bytes = req.encode_to_vec();
    let back = ExportTraceServiceRequest::decode(bytes.as_slice()).expect("decodes");
    assert_eq!(back, req);
    assert!(
        bytes.len() < 4096,
        "a 20-token request with two points stays small: {} bytes",
        bytes.len()
    );
}

#[test]
fn a_request_known_at_one_point_only_still_makes_a_trace() {
    let r = Request::at_point(1, PointKind::ClientRead, 1, "curl", vec![5 * MS, 6 * MS]);
    let s = spans(&r);
    assert_eq!(names(&s), ["POST /v1/completions", "client read"]);
    assert_eq!(duration(&s[0]), MS);
    let empty = Request::at_point(2, PointKind::ClientRead, 1, "curl", Vec::new());
    let s = spans(&empty);
    assert_eq!(names(&s), ["POST /v1/completions", "client read"]);
    assert!(s
        .iter()
        .all(|x| x.end_time_unix_nano >= x.start_time_unix_nano));
}
