//! The TLS row of `cargo xtask bench`: what the OpenSSL plaintext uprobes cost a
//! program's `SSL_write` (see `tls_cost`).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use super::{Recorder, Summary, ROUNDS};

/// Cost of a traced OpenSSL `SSL_write`: N small writes from python's ssl module
/// to a TLS peer (another python process) over loopback, with no recorder, with
/// `tokenscope record --tls off` (socket probes only) and with `--tls auto` (the
/// plaintext uprobes on SSL_write, SSL_read and friends as well), alternating in
/// each round. Both processes load a private copy of the libssl python uses
/// (LD_LIBRARY_PATH): a uprobe covers one file, so no probe another tracer put on
/// the system's copy reaches the baseline, and `--tls auto` finds the copy among
/// the files running processes map.
pub(super) fn tls_cost(bin: &Path, out: &Path) -> Result<()> {
    let dir = std::env::temp_dir().join(format!("tokenscope-bench-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = tls_rounds(bin, out, &dir);
    let _ = std::fs::remove_file(out);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// `python3 -c TLS_WORKLOAD libssl | server CERT KEY CALLS SIZE | client PORT CALLS SIZE`.
/// The server reads CALLS * SIZE bytes per connection and answers one byte; the
/// client times its CALLS writes of SIZE bytes (SSL_write_ex in OpenSSL 3). Each
/// names the libssl it has mapped.
const TLS_WORKLOAD: &str = r#"
import socket, ssl, sys, time

def libssl():
    return next(l.split()[-1] for l in open('/proc/self/maps') if '/libssl.so' in l)

def server(cert, key, calls, size):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    ls = socket.socket()
    ls.bind(('127.0.0.1', 0))
    ls.listen()
    print(ls.getsockname()[1], libssl(), flush=True)
    while True:
        c, _ = ls.accept()
        try:
            with ctx.wrap_socket(c, server_side=True) as s:
                want, got = calls * size, 0
                while got < want:
                    b = s.recv(65536)
                    if not b:
                        break
                    got += len(b)
                s.sendall(b'k' if got == want else b'e')
        except OSError:
            pass

def client(port, calls, size):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with ctx.wrap_socket(socket.create_connection(('127.0.0.1', port))) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        w, b = s.write, b'x' * size
        t = time.perf_counter_ns()
        for _ in range(calls):
            w(b)
        t = time.perf_counter_ns() - t
        if s.recv(1) != b'k':
            sys.exit('the TLS peer did not get every byte')
    print(t, libssl())

a = sys.argv[1:]
if a[0] == 'libssl':
    print(libssl())
elif a[0] == 'server':
    server(a[1], a[2], int(a[3]), int(a[4]))
else:
    client(int(a[1]), int(a[2]), int(a[3]))
"#;

fn tls_rounds(bin: &Path, out: &Path, dir: &Path) -> Result<()> {
    const CALLS: u32 = 20_000;
    const SIZE: u32 = 64;
    let python = |args: &[&str]| {
        let mut c = Command::new("python3");
        c.arg("-c").arg(TLS_WORKLOAD).args(args);
        c.env("LD_LIBRARY_PATH", dir).stdin(Stdio::null());
        c
    };
    let (lib, cert, key) = tls_peer_files(&python, dir)?;
    // /proc/PID/maps names the file with symlinks resolved.
    let real = std::fs::canonicalize(&lib)?;
    let loaded = |mapped: Option<&str>| -> Result<()> {
        if mapped.map(Path::new) != Some(real.as_path()) {
            bail!(
                "python's ssl module loaded {mapped:?}, not the bench's copy {}",
                lib.display()
            );
        }
        Ok(())
    };
    let (calls, size) = (CALLS.to_string(), SIZE.to_string());
    let (cert, key) = (cert.to_string_lossy(), key.to_string_lossy());
    let mut server = Peer(
        python(&["server", &cert, &key, &calls, &size])
            .stdout(Stdio::piped())
            .spawn()
            .context("start the TLS peer")?,
    );
    let mut line = String::new();
    BufReader::new(server.0.stdout.take().expect("piped")).read_line(&mut line)?;
    let mut words = line.split_whitespace();
    let port: u16 = words
        .next()
        .and_then(|p| p.parse().ok())
        .context("the TLS peer did not start")?;
    loaded(words.next())?;
    let port = port.to_string();
    let client = || -> Result<f64> {
        let o = python(&["client", &port, &calls, &size]).output()?;
        if !o.status.success() {
            bail!("TLS client: {}", String::from_utf8_lossy(&o.stderr).trim());
        }
        let text = String::from_utf8_lossy(&o.stdout);
        let mut words = text.split_whitespace();
        let ns: f64 = words
            .next()
            .and_then(|t| t.parse().ok())
            .context("timing from python")?;
        loaded(words.next())?;
        Ok(ns / f64::from(CALLS))
    };
    let record = |tls: &str| {
        let args = ["--port", &port, "--tls", tls, "-o"];
        let mut args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_ref()).collect();
        args.push(out.as_os_str());
        Recorder::spawn(bin, &args)
    };
    let plaintext = || plaintext_io(bin, out, SIZE);

    let (mut base, mut off, mut auto, mut seen) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        base.push(client()?);
        let rec = record("off")?;
        off.push(client()?);
        rec.stop()?;
        let (w, r, _) = plaintext()?;
        if w + r > 0 {
            bail!("--tls off still recorded plaintext: {w} SSL_write and {r} SSL_read events");
        }
        let rec = record("auto")?;
        auto.push(client()?);
        let summary = rec.stop()?;
        let (w, r, probed) = plaintext()?;
        if w == 0 {
            bail!(
                "--tls auto recorded no SSL_write of {SIZE} B for {CALLS} calls on {} (SSL_write probed in: {probed})",
                lib.display()
            );
        }
        seen.push((w, r, summary));
    }
    drop(server);

    let name = lib.file_name().unwrap_or_default().to_string_lossy();
    print_tls_rounds(&name, CALLS, SIZE, (base, off, auto), &seen);
    Ok(())
}

/// The bench's copy of the libssl python's ssl module maps (so its uprobes touch
/// nothing else), and a throwaway certificate for the peer.
fn tls_peer_files(
    python: &dyn Fn(&[&str]) -> Command,
    dir: &Path,
) -> Result<(PathBuf, PathBuf, PathBuf)> {
    let o = python(&["libssl"]).env_remove("LD_LIBRARY_PATH").output()?;
    if !o.status.success() {
        bail!(
            "python3 with its ssl module: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    let system = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim());
    let lib = dir.join(system.file_name().context("the libssl python maps")?);
    std::fs::copy(&system, &lib).with_context(|| format!("copy {}", system.display()))?;
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let o = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .args(["ec_paramgen_curve:prime256v1", "-nodes", "-days", "1"])
        .args(["-subj", "/CN=localhost", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stdin(Stdio::null())
        .output()
        .context("openssl")?;
    if !o.status.success() {
        bail!(
            "openssl req (the peer's certificate): {}",
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    Ok((lib, cert, key))
}

/// Plaintext I/O in a recording: (SSL_write events of `size` bytes, SSL_read events,
/// the files SSL_write was probed in).
fn plaintext_io(bin: &Path, recording: &Path, size: u32) -> Result<(u64, u64, String)> {
    let o = Command::new(bin).arg("dump").arg(recording).output()?;
    if !o.status.success() {
        bail!(
            "tokenscope dump: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    let text = String::from_utf8_lossy(&o.stdout);
    let sized = format!(" {size} B");
    let writes = text
        .lines()
        .filter(|l| l.contains(" send SSL_write fd ") && l.contains(&sized))
        .count();
    let reads = text
        .lines()
        .filter(|l| l.contains(" recv SSL_read fd "))
        .count();
    let probed: Vec<&str> = text
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("uprobe:SSL_write@"))
        .collect();
    Ok((writes as u64, reads as u64, probed.join(" ")))
}

/// The rounds' medians against the run without tokenscope, and what each recording saw.
fn print_tls_rounds(
    name: &str,
    calls: u32,
    size: u32,
    (mut base, mut off, mut auto): (Vec<f64>, Vec<f64>, Vec<f64>),
    seen: &[(u64, u64, Summary)],
) {
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (b, f, t) = (med(&mut base), med(&mut off), med(&mut auto));
    println!("TLS plaintext uprobes: {calls} SSL_write calls of {size} B (python ssl, a copy of {name}) to a TLS peer over loopback, median of {ROUNDS} rounds (same run)");
    println!("  no tokenscope                     {b:>8.0} ns/call   1.00x");
    println!(
        "  socket probes only (--tls off)    {f:>8.0} ns/call   {:.2}x  (+{:.2} us/call)",
        f / b,
        (f - b) / 1e3
    );
    println!(
        "  TLS uprobes too (--tls auto)      {t:>8.0} ns/call   {:.2}x  (+{:.2} us/call)",
        t / b,
        (t - b) / 1e3
    );
    println!(
        "SSL_write ({size} B, python ssl): {:.1} us/call without tokenscope, {:.1} us with socket probes only (--tls off), {:.1} us with TLS uprobes: +{:.1} us per traced SSL_write (entry + return uprobes and the plaintext record; the peer's SSL_read is traced too)",
        b / 1e3,
        f / 1e3,
        t / 1e3,
        (t - f) / 1e3
    );
    for (w, r, s) in seen {
        println!(
            "  --tls auto recorded {w} SSL_write events of {size} B for {calls} calls, {r} SSL_read ({} delivered, {} dropped)",
            s.delivered, s.dropped
        );
    }
}

/// A child killed when dropped, on error paths too.
struct Peer(std::process::Child);

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
