//! Command-line arguments: durations (`duration::parse`, `parse_latency`) and SLO
//! objectives (`ttft_p95=300ms`, `diagnose::slo`).
#![no_main]

use collector::diagnose::slo::Slo;
use collector::duration;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let parsed = [duration::parse(&text), duration::parse_latency(&text)];
    for d in parsed.into_iter().flatten() {
        assert!(!d.is_zero(), "zero durations are refused");
    }
    if let Ok(slo) = text.parse::<Slo>() {
        assert!(slo.limit_ns >= 1, "a limit of zero passed");
        assert_eq!(slo.text, text.trim(), "the objective as written");
        let again: Slo = slo
            .to_string()
            .parse()
            .expect("an objective's own text parses");
        assert_eq!(again, slo, "printing and parsing round-trips");
    }
});
