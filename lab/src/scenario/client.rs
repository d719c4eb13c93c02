//! A plain HTTP/1.1 streaming client for the scenarios: one keep-alive connection, one
//! request at a time, every token timed at the read that completed it. It sets no TCP
//! option but an optional receive buffer (no TCP_NODELAY, no TCP_QUICKACK): how the
//! kernel acknowledges what it reads is part of what the scenarios measure.
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use crate::bench::{SseEvent, SseParser};
use collector::clock::monotonic_ns;

/// How a client reads.
#[derive(Debug, Clone)]
pub(crate) struct ClientOptions {
    /// SO_RCVBUF, set before connect so the window is small from the handshake on (the
    /// kernel doubles it); None keeps autotuning.
    pub recv_buffer: Option<u32>,
    /// Bytes asked for per read.
    pub read_size: usize,
    /// Pause after every read: a client that renders or forwards slowly.
    pub pause_per_read: Duration,
}

impl ClientOptions {
    /// Reads whatever has arrived, at once.
    pub(super) fn prompt_reader() -> Self {
        ClientOptions {
            recv_buffer: None,
            read_size: 64 << 10,
            pause_per_read: Duration::ZERO,
        }
    }
}

/// One streamed completion as the client read it.
#[derive(Debug, Clone)]
pub(crate) struct ReadStream {
    pub response_id: String,
    pub local_port: u16,
    /// CLOCK_MONOTONIC ns of the read that completed each token event.
    pub token_read_ns: Vec<u64>,
}

/// A connection to the engine, reused for request after request.
pub(crate) struct StreamClient {
    stream: TcpStream,
    host: String,
    opts: ClientOptions,
    local_port: u16,
}

impl StreamClient {
    pub(super) async fn connect(addr: SocketAddr, opts: ClientOptions) -> io::Result<StreamClient> {
        let socket = if addr.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        if let Some(bytes) = opts.recv_buffer {
            socket.set_recv_buffer_size(bytes)?;
        }
        let stream = socket.connect(addr).await?;
        let local_port = stream.local_addr()?.port();
        Ok(StreamClient {
            stream,
            host: addr.to_string(),
            opts,
            local_port,
        })
    }

    /// POSTs a streamed /v1/completions request and reads the response to its end.
    pub(super) async fn complete(
        &mut self,
        prompt: &str,
        max_tokens: usize,
    ) -> Result<ReadStream, String> {
        let body = serde_json::json!({
            "model": "lab-model",
            "prompt": prompt,
            "max_tokens": max_tokens,
            "stream": true,
        })
        .to_string();
        let request = format!(
            "POST /v1/completions HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\n\
             accept: text/event-stream\r\ncontent-length: {}\r\n\r\n{body}",
            self.host,
            body.len()
        );
        // One write: the request itself must not wait on Nagle.
        self.stream
            .write_all(request.as_bytes())
            .await
            .map_err(|e| format!("send request: {e}"))?;
        let mut response = ResponseReader::default();
        let mut read_buf = vec![0u8; self.opts.read_size.max(1)];
        let mut out = ReadStream {
            response_id: String::new(),
            local_port: self.local_port,
            token_read_ns: Vec::new(),
        };
        while !response.finished() {
            let n = self
                .stream
                .read(&mut read_buf)
                .await
                .map_err(|e| format!("read: {e}"))?;
            let t = monotonic_ns();
            if n == 0 {
                return Err("the engine closed the connection mid-response".into());
            }
            for event in response.push(&read_buf[..n])? {
                if let SseEvent::Data { content, id, .. } = event {
                    if out.response_id.is_empty() {
                        out.response_id = id.unwrap_or_default();
                    }
                    if content {
                        out.token_read_ns.push(t);
                    }
                }
            }
            if !self.opts.pause_per_read.is_zero() {
                tokio::time::sleep(self.opts.pause_per_read).await;
            }
        }
        if out.response_id.is_empty() {
            return Err("the stream carried no response id".into());
        }
        Ok(out)
    }
}

/// Response head, then chunked body, then SSE events.
#[derive(Default)]
struct ResponseReader {
    head: Vec<u8>,
    head_done: bool,
    body: ChunkedDecoder,
    sse: SseParser,
}

impl ResponseReader {
    fn finished(&self) -> bool {
        self.body.done()
    }

    fn push(&mut self, bytes: &[u8]) -> Result<Vec<SseEvent>, String> {
        let after_head: Vec<u8>;
        let body = if self.head_done {
            bytes
        } else {
            self.head.extend_from_slice(bytes);
            let Some(end) = self.head.windows(4).position(|w| w == b"\r\n\r\n") else {
                return Ok(Vec::new());
            };
            let head = String::from_utf8_lossy(&self.head[..end]).to_ascii_lowercase();
            let status = head.split_whitespace().nth(1).unwrap_or("");
            if status != "200" {
                return Err(format!("the engine answered HTTP {status}"));
            }
            if !head.contains("transfer-encoding: chunked") {
                return Err("the stream is not chunked".into());
            }
            self.head_done = true;
            after_head = self.head.split_off(end + 4);
            &after_head
        };
        let mut decoded = Vec::new();
        self.body.push(body, &mut decoded)?;
        Ok(self.sse.push(&decoded))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum ChunkState {
    #[default]
    Size,
    Data(usize),
    DataEnd,
    Trailer,
    Done,
}

/// HTTP/1.1 chunked transfer coding, across any read boundary.
#[derive(Debug, Default)]
struct ChunkedDecoder {
    state: ChunkState,
    pending: Vec<u8>,
}

impl ChunkedDecoder {
    fn done(&self) -> bool {
        self.state == ChunkState::Done
    }

    fn push(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
        self.pending.extend_from_slice(input);
        let mut pos = 0;
        loop {
            let avail = &self.pending[pos..];
            match self.state {
                ChunkState::Size | ChunkState::Trailer => {
                    let Some(eol) = avail.windows(2).position(|w| w == b"\r\n") else {
                        break;
                    };
                    let line = &avail[..eol];
                    pos += eol + 2;
                    if self.state == ChunkState::Trailer {
                        if line.is_empty() {
                            self.state = ChunkState::Done;
                        }
                        continue;
                    }
                    let hex = line.split(|b| *b == b';').next().unwrap_or(line);
                    let size = std::str::from_utf8(hex)
                        .ok()
                        .and_then(|h| usize::from_str_radix(h.trim(), 16).ok())
                        .ok_or("bad chunk size line")?;
                    self.state = if size == 0 {
                        ChunkState::Trailer
                    } else {
                        ChunkState::Data(size)
                    };
                }
                ChunkState::Data(left) => {
                    if avail.is_empty() {
                        break;
                    }
                    let take = left.min(avail.len());
                    out.extend_from_slice(&avail[..take]);
                    pos += take;
                    self.state = if take == left {
                        ChunkState::DataEnd
                    } else {
                        ChunkState::Data(left - take)
                    };
                }
                ChunkState::DataEnd => {
                    if avail.len() < 2 {
                        break;
                    }
                    if &avail[..2] != b"\r\n" {
                        return Err("chunk without its closing CRLF".into());
                    }
                    pos += 2;
                    self.state = ChunkState::Size;
                }
                ChunkState::Done => break,
            }
        }
        self.pending.drain(..pos);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_body_decodes_across_every_split() {
        let wire = b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\n";
        for cut in 0..=wire.len() {
            let mut d = ChunkedDecoder::default();
            let mut out = Vec::new();
            d.push(&wire[..cut], &mut out).expect("valid prefix");
            d.push(&wire[cut..], &mut out).expect("valid rest");
            assert_eq!(out, b"hello world", "body decoded with a cut at {cut}");
            assert!(d.done(), "terminator seen with a cut at {cut}");
        }
        let mut d = ChunkedDecoder::default();
        assert!(
            d.push(b"3\r\nabcX\r\n", &mut Vec::new()).is_err(),
            "a chunk longer than its size is malformed"
        );
    }

    #[test]
    fn response_reader_yields_events_after_the_head() {
        let mut r = ResponseReader::default();
        let events = r
            .push(
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n\
                  20\r\ndata: {\"id\":\"c1\",\"choices\":[]}\n\n\r\n",
            )
            .expect("valid response");
        assert_eq!(events.len(), 1, "one event in the first chunk");
        let events = r.push(b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n").unwrap();
        assert_eq!(events, vec![SseEvent::Done], "then [DONE]");
        assert!(r.finished(), "body ended");
        let mut r = ResponseReader::default();
        assert!(
            r.push(b"HTTP/1.1 503 Service Unavailable\r\n\r\n").is_err(),
            "a non-200 answer is an error"
        );
    }
}
