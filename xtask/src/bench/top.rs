//! What `tokenscope top` costs while it draws a live load (issue 17's `top` row): top
//! runs in a tmux pane (it needs a terminal) tracing the given ports, the lab's bench
//! runs the load, and top's CPU (utime + stime from /proc/PID/stat, % of one core) and
//! RSS (VmRSS at the end, VmHWM) are read over the bench's run.
//! top keeps a window of history (60 s by default) and passes over all of it each
//! second: until the window is full its memory and CPU only grow. The same load first
//! runs for one window, unmeasured, so the figures are top's steady state, not its first
//! seconds (measured from the start, a 20 s run showed 66 MiB where a minute's load
//! reaches 116 MiB).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::child::{cpu_seconds, rss_kib};

/// top's cost over one load.
#[derive(Clone, Copy, Debug)]
pub(super) struct TopCost {
    /// Output tokens/s the bench was served meanwhile.
    pub(super) tokens_per_s: f64,
    /// % of one core.
    pub(super) cpu_pct: f64,
    /// VmRSS at the end and VmHWM, KiB.
    pub(super) rss_kib: u64,
    pub(super) peak_kib: u64,
}

/// top's default `--window`: the history it holds once it has run that long.
const TOP_WINDOW: Duration = Duration::from_secs(60);

/// Starts `tokenscope top` (`bin`) live on `ports` (GPU probes as top defaults them, NVML
/// off), fills its window with the load, then runs `LAB bench --url URL --duration LOAD
/// BENCH_ARGS` and returns top's cost over that run. Needs root (eBPF) and tmux.
pub(super) fn measure(
    bin: &Path,
    lab: &Path,
    url: &str,
    ports: &[u16],
    bench_args: &[&str],
    load: Duration,
) -> Result<TopCost> {
    let session = Session::start(bin, ports)?;
    let top = session.top_pid()?;
    let warm = super::child::load(lab, url, TOP_WINDOW, bench_args)?;
    anyhow::ensure!(
        warm.failed == 0,
        "{} of the warm-up load's requests failed with top attached",
        warm.failed
    );
    let before = cpu_seconds(top)?;
    let started = Instant::now();
    let served = super::child::load(lab, url, load, bench_args)?;
    let seconds = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds(top)? - before;
    let (rss_kib, peak_kib) = rss_kib(top)?;
    drop(session);
    anyhow::ensure!(
        served.failed == 0,
        "{} of the load's requests failed with top attached",
        served.failed
    );
    Ok(TopCost {
        tokens_per_s: served.tokens_per_s,
        cpu_pct: cpu / seconds * 100.0,
        rss_kib,
        peak_kib,
    })
}

/// A tmux session running top; killed (top with it) when dropped.
struct Session(String);

impl Session {
    fn start(bin: &Path, ports: &[u16]) -> Result<Session> {
        let name = format!("tokenscope-bench-top-{}", std::process::id());
        let mut top = format!("exec {} top --nvml off", bin.display());
        for p in ports {
            top.push_str(&format!(" --port {p}"));
        }
        let status = Command::new("tmux")
            .args([
                "new-session",
                "-d",
                "-s",
                &name,
                "-x",
                "120",
                "-y",
                "40",
                &top,
            ])
            .status()
            .context("start tmux (is it installed?)")?;
        if !status.success() {
            bail!("tmux new-session failed");
        }
        let session = Session(name);
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let screen = session.screen()?;
            if screen.contains("tokenscope top") && screen.contains("live") {
                return Ok(session);
            }
            if Instant::now() > deadline {
                bail!("top did not start tracing within 90 s (needs root):\n{screen}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn screen(&self) -> Result<String> {
        let out = Command::new("tmux")
            .args(["capture-pane", "-p", "-t", &self.0])
            .output()
            .context("tmux capture-pane")?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The pane's process: top itself (the pane's shell exec'd it).
    fn top_pid(&self) -> Result<u32> {
        let out = Command::new("tmux")
            .args(["display", "-p", "-t", &self.0, "#{pane_pid}"])
            .output()
            .context("tmux display")?;
        let pid: u32 = String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .context("the pane's pid")?;
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if !comm.starts_with("tokenscope") {
            bail!("the pane runs {comm:?}, not tokenscope top");
        }
        Ok(pid)
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["send-keys", "-t", &self.0, "q"])
            .status();
        std::thread::sleep(Duration::from_secs(1));
        let _ = Command::new("tmux")
            .args(["kill-session", "-t", &self.0])
            .status();
    }
}
