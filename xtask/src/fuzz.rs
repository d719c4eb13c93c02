//! `cargo xtask fuzz`: the coverage-guided fuzz targets of fuzz/ (libFuzzer, through
//! libfuzzer-sys on stable Rust). The fuzz crate is built with SanitizerCoverage
//! flags into a target directory of its own (the flags would otherwise invalidate
//! the main build), each target runs on a scratch copy of its committed seed corpus,
//! and crashes land in `<target>/fuzz/artifacts/<name>/`.
//!
//! `cargo xtask test` runs every target for [`CI_SECONDS`] and the planted-bug check.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Instant;

use anyhow::{bail, Context, Result};

const HELP: &str = "\
usage: cargo xtask fuzz [TARGET...] [--time S] [--jobs N]
       cargo xtask fuzz --planted [--time S]
       cargo xtask fuzz --ci
       cargo xtask fuzz --write-seeds

Builds the fuzz targets (fuzz/, coverage-instrumented, into <target>/fuzz) and runs
each for S seconds on a scratch copy of its seed corpus (fuzz/corpus/TARGET; the tree
is never written). Prints a line per target as it ends, then a table. Exits non-zero
on a crash, naming the input that caused it and the command that replays it.

options:
  TARGET         run only these (default: all); see the list below
  --time S       seconds per target (default 30)
  --jobs N       targets run at once (default: the number of CPUs)
  --planted      build with a bug planted in the TLS parser (an unchecked length) and
                 succeed only if the tls target finds it within S seconds
  --ci           what `cargo xtask test` runs: every target briefly, two at once, then
                 the planted bug
  --write-seeds  regenerate fuzz/corpus with fuzz/examples/seeds.rs (the real encoders)

examples:
  cargo xtask fuzz                       every target, 30 s each, as many at once as CPUs
  cargo xtask fuzz stream h2 --time 600  ten minutes on the whole stream decoder and HTTP/2
  cargo xtask fuzz --planted --time 60   does the fuzzer still find a planted bug?

A crash's input is kept in <target>/fuzz/artifacts/TARGET/; replay it with
`<target>/fuzz/<triple>/release/TARGET <input>` (the panic and its backtrace print).
Build profile (fuzz/Cargo.toml): opt-level 3 with overflow checks and debug assertions.

targets:";

/// Every target (a `[[bin]]` of fuzz/Cargo.toml with a corpus in fuzz/corpus/) and
/// what it reads.
const TARGETS: &[(&str, &str)] = &[
    (
        "http_head",
        "HTTP/1 request and response heads, HTTP/2 fields as heads",
    ),
    (
        "chunked",
        "HTTP/1 body framing: chunked and Content-Length, cut and skipped",
    ),
    ("sse", "SSE and NDJSON splitting, whole vs cut"),
    ("shape", "the API shape classifier (one event's JSON)"),
    ("gzip", "gzip-encoded event streams inflated to the limit"),
    ("tls", "TLS record headers"),
    (
        "h2",
        "HTTP/2 framing and HPACK, client, server or joined mid-connection",
    ),
    ("hpack", "HPACK header blocks through one decoder"),
    (
        "stream",
        "the whole per-direction stream decoder over cut I/Os",
    ),
    (
        "ring_record",
        "ring-buffer records, alone and through the protocol decoder",
    ),
    ("record_file", "the record file reader"),
    (
        "record_batch",
        "a record file's batch: the reader's own decoder against prost",
    ),
    ("cupti_wire", "the CUPTI hook's wire format"),
    ("duration_slo", "duration and SLO arguments"),
];

/// Seconds per target in `cargo xtask test`: a smoke run of every target on the
/// committed seeds and what it finds in that time (100 thousand to 3 million inputs;
/// exec/s vary 30-fold by target); longer runs belong to `cargo xtask fuzz`. Measured
/// cold on two shared cores at 15 s: 243 s for the stage, of which the build 99 s, 13
/// targets two at a time 111 s, the planted build and run 33 s; 6 s saves a minute of
/// the CI's 30.
const CI_SECONDS: u64 = 6;
/// Targets at once in `cargo xtask test` (the CI machines have two cores).
const CI_JOBS: usize = 2;
/// The planted bug's budget in `cargo xtask test` (found in seconds when the fuzzer works).
const CI_PLANTED_SECONDS: u64 = 30;

/// SanitizerCoverage as cargo-fuzz sets it up: edge counters, the PC table libFuzzer
/// reads them by, and comparison tracing (to get past magic bytes and lengths).
const RUSTFLAGS: &str = "-Cpasses=sancov-module \
-Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
-Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares";
/// The target the planted bug is in, and the file its panic names.
const PLANTED_TARGET: &str = "tls";
const PLANTED_FILE: &str = "protocol/tls.rs";

struct Options {
    targets: Vec<&'static str>,
    seconds: u64,
    jobs: usize,
    planted: bool,
    ci: bool,
    write_seeds: bool,
}

pub(crate) fn run(args: &[String]) -> Result<()> {
    let Some(opts) = parse(args)? else {
        println!("{HELP}");
        for (name, what) in TARGETS {
            println!("  {name:<13} {what}");
        }
        return Ok(());
    };
    if opts.ci {
        return ci();
    }
    let fuzz = Fuzz::new()?;
    if opts.write_seeds {
        return fuzz.write_seeds();
    }
    if opts.planted {
        return fuzz.planted(opts.seconds);
    }
    fuzz.build(false)?;
    fuzz.run_targets(&opts.targets, opts.seconds, opts.jobs)
}

/// The stage of `cargo xtask test`: every target for [`CI_SECONDS`], then the planted bug.
pub(crate) fn ci() -> Result<()> {
    let started = Instant::now();
    let fuzz = Fuzz::new()?;
    fuzz.build(false)?;
    let names: Vec<&str> = TARGETS.iter().map(|(n, _)| *n).collect();
    let result = fuzz.run_targets(&names, CI_SECONDS, CI_JOBS);
    // The planted check runs even after a crash: both verdicts are worth a run.
    let planted = fuzz.planted(CI_PLANTED_SECONDS);
    println!("xtask: fuzz stage took {:.0?}", started.elapsed());
    result.and(planted)
}

/// `None`: help was asked for.
fn parse(args: &[String]) -> Result<Option<Options>> {
    let mut opts = Options {
        targets: Vec::new(),
        seconds: 30,
        jobs: std::thread::available_parallelism().map_or(1, |n| n.get()),
        planted: false,
        ci: false,
        write_seeds: false,
    };
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut value = |flag: &str| -> Result<u64> {
            let v = args
                .next()
                .with_context(|| format!("{flag} needs a number"))?;
            v.parse()
                .ok()
                .filter(|n| *n > 0)
                .with_context(|| format!("{flag} {v}: expected a positive whole number"))
        };
        match arg.as_str() {
            "-h" | "--help" | "help" => return Ok(None),
            "--time" => opts.seconds = value("--time")?,
            "--jobs" => opts.jobs = usize::try_from(value("--jobs")?)?,
            "--planted" => opts.planted = true,
            "--ci" => opts.ci = true,
            "--write-seeds" => opts.write_seeds = true,
            flag if flag.starts_with('-') => bail!("unknown option {flag} (see --help)"),
            name => match TARGETS.iter().find(|(n, _)| *n == name) {
                Some((n, _)) => opts.targets.push(n),
                None => bail!("unknown fuzz target '{name}' (see --help for the list)"),
            },
        }
    }
    if opts.targets.is_empty() {
        opts.targets = TARGETS.iter().map(|(n, _)| *n).collect();
    }
    Ok(Some(opts))
}

/// Where the fuzz crate is built and run.
struct Fuzz {
    /// The fuzz crate's target directory: `<target>/fuzz`.
    dir: PathBuf,
    /// The host triple: an explicit `--target` keeps build scripts uninstrumented.
    triple: String,
}

/// What one target's run came to.
struct Outcome {
    name: &'static str,
    execs: u64,
    seconds: f64,
    seeds: usize,
    corpus: usize,
    /// `None`: it ran its time out; else what libFuzzer reported, the input, the panic.
    crash: Option<Crash>,
}

struct Crash {
    kind: String,
    input: Option<PathBuf>,
    panic: Option<String>,
}

impl Fuzz {
    fn new() -> Result<Fuzz> {
        Ok(Fuzz {
            dir: crate::target_dir().join("fuzz"),
            triple: host_triple()?,
        })
    }

    fn cargo(&self, args: &[&str]) -> Result<()> {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let manifest = crate::root().join("fuzz/Cargo.toml");
        let mut cmd = Command::new(cargo);
        cmd.args(args)
            .arg("--manifest-path")
            .arg(&manifest)
            .args(["--release", "--target", &self.triple])
            .current_dir(crate::root())
            .env("CARGO_TARGET_DIR", &self.dir)
            .env("RUSTFLAGS", RUSTFLAGS)
            // No target runs the probes: the eBPF object is not needed.
            .env("TOKENSCOPE_SKIP_BPF", "1")
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .env_remove("CARGO_MANIFEST_DIR")
            .env_remove("CARGO_MANIFEST_PATH");
        crate::run(&mut cmd)
    }

    /// Builds every target, or (`planted`) the planted bug's target with the bug in.
    fn build(&self, planted: bool) -> Result<()> {
        if which("c++").is_none() {
            bail!("libfuzzer-sys builds libFuzzer from C++: install g++ (cargo xtask setup does)");
        }
        let started = Instant::now();
        if planted {
            self.cargo(&[
                "build",
                "--bin",
                PLANTED_TARGET,
                "--features",
                "planted-bug",
            ])?;
        } else {
            self.cargo(&["build", "--bins"])?;
        }
        println!("xtask: fuzz build took {:.0?}", started.elapsed());
        Ok(())
    }

    fn binary(&self, name: &str) -> PathBuf {
        self.dir.join(&self.triple).join("release").join(name)
    }

    fn write_seeds(&self) -> Result<()> {
        self.cargo(&["build", "--example", "seeds"])?;
        let seeds = self.dir.join(&self.triple).join("release/examples/seeds");
        crate::run(&mut Command::new(seeds))?;
        println!("xtask: wrote fuzz/corpus; commit what changed");
        Ok(())
    }

    /// Runs `names` (at most `jobs` at once), prints a line for each as it ends and
    /// then a table; fails naming every crash.
    fn run_targets(&self, names: &[&'static str], seconds: u64, jobs: usize) -> Result<()> {
        println!(
            "xtask: fuzzing {} target(s) for {seconds} s each, {jobs} at once",
            names.len()
        );
        let queue = Mutex::new(names.to_vec());
        let outcomes = Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for _ in 0..jobs.min(names.len()) {
                s.spawn(|| loop {
                    let Some(name) = queue.lock().expect("queue").pop() else {
                        break;
                    };
                    let outcome = self.run_one(name, name, seconds, &self.binary(name));
                    match &outcome {
                        Ok(o) => println!("xtask: fuzz {}", o.line()),
                        Err(e) => println!("xtask: fuzz {name}: could not run: {e:#}"),
                    }
                    outcomes.lock().expect("outcomes").push((name, outcome));
                });
            }
        });
        let mut outcomes = outcomes.into_inner().expect("outcomes");
        outcomes.sort_by_key(|(name, _)| names.iter().position(|n| n == name));
        println!(
            "\n{:<13} {:>10} {:>8} {:>14}  result",
            "target", "execs", "exec/s", "corpus"
        );
        let mut failed = Vec::new();
        for (name, outcome) in &outcomes {
            match outcome {
                Ok(o) => {
                    println!("{}", o.row());
                    if let Some(c) = &o.crash {
                        failed.push(reproduce(&self.binary(name), name, c));
                    }
                }
                Err(e) => {
                    println!(
                        "{name:<13} {:>10} {:>8} {:>14}  could not run: {e:#}",
                        "-", "-", "-"
                    );
                    failed.push(format!("{name}: could not run"));
                }
            }
        }
        if !failed.is_empty() {
            bail!("fuzzing found crashes:\n  {}", failed.join("\n  "));
        }
        Ok(())
    }

    /// Runs `binary` for `seconds` on a fresh scratch copy of `name`'s seeds; its
    /// corpus and log go to `runs/<label>`, a crash's input to `artifacts/<label>`.
    fn run_one(
        &self,
        name: &'static str,
        label: &str,
        seconds: u64,
        binary: &Path,
    ) -> Result<Outcome> {
        let scratch = self.dir.join("runs").join(label);
        let corpus = scratch.join("corpus");
        if scratch.exists() {
            std::fs::remove_dir_all(&scratch)
                .with_context(|| format!("emptying {}", scratch.display()))?;
        }
        std::fs::create_dir_all(&corpus)?;
        let seeds_dir = crate::root().join("fuzz/corpus").join(name);
        let mut seeds = 0;
        for seed in std::fs::read_dir(&seeds_dir)
            .with_context(|| format!("reading {}", seeds_dir.display()))?
        {
            let seed = seed?.path();
            let file = seed.file_name().context("a seed's file name")?;
            std::fs::copy(&seed, corpus.join(file))?;
            seeds += 1;
        }
        let artifacts = self.dir.join("artifacts").join(label);
        std::fs::create_dir_all(&artifacts)?;
        let log = scratch.join("log");
        let log_file = std::fs::File::create(&log)?;
        let started = Instant::now();
        let status = Command::new(binary)
            .arg(format!("-max_total_time={seconds}"))
            .args(["-rss_limit_mb=2048", "-timeout=10", "-print_final_stats=1"])
            .arg(format!("-artifact_prefix={}/", artifacts.display()))
            .arg(&corpus)
            .stdout(log_file.try_clone()?)
            .stderr(log_file)
            .status()
            .with_context(|| format!("starting {}", binary.display()))?;
        let elapsed = started.elapsed();
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let crash = (!status.success()).then(|| crash_of(&text, &log));
        Ok(Outcome {
            name,
            execs: stat(&text, "stat::number_of_executed_units").unwrap_or(0),
            seconds: elapsed.as_secs_f64(),
            seeds,
            corpus: std::fs::read_dir(&corpus).map_or(0, |d| d.count()),
            crash,
        })
    }

    /// Builds the TLS target with the planted bug and runs it for `seconds`: the run
    /// passes only if libFuzzer reports the planted panic.
    fn planted(&self, seconds: u64) -> Result<()> {
        self.build(true)?;
        // The next ordinary build relinks the bug-free binary over this one; run a copy.
        let binary = self.dir.join("planted").join(PLANTED_TARGET);
        std::fs::create_dir_all(binary.parent().expect("a parent"))?;
        std::fs::copy(self.binary(PLANTED_TARGET), &binary)?;
        let label = format!("{PLANTED_TARGET}-planted");
        let o = self.run_one(PLANTED_TARGET, &label, seconds, &binary)?;
        match &o.crash {
            Some(c) if c.panic.as_deref().is_some_and(|p| p.contains(PLANTED_FILE)) => {
                println!(
                    "xtask: fuzz --planted: found the planted bug in {:.1} s ({} execs): {}",
                    o.seconds,
                    o.execs,
                    c.panic.as_deref().unwrap_or_default()
                );
                Ok(())
            }
            Some(c) => bail!(
                "the planted run crashed, but not on the planted bug: {}",
                reproduce(&binary, PLANTED_TARGET, c)
            ),
            None => bail!(
                "the fuzzer did not find the planted bug in {seconds} s ({} execs)",
                o.execs
            ),
        }
    }
}

impl Outcome {
    fn result(&self) -> String {
        match &self.crash {
            None => "ok".into(),
            Some(c) => match &c.panic {
                Some(p) => format!("{}: {p}", c.kind),
                None => c.kind.clone(),
            },
        }
    }

    fn line(&self) -> String {
        format!(
            "{}: {} execs in {:.0} s, corpus {} -> {}: {}",
            self.name,
            self.execs,
            self.seconds,
            self.seeds,
            self.corpus,
            self.result()
        )
    }

    fn row(&self) -> String {
        format!(
            "{:<13} {:>10} {:>8.0} {:>14}  {}",
            self.name,
            self.execs,
            self.execs as f64 / self.seconds.max(0.001),
            format!("{} -> {}", self.seeds, self.corpus),
            self.result()
        )
    }
}

/// One line saying how to replay a crash of `binary`.
fn reproduce(binary: &Path, name: &str, c: &Crash) -> String {
    match &c.input {
        Some(input) => format!(
            "{name}: {}; reproduce: {} {}",
            c.kind,
            binary.display(),
            input.display()
        ),
        None => format!("{name}: {} (no input was written; see its log)", c.kind),
    }
}

/// What libFuzzer's log says of a failed run: the kind (its SUMMARY), the input it
/// wrote, and the panic's place and message.
fn crash_of(log: &str, log_path: &Path) -> Crash {
    let kind = log
        .lines()
        .find_map(|l| l.strip_prefix("SUMMARY: libFuzzer: "))
        .unwrap_or("exited with an error")
        .trim()
        .to_string();
    let input = log.lines().find_map(|l| {
        l.split_once("Test unit written to ")
            .map(|(_, p)| PathBuf::from(p.trim()))
    });
    // "thread '<unnamed>' (N) panicked at FILE:LINE:COL:" then the message.
    let panic = log.lines().enumerate().find_map(|(i, l)| {
        let (_, at) = l.split_once("panicked at ")?;
        let message = log.lines().nth(i + 1).unwrap_or_default();
        Some(format!("{} {message}", at.trim_end_matches(':')))
    });
    let panic = panic.or_else(|| Some(format!("see {}", log_path.display())));
    Crash { kind, input, panic }
}

/// A `stat::name: value` line of `-print_final_stats`.
fn stat(log: &str, name: &str) -> Option<u64> {
    log.lines().rev().find_map(|l| {
        l.strip_prefix(name)?
            .trim_start_matches(':')
            .trim()
            .parse()
            .ok()
    })
}

fn host_triple() -> Result<String> {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let out = Command::new(&rustc)
        .arg("-vV")
        .output()
        .with_context(|| format!("running {rustc} -vV"))?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
        .context("rustc -vV named no host triple")
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_target_is_a_bin_of_the_fuzz_crate_with_a_corpus() {
        let manifest = std::fs::read_to_string(crate::root().join("fuzz/Cargo.toml"))
            .expect("fuzz/Cargo.toml");
        let bins: Vec<&str> = manifest
            .lines()
            .filter_map(|l| l.strip_prefix("name = \""))
            .map(|l| l.trim_end_matches('"'))
            .filter(|n| *n != "tokenscope-fuzz")
            .collect();
        let names: Vec<&str> = TARGETS.iter().map(|(n, _)| *n).collect();
        assert_eq!(
            bins, names,
            "TARGETS lists fuzz/Cargo.toml's [[bin]]s, in order"
        );
        for name in names {
            let seeds = crate::root().join("fuzz/corpus").join(name);
            let count = std::fs::read_dir(&seeds).map_or(0, |d| d.count());
            assert!(count > 0, "{} has no seeds", seeds.display());
        }
    }

    #[test]
    fn a_crash_log_names_its_input_and_panic() {
        let log = "INFO: Seed: 1\n\
thread '<unnamed>' (99) panicked at collector/src/protocol/tls.rs:60:13:\n\
range end index 70 out of range for slice of length 12\n\
==99== ERROR: libFuzzer: deadly signal\n\
artifact_prefix='/t/'; Test unit written to /t/crash-abc\n\
SUMMARY: libFuzzer: deadly signal\n\
stat::number_of_executed_units: 4242\n";
        let c = crash_of(log, Path::new("/t/log"));
        assert_eq!(c.kind, "deadly signal");
        assert_eq!(c.input, Some(PathBuf::from("/t/crash-abc")));
        assert_eq!(
            c.panic.as_deref(),
            Some("collector/src/protocol/tls.rs:60:13 range end index 70 out of range for slice of length 12")
        );
        assert_eq!(stat(log, "stat::number_of_executed_units"), Some(4242));
    }

    #[test]
    fn options_parse_and_refuse_unknown_targets() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let o = parse(&args(&["stream", "--time", "5", "--jobs", "3"]))
            .expect("valid")
            .expect("not help");
        assert_eq!((o.targets, o.seconds, o.jobs), (vec!["stream"], 5, 3));
        assert!(parse(&args(&["nope"])).is_err(), "unknown target");
        assert!(parse(&args(&["--time", "0"])).is_err(), "zero seconds");
        assert!(parse(&args(&["--help"])).expect("help").is_none());
    }
}
