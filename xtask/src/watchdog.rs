//! A time limit on each test binary: `cargo test` runs them through
//! `xtask watchdog SECS BINARY ARGS..` (cargo's target runner), so a test that hangs
//! fails its binary after SECS with every thread's stack printed, instead of holding
//! CI until its own limit (a lock-order deadlock in the lab's libcuda stand-in once
//! held a CI run for 15 minutes with nothing said).

use std::collections::HashMap;
use std::io::Write;
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// Per test binary: the longest takes about two minutes on 2 cores (lifecycle.rs).
pub(crate) const TEST_BINARY_SECS: u64 = 600;

/// The `--config` that makes cargo run each test binary under the watchdog.
pub(crate) fn runner_config() -> Result<String> {
    let me = std::env::current_exe().context("locating xtask itself")?;
    let me = me.to_str().context("xtask's path is not UTF-8")?;
    Ok(format!(
        "target.'cfg(all())'.runner = ['{me}', 'watchdog', '{TEST_BINARY_SECS}']"
    ))
}

/// `xtask watchdog SECS PROGRAM ARGS..`: runs PROGRAM and exits with its status; after
/// SECS, prints the stacks of it and its descendants, kills them, and exits 124.
pub(crate) fn run(args: &[String]) -> Result<()> {
    let [secs, program, rest @ ..] = args else {
        bail!("usage: cargo xtask watchdog SECS PROGRAM [ARGS..]");
    };
    let secs: u64 = secs
        .parse()
        .with_context(|| format!("'{secs}' is not a number of seconds"))?;
    let mut cmd = Command::new(program);
    cmd.args(rest);
    let code = match watch(&mut cmd, Duration::from_secs(secs), &mut std::io::stderr())? {
        Outcome::Exited(status) => exit_code(status),
        Outcome::TimedOut => 124,
    };
    std::process::exit(code);
}

#[derive(Debug)]
pub(crate) enum Outcome {
    Exited(ExitStatus),
    TimedOut,
}

/// Runs `cmd` for at most `limit`; past it, writes what every thread of the process
/// tree is waiting on to `out`, kills the tree (deepest first) and reaps the child.
pub(crate) fn watch(cmd: &mut Command, limit: Duration, out: &mut impl Write) -> Result<Outcome> {
    let shown = format!("{cmd:?}");
    let mut child = cmd.spawn().with_context(|| format!("starting {shown}"))?;
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait()? {
            return Ok(Outcome::Exited(status));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let tree = descendants(child.id());
    let _ = writeln!(
        out,
        "\nxtask watchdog: {shown} still running after {}s; where each of its {} \
         processes waits, then they are killed:",
        limit.as_secs(),
        tree.len()
    );
    for &pid in &tree {
        describe(pid, out);
    }
    for &pid in tree.iter().rev() {
        // SAFETY: kill(2) with a pid of this tree; a pid that exited meanwhile fails harmlessly.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
    child.wait()?;
    Ok(Outcome::TimedOut)
}

/// `root` and every process below it, parents before children.
fn descendants(root: u32) -> Vec<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        if let Some(ppid) = parent(pid) {
            children.entry(ppid).or_default().push(pid);
        }
    }
    let mut tree = vec![root];
    let mut i = 0;
    while i < tree.len() {
        tree.extend(children.get(&tree[i]).into_iter().flatten());
        i += 1;
    }
    tree
}

/// The parent from /proc/PID/stat (the field after the command name, which may hold
/// spaces and parentheses: read after the last ')').
fn parent(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, after) = stat.rsplit_once(')')?;
    after.split_whitespace().nth(1)?.parse().ok()
}

/// The process's command line, each thread's kernel wait, and with gdb on the machine
/// each thread's user stack.
fn describe(pid: u32, out: &mut impl Write) {
    let read = |path: String| std::fs::read_to_string(path).unwrap_or_default();
    let cmdline = read(format!("/proc/{pid}/cmdline")).replace('\0', " ");
    let _ = writeln!(out, "--- pid {pid}: {}", cmdline.trim_end());
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten();
    for task in tasks.flatten() {
        let tid = task.file_name().to_string_lossy().into_owned();
        let comm = read(format!("/proc/{pid}/task/{tid}/comm"));
        let wchan = read(format!("/proc/{pid}/task/{tid}/wchan"));
        let _ = writeln!(out, "  thread {tid} ({}) waits in {wchan}", comm.trim_end());
        for frame in read(format!("/proc/{pid}/task/{tid}/stack")).lines() {
            let _ = writeln!(out, "    {frame}");
        }
    }
    let gdb = Command::new("gdb")
        .args(["-batch", "-nx", "-p", &pid.to_string()])
        .args(["-ex", "thread apply all bt"])
        .stderr(std::process::Stdio::null())
        .output();
    if let Ok(gdb) = gdb {
        let _ = out.write_all(&gdb.stdout);
    }
}

/// The exit code a shell would report: the program's own, or 128 + the signal.
fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hung_tree_is_described_and_killed() {
        // A shell whose child sleeps: both must be gone after the limit.
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "sleep 60 & echo $! ; wait"])
            .stdout(std::process::Stdio::piped());
        let mut said = Vec::new();
        let started = Instant::now();
        let outcome = watch(&mut cmd, Duration::from_secs(1), &mut said).unwrap();
        assert!(matches!(outcome, Outcome::TimedOut), "{outcome:?}");
        assert!(started.elapsed() < Duration::from_secs(30));
        let said = String::from_utf8(said).unwrap();
        assert!(said.contains("still running after 1s"), "{said}");
        assert!(said.contains("sleep 60"), "{said}");
        assert!(said.contains("processes waits"), "{said}");
        let sleepers: Vec<u32> = said
            .lines()
            .filter(|l| l.ends_with("sleep 60"))
            .filter_map(|l| l.strip_prefix("--- pid ")?.split(':').next()?.parse().ok())
            .collect();
        assert_eq!(sleepers.len(), 1, "{said}");
        // Killed and reaped by its shell's death (init adopts it): no longer running.
        let gone = (0..50).any(|_| {
            std::thread::sleep(Duration::from_millis(100));
            std::fs::read_to_string(format!("/proc/{}/stat", sleepers[0]))
                .map_or(true, |s| s.contains(") Z "))
        });
        assert!(gone, "the sleeping grandchild outlived the watchdog");
    }

    #[test]
    fn exit_codes_pass_through() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "exit 3"]);
        let outcome = watch(&mut cmd, Duration::from_secs(30), &mut Vec::new()).unwrap();
        match outcome {
            Outcome::Exited(status) => assert_eq!(exit_code(status), 3),
            Outcome::TimedOut => panic!("timed out"),
        }
    }
}
