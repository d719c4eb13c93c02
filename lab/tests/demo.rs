//! Both sides of `tokenscope-lab demo`: the untuned chain shows the classic slow stream, the
//! tuned one removes it, from the mechanisms alone.

#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

use std::time::Duration;

use tokenscope_lab::demo::{self, DemoConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untuned_demo_stalls_and_tuned_demo_streams_smoothly() {
    let base = DemoConfig {
        duration: Duration::from_secs(20),
        progress: false,
        ..DemoConfig::default()
    };
    let untuned = DemoConfig {
        tuned: false,
        ..base.clone()
    };
    let tuned = DemoConfig {
        tuned: true,
        ..base
    };
    // Both sides at once: they share no state and mostly wait on simulated GPU time.
    let (u, t) = tokio::join!(demo::run(&untuned), demo::run(&tuned));
    let (u, t) = (u.expect("untuned demo runs"), t.expect("tuned demo runs"));
    let (ur, tr) = (&u.bench.report, &t.bench.report);
    eprintln!("untuned:\n{ur}\ntuned:\n{tr}");
    assert!(
        ur.ok >= 20 && tr.ok >= 20,
        "both sides completed their load"
    );
    assert_eq!(ur.failed + tr.failed, 0, "no request failed");
    assert!(
        ur.ttft_ms.p95 > 2000.0,
        "untuned TTFT p95 is multi-second: {:.0} ms",
        ur.ttft_ms.p95
    );
    assert!(
        ur.itl_ms.p99 > 1000.0,
        "untuned p99 ITL shows second-long stalls: {:.0} ms",
        ur.itl_ms.p99
    );
    assert!(
        tr.ttft_ms.p95 < 300.0,
        "tuned TTFT p95 under 300 ms: {:.0} ms",
        tr.ttft_ms.p95
    );
    // A step that carries a prefill chunk beside the decodes takes about two decode
    // steps (the tuned budget sizes the chunk so); a stall takes dozens.
    assert!(
        tr.itl_ms.p99 < 2.5 * tr.itl_ms.mean,
        "tuned p99 ITL {:.1} ms under 2.5x the mean {:.1} ms",
        tr.itl_ms.p99,
        tr.itl_ms.mean
    );
    assert!(
        ur.itl_ms.mean > 2.0 * tr.itl_ms.mean,
        "untuned mean ITL {:.1} ms well above tuned {:.1} ms",
        ur.itl_ms.mean,
        tr.itl_ms.mean
    );
    let text = format!("{ur}");
    for needle in ["TTFT", "ITL", "TPOT", "E2E", "p99.9", "new connection"] {
        assert!(text.contains(needle), "the printed report shows {needle}");
    }
    assert!(
        !u.steps.is_empty() && !t.steps.is_empty(),
        "both engines logged steps"
    );
}
