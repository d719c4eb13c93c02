use super::*;
use crate::analyze::summarize;
use crate::stitch::PointKind;

const MS: u64 = 1_000_000;

/// A request seen at the client: first token after `ttft`, then tokens `gap` apart.
fn request(id: usize, ttft: u64, gaps: &[u64]) -> Request {
    let start = id as u64 * 10_000 * MS;
    let mut tokens = vec![start + ttft];
    for g in gaps {
        tokens.push(tokens.last().unwrap() + g);
    }
    let mut r = Request::at_point(id, PointKind::ClientRead, 1, "client", tokens);
    r.path = "/v1/chat/completions".into();
    r.host = Some("api".into());
    r.status = Some(200);
    r.start_ns = start;
    r.first_byte_ns = start;
    r.points[0].ttft_ns = Some(ttft);
    r
}

fn finding(rule: u8, ttft: &[(usize, u64)], itl: &[((usize, usize), i64)]) -> Finding {
    Finding {
        diagnosis: Diagnosis {
            rule,
            key: rules::RULES.iter().find(|r| r.0 == rule).unwrap().1,
            title: rules::RULES.iter().find(|r| r.0 == rule).unwrap().2,
            finding: String::new(),
            scope: String::new(),
            evidence: Evidence::default(),
            saving: Saving::default(),
            fix: Vec::new(),
        },
        ttft: ttft.iter().copied().collect(),
        ttft_added: BTreeMap::new(),
        itl: itl.iter().copied().collect(),
        instead: None,
    }
}

#[test]
fn shares_add_up_to_the_joint_saving_and_alone_is_each_fix_by_itself() {
    let reqs: Vec<Request> = (0..20).map(|i| request(i, 1000 * MS, &[20 * MS])).collect();
    let all = |ms: u64| -> Vec<(usize, u64)> { (0..20).map(|i| (i, ms * MS)).collect() };
    // Independent causes: 600 + 300 ms of every request's 1000 ms.
    let out = share_savings(
        &refs(&reqs),
        vec![finding(2, &all(600), &[]), finding(4, &all(300), &[])],
    );
    let saving = |d: &Diagnosis| {
        (
            d.saving.ttft_p95_ns.unwrap(),
            d.saving.ttft_p95_alone_ns.unwrap(),
        )
    };
    assert_eq!(saving(&out[0]), (600 * MS, 600 * MS));
    assert_eq!(saving(&out[1]), (300 * MS, 300 * MS));
    // Overlapping causes: each alone would free 800 ms, together they cannot free more
    // than the whole 1000 ms; the joint saving is shared, and the shares add up to it.
    let out = share_savings(
        &refs(&reqs),
        vec![finding(2, &all(800), &[]), finding(3, &all(800), &[])],
    );
    assert_eq!(saving(&out[0]), (500 * MS, 800 * MS));
    assert_eq!(saving(&out[1]), (500 * MS, 800 * MS));
    // A rule with no TTFT removal claims no TTFT saving.
    let out = share_savings(
        &refs(&reqs),
        vec![finding(5, &[], &[((0, 0), 10 * MS as i64)])],
    );
    assert_eq!(out[0].saving.ttft_p95_ns, None);
}

#[test]
fn a_fix_that_costs_ttft_claims_none_and_shrinks_the_others_joint_saving() {
    let reqs: Vec<Request> = (0..20).map(|i| request(i, 1000 * MS, &[20 * MS])).collect();
    let all = |ms: u64| -> Vec<(usize, u64)> { (0..20).map(|i| (i, ms * MS)).collect() };
    // Rule 2 frees 600 ms of every request; rule 5 adds 200 ms back to every one.
    let mut chunked = finding(5, &[], &[]);
    chunked.ttft_added = all(200).into_iter().collect();
    let out = share_savings(&refs(&reqs), vec![finding(2, &all(600), &[]), chunked]);
    assert_eq!(out[1].saving.ttft_p95_ns, Some(0), "a cost is no saving");
    assert_eq!(out[1].saving.ttft_p95_alone_ns, Some(0));
    // Joint: 1000 -> 600 ms, 400 ms in all. Rule 2's share is its mean marginal saving,
    // (600 + (400 - 0)) / 2 = 500 (a cost alone counts as no saving, not a negative
    // one); rule 5's negative share is clamped to none, so the shares add up to more
    // than the joint saving by what the cost takes back.
    assert_eq!(out[0].saving.ttft_p95_alone_ns, Some(600 * MS));
    assert_eq!(out[0].saving.ttft_p95_ns, Some(500 * MS));
}

#[test]
fn itl_savings_come_from_the_gaps_a_rule_shortens() {
    // 10 requests x 20 gaps of 20 ms, and one 500 ms gap in each of 3 requests.
    let reqs: Vec<Request> = (0..10)
        .map(|i| {
            let mut gaps = vec![20 * MS; 20];
            if i < 3 {
                gaps[5] = 500 * MS;
            }
            request(i, 100 * MS, &gaps)
        })
        .collect();
    let stalls: Vec<((usize, usize), i64)> = (0..3).map(|i| ((i, 5), 480 * MS as i64)).collect();
    let out = share_savings(&refs(&reqs), vec![finding(5, &[], &stalls)]);
    // p99 of 200 gaps: rank 197.01 of the sorted gaps, i.e. a 500 ms gap; after: 20 ms.
    assert_eq!(out[0].saving.itl_p99_ns, Some(480 * MS));
    assert_eq!(out[0].saving.itl_p99_alone_ns, Some(480 * MS));
}

#[test]
fn a_prompt_shares_the_whole_kib_an_earlier_prompt_sent() {
    let mut reqs: Vec<Request> = (0..3).map(|i| request(i, 100 * MS, &[])).collect();
    reqs[0].prefix_prints = vec![1, 2, 3, 4];
    reqs[0].body_bytes = Some(4096 + 100);
    reqs[1].prefix_prints = vec![1, 2, 3, 9]; // 3 KiB shared of 4.5 KiB
    reqs[1].body_bytes = Some(4608);
    reqs[2].prefix_prints = vec![7, 8];
    reqs[2].body_bytes = Some(2048);
    let f = rules::shared_fractions(&refs(&reqs));
    assert_eq!(f[0], Some(0.0), "the first prompt shares nothing");
    assert!((f[1].unwrap() - 3072.0 / 4608.0).abs() < 1e-9);
    assert_eq!(f[2], Some(0.0));
}

#[test]
fn the_slo_gate_lists_violations_with_the_diagnoses_that_help_most() {
    let reqs: Vec<Request> = (0..20)
        .map(|i| request(i, 400 * MS, &[20 * MS; 5]))
        .collect();
    let all = |ms: u64| -> Vec<(usize, u64)> { (0..20).map(|i| (i, ms * MS)).collect() };
    let diagnoses = share_savings(
        &refs(&reqs),
        vec![finding(1, &all(10), &[]), finding(2, &all(300), &[])],
    );
    let slos: Vec<Slo> = ["ttft_p95=300ms", "itl_p99=50ms", "ttft_p50=500ms"]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
    let r = slo::check(&slos, &reqs, &diagnoses);
    assert!(!r[0].met && r[0].measured_ns == Some(400 * MS));
    assert_eq!(r[0].top_diagnoses, vec![2, 1], "the larger saving first");
    assert!(r[1].met && r[1].top_diagnoses.is_empty());
    assert!(r[2].met);
    // No samples at all is not a pass.
    let r = slo::check(&slos[..1], &[], &[]);
    assert!(!r[0].met && r[0].measured_ns.is_none());
}

#[test]
fn the_linear_time_percentile_matches_the_reports() {
    let mut seed = 7u64;
    for n in [1usize, 2, 3, 10, 101, 1000] {
        let v: Vec<u64> = (0..n)
            .map(|_| {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                seed >> 40
            })
            .collect();
        let s = summarize(&v).unwrap();
        assert_eq!(p95(&mut v.clone()), s.p95_ns, "p95 of {n}");
        assert_eq!(p99(&mut v.clone()), s.p99_ns, "p99 of {n}");
    }
    assert_eq!(p95(&mut []), 0);
}

/// The requests as `Input` holds them.
fn refs(requests: &[Request]) -> Vec<&Request> {
    requests.iter().collect()
}
