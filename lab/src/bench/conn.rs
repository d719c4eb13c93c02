//! One client connection, timed by hand: TCP connect, TLS handshake (ALPN h2/http1.1),
//! and every socket read, so the bench can say which read carried which SSE event.
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use super::BenchError;
use collector::clock::monotonic_ns;

/// Where and how to connect.
#[derive(Debug, Clone)]
pub struct Target {
    pub host: String,
    pub port: u16,
    pub tls: bool,
    pub http2: bool,
    pub insecure: bool,
}

/// Socket-level facts shared between the connection task and the request loop.
#[derive(Debug, Default)]
pub struct IoStats {
    /// Reads that returned data, ever (a read index names one of them).
    pub reads: AtomicU64,
    pub last_read_ns: AtomicU64,
    armed: AtomicBool,
    first_read_after_arm_ns: AtomicU64,
    write_armed: AtomicBool,
    first_write_after_arm_ns: AtomicU64,
    first_write_done_ns: AtomicU64,
}

impl IoStats {
    /// Marks a request start: the next read is its response's first byte.
    pub fn arm(&self) {
        self.first_read_after_arm_ns.store(0, Ordering::Relaxed);
        self.armed.store(true, Ordering::Release);
        self.first_write_after_arm_ns.store(0, Ordering::Relaxed);
        self.first_write_done_ns.store(0, Ordering::Relaxed);
        self.write_armed.store(true, Ordering::Release);
    }

    /// When the request's first byte was written: hyper writes from its connection
    /// task, which may run a while after the request was handed over.
    pub fn first_write_after_arm(&self) -> Option<u64> {
        match self.first_write_after_arm_ns.load(Ordering::Acquire) {
            0 => None,
            t => Some(t),
        }
    }

    /// When that first write returned: the byte left between the two stamps (a
    /// preemption between the first stamp and the syscall widens the gap, not the error).
    pub fn first_write_done(&self) -> Option<u64> {
        match self.first_write_done_ns.load(Ordering::Acquire) {
            0 => None,
            t => Some(t),
        }
    }

    /// `started`: taken just before the write, so the stamp never follows the peer's read.
    fn wrote(&self, result: &Poll<io::Result<usize>>, started: u64) {
        if matches!(result, Poll::Ready(Ok(n)) if *n > 0)
            && self.write_armed.swap(false, Ordering::AcqRel)
        {
            self.first_write_done_ns
                .store(monotonic_ns(), Ordering::Release);
            self.first_write_after_arm_ns
                .store(started, Ordering::Release);
        }
    }

    pub fn first_read_after_arm(&self) -> Option<u64> {
        match self.first_read_after_arm_ns.load(Ordering::Acquire) {
            0 => None,
            t => Some(t),
        }
    }
}

/// Wraps the socket (plain or TLS) and timestamps every read that returns data.
pub struct CountingIo<T> {
    inner: T,
    stats: Arc<IoStats>,
}

impl<T: AsyncRead + Unpin> AsyncRead for CountingIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            if buf.filled().len() > before {
                let now = monotonic_ns();
                self.stats.last_read_ns.store(now, Ordering::Release);
                self.stats.reads.fetch_add(1, Ordering::AcqRel);
                if self.stats.armed.swap(false, Ordering::AcqRel) {
                    self.stats
                        .first_read_after_arm_ns
                        .store(now, Ordering::Release);
                }
            }
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for CountingIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let started = monotonic_ns();
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.stats.wrote(&r, started);
        r
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let started = monotonic_ns();
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.stats.wrote(&r, started);
        r
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

enum Sender {
    Http1(http1::SendRequest<Full<Bytes>>),
    Http2(http2::SendRequest<Full<Bytes>>),
}

/// An open connection and when its set-up happened.
pub struct Connection {
    sender: Sender,
    pub stats: Arc<IoStats>,
    pub connect_start_ns: u64,
    pub connect_done_ns: u64,
    pub tls_done_ns: Option<u64>,
    pub http2: bool,
    /// This end's port: what a profiler sees as the client's socket.
    pub local_port: u16,
}

/// Accepts any server certificate: for the lab's self-signed nginx (--insecure).
#[derive(Debug)]
struct AcceptAnyCert(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AcceptAnyCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Builds the TLS client configuration once per bench run.
pub fn tls_connector(target: &Target) -> Result<TlsConnector, BenchError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| BenchError::Tls(e.to_string()))?;
    let mut config = if target.insecure {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAnyCert(provider)))
            .with_no_client_auth()
    } else {
        let roots = rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        builder.with_root_certificates(roots).with_no_client_auth()
    };
    config.alpn_protocols = if target.http2 {
        vec![b"h2".to_vec()]
    } else {
        vec![b"http/1.1".to_vec()]
    };
    Ok(TlsConnector::from(Arc::new(config)))
}

/// Opens a connection, timing connect and TLS, and starts hyper on it.
pub async fn connect(
    target: &Target,
    tls: Option<&TlsConnector>,
) -> Result<Connection, BenchError> {
    let connect_start_ns = monotonic_ns();
    let tcp = TcpStream::connect((target.host.as_str(), target.port))
        .await
        .map_err(|e| BenchError::Connect(format!("{}:{}: {e}", target.host, target.port)))?;
    let connect_done_ns = monotonic_ns();
    let _ = tcp.set_nodelay(true);
    let local_port = tcp.local_addr().map_or(0, |a| a.port());
    let stats = Arc::new(IoStats::default());
    match (target.tls, tls) {
        (true, Some(connector)) => {
            let name = ServerName::try_from(target.host.clone())
                .map_err(|e| BenchError::Tls(format!("server name {}: {e}", target.host)))?;
            let stream = connector
                .connect(name, tcp)
                .await
                .map_err(|e| BenchError::Tls(e.to_string()))?;
            let tls_done_ns = monotonic_ns();
            let alpn_h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
            if target.http2 && !alpn_h2 {
                return Err(BenchError::Tls(
                    "server did not negotiate h2 via ALPN".into(),
                ));
            }
            let io = CountingIo {
                inner: stream,
                stats: stats.clone(),
            };
            let sender = handshake(io, target.http2).await?;
            Ok(Connection {
                sender,
                stats,
                connect_start_ns,
                connect_done_ns,
                tls_done_ns: Some(tls_done_ns),
                http2: target.http2,
                local_port,
            })
        }
        _ => {
            let io = CountingIo {
                inner: tcp,
                stats: stats.clone(),
            };
            // Cleartext --http2 speaks h2 with prior knowledge (h2c).
            let sender = handshake(io, target.http2).await?;
            Ok(Connection {
                sender,
                stats,
                connect_start_ns,
                connect_done_ns,
                tls_done_ns: None,
                http2: target.http2,
                local_port,
            })
        }
    }
}

async fn handshake<T>(io: CountingIo<T>, http2: bool) -> Result<Sender, BenchError>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let io = TokioIo::new(io);
    if http2 {
        let (sender, conn) = http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .handshake(io)
            .await
            .map_err(|e| BenchError::Http(e.to_string()))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Sender::Http2(sender))
    } else {
        let (sender, conn) = http1::handshake(io)
            .await
            .map_err(|e| BenchError::Http(e.to_string()))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Sender::Http1(sender))
    }
}

impl Connection {
    pub async fn send(
        &mut self,
        req: Request<Full<Bytes>>,
    ) -> Result<Response<Incoming>, BenchError> {
        let r = match &mut self.sender {
            Sender::Http1(s) => {
                s.ready()
                    .await
                    .map_err(|e| BenchError::Http(e.to_string()))?;
                s.send_request(req).await
            }
            Sender::Http2(s) => {
                s.ready()
                    .await
                    .map_err(|e| BenchError::Http(e.to_string()))?;
                s.send_request(req).await
            }
        };
        r.map_err(|e| BenchError::Http(e.to_string()))
    }

    /// Waits until the connection can take another request; false when the server closed
    /// it (Connection: close, GOAWAY) so the next request must open a new one.
    pub async fn reusable(&mut self) -> bool {
        match &mut self.sender {
            Sender::Http1(s) => s.ready().await.is_ok(),
            Sender::Http2(s) => s.ready().await.is_ok(),
        }
    }
}
