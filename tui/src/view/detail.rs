//! One request (Enter): the diagnoses citing it, a waterfall of its stages on one
//! time axis, then its tokens as they crossed each observation point on another,
//! so a buffering hop shows as bursts where the engine wrote evenly.

use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph};
use ratatui::Frame;

use collector::analyze::summarize;
use collector::stitch::{Point, Request};

use super::{diagnoses, fmt};
use crate::findings::Share;
use crate::rows::Row;
use crate::state::State;

const LABEL: usize = 14;
const DURATION: usize = 7;

pub fn render_detail(f: &mut Frame, state: &State, area: Rect) {
    let (Some(row), Some(r)) = (state.selected_row(), state.selected_request()) else {
        f.render_widget(Paragraph::new("no request selected"), area);
        return;
    };
    let title = format!(" request #{} {} {} ", row.index, r.method, r.route());
    let block = Block::new()
        .borders(Borders::TOP)
        .title(Line::from(title).style(Style::new().add_modifier(Modifier::BOLD)));
    let inner = block.inner(area);
    let width = inner.width as usize;
    let share = state.selected_share();
    let mut lines = summary(row, r, state.shown.events_dropped);
    lines.extend(cited_by(state, row.index, width));
    lines.extend(waterfall(r, width, share.as_ref()));
    lines.extend(token_timeline(r, width));
    lines.extend(gpu(share.as_ref()));
    lines.extend(forward(r));
    f.render_widget(Paragraph::new(lines).block(block), area);
}

fn heading(text: String) -> Line<'static> {
    Line::from(Span::styled(
        text,
        Style::new().add_modifier(Modifier::BOLD | Modifier::UNDERLINED),
    ))
}

fn summary(row: &Row, r: &Request, dropped: bool) -> Vec<Line<'static>> {
    let status = r.status.map_or_else(
        || if row.open { "open".into() } else { "-".into() },
        |s| s.to_string(),
    );
    let mut flags = Vec::new();
    for (on, word) in [
        (row.new_connection, "new-conn"),
        (row.tls, "TLS"),
        (row.coalesced, "coalesced"),
        (row.stalled, "stalled"),
        (r.encrypted, "encrypted"),
        (r.http2, "HTTP/2"),
        (r.attached_mid, "attached mid-connection"),
        (r.events_dropped || dropped, "events dropped"),
    ] {
        if on {
            flags.push(word);
        }
    }
    vec![
        Line::from(format!(
            "status {status} │ {} │ client {}",
            if flags.is_empty() {
                "no flags".to_string()
            } else {
                flags.join(" ")
            },
            row.client
        )),
        Line::from(format!(
            "TTFT {} ms (engine {}) │ ITL p50 {} p99 {} │ {} tokens │ {} tok/s",
            fmt::ms_opt(row.ttft_first_ns),
            fmt::ms_opt(row.ttft_engine_ns),
            fmt::ms_opt(row.itl_p50_ns),
            fmt::ms_opt(row.itl_p99_ns),
            row.tokens,
            row.tokens_per_s
                .map_or_else(|| "-".into(), |t| format!("{t:.0}"))
        )),
    ]
}

/// The diagnoses that list this request among their evidence, on one line.
fn cited_by(state: &State, id: usize, width: usize) -> Option<Line<'static>> {
    let cites: Vec<String> = state
        .diagnoses_citing(id)
        .map(|d| format!("[{}] {} ({})", d.rule, d.title, diagnoses::saving_short(d)))
        .collect();
    if cites.is_empty() {
        return None;
    }
    let text = format!("cited by {}", cites.join(", "));
    Some(Line::from(Span::styled(
        fmt::head(&text, width),
        Style::new().add_modifier(Modifier::BOLD),
    )))
}

/// A bar from `from` to `to` on the axis `[t0, t1]`, `width` cells, `before` up to it.
fn bar(from: u64, to: u64, t0: u64, t1: u64, width: usize, before: char) -> String {
    if width == 0 {
        return String::new();
    }
    let span = t1.saturating_sub(t0).max(1) as f64;
    let cell = |t: u64| (t.saturating_sub(t0) as f64 / span * width as f64) as usize;
    let a = cell(from).min(width - 1);
    let b = cell(to).clamp(a + 1, width);
    let mut s: String = std::iter::repeat_n(before, a).collect();
    s.extend(std::iter::repeat_n('█', b - a));
    s
}

fn waterfall(r: &Request, width: usize, share: Option<&Share>) -> Vec<Line<'static>> {
    let t0 = r.start_ns;
    let last_token = r
        .points
        .iter()
        .filter_map(|p| p.token_ns.last().or(p.record_ns.last()))
        .max()
        .copied();
    let t1 = last_token.into_iter().chain(r.end_ns).max().unwrap_or(t0);
    let st = &r.stages;
    let mut stages: Vec<(&str, u64, Option<u64>)> = vec![
        ("connect", t0, st.connect_ns),
        ("TLS", t0 + st.connect_ns.unwrap_or(0), st.tls_ns),
        ("upload", r.first_byte_ns, st.upload_ns),
        ("gateway", r.first_byte_ns, st.gateway_ns),
        ("  sub-requests", r.first_byte_ns, st.subrequest_ns),
    ];
    if let Some(arrived) = r.engine_received_ns {
        stages.push(("engine wait", arrived, st.upstream_wait_ns));
        if let Some(g) = share {
            stages.push(("  queue", arrived, g.queue_ns));
            let prefill_from = arrived + g.queue_ns.unwrap_or(0);
            stages.push((
                "  prefill",
                prefill_from,
                (g.prefill_steps > 0).then_some(g.prefill_ns),
            ));
        }
    }
    let bar_width = width.saturating_sub(LABEL + DURATION + 2);
    let mut lines = vec![heading(format!(
        "waterfall, ms from request start (0 … {})",
        fmt::ms(t1 - t0)
    ))];
    for (label, from, dur) in stages {
        let Some(dur) = dur else { continue };
        lines.push(stage_line(
            label,
            dur,
            bar(from, from + dur, t0, t1, bar_width, ' '),
        ));
    }
    for p in [r.points.last(), r.points.first()].into_iter().flatten() {
        let times = if p.token_ns.is_empty() {
            &p.record_ns
        } else {
            &p.token_ns
        };
        if let (Some(&a), Some(&b)) = (times.first(), times.last()) {
            let label = format!("@{}", short_label(p));
            lines.push(stage_line(
                &label,
                a.saturating_sub(t0),
                bar(a, b, t0, t1, bar_width, '·'),
            ));
        }
        if r.points.len() == 1 {
            break;
        }
    }
    lines
}

fn stage_line(label: &str, dur_ns: u64, bar: String) -> Line<'static> {
    Line::from(vec![
        Span::raw(format!(
            "{:<LABEL$} {:>DURATION$} ",
            fmt::tail(label, LABEL),
            fmt::ms(dur_ns)
        )),
        Span::raw(bar),
    ])
}

fn short_label(p: &Point) -> &'static str {
    use collector::stitch::PointKind::*;
    match p.kind {
        EngineWrite => "engine write",
        ProxyRead => "proxy read",
        ProxyWrite => "proxy write",
        ClientRead => "client read",
    }
}

/// Tokens per time cell at every point, on one axis (first token anywhere ->
/// last token anywhere), all scaled to the fullest cell.
fn token_timeline(r: &Request, width: usize) -> Vec<Line<'static>> {
    let series: Vec<(&Point, &Vec<u64>)> = r
        .points
        .iter()
        .map(|p| {
            (
                p,
                if p.token_ns.is_empty() {
                    &p.record_ns
                } else {
                    &p.token_ns
                },
            )
        })
        .filter(|(_, t)| !t.is_empty())
        .collect();
    let (Some(t0), Some(t1)) = (
        series.iter().filter_map(|(_, t)| t.first()).min().copied(),
        series.iter().filter_map(|(_, t)| t.last()).max().copied(),
    ) else {
        return vec![heading("tokens per point: none seen".into())];
    };
    let cells = width.saturating_sub(LABEL + 1 + 10).max(1);
    let span = (t1 - t0).max(1);
    let counts: Vec<Vec<u64>> = series
        .iter()
        .map(|(_, times)| {
            let mut c = vec![0u64; cells];
            for &t in times.iter() {
                let i = (((t - t0) as u128 * cells as u128) / (span as u128 + 1)) as usize;
                c[i.min(cells - 1)] += 1;
            }
            c
        })
        .collect();
    let max = counts.iter().flatten().copied().max().unwrap_or(0);
    let mut lines = vec![heading(format!(
        "tokens per point over {} ms (█ = {max} per cell); per I/O max; +delay p50",
        fmt::ms(span)
    ))];
    for ((p, _), c) in series.iter().zip(&counts) {
        let glyphs: String = c.iter().map(|&n| fmt::block(n, max)).collect();
        // What this hop added: the token delay from the point upstream of it.
        let added = r
            .forward
            .iter()
            .find(|f| f.to == p.kind)
            .and_then(|f| summarize(&f.delay_ns(&r.points)))
            .map_or_else(String::new, |s| format!("+{}", fmt::ms(s.p50_ns)));
        lines.push(Line::from(vec![
            Span::raw(format!("{:<LABEL$} ", short_label(p))),
            Span::styled(glyphs, Style::new().add_modifier(Modifier::REVERSED)),
            Span::raw(format!(" {:>3} {added:>5}", p.max_tokens_per_io)),
        ]));
    }
    lines
}

fn gpu(share: Option<&Share>) -> Vec<Line<'static>> {
    let Some(g) = share else {
        return Vec::new();
    };
    let mut lines = vec![Line::from(format!(
        "GPU: queue {} · prefill {} in {} steps · {} decode steps",
        fmt::ms_opt(g.queue_ns),
        fmt::ms(g.prefill_ns),
        g.prefill_steps,
        g.decode_steps
    ))];
    if g.stalls > 0 {
        let by: Vec<String> = g.stalled_by.iter().map(|i| format!("#{i}")).collect();
        lines.push(Line::from(format!(
            "stalled: {} decode gaps (max {}) by the prefill of {}",
            g.stalls,
            fmt::ms(g.worst_stall_ns),
            by.join(" ")
        )));
    }
    lines
}

fn forward(r: &Request) -> Vec<Line<'static>> {
    r.forward
        .iter()
        .filter_map(|fw| {
            let s = summarize(&fw.delay_ns(&r.points))?;
            Some(Line::from(format!(
                "{}: token delay p50 {} p99 {} max {} ms",
                fw.label().replace("->", "→"),
                fmt::ms(s.p50_ns),
                fmt::ms(s.p99_ns),
                fmt::ms(s.max_ns)
            )))
        })
        .collect()
}
