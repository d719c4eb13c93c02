//! Rule 7 against a busy reader: a hold through which the reader left another
//! stream's token unread is not Nagle.

use super::nagle;
use crate::diagnose::rules::readers::Readers;
use crate::diagnose::Input;
use crate::stitch::request::Forward;
use crate::stitch::{PointKind, Request};

const MS: u64 = 1_000_000;

/// A stream read by process 7: tokens sent at `sent`, each crossing the hop in `delay`.
fn stream(id: usize, sent: &[u64], delay: &[u64]) -> Request {
    let read: Vec<u64> = sent.iter().zip(delay).map(|(s, d)| s + d).collect();
    let mut r = Request::at_point(id, PointKind::ClientRead, 7, "reader", read);
    let mut writer = r.points[0].clone();
    writer.kind = PointKind::EngineWrite;
    writer.pid = 3;
    writer.token_ns = sent.to_vec();
    r.points.push(writer);
    r.forward.push(Forward::between(&r.points, 0));
    r
}

/// 64 tokens 16 ms apart crossing in 0.2 ms, every 8th held 40 ms (a delayed ACK),
/// the next two read with it (TCP delivers in order).
fn held_stream() -> (Vec<u64>, Request) {
    let sent: Vec<u64> = (0..64).map(|k| 1_000 * MS + k * 16 * MS).collect();
    let delay: Vec<u64> = (0..64u64)
        .map(|k| match k % 8 {
            _ if k < 8 => MS / 5,
            0 => 40 * MS,
            1 => 24 * MS,
            2 => 8 * MS,
            _ => MS / 5,
        })
        .collect();
    let r = stream(0, &sent, &delay);
    (sent, r)
}

fn input(requests: &[Request]) -> Input<'_> {
    Input {
        requests: requests.iter().collect(),
        steps: &[],
        nvml: &[],
        shares: &[],
    }
}

#[test]
fn held_segments_are_nagle_unless_the_reader_sat_on_another_streams_data() {
    let (sent, a) = held_stream();
    let alone = [a.clone()];
    let f = nagle(&input(&alone)).expect("a stream with 7 held tokens and nothing else");
    assert_eq!(f.diagnosis.evidence.figures[0].value, 7.0);

    // The same reader had another stream's token waiting through each hold: it was
    // busy (an event loop that reads every socket late), not held by the sender.
    let waiting: Vec<u64> = (1..8).map(|h| sent[h * 8] - MS).collect();
    let b = stream(1, &waiting, &vec![42 * MS; waiting.len()]);
    let busy = [a.clone(), b];
    assert!(nagle(&input(&busy)).is_none(), "a busy reader is not Nagle");
    let readers = Readers::of(&input(&busy).requests, |_| true);
    let (from, to) = (sent[8], sent[8] + 40 * MS);
    assert!(readers.sat_on_other_data(7, 0, (from, to)));
    assert!(
        !readers.sat_on_other_data(7, 1, (from, to)),
        "not its own data"
    );
    assert!(
        !readers.sat_on_other_data(8, 0, (from, to)),
        "another reader"
    );
    // The table holds only the readers asked for (nagle asks for its candidates').
    let others = Readers::of(&input(&busy).requests, |pid| pid != 7);
    assert!(
        !others.sat_on_other_data(7, 0, (from, to)),
        "reader 7 left out"
    );

    // Another stream the reader read promptly does not excuse the hold.
    let prompt = stream(1, &waiting, &vec![MS / 5; waiting.len()]);
    assert!(nagle(&input(&[a, prompt])).is_some());
}

/// `n` keep-alive responses read by one process (a threaded client), heads 1 ms apart:
/// each head crosses in 0.05 ms, its 16 tokens are written 2 ms apart from 2 ms after the
/// head, and the first `held` responses' tokens all wait for the head's delayed ACK, 40 ms
/// after it and 4 ms longer for each earlier response (an earlier head's ACK comes last).
fn behind_heads(n: usize, held: usize, head_apart: bool) -> Vec<Request> {
    (0..n)
        .map(|i| {
            let head = 1_000 * MS + i as u64 * MS;
            let first = if head_apart { head + 2 * MS } else { head };
            let sent: Vec<u64> = (0..16).map(|k| first + k * 2 * MS).collect();
            let release = head + 40 * MS + (n - 1 - i) as u64 * 4 * MS;
            let delay: Vec<u64> = sent
                .iter()
                .map(|&s| {
                    if i < held {
                        release.max(s) - s + MS / 20
                    } else {
                        MS / 20
                    }
                })
                .collect();
            let mut r = stream(i, &sent, &delay);
            r.points[0].head_ns = Some(head + MS / 20);
            r.points[1].head_ns = Some(head);
            r
        })
        .collect()
}

#[test]
fn first_tokens_held_behind_the_response_head_are_nagle_and_cost_ttft() {
    // All eight streams held at once: each looks like data the reader left unread
    // while the others were held, which the sender's holds must not excuse.
    let reqs = behind_heads(8, 8, true);
    let f = nagle(&input(&reqs)).expect("eight first tokens held 38-66 ms behind their heads");
    let figure = |name: &str| {
        f.diagnosis
            .evidence
            .figures
            .iter()
            .find(|x| x.name == name)
            .unwrap_or_else(|| panic!("figure {name}: {:?}", f.diagnosis.evidence.figures))
            .value
    };
    assert_eq!(figure("first tokens held behind the head"), 8.0);
    // Written 2 ms after the head, read 40-68 ms after it: 38-66 ms longer on the hop.
    let p50 = figure("first-token hold p50");
    assert!((50.0..=54.0).contains(&p50), "{p50}");
    let want: Vec<(usize, u64)> = (0..8)
        .map(|i| (i, (38 + (7 - i as u64) * 4) * MS))
        .collect();
    assert_eq!(
        f.ttft.into_iter().collect::<Vec<_>>(),
        want,
        "each request's TTFT"
    );
    assert!(
        f.itl.is_empty(),
        "the gaps after the first token are not the finding's"
    );

    // Five of eight is still the pattern; one of eight, or heads written with the
    // first token, or tokens not held, is not.
    assert!(nagle(&input(&behind_heads(8, 5, true))).is_some());
    assert!(nagle(&input(&behind_heads(8, 1, true))).is_none());
    assert!(nagle(&input(&behind_heads(8, 0, true))).is_none());
    assert!(nagle(&input(&behind_heads(8, 8, false))).is_none());
    // Without the heads' times (a hop seen only as tokens) the form cannot be told.
    let mut headless = behind_heads(8, 8, true);
    for r in &mut headless {
        r.points[1].head_ns = None;
    }
    assert!(nagle(&input(&headless)).is_none());
}
