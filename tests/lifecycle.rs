//! Privileged: how `tokenscope record` starts and ends. SIGINT and SIGTERM
//! leave a complete, readable file and no tokenscope program in the kernel;
//! bad set-ups fail with one clear line.

#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

use std::process::{Command, Stdio};

use test_support::*;

/// Names of loaded BPF programs (bpftool truncates to the kernel's 15 chars).
fn loaded_programs() -> String {
    let out = Command::new("bpftool")
        .args(["prog", "show"])
        .output()
        .expect("run bpftool (installed by cargo xtask setup)");
    assert!(out.status.success(), "bpftool prog show failed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

const OUR_PROGRAMS: &[&str] = &["tp_sock_sock_se", "tp_sock_inet_so", "tp_sys_enter_wr"];

fn ends_cleanly_on(signal: i32) {
    let dir = tempfile::tempdir().expect("tempdir");
    let nginx = Nginx::start(dir.path(), "return 204;");
    let rec = Recorder::start(dir.path(), &[]);
    let during = loaded_programs();
    for p in OUR_PROGRAMS {
        assert!(
            during.contains(p),
            "while recording, bpftool lists {p}:\n{during}"
        );
    }
    curl(&[
        "-s",
        "-o",
        "/dev/null",
        &format!("http://127.0.0.1:{}/", nginx.http_port),
    ]);
    let path = rec.path.clone();
    let stderr = rec.stop_with(signal);
    assert!(
        stderr.contains("wrote"),
        "a summary line after the signal: {stderr}"
    );

    let (header, events) = read_recording(&path);
    assert!(header.complete, "signal {signal}: the header is sealed");
    let c = header.counters.expect("counters");
    assert_eq!(c.written, events.len() as u64);
    assert!(
        events.iter().any(|e| e.comm == "curl"),
        "the traffic before the signal is in the file"
    );
    let after = loaded_programs();
    for p in OUR_PROGRAMS {
        assert!(
            !after.contains(p),
            "after signal {signal}, {p} is still loaded:\n{after}"
        );
    }
}

#[test]
fn sigint_leaves_a_complete_file_and_no_programs() {
    ends_cleanly_on(libc::SIGINT);
}

#[test]
fn sigterm_leaves_a_complete_file_and_no_programs() {
    ends_cleanly_on(libc::SIGTERM);
}

#[test]
fn duration_ends_the_recording() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("d.tsrec");
    let out = Command::new(profiler())
        .args(["record", "--duration", "300ms", "-o"])
        .arg(&path)
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "record --duration: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (header, _) = read_recording(&path);
    assert!(header.complete && header.end_monotonic_ns > header.start_monotonic_ns);
}

/// Runs the binary and returns (exit code, stderr); asserts stderr is one error line.
fn fails_with(cmd: &mut Command) -> String {
    fails_with_code(cmd, 1)
}

/// As `fails_with`, with the exit code the failure must give (2: this host or these
/// privileges cannot run the probes).
fn fails_with_code(cmd: &mut Command, code: i32) -> String {
    let out = cmd.stdout(Stdio::null()).output().expect("run tokenscope");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(code),
        "exit code {code} for this failure; stderr: {stderr}"
    );
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line of error, got: {stderr}");
    assert!(
        lines[0].starts_with("tokenscope: error: "),
        "error prefix: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "no panic: {stderr}");
    stderr
}

#[test]
fn unwritable_output_is_one_clear_line() {
    let e = fails_with(Command::new(profiler()).args([
        "record",
        "--duration",
        "1s",
        "-o",
        "/nonexistent-dir/x.tsrec",
    ]));
    assert!(
        e.contains("/nonexistent-dir/x.tsrec") && e.contains("No such file"),
        "{e}"
    );
}

#[test]
fn unprivileged_is_one_clear_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    Command::new("chmod")
        .arg("777")
        .arg(dir.path())
        .status()
        .expect("chmod");
    let out = dir.path().join("x.tsrec");
    let e = fails_with_code(
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(profiler())
            .args(["record", "--duration", "1s", "-o"])
            .arg(&out),
        2,
    );
    assert!(e.contains("not privileged") && e.contains("CAP_BPF"), "{e}");
}

/// Root with capabilities taken away (setpriv drops them from the bounding and
/// inheritable sets): without CAP_SYS_ADMIN and CAP_BPF or CAP_PERFMON, one line that
/// names what is missing and the fix, exit 2; without CAP_SYS_ADMIN alone, the
/// tracepoints record and each uprobe is skipped with a line.
#[test]
fn each_missing_capability_is_named_in_one_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("x.tsrec");
    let without = |caps: &str| {
        let mut cmd = Command::new("setpriv");
        cmd.arg(format!("--bounding-set={caps}"))
            .arg(format!("--inh-caps={caps}"))
            .arg(profiler())
            .args(["record", "--duration", "1s", "-o"])
            .arg(&out);
        cmd
    };
    for (caps, named) in [
        ("-bpf,-sys_admin", "CAP_BPF"),
        ("-perfmon,-sys_admin", "CAP_PERFMON"),
        (
            "-bpf,-perfmon,-sys_admin",
            "CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN",
        ),
    ] {
        let e = fails_with_code(&mut without(caps), 2);
        assert!(
            e.contains(&format!("not privileged (no {named}")) && e.contains("setcap"),
            "{caps}: {e}"
        );
    }
    let run = without("-sys_admin").output().expect("run tokenscope");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(
        run.status.code(),
        Some(0),
        "tracepoints need no CAP_SYS_ADMIN: {stderr}"
    );
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("uprobes need CAP_SYS_ADMIN"))
        .collect();
    assert!(
        lines.len() == 1
            && lines[0].contains("TLS plaintext (OpenSSL) not traced")
            && !stderr.contains("probe skipped: uprobe:")
            && stderr.contains("recording:"),
        "the TLS uprobes skipped in one line naming CAP_SYS_ADMIN, the rest recorded: {stderr}"
    );
    let (header, _) = read_recording(&out);
    assert!(header.complete);
}

#[test]
fn dead_pid_is_one_clear_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let e = fails_with(
        Command::new(profiler())
            .args(["record", "-p", "999999", "--duration", "1s", "-o"])
            .arg(dir.path().join("x")),
    );
    assert!(e.contains("pid 999999: no such process"), "{e}");
}

#[test]
fn dump_of_garbage_or_missing_file_is_one_clear_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let junk = dir.path().join("junk.tsrec");
    std::fs::write(&junk, b"\x00garbage that is not a recording").expect("write");
    let e = fails_with(Command::new(profiler()).arg("dump").arg(&junk));
    assert!(e.contains("not a tokenscope recording"), "{e}");
    let e = fails_with(
        Command::new(profiler())
            .arg("dump")
            .arg(dir.path().join("missing.tsrec")),
    );
    assert!(e.contains("No such file"), "{e}");
}

/// Stopped while tokens stream, the recording still parses: the probes that emit I/O
/// records detach before the syscall probes that give them their buffers, so the
/// last I/Os are whole (before that order, hundreds of I/Os arrived without payload
/// while detaching and every stream in flight was lost).
#[test]
fn stopping_mid_stream_leaves_every_stream_readable() {
    use std::time::Duration;
    use tokenscope_lab::bench::{self, BenchConfig};
    use tokenscope_lab::{Engine, EngineConfig};

    let dir = tempfile::tempdir().expect("tempdir");
    let rt = runtime();
    let (path, report) = rt.block_on(async {
        let engine = Engine::start(EngineConfig::default(), "127.0.0.1:0".parse().unwrap())
            .await
            .expect("engine");
        let port = engine.addr().port().to_string();
        let rec = Recorder::start(dir.path(), &["--port", &port, "--gpu", "off"]);
        let load = BenchConfig {
            url: engine.base_url(),
            concurrency: 8,
            requests: Some(16),
            max_tokens: 200,
            progress: false,
            timeout: Duration::from_secs(60),
            ..BenchConfig::default()
        };
        let bench = tokio::spawn(async move { bench::run(&load).await });
        // Stop while all 8 streams are mid-way: their first tokens come within ~1.4 s
        // (8 prompts prefill in turn), 200 tokens at ~20 ms take another ~4 s.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let path = rec.path.clone();
        tokio::task::spawn_blocking(move || rec.stop())
            .await
            .expect("stop");
        let out = bench.await.expect("bench task").expect("bench");
        assert!(out.records.iter().all(|r| r.ok), "every request succeeded");
        engine.shutdown().await;
        let report = report_json(&path);
        (path, report)
    });
    let (header, _) = read_recording(&path);
    assert!(header.complete, "sealed");
    assert_eq!(
        report["unparsed_ios"], 0,
        "no I/O lost its stream when the recording stopped"
    );
    let requests = report["requests"].as_array().expect("requests");
    assert_eq!(
        requests.len(),
        8,
        "the 8 streams in flight, nothing made up"
    );
    for r in requests {
        let tokens = |kind: &str| tokens_at(r, kind);
        assert!(
            tokens("engine_write") >= 5 && tokens("client_read") >= 5,
            "request {} has its tokens at both ends: {}",
            r["id"],
            r["points"]
        );
    }
}

/// Our programs still loaded, polled for up to 5 s: the kernel frees a killed
/// process's programs when its last file descriptor goes, which can lag its exit.
fn ours_left() -> Vec<&'static str> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let now = loaded_programs();
        let left: Vec<&str> = OUR_PROGRAMS
            .iter()
            .copied()
            .filter(|p| now.contains(p))
            .collect();
        if left.is_empty() || std::time::Instant::now() > deadline {
            return left;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// What SIGKILL left: the file read back (flagged as cut off), refused in one line, or
/// never created.
#[derive(Default)]
struct Killed {
    read: usize,
    refused: usize,
}

impl Killed {
    /// After a SIGKILL at `at_ms` of run `run` (writing `path`): nothing stays in the
    /// kernel, and the file reads back up to its last whole frame, flagged as cut off,
    /// or fails with one clear line, never a panic.
    fn check(&mut self, what: &str, at_ms: u64, path: &std::path::Path) {
        let left = ours_left();
        assert!(
            left.is_empty(),
            "{what} (SIGKILL at {at_ms} ms): {left:?} still loaded"
        );
        if !path.exists() {
            return; // killed before it created the file
        }
        let out = Command::new(profiler())
            .arg("report")
            .arg(path)
            .output()
            .expect("tokenscope report");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{what}: {stderr}");
        if out.status.success() {
            self.read += 1;
            assert!(
                stdout.contains("never completed (cut off)"),
                "{what}: a killed recording says it was cut off: {stdout}"
            );
        } else {
            self.refused += 1;
            assert_eq!(
                stderr.lines().count(),
                1,
                "{what}: an unreadable file is one clear line: {stderr}"
            );
        }
    }
}

/// Spread over start-up (loading, attaching, writing the header: the first ~1 s here)
/// and recording, with traffic to `url` until then.
fn traffic_until(run: u64, url: &str) -> u64 {
    let at_ms = (run * 7_919) % 2_400;
    let start = std::time::Instant::now();
    while start.elapsed().as_millis() < u128::from(at_ms) {
        curl(&["-s", "-o", "/dev/null", url]);
    }
    at_ms
}

/// SIGKILL at 20 points of the probes' life, 12 of `record` and 8 of `top` (live, on
/// a terminal, keeping its recording), from start-up to recording under traffic:
/// nothing stays in the kernel, and what was written reads back (up to its last whole
/// frame, flagged as cut off) or fails with one clear line, never a panic.
#[test]
fn sigkill_at_any_point_leaves_no_programs_and_a_readable_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let nginx = Nginx::start(dir.path(), "return 204;");
    let url = format!("http://127.0.0.1:{}/", nginx.http_port);
    let mut killed = Killed::default();
    for run in 0..12u64 {
        let path = dir.path().join(format!("kill-{run}.tsrec"));
        let mut child = Command::new(profiler())
            .args(["record", "-o"])
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn tokenscope record");
        let at_ms = traffic_until(run, &url);
        // SAFETY: plain kill(2) on our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
        child.wait().expect("reaped");
        killed.check(&format!("record run {run}"), at_ms, &path);
    }
    let record_read = killed.read;
    for run in 12..20u64 {
        let path = dir.path().join(format!("kill-{run}.tsrec"));
        let tmux = test_support::tmux::Tmux::start(
            100,
            30,
            &format!("exec {} top -o {}", profiler().display(), path.display()),
        );
        let pid: i32 = tmux.pane_flag("#{pane_pid}").parse().expect("top's pid");
        let at_ms = traffic_until(run, &url);
        // SAFETY: plain kill(2) on the pane's process, top itself (exec'd).
        unsafe { libc::kill(pid, libc::SIGKILL) };
        let gone = std::time::Instant::now() + std::time::Duration::from_secs(10);
        // SAFETY: signal 0 only asks whether the process still exists.
        while unsafe { libc::kill(pid, 0) } == 0 && std::time::Instant::now() < gone {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        killed.check(&format!("top run {run}"), at_ms, &path);
    }
    println!(
        "20 SIGKILLs: {} files read back and flagged cut off ({record_read} of record's 12), {} refused with one line",
        killed.read, killed.refused
    );
    assert!(
        record_read >= 6 && killed.read - record_read >= 4,
        "most kills came after the header"
    );
}

/// tracefs mounted by `record` (a host that had none) is unmounted when it exits; one
/// that was mounted before stays. Run in a private mount namespace with tracefs
/// unmounted, so the host's own mount is untouched; debugfs too (where it is mounted,
/// looking for /sys/kernel/debug/tracing makes the kernel automount tracefs there).
#[test]
fn tracefs_mounted_by_record_is_unmounted_at_exit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("t.tsrec");
    let script = format!(
        "umount /sys/kernel/debug/tracing 2>/dev/null; umount /sys/kernel/tracing 2>/dev/null; \
         umount /sys/kernel/debug 2>/dev/null; \
         grep -c ' - tracefs ' /proc/self/mountinfo; \
         {bin} record --duration 300ms -o {out} || exit 9; \
         grep -c ' - tracefs ' /proc/self/mountinfo; \
         mount -t tracefs nodev /sys/kernel/tracing || exit 8; \
         {bin} record --duration 300ms -o {out} || exit 9; \
         grep -c ' - tracefs ' /proc/self/mountinfo; true",
        bin = profiler().display(),
        out = path.display()
    );
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .output()
        .expect("run unshare (util-linux)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let counts: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        counts,
        ["0", "0", "1"],
        "tracefs mounts: none before, none after record mounted its own, and the one that was there stays"
    );
    let (header, _) = read_recording(&path);
    assert!(header.complete);
}

/// A kernel locked down for confidentiality refuses eBPF reads of kernel memory: one
/// line naming the fix, exit 2. Integrity lockdown does not stop the probes. Played in a
/// private mount namespace whose securityfs is a tmpfs holding the mode.
#[test]
fn a_locked_down_kernel_is_one_line_and_integrity_mode_records() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("l.tsrec");
    let in_mode = |mode: &str| {
        let script = format!(
            "mount -t tmpfs none /sys/kernel/security || exit 8; \
             echo '{mode}' > /sys/kernel/security/lockdown; \
             exec {bin} record --duration 300ms -o {out}",
            bin = profiler().display(),
            out = path.display()
        );
        Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &script])
            .stdout(Stdio::null())
            .output()
            .expect("run unshare (util-linux)")
    };
    let out = in_mode("none integrity [confidentiality]");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "exit 2: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(
        stderr.contains("locked down") && stderr.contains("lockdown=integrity"),
        "names the cause and the fix: {stderr}"
    );
    let out = in_mode("none [integrity] confidentiality");
    assert!(
        out.status.success(),
        "integrity lockdown records: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(read_recording(&path).0.complete);
}
