//! Tests of `hosts`.

use super::*;

fn end(local: &str, remote: &str, sent: &[(u64, u64)], recv: &[(u64, u64)]) -> End {
    End {
        local: Some(local.parse().unwrap()),
        remote: Some(remote.parse().unwrap()),
        start_ns: sent.first().or(recv.first()).map_or(0, |s| s.0),
        sent: sent.to_vec(),
        recv: recv.to_vec(),
        sent_total: sent.last().map_or(0, |s| s.1),
        recv_total: recv.last().map_or(0, |s| s.1),
    }
}

#[test]
fn a_request_and_its_response_bound_the_offset_from_both_sides() {
    // y's clock is x's + 1 s; 100 us each way.
    let d = 1_000_000_000i64;
    let t = |x: u64| (x as i64 + d) as u64;
    let x = end(
        "10.0.0.1:40000",
        "10.0.0.2:80",
        &[(1_000_000, 300)],
        &[(1_400_000, 100), (1_600_000, 200)],
    );
    let y = end(
        "10.0.0.2:80",
        "10.0.0.1:40000",
        &[(t(1_300_000), 100), (t(1_500_000), 200)],
        &[(t(1_100_000), 300)],
    );
    let (off, clock) = traffic_offset(&[x], &[y], d).expect("bounds both ways");
    assert_eq!(off, d);
    let Clock::Traffic {
        connections,
        uncertainty_ns,
        crossed_ns,
        ..
    } = clock
    else {
        panic!("{clock:?}")
    };
    assert_eq!((connections, uncertainty_ns, crossed_ns), (1, 100_000, 0));
}

#[test]
fn the_byte_that_ends_a_read_picks_the_send_that_carried_it() {
    // x sent 3 writes; y read them in one: the last write bounds it, not the first.
    let x = end(
        "10.0.0.1:40000",
        "10.0.0.2:80",
        &[(1_000, 10), (5_000, 20), (9_000, 30)],
        &[],
    );
    let y = end("10.0.0.2:80", "10.0.0.1:40000", &[], &[(9_500, 30)]);
    assert_eq!(bounds(&x, &y), (None, Some(500)));
}

#[test]
fn a_host_of_the_same_boot_as_one_aligned_by_traffic_takes_its_clock() {
    // Host 1 is 1 s ahead of host 0 (a connection both saw); host 2 shares host 1's
    // boot but no connection with host 0; host 3 shares nothing.
    let d = 1_000_000_000u64;
    let x = end(
        "10.0.0.1:40000",
        "10.0.0.2:80",
        &[(1_000_000, 300)],
        &[(1_400_000, 100)],
    );
    let y = end(
        "10.0.0.2:80",
        "10.0.0.1:40000",
        &[(d + 1_300_000, 100)],
        &[(d + 1_100_000, 300)],
    );
    let header = |boot: &str| FileHeader {
        boot_id: boot.into(),
        start_realtime_ns: 5 * d,
        start_monotonic_ns: d,
        ..Default::default()
    };
    let headers = [header("a"), header("b"), header("b"), header("c")];
    let aligned = align(&headers, &[vec![x], vec![y], Vec::new(), Vec::new()]);
    assert_eq!(aligned[0], (0, Clock::Reference));
    assert_eq!(aligned[1].0, -(d as i64));
    assert!(matches!(aligned[1].1, Clock::Traffic { with: 0, .. }));
    assert_eq!(aligned[2], (-(d as i64), Clock::SameBoot { with: 1 }));
    assert_eq!(aligned[3], (0, Clock::Realtime));
}

#[test]
fn one_way_traffic_alone_gives_no_offset() {
    let x = end("10.0.0.1:40000", "10.0.0.2:80", &[(1_000, 10)], &[]);
    let y = end("10.0.0.2:80", "10.0.0.1:40000", &[], &[(2_000, 10)]);
    assert!(traffic_offset(&[x], &[y], 0).is_none());
}

#[test]
fn folded_pids_and_sockets_never_meet_another_hosts() {
    use crate::ingest::model::{Sock, SockIo};
    let mut e = Event {
        ts_ns: 5_000,
        pid: 1234,
        tid: 1235,
        body: Some(Body::Io(SockIo {
            sock: Some(Sock {
                skaddr: 0xffff_8880_0000_1000,
                ..Default::default()
            }),
            ..Default::default()
        })),
        ..Default::default()
    };
    fold(&mut e, 3, -1_000);
    assert_eq!(e.ts_ns, 4_000);
    assert_eq!(split_pid(e.pid), (3, 1234));
    assert_eq!(pid_label(e.pid), "1234@3");
    assert_ne!(e.sock().unwrap().skaddr, 0xffff_8880_0000_1000);
    assert_eq!(e.sock().unwrap().skaddr >> 63, 1);
}

#[test]
fn recordings_whose_prints_differ_are_not_joined() {
    let header = |prints: &str| FileHeader {
        prints: prints.into(),
        ..Default::default()
    };
    let paths: Vec<PathBuf> = ["a.tsrec", "b.tsrec", "c.tsrec"]
        .iter()
        .map(PathBuf::from)
        .collect();
    let new = header(crate::ingest::record::PRINTS);
    let old = header("");
    assert!(same_prints(&paths, &[new.clone(), new.clone(), new.clone()]).is_ok());
    assert!(
        same_prints(&paths, &[old.clone(), old.clone()]).is_ok(),
        "old recordings (and copies of them) still join"
    );
    for (headers, old_path, new_path) in [
        ([new.clone(), new.clone(), old.clone()], "c", "a"),
        ([old.clone(), new.clone(), new], "a", "b"),
    ] {
        let err = same_prints(&paths, &headers)
            .expect_err("mixed prints")
            .to_string();
        assert_eq!(
            err,
            format!(
                "{old_path}.tsrec: its SSE prints are fnv-1a and those of {new_path}.tsrec \
                 are xxh3-64: the hops between hosts would not match; record every host \
                 with the same tokenscope, or replay each alone"
            )
        );
    }
}
