//! The one parser for durations on every command line (`30s`, `500ms`, `2m`, `1h`, a
//! bare number of seconds) and in objectives (`ttft_p95=300ms`). Zero and negative
//! durations are refused: no option of tokenscope or its lab means anything by them.

use std::time::Duration;

/// Units of options (run lengths, windows, intervals) and their length in ns.
const OPTION_UNITS: &[(&str, f64)] = &[
    ("s", 1e9),
    ("ms", 1e6),
    ("m", 60e9),
    ("min", 60e9),
    ("h", 3600e9),
];

/// Units of latencies (SLO limits): a latency always names one, and minutes or hours
/// for a token's latency are a slip of the pen.
const LATENCY_UNITS: &[(&str, f64)] = &[
    ("ns", 1.0),
    ("us", 1e3),
    ("µs", 1e3),
    ("ms", 1e6),
    ("s", 1e9),
];

/// A duration option: `500ms`, `10s`, `2m`, `1h`, or a bare number of seconds.
pub fn parse(s: &str) -> Result<Duration, String> {
    parse_in(s, OPTION_UNITS, Some(1e9), "use ms, s, m or h")
}

/// A latency with its unit: `300ms`, `0.05s`, `1500us`, `800ns`.
pub fn parse_latency(s: &str) -> Result<Duration, String> {
    parse_in(s, LATENCY_UNITS, None, "use ns, us, ms or s")
}

/// `s` as a number and one of `units` (`bare`: the scale of a number without one),
/// rounded to whole nanoseconds.
fn parse_in(
    s: &str,
    units: &[(&str, f64)],
    bare: Option<f64>,
    hint: &str,
) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("'{s}': expected a duration such as 500ms or 10s"))?;
    let scale = match unit.trim() {
        "" => bare.ok_or_else(|| format!("'{s}': the duration needs a unit ({hint})"))?,
        unit => units
            .iter()
            .find(|(name, _)| *name == unit)
            .map(|(_, scale)| *scale)
            .ok_or_else(|| format!("'{s}': unknown unit '{unit}' ({hint})"))?,
    };
    let ns = (n * scale).round();
    if !ns.is_finite() || ns < 1.0 {
        return Err(format!("'{s}': must be positive"));
    }
    if ns > u64::MAX as f64 {
        return Err(format!("'{s}': too long"));
    }
    Ok(Duration::from_nanos(ns as u64))
}

#[cfg(test)]
mod tests {
    use super::{parse, parse_latency};
    use std::time::Duration;

    #[test]
    fn units_bare_seconds_and_refusals() {
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse("7"), Ok(Duration::from_secs(7)));
        assert_eq!(parse(" 1.5s "), Ok(Duration::from_millis(1500)));
        for bad in ["0s", "0", "", "fast", "3 parsecs", "-1s", "1e9999s"] {
            assert!(parse(bad).is_err(), "{bad:?} is refused");
        }
    }

    #[test]
    fn latencies_name_a_sub_minute_unit() {
        assert_eq!(parse_latency("300ms"), Ok(Duration::from_millis(300)));
        assert_eq!(parse_latency("0.05s"), Ok(Duration::from_millis(50)));
        assert_eq!(parse_latency("1500us"), Ok(Duration::from_micros(1500)));
        assert_eq!(parse_latency("2µs"), Ok(Duration::from_micros(2)));
        assert_eq!(parse_latency("800ns"), Ok(Duration::from_nanos(800)));
        for bad in ["300", "1h", "2m", "0ms", "x ms", "99999999999999999999999s"] {
            assert!(parse_latency(bad).is_err(), "{bad:?} is refused");
        }
    }
}
