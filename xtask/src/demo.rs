//! `cargo xtask demo`: record a few seconds of real curl traffic (plain HTTP and
//! TLS, keep-alive and not) through a local nginx, then print the recording.
//! (Until the lab's `tokenscope demo` lands, this is the main job.)

use std::io::{BufRead, BufReader};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

pub fn run() -> Result<()> {
    crate::setup::run()?;
    crate::cargo(&["build", "--bin", "tokenscope"])?;
    let bin = crate::root().join("target/debug/tokenscope");
    let dir = std::env::temp_dir().join(format!("tokenscope-demo-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("logs"))?;
    let (http, https) = (free_port()?, free_port()?);
    let mut nginx = start_nginx(&dir, http, https)?;
    let result = record_and_dump(&bin, http, https);
    // SAFETY: SIGQUIT asks nginx to stop gracefully.
    unsafe { libc::kill(nginx.id() as i32, libc::SIGQUIT) };
    let _ = nginx.wait();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn record_and_dump(bin: &Path, http: u16, https: u16) -> Result<()> {
    let out = crate::root().join("target/demo.tsrec");
    let mut rec = Command::new(bin)
        .args([
            "record",
            "--duration",
            "4s",
            "--port",
            &http.to_string(),
            "--port",
            &https.to_string(),
            "-o",
        ])
        .arg(&out)
        .stderr(Stdio::piped())
        .spawn()
        .context("start tokenscope record")?;
    let stderr = rec.stderr.take().expect("piped");
    let mut lines = BufReader::new(stderr).lines();
    loop {
        match lines.next() {
            Some(Ok(l)) if l.contains("recording:") => {
                eprintln!("{l}");
                break;
            }
            Some(Ok(l)) => eprintln!("{l}"),
            _ => bail!("tokenscope record stopped before attaching (see above)"),
        }
    }
    let plain = format!("http://127.0.0.1:{http}/v1/models");
    let tls = format!("https://127.0.0.1:{https}/v1/models");
    crate::run(Command::new("curl").args(["-s", "-o", "/dev/null", &plain, &plain]))?; // keep-alive: one connection
    crate::run(Command::new("curl").args(["-sk", "-o", "/dev/null", &tls]))?;
    for l in lines.map_while(Result::ok) {
        eprintln!("{l}");
    }
    let status = rec.wait()?;
    if !status.success() {
        bail!("tokenscope record failed with {status}");
    }
    crate::run(Command::new(bin).arg("dump").arg(&out))?;
    println!("\n(recording kept at {})", out.display());
    Ok(())
}

fn start_nginx(dir: &Path, http: u16, https: u16) -> Result<Child> {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    crate::run(
        Command::new("openssl")
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
            .stderr(Stdio::null()),
    )?;
    let d = dir.display();
    let conf = format!(
        "worker_processes 1; error_log {d}/logs/error.log; pid {d}/nginx.pid;\n\
         events {{ worker_connections 64; }}\n\
         http {{ access_log off; client_body_temp_path {d}/body; proxy_temp_path {d}/proxy;\n\
           fastcgi_temp_path {d}/fcgi; uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;\n\
           server {{ listen 127.0.0.1:{http}; listen 127.0.0.1:{https} ssl;\n\
             ssl_certificate {}; ssl_certificate_key {};\n\
             location / {{ default_type application/json; return 200 '{{\"object\":\"list\",\"data\":[]}}'; }} }} }}\n",
        cert.display(),
        key.display()
    );
    let conf_path = dir.join("nginx.conf");
    std::fs::write(&conf_path, conf)?;
    let child = Command::new("nginx")
        .arg("-p")
        .arg(dir)
        .arg("-c")
        .arg(&conf_path)
        .args(["-g", "daemon off;"])
        .spawn()
        .context("start nginx")?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", https)).is_err() {
        if Instant::now() > deadline {
            bail!("nginx did not start listening on {https}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(child)
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}
