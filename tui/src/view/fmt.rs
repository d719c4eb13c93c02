//! Numbers as the columns show them.

/// Milliseconds with the precision that matters at that size: "0.15", "23.5", "541", "12.3s".
pub fn ms(ns: u64) -> String {
    let ms = ns as f64 / 1e6;
    if ms < 10.0 {
        format!("{ms:.2}")
    } else if ms < 100.0 {
        format!("{ms:.1}")
    } else if ms < 10_000.0 {
        format!("{ms:.0}")
    } else {
        format!("{:.1}s", ms / 1000.0)
    }
}

pub fn ms_opt(ns: Option<u64>) -> String {
    ns.map_or_else(|| "-".into(), ms)
}

/// Seconds since `base`: "+12.3s".
pub fn since(ns: u64, base: u64) -> String {
    let s = ns.saturating_sub(base) as f64 / 1e9;
    if s < 100.0 {
        format!("+{s:.1}s")
    } else if s < 10_000.0 {
        format!("+{s:.0}s")
    } else {
        format!("+{:.0}m", s / 60.0)
    }
}

/// 1234 -> "1.2k", 1234567 -> "1.2M".
pub fn count(n: u64) -> String {
    match n {
        0..=9_999 => n.to_string(),
        10_000..=999_999 => format!("{:.1}k", n as f64 / 1e3),
        _ => format!("{:.1}M", n as f64 / 1e6),
    }
}

pub fn bytes(b: u64) -> String {
    let g = b as f64 / (1u64 << 30) as f64;
    if g >= 1.0 {
        format!("{g:.1} GiB")
    } else {
        format!("{:.0} MiB", b as f64 / (1u64 << 20) as f64)
    }
}

/// Keeps the end of `s` (the path end of a route says most), with a leading `…`.
pub fn tail(s: &str, width: usize) -> String {
    let n = s.chars().count();
    if n <= width {
        return s.to_string();
    }
    if width == 0 {
        return String::new();
    }
    let skip = n - (width - 1);
    std::iter::once('…').chain(s.chars().skip(skip)).collect()
}

/// Keeps the start of `s`, with a trailing `…`.
pub fn head(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        return s.to_string();
    }
    let mut out: String = s.chars().take(width.saturating_sub(1)).collect();
    if width > 0 {
        out.push('…');
    }
    out
}

/// A route without a numeric IPv4 host (kept: the port), for narrow panels:
/// "127.0.0.1:8000/v1/completions" -> ":8000/v1/completions".
pub fn route_short(route: &str) -> &str {
    let host_end = route.find('/').unwrap_or(route.len());
    let host = &route[..host_end];
    match host.rfind(':') {
        Some(colon)
            if host[..colon]
                .chars()
                .all(|c| c.is_ascii_digit() || c == '.') =>
        {
            &route[colon..]
        }
        _ => route,
    }
}

/// Eight levels of block, for sparklines drawn as text.
pub fn block(level: u64, max: u64) -> char {
    const BLOCKS: [char; 9] = [' ', '▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    if level == 0 || max == 0 {
        return BLOCKS[0];
    }
    let i = (level * 8).div_ceil(max).clamp(1, 8);
    BLOCKS[i as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn milliseconds_keep_three_significant_digits() {
        assert_eq!(ms(150_000), "0.15");
        assert_eq!(ms(23_540_000), "23.5");
        assert_eq!(ms(541_800_000), "542");
        assert_eq!(ms(12_345_000_000), "12.3s");
    }

    #[test]
    fn offsets_fit_six_columns() {
        assert_eq!(since(12_345_000_000, 0), "+12.3s");
        assert_eq!(since(861_400_000_000, 0), "+861s");
        assert_eq!(since(20_000_000_000_000, 0), "+333m");
    }

    #[test]
    fn tail_keeps_the_end() {
        assert_eq!(tail("127.0.0.1:8000/v1/completions", 12), "…completions");
        assert_eq!(tail("/v1", 12), "/v1");
    }

    #[test]
    fn short_routes_drop_numeric_hosts_only() {
        assert_eq!(
            route_short("127.0.0.1:8000/v1/completions"),
            ":8000/v1/completions"
        );
        assert_eq!(
            route_short("api.example.com/v1/chat"),
            "api.example.com/v1/chat"
        );
        assert_eq!(route_short("/v1/chat"), "/v1/chat");
        assert_eq!(head("tokio-runtime-worker", 8), "tokio-r…");
    }

    #[test]
    fn blocks_scale_to_the_max() {
        assert_eq!(block(0, 10), ' ');
        assert_eq!(block(1, 100), '▁');
        assert_eq!(block(10, 10), '█');
    }
}
