//! Real nginx in front of the engine, in two set-ups: `untuned` (what a default gateway
//! does to a token stream) and `tuned` (what fixes it). Configs are written to a temp dir,
//! nginx runs as its own master process on a free port and stops on drop.
use std::fmt;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use thiserror::Error;

use crate::server::AUTH_PATH;

#[derive(Debug, Error)]
pub enum ProxyError {
    #[error("cannot prepare the nginx directory: {0}")]
    Dir(std::io::Error),
    #[error("cannot find a free port: {0}")]
    Port(std::io::Error),
    #[error("cannot run {program}: {source} (install the Debian packages nginx and openssl)")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("openssl could not make the self-signed certificate: {0}")]
    Cert(String),
    #[error("nginx did not start: {0}")]
    Start(String),
}

/// Which gateway set-up to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyMode {
    /// TLS + HTTP/2 to clients, keep-alive both sides, HTTP/1.1 upstream, no buffering,
    /// no gzip.
    Tuned,
    /// Plain HTTP, Connection: close to clients, HTTP/1.0 upstream with buffering on,
    /// gzip on for text/event-stream, and an auth_request hop to a slow endpoint.
    Untuned,
    /// Tuned, but plain HTTP/1.1 to clients: keep-alive both sides, no buffering, no
    /// gzip. What a profiler sees in the clear end to end (used by tokenscope's tests).
    TunedPlain,
    /// Untuned, with TLS (HTTP/1.1) on the client hop: every request pays a TCP and a
    /// TLS handshake.
    UntunedTls,
}

impl ProxyMode {
    /// Clients reach nginx over TLS.
    pub fn client_tls(self) -> bool {
        matches!(self, ProxyMode::Tuned | ProxyMode::UntunedTls)
    }
}

impl fmt::Display for ProxyMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ProxyMode::Tuned => "tuned",
            ProxyMode::Untuned => "untuned",
            ProxyMode::TunedPlain => "tuned-plain",
            ProxyMode::UntunedTls => "untuned-tls",
        })
    }
}

/// How to start a proxy.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    pub mode: ProxyMode,
    /// The engine (or any OpenAI server) nginx forwards to.
    pub upstream: SocketAddr,
    /// Where nginx listens; None picks a free port on 127.0.0.1.
    pub listen: Option<SocketAddr>,
    /// The nginx binary.
    pub nginx: PathBuf,
    /// Route the untuned gateway's auth_request calls on the upstream.
    pub auth_path: String,
    /// Untuned with one of its causes fixed (each diagnosis's fix measured alone).
    pub fix: Option<OneFix>,
}

/// One of the seed article's five fixes, applied alone to the untuned set-up: nginx's
/// three (`ProxyConfig::fix`), the engine's two (`DemoConfig::fix`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OneFix {
    /// Keep-alive to clients (rule 1; the engine hop stays HTTP/1.0).
    KeepAlive,
    /// `proxy_buffering off` (rule 2).
    NoBuffering,
    /// Event streams left out of `gzip_types` (rule 3).
    NoGzip,
    /// The engine's prefix cache on (rule 4).
    PrefixCache,
    /// The engine's chunked prefill on (rule 5).
    ChunkedPrefill,
}

impl ProxyConfig {
    pub fn new(mode: ProxyMode, upstream: SocketAddr) -> Self {
        ProxyConfig {
            mode,
            upstream,
            listen: None,
            nginx: PathBuf::from("nginx"),
            auth_path: AUTH_PATH.to_string(),
            fix: None,
        }
    }
}

/// A running nginx; stopped (and its directory removed) on drop.
pub struct NginxProxy {
    child: Child,
    dir: tempfile::TempDir,
    addr: SocketAddr,
    mode: ProxyMode,
}

fn free_port() -> Result<u16, ProxyError> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(ProxyError::Port)?;
    Ok(l.local_addr().map_err(ProxyError::Port)?.port())
}

/// Settings both set-ups share: paths inside the temp dir, one worker, quiet logs.
fn preamble(dir: &Path) -> String {
    let d = dir.display();
    format!(
        "# written by tokenscope lab\n\
         user root;\n\
         daemon off;\n\
         master_process on;\n\
         worker_processes 1;\n\
         pid {d}/nginx.pid;\n\
         error_log {d}/error.log warn;\n\
         events {{ worker_connections 8192; }}\n"
    )
}

fn temp_paths(dir: &Path) -> String {
    let d = dir.display();
    format!(
        "    access_log off;\n\
         \x20   client_body_temp_path {d}/tmp/body;\n\
         \x20   proxy_temp_path {d}/tmp/proxy;\n\
         \x20   fastcgi_temp_path {d}/tmp/fastcgi;\n\
         \x20   uwsgi_temp_path {d}/tmp/uwsgi;\n\
         \x20   scgi_temp_path {d}/tmp/scgi;\n\
         \x20   client_max_body_size 16m;\n"
    )
}

/// nginx.conf for a mode.
pub fn render_config(cfg: &ProxyConfig, dir: &Path, listen: SocketAddr) -> String {
    let up = cfg.upstream;
    let d = dir.display();
    let mut c = preamble(dir);
    c.push_str("http {\n");
    c.push_str(&temp_paths(dir));
    let tls_lines = format!(
        "ssl_certificate {d}/cert.pem;\n\
         \x20       ssl_certificate_key {d}/key.pem;\n\
         \x20       ssl_protocols TLSv1.2 TLSv1.3;"
    );
    match cfg.mode {
        ProxyMode::Untuned | ProxyMode::UntunedTls => {
            let listen_line = if cfg.mode == ProxyMode::UntunedTls {
                format!("listen {listen} ssl;\n\x20       {tls_lines}")
            } else {
                format!("listen {listen};")
            };
            let fix = cfg.fix;
            // Keep-alive to clients only: HTTP/1.1 upstream (what keep-alive to the engine
            // needs) would also end the buffered hold, which is rule 2's to remove.
            let client_keepalive = if fix == Some(OneFix::KeepAlive) {
                "keepalive_timeout 300s;"
            } else {
                "keepalive_timeout 0;"
            };
            let buffering = if fix == Some(OneFix::NoBuffering) {
                "off"
            } else {
                "on"
            };
            let gzip_types = if fix == Some(OneFix::NoGzip) {
                "application/json"
            } else {
                "text/event-stream application/json"
            };
            c.push_str(&format!(
                "    # No keep-alive to clients: every request pays a new connection.\n\
                 \x20   {client_keepalive}\n\
                 \x20   # Compressing a token stream makes nginx hold it until a gzip block fills.\n\
                 \x20   gzip on;\n\
                 \x20   gzip_proxied any;\n\
                 \x20   gzip_types {gzip_types};\n\
                 \x20   upstream engine {{ server {up}; }}\n\
                 \x20   server {{\n\
                 \x20       {listen_line}\n\
                 \x20       location / {{\n\
                 \x20           # The gateway checks every request with an auth service first.\n\
                 \x20           auth_request /_gateway_auth;\n\
                 \x20           # nginx's defaults: HTTP/1.0 upstream (close-delimited), buffering on.\n\
                 \x20           proxy_http_version 1.0;\n\
                 \x20           proxy_buffering {buffering};\n\
                 \x20           proxy_read_timeout 300s;\n\
                 \x20           proxy_pass http://engine;\n\
                 \x20       }}\n\
                 \x20       location = /_gateway_auth {{\n\
                 \x20           internal;\n\
                 \x20           proxy_pass_request_body off;\n\
                 \x20           proxy_set_header Content-Length \"\";\n\
                 \x20           proxy_pass http://engine{auth};\n\
                 \x20       }}\n\
                 \x20   }}\n",
                auth = cfg.auth_path
            ));
        }
        ProxyMode::Tuned | ProxyMode::TunedPlain => {
            let listen_line = if cfg.mode == ProxyMode::Tuned {
                format!(
                    "listen {listen} ssl http2;\n\
                     \x20       {tls_lines}\n\
                     \x20       ssl_session_cache shared:lab:1m;"
                )
            } else {
                format!("listen {listen};")
            };
            c.push_str(&format!(
                "    # Keep client connections (and their TLS sessions) for many requests.\n\
                 \x20   keepalive_timeout 300s;\n\
                 \x20   keepalive_requests 100000;\n\
                 \x20   gzip off;\n\
                 \x20   tcp_nodelay on;\n\
                 \x20   upstream engine {{\n\
                 \x20       server {up};\n\
                 \x20       keepalive 64;\n\
                 \x20       keepalive_requests 100000;\n\
                 \x20   }}\n\
                 \x20   server {{\n\
                 \x20       {listen_line}\n\
                 \x20       location / {{\n\
                 \x20           # HTTP/1.1 upstream with keep-alive; every token forwarded as it comes.\n\
                 \x20           proxy_http_version 1.1;\n\
                 \x20           proxy_set_header Connection \"\";\n\
                 \x20           proxy_buffering off;\n\
                 \x20           proxy_cache off;\n\
                 \x20           proxy_read_timeout 300s;\n\
                 \x20           proxy_pass http://engine;\n\
                 \x20       }}\n\
                 \x20   }}\n"
            ));
        }
    }
    c.push_str("}\n");
    c
}

fn make_cert(dir: &Path) -> Result<(), ProxyError> {
    let out = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ])
        .args(["-nodes", "-days", "30", "-subj", "/CN=localhost"])
        .args(["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"])
        .arg("-keyout")
        .arg(dir.join("key.pem"))
        .arg("-out")
        .arg(dir.join("cert.pem"))
        .stdin(Stdio::null())
        .output()
        .map_err(|source| ProxyError::Spawn {
            program: "openssl".into(),
            source,
        })?;
    if !out.status.success() {
        return Err(ProxyError::Cert(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ));
    }
    Ok(())
}

impl NginxProxy {
    /// Writes the config, starts nginx and waits until it accepts connections.
    pub async fn start(cfg: ProxyConfig) -> Result<NginxProxy, ProxyError> {
        tokio::task::spawn_blocking(move || Self::start_blocking(cfg))
            .await
            .map_err(|e| ProxyError::Start(e.to_string()))?
    }

    /// Blocking form of `start`, for callers outside a runtime.
    pub fn start_blocking(cfg: ProxyConfig) -> Result<NginxProxy, ProxyError> {
        let dir = tempfile::Builder::new()
            .prefix("tokenscope-lab-nginx-")
            .tempdir()
            .map_err(ProxyError::Dir)?;
        for sub in ["tmp", "logs"] {
            std::fs::create_dir_all(dir.path().join(sub)).map_err(ProxyError::Dir)?;
        }
        if cfg.mode.client_tls() {
            make_cert(dir.path())?;
        }
        let listen = match cfg.listen {
            Some(a) => a,
            None => SocketAddr::from(([127, 0, 0, 1], free_port()?)),
        };
        let conf = dir.path().join("nginx.conf");
        std::fs::write(&conf, render_config(&cfg, dir.path(), listen)).map_err(ProxyError::Dir)?;
        let mut child = Command::new(&cfg.nginx)
            .arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(&conf)
            .arg("-e")
            .arg(dir.path().join("error.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| ProxyError::Spawn {
                program: cfg.nginx.display().to_string(),
                source,
            })?;
        // nginx writes its pid file once its sockets are bound; then the listener must answer
        // (a connect alone could reach some other process on a port we did not get).
        let pid_file = dir.path().join("nginx.pid");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    use std::io::Read;
                    let _ = e.read_to_string(&mut err);
                }
                let log = std::fs::read_to_string(dir.path().join("error.log")).unwrap_or_default();
                let why = if err.trim().is_empty() { log } else { err };
                return Err(ProxyError::Start(format!(
                    "exited with {status}: {}",
                    why.trim()
                )));
            }
            if pid_file.exists()
                && TcpStream::connect_timeout(&listen, Duration::from_millis(200)).is_ok()
            {
                break;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(ProxyError::Start(format!(
                    "no listener on {listen} after 10 s"
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(NginxProxy {
            child,
            dir,
            addr: listen,
            mode: cfg.mode,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn mode(&self) -> ProxyMode {
        self.mode
    }

    /// Base URL clients use: https where the client hop has TLS.
    pub fn url(&self) -> String {
        let scheme = if self.mode.client_tls() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.addr)
    }

    /// nginx's master process id (the workers are its children).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The directory holding nginx.conf, the certificate and error.log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The current error.log (for test failure messages).
    pub fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }

    fn stop(&mut self) {
        // SIGTERM is nginx's fast shutdown: workers close connections and exit.
        // SAFETY: signalling our own child by pid.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for NginxProxy {
    fn drop(&mut self) {
        self.stop();
    }
}
