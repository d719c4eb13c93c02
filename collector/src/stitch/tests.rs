//! Stitching on synthetic traffic (see testnet).

use super::testnet::*;
use super::*;
use crate::protocol::limits::Limit;

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
    assert_eq!(
        r.stages.gateway_ttft_ns,
        Some(125 * MS + 200_000 - (96 * MS - 100_000)),
        "client TTFT 125.2 ms less the engine's 95.9 ms (its request's first byte at +4.1 ms)"
    );
    let fwd = r
        .forward
        .iter()
        .find(|f| f.from == PointKind::ProxyRead && f.to == PointKind::ProxyWrite)
        .unwrap();
    assert_eq!(
        fwd.delay_ns(&r.points),
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

/// A gateway that rewrites each request and re-serialises each event (keys reordered,
/// fields dropped, a role-only chunk first and a finish chunk added), serving three
/// interleaved streams: each is joined to its upstream request by its tokens' text.
#[test]
fn a_rewriting_gateway_is_joined_by_the_text_of_the_tokens_it_forwards() {
    const GATEWAY: u32 = 40;
    let mut net = Net::default();
    let t0 = 1_000 * MS;
    let words = |k: usize, i: usize| format!(" w{k}x{i}");
    let post = |path: &str, body: &str| {
        format!(
            "POST {path} HTTP/1.1\r\nHost: lab\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let mut streams = Vec::new();
    for k in 0..3usize {
        let t = t0 + k as u64 * 2 * MS;
        let a = net.connect(
            t,
            (BENCH, "client", 41000 + k as u16),
            (GATEWAY, "litellm", 4000),
        );
        let req = post(
            "/chat/completions",
            &format!("{{\"model\":\"m\",\"messages\":[{{\"role\":\"user\",\"content\":\"q{k}\"}}],\"stream\":true}}"),
        );
        net.send(t + MS, BENCH, a, req.as_bytes(), 100_000);
        // Upstream, the gateway's own body (other keys, stream_options added).
        let b = net.connect(
            t + 3 * MS,
            (GATEWAY, "litellm", 51000 + k as u16),
            (ENGINE, "engine", 9000),
        );
        let up = post(
            "/v1/chat/completions",
            &format!("{{\"messages\":[{{\"content\":\"q{k}\",\"role\":\"user\"}}],\"model\":\"m\",\"stream\":true,\"stream_options\":{{\"include_usage\":true}}}}"),
        );
        net.send(t + 4 * MS, GATEWAY, b, up.as_bytes(), 100_000);
        streams.push((net.peer_of(a), net.peer_of(b), b, t));
    }
    let engine_event = |k: usize, i: usize| {
        chunk(&format!(
            "data: {{\"choices\":[{{\"delta\":{{\"content\":\"{}\"}},\"finish_reason\":null,\"index\":0}}],\"id\":\"e{k}\",\"object\":\"chat.completion.chunk\"}}\n\n",
            words(k, i)
        ))
    };
    let gateway_event = |k: usize, content: &str| {
        chunk(&format!(
            "data: {{\"id\":\"e{k}\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{{content}}}}}]}}\n\n"
        ))
    };
    for &(a_srv, e, _, t) in &streams {
        net.send(t + 50 * MS, ENGINE, e, HEAD, 50_000);
        net.send(t + 51 * MS, GATEWAY, a_srv, HEAD, 50_000);
    }
    for i in 0..5 {
        for (k, &(a_srv, e, _, t)) in streams.iter().enumerate() {
            let ts = t + 100 * MS + i as u64 * 20 * MS;
            net.send(ts, ENGINE, e, &engine_event(k, i), 100_000);
            let mut out = Vec::new();
            if i == 0 {
                out.extend(gateway_event(k, "\"role\":\"assistant\",\"content\":\"\""));
            }
            out.extend(gateway_event(
                k,
                &format!("\"content\":\"{}\"", words(k, i)),
            ));
            net.send(ts + 3 * MS, GATEWAY, a_srv, &out, 100_000);
        }
    }
    for (k, &(a_srv, e, _, t)) in streams.iter().enumerate() {
        let done = [chunk("data: [DONE]\n\n"), b"0\r\n\r\n".to_vec()].concat();
        net.send(t + 200 * MS, ENGINE, e, &done, 100_000);
        let fin = [gateway_event(k, ""), done].concat();
        net.send(t + 205 * MS, GATEWAY, a_srv, &fin, 100_000);
    }
    net.events.sort_by_key(|e| e.ts_ns);
    let tl = stitch(&net.events, false);
    assert_eq!(
        tl.requests.len(),
        3,
        "one request per stream: {:#?}",
        tl.requests
    );
    for r in &tl.requests {
        let kinds: Vec<PointKind> = r.points.iter().map(|p| p.kind).collect();
        assert_eq!(
            kinds,
            [
                PointKind::ClientRead,
                PointKind::ProxyWrite,
                PointKind::ProxyRead,
                PointKind::EngineWrite
            ],
            "{r:#?}"
        );
        assert_eq!(r.join, Some("by-tokens"));
        // Its own stream: the engine's first token at +100 ms of its own start.
        let engine = r.point(PointKind::EngineWrite).unwrap();
        assert_eq!(engine.token_ns[0], r.start_ns + 100 * MS);
        let client = r.point(PointKind::ClientRead).unwrap();
        // The client's first token is the role-only chunk, read with token 0 at
        // +103.1 ms of its connect(); the engine's own TTFT runs from its request's
        // first byte (+4.1 ms) to its first token (+100 ms).
        assert_eq!(client.ttft_ns, Some(103 * MS + 100_000));
        assert_eq!(
            r.stages.gateway_ttft_ns,
            Some(103 * MS + 100_000 - (100 * MS - 4 * MS - 100_000))
        );
    }
}

/// The same gateway, but what it wrote is not what it read (other texts): no join.
#[test]
fn a_gateway_whose_tokens_differ_from_upstream_is_not_joined() {
    let mut net = Net::default();
    proxied(&mut net, 1_000 * MS, 40000, 50000, "req-a");
    let tl = stitch(&net.events, false);
    assert_eq!(tl.requests[0].join, None, "joined by body print");
    let texts = |x: &[(u64, u64)]| x.to_vec();
    assert!(super::chain::forwarded_for_tests(
        &texts(&[(1, 10), (2, 20)]),
        &[(1, 5), (2, 15)]
    ));
    assert!(!super::chain::forwarded_for_tests(
        &[(1, 10), (3, 20)],
        &[(1, 5), (2, 15)]
    ));
    assert!(
        !super::chain::forwarded_for_tests(&[(1, 4), (2, 20)], &[(1, 5), (2, 15)]),
        "a token written before it was read is not forwarded"
    );
    assert!(!super::chain::forwarded_for_tests(&[], &[(1, 5)]));
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

/// A client straight to an engine that answers with `head` and then one write per
/// item of `body` (already framed), 20 ms apart from +100 ms.
fn direct(net: &mut Net, t0: u64, port: u16, head: &[u8], body: &[Vec<u8>]) {
    let a = net.connect(t0, (BENCH, "bench", port), (ENGINE, "engine", 9000));
    net.send(t0 + MS, BENCH, a, &request_bytes("p"), 100_000);
    let e = net.peer_of(a);
    net.send(t0 + 50 * MS, ENGINE, e, head, 50_000);
    for (i, b) in body.iter().enumerate() {
        net.send(t0 + 100 * MS + i as u64 * 20 * MS, ENGINE, e, b, 100_000);
    }
    net.close(t0 + 100 * MS + body.len() as u64 * 20 * MS, a);
}

fn sse(events: &[&str]) -> Vec<Vec<u8>> {
    events.iter().map(|e| chunk(&format!("{e}\n\n"))).collect()
}

fn one(head: &[u8], body: &[Vec<u8>]) -> Request {
    let mut net = Net::default();
    direct(&mut net, 1_000 * MS, 40000, head, body);
    let mut tl = stitch(&net.events, false);
    assert_eq!(tl.requests.len(), 1);
    tl.requests.remove(0)
}

#[test]
fn each_api_is_named_and_its_tokens_timed_by_its_own_rule() {
    let anthropic = sse(&[
        r#"event: message_start
data: {"type":"message_start","message":{"id":"m","content":[]}}"#,
        "event: ping\ndata: {\"type\":\"ping\"}",
        r#"event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"h"}}"#,
        r#"event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Hi"}}"#,
        ": keep-alive",
        r#"event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"!"}}"#,
        "event: message_stop\ndata: {\"type\":\"message_stop\"}",
    ]);
    let r = one(HEAD, &anthropic);
    assert_eq!(r.api, Some("anthropic"));
    assert_eq!((r.tokens(), r.reasoning_tokens, r.tool_tokens), (3, 1, 0));
    let p = r.first_point().unwrap();
    assert_eq!(
        p.ttft_ns,
        Some(140 * MS + 100_000),
        "the first delta (after message_start and ping), read 100 us after its write"
    );
    assert!(p.done && !r.truncated, "message_stop ends it");

    let ndjson = [
        r#"{"model":"m","response":"a","done":false}"#,
        r#"{"model":"m","response":"b","done":false}"#,
        r#"{"model":"m","response":"","done":true,"eval_count":2}"#,
    ]
    .iter()
    .map(|l| chunk(&format!("{l}\n")))
    .collect::<Vec<_>>();
    let head = b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n";
    let r = one(head, &ndjson);
    assert_eq!((r.api, r.tokens()), (Some("ollama"), 2));
    assert_eq!(r.first_point().unwrap().itl_ns(), [20 * MS]);
}

#[test]
fn choices_are_token_streams_of_their_own() {
    let chunk_of = |i: usize, text: &str| {
        format!(
            r#"data: {{"object":"chat.completion.chunk","choices":[{{"index":{i},"delta":{{"content":"{text}"}}}}]}}"#
        )
    };
    // Choice 0 at +100, +140, +180 ms; choice 1 at +120, +160 ms; then usage and [DONE].
    let events: Vec<String> = vec![
        chunk_of(0, "a"),
        chunk_of(1, "b"),
        chunk_of(0, "c"),
        chunk_of(1, "d"),
        chunk_of(0, "e"),
        r#"data: {"object":"chat.completion.chunk","choices":[],"usage":{"completion_tokens":5}}"#
            .into(),
        "data: [DONE]".into(),
    ];
    let r = one(
        HEAD,
        &sse(&events.iter().map(String::as_str).collect::<Vec<_>>()),
    );
    assert_eq!((r.api, r.tokens()), (Some("openai-chat"), 5));
    let p = r.first_point().unwrap();
    assert_eq!(p.token_choice, [0, 1, 0, 1, 0]);
    assert_eq!(
        p.itl_ns(),
        [40 * MS, 40 * MS, 40 * MS],
        "gaps within each choice, never between choices"
    );
    assert_eq!(r.tpot_ns(), Some(40 * MS));
}

#[test]
fn an_unknown_event_stream_counts_every_data_event_and_json_is_timed_to_its_body() {
    let r = one(
        HEAD,
        &sse(&[
            "data: {\"x\":1}",
            "data: hello",
            ": ping",
            "data: {\"x\":2}",
        ]),
    );
    assert_eq!((r.api, r.tokens()), (Some("unknown-sse"), 3));
    let head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n";
    let mut net = Net::default();
    let a = net.connect(
        1_000 * MS,
        (BENCH, "bench", 40000),
        (ENGINE, "engine", 9000),
    );
    net.send(1_001 * MS, BENCH, a, &request_bytes("p"), 100_000);
    let e = net.peer_of(a);
    net.send(1_050 * MS, ENGINE, e, head, 50_000);
    net.send(1_300 * MS, ENGINE, e, b"{\"text\":1}\n", 50_000);
    net.close(1_400 * MS, a);
    let tl = stitch(&net.events, false);
    let r = &tl.requests[0];
    assert_eq!((r.api, r.tokens()), (Some("json"), 0));
    let p = r.first_point().unwrap();
    assert_eq!(
        p.ttft_ns,
        Some(300 * MS + 50_000),
        "to the first body byte, not the head"
    );
    assert!(p.itl_ns().is_empty());
}

#[test]
fn past_the_connection_cap_the_quietest_go_early_and_are_counted() {
    let mut net = Net::default();
    for i in 0..40u16 {
        let t = (1_000 + u64::from(i)) * MS;
        let csk = net.connect(t, (7, "client", 40000 + i), (9, "engine", 8000));
        net.send(t + MS, 7, csk, &request_bytes("held open"), 10_000);
    }
    let settle = Settle {
        max_connections: 8,
        ..Settle::default()
    };
    let mut s = Stitcher::new(settle, false);
    let mut early = 0;
    let mut peak = 0;
    for ev in &net.events {
        s.push(ev);
        let out = s.advance();
        peak = peak.max(s.held_connections());
        early += out
            .connections
            .iter()
            .map(|c| c.limits[Limit::Connections as usize])
            .sum::<u64>();
    }
    assert!(
        peak <= 9,
        "held at most the cap (+ the one just opened): {peak}"
    );
    assert!(
        early >= 70,
        "the 80 ends went early, but the last few: {early}"
    );
    let out = s.finish();
    let at_end: u64 = out
        .connections
        .iter()
        .map(|c| c.limits[Limit::Connections as usize])
        .sum();
    assert_eq!(at_end, 0, "what the end releases is not early");
    // Without the cap, all 80 ends are held until the end.
    let mut s = Stitcher::new(Settle::default(), false);
    for ev in &net.events {
        s.push(ev);
        s.advance();
    }
    assert_eq!(s.held_connections(), 80);
}

#[test]
fn most_tokens_per_io_counts_runs_and_survives_an_unordered_list() {
    let most = |ios: &[u32]| request::max_per_io(|| ios.iter().copied());
    assert_eq!(most(&[]), 0, "no tokens, no I/O");
    assert_eq!(
        most(&[0, 0, 1, 2, 2, 2, 5]),
        3,
        "the longest run of one I/O"
    );
    assert_eq!(
        most(&[3, 1, 3, 1, 3]),
        3,
        "out of order (never made by an exchange): counted as a map would"
    );
}
