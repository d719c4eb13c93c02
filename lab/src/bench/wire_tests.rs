//! Each API's parser against its server's real output: the same tokens whatever the read
//! boundaries, keep-alive comments anywhere, and nothing but tokens counted as tokens.
use super::rules::{TokenKind, TokenMark};
use super::wire::WireParser;
use crate::api::Api;
use crate::engine::EngineConfig;
use crate::server::render_response;

/// What a whole response said: its token events in order, the end, the usage count.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Heard {
    tokens: Vec<TokenMark>,
    end: bool,
    usage: Option<u32>,
    id: Option<String>,
}

fn hear(parser: &mut WireParser, pieces: &[&[u8]]) -> Heard {
    let mut heard = Heard {
        tokens: Vec::new(),
        end: false,
        usage: None,
        id: None,
    };
    let events = pieces
        .iter()
        .flat_map(|p| parser.push(p))
        .collect::<Vec<_>>()
        .into_iter()
        .chain(parser.finish());
    for ev in events {
        heard.tokens.extend(ev.token);
        heard.end |= ev.end;
        heard.usage = ev.usage_tokens.or(heard.usage);
        heard.id = heard.id.or(ev.id);
    }
    heard
}

/// A request, whether it streams, the kinds of its tokens in order (runs of a kind), and
/// its number of choices.
struct Case {
    api: Api,
    stream: bool,
    body: &'static str,
    runs: &'static [(TokenKind, usize)],
    choices: u32,
}

impl Case {
    fn kinds(&self) -> Vec<TokenKind> {
        self.runs
            .iter()
            .flat_map(|&(k, n)| std::iter::repeat_n(k, n))
            .collect()
    }
}

const fn case(api: Api, body: &'static str, runs: &'static [(TokenKind, usize)]) -> Case {
    Case {
        api,
        stream: true,
        body,
        runs,
        choices: 1,
    }
}

const CASES: [Case; 14] = {
    use TokenKind::{Reasoning, Text, Tool};
    [
        // The role chunk is a token event without content: 5 tokens + 1.
        case(
            Api::OpenAiChat,
            r#"{"messages":[{"role":"user","content":"hi there"}],"max_tokens":5,"stream":true,"stream_options":{"include_usage":true}}"#,
            &[(Text, 6)],
        ),
        Case {
            choices: 2,
            ..case(
                Api::OpenAiChat,
                r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":4,"n":2,"stream":true,"stream_options":{"include_usage":true}}"#,
                &[(Text, 10)],
            )
        },
        case(
            Api::OpenAiCompletions,
            r#"{"prompt":"a b c","max_tokens":5,"stream":true}"#,
            &[(Text, 5)],
        ),
        case(
            Api::OpenAiResponses,
            r#"{"input":"hi","max_output_tokens":5,"stream":true}"#,
            &[(Text, 5)],
        ),
        case(
            Api::OpenAiResponses,
            r#"{"input":[{"role":"user","content":"hi"}],"max_output_tokens":6,"stream":true,"reasoning":{"effort":"medium"},"tools":[{"type":"function","name":"f"}],"tool_choice":"required"}"#,
            &[(Reasoning, 3), (Tool, 3)],
        ),
        case(
            Api::Anthropic,
            r#"{"model":"lab-model","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
            &[(Text, 5)],
        ),
        case(
            Api::Anthropic,
            r#"{"max_tokens":6,"stream":true,"system":"be brief","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"thinking":{"type":"enabled","budget_tokens":2}}"#,
            &[(Reasoning, 2), (Text, 4)],
        ),
        case(
            Api::Anthropic,
            r#"{"max_tokens":4,"stream":true,"messages":[{"role":"user","content":"hi"}],"tools":[{"name":"f","input_schema":{}}],"tool_choice":{"type":"any"}}"#,
            &[(Tool, 4)],
        ),
        case(
            Api::Gemini,
            r#"{"contents":[{"role":"user","parts":[{"text":"hi"}]}],"generationConfig":{"maxOutputTokens":5}}"#,
            &[(Text, 5)],
        ),
        case(
            Api::Tgi,
            r#"{"inputs":"hi","parameters":{"max_new_tokens":5}}"#,
            &[(Text, 5)],
        ),
        case(
            Api::OllamaGenerate,
            r#"{"model":"lab-model","prompt":"hi","options":{"num_predict":5}}"#,
            &[(Text, 5)],
        ),
        case(
            Api::OllamaChat,
            r#"{"model":"lab-model","messages":[{"role":"user","content":"hi"}],"options":{"num_predict":5}}"#,
            &[(Text, 5)],
        ),
        Case {
            stream: false,
            ..case(
                Api::OpenAiChat,
                r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":3}"#,
                &[],
            )
        },
        Case {
            stream: false,
            ..case(
                Api::OllamaGenerate,
                r#"{"prompt":"hi","stream":false,"options":{"num_predict":3}}"#,
                &[],
            )
        },
    ]
};

fn rendered(c: &Case) -> Vec<u8> {
    let cfg = EngineConfig::default();
    render_response(c.api, &c.api.route(&cfg.model), c.body.as_bytes(), &cfg)
        .unwrap_or_else(|e| panic!("{}: the server accepts {}: {e:?}", c.api, c.body))
        .concat()
}

#[test]
fn every_api_yields_its_tokens_whatever_the_read_boundaries() {
    for c in &CASES {
        let bytes = rendered(c);
        let whole = hear(&mut WireParser::new(c.api, c.stream), &[&bytes]);
        let got: Vec<TokenKind> = whole.tokens.iter().map(|t| t.kind).collect();
        assert_eq!(
            got,
            c.kinds(),
            "{} ({}): token kinds in order",
            c.api,
            c.body
        );
        let choices: std::collections::BTreeSet<u32> =
            whole.tokens.iter().map(|t| t.choice_index).collect();
        assert!(
            whole.tokens.is_empty() || choices.len() as u32 == c.choices,
            "{}: {} choice series, got {choices:?}",
            c.api,
            c.choices
        );
        assert!(whole.end, "{} ({}): the end event is seen", c.api, c.body);
        for at in 0..=bytes.len() {
            let (a, b) = bytes.split_at(at);
            let split = hear(&mut WireParser::new(c.api, c.stream), &[a, b]);
            assert_eq!(split, whole, "{}: split at byte {at} hears the same", c.api);
        }
        let bytewise: Vec<&[u8]> = bytes.chunks(1).collect();
        let heard = hear(&mut WireParser::new(c.api, c.stream), &bytewise);
        assert_eq!(heard, whole, "{}: one byte per read hears the same", c.api);
    }
}

#[test]
fn content_usage_and_ids_match_what_the_server_counted() {
    for c in CASES.iter().filter(|c| c.stream) {
        let heard = hear(&mut WireParser::new(c.api, true), &[&rendered(c)]);
        let content = heard.tokens.iter().filter(|t| t.content).count() as u32;
        // Each choice's tokens are counted once per engine token; the role chunks are not.
        assert_eq!(
            heard.usage.unwrap_or(content),
            content,
            "{}: usage counts the content tokens",
            c.api
        );
        let has_id = !matches!(c.api, Api::Tgi | Api::OllamaGenerate | Api::OllamaChat);
        assert_eq!(
            heard.id.is_some(),
            has_id,
            "{}: the body carries an id",
            c.api
        );
    }
}

#[test]
fn keep_alive_comments_between_events_change_nothing() {
    for c in CASES.iter().filter(|c| c.stream && !c.api.is_ndjson()) {
        let cfg = EngineConfig::default();
        let pieces = render_response(c.api, &c.api.route(&cfg.model), c.body.as_bytes(), &cfg)
            .expect("the server accepts the case");
        let mut with_comments = b": keep-alive\n\n".to_vec();
        for p in &pieces {
            with_comments.extend_from_slice(p);
            with_comments.extend_from_slice(b": OPENROUTER PROCESSING\r\n\r\n");
        }
        let plain = hear(&mut WireParser::new(c.api, true), &[&pieces.concat()]);
        let commented = hear(&mut WireParser::new(c.api, true), &[&with_comments]);
        assert_eq!(commented, plain, "{}: comments are never events", c.api);
    }
}

#[test]
fn garbage_and_truncation_never_panic_or_end_a_stream() {
    for api in Api::ALL {
        for stream in [true, false] {
            let mut p = WireParser::new(api, stream);
            let mut events = p.push(b"data: {\"choices\":[{\"ind\xff\xfe\n\n{\"done\":tr");
            events.extend(p.push(&[0u8, 13, 10, 13, 10, b':', 10, 10]));
            events.extend(p.finish());
            assert!(
                events.iter().all(|e| !e.end),
                "{api}: garbage never ends a response"
            );
        }
    }
}

/// The events of a response as JSON values (SSE events as `[name, data]`), with Ollama's
/// wall-clock stamps and durations blanked: what the wire-shape doc must show.
fn events_of(api: Api, text: &str) -> Vec<serde_json::Value> {
    const VOLATILE: [&str; 5] = [
        "created_at",
        "total_duration",
        "load_duration",
        "prompt_eval_duration",
        "eval_duration",
    ];
    let json = |data: &[u8]| {
        let mut v: serde_json::Value = serde_json::from_slice(data)
            .unwrap_or_else(|_| serde_json::Value::from(String::from_utf8_lossy(data)));
        if let Some(o) = v.as_object_mut() {
            for key in VOLATILE {
                if let Some(value) = o.get_mut(key) {
                    *value = serde_json::Value::Null;
                }
            }
        }
        v
    };
    if api.is_ndjson() || text.trim_start().starts_with('{') {
        return text
            .lines()
            .filter(|l| !l.is_empty())
            .map(|l| json(l.as_bytes()))
            .collect();
    }
    // The doc's blocks drop the blank line after the last event.
    super::wire::SseSplitter::default()
        .push(format!("{text}\n\n").as_bytes())
        .iter()
        .map(|b| serde_json::json!([b.name, json(&b.data)]))
        .collect()
}

/// The doc's fenced blocks tagged `json request API` / `text response API`, paired.
fn doc_examples(doc: &str) -> Vec<(Api, String, String)> {
    let mut blocks = Vec::new();
    let mut lines = doc.lines();
    while let Some(line) = lines.next() {
        let Some(info) = line.strip_prefix("```") else {
            continue;
        };
        let body: Vec<&str> = lines
            .by_ref()
            .take_while(|l| !l.starts_with("```"))
            .collect();
        blocks.push((info.to_string(), body.join("\n")));
    }
    let mut out = Vec::new();
    for pair in blocks.windows(2) {
        let (req, resp) = (&pair[0], &pair[1]);
        let Some(name) = req.0.strip_prefix("json request ") else {
            continue;
        };
        let api = Api::ALL
            .into_iter()
            .find(|a| a.name() == name)
            .unwrap_or_else(|| panic!("API-SHAPES.md names a known API: {name}"));
        assert_eq!(
            resp.0,
            format!("text response {name}"),
            "a response follows each request"
        );
        out.push((api, req.1.clone(), resp.1.clone()));
    }
    out
}

#[test]
fn api_shapes_doc_shows_what_the_server_writes() {
    let doc = include_str!("../../API-SHAPES.md");
    let examples = doc_examples(doc);
    let documented: std::collections::BTreeSet<&str> =
        examples.iter().map(|e| e.0.name()).collect();
    assert_eq!(
        documented.len(),
        Api::ALL.len(),
        "every API has an example: {documented:?}"
    );
    let cfg = EngineConfig::default();
    for (api, request, response) in examples {
        let written = render_response(api, &api.route(&cfg.model), request.as_bytes(), &cfg)
            .unwrap_or_else(|e| panic!("{api}: the doc's request is accepted: {e:?}"))
            .concat();
        assert_eq!(
            events_of(api, &response),
            events_of(api, &String::from_utf8_lossy(&written)),
            "{api}: API-SHAPES.md shows what the server writes for {request}"
        );
    }
}
