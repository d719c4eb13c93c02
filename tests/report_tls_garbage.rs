//! Privileged: `tokenscope report` on real traffic without the lab: TLS
//! handshake time per new connection and response timing by TLS record through
//! nginx's TLS listener; garbage and another protocol on a traced port are
//! counted as unparsed, and nothing panics.

#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

use std::io::Write;
use std::net::{TcpListener, TcpStream};

use test_support::*;

#[test]
fn tls_handshake_per_new_connection_and_timing_by_record() {
    let dir = tempfile::tempdir().expect("tempdir");
    let nginx = Nginx::start(
        dir.path(),
        "default_type text/plain; return 200 \"hello over TLS\";",
    );
    let port = nginx.https_port;
    // Without plaintext (--tls off: what a TLS stack with no OpenSSL symbols gives).
    let rec = Recorder::start(dir.path(), &["--port", &port.to_string(), "--tls", "off"]);
    let url = format!("https://127.0.0.1:{port}/v1/models");
    let (curl_a, _) = curl(&["-sk", "-o", "/dev/null", &url]);
    let (curl_b, _) = curl(&["-sk", "-o", "/dev/null", &url]);
    let path = rec.path.clone();
    rec.stop();

    let report = report_json(&path);
    let requests = report["requests"].as_array().expect("requests");
    for pid in [curl_a, curl_b] {
        let r = requests
            .iter()
            .find(|r| r["client_pid"] == pid)
            .unwrap_or_else(|| panic!("curl {pid}'s request is in the report: {requests:#?}"));
        assert_eq!(r["tls"], true);
        assert_eq!(r["new_connection"], true);
        let tls = r["stages"]["tls_ns"]
            .as_u64()
            .expect("a TLS handshake time");
        let connect = r["stages"]["connect_ns"]
            .as_u64()
            .expect("a TCP handshake time");
        assert!(tls > 0 && tls < 5_000_000_000, "TLS handshake {tls} ns");
        assert!(
            connect < tls,
            "on loopback the TCP handshake ({connect} ns) is faster than TLS ({tls} ns)"
        );
        let client = &r["points"][0];
        assert_eq!(client["kind"], "client_read");
        let records = client["record_ns"].as_array().expect("record times");
        assert!(
            !records.is_empty(),
            "the response is timed by TLS record: {client}"
        );
        let first = records[0].as_u64().unwrap();
        assert!(
            first > r["first_byte_ns"].as_u64().unwrap(),
            "the response record comes after the request"
        );
    }
    assert!(
        report["overall"]["stages"]["tls"]["count"]
            .as_u64()
            .unwrap()
            >= 2,
        "TLS stage stats"
    );
}

#[test]
fn garbage_and_other_protocols_are_counted_as_unparsed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let rec = Recorder::start(dir.path(), &["--port", &port.to_string()]);
    let sink = std::thread::spawn(move || {
        for _ in 0..2 {
            let (mut c, _) = listener.accept().expect("accept");
            let _ = std::io::copy(&mut c, &mut std::io::sink());
        }
    });
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let garbage: Vec<u8> = (0..20_000)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed as u8
        })
        .collect();
    let mut a = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    for piece in garbage.chunks(997) {
        a.write_all(piece).expect("send garbage");
    }
    drop(a);
    let mut b = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    b.write_all(b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n")
        .expect("send banner");
    b.write_all(&[0, 0, 5, 0xdc, 6, 0x14])
        .expect("send a binary packet");
    drop(b);
    sink.join().expect("sink");
    let path = rec.path.clone();
    rec.stop();

    let report = report_json(&path);
    let unparsed = report["unparsed_ios"].as_u64().expect("unparsed count");
    assert!(
        unparsed >= 4,
        "garbage and SSH I/Os are counted as unparsed (got {unparsed})"
    );
    assert_eq!(
        report["requests"].as_array().map(Vec::len),
        Some(0),
        "no request is made up from garbage"
    );
}
