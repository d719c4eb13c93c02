//! The command line: clap definitions and thin calls into the libraries.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use collector::ingest::record::{ReadAhead, Source};
use collector::probes::Probes;
use collector::record::RecordObserver;

use crate::probe_args::ProbeArgs;

const ABOUT: &str =
    "Where did the time to first token go? An eBPF + GPU trace profiler for LLM token streams.";
const LONG_ABOUT: &str = "\
tokenscope attaches to a host that serves an OpenAI-style streaming API and times every
connection, TLS handshake and socket read/write of the chain (client -> proxy -> engine),
without restarting anything.

Requirements: root, or CAP_BPF + CAP_PERFMON (+ CAP_SYS_ADMIN for uprobes); a kernel with
BTF (/sys/kernel/btf/vmlinux, or --btf FILE) and a BPF ring buffer (5.8+); tracefs (mounted
automatically when missing). Exit status 2 when the kernel cannot host the probes.

Privacy: payloads are reduced in the collector to HTTP start lines, framing headers and
TLS record headers; prompts, completions, Authorization and Cookie values never reach any
output.";

#[derive(Parser, Debug)]
#[command(name = "tokenscope", version, about = ABOUT, long_about = LONG_ABOUT)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Record TCP connections and socket I/O to a file (needs privileges).
    #[command(after_help = "\
Examples:
  tokenscope record -o run.tsrec                       # everything, until Ctrl-C
  tokenscope record -p $(pgrep -d' -p ' nginx) -o n.tsrec --duration 30s
  tokenscope record --port 8000 --port 443 -o api.tsrec
  tokenscope record --port 443 --libssl /opt/app/lib/libssl.so.3 -o tls.tsrec
  tokenscope record --port 443 --tls off -o tls.tsrec  # TLS timed by record only
  tokenscope record --io-source syscall -o s.tsrec     # no kprobes, no 6.3 tracepoints
  tokenscope record --btf /var/lib/btf/$(uname -r).btf -o r.tsrec  # kernel without BTF
  tokenscope record --port 8000 --libcuda /usr/lib/x86_64-linux-gnu/libcuda.so.1 -o gpu.tsrec
  tokenscope record --netns /run/netns/gw -o gw.tsrec      # one network namespace (a pod: its pid)
  tokenscope record --port 8000 --cupti-socket /tmp/ts-cupti.sock -o gpu.tsrec
      # ...and start the engine with CUDA_INJECTION64_PATH=<tokenscope dir>/libtokenscope_cupti_hook.so
      #     TOKENSCOPE_CUPTI_SOCKET=/tmp/ts-cupti.sock

I/O source: socket I/O comes from the socket-layer tracepoints (Linux 6.3+), else kprobes on
tcp_sendmsg/tcp_cleanup_rbuf, else the syscall tracepoints alone (--io-source forces one);
the first lines and the report name the one used. A kernel without BTF needs --btf FILE.

Filters: -p limits socket I/O and accepts to those processes; TCP state changes and
retransmits run in the kernel's softirq, outside any process, so only --port filters them.
--netns keeps one network namespace's sockets (by the socket's namespace, softirq included)
and its processes' uprobes: one pod of a node, or one 'host' of a test machine; record each
host and join them with `tokenscope report A.tsrec B.tsrec`. tokenscope never records its
own sockets. Ctrl-C or SIGTERM ends the recording cleanly:
the file is sealed with final counters (submitted, delivered, dropped).

TLS: with --tls auto (the default) uprobes on OpenSSL's SSL_read/SSL_write read the
plaintext of every process using the system's libssl (nginx, curl, python, ...), tied to
the socket of the syscall inside each call, so HTTP/1.1 and HTTP/2 over TLS are timed per
token. Stacks without those symbols (Go crypto/tls, rustls, stripped BoringSSL) are timed
by TLS record only. Plaintext goes through the same redaction as socket payloads.")]
    Record(RecordArgs),
    /// Print a recording, one line per event.
    #[command(after_help = "\
Examples:
  tokenscope dump run.tsrec
  tokenscope dump run.tsrec --limit 50

Each line: monotonic time, pid/comm ('-' when the kernel ran it outside any process),
source > destination, and what happened: state changes, accepts, retransmits, and sends/
receives with their syscall, byte count and what the payload prefix showed (HTTP start
line with framing headers, or TLS record types such as ClientHello / application_data).")]
    Dump(DumpArgs),
    /// Per-request timelines and TTFT/ITL statistics from a recording.
    #[command(after_help = "\
Examples:
  tokenscope report run.tsrec
  tokenscope report run.tsrec --json > report.json   # schema: schema/report.schema.json
  tokenscope report run.tsrec --json --tokens       # with every token's time (~20 B a token)
  tokenscope report run.tsrec --slo ttft_p95=300ms --slo itl_p99=50ms   # exit 1 if violated
  tokenscope report run.tsrec --what-if 2,3      # TTFT/ITL if buffering and gzip were off
  tokenscope report run.tsrec --what-if all      # every fix the diagnoses name
  tokenscope report gateway.tsrec gpu.tsrec      # two hosts' recordings, one timeline

Several recordings (one per host: gateway, GPU host) are joined into one timeline. Each host's
clock is put on the first one's from the connections both recorded (joined by 4-tuple, each
seen from its start): every byte one end sent and the other read bounds the offset, and the
tightest bounds give it with its uncertainty, printed first. Hosts of the same boot share a
clock; hosts with no connection in common fall back to the wall clocks (as good as NTP) and
are reported side by side. The hop between hosts is 'gateway -> engine network'. NAT, load
balancers that rewrite the 4-tuple and asymmetric routes defeat the join or bias the offset
(see the README's limits).

Diagnoses: eleven rules name a fix with its evidence (requests, figures) and an estimated
saving of TTFT p95 / ITL p99: new connection per request, proxy buffering, gzip on event
streams, no prefix cache, prefill stalling decodes, queueing, Nagle/delayed ACK, retransmits,
slow client, GPU throttling, and (for engines without a GPU source) requests waiting for an
engine slot. Causes that overlap are estimated together and shared out (see the README).

Definitions (as vllm bench serve): a request starts at the client's connect() when the
connection was opened for it, else at its first request byte, so TTFT includes handshakes as
a user feels them; 'from first request byte' is the server-side TTFT. The first token is the
first SSE data event whose JSON carries a non-empty choices array. TTFT and ITL are given at
every observation point the response crossed: engine write, proxy read, proxy write, client
read. ITL: the gap between consecutive token events at one point, one sample per gap, pooled
over requests; events that arrive in the same read count as gap 0 (coalescing). TPOT:
(last - first token) / (tokens - 1) per request. Percentiles interpolate linearly (as
numpy and vllm bench serve), with counts.")]
    Report(ReportArgs),
    /// Write a recording as a Perfetto trace, to open in ui.perfetto.dev.
    #[command(after_help = "\
Examples:
  tokenscope export run.tsrec -o run.pftrace
  tokenscope export day.tsrec -o day.pftrace --window 5m   # fewer, longer windows
  tokenscope export gateway.tsrec gpu.tsrec -o joined.pftrace   # two hosts, one timeline
  tokenscope export run.tsrec -o run.pftrace --uncompressed   # no compressed_packets

Open https://ui.perfetto.dev and drop the file on it (it stays in the browser). Tracks: a
process per traced process; under it a track per request (stages nested: connect, tls,
upload, gateway, queue, prefill, decode) with a child track per observation point holding
one instant per token, flows linking each token from engine write to client read; a track
per connection end; GPU steps, CUPTI kernels and NVML counters when recorded; counters for
in-flight requests, engine queue depth, tokens/s and ring-buffer drops; a 'tokenscope
diagnoses' track with one row per diagnosis (its evidence's time span, finding, fix and cited
requests), and a 'cited by' instant on each cited request. See the README.")]
    Export(ExportArgs),
    /// Two runs side by side: what a change did to TTFT, ITL, stages and diagnoses.
    #[command(after_help = "\
Examples:
  tokenscope diff before.tsrec after.tsrec
  tokenscope diff last-week.json today.tsrec          # a kept `report --json` and a recording
  tokenscope diff before.tsrec after.tsrec --json > diff.json

Each side is a recording or a JSON report (`tokenscope report --json`, gzipped or not).
Overall and per route: requests, new connections, coalesced and truncated responses; TTFT
p50/p95/p99 and ITL p50/p99 at every observation point; each stage's p50/p95; TPOT. A '*'
marks a figure that moved by 10% or more (and 1 ms or more for times). Routes match by
address, else by path (the engine's port changes between runs). Diagnoses: gone (fixed, with
the saving estimated before), new, or kept.")]
    Diff(DiffArgs),
    /// The live terminal view: requests, TTFT and ITL per hop, as they happen (or a replay).
    #[command(after_help = tokenscope_tui::AFTER_HELP)]
    Top(tokenscope_tui::TopArgs),
    /// Always on: Prometheus metrics and OTLP traces of every stream, rotating recordings.
    #[command(after_help = crate::agent_cli::AFTER_HELP)]
    Agent(crate::agent_cli::AgentArgs),
}

#[derive(Args, Debug)]
struct ReportArgs {
    /// Files written by `tokenscope record`: one, or one per host to join.
    #[arg(required = true, num_args = 1.., value_name = "FILE")]
    files: Vec<PathBuf>,
    /// Print JSON (one document) instead of text.
    #[arg(long)]
    json: bool,
    /// An objective to check, e.g. ttft_p95=300ms or itl_p99=50ms (repeatable). Exit
    /// status: 0 all met, 1 one or more violated (listed with their top diagnoses),
    /// 2 the recording could not be read.
    #[arg(long = "slo", value_name = "METRIC_STAT=DURATION")]
    slos: Vec<collector::diagnose::Slo>,
    /// Re-time the recorded requests as if these rules' fixes were applied (numbers or
    /// keys, comma-separated, or `all` for every rule that fired) and print predicted
    /// TTFT p50/p95 and ITL mean/p99 next to the recorded ones.
    #[arg(long = "what-if", value_name = "RULE[,RULE..]")]
    what_if: Option<collector::diagnose::Selection>,
    /// With --json: list every request's per-token arrays (each point's token times,
    /// each hop's delay per token, each stalled gap) instead of their summaries (about
    /// 20 bytes a token, where a summed-up request is 1-2 KB).
    #[arg(long, requires = "json")]
    tokens: bool,
}

#[derive(Args, Debug)]
struct DiffArgs {
    /// The run before the change: a recording or a JSON report.
    before: PathBuf,
    /// The run after it.
    after: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct ExportArgs {
    /// Files written by `tokenscope record`: one, or one per host to join.
    #[arg(required = true, num_args = 1.., value_name = "FILE")]
    files: Vec<PathBuf>,
    /// The Perfetto trace to write (e.g. run.pftrace).
    #[arg(short, long, value_name = "FILE")]
    output: PathBuf,
    /// Lay out and write the trace in windows this long, each its own packet sequence
    /// (what begins in a window is written with it, once nothing in flight began in
    /// it). Request ids run across windows; diagnoses are each window's.
    #[arg(long, value_parser = collector::duration::parse, default_value = "60s", value_name = "D")]
    window: Duration,
    /// Write every packet at the top level of the file instead of in deflated bundles
    /// (TracePacket.compressed_packets, which ui.perfetto.dev, trace processor and its
    /// Python bindings expand): about four times the bytes, for readers that decode the
    /// protobuf themselves.
    #[arg(long)]
    uncompressed: bool,
}

#[derive(Args, Debug)]
struct RecordArgs {
    #[command(flatten)]
    probes: ProbeArgs,
    /// Stop after this long (e.g. 500ms, 10s, 2m); default: until Ctrl-C.
    #[arg(short, long, value_parser = collector::duration::parse, value_name = "D")]
    duration: Option<Duration>,
    /// The recording to write (a name ending in .pftrace writes a Perfetto trace instead,
    /// keeping the recording beside it as FILE.tsrec for replay).
    #[arg(short, long, value_name = "FILE")]
    output: PathBuf,
    /// Output format; default: from the extension (.pftrace: perfetto).
    #[arg(long, value_enum)]
    format: Option<OutputFormat>,
    /// Print the report (as `tokenscope report`) when the recording ends.
    #[arg(long)]
    report: bool,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum OutputFormat {
    /// tokenscope's record file (replay with report, dump, export, top --replay).
    Record,
    /// A Perfetto trace (ui.perfetto.dev), exported when the recording ends.
    Perfetto,
}

#[derive(Args, Debug)]
struct DumpArgs {
    /// A file written by `tokenscope record`.
    file: PathBuf,
    /// Print at most this many events.
    #[arg(long, value_name = "N")]
    limit: Option<u64>,
}

pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    if matches!(
        cli.command,
        Command::Report(_) | Command::Export(_) | Command::Diff(_) | Command::Dump(_)
    ) {
        keep_freed_memory_for_reuse();
    }
    match cli.command {
        Command::Record(args) => record(args),
        Command::Report(args) if args.slos.is_empty() => report(&args),
        Command::Report(args) => {
            // A gate tells "violated" (1) from "could not tell" (2).
            report(&args).or_else(|e| {
                eprintln!("tokenscope: error: {e:#}");
                Ok(ExitCode::from(2))
            })
        }
        Command::Export(args) => export(&args),
        Command::Diff(args) => diff(&args),
        Command::Top(args) => tokenscope_tui::run_top(args).map(|()| ExitCode::SUCCESS),
        Command::Agent(args) => crate::agent_cli::agent(args),
        Command::Dump(args) => {
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::new(stdout.lock());
            match collector::export::dump::dump(&args.file, args.limit, &mut out) {
                Err(collector::export::dump::DumpError::Output(e))
                    if e.kind() == std::io::ErrorKind::BrokenPipe => {}
                other => {
                    other?;
                }
            }
            let _ = out.flush();
            Ok(ExitCode::SUCCESS)
        }
    }
}

struct Progress {
    gpu_note: Option<&'static str>,
}

impl RecordObserver for Progress {
    fn note(&mut self, line: &str) {
        eprintln!("tokenscope: {line}");
    }

    fn started(&mut self, probes: &Probes) {
        if let Some(note) = self.gpu_note {
            eprintln!("tokenscope: {note}");
        }
        eprintln!("tokenscope: {}", probes.io_source_line());
        eprintln!(
            "tokenscope: recording: {} probes attached; Ctrl-C to stop",
            probes.attached.len()
        );
        for s in &probes.skipped {
            eprintln!("tokenscope: probe skipped: {s}");
        }
    }
}

fn record(args: RecordArgs) -> anyhow::Result<ExitCode> {
    let perfetto = args.format == Some(OutputFormat::Perfetto)
        || (args.format.is_none() && args.output.extension().is_some_and(|e| e == "pftrace"));
    // A trace is exported from the recording once it ends; the recording stays for replay.
    let recording = if perfetto {
        append_ext(&args.output, "tsrec")
    } else {
        args.output.clone()
    };
    let (opts, gpu_note) = args.probes.record_options(
        args.duration,
        collector::record::sink::Output::File(recording.clone()),
    );
    let header = collector::record::run(&opts, &mut Progress { gpu_note }).context("record")?;
    let c = header.counters.unwrap_or_default();
    eprintln!(
        "tokenscope: wrote {}: {} events (submitted {}, delivered {}, dropped {}, undecodable {})",
        recording.display(),
        c.written,
        c.submitted,
        c.delivered,
        c.dropped,
        c.decode_errors
    );
    if c.dropped > 0 {
        eprintln!("tokenscope: warning: {} events were dropped (ring buffer full); try a larger --ring-size", c.dropped);
    }
    if perfetto {
        export(&ExportArgs {
            files: vec![recording.clone()],
            output: args.output.clone(),
            window: Duration::from_secs(60),
            uncompressed: false,
        })?;
    }
    if args.report {
        report(&ReportArgs {
            files: vec![recording],
            json: false,
            slos: Vec::new(),
            what_if: None,
            tokens: false,
        })?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `run.pftrace` -> `run.pftrace.tsrec`.
fn append_ext(path: &std::path::Path, ext: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".");
    s.push(ext);
    PathBuf::from(s)
}

fn diff(args: &DiffArgs) -> anyhow::Result<ExitCode> {
    use collector::export::diff;
    let before = diff::load(&args.before)?;
    let after = diff::load(&args.after)?;
    let label = |p: &std::path::Path| p.display().to_string();
    let d = diff::compare(
        (&label(&args.before), &before),
        (&label(&args.after), &after),
    );
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let written = if args.json {
        diff::write_json(&d, &mut out)
    } else {
        diff::write_text(&d, &mut out)
    };
    match written.and_then(|_| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e).context("writing the diff"),
        _ => Ok(ExitCode::SUCCESS),
    }
}

fn report(args: &ReportArgs) -> anyhow::Result<ExitCode> {
    use collector::export::report;
    let json = args.json;
    let (mut reader, hosts) = open_recordings(&args.files)?;
    // Streamed: a batch of events at a time through the pipeline, never all at once;
    // requests are summed up and let go (JSON: written aside) as their window closes.
    let keep = match (json, args.tokens) {
        (true, false) => report::Requests::Spill,
        (true, true) => report::Requests::SpillWithTokens,
        (false, _) => report::Requests::Drop,
    };
    let mut builder = report::Builder::new(reader.header(), &args.slos, keep).hosts(hosts);
    if let Some(selection) = &args.what_if {
        builder = builder.what_if(selection.clone());
    }
    builder.push_all(&mut reader)?;
    let built = builder.try_finish().context("building the report")?;
    let code = if built.slo.iter().all(|r| r.met) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    };
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let written = if json {
        report::write_json(&built, &mut out)
    } else {
        report::write_text(&built, &mut out)
    };
    match written.and_then(|_| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(e).context("writing the report")
        }
        _ => Ok(code),
    }
}

/// One recording, or several hosts' joined on one clock (and how each was aligned),
/// read ahead on their own thread (`ReadAhead`) while the caller replays.
fn open_recordings(
    files: &[PathBuf],
) -> anyhow::Result<(ReadAhead, Vec<collector::ingest::hosts::Host>)> {
    let (source, hosts) = open_sources(files)?;
    let reader = ReadAhead::spawn(source).context("starting the reading thread")?;
    Ok((reader, hosts))
}

fn open_sources(
    files: &[PathBuf],
) -> anyhow::Result<(
    Box<dyn collector::ingest::record::Source + Send>,
    Vec<collector::ingest::hosts::Host>,
)> {
    use collector::ingest::hosts::{Joined, MAX_HOSTS};
    match files {
        [one] => Ok((
            Box::new(collector::ingest::record::RecordReader::open(one)?),
            Vec::new(),
        )),
        _ if files.len() > MAX_HOSTS => {
            anyhow::bail!(
                "{} recordings: at most {MAX_HOSTS} can be joined",
                files.len()
            )
        }
        _ => {
            let joined = Joined::open(files)?;
            let hosts = joined.hosts.clone();
            Ok((Box::new(joined), hosts))
        }
    }
}

fn export(args: &ExportArgs) -> anyhow::Result<ExitCode> {
    use collector::export::perfetto::{
        write_trace_streamed, Compression, PerfettoError, Windowing,
    };
    let output = &args.output;
    let (mut reader, hosts) = open_recordings(&args.files)?;
    for line in collector::ingest::hosts::describe(&hosts) {
        eprintln!("{}: {line}", output.display());
    }
    let file = collector::ingest::record::create_private(output)
        .with_context(|| format!("creating {}", output.display()))?;
    let windowing = Windowing {
        window_ns: args.window.as_nanos().max(1) as u64,
    };
    let compression = if args.uncompressed {
        Compression::None
    } else {
        Compression::Deflate
    };
    let file = std::io::BufWriter::new(file);
    let s = match write_trace_streamed(&mut reader, file, windowing, compression) {
        Ok(s) => s,
        Err(e) => {
            // Windows already written would make a trace that silently ends early.
            let _ = std::fs::remove_file(output);
            return match e {
                // The recording's own error names its file.
                PerfettoError::Record(e) => Err(e.into()),
                e => Err(e).with_context(|| format!("{}", output.display())),
            };
        }
    };
    let deflated = if s.bundles > 0 {
        format!(
            " (deflated in {} bundle{} from {} bytes)",
            s.bundles,
            if s.bundles == 1 { "" } else { "s" },
            s.uncompressed_bytes
        )
    } else {
        String::new()
    };
    eprintln!(
        "{}: {} requests, {} token events ({:.1} B each before compression), {} GPU steps, {} flows; {} packets, {} bytes{deflated}, {} window{}",
        output.display(),
        s.request_tracks,
        s.token_instants,
        s.token_bytes as f64 / s.token_instants.max(1) as f64,
        s.gpu_steps,
        s.flows,
        s.packets,
        s.bytes,
        s.windows,
        if s.windows == 1 { "" } else { "s" }
    );
    if s.late_events > 0 {
        eprintln!(
            "{}: {} events came later than the replay's reorder window (used out of order)",
            output.display(),
            s.late_events
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// A replay's reading thread allocates each frame's events (~370 KB) and the main thread
/// frees them a moment later: with glibc's default, moving thresholds, a freed heap's
/// top was handed back to the kernel and faulted in again for the next frame (9,400 page
/// faults and 0.45 s instead of 2,600 and 0.28 s for a replay of 1.08 M events). Memory
/// freed by a one-shot command is kept for reuse: up to 64 MiB at the heap's top, and
/// blocks under 4 MiB come from the heap (peak RSS there 16 -> 17 MiB).
///
/// The heap is left in 4 KiB pages. Marking it for transparent huge pages (3172932) made
/// back-to-back replays ~5% faster, but in a VM whose balloon reports free memory to the
/// host (free page reporting, as on these Firecracker machines) a huge page comes from a
/// 2 MiB block the host has taken back, and the host must fault all of it in again: 24
/// MiB touched in huge pages took 2.3 ms right after the same was freed and 114-138 ms
/// five seconds later (4 KiB pages: 12-18 ms either way). A replay touched 6 huge pages,
/// so a `report` run once, after a pause, as an SRE runs it, paid for them: the bench
/// recording's one-core `report` five seconds after the last run, 16 rounds
/// interleaved, median 192.3 ms with huge pages and 141.5 ms without (paired ratio
/// 0.74); back to back, 15 rounds, 114.9 and 123.4 ms (1.06).
fn keep_freed_memory_for_reuse() {
    // SAFETY: mallopt only sets glibc's allocation parameters; called before any thread.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 4 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 64 << 20);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
