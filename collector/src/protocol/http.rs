//! HTTP/1.x request and response heads, redacted as they are parsed: header
//! names are kept, values only for an allow-list of framing headers, and the
//! request target loses its query string. Authorization, Cookie and every
//! other value never get past this module.

use crate::ingest::model::{sniff, CompactString, Header, HttpRequestHead, HttpResponseHead};

/// Headers whose values describe framing or routing, never secrets or content.
const VALUE_ALLOWED: &[&str] = &[
    "host",
    "content-type",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "content-encoding",
    "accept-encoding",
    "x-accel-buffering",
    "upgrade",
    "server",
    "cache-control",
    "te",
    "accept",
];
const MAX_HEADERS: usize = 64;
const MAX_METHOD_LEN: usize = 16;

/// A request head at the start of `payload` (`METHOD target HTTP/1.x`), or `None`.
pub fn parse_request_head(payload: &[u8]) -> Option<HttpRequestHead> {
    let (line, rest) = split_line(payload)?;
    let mut parts = line.splitn(3, |b| *b == b' ');
    let method = parts.next()?;
    let target = parts.next()?;
    let version = parts.next()?;
    let method_ok = !method.is_empty()
        && method.len() <= MAX_METHOD_LEN
        && method.iter().all(u8::is_ascii_uppercase);
    if !method_ok || !version.starts_with(b"HTTP/") || target.is_empty() {
        return None;
    }
    let (path, query) = match target.iter().position(|b| *b == b'?') {
        Some(q) => (&target[..q], true),
        None => (target, false),
    };
    let (headers, complete) = parse_headers(rest);
    Some(HttpRequestHead {
        method: text(method),
        path: text(path),
        has_query: query,
        version: text(version),
        headers,
        complete,
    })
}

/// A response head at the start of `payload` (`HTTP/1.x NNN reason`), or `None`.
pub fn parse_response_head(payload: &[u8]) -> Option<HttpResponseHead> {
    let (line, rest) = split_line(payload)?;
    let mut parts = line.splitn(3, |b| *b == b' ');
    let version = parts.next()?;
    let status = parts.next()?;
    if !version.starts_with(b"HTTP/") || status.len() != 3 || !status.iter().all(u8::is_ascii_digit)
    {
        return None;
    }
    let status = std::str::from_utf8(status).ok()?.parse().ok()?;
    let (headers, complete) = parse_headers(rest);
    Some(HttpResponseHead {
        version: text(version),
        status,
        headers,
        complete,
    })
}

/// Whether `b` could be the start of an HTTP/1.x head (possibly cut short):
/// `HTTP/` or an upper-case method followed by a space.
pub fn starts_like_head(b: &[u8]) -> bool {
    let token = b.iter().take_while(|c| c.is_ascii_uppercase()).count();
    if b.starts_with(b"HTTP/") {
        return true;
    }
    token > 0 && token <= MAX_METHOD_LEN && (token == b.len() || b[token] == b' ')
}

/// The first CRLF-terminated line and what follows it.
fn split_line(buf: &[u8]) -> Option<(&[u8], &[u8])> {
    let end = buf.windows(2).position(|w| w == b"\r\n")?;
    Some((&buf[..end], &buf[end + 2..]))
}

/// Header lines up to the blank line; `complete` says whether it was reached.
/// A line cut off by the end of the prefix is dropped.
fn parse_headers(mut buf: &[u8]) -> (Vec<Header>, bool) {
    let mut headers = Vec::new();
    while let Some((line, rest)) = split_line(buf) {
        if line.is_empty() {
            return (headers, true);
        }
        buf = rest;
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            continue;
        };
        if headers.len() >= MAX_HEADERS {
            continue;
        }
        if let Some(h) = redacted(&line[..colon], line[colon + 1..].trim_ascii()) {
            headers.push(h);
        }
    }
    (headers, false)
}

/// A header as a sniff may hold it: its lower-case name, and its value only when
/// the name is allow-listed. `None` when the name is not an HTTP token.
pub fn redacted(name: &[u8], value: &[u8]) -> Option<Header> {
    if name.is_empty() || !name.iter().all(is_token_char) {
        return None;
    }
    // A token is ASCII: the name is as it was written, lower-cased in place.
    let mut name = CompactString::from_utf8_lossy(name);
    name.make_ascii_lowercase();
    let value = if name == "traceparent" {
        trace_parent(value.trim_ascii()).map(CompactString::from)
    } else {
        VALUE_ALLOWED
            .contains(&name.as_str())
            .then(|| CompactString::from_utf8_lossy(value.trim_ascii()))
    };
    Some(Header { name, value })
}

/// A W3C `traceparent` value (`00-<32 hex trace id>-<16 hex parent id>-<2 hex
/// flags>`), lower-cased; anything else is dropped (only ids cross, never text).
fn trace_parent(value: &[u8]) -> Option<String> {
    let hex = |b: &[u8]| !b.is_empty() && b.iter().all(u8::is_ascii_hexdigit);
    let parts: Vec<&[u8]> = value.split(|b| *b == b'-').collect();
    let shape = [2, 32, 16, 2];
    let ok = parts.len() == 4
        && parts.iter().zip(shape).all(|(p, n)| p.len() == n && hex(p))
        && parts[1].iter().any(|b| *b != b'0')
        && parts[2].iter().any(|b| *b != b'0')
        && !parts[0].eq_ignore_ascii_case(b"ff");
    ok.then(|| String::from_utf8_lossy(value).to_ascii_lowercase())
}

/// An HTTP/2 header block's fields as a head, redacted as an HTTP/1 head is: a
/// request when it has `:method`, a response when it has `:status`, else `None`
/// (trailers, or a block whose pseudo-headers went unread). `:authority` is
/// reported as a `host` header.
pub fn h2_head(fields: &[(Vec<u8>, Vec<u8>)], complete: bool) -> Option<sniff::Kind> {
    let pseudo = |name: &[u8]| {
        fields
            .iter()
            .find(|(n, _)| n.as_slice() == name)
            .map(|(_, v)| v.as_slice())
    };
    let mut headers = Vec::new();
    for (name, value) in fields {
        if headers.len() >= MAX_HEADERS {
            break;
        }
        let header = match name.as_slice() {
            b":authority" => redacted(b"host", value),
            n if n.starts_with(b":") => None,
            n => redacted(n, value),
        };
        headers.extend(header);
    }
    if let Some(method) = pseudo(b":method") {
        let target = pseudo(b":path").unwrap_or_default();
        let (path, has_query) = match target.iter().position(|b| *b == b'?') {
            Some(q) => (&target[..q], true),
            None => (target, false),
        };
        let method_ok = !method.is_empty() && method.len() <= MAX_METHOD_LEN;
        return Some(sniff::Kind::HttpRequest(Box::new(HttpRequestHead {
            method: if method_ok {
                text(method)
            } else {
                CompactString::default()
            },
            path: text(path),
            has_query,
            version: "HTTP/2".into(),
            headers,
            complete,
        })));
    }
    let status = pseudo(b":status")?;
    let status = std::str::from_utf8(status).ok()?.parse().ok()?;
    Some(sniff::Kind::HttpResponse(Box::new(HttpResponseHead {
        version: "HTTP/2".into(),
        status,
        headers,
        complete,
    })))
}

fn is_token_char(b: &u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(b)
}

/// A head's text, inline up to 24 bytes (see `HttpRequestHead`).
fn text(b: &[u8]) -> CompactString {
    CompactString::from_utf8_lossy(b)
}

/// The value of header `name` (lower-case), when it was kept.
pub fn header<'a>(headers: &'a [Header], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|h| h.name == name)
        .and_then(|h| h.value.as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;

    const REQ: &[u8] = b"POST /v1/chat/completions?api_key=sk-123 HTTP/1.1\r\nHost: localhost:8080\r\n\
Authorization: Bearer sk-secret-token\r\nCookie: session=abcdef\r\nContent-Type: application/json\r\n\
Content-Length: 42\r\n\r\n{\"messages\":[{\"content\":\"my prompt\"}]}";

    #[test]
    fn request_head_keeps_routing_and_drops_secrets() {
        let h = parse_request_head(REQ).expect("a request head");
        assert_eq!(
            (h.method.as_str(), h.path.as_str(), h.version.as_str()),
            ("POST", "/v1/chat/completions", "HTTP/1.1")
        );
        assert!(h.has_query && h.complete);
        assert_eq!(header(&h.headers, "host"), Some("localhost:8080"));
        let traced = parse_request_head(
            b"GET /e HTTP/1.1\r\ntraceparent: 00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01\r\n\r\n",
        )
        .unwrap();
        assert_eq!(
            header(&traced.headers, "traceparent"),
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        );
        for bad in [
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-secretsecretsecretsecretsecret12-00f067aa0ba902b7-01",
        ] {
            let head = parse_request_head(
                format!("GET /e HTTP/1.1\r\ntraceparent: {bad}\r\n\r\n").as_bytes(),
            )
            .unwrap();
            assert_eq!(header(&head.headers, "traceparent"), None, "{bad}");
        }
        assert_eq!(header(&h.headers, "content-length"), Some("42"));
        let auth = h
            .headers
            .iter()
            .find(|x| x.name == "authorization")
            .expect("the name is kept");
        assert_eq!(auth.value, None, "Authorization value must be dropped");
        let debug = format!("{h:?}");
        for secret in ["sk-secret-token", "session=abcdef", "sk-123", "my prompt"] {
            assert!(
                !debug.contains(secret),
                "{secret} leaked into the parsed head"
            );
        }
    }

    #[test]
    fn cut_prefix_keeps_whole_lines_only() {
        let cut = &REQ[..70];
        let h = parse_request_head(cut).expect("the request line is inside the cut");
        assert!(!h.complete, "the blank line was not reached");
        assert!(
            h.headers.iter().all(|x| x.name == "host"),
            "only fully captured lines: {:?}",
            h.headers
        );
        assert_eq!(
            parse_request_head(b"POST /v1/chat"),
            None,
            "no CRLF yet: not a head"
        );
    }

    #[test]
    fn response_head() {
        let h = parse_response_head(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\ndata: x")
            .expect("a response head");
        assert_eq!(h.status, 200);
        assert_eq!(header(&h.headers, "transfer-encoding"), Some("chunked"));
        assert!(h.complete);
        assert_eq!(parse_response_head(b"HTTP/1.1 2x0 OK\r\n"), None);
        assert_eq!(parse_response_head(b"data: HTTP/1.1 200\r\n"), None);
    }

    #[test]
    fn garbage_is_not_a_head() {
        assert_eq!(parse_request_head(b"\x00\x01\x02 \xff HTTP/1.1\r\n"), None);
        assert_eq!(
            parse_request_head(b"get / HTTP/1.1\r\n"),
            None,
            "methods are upper-case tokens"
        );
        assert_eq!(parse_request_head(b"\r\n"), None);
    }
}
