//! The one parser for durations on every command line (`30s`, `500ms`, `2m`, `1h`, a
//! bare number of seconds). Zero and negative durations are refused: no option of
//! tokenscope or its lab means anything by them.

use std::time::Duration;

pub fn parse(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("'{s}': expected a duration such as 500ms, 10s or 2m"))?;
    let secs = match unit.trim() {
        "" | "s" => n,
        "ms" => n / 1e3,
        "m" | "min" => n * 60.0,
        "h" => n * 3600.0,
        other => return Err(format!("'{s}': unknown unit '{other}' (use ms, s, m or h)")),
    };
    if !secs.is_finite() || secs <= 0.0 {
        return Err(format!("'{s}': must be positive"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::parse;
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
}
