//! Privileged: a TCP connection on loopback between this test (server) and a
//! python3 child (client), with known byte counts both ways. The recording
//! must hold both handshakes and the exact byte totals per direction and pid.

#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::Command;

use collector::ingest::model::{event::Body, Direction};
use test_support::*;

const UP: usize = 100_000; // client -> server
const DOWN: usize = 250_000; // server -> client

#[test]
fn loopback_connection_bytes_and_handshakes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let server_port = listener.local_addr().expect("addr").port();
    let rec = Recorder::start(dir.path(), &["--port", &server_port.to_string()]);

    let server = std::thread::spawn(move || {
        let (mut conn, peer) = listener.accept().expect("accept");
        let mut buf = vec![0u8; UP];
        conn.read_exact(&mut buf).expect("read the client's bytes");
        conn.write_all(&vec![b'z'; DOWN])
            .expect("write the response bytes");
        conn.shutdown(std::net::Shutdown::Write).expect("shutdown");
        let mut rest = Vec::new();
        conn.read_to_end(&mut rest)
            .expect("wait for the client to close");
        peer.port()
    });
    let script = format!(
        "import socket\ns=socket.create_connection(('127.0.0.1',{server_port}))\ns.sendall(b'a'*{UP})\n\
got=0\nwhile True:\n  d=s.recv(65536)\n  if not d: break\n  got+=len(d)\nassert got=={DOWN}, got\ns.close()\n"
    );
    let client = Command::new("python3")
        .arg("-c")
        .arg(script)
        .spawn()
        .expect("run python3 client");
    let client_pid = client.id();
    let out = client.wait_with_output().expect("client");
    assert!(out.status.success(), "python client failed");
    let client_port = server.join().expect("server thread");
    let path = rec.path.clone();
    let stderr = rec.stop();

    let (header, events) = read_recording(&path);
    assert!(
        header.complete,
        "recording must be sealed; stderr: {stderr}"
    );
    let me = std::process::id();

    assert_eq!(
        io_bytes(&events, client_pid, Direction::Send, client_port),
        UP as u64,
        "client send total"
    );
    assert_eq!(
        io_bytes(&events, me, Direction::Recv, server_port),
        UP as u64,
        "server receive total"
    );
    assert_eq!(
        io_bytes(&events, me, Direction::Send, server_port),
        DOWN as u64,
        "server send total"
    );
    assert_eq!(
        io_bytes(&events, client_pid, Direction::Recv, client_port),
        DOWN as u64,
        "client receive total"
    );

    // Every send copies its payload up to the default cap of 16384 bytes.
    for (e, bytes) in io_events(&events, me, Direction::Send, server_port) {
        let io = e.io().expect("io");
        assert_eq!(
            io.captured as u64,
            bytes.min(16384),
            "captured prefix of a {bytes}-byte send"
        );
    }

    let connect = events.iter().any(|e| match &e.body {
        Some(Body::State(s)) => {
            e.pid == client_pid
                && s.new().label() == "SYN_SENT"
                && s.sock
                    .as_ref()
                    .is_some_and(|k| k.dport == u32::from(server_port))
        }
        _ => false,
    });
    assert!(
        connect,
        "the client's connect (CLOSE -> SYN_SENT) with its pid"
    );
    let client_side = transitions(&events, client_port, server_port);
    assert!(
        client_side
            .iter()
            .any(|(o, n, _)| o == "SYN_SENT" && n == "ESTABLISHED"),
        "client handshake: {client_side:?}"
    );
    let server_side = transitions(&events, server_port, client_port);
    assert!(
        server_side
            .iter()
            .any(|(o, n, _)| o == "SYN_RECV" && n == "ESTABLISHED"),
        "server handshake: {server_side:?}"
    );
    assert!(
        server_side.iter().any(|(_, n, _)| n == "CLOSE")
            || client_side.iter().any(|(_, n, _)| n == "CLOSE"),
        "close seen"
    );

    let accepted = events.iter().any(|e| match &e.body {
        Some(Body::Accept(a)) => {
            e.pid == me
                && a.sock.as_ref().is_some_and(|k| {
                    k.sport == u32::from(server_port) && k.dport == u32::from(client_port)
                })
        }
        _ => false,
    });
    assert!(
        accepted,
        "the server's accept with this test's pid and the 4-tuple"
    );
}
