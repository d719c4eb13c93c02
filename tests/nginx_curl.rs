//! Privileged: real nginx (plain HTTP and TLS listeners) fetched by real curl.
//! The recording must show curl's connect, the TLS records from ClientHello to
//! the first application-data record, nginx's response writes with byte totals
//! equal to what curl downloaded, and no secret the client sent.

#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

use collector::ingest::model::{event::Body, sniff, Direction, Event};
use collector::protocol::tls::{APPLICATION_DATA, HANDSHAKE};
use test_support::*;

const BODY: &str = "tokenscope says hello from nginx; this body has a known size.";

fn location() -> String {
    format!("default_type text/plain; return 200 \"{BODY}\";")
}

#[test]
fn plain_http_connect_response_writes_and_byte_totals() {
    let dir = tempfile::tempdir().expect("tempdir");
    let nginx = Nginx::start(dir.path(), &location());
    let port = nginx.http_port;
    let rec = Recorder::start(dir.path(), &["--port", &port.to_string()]);
    let url = format!("http://127.0.0.1:{port}/v1/models");
    let (curl_pid, out) = curl(&[
        "-s",
        "-o",
        "/dev/null",
        "-w",
        "%{size_download} %{size_header} %{local_port}",
        &url,
    ]);
    let path = rec.path.clone();
    rec.stop();

    let mut f = out
        .split_whitespace()
        .map(|x| x.parse::<u64>().expect("curl -w number"));
    let (size_download, size_header, local_port) = (
        f.next().unwrap(),
        f.next().unwrap(),
        f.next().unwrap() as u16,
    );
    assert_eq!(size_download, BODY.len() as u64, "curl downloaded the body");
    let (header, events) = read_recording(&path);
    assert!(header.complete);

    let connect = events.iter().any(|e| {
        matches!(&e.body, Some(Body::State(s)) if e.pid == curl_pid && s.new().label() == "SYN_SENT"
            && s.sock.as_ref().is_some_and(|k| k.dport == u32::from(port)))
    });
    assert!(
        connect,
        "curl's connect (CLOSE -> SYN_SENT) attributed to curl's pid {curl_pid}"
    );
    let handshake = transitions(&events, local_port, port);
    assert!(
        handshake
            .iter()
            .any(|(o, n, _)| o == "SYN_SENT" && n == "ESTABLISHED"),
        "curl's handshake: {handshake:?}"
    );

    let workers = nginx.worker_pids();
    assert!(!workers.is_empty(), "nginx has a worker");
    let sent: u64 = workers
        .iter()
        .map(|w| io_bytes(&events, *w, Direction::Send, port))
        .sum();
    assert_eq!(
        sent,
        size_download + size_header,
        "nginx response bytes = curl's size_download + size_header"
    );
    assert_eq!(
        io_bytes(&events, curl_pid, Direction::Recv, local_port),
        sent,
        "curl received what nginx sent"
    );

    let writes: Vec<&Event> = events
        .iter()
        .filter(|e| {
            workers.contains(&e.pid) && e.io().is_some_and(|io| io.dir() == Direction::Send)
        })
        .collect();
    let first = writes
        .first()
        .expect("nginx wrote a response")
        .io()
        .unwrap();
    let Some(sniff::Kind::HttpResponse(h)) = first.sniff.as_ref().and_then(|s| s.kind.clone())
    else {
        panic!("nginx's first write starts with the response head: {first:?}")
    };
    assert_eq!(h.status, 200);
}

#[test]
fn tls_records_from_client_hello_to_first_application_data() {
    let dir = tempfile::tempdir().expect("tempdir");
    let nginx = Nginx::start(dir.path(), &location());
    let port = nginx.https_port;
    let rec = Recorder::start(dir.path(), &["--port", &port.to_string()]);
    let url = format!("https://127.0.0.1:{port}/");
    let (curl_pid, out) = curl(&["-sk", "-o", "/dev/null", "-w", "%{size_download}", &url]);
    let path = rec.path.clone();
    rec.stop();
    assert_eq!(out.trim(), BODY.len().to_string());
    let (_, events) = read_recording(&path);

    // (sender is curl, content type, handshake type) of every TLS record header seen, in time order.
    let mut seq: Vec<SeenRecord> = Vec::new();
    for e in &events {
        let Some(io) = e.io() else { continue };
        if io.dir() != Direction::Send {
            continue;
        }
        if let Some(sniff::Kind::Tls(t)) = io.sniff.as_ref().and_then(|s| s.kind.as_ref()) {
            for r in &t.records {
                seq.push((e.pid == curl_pid, r.content_type, r.handshake_type));
            }
        }
    }
    let pos = |pred: &dyn Fn(&SeenRecord) -> bool| seq.iter().position(pred);
    let hello = pos(&|r| r.0 && r.1 == HANDSHAKE && r.2 == Some(1))
        .unwrap_or_else(|| panic!("curl's ClientHello in {seq:?}"));
    let server_hello = pos(&|r| !r.0 && r.1 == HANDSHAKE && r.2 == Some(2))
        .unwrap_or_else(|| panic!("nginx's ServerHello in {seq:?}"));
    let client_app = pos(&|r| r.0 && r.1 == APPLICATION_DATA)
        .unwrap_or_else(|| panic!("curl's first application data in {seq:?}"));
    let server_app = seq
        .iter()
        .enumerate()
        .position(|(i, r)| i > client_app && !r.0 && r.1 == APPLICATION_DATA)
        .unwrap_or_else(|| panic!("nginx's application data after curl's: {seq:?}"));
    assert!(
        hello < server_hello && server_hello < client_app && client_app < server_app,
        "record order: {seq:?}"
    );
    let curl_connect = events.iter().any(|e| {
        e.pid == curl_pid
            && matches!(&e.body, Some(Body::State(s)) if s.new().label() == "SYN_SENT")
    });
    assert!(
        curl_connect,
        "curl's connect is recorded on the TLS port too"
    );
}

#[test]
fn request_line_is_shown_and_secrets_never_leave() {
    const AUTH: &str = "tok-SECRET-7f3a9c";
    const COOKIE: &str = "sid=COOKIE-SECRET-55aa";
    const PROMPT: &str = "PROMPT-SECRET-words-of-the-user";
    let dir = tempfile::tempdir().expect("tempdir");
    let nginx = Nginx::start(dir.path(), &location());
    let port = nginx.http_port;
    let rec = Recorder::start(dir.path(), &["--port", &port.to_string()]);
    let url = format!("http://127.0.0.1:{port}/v1/chat/completions?api_key=QUERY-SECRET");
    let auth = format!("Authorization: Bearer {AUTH}");
    let cookie = format!("Cookie: {COOKIE}");
    let body = format!(
        "{{\"messages\":[{{\"role\":\"user\",\"content\":\"{PROMPT}\"}}],\"stream\":true}}"
    );
    curl(&[
        "-s",
        "-o",
        "/dev/null",
        "-H",
        &auth,
        "-H",
        &cookie,
        "-H",
        "Content-Type: application/json",
        "--data",
        &body,
        &url,
    ]);
    let path = rec.path.clone();
    rec.stop();

    // Every output of the recording: dump, report (text and JSON, diagnoses
    // included) and the Perfetto trace.
    let text =
        assert_no_secrets_in_outputs(&path, dir.path(), &[AUTH, COOKIE, PROMPT, "QUERY-SECRET"]);
    assert!(
        text.contains("http POST /v1/chat/completions?… HTTP/1.1"),
        "the request line is in the dump:\n{text}"
    );
    assert!(
        text.contains("authorization=<redacted>"),
        "the header name is kept, its value redacted:\n{text}"
    );
}

/// (sent by curl, TLS content type, handshake message type)
type SeenRecord = (bool, u32, Option<u32>);
