//! Stitching on synthetic traffic (see testnet).

use super::testnet::*;
use super::*;

#[test]
fn one_request_through_a_proxy_has_every_point_and_stage() {
    let mut net = Net::default();
    proxied(&mut net, 1_000 * MS, 40000, 50000, "req-a");
    let tl = stitch(&net.events, false);
    assert_eq!(
        tl.requests.len(),
        1,
        "one request, not one per hop: {:#?}",
        tl.requests
    );
    let r = &tl.requests[0];
    let kinds: Vec<PointKind> = r.points.iter().map(|p| p.kind).collect();
    assert_eq!(
        kinds,
        vec![
            PointKind::ClientRead,
            PointKind::ProxyWrite,
            PointKind::ProxyRead,
            PointKind::EngineWrite
        ]
    );
    assert_eq!(
        r.start_ns,
        1_000 * MS,
        "a new connection's request starts at connect()"
    );
    assert!(r.new_connection && r.coalesced && !r.truncated);
    assert_eq!(r.chunk_mismatches, 0);
    let engine = r.point(PointKind::EngineWrite).unwrap();
    assert_eq!(
        engine.ttft_ns,
        Some(100 * MS),
        "engine wrote token 0 at +100 ms"
    );
    assert_eq!(engine.max_tokens_per_io, 1);
    let client = r.point(PointKind::ClientRead).unwrap();
    assert_eq!(
        client.ttft_ns,
        Some(125 * MS + 200_000),
        "token 0 reached the client with token 1, 5 ms after it"
    );
    assert_eq!(client.max_tokens_per_io, 2);
    assert_eq!(client.token_ns.len(), 6);
    assert_eq!(r.stages.connect_ns, Some(50_000));
    assert_eq!(
        r.stages.gateway_ns,
        Some(4 * MS - (MS + 100_000)),
        "proxy got the request at +1.1 ms, sent it at +4 ms"
    );
    assert_eq!(r.stages.upstream_wait_ns, Some(96 * MS - 100_000));
    let fwd = r
        .forward
        .iter()
        .find(|f| f.from == PointKind::ProxyRead && f.to == PointKind::ProxyWrite)
        .unwrap();
    assert_eq!(
        fwd.delay_ns,
        vec![
            25 * MS - 100_000,
            5 * MS - 100_000,
            25 * MS - 100_000,
            5 * MS - 100_000,
            25 * MS - 100_000,
            5 * MS - 100_000
        ]
    );
    // What analyze makes of this request is tested in analyze (a floor above).
}

#[test]
fn concurrent_requests_with_the_same_prompt_prefix_keep_their_own_tokens() {
    let mut net = Net::default();
    for k in 0..8u16 {
        proxied(
            &mut net,
            1_000 * MS + u64::from(k) * 7 * MS,
            41000 + k,
            51000 + k,
            &format!("req-{k}"),
        );
    }
    let tl = stitch(&net.events, false);
    assert_eq!(tl.requests.len(), 8);
    for r in &tl.requests {
        assert_eq!(
            r.points.len(),
            4,
            "request {} joined across the proxy",
            r.id
        );
        assert_eq!(
            r.chunk_mismatches, 0,
            "request {}: no chunk from another request",
            r.id
        );
        assert_eq!(r.tokens(), 6);
    }
}

#[test]
fn keep_alive_requests_are_separate_and_only_the_first_pays_connect() {
    let mut net = Net::default();
    let a = net.connect(0, (BENCH, "bench", 40000), (ENGINE, "engine", 9000));
    let srv = net.peer_of(a);
    for k in 0..3u64 {
        let t = 10 * MS + k * 100 * MS;
        net.send(t, BENCH, a, &request_bytes(&format!("p{k}")), 10_000);
        net.send(t + 20 * MS, ENGINE, srv, HEAD, 10_000);
        net.send(t + 30 * MS, ENGINE, srv, &token("x", 0), 10_000);
        net.send(
            t + 40 * MS,
            ENGINE,
            srv,
            &[chunk("data: [DONE]\n\n"), b"0\r\n\r\n".to_vec()].concat(),
            10_000,
        );
    }
    let tl = stitch(&net.events, true);
    assert_eq!(tl.requests.len(), 3);
    let new: Vec<bool> = tl.requests.iter().map(|r| r.new_connection).collect();
    assert_eq!(new, vec![true, false, false]);
    assert_eq!(
        tl.requests[1].start_ns,
        110 * MS,
        "a reused connection's request starts at its first byte"
    );
    assert!(
        tl.requests.iter().all(|r| r.events_dropped),
        "drops mark every request"
    );
    assert!(tl.requests.iter().all(|r| r.points.len() == 2));
}

#[test]
fn a_process_that_calls_itself_is_not_a_proxy_even_when_its_read_is_timed_first() {
    // A load generator inside the engine's process (the lab's demo and tests): one pid is
    // both ends of a loopback connection. The probes can time the server's read of the
    // request a few microseconds before the client's write of it; that must not read as
    // the process forwarding its accepted request upstream, to itself.
    const LAB: u32 = 40;
    let mut net = Net::default();
    let t0 = 1_000 * MS;
    let c = net.connect(t0, (LAB, "lab", 5000), (LAB, "lab", 9000));
    let s = net.peer_of(c);
    let req = request_bytes("self");
    use crate::ingest::model::Direction;
    net.io(t0 + MS, LAB, "lab", s, Direction::Recv, &req);
    net.io(t0 + MS + 7_000, LAB, "lab", c, Direction::Send, &req);
    net.send(t0 + 50 * MS, LAB, s, HEAD, 50_000);
    for i in 0..3 {
        net.send(
            t0 + (100 + 20 * i as u64) * MS,
            LAB,
            s,
            &token("self", i),
            100_000,
        );
    }
    let done = [chunk("data: [DONE]\n\n"), b"0\r\n\r\n".to_vec()].concat();
    net.send(t0 + 200 * MS, LAB, s, &done, 100_000);
    let tl = stitch(&net.events, false);
    assert_eq!(tl.requests.len(), 1, "{:#?}", tl.requests);
    let kinds: Vec<PointKind> = tl.requests[0].points.iter().map(|p| p.kind).collect();
    assert_eq!(kinds, vec![PointKind::ClientRead, PointKind::EngineWrite]);
    assert!(tl.requests[0].points.iter().all(|p| p.token_ns.len() == 3));
}
