//! The profiler's token rule and the lab bench's agree on every example stream of
//! lab/API-SHAPES.md (what the lab engine writes for each API): the same tokens, in
//! the same order, of the same choice and kind, the same end, whatever the read
//! boundaries on the profiler's side. Two implementations of one contract, checked
//! against each other on real server output.
#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

use collector::ingest::model::{Api as Shape, SseEvent, SseKind, TokenKind};
use collector::protocol::sse::SseSplitter;
use tokenscope_lab::api::Api;
use tokenscope_lab::bench::rules;
use tokenscope_lab::bench::wire::WireParser;

/// (API name, whether the request asked for a stream, the response body) of every
/// `text response NAME` block (the request is the `json request NAME` block before it).
fn examples() -> Vec<(String, bool, Vec<u8>)> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/lab/API-SHAPES.md"))
        .expect("lab/API-SHAPES.md");
    let mut out = Vec::new();
    let mut lines = doc.lines();
    let mut stream = true;
    while let Some(line) = lines.next() {
        if line.starts_with("```json request ") {
            // OpenAI chat/completions stream when asked; the others unless told not to.
            let request = lines.next().unwrap_or_default().replace(' ', "");
            let asks = line.contains("openai-chat") || line.contains("openai-completions");
            stream = request.contains("\"stream\":true")
                || (!asks && !request.contains("\"stream\":false"));
            continue;
        }
        let Some(name) = line.strip_prefix("```text response ") else {
            continue;
        };
        let mut body = String::new();
        for l in lines.by_ref() {
            if l == "```" {
                break;
            }
            body.push_str(l);
            body.push('\n');
        }
        out.push((name.trim().to_string(), stream, body.into_bytes()));
    }
    out
}

fn lab_api(name: &str) -> Api {
    *Api::ALL
        .iter()
        .find(|a| a.name() == name)
        .unwrap_or_else(|| panic!("no lab API {name}"))
}

/// The profiler's label for a lab API.
fn label(api: Api) -> &'static str {
    match api {
        Api::OllamaGenerate | Api::OllamaChat => "ollama",
        other => other.name(),
    }
}

/// Tokens as (choice, kind) and whether the stream ended, by the lab's rule.
fn lab_verdict(api: Api, body: &[u8]) -> (Vec<(u32, &'static str)>, bool) {
    let mut p = WireParser::new(api, true);
    let mut events = p.push(body);
    events.extend(p.finish());
    let tokens = events
        .iter()
        .filter_map(|e| e.token)
        .map(|t| {
            let kind = match t.kind {
                rules::TokenKind::Text => "text",
                rules::TokenKind::Reasoning => "reasoning",
                rules::TokenKind::Tool => "tool",
            };
            (t.choice_index, kind)
        })
        .collect();
    (tokens, events.iter().any(|e| e.end))
}

/// The same by the profiler's splitter and shapes, fed `body` cut at `cuts`.
fn profiler_verdict(
    ndjson: bool,
    body: &[u8],
    cuts: &[usize],
) -> (Vec<(u32, &'static str)>, bool, Vec<SseEvent>) {
    let mut s = if ndjson {
        SseSplitter::ndjson()
    } else {
        SseSplitter::new()
    };
    let mut events = Vec::new();
    let mut at = 0;
    for &cut in cuts.iter().chain([&body.len()]) {
        events.extend(s.feed(&body[at..cut]));
        at = cut;
    }
    let tokens = events
        .iter()
        .filter(|e| e.kind() == SseKind::Choice)
        .map(|e| {
            let kind = match e.token() {
                TokenKind::Text => "text",
                TokenKind::Reasoning => "reasoning",
                TokenKind::Tool => "tool",
            };
            (e.choice, kind)
        })
        .collect();
    let end = events.iter().any(|e| e.kind() == SseKind::Done);
    (tokens, end, events)
}

#[test]
fn the_profiler_reads_every_apis_tokens_as_the_bench_does_at_every_split() {
    let examples = examples();
    assert!(
        examples.len() >= 10,
        "the doc has an example per API: {}",
        examples.len()
    );
    let mut seen = std::collections::BTreeSet::new();
    let mut whole = 0;
    for (name, stream, body) in &examples {
        let api = lab_api(name);
        if !stream {
            // A whole JSON answer: no token events by either rule (the profiler times it
            // to its first body byte: stitch's tests).
            let mut p = WireParser::new(api, false);
            p.push(body);
            assert!(p.finish().iter().all(|e| e.token.is_none()), "{name}");
            whole += 1;
            continue;
        }
        let (want, want_end) = lab_verdict(api, body);
        assert!(
            !want.is_empty() && want_end,
            "{name}: the example streams tokens and ends: {want:?} {want_end} in {}",
            String::from_utf8_lossy(body)
        );
        let ndjson = api.is_ndjson();
        let (got, end, events) = profiler_verdict(ndjson, body, &[]);
        assert_eq!(got, want, "{name}: tokens (choice, kind)");
        assert_eq!(end, want_end, "{name}: the end");
        let named = events
            .iter()
            .map(SseEvent::api)
            .find(|a| !matches!(a, Shape::Unknown | Shape::Unspecified))
            .map(Shape::label);
        assert_eq!(named, Some(label(api)), "{name}: named by its shape");
        seen.insert(label(api));
        for cut in 0..=body.len() {
            let (_, _, split) = profiler_verdict(ndjson, body, &[cut]);
            assert_eq!(split, events, "{name}: cut at byte {cut}");
        }
        let bytes: Vec<usize> = (1..body.len()).collect();
        let (_, _, one_by_one) = profiler_verdict(ndjson, body, &bytes);
        assert_eq!(one_by_one, events, "{name}: a byte at a time");
    }
    assert_eq!(seen.len(), 7, "every API has a streamed example: {seen:?}");
    assert!(whole >= 1, "and a whole JSON answer");
}
