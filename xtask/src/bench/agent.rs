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
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::child::{cpu_seconds, number_before, rss_kib, Chain, Guard};

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
    let lab = super::lab();
    let chain = Chain::start(&lab, &[], "--untuned")?;
    let (engine_port, proxy_port) = (chain.engine_port, chain.proxy_port);
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
            let without = bench(&lab, &url, load)?.tokens_per_s;
            let child = AgentChild::start(bin, &tool, engine_port, proxy_port)?;
            let cpu_before = cpu_seconds(child.pid())?;
            let started = Instant::now();
            let with = bench(&lab, &url, load)?.tokens_per_s;
            let cpu = (cpu_seconds(child.pid())? - cpu_before) / started.elapsed().as_secs_f64();
            let (rss, peak) = rss_kib(child.pid())?;
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
    drop(chain);
    Ok(())
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
    let bytes = std::fs::metadata(path)?.len().saturating_sub(4096) as f64;
    let c = report_counts(bin, path)?;
    Ok(format!(
        " | {:>5.0} B ({:.1} B per event, {:.1} events per token)",
        bytes / c.tokens,
        bytes / c.events,
        c.events / c.tokens
    ))
}

pub(super) struct ReportCounts {
    pub(super) requests: f64,
    pub(super) tokens: f64,
    pub(super) events: f64,
}

/// What `tokenscope report FILE` counts in its first line (the text report: xtask parses
/// no JSON).
pub(super) fn report_counts(bin: &Path, path: &Path) -> Result<ReportCounts> {
    let out = Command::new(bin)
        .arg("report")
        .arg(path)
        .output()
        .context("tokenscope report")?;
    if !out.status.success() {
        bail!(
            "tokenscope report {} failed: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    // "tokenscope report: N requests (...), T tokens; E events, ..."
    let text = String::from_utf8_lossy(&out.stdout);
    let first = text.lines().next().unwrap_or_default();
    match (
        number_before(first, " requests"),
        number_before(first, " tokens;"),
        number_before(first, " events,"),
    ) {
        (Some(requests), Some(tokens), Some(events)) => Ok(ReportCounts {
            requests,
            tokens,
            events,
        }),
        _ => bail!("no request, token or event count in the report: {first}"),
    }
}

/// `tokenscope agent` or `record` attached to the lab's ports, stopped when dropped
/// (SIGTERM seals a recording).
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

    fn pid(&self) -> u32 {
        self.0 .0.id()
    }
}

fn bench(lab: &Path, url: &str, load: &Load) -> Result<super::child::Served> {
    super::child::load(lab, url, Duration::from_secs(LOAD_SECONDS), load.args)
}
