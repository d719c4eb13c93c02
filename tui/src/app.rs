//! `tokenscope top`: options, the key map, and the loop that feeds the state
//! and draws it. The loop owns the clocks; `update` and `render` get time from it.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use collector::probes::{
    IoSource, IoSourceChoice, ProbeConfig, DEFAULT_PAYLOAD_CAP, LIVE_RING_BYTES,
};
use collector::record::sink::Output;
use collector::record::{NvmlOptions, RecordOptions};
use crossterm::event::{self, Event as TermEvent, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use crate::feed::{Live, Replay};
use crate::state::{update, Action, Meta, State, View};
use crate::term::TerminalGuard;
use crate::view::render;
use crate::worker::{Source, Worker};

/// How long the loop waits for a key before it draws again.
const FRAME: Duration = Duration::from_millis(100);

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuMode {
    Auto,
    Off,
}

/// Where socket I/O events come from (`--io-source`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoSourceArg {
    /// The best source this kernel has (sock, then kprobe, then syscall).
    Auto,
    /// The socket-layer tracepoints sock:sock_send_length/sock_recv_length (Linux 6.3+).
    Sock,
    /// kprobes on tcp_sendmsg and tcp_cleanup_rbuf (kernels built with kprobes).
    Kprobe,
    /// The syscall tracepoints alone; does not see sendfile, splice or io_uring.
    Syscall,
}

/// How the probes meet the kernel: shared by `record` and `top`.
#[derive(clap::Args, Debug, Clone)]
pub struct KernelArgs {
    /// Where socket I/O events come from; the recording and the report name the one used.
    #[arg(long, value_enum, default_value_t = IoSourceArg::Auto)]
    pub io_source: IoSourceArg,
    /// Kernel BTF to use when the kernel has none at /sys/kernel/btf/vmlinux (older
    /// RHEL/CentOS), e.g. a BTFHub file for this exact kernel.
    #[arg(long, value_name = "FILE")]
    pub btf: Option<PathBuf>,
}

impl KernelArgs {
    pub fn apply(&self, probes: &mut ProbeConfig) {
        probes.io_source = match self.io_source {
            IoSourceArg::Auto => IoSourceChoice::Auto,
            IoSourceArg::Sock => IoSourceChoice::Only(IoSource::Sock),
            IoSourceArg::Kprobe => IoSourceChoice::Only(IoSource::Kprobe),
            IoSourceArg::Syscall => IoSourceChoice::Only(IoSource::Syscall),
        };
        probes.btf = self.btf.clone();
    }
}

/// For the CLI's `#[command(after_help = ...)]` on `top`.
pub const AFTER_HELP: &str = "\
Examples:
  tokenscope top --port 8000 --port 443          # live: needs root, or CAP_BPF + CAP_PERFMON
  tokenscope top --replay run.tsrec --speed 10   # a recording, ten times faster (0: at once)
  tokenscope top --replay gateway.tsrec gpu.tsrec   # two hosts' recordings, one timeline

Keys: q or Ctrl-C quit, j/k or arrows move, Enter opens a request (waterfall and tokens per
observation point), Esc goes back, / filters (route, client, status, or new-conn tls
coalesced stalled open), s sorts (start, TTFT, ITL p99), p pauses the screen, ? helps.
TTFT: first token - request start (connect() when the request opened its connection), at the
first point traced and at the engine's write. ITL: gaps between tokens at one point; 0 means
the same read (coalescing). Live drops (ring buffer full) are read every 200 ms.
The pipeline runs on its own thread and passes over the window once a second; the header's
`pass` is how long the last pass took (top's own cost), and keys never wait for it. GPU
shares and diagnoses are made again at most once a second and at most 2% of a core: under
a heavy load, less often.
The diagnoses panel shows what the rules of `tokenscope report` find in the window, largest
saving first: [rule] the fix, its share of the TTFT p95 saving, where, then what was seen; a
request's detail names the diagnoses that cite it. The report gives the fix lines.";

/// `tokenscope top`: live (needs privileges) or `--replay FILE`.
#[derive(clap::Args, Debug, Clone)]
pub struct TopArgs {
    /// Replay a recording (from `tokenscope record`) instead of tracing live; several
    /// (one per host) are joined into one timeline as `tokenscope report A B` joins them.
    #[arg(long, value_name = "FILE", num_args = 1.., conflicts_with_all = ["pids", "ports", "output"])]
    pub replay: Vec<PathBuf>,
    /// Replay speed: 1 plays as recorded, 10 ten times faster, 0 shows it all at once.
    #[arg(long, default_value_t = 1.0, value_name = "X", value_parser = parse_speed)]
    pub speed: f64,
    /// Live: trace only this process (repeatable).
    #[arg(short = 'p', long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,
    /// Live: trace only sockets with this local or remote port (repeatable, up to 8).
    #[arg(long = "port", value_name = "N")]
    pub ports: Vec<u16>,
    /// Live: libcuda uprobes on every libcuda a traced process maps (`auto`) or none.
    #[arg(long, value_enum, default_value_t = GpuMode::Auto)]
    pub gpu: GpuMode,
    /// Live: NVML device counters when a driver is there (`auto`) or none.
    #[arg(long, value_enum, default_value_t = GpuMode::Auto)]
    pub nvml: GpuMode,
    /// Live: TLS plaintext from OpenSSL uprobes (`auto`, as `record --tls`) or none.
    #[arg(long, value_enum, default_value_t = GpuMode::Auto)]
    pub tls: GpuMode,
    #[command(flatten)]
    pub kernel: KernelArgs,
    /// Live: ring buffer size in bytes (power of two). Drained every 100 ms, so half of
    /// `record`'s; raise it if the header counts drops.
    #[arg(long, default_value_t = LIVE_RING_BYTES, value_name = "BYTES", value_parser = parse_ring_size)]
    pub ring_size: u32,
    /// Live: keep the recording in this file (default: none kept).
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// History kept: finished requests, GPU steps and samples this recent (e.g. 30s, 5m).
    #[arg(long, default_value = "60s", value_parser = collector::duration::parse, value_name = "D")]
    pub window: Duration,
}

/// Checked here, before the screen is set up (the probes would refuse it later).
fn parse_ring_size(s: &str) -> Result<u32, String> {
    let n: u32 = s
        .parse()
        .map_err(|_| format!("not a number of bytes: {s}"))?;
    if collector::probes::ring_bytes_ok(n) {
        Ok(n)
    } else {
        Err("must be a power of two of at least 4096 bytes (e.g. 8388608)".into())
    }
}

fn parse_speed(s: &str) -> Result<f64, String> {
    let x: f64 = s.parse().map_err(|_| format!("not a number: {s}"))?;
    if x.is_finite() && x >= 0.0 {
        Ok(x)
    } else {
        Err("speed must be 0 (all at once) or more".into())
    }
}

/// The key map: what a key means in the state's current mode.
pub fn action_for_key(state: &State, key: KeyEvent) -> Option<Action> {
    if key.kind == KeyEventKind::Release {
        return None;
    }
    let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
    if ctrl && key.code == KeyCode::Char('c') {
        return Some(Action::Quit);
    }
    if state.filter_input.is_some() {
        return match key.code {
            KeyCode::Enter => Some(Action::FilterApply),
            KeyCode::Esc => Some(Action::FilterCancel),
            KeyCode::Backspace => Some(Action::FilterBackspace),
            KeyCode::Char(c) if !ctrl => Some(Action::FilterInput(c)),
            _ => None,
        };
    }
    match key.code {
        KeyCode::Char('q') => Some(Action::Quit),
        KeyCode::Char('j') | KeyCode::Down => Some(Action::Down),
        KeyCode::Char('k') | KeyCode::Up => Some(Action::Up),
        KeyCode::PageDown => Some(Action::PageDown),
        KeyCode::PageUp => Some(Action::PageUp),
        KeyCode::Char('g') | KeyCode::Home => Some(Action::Home),
        KeyCode::Char('G') | KeyCode::End => Some(Action::End),
        KeyCode::Enter => Some(Action::Open),
        KeyCode::Esc => Some(Action::Back),
        KeyCode::Char('/') if state.view == View::Table => Some(Action::FilterStart),
        KeyCode::Char('s') => Some(Action::CycleSort),
        KeyCode::Char('p') => Some(Action::TogglePause),
        KeyCode::Char('?') => Some(Action::ToggleHelp),
        _ => None,
    }
}

/// Runs top until q, Ctrl-C, SIGINT or SIGTERM. Needs a terminal on stdout.
pub fn run_top(args: TopArgs) -> anyhow::Result<()> {
    if !std::io::stdout().is_terminal() {
        anyhow::bail!(
            "tokenscope top needs a terminal on stdout; use `tokenscope report` for text or JSON"
        );
    }
    // Before anything can raise SIGINT: the signals end the loop, not the process.
    let quit = collector::record::live::quit_flag().context("signal handler")?;
    let window_ns = args.window.as_nanos() as u64;
    let (source, meta) = match args.replay.as_slice() {
        [_, ..] => {
            let replay = Replay::open(&args.replay)?;
            let meta = replay.meta(&args.replay, args.speed);
            (
                Source::Replay {
                    replay: Box::new(replay),
                    speed: args.speed,
                },
                meta,
            )
        }
        [] => {
            let mut live = Live::start(record_options(&args))?;
            let (attached, skipped) = live.wait_started(Duration::from_secs(60))?;
            let meta = Meta {
                host: hostname(),
                source: "live".into(),
                probes_attached: attached,
                probes_skipped: skipped,
                dropped: None,
                start_ns: collector::clock::monotonic_ns(),
            };
            (Source::Live(live), meta)
        }
    };
    let mut state = State::new(meta);
    let mut worker = Worker::start(source, window_ns)?;
    let mut guard = TerminalGuard::enter().context("setting up the terminal")?;
    let result = run_loop(&mut guard, &mut state, &worker, &quit);
    drop(guard);
    // The pipeline thread (and the live recording) stop before top returns.
    result.and(worker.stop())
}

fn record_options(args: &TopArgs) -> RecordOptions {
    let libcuda = match args.gpu {
        GpuMode::Off => Vec::new(),
        GpuMode::Auto => collector::probes::find_libcuda(&args.pids),
    };
    let libssl = match args.tls {
        GpuMode::Off => Vec::new(),
        GpuMode::Auto => collector::probes::find_libssl(&args.pids),
    };
    let mut probes = ProbeConfig {
        pids: args.pids.clone(),
        ports: args.ports.clone(),
        ring_bytes: args.ring_size,
        payload_cap: DEFAULT_PAYLOAD_CAP,
        libcuda,
        libssl,
        ..ProbeConfig::default()
    };
    args.kernel.apply(&mut probes);
    RecordOptions {
        probes,
        nvml: (args.nvml == GpuMode::Auto).then(|| NvmlOptions {
            lib: None,
            interval: Duration::from_millis(100),
        }),
        cupti_socket: None,
        duration: None,
        output: match &args.output {
            Some(path) => Output::File(path.clone()),
            None => Output::Discard,
        },
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Draws and answers keys; the pipeline runs on the worker's thread, so nothing
/// here takes longer than a frame.
fn run_loop(
    guard: &mut TerminalGuard,
    state: &mut State,
    worker: &Worker,
    quit: &AtomicBool,
) -> anyhow::Result<()> {
    // `render` is pure: the screen changes only with the state or the terminal's size,
    // so a frame is drawn only then (a snapshot a second under load, not ten frames).
    let mut changed = true;
    loop {
        for action in worker.actions() {
            update(state, action);
            changed = true;
        }
        if std::mem::take(&mut changed) {
            guard.terminal.draw(|f| render(f, state))?;
        }
        if event::poll(FRAME)? {
            // Drain what is queued so a burst of keys costs one frame.
            loop {
                match event::read()? {
                    TermEvent::Key(key) => {
                        if let Some(action) = action_for_key(state, key) {
                            update(state, action);
                            changed = true;
                        }
                    }
                    TermEvent::Resize(..) => changed = true,
                    _ => {}
                }
                if !event::poll(Duration::ZERO)? {
                    break;
                }
            }
            worker.set_paused(state.paused);
        }
        if state.quit || quit.load(Ordering::Relaxed) {
            return Ok(());
        }
    }
}
