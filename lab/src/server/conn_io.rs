//! The accepted socket as the server writes to it: its TCP options, and optionally each
//! HTTP chunk in two writes (the lab's Nagle set-up).
use std::io;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::engine::EngineConfig;

/// Applies the engine's socket options to an accepted connection.
pub(crate) fn configure(stream: &TcpStream, cfg: &EngineConfig) {
    // Best effort, as servers do: a refused option leaves the kernel default.
    let _ = stream.set_nodelay(cfg.tcp_nodelay);
    if let Some(bytes) = cfg.send_buffer_bytes {
        let _ = set_send_buffer(stream, bytes);
    }
}

fn set_send_buffer(stream: &TcpStream, bytes: usize) -> io::Result<()> {
    let value = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    // SAFETY: the descriptor is owned by `stream` and open; the option value is a c_int of
    // the length passed.
    let rc = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The connection hyper serves. With `split_chunks`, a write that ends an HTTP chunk goes
/// out as two write(2) calls: everything up to the chunk's closing CRLF, then the CRLF.
pub(crate) struct ConnIo {
    stream: TcpStream,
    split_chunks: bool,
    /// When a read last returned bytes (CLOCK_MONOTONIC ns; 0: none yet).
    last_read_ns: Arc<AtomicU64>,
}

impl ConnIo {
    pub(crate) fn new(stream: TcpStream, split_chunks: bool) -> Self {
        ConnIo {
            stream,
            split_chunks,
            last_read_ns: Arc::default(),
        }
    }

    /// The time of the last read that returned bytes, shared with the connection's
    /// handler: when a request's head is handed over, the read that brought it (its bytes
    /// come in one burst) is the last one, where the handler itself may run later on a
    /// busy runtime.
    pub(crate) fn last_read(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.last_read_ns)
    }
}

/// The part of `buf` to write now: all of it, or all but a closing CRLF.
fn first_write(buf: &[u8], split_chunks: bool) -> &[u8] {
    if split_chunks && buf.len() > 2 && buf.ends_with(b"\r\n") {
        &buf[..buf.len() - 2]
    } else {
        buf
    }
}

impl AsyncRead for ConnIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.stream).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.last_read_ns
                .store(collector::clock::monotonic_ns(), Ordering::Relaxed);
        }
        polled
    }
}

impl AsyncWrite for ConnIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        // hyper writes the rest (the CRLF) in its next call: a second write(2).
        let now = first_write(buf, this.split_chunks);
        Pin::new(&mut this.stream).poll_write(cx, now)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        // Splitting needs one contiguous buffer per flush: hyper then flattens its queue.
        !self.split_chunks && self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::first_write;

    #[test]
    fn a_chunk_is_written_without_its_closing_crlf_first() {
        let chunk = b"7\r\ndata: x\r\n";
        assert_eq!(first_write(chunk, true), b"7\r\ndata: x", "CRLF held back");
        assert_eq!(
            first_write(b"\r\n", true),
            b"\r\n",
            "the CRLF alone goes whole"
        );
        assert_eq!(first_write(chunk, false), chunk, "no split when off");
        assert_eq!(
            first_write(b"{}", true),
            b"{}",
            "bodies without CRLF go whole"
        );
    }
}
