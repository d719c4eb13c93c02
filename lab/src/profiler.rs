//! The lab recorded by the profiler: `tokenscope-lab demo` and `scenario -o`. A
//! `tokenscope` child watches the engine's and the proxy's ports while the bench runs
//! (in this process, so the recorder's self-exclusion does not hide it): on a
//! terminal it is `tokenscope top` (live, until you quit it), otherwise
//! `tokenscope record`. Either way the report is printed beside the bench's own.
//! The profiler is a separate binary (it ships without the lab), found by
//! [`profiler_binary`].

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, ChildStderr, Command, Stdio};

use anyhow::Context;
use collector::diagnose::Diagnosis;
use collector::export::report;
use collector::ingest::record::RecordReader;

use crate::demo::{DemoObserver, DemoOutcome};

/// Names the profiler binary to record with, over the default search.
pub const PROFILER_ENV: &str = "TOKENSCOPE_BIN";

/// The `tokenscope` binary the lab records with: `$TOKENSCOPE_BIN`, else the one
/// beside this binary (cargo builds both into one directory), else `tokenscope` on
/// the PATH.
pub fn profiler_binary() -> PathBuf {
    if let Some(path) = std::env::var_os(PROFILER_ENV) {
        return PathBuf::from(path);
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join("tokenscope")))
        .filter(|sibling| sibling.is_file())
        .unwrap_or_else(|| PathBuf::from("tokenscope"))
}

pub struct RecordingObserver {
    dir: PathBuf,
    recorder: Option<(Child, BufReader<ChildStderr>, PathBuf)>,
    /// On a terminal: the `tokenscope top` child and the recording it keeps.
    top: Option<(Child, PathBuf)>,
    interactive: bool,
    problem: Option<String>,
    /// Each side's diagnoses (untuned, tuned), once its recording was read.
    diagnoses: [Option<Vec<Diagnosis>>; 2],
    /// Record into this file (both sides, in turn) instead of the scratch directory.
    output: Option<PathBuf>,
    /// More `tokenscope record` arguments (e.g. --nvml-lib).
    extra: Vec<std::ffi::OsString>,
}

impl RecordingObserver {
    pub fn new() -> std::io::Result<Self> {
        let dir = std::env::temp_dir().join(format!("tokenscope-demo-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        // SAFETY: isatty has no preconditions.
        let interactive = unsafe { libc::isatty(0) == 1 && libc::isatty(1) == 1 };
        Ok(RecordingObserver {
            dir,
            recorder: None,
            top: None,
            interactive,
            problem: None,
            diagnoses: [None, None],
            output: None,
            extra: Vec::new(),
        })
    }

    /// Records into `output` with `tokenscope record` (never top) and these extra arguments.
    pub fn to_file(output: PathBuf, extra: Vec<std::ffi::OsString>) -> std::io::Result<Self> {
        let mut o = RecordingObserver::new()?;
        o.interactive = false;
        o.output = Some(output);
        o.extra = extra;
        Ok(o)
    }

    /// Where one side's recording goes.
    fn side_path(&self, tuned: bool) -> PathBuf {
        if let Some(path) = &self.output {
            return path.clone();
        }
        self.dir.join(if tuned {
            "tuned.tsrec"
        } else {
            "untuned.tsrec"
        })
    }

    /// `tokenscope SUBCOMMAND` watching the engine's and the proxy's ports into this
    /// side's recording, and that recording's path.
    fn watcher(&self, sub: &str, tuned: bool, ports: [u16; 2]) -> (Command, PathBuf) {
        let path = self.side_path(tuned);
        let mut cmd = Command::new(profiler_binary());
        cmd.arg(sub);
        for port in ports {
            cmd.args(["--port", &port.to_string()]);
        }
        cmd.arg("-o").arg(&path).args(&self.extra);
        (cmd, path)
    }

    fn start_top(&mut self, tuned: bool, ports: [u16; 2]) -> Result<(), String> {
        let (mut cmd, path) = self.watcher("top", tuned, ports);
        let child = cmd.spawn().map_err(|e| spawn_error("top", &e))?;
        // Start the load once top's probes are attached: its recording's header lists them.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !RecordReader::open(&path).is_ok_and(|r| !r.header.probes.is_empty()) {
            if std::time::Instant::now() > deadline {
                return Err("tokenscope top did not attach its probes within 20 s".into());
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        self.top = Some((child, path));
        Ok(())
    }

    fn start(&mut self, tuned: bool, ports: [u16; 2]) -> Result<(), String> {
        let (mut cmd, path) = self.watcher("record", tuned, ports);
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| spawn_error("record", &e))?;
        let mut err = BufReader::new(child.stderr.take().expect("stderr is piped"));
        let mut line = String::new();
        loop {
            line.clear();
            match err.read_line(&mut line) {
                Ok(0) | Err(_) => {
                    let _ = child.wait();
                    return Err(line.trim().to_string());
                }
                Ok(_) if line.contains("recording:") => break,
                Ok(_) if line.contains("error") => {
                    let _ = child.wait();
                    return Err(line.trim().to_string());
                }
                Ok(_) => {}
            }
        }
        self.recorder = Some((child, err, path));
        Ok(())
    }
}

impl DemoObserver for RecordingObserver {
    fn ready(&mut self, tuned: bool, engine: SocketAddr, proxy: SocketAddr) {
        let ports = [engine.port(), proxy.port()];
        self.problem = if self.interactive {
            self.start_top(tuned, ports)
        } else {
            self.start(tuned, ports)
        }
        .err();
    }

    fn takes_terminal(&self) -> bool {
        self.interactive
    }

    fn finished(&mut self, tuned: bool) -> Option<String> {
        if let Some(problem) = self.problem.take() {
            return Some(format!("tokenscope did not record this side: {problem}\n"));
        }
        if let Some((mut child, path)) = self.top.take() {
            // The load is over; top stays up until it is quit (q), then the report.
            return match child.wait() {
                Ok(s) if s.success() => Some(self.profile(tuned, &path)),
                other => Some(format!("tokenscope top ended with {other:?}\n")),
            };
        }
        let (mut child, mut err, path) = self.recorder.take()?;
        // SAFETY: kill(2) on our own child; SIGINT seals the recording.
        unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut rest);
        match child.wait() {
            Ok(s) if s.success() => {}
            other => {
                return Some(format!(
                    "tokenscope record failed ({other:?}): {}\n",
                    rest.trim()
                ))
            }
        }
        Some(self.profile(tuned, &path))
    }

    fn compared(&mut self, untuned: &DemoOutcome, tuned: &DemoOutcome) -> Option<String> {
        let found = self.diagnoses[0].as_ref()?;
        let measured = untuned.bench.report.ttft_ms.p95 - tuned.bench.report.ttft_ms.p95;
        let classic: Vec<&Diagnosis> = found.iter().filter(|d| d.rule <= 5).collect();
        let mut out = String::from(
            "\ntokenscope's diagnoses of the untuned side, rules 1-5 (the seed article's fixes):\n",
        );
        let mut sum = 0.0;
        for d in &classic {
            let ms = d.saving.ttft_p95_ns.unwrap_or(0) as f64 / 1e6;
            sum += ms;
            let itl = d
                .saving
                .itl_p99_ns
                .map(|n| format!(", ~{:.0} ms of ITL p99", n as f64 / 1e6))
                .unwrap_or_default();
            out += &format!(
                "  [{}] {:<28} ~{ms:>7.0} ms of TTFT p95{itl}\n",
                d.rule, d.title
            );
        }
        out += &format!(
            "  estimated saving, summed: {sum:.0} ms of TTFT p95; measured untuned - tuned (bench): \
             {measured:.0} ms ({:.0}%)\n",
            if measured > 0.0 { sum / measured * 100.0 } else { 0.0 }
        );
        if let Some(t) = &self.diagnoses[1] {
            let left: Vec<String> = t
                .iter()
                .filter(|d| d.rule <= 5)
                .map(|d| format!("[{}] {}", d.rule, d.title))
                .collect();
            out += &format!(
                "  tuned side: {}\n",
                if left.is_empty() {
                    "none of rules 1-5".to_string()
                } else {
                    left.join(", ")
                }
            );
        }
        Some(out)
    }
}

impl RecordingObserver {
    /// The report of one side's recording; keeps its diagnoses for the comparison.
    fn profile(&mut self, tuned: bool, path: &std::path::Path) -> String {
        match profile(path) {
            Ok((text, diagnoses)) => {
                self.diagnoses[usize::from(tuned)] = Some(diagnoses);
                text
            }
            Err(e) => format!("reading the recording {}: {e}\n", path.display()),
        }
    }
}

fn profile(path: &std::path::Path) -> anyhow::Result<(String, Vec<Diagnosis>)> {
    let mut reader = RecordReader::open(path)?;
    let events = reader.read_all()?;
    let built = report::build(&reader.header, &events);
    let mut text = format!(
        "tokenscope's view of the same run (recording: {}):\n",
        path.display()
    );
    let mut buf = Vec::new();
    report::write_text(&built, &mut buf)?;
    text.push_str(&String::from_utf8_lossy(&buf));
    Ok((text, built.diagnoses))
}

/// `tokenscope-lab scenario NAME -o FILE`: the scenario, recorded, then its report.
pub fn scenario_recorded(args: crate::cli::ScenarioArgs) -> anyhow::Result<()> {
    let output = args
        .output
        .clone()
        .context("a scenario to record needs -o FILE")?;
    let scratch = tempfile::tempdir().context("scratch directory")?;
    let mut extra = Vec::new();
    if let Some(script) = args.name.nvml_script() {
        let lib = nvml_sampler::standin::scripted_copy(scratch.path(), script)
            .context("writing the scripted NVML stand-in")?;
        extra.extend(["--nvml-lib".into(), lib.into_os_string()]);
        extra.extend(["--nvml-interval".into(), "50ms".into()]);
    }
    let mut observer = RecordingObserver::to_file(output, extra).context("scratch directory")?;
    let rt = crate::cli::runtime()?;
    let out = rt
        .block_on(crate::scenario::run(args.name, &mut observer))
        .with_context(|| format!("scenario {}", args.name))?;
    println!("{}: {}\n{}", args.name, args.name.describe(), out.summary);
    if let Some(profile) = &out.profile {
        print!("{profile}");
    }
    Ok(())
}

/// Why the profiler could not be started, with where it was looked for.
fn spawn_error(sub: &str, e: &std::io::Error) -> String {
    format!(
        "starting {} {sub}: {e} (build it with `cargo build --bin tokenscope`, or name it in ${PROFILER_ENV})",
        profiler_binary().display()
    )
}
