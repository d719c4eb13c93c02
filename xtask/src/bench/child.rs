//! What the bench's rows share: children stopped when dropped, ports, a process's CPU
//! and memory from /proc, and the lab's load client.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// Stops the child when dropped: SIGTERM first (the lab proxy then stops its nginx,
/// which would otherwise outlive it), SIGKILL after 10 s.
pub(super) struct Guard(pub(super) Child);

impl Drop for Guard {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.0.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while matches!(self.0.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The lab engine (with `engine_args`) behind the lab's nginx (`proxy_mode`: --tuned-plain,
/// --untuned...), each stopped when dropped (proxy first).
pub(super) struct Chain {
    _proxy: Guard,
    _engine: Guard,
    pub(super) engine_port: u16,
    pub(super) proxy_port: u16,
}

impl Chain {
    pub(super) fn start(lab: &Path, engine_args: &[&str], proxy_mode: &str) -> Result<Chain> {
        let engine_port = free_port()?;
        let engine = Guard(
            Command::new(lab)
                .args(["engine", "--listen", &format!("127.0.0.1:{engine_port}")])
                .args(engine_args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("start the lab engine")?,
        );
        wait_port(engine_port)?;
        let proxy_port = free_port()?;
        let proxy = Guard(
            Command::new(lab)
                .args(["proxy", proxy_mode, "--upstream"])
                .arg(format!("127.0.0.1:{engine_port}"))
                .arg("--listen")
                .arg(format!("127.0.0.1:{proxy_port}"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("start the lab proxy (nginx)")?,
        );
        wait_port(proxy_port)?;
        Ok(Chain {
            _proxy: proxy,
            _engine: engine,
            engine_port,
            proxy_port,
        })
    }
}

pub(super) fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

pub(super) fn wait_port(port: u16) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            bail!("nothing listens on {port} after 30 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// The process's utime + stime so far, in seconds.
pub(super) fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces) start at ")".
    let rest = stat.rsplit_once(')').context("stat")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f[11].parse::<u64>()? + f[12].parse::<u64>()?;
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    Ok(ticks as f64 / per_second as f64)
}

/// (VmRSS, VmHWM) in KiB.
pub(super) fn rss_kib(pid: u32) -> Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    Ok((field("VmRSS:"), field("VmHWM:")))
}

/// What a run of the lab's bench served.
pub(super) struct Served {
    pub(super) tokens_per_s: f64,
    pub(super) failed: u64,
}

/// Runs the lab's bench (`tokenscope-lab bench --url URL --duration D ARGS`).
pub(super) fn load(lab: &Path, url: &str, duration: Duration, args: &[&str]) -> Result<Served> {
    let out = Command::new(lab)
        .args(["bench", "--url", url, "--no-progress", "--duration"])
        .arg(format!("{}s", duration.as_secs()))
        .args(args)
        .output()
        .context("run the lab bench")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!("bench failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    // "requests: N ok, F failed in T s (R req/s, X output tokens/s), W workers"
    text.lines()
        .filter(|l| l.contains(" output tokens/s"))
        .find_map(|l| {
            let before = l.split(" output tokens/s").next()?;
            let failed = l
                .split(" failed")
                .next()?
                .rsplit(' ')
                .next()?
                .parse()
                .ok()?;
            Some(Served {
                tokens_per_s: before.rsplit(", ").next()?.trim().parse().ok()?,
                failed,
            })
        })
        .with_context(|| format!("no tokens/s in the bench's output: {text}"))
}

/// The number just before `what` in `text` ("..., 12 tokens;" -> 12 for " tokens;").
pub(super) fn number_before(text: &str, what: &str) -> Option<f64> {
    text.split(what)
        .next()?
        .rsplit([' ', ',', ';', ':', '('])
        .find(|w| !w.is_empty())?
        .parse()
        .ok()
}

/// The number just after the first `key` in `text` ("dropped 3, ..." -> 3 for "dropped").
pub(super) fn number_after(text: &str, key: &str) -> Option<u64> {
    text.split(key)
        .nth(1)?
        .trim_start()
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}
