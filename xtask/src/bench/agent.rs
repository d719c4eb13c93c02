//! `cargo xtask bench agent`: what `tokenscope agent` costs while it stays attached.
//! The lab engine behind the untuned nginx (no keep-alive, buffering, gzip, an auth
//! hop: every token crosses four observation points), two loads: the demo's (1.45
//! requests/s, 96 tokens each, a shared 2000-token system prompt, a long document
//! every 40th) and about 1,000 tokens/s. Each load runs without the agent, then with
//! it, back to back: served tokens/s with the agent as a ratio of without, the agent's
//! CPU (% of one core, from /proc/PID/stat over the load) per 1k tokens/s, and its RSS
//! at the end and at its peak. Then the same for `tokenscope record` (issue 17's first
//! rows), with the recording's size per token. Printed rows, not assertions.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

const LOAD_SECONDS: u64 = 30;

struct Load {
    name: &'static str,
    args: &'static [&'static str],
}

const LOADS: &[Load] = &[
    Load {
        name: "demo load",
        args: &[
            "--chat",
            "--rate",
            "1.45",
            "--concurrency",
            "24",
            "--max-tokens",
            "96",
            "--prompt-tokens",
            "40",
            "--shared-prefix",
            "2000",
            "--long-prompt-every",
            "40",
            "--long-prompt-tokens",
            "6000",
        ],
    },
    Load {
        name: "~1k tokens/s",
        args: &[
            "--chat",
            "--rate",
            "20",
            "--concurrency",
            "64",
            "--max-tokens",
            "50",
            "--prompt-tokens",
            "40",
        ],
    },
];

pub(super) fn run(bin: &Path) -> Result<()> {
    let lab = super::lab(bin);
    let engine_port = free_port()?;
    let engine = Guard(
        Command::new(&lab)
            .args(["engine", "--listen", &format!("127.0.0.1:{engine_port}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("start the lab engine")?,
    );
    wait_port(engine_port)?;
    let proxy_port = free_port()?;
    let proxy = Guard(
        Command::new(&lab)
            .args(["proxy", "--untuned", "--upstream"])
            .arg(format!("127.0.0.1:{engine_port}"))
            .arg("--listen")
            .arg(format!("127.0.0.1:{proxy_port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("start the lab proxy (nginx)")?,
    );
    wait_port(proxy_port)?;
    let recording = std::env::temp_dir().join(format!(
        "tokenscope-bench-record-{}.tsrec",
        std::process::id()
    ));
    for tool in [Tool::Agent, Tool::Record(&recording)] {
        println!(
            "{} cost: lab engine behind the untuned nginx (4 observation points per token), {LOAD_SECONDS} s per run, without then with `tokenscope {}` (same run)",
            tool.name(),
            tool.name()
        );
        println!(
            "  load            tok/s without  tok/s with   ratio | {:<6} CPU  per 1k tok/s | RSS end  RSS peak{}",
            tool.name(),
            if matches!(tool, Tool::Record(_)) { " | recording per token (event)" } else { "" }
        );
        for load in LOADS {
            let url = format!("http://127.0.0.1:{proxy_port}/v1/chat/completions");
            let without = bench(&lab, &url, load)?;
            let child = AgentChild::start(bin, &tool, engine_port, proxy_port)?;
            let ticks_before = child.cpu_ticks()?;
            let started = Instant::now();
            let with = bench(&lab, &url, load)?;
            let cpu = (child.cpu_ticks()? - ticks_before) as f64
                / clock_ticks()
                / started.elapsed().as_secs_f64();
            let (rss, peak) = child.rss_kib()?;
            drop(child);
            let size = match tool {
                Tool::Record(path) => {
                    let s = recording_size(bin, path);
                    let _ = std::fs::remove_file(path);
                    s?
                }
                Tool::Agent => String::new(),
            };
            println!(
                "  {:<14} {:>13.0} {:>11.0} {:>7.3} | {:>8.2}%  {:>10.2}% | {:>4} MiB {:>5} MiB{size}",
                load.name,
                without,
                with,
                with / without,
                cpu * 100.0,
                cpu * 100.0 / (with / 1000.0),
                rss / 1024,
                peak / 1024
            );
        }
    }
    drop(proxy);
    drop(engine);
    Ok(())
}

/// Stops the child when dropped: SIGTERM first (the lab proxy then stops its nginx,
/// which would otherwise outlive it), SIGKILL after 10 s.
struct Guard(Child);

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

/// What stays attached while the load runs.
enum Tool<'a> {
    Agent,
    /// `record -o` this file (SIGTERM seals it).
    Record(&'a Path),
}

impl Tool<'_> {
    fn name(&self) -> &'static str {
        match self {
            Tool::Agent => "agent",
            Tool::Record(_) => "record",
        }
    }
}

/// The recording's bytes (past its header) per token the report counts, and per event.
fn recording_size(bin: &Path, path: &Path) -> Result<String> {
    let bytes = std::fs::metadata(path)?.len().saturating_sub(4096);
    let out = Command::new(bin)
        .arg("report")
        .arg(path)
        .output()
        .context("tokenscope report")?;
    // "tokenscope report: N requests (...), T tokens; E events, ..."
    let text = String::from_utf8_lossy(&out.stdout);
    let first = text.lines().next().unwrap_or_default();
    let number_before = |what: &str| -> Option<f64> {
        first
            .split(what)
            .next()?
            .rsplit([' ', ',', ';'])
            .find(|w| !w.is_empty())?
            .parse()
            .ok()
    };
    let (Some(tokens), Some(events)) = (number_before(" tokens;"), number_before(" events,"))
    else {
        bail!("no token or event count in the report: {first}");
    };
    Ok(format!(
        " | {:>5.0} B ({:.1} B per event, {:.1} events per token)",
        bytes as f64 / tokens,
        bytes as f64 / events,
        events / tokens
    ))
}

struct AgentChild(Guard);

impl AgentChild {
    fn start(bin: &Path, tool: &Tool, engine: u16, proxy: u16) -> Result<AgentChild> {
        let mut command = Command::new(bin);
        let marker = match tool {
            Tool::Agent => {
                command.args(["agent", "--nvml", "off", "--metrics-listen", "off"]);
                "tokenscope agent: attached"
            }
            Tool::Record(path) => {
                command.args(["record", "--nvml", "off", "-o"]).arg(path);
                "recording:"
            }
        };
        let mut child = command
            .args(["--port", &engine.to_string(), "--port", &proxy.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("start tokenscope {}", tool.name()))?;
        let stderr = child.stderr.take().context("stderr")?;
        let guard = Guard(child);
        let mut lines = BufReader::new(stderr).lines();
        loop {
            match lines.next() {
                Some(Ok(line)) if line.contains(marker) => break,
                Some(Ok(_)) => {}
                _ => bail!(
                    "tokenscope {} ended before attaching (needs root)",
                    tool.name()
                ),
            }
        }
        // Keep draining its stderr so it never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        Ok(AgentChild(guard))
    }

    /// utime + stime, in clock ticks.
    fn cpu_ticks(&self) -> Result<u64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.0 .0.id()))?;
        // Fields after the command name (which may hold spaces) start at ")".
        let rest = stat.rsplit_once(')').context("stat")?.1;
        let f: Vec<&str> = rest.split_whitespace().collect();
        Ok(f[11].parse::<u64>()? + f[12].parse::<u64>()?)
    }

    /// (VmRSS, VmHWM) in KiB.
    fn rss_kib(&self) -> Result<(u64, u64)> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.0 .0.id()))?;
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
                .unwrap_or(0)
        };
        Ok((field("VmRSS:"), field("VmHWM:")))
    }
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }) as f64
}

/// Runs the lab's bench for LOAD_SECONDS; the output tokens/s it served.
fn bench(lab: &Path, url: &str, load: &Load) -> Result<f64> {
    let out = Command::new(lab)
        .args(["bench", "--url", url, "--no-progress", "--duration"])
        .arg(format!("{LOAD_SECONDS}s"))
        .args(load.args)
        .output()
        .context("run the lab bench")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!("bench failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    // "requests: N ok, 0 failed in T s (R req/s, X output tokens/s), W workers"
    text.lines()
        .filter(|l| l.contains(" output tokens/s"))
        .find_map(|l| {
            let before = l.split(" output tokens/s").next()?;
            before.rsplit(", ").next()?.trim().parse().ok()
        })
        .with_context(|| format!("no tokens/s in the bench's output: {text}"))
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn wait_port(port: u16) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            bail!("nothing listens on {port} after 30 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}
