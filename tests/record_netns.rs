//! Privileged: `record --netns` limits a recording to one network namespace. Two
//! namespaces joined by a veth pair stand for two hosts, each with a web server on the
//! same port and curl clients calling both servers. Three recorders watch at once: two
//! given namespace A's file (the default I/O source and the syscall source, which filter
//! at different points) and one a process in B. Each holds every socket of its own
//! namespace (TCP state changes from softirq included) and none of the other's or of
//! the host's, and its header names the namespace. A --netns that names no network
//! namespace is one line and exit status 2.

#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;

use collector::ingest::model::{event::Body, Direction};
use test_support::netns::{Netns, NetnsPair};
use test_support::recorder::spawn_until;
use test_support::*;

/// Both servers listen on it: a port filter could not tell them apart.
const PORT: u16 = 8000;
/// curl's client ports (`--local-port`), so the test knows every socket in advance:
/// BASE+1..=BASE+3 call the own namespace's server, BASE+4 the other's.
const A_CLIENT_BASE: u16 = 41000;
const B_CLIENT_BASE: u16 = 42000;
const LOCAL_CALLS: u16 = 3;

/// `python3 -m http.server` bound to a namespace's address; killed when dropped.
struct WebServer {
    child: Child,
    /// Its request log: read until it ends, or a full pipe would stall the server.
    _log: mpsc::Receiver<String>,
}

impl WebServer {
    fn start(ns: &Netns, root: &Path) -> WebServer {
        // `ip netns exec` and sh both exec: the child's pid is python's, in the namespace.
        let script = format!(
            "exec python3 -u -m http.server --bind {} --directory {} {PORT} 1>&2",
            ns.addr,
            root.display()
        );
        let mut cmd = ns.command("sh");
        cmd.args(["-c", &script]);
        let (child, log) = spawn_until(&mut cmd, "Serving HTTP", "python3 -m http.server");
        WebServer { child, _log: log }
    }
}

impl Drop for WebServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One GET by curl in `from` to the server at `to`, from `client_port`.
fn get(from: &Netns, to: Ipv4Addr, client_port: u16) {
    let url = format!("http://{to}:{PORT}/hello.txt");
    let out = from
        .command("curl")
        .args(["-sS", "-m", "10", "-o", "/dev/null", "-w", "%{http_code}"])
        .args(["--local-port", &client_port.to_string(), &url])
        .stdin(Stdio::null())
        .output()
        .expect("run curl (Debian package curl) in the namespace");
    let code = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && code == "200",
        "curl in {} to {url} from port {client_port}: status {}, HTTP {code}, {}",
        from.name,
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The sockets namespace `own` holds after the calls: its clients' ends (to its own
/// server and to the other's) and its server's ends (for its own clients and for the
/// other's call), as (local, remote).
fn sockets_of(
    own: Ipv4Addr,
    own_base: u16,
    other: Ipv4Addr,
    other_base: u16,
) -> Vec<(SocketAddr, SocketAddr)> {
    let at = |ip: Ipv4Addr, port: u16| SocketAddr::from((ip, port));
    let mut out = Vec::new();
    for i in 1..=LOCAL_CALLS {
        out.push((at(own, own_base + i), at(own, PORT)));
        out.push((at(own, PORT), at(own, own_base + i)));
    }
    let cross = LOCAL_CALLS + 1;
    out.push((at(own, own_base + cross), at(other, PORT)));
    out.push((at(own, PORT), at(other, other_base + cross)));
    out
}

#[derive(Default, Debug)]
struct Seen {
    sends: u32,
    recvs: u32,
    states: u32,
}

/// Checks one recording against the namespace it was limited to; (events, I/O events,
/// state changes) for the figures.
fn check(path: &Path, ns: &Netns, expected: &[(SocketAddr, SocketAddr)]) -> (usize, u32, u32) {
    let (header, events) = read_recording(path);
    assert!(header.complete, "{}: the recording was sealed", ns.name);
    assert_eq!(
        header.net_namespace,
        ns.inode(),
        "the header names the namespace the recording was limited to ({})",
        ns.name
    );
    let mut seen: BTreeMap<(SocketAddr, SocketAddr), Seen> = BTreeMap::new();
    for e in &events {
        let Some(sock) = e.sock() else { continue };
        assert_eq!(
            sock.src().ip(),
            ns.addr,
            "every socket recorded with --netns {} is one of that namespace (local address \
             {}), not the other's or the host's: {e:?}",
            ns.name,
            ns.addr
        );
        let s = seen.entry((sock.src(), sock.dst())).or_default();
        match &e.body {
            Some(Body::Io(io)) if io.dir() == Direction::Send => s.sends += 1,
            Some(Body::Io(_)) => s.recvs += 1,
            Some(Body::State(_)) => s.states += 1,
            _ => {}
        }
    }
    for key in expected {
        let s = seen.get(key).unwrap_or_else(|| {
            panic!(
                "{}: socket {} -> {} never recorded; recorded: {:?}",
                ns.name,
                key.0,
                key.1,
                seen.keys().collect::<Vec<_>>()
            )
        });
        assert!(
            s.sends > 0 && s.recvs > 0 && s.states > 0,
            "{}: socket {} -> {} has a send, a receive and a state change: {s:?}",
            ns.name,
            key.0,
            key.1
        );
    }
    let total = |f: fn(&Seen) -> u32| seen.values().map(f).sum::<u32>();
    let io = total(|s| s.sends + s.recvs);
    let states = total(|s| s.states);
    (
        events.iter().filter(|e| e.sock().is_some()).count(),
        io,
        states,
    )
}

#[test]
fn each_recording_holds_its_own_namespace_and_nothing_else() {
    let pair = NetnsPair::new("rec").expect("two network namespaces and a veth pair (root, ip)");
    let root = tempfile::tempdir().expect("tempdir");
    std::fs::write(root.path().join("hello.txt"), "hello\n").expect("write hello.txt");
    let server_a = WebServer::start(&pair.a, root.path());
    let server_b = WebServer::start(&pair.b, root.path());

    let dirs: Vec<_> = (0..3)
        .map(|_| tempfile::tempdir().expect("tempdir"))
        .collect();
    let a_path = pair.a.path();
    let a_path = a_path.to_str().expect("utf-8");
    let rec_a = Recorder::start(dirs[0].path(), &["--netns", a_path]);
    let rec_a_syscall = Recorder::start(
        dirs[1].path(),
        &["--netns", a_path, "--io-source", "syscall"],
    );
    // B named by a process in it: the server's pid.
    let b_pid = server_b.child.id().to_string();
    let rec_b = Recorder::start(dirs[2].path(), &["--netns", &b_pid]);

    for i in 1..=LOCAL_CALLS {
        get(&pair.a, pair.a.addr, A_CLIENT_BASE + i);
        get(&pair.b, pair.b.addr, B_CLIENT_BASE + i);
    }
    get(&pair.a, pair.b.addr, A_CLIENT_BASE + LOCAL_CALLS + 1);
    get(&pair.b, pair.a.addr, B_CLIENT_BASE + LOCAL_CALLS + 1);

    let paths: Vec<_> = [&rec_a, &rec_a_syscall, &rec_b]
        .iter()
        .map(|r| r.path.clone())
        .collect();
    for r in [rec_a, rec_a_syscall, rec_b] {
        r.stop();
    }
    drop(server_a);
    drop(server_b);

    let expected_a = sockets_of(pair.a.addr, A_CLIENT_BASE, pair.b.addr, B_CLIENT_BASE);
    let expected_b = sockets_of(pair.b.addr, B_CLIENT_BASE, pair.a.addr, A_CLIENT_BASE);
    for (name, path, ns, expected) in [
        ("A (by file)", &paths[0], &pair.a, &expected_a),
        (
            "A (by file, syscall source)",
            &paths[1],
            &pair.a,
            &expected_a,
        ),
        ("B (by pid)", &paths[2], &pair.b, &expected_b),
    ] {
        let (events, io, states) = check(path, ns, expected);
        eprintln!(
            "namespace {name}: {events} socket events ({io} I/O, {states} state changes) on \
             {} expected sockets, none of the other namespace's",
            expected.len()
        );
    }
}

/// `tokenscope record --netns <value>`: exit status and stderr.
fn record_with_netns(value: &str) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(profiler())
        .arg("record")
        .arg("-o")
        .arg(dir.path().join("r.tsrec"))
        .args(["--duration", "1s", "--netns", value])
        .stdout(Stdio::null())
        .output()
        .expect("run tokenscope record");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_netns_that_is_not_a_network_namespace_is_one_line_and_status_2() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("plain");
    std::fs::write(&file, "not a namespace").expect("write");
    let file = file.to_str().expect("utf-8").to_string();
    for (value, why) in [
        ("/run/netns/ts-no-such-namespace", "no such file"),
        (file.as_str(), "not a network namespace (a regular file"),
        (
            "/proc/self/ns/mnt",
            "not a network namespace (a namespace of another kind)",
        ),
        // Above the kernel's largest pid_max (2^22): never a process.
        ("99999999", "no such process"),
    ] {
        let (code, stderr) = record_with_netns(value);
        assert_eq!(
            code,
            Some(2),
            "--netns {value}: exit status 2; stderr: {stderr}"
        );
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(
            lines.len(),
            1,
            "--netns {value}: one line; stderr: {stderr}"
        );
        assert!(
            lines[0].starts_with("tokenscope: error: ")
                && lines[0].contains(&format!("--netns {value}: {why}")),
            "--netns {value}: names the value and says {why:?}; stderr: {stderr}"
        );
    }
}
