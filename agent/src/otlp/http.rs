//! OTLP/HTTP: one POST of a protobuf body over a fresh TCP connection, plain http only.
//! TLS is the local OpenTelemetry Collector's job (it forwards wherever it is told to);
//! the agent stays small and does no certificate handling of its own.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use prost::Message;

use super::proto::ExportTraceServiceResponse;

/// Where export requests go, from `http://HOST[:PORT][/PATH]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Endpoint {
    /// As the `Host` header says it (`[v6]:port` for IPv6).
    authority: String,
    /// For resolving (no brackets).
    host: String,
    port: u16,
    path: String,
}

/// OTLP/HTTP's path for traces, when the URL gives none.
const TRACES_PATH: &str = "/v1/traces";

/// A response is read up to this much: the agent wants its status, its Retry-After and
/// a partial-success message, never a large body.
const MAX_RESPONSE_BYTES: usize = 64 * 1024;

/// The longest Retry-After honoured; a longer one waits this long instead, so that a
/// misconfigured collector cannot park the exporter for hours.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(30);

impl Endpoint {
    pub(crate) fn parse(url: &str) -> anyhow::Result<Endpoint> {
        let bad = |why: &str| anyhow::anyhow!("OTLP endpoint `{url}`: {why}");
        let Some((scheme, rest)) = url.split_once("://") else {
            return Err(bad(
                "not a URL; expected http://HOST:PORT (e.g. http://127.0.0.1:4318)",
            ));
        };
        if scheme.eq_ignore_ascii_case("https") {
            return Err(bad(
                "https is not supported; point it at a local OpenTelemetry Collector over http \
                 (e.g. http://127.0.0.1:4318), which can forward over TLS",
            ));
        }
        if !scheme.eq_ignore_ascii_case("http") {
            return Err(bad("only http:// is supported (OTLP/HTTP with protobuf)"));
        }
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        if authority.contains('@') {
            // Not echoed: the URL holds a secret.
            anyhow::bail!("OTLP endpoint: credentials in the URL are not supported");
        }
        let path = match path.split('#').next().unwrap_or("") {
            "" | "/" => TRACES_PATH,
            p => p,
        };
        if path.bytes().any(|b| b.is_ascii_control() || b == b' ') {
            return Err(bad("the path holds spaces or control characters"));
        }
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (h, tail) = v6
                .split_once(']')
                .ok_or_else(|| bad("unclosed [ in the host"))?;
            (h, tail.strip_prefix(':'))
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (authority, None),
            }
        };
        if host.is_empty() || host.bytes().any(|b| b.is_ascii_control() || b == b' ') {
            return Err(bad("no host"));
        }
        let port = match port {
            None => 80,
            Some(p) => p
                .parse::<u16>()
                .ok()
                .filter(|&p| p != 0)
                .ok_or_else(|| bad(&format!("`{p}` is not a port")))?,
        };
        let authority = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        Ok(Endpoint {
            authority,
            host: host.to_string(),
            port,
            path: path.to_string(),
        })
    }

    /// `http://authority/path`, for messages.
    pub(crate) fn url(&self) -> String {
        format!("http://{}{}", self.authority, self.path)
    }
}

/// What became of one export request.
#[derive(Debug, PartialEq)]
pub(crate) enum Outcome {
    /// 2xx; `rejected`: spans the collector said it dropped (partial success).
    Accepted { rejected: u64 },
    /// Worth sending again: no connection, a timeout, 429, 502, 503 or 504.
    Retry {
        after: Option<Duration>,
        why: String,
    },
    /// Not worth sending again (any other status): the batch is dropped.
    Refused { why: String },
}

/// POSTs `body` (an encoded ExportTraceServiceRequest), all within `timeout`.
pub(crate) fn post(ep: &Endpoint, body: &[u8], timeout: Duration) -> Outcome {
    let deadline = Instant::now() + timeout;
    let retry = |why: String| Outcome::Retry { after: None, why };
    let mut stream = match connect(ep, deadline) {
        Ok(s) => s,
        Err(e) => return retry(format!("connect {}: {e}", ep.authority)),
    };
    let head = format!(
        "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/x-protobuf\r\n\
         Content-Length: {}\r\nUser-Agent: tokenscope/{}\r\nConnection: close\r\n\r\n",
        ep.path,
        ep.authority,
        body.len(),
        env!("CARGO_PKG_VERSION"),
    );
    let sent = left(deadline)
        .and_then(|t| stream.set_write_timeout(Some(t)))
        .and_then(|()| stream.write_all(head.as_bytes()))
        .and_then(|()| stream.write_all(body));
    if let Err(e) = sent {
        return retry(format!("sending to {}: {e}", ep.url()));
    }
    let response = match read_response(&mut stream, deadline) {
        Ok(r) => r,
        Err(e) => return retry(format!("reading the response of {}: {e}", ep.url())),
    };
    classify(ep, &response)
}

fn left(deadline: Instant) -> std::io::Result<Duration> {
    let d = deadline.saturating_duration_since(Instant::now());
    if d.is_zero() {
        return Err(std::io::ErrorKind::TimedOut.into());
    }
    Ok(d)
}

fn connect(ep: &Endpoint, deadline: Instant) -> std::io::Result<TcpStream> {
    let addrs: Vec<SocketAddr> = (ep.host.as_str(), ep.port).to_socket_addrs()?.collect();
    let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "no address");
    for a in addrs {
        match TcpStream::connect_timeout(&a, left(deadline)?) {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

struct Response {
    status: u16,
    retry_after: Option<Duration>,
    body: Vec<u8>,
}

/// Reads the status line, headers and (up to `MAX_RESPONSE_BYTES`) the body.
fn read_response(stream: &mut TcpStream, deadline: Instant) -> std::io::Result<Response> {
    let invalid =
        |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > MAX_RESPONSE_BYTES {
            return Err(invalid("response headers over 64 KiB"));
        }
        stream.set_read_timeout(Some(left(deadline)?))?;
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Err(invalid("connection closed before a full response head"));
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .filter(|_| status_line.starts_with("HTTP/"))
        .ok_or_else(|| invalid("not an HTTP response"))?;
    let mut length = None;
    let mut retry_after = None;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            length = value.parse::<usize>().ok();
        } else if name.eq_ignore_ascii_case("retry-after") {
            // Seconds only; an HTTP-date falls back to the exporter's own back-off.
            retry_after = value.parse::<u64>().ok().map(Duration::from_secs);
        }
    }
    let mut body = buf.split_off(head_end);
    // Without a Content-Length (chunked, or a server that holds the connection) the body
    // is not waited for: the status says what matters, the body only a partial success.
    let want = length.unwrap_or(0).min(MAX_RESPONSE_BYTES);
    while body.len() < want {
        // A body the agent cannot finish reading does not undo the status it got.
        let Ok(t) = left(deadline) else { break };
        if stream.set_read_timeout(Some(t)).is_err() {
            break;
        }
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => body.extend_from_slice(&chunk[..n]),
        }
    }
    body.truncate(want);
    Ok(Response {
        status,
        retry_after,
        body,
    })
}

/// The OTLP/HTTP rules: 2xx accepted (maybe partially); 429, 502, 503 and 504 are
/// retryable, honouring Retry-After; anything else is final.
fn classify(ep: &Endpoint, r: &Response) -> Outcome {
    match r.status {
        200..=299 => {
            let rejected = ExportTraceServiceResponse::decode(r.body.as_slice())
                .ok()
                .and_then(|m| m.partial_success)
                .map_or(0, |p| u64::try_from(p.rejected_spans).unwrap_or(0));
            Outcome::Accepted { rejected }
        }
        429 | 502 | 503 | 504 => Outcome::Retry {
            after: r.retry_after.map(|d| d.min(MAX_RETRY_AFTER)),
            why: format!("{} answered {}", ep.url(), r.status),
        },
        s => Outcome::Refused {
            why: format!("{} answered {s}; the batch is dropped", ep.url()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_without_a_path_posts_to_v1_traces() {
        let ep = Endpoint::parse("http://127.0.0.1:4318").expect("valid");
        assert_eq!(ep.url(), "http://127.0.0.1:4318/v1/traces");
        let ep = Endpoint::parse("http://collector:4318/").expect("valid");
        assert_eq!(ep.url(), "http://collector:4318/v1/traces");
        let ep = Endpoint::parse("http://[::1]:4318/otlp/v1/traces").expect("valid");
        assert_eq!((ep.host.as_str(), ep.port), ("::1", 4318));
        assert_eq!(ep.url(), "http://[::1]:4318/otlp/v1/traces");
        let ep = Endpoint::parse("HTTP://otel").expect("valid");
        assert_eq!(ep.url(), "http://otel:80/v1/traces", "http's own port");
    }

    #[test]
    fn a_response_without_content_length_is_not_waited_out() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("bound").port();
        let (done, held) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().expect("accept");
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            let _ = conn.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
            // The connection stays open, the body never ends, until the test is done.
            let _ = held.recv();
        });
        let ep = Endpoint::parse(&format!("http://127.0.0.1:{port}")).expect("valid");
        let began = Instant::now();
        let outcome = post(&ep, b"", Duration::from_secs(600));
        assert_eq!(outcome, Outcome::Accepted { rejected: 0 });
        assert!(
            began.elapsed() < Duration::from_secs(60),
            "the status was enough; the request's 600 s timeout was not waited out"
        );
        let _ = done.send(());
    }

    #[test]
    fn a_partial_success_counts_its_rejected_spans() {
        let body = ExportTraceServiceResponse {
            partial_success: Some(super::super::proto::ExportTracePartialSuccess {
                rejected_spans: 3,
                error_message: "too old".into(),
            }),
        }
        .encode_to_vec();
        let ep = Endpoint::parse("http://127.0.0.1:4318").expect("valid");
        let ok = Response {
            status: 200,
            retry_after: None,
            body,
        };
        assert_eq!(classify(&ep, &ok), Outcome::Accepted { rejected: 3 });
        let busy = Response {
            status: 429,
            retry_after: Some(Duration::from_secs(3600)),
            body: Vec::new(),
        };
        assert_eq!(
            classify(&ep, &busy),
            Outcome::Retry {
                after: Some(MAX_RETRY_AFTER),
                why: "http://127.0.0.1:4318/v1/traces answered 429".into()
            },
            "a long Retry-After is capped"
        );
        let gone = Response {
            status: 404,
            ..busy
        };
        assert!(matches!(classify(&ep, &gone), Outcome::Refused { .. }));
    }

    #[test]
    fn https_and_malformed_urls_get_one_line_that_says_what_to_do() {
        let https = Endpoint::parse("https://otel.example.com:4318")
            .unwrap_err()
            .to_string();
        assert!(
            https.contains("local OpenTelemetry Collector over http"),
            "says to point it at a local collector: {https}"
        );
        for (url, says) in [
            ("127.0.0.1:4318", "not a URL"),
            ("grpc://127.0.0.1:4317", "only http://"),
            ("http://:4318", "no host"),
            ("http://127.0.0.1:port", "not a port"),
            ("http://127.0.0.1:0", "not a port"),
            ("http://user:pw@127.0.0.1:4318", "credentials"),
        ] {
            let e = Endpoint::parse(url).unwrap_err().to_string();
            assert!(e.contains(says) && !e.contains('\n'), "{url}: {e}");
        }
    }
}
