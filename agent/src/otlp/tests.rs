//! The exporter against a collector in the test: a TcpListener that reads each POST,
//! decodes its body with the same messages and answers as it is told (or never).

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use collector::stitch::{PointKind, Request};
use prost::Message;

use super::proto::{ExportTraceServiceRequest, Span, Value};
use super::*;

/// One POST the collector read.
struct Post {
    head: String,
    spans: Vec<Span>,
    service_name: Option<String>,
}

/// A collector on 127.0.0.1: each POST goes to `posts`, answered with the next status
/// of `answers` (200 when none is left); a black hole accepts and never answers.
struct TestCollector {
    port: u16,
    posts: Receiver<Post>,
    answers: Arc<Mutex<VecDeque<u16>>>,
}

impl TestCollector {
    fn start(listener: TcpListener, black_hole: bool) -> TestCollector {
        let port = listener.local_addr().expect("bound").port();
        let (tx, posts) = mpsc::channel();
        let answers: Arc<Mutex<VecDeque<u16>>> = Arc::default();
        let to_answer = Arc::clone(&answers);
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { return };
                if black_hole {
                    // Held open, never read or answered: the exporter waits out its timeout.
                    held.push(conn);
                    let _ = tx.send(Post {
                        head: String::new(),
                        spans: Vec::new(),
                        service_name: None,
                    });
                    continue;
                }
                let Some(post) = read_post(&mut conn) else {
                    continue;
                };
                let status = to_answer
                    .lock()
                    .expect("answers")
                    .pop_front()
                    .unwrap_or(200);
                let answer = format!(
                    "HTTP/1.1 {status} X\r\nRetry-After: 0\r\nContent-Length: 0\r\n\
                     Connection: close\r\n\r\n"
                );
                let _ = conn.write_all(answer.as_bytes());
                if tx.send(post).is_err() {
                    return;
                }
            }
        });
        TestCollector {
            port,
            posts,
            answers,
        }
    }

    fn up() -> TestCollector {
        TestCollector::start(TcpListener::bind("127.0.0.1:0").expect("bind"), false)
    }

    fn answer(&self, statuses: &[u16]) {
        self.answers.lock().expect("answers").extend(statuses);
    }

    /// The next POST, within 20 s.
    fn next(&self) -> Post {
        self.posts
            .recv_timeout(Duration::from_secs(20))
            .expect("the exporter posted within 20 s")
    }

    /// POSTs until `n` spans have arrived.
    fn spans(&self, n: usize) -> Vec<Post> {
        let mut posts = Vec::new();
        let mut got = 0;
        while got < n {
            let p = self.next();
            got += p.spans.len();
            posts.push(p);
        }
        assert_eq!(got, n, "exactly {n} spans arrived");
        posts
    }
}

fn read_post(conn: &mut TcpStream) -> Option<Post> {
    conn.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = conn.read(&mut chunk).ok().filter(|&n| n > 0)?;
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .and_then(|v| v.trim().parse().ok())?;
    while buf.len() < head_end + length {
        let n = conn.read(&mut chunk).ok().filter(|&n| n > 0)?;
        buf.extend_from_slice(&chunk[..n]);
    }
    let req = ExportTraceServiceRequest::decode(&buf[head_end..head_end + length])
        .expect("the body is an ExportTraceServiceRequest");
    let mut spans = Vec::new();
    let mut service_name = None;
    for rs in req.resource_spans {
        service_name = rs.resource.and_then(|r| {
            r.attributes
                .into_iter()
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| match kv.value?.value? {
                    Value::StringValue(s) => Some(s),
                    _ => None,
                })
        });
        for ss in rs.scope_spans {
            spans.extend(ss.spans);
        }
    }
    Some(Post {
        head,
        spans,
        service_name,
    })
}

fn config(port: u16) -> OtlpConfig {
    OtlpConfig {
        endpoint: format!("http://127.0.0.1:{port}"),
        queue_spans: 1000,
        batch_spans: 4,
        batch_delay: Duration::from_millis(20),
        timeout: Duration::from_secs(5),
        service_name: "tokenscope-test".into(),
        host_name: "test-host".into(),
    }
}

/// A request of two spans: its root and the client's point.
fn request(i: u64) -> Request {
    let t = 1_000_000_000 + i * 10_000_000;
    Request::at_point(
        i as usize,
        PointKind::ClientRead,
        1,
        "client",
        vec![t, t + 1_000_000],
    )
}

/// A port with nothing listening (bound once, then let go).
fn closed_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("bound").port()
}

/// Polls `stats` until `ready` (the exporter's counters have no event to wait on).
fn wait_for(x: &Exporter, what: &str, ready: impl Fn(&OtlpStats) -> bool) -> OtlpStats {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = x.stats();
        if ready(&s) {
            return s;
        }
        assert!(Instant::now() < deadline, "{what} within 20 s: {s:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn spans_go_out_in_batches_of_at_most_batch_spans_as_protobuf_posts() {
    let c = TestCollector::up();
    let x = Exporter::start(config(c.port)).expect("start");
    for i in 0..5 {
        x.export(&request(i));
    }
    let posts = c.spans(10);
    for p in &posts {
        assert!(
            p.head.starts_with("POST /v1/traces HTTP/1.1\r\n"),
            "{}",
            p.head
        );
        assert!(
            p.head.contains("Content-Type: application/x-protobuf\r\n"),
            "{}",
            p.head
        );
        assert!(p.spans.len() <= 4, "a batch holds at most batch_spans");
        assert_eq!(p.service_name.as_deref(), Some("tokenscope-test"));
    }
    let roots = posts
        .iter()
        .flat_map(|p| &p.spans)
        .filter(|s| s.parent_span_id.is_empty());
    assert_eq!(roots.count(), 5, "a root per request");
    let s = x.shutdown(Duration::from_secs(5));
    assert_eq!(
        s,
        OtlpStats {
            requests_exported: 5,
            spans_exported: 10,
            spans_dropped: 0,
            export_failures: 0,
        }
    );
}

#[test]
fn a_collector_that_is_down_then_up_gets_the_spans_once_it_is_back() {
    let port = closed_port();
    let x = Exporter::start(config(port)).expect("start");
    for i in 0..10 {
        x.export(&request(i));
    }
    let down = wait_for(&x, "retries against the closed port", |s| {
        s.export_failures >= 3
    });
    assert_eq!(down.spans_exported, 0);
    assert!(
        x.last_error()
            .is_some_and(|e| e.contains(&port.to_string())),
        "the last error names the endpoint: {:?}",
        x.last_error()
    );
    // Back on the same port: the batch kept through the retries arrives, then the rest.
    let c = TestCollector::start(
        TcpListener::bind(("127.0.0.1", port)).expect("the port is free again"),
        false,
    );
    c.spans(20);
    let s = x.shutdown(Duration::from_secs(5));
    assert_eq!(
        (s.spans_exported, s.spans_dropped, s.requests_exported),
        (20, 0, 10)
    );
    assert!(s.export_failures >= 3, "{s:?}");
}

#[test]
fn a_black_hole_collector_never_holds_up_export_and_the_queue_drops_past_its_bound() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let c = TestCollector::start(listener, true);
    let mut cfg = config(c.port);
    cfg.queue_spans = 10;
    cfg.timeout = Duration::from_secs(600);
    let x = Exporter::start(cfg).expect("start");
    x.export(&request(0));
    c.next(); // the thread is now stuck in that POST (until its 600 s timeout)
    for i in 1..50 {
        x.export(&request(i));
    }
    let s = x.stats();
    assert_eq!(
        s.spans_dropped,
        100 - 10 - 2,
        "all but the queue's 10 and the 2 in flight are dropped: {s:?}"
    );
    let began = Instant::now();
    let s = x.shutdown(Duration::from_millis(300));
    assert!(
        began.elapsed() < Duration::from_secs(60),
        "shutdown kept its deadline, not the request's 600 s timeout"
    );
    assert_eq!(
        (s.spans_exported, s.spans_dropped),
        (0, 100),
        "what was held at the deadline counts as dropped"
    );
}

#[test]
fn a_503_is_sent_again_and_a_400_is_dropped_without_retry() {
    let c = TestCollector::up();
    c.answer(&[503, 503]);
    let x = Exporter::start(config(c.port)).expect("start");
    x.export(&request(0));
    let tries: Vec<Post> = (0..3).map(|_| c.next()).collect();
    assert!(
        tries.iter().all(|p| p.spans == tries[0].spans),
        "the same batch each time"
    );
    let s = wait_for(&x, "the third try taken", |s| s.spans_exported == 2);
    assert_eq!(s.export_failures, 2);

    c.answer(&[400]);
    x.export(&request(1));
    assert_eq!(c.next().spans.len(), 2);
    wait_for(&x, "the refused batch dropped", |s| s.spans_dropped == 2);
    x.export(&request(2));
    let next = c.next();
    assert_eq!(
        next.spans[0].span_id.len(),
        8,
        "the next POST is the next request's, not the refused batch again"
    );
    assert_ne!(next.spans, tries[0].spans);
    let s = x.shutdown(Duration::from_secs(5));
    assert_eq!(
        s,
        OtlpStats {
            requests_exported: 2,
            spans_exported: 4,
            spans_dropped: 2,
            export_failures: 3,
        }
    );
}

#[test]
fn shutdown_sends_what_waits_without_waiting_out_the_batch_delay() {
    let c = TestCollector::up();
    let mut cfg = config(c.port);
    cfg.batch_delay = Duration::from_secs(3600);
    cfg.batch_spans = 100;
    let x = Exporter::start(cfg).expect("start");
    for i in 0..3 {
        x.export(&request(i));
    }
    let s = x.shutdown(Duration::from_secs(10));
    assert_eq!((s.spans_exported, s.requests_exported), (6, 3), "{s:?}");
    assert_eq!(c.spans(6).len(), 1, "one POST");
}

#[test]
fn shutdown_with_the_collector_down_gives_up_at_its_deadline_and_counts_the_rest() {
    let mut cfg = config(closed_port());
    cfg.batch_spans = 2;
    let x = Exporter::start(cfg).expect("start");
    for i in 0..5 {
        x.export(&request(i));
    }
    let s = x.shutdown(Duration::from_millis(300));
    assert_eq!((s.spans_exported, s.spans_dropped), (0, 10), "{s:?}");
    assert!(s.export_failures >= 1);
}

#[test]
fn start_refuses_https_and_empty_queues_in_one_line() {
    let mut cfg = config(4318);
    cfg.endpoint = "https://collector:4318".into();
    let e = Exporter::start(cfg.clone())
        .err()
        .expect("https refused")
        .to_string();
    assert!(e.contains("http"), "{e}");
    cfg.endpoint = "http://127.0.0.1:4318".into();
    cfg.queue_spans = 0;
    let e = Exporter::start(cfg)
        .err()
        .expect("an empty queue refused")
        .to_string();
    assert!(e.contains("at least 1"), "{e}");
}
