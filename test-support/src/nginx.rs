//! Real nginx from the system on free ports, curl, and the lab engine behind nginx.

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::recorder::wait_timeout;

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// `N` distinct free ports: each is held until all are picked (ports picked one after
/// another may repeat, since a port let go is free again at once).
pub fn free_ports<const N: usize>() -> [u16; N] {
    let held: [TcpListener; N] =
        std::array::from_fn(|_| TcpListener::bind("127.0.0.1:0").expect("bind"));
    held.map(|l| l.local_addr().expect("addr").port())
}

/// Waits until something accepts connections on `port`.
pub fn wait_for_port(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "nothing listens on port {port} after 20 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A real nginx from the system, with its own prefix directory, on free ports.
pub struct Nginx {
    child: Child,
    pub dir: PathBuf,
    pub http_port: u16,
    pub https_port: u16,
    /// TLS with HTTP/2 offered by ALPN.
    pub h2_port: u16,
    /// Cleartext HTTP/2 with prior knowledge (h2c).
    pub h2c_port: u16,
}

impl Nginx {
    /// Serves `location_body` (nginx directives) on four listeners: plain HTTP/1.1,
    /// TLS (HTTP/1.1), TLS with HTTP/2, and cleartext HTTP/2 (prior knowledge).
    pub fn start(dir: &Path, location_body: &str) -> Nginx {
        // A free port is free when asked, not when nginx binds it: an outgoing
        // connection of another test may take it meanwhile (same ephemeral range). Then
        // nginx exits with "Address already in use", and other ports are tried.
        for attempt in 1.. {
            match Nginx::try_start(dir, location_body) {
                Ok(nginx) => return nginx,
                Err(why) if attempt < 4 && why.contains("Address already in use") => {
                    eprintln!("nginx attempt {attempt}: {why}; trying other ports");
                }
                Err(why) => panic!("nginx did not start: {why}"),
            }
        }
        unreachable!("the loop returns or panics")
    }

    fn try_start(dir: &Path, location_body: &str) -> Result<Nginx, String> {
        let [http_port, https_port, h2_port, h2c_port] = free_ports();
        let cert = dir.join("cert.pem");
        let key = dir.join("key.pem");
        let status = Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-subj",
                "/CN=localhost",
                "-keyout",
            ])
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("run openssl (installed by cargo xtask setup)");
        assert!(
            status.success(),
            "openssl could not make a self-signed certificate"
        );
        std::fs::create_dir_all(dir.join("logs")).expect("logs dir");
        let conf = format!(
            "worker_processes 1;\nerror_log {dir}/logs/error.log;\npid {dir}/nginx.pid;\n\
events {{ worker_connections 64; }}\n\
http {{\n  access_log off;\n  client_body_temp_path {dir}/body;\n  proxy_temp_path {dir}/proxy;\n\
  fastcgi_temp_path {dir}/fcgi;\n  uwsgi_temp_path {dir}/uwsgi;\n  scgi_temp_path {dir}/scgi;\n\
  server {{\n    listen 127.0.0.1:{http_port};\n    listen 127.0.0.1:{https_port} ssl;\n\
    listen 127.0.0.1:{h2_port} ssl http2;\n    listen 127.0.0.1:{h2c_port} http2;\n\
    ssl_certificate {cert};\n    ssl_certificate_key {key};\n    location / {{ {location_body} }}\n  }}\n}}\n",
            dir = dir.display(),
            cert = cert.display(),
            key = key.display(),
        );
        let conf_path = dir.join("nginx.conf");
        std::fs::write(&conf_path, conf).expect("write nginx.conf");
        let child = Command::new(nginx_binary())
            .arg("-p")
            .arg(dir)
            .arg("-c")
            .arg(&conf_path)
            .args(["-g", "daemon off; master_process on;"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start nginx (installed by cargo xtask setup)");
        let mut nginx = Nginx {
            child,
            dir: dir.to_path_buf(),
            http_port,
            https_port,
            h2_port,
            h2c_port,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        for port in [http_port, https_port, h2_port, h2c_port] {
            while TcpStream::connect(("127.0.0.1", port)).is_err() {
                if let Some(status) = nginx.child.try_wait().expect("try_wait") {
                    let mut stderr = String::new();
                    if let Some(mut e) = nginx.child.stderr.take() {
                        let _ = e.read_to_string(&mut stderr);
                    }
                    return Err(format!(
                        "exited with {status}: {stderr}{}",
                        nginx.error_log()
                    ));
                }
                if Instant::now() > deadline {
                    return Err(format!(
                        "nothing listens on port {port} after 20 s: {}",
                        nginx.error_log()
                    ));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(nginx)
    }

    pub fn master_pid(&self) -> u32 {
        self.child.id()
    }

    /// Pids of the worker processes (children of the master).
    pub fn worker_pids(&self) -> Vec<u32> {
        let master = self.master_pid();
        std::fs::read_dir("/proc")
            .expect("read /proc")
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .ok()
                    .and_then(|s| {
                        s.rsplit(')')
                            .next()?
                            .split_whitespace()
                            .nth(1)?
                            .parse::<u32>()
                            .ok()
                    })
                    == Some(master)
            })
            .collect()
    }

    pub fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("logs/error.log")).unwrap_or_default()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        if !matches!(self.child.try_wait(), Ok(None)) {
            return; // already gone (and reaped: its pid may be another's now)
        }
        // SAFETY: SIGQUIT asks the nginx master (still our unreaped child) to stop.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGQUIT) };
        if wait_timeout(&mut self.child, Duration::from_secs(10)).is_none() {
            let _ = self.child.kill();
        }
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
    }
}

fn nginx_binary() -> &'static str {
    [
        "/usr/sbin/nginx",
        "/usr/local/sbin/nginx",
        "/usr/local/nginx/sbin/nginx",
    ]
    .into_iter()
    .find(|p| Path::new(p).exists())
    .unwrap_or("nginx")
}

/// Runs curl and returns (pid, stdout).
pub fn curl(args: &[&str]) -> (u32, String) {
    let child = Command::new("curl")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run curl");
    let pid = child.id();
    let out = child.wait_with_output().expect("curl output");
    assert!(
        out.status.success(),
        "curl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (pid, String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The lab engine (on a runtime the caller keeps) behind real nginx on its four
/// listeners, proxying with HTTP/1.1 keep-alive upstream and no buffering.
pub fn engine_behind_nginx(dir: &Path) -> (tokio::runtime::Runtime, tokenscope_lab::Engine, Nginx) {
    engine_behind_nginx_with(dir, "")
}

/// The runtime the lab's engine and bench run on in a test: two workers, as the
/// machines have two cores.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// The lab engine with `cfg` on a free loopback port, served by `rt`.
pub fn lab_engine(
    rt: &tokio::runtime::Runtime,
    cfg: tokenscope_lab::EngineConfig,
) -> tokenscope_lab::Engine {
    rt.block_on(tokenscope_lab::Engine::start(
        cfg,
        "127.0.0.1:0".parse().unwrap(),
    ))
    .expect("lab engine")
}

/// `engine_behind_nginx` with more directives in its location (e.g. a nested
/// location that serves something else).
pub fn engine_behind_nginx_with(
    dir: &Path,
    extra: &str,
) -> (tokio::runtime::Runtime, tokenscope_lab::Engine, Nginx) {
    let rt = runtime();
    let engine = lab_engine(&rt, tokenscope_lab::EngineConfig::default());
    let up = engine.addr();
    let nginx = Nginx::start(
        dir,
        &format!(
            "proxy_pass http://{up}; proxy_http_version 1.1; proxy_set_header Connection \"\"; \
             proxy_buffering off; {extra}"
        ),
    );
    (rt, engine, nginx)
}
