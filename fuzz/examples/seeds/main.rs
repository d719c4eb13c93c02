//! Writes the seed corpora (fuzz/corpus/<target>/) with the real encoders: the bytes
//! are committed, this is how they were made. Run from the repository root:
//!
//!     cargo run --manifest-path fuzz/Cargo.toml --example seeds
//!
//! Seeds are small and realistic: what the probes see of OpenAI, Anthropic, Gemini
//! and Ollama traffic over HTTP/1.1, HTTP/2 and TLS, cut into I/Os as sockets cut it
//! (see `tokenscope_fuzz::ios` for the layout of inputs that hold several I/Os).
//! The binary formats (ring records, recordings, the CUPTI hook's wire) are in
//! `binary.rs`.

use std::io::Write;
use std::path::{Path, PathBuf};

use flate2::write::GzEncoder;
use tokenscope_fuzz::cut_prefix;
// Built with the targets' coverage instrumentation (it shares their build): libFuzzer
// defines the callbacks the instrumented code calls.
use libfuzzer_sys as _;

const CHAT_REQUEST: &str = "POST /v1/chat/completions HTTP/1.1\r\nHost: api.openai.com\r\n\
Authorization: Bearer sk-proj-SECRET\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n\
Content-Length: 87\r\n\r\n\
{\"model\":\"gpt-4o\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"Say hi twice\"}]}";

const ANTHROPIC_REQUEST_HEAD: &str = "POST /v1/messages HTTP/1.1\r\nHost: api.anthropic.com\r\n\
x-api-key: sk-ant-SECRET\r\nanthropic-version: 2023-06-01\r\ncontent-type: application/json\r\n\
Transfer-Encoding: chunked\r\n\r\n";

const SSE_HEAD: &str = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n\
Transfer-Encoding: chunked\r\nConnection: keep-alive\r\nCache-Control: no-cache\r\n\
Set-Cookie: __cf_bm=SECRET; path=/\r\n\r\n";

const OPENAI_SSE: &str = "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n\
data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n\
data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"hm\"}}]}\n\n\
data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n\
data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2}}\n\n\
data: [DONE]\n\n";

const ANTHROPIC_SSE: &str = "event: message_start\r\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"content\":[],\"usage\":{\"input_tokens\":9}}}\r\n\r\n\
event: content_block_start\r\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\r\n\r\n\
event: ping\r\ndata: {\"type\": \"ping\"}\r\n\r\n\
event: content_block_delta\r\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\r\n\r\n\
event: content_block_delta\r\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"h\"}}\r\n\r\n\
event: content_block_stop\r\ndata: {\"type\":\"content_block_stop\",\"index\":0}\r\n\r\n\
event: message_delta\r\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":2}}\r\n\r\n\
event: message_stop\r\ndata: {\"type\":\"message_stop\"}\r\n\r\n";

const GEMINI_SSE: &str = "data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"Hi\",\"thought\":true}],\"role\": \"model\"},\"index\": 0}]}\r\n\r\n\
data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \" there\"}],\"role\": \"model\"},\"finishReason\": \"STOP\",\"index\": 0}],\"usageMetadata\": {\"promptTokenCount\": 4}}\r\n\r\n";

const RESPONSES_SSE: &str = "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\",\"output\":[]},\"sequence_number\":0}\n\n\
event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\",\"sequence_number\":1}\n\n\
event: response.function_call_arguments.delta\ndata: {\"type\":\"response.function_call_arguments.delta\",\"delta\":\"{\\\"\",\"sequence_number\":2}\n\n\
event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":3}\n\n";

const TGI_SSE: &str = "data:{\"index\":1,\"token\":{\"id\":5,\"text\":\" a\",\"logprob\":-0.1,\"special\":false},\"generated_text\":null,\"details\":null}\n\n\
data:{\"index\":2,\"token\":{\"id\":2,\"text\":\"</s>\",\"special\":true},\"generated_text\":\"a\",\"details\":null}\n\n";

const OLLAMA_NDJSON: &str = "{\"model\":\"llama3\",\"created_at\":\"2025-01-01T00:00:00Z\",\"message\":{\"role\":\"assistant\",\"content\":\"Hi\"},\"done\":false}\n\
{\"model\":\"llama3\",\"created_at\":\"2025-01-01T00:00:00Z\",\"response\":\"\",\"thinking\":\"h\",\"done\":false}\n\
{\"model\":\"llama3\",\"created_at\":\"2025-01-01T00:00:01Z\",\"response\":\"\",\"done\":true,\"eval_count\":2}\n";

mod binary;

use binary::{cupti_wire, duration_slo, record_file, ring_record};

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let mut seeds = Seeds { root };
    http_head(&mut seeds);
    chunked(&mut seeds);
    sse(&mut seeds);
    shape(&mut seeds);
    gzip(&mut seeds);
    tls(&mut seeds);
    h2(&mut seeds);
    hpack(&mut seeds);
    stream(&mut seeds);
    ring_record(&mut seeds);
    record_file(&mut seeds);
    cupti_wire(&mut seeds);
    duration_slo(&mut seeds);
}

struct Seeds {
    root: PathBuf,
}

impl Seeds {
    fn put(&mut self, target: &str, name: &str, bytes: &[u8]) {
        let dir = self.root.join(target);
        std::fs::create_dir_all(&dir).expect("create the corpus folder");
        std::fs::write(dir.join(name), bytes).expect("write a seed");
    }

    /// A seed of I/Os for `tokenscope_fuzz::ios`: `mode` first when the target takes one.
    fn put_ios(
        &mut self,
        target: &str,
        name: &str,
        mode: Option<u8>,
        stream: &[u8],
        cuts: &[(usize, u8)],
    ) {
        let mut bytes: Vec<u8> = mode.into_iter().collect();
        bytes.extend(cut_prefix(stream.len(), cuts));
        bytes.extend_from_slice(stream);
        self.put(target, name, &bytes);
    }
}

/// `body` in HTTP/1.1 chunks of at most `size` bytes, then the last chunk.
fn chunk(body: &[u8], size: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for piece in body.chunks(size) {
        out.extend(format!("{:x}\r\n", piece.len()).bytes());
        out.extend_from_slice(piece);
        out.extend(b"\r\n");
    }
    out.extend(b"0\r\n\r\n");
    out
}

fn gzipped(bytes: &[u8]) -> Vec<u8> {
    let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(bytes).expect("gzip into memory");
    gz.finish().expect("gzip into memory")
}

fn http_head(s: &mut Seeds) {
    s.put("http_head", "openai_request", CHAT_REQUEST.as_bytes());
    s.put(
        "http_head",
        "anthropic_request",
        ANTHROPIC_REQUEST_HEAD.as_bytes(),
    );
    s.put("http_head", "sse_response", SSE_HEAD.as_bytes());
    s.put(
        "http_head",
        "gzip_response_cut",
        b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Type: text/event-stream\r\nVary: Accept-Enc",
    );
    s.put(
        "http_head",
        "get_with_query",
        b"GET /v1/models?key=SECRET HTTP/1.0\r\nHost: localhost:11434\r\nCookie: a=SECRET\r\n\r\n",
    );
    s.put(
        "http_head",
        "h2_fields",
        b":method\0POST\0:path\0/v1beta/models/gemini:streamGenerateContent?alt=sse\0:authority\0generativelanguage.googleapis.com\0x-goog-api-key\0SECRET\0content-type\0application/json\0",
    );
    s.put(
        "http_head",
        "h2_status",
        b":status\x00200\0content-type\0text/event-stream\0set-cookie\0SECRET\0",
    );
}

fn chunked(s: &mut Seeds) {
    let body = chunk(OPENAI_SSE.as_bytes(), 160);
    s.put_ios("chunked", "openai_sse", Some(0), &body, &[]);
    s.put_ios(
        "chunked",
        "openai_sse_cut",
        Some(0),
        &body,
        &[(3, 0), (100, 0), (171, 0), (300, 0)],
    );
    s.put_ios(
        "chunked",
        "extensions_and_trailer",
        Some(1),
        b"5;name=value\r\nhello\r\n7\r\n, world\r\n0\r\nX-Trailer: 1\r\n\r\n",
        &[(14, 0), (20, 0)],
    );
    s.put_ios(
        "chunked",
        "skipped_inside_data",
        Some(0),
        &body,
        &[(50, 40)],
    );
    s.put_ios(
        "chunked",
        "content_length",
        Some(2),
        b"0123456789",
        &[(4, 3)],
    );
}

fn sse(s: &mut Seeds) {
    let sse = OPENAI_SSE.as_bytes();
    s.put_ios("sse", "openai", Some(0), sse, &[]);
    s.put_ios(
        "sse",
        "openai_cut",
        Some(0),
        sse,
        &[(5, 0), (120, 0), (200, 0)],
    );
    s.put_ios(
        "sse",
        "anthropic_crlf",
        Some(0),
        ANTHROPIC_SSE.as_bytes(),
        &[(22, 0)],
    );
    s.put_ios("sse", "gemini", Some(0), GEMINI_SSE.as_bytes(), &[]);
    s.put_ios("sse", "responses", Some(0), RESPONSES_SSE.as_bytes(), &[]);
    s.put_ios("sse", "tgi", Some(0), TGI_SSE.as_bytes(), &[(40, 9)]);
    s.put_ios(
        "sse",
        "ollama_ndjson",
        Some(1),
        OLLAMA_NDJSON.as_bytes(),
        &[(60, 0)],
    );
}

fn shape(s: &mut Seeds) {
    let events = [
        (
            "openai_chat",
            r#"{"id":"c","object":"chat.completion.chunk","choices":[{"index":1,"delta":{"content":"x"}}]}"#,
        ),
        (
            "openai_tool",
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]}}]}"#,
        ),
        (
            "openai_completions",
            r#"{"object":"text_completion","choices":[{"index":0,"text":"x"},{"index":1,"text":"y"}]}"#,
        ),
        (
            "openai_usage",
            r#"{"object":"chat.completion.chunk","choices":[],"usage":{"completion_tokens":3}}"#,
        ),
        (
            "responses",
            r#"{"type":"response.reasoning_text.delta","delta":"hm","sequence_number":3}"#,
        ),
        (
            "anthropic",
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{"}}"#,
        ),
        (
            "anthropic_start",
            r#"{"type":"message_start","message":{"id":"m","content":[],"usage":{}}}"#,
        ),
        (
            "gemini",
            r#"{"candidates":[{"content":{"parts":[{"text":"h","thought":true}]},"finishReason":"STOP","index":2}],"usageMetadata":{}}"#,
        ),
        (
            "tgi",
            r#"{"index":9,"token":{"id":2,"text":"</s>","special":true},"generated_text":"a b","details":{}}"#,
        ),
        (
            "ollama_chat",
            r#"{"model":"m","message":{"role":"assistant","content":"","thinking":"h"},"done":false}"#,
        ),
        (
            "ollama_done",
            r#"{"model":"m","response":"","done":true,"eval_count":4}"#,
        ),
        ("done", " [DONE] "),
        (
            "escapes",
            r#"{"type":"ping\u0000","choices":null,"delta":"\ud83d\ude00"}"#,
        ),
    ];
    for (name, json) in events {
        s.put("shape", name, json.as_bytes());
    }
}

fn gzip(s: &mut Seeds) {
    let sse = gzipped(OPENAI_SSE.as_bytes());
    s.put_ios("gzip", "openai_sse", Some(0), &sse, &[]);
    s.put_ios("gzip", "openai_sse_cut", Some(0), &sse, &[(10, 0), (60, 0)]);
    s.put_ios(
        "gzip",
        "anthropic_sse_x_gzip",
        Some(2),
        &gzipped(ANTHROPIC_SSE.as_bytes()),
        &[],
    );
    s.put_ios(
        "gzip",
        "ollama_ndjson",
        Some(1),
        &gzipped(OLLAMA_NDJSON.as_bytes()),
        &[(30, 20)],
    );
}

/// A TLS record: type, version 0x0303, length, body.
fn tls_record(content_type: u8, body: &[u8]) -> Vec<u8> {
    let mut r = vec![content_type, 3, 3];
    r.extend((body.len() as u16).to_be_bytes());
    r.extend_from_slice(body);
    r
}

/// A handshake message: type, 24-bit length, body.
fn handshake(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut m = vec![kind];
    m.extend(&(body.len() as u32).to_be_bytes()[1..]);
    m.extend_from_slice(body);
    m
}

/// A ClientHello record as curl sends it to an API host (trimmed: SNI, ALPN h2).
fn client_hello() -> Vec<u8> {
    let mut hello = vec![3, 3];
    hello.extend([0x5a; 32]); // random
    hello.push(32);
    hello.extend([0xa5; 32]); // legacy session id
    hello.extend([0, 6, 0x13, 0x01, 0x13, 0x02, 0x13, 0x03]); // cipher suites
    hello.extend([1, 0]); // compression: null
    let host = b"api.openai.com";
    let mut sni = vec![0, 0];
    sni.extend(((host.len() + 5) as u16).to_be_bytes());
    sni.extend(((host.len() + 3) as u16).to_be_bytes());
    sni.push(0);
    sni.extend((host.len() as u16).to_be_bytes());
    sni.extend_from_slice(host);
    let alpn = [0, 0x10, 0, 5, 0, 3, 2, b'h', b'2'];
    let versions = [0, 0x2b, 0, 3, 2, 3, 4];
    let ext_len = sni.len() + alpn.len() + versions.len();
    hello.extend((ext_len as u16).to_be_bytes());
    hello.extend(sni);
    hello.extend(alpn);
    hello.extend(versions);
    let mut record = tls_record(22, &handshake(1, &hello));
    record[2] = 1; // record version 0x0301, as clients send their first
    record
}

fn tls(s: &mut Seeds) {
    s.put("tls", "client_hello", &client_hello());
    let mut server = tls_record(22, &handshake(2, &[3, 3, 7, 7, 7, 7]));
    server.extend(tls_record(20, &[1]));
    server.extend(tls_record(23, &[0xc3; 40]));
    server.extend(&tls_record(23, &[0x17; 300])[..20]); // cut by the capture
    s.put("tls", "server_flight", &server);
    s.put("tls", "alert", &tls_record(21, &[2, 40]));
    s.put("tls", "header_start", &[23, 3]);
}

/// An HTTP/2 frame.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    f.extend([kind, flags]);
    f.extend(stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// An HPACK string literal, Huffman-coded.
fn huffman(out: &mut Vec<u8>, s: &[u8]) {
    let mut coded = Vec::new();
    httlib_huffman::encode(s, &mut coded).expect("any bytes Huffman-code");
    let mut len = loona_hpack::encoder::encode_integer(coded.len(), 7);
    len[0] |= 0x80;
    out.extend(len);
    out.extend(coded);
}

/// A request header block: static indices, a Huffman literal inserted into the
/// table, a secret never indexed, and plain literals (loona-hpack's encoder).
fn request_block(path: &str) -> Vec<u8> {
    let mut block = vec![0x83, 0x87]; // :method POST, :scheme https
    block.push(0x44); // :path, incremental indexing, Huffman value
    huffman(&mut block, path.as_bytes());
    block.push(0x41); // :authority
    huffman(&mut block, b"api.openai.com");
    block.push(0x10); // never indexed, new name
    huffman(&mut block, b"authorization");
    huffman(&mut block, b"Bearer sk-SECRET");
    let mut plain = loona_hpack::Encoder::new();
    block.extend(plain.encode([
        (&b"content-type"[..], &b"application/json"[..]),
        (&b"accept"[..], &b"text/event-stream"[..]),
    ]));
    block
}

fn h2_client_stream() -> Vec<u8> {
    let mut c = collector::protocol::h2::PREFACE.to_vec();
    c.extend(frame(4, 0, 0, &[0, 3, 0, 0, 0, 100, 0, 4, 0, 0x60, 0, 0])); // SETTINGS
    c.extend(frame(8, 0, 0, &[0, 0x3f, 0, 1])); // WINDOW_UPDATE
    c.extend(frame(1, 0x4, 1, &request_block("/v1/chat/completions"))); // HEADERS, END_HEADERS
    c.extend(frame(0, 0x1, 1, br#"{"model":"gpt-4o","stream":true}"#)); // DATA, END_STREAM
                                                                        // The next request reuses the table: :path and :authority by dynamic index.
    let mut again = vec![0x83, 0x87, 0xbf, 0xbe];
    again.push(0x10);
    huffman(&mut again, b"authorization");
    huffman(&mut again, b"Bearer sk-SECRET");
    c.extend(frame(1, 0x5, 3, &again)); // HEADERS, END_HEADERS | END_STREAM
    c
}

fn h2_server_stream() -> Vec<u8> {
    let mut srv = frame(4, 0, 0, &[0, 3, 0, 0, 0, 128]); // SETTINGS
    srv.extend(frame(4, 1, 0, &[])); // SETTINGS ack
    let mut head = vec![0x88]; // :status 200
    let mut plain = loona_hpack::Encoder::new();
    head.extend(plain.encode([
        (&b"content-type"[..], &b"text/event-stream"[..]),
        (&b"set-cookie"[..], &b"SECRET"[..]),
    ]));
    // HEADERS split into HEADERS + CONTINUATION.
    let (a, b) = head.split_at(head.len() / 2);
    srv.extend(frame(1, 0, 1, a));
    srv.extend(frame(9, 0x4, 1, b));
    let sse = OPENAI_SSE.as_bytes();
    let (first, rest) = sse.split_at(130);
    // A padded DATA frame: pad length, data, padding.
    let mut padded = vec![4];
    padded.extend_from_slice(first);
    padded.extend([0; 4]);
    srv.extend(frame(0, 0x8, 1, &padded));
    srv.extend(frame(0, 0x1, 1, rest));
    srv.extend(frame(3, 0, 5, &[0, 0, 0, 8])); // RST_STREAM on another stream
    srv.extend(frame(6, 0, 0, &[1; 8])); // PING
    srv
}

fn h2(s: &mut Seeds) {
    let client = h2_client_stream();
    s.put_ios("h2", "client", Some(0), &client, &[]);
    s.put_ios(
        "h2",
        "client_cut",
        Some(0),
        &client,
        &[(10, 0), (40, 0), (90, 0)],
    );
    let server = h2_server_stream();
    s.put_ios("h2", "server", Some(1), &server, &[(60, 0)]);
    s.put_ios("h2", "server_skipped_data", Some(1), &server, &[(100, 64)]);
    // Joined part-way: DATA of an event stream, then a head that indexes the unknown table.
    let mut mid = frame(
        0,
        0,
        7,
        b"data: {\"choices\":[{\"index\":0,\"text\":\"x\"}]}\n\n",
    );
    mid.extend(frame(1, 0x5, 9, &[0x88, 0xc0, 0xbe]));
    s.put_ios("h2", "joined_mid", Some(2), &mid, &[]);
}

fn hpack(s: &mut Seeds) {
    let first = request_block("/v1/messages");
    let second = [0x83, 0x87, 0xbf, 0xbe, 0x3f, 0xe1, 0x1f]; // dynamic hits, then a size update
    let mut blocks = first.clone();
    blocks.extend_from_slice(&second);
    s.put_ios(
        "hpack",
        "request_then_reuse",
        Some(0),
        &blocks,
        &[(first.len(), 0)],
    );
    s.put_ios("hpack", "joined_mid", Some(1), &second, &[]);
    s.put_ios("hpack", "lost_block", Some(0), &blocks, &[(first.len(), 9)]);
}

fn stream(s: &mut Seeds) {
    let req = CHAT_REQUEST.as_bytes();
    s.put_ios("stream", "openai_request", None, req, &[(40, 0)]);
    let mut resp = SSE_HEAD.as_bytes().to_vec();
    resp.extend(chunk(OPENAI_SSE.as_bytes(), 170));
    s.put_ios(
        "stream",
        "openai_sse_response",
        None,
        &resp,
        &[(SSE_HEAD.len(), 0), (400, 0)],
    );
    s.put_ios(
        "stream",
        "sse_bytes_lost",
        None,
        &resp,
        &[(SSE_HEAD.len() + 40, 200)],
    );
    let mut anthropic = ANTHROPIC_REQUEST_HEAD.as_bytes().to_vec();
    anthropic.extend(chunk(
        br#"{"model":"claude","stream":true,"max_tokens":64}"#,
        20,
    ));
    s.put_ios("stream", "anthropic_chunked_request", None, &anthropic, &[]);
    let mut gz = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Encoding: gzip\r\nContent-Length: "
        .to_vec();
    let body = gzipped(GEMINI_SSE.as_bytes());
    gz.extend(format!("{}\r\n\r\n", body.len()).bytes());
    gz.extend(body);
    s.put_ios("stream", "gzip_gemini", None, &gz, &[]);
    let mut ollama = b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n\r\n".to_vec();
    ollama.extend(OLLAMA_NDJSON.as_bytes());
    s.put_ios("stream", "ollama_until_close", None, &ollama, &[]);
    let mut tls = client_hello();
    tls.extend(tls_record(23, &[0x33; 64]));
    s.put_ios("stream", "tls", None, &tls, &[(30, 0)]);
    s.put_ios(
        "stream",
        "h2_client",
        None,
        &h2_client_stream(),
        &[(2, 0), (30, 0)],
    );
    s.put_ios("stream", "h2_server", None, &h2_server_stream(), &[]);
}
