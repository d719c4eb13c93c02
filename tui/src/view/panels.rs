//! Under the table: ITL per route, TTFT over time, diagnoses (view::diagnoses).

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph};
use ratatui::Frame;

use super::fmt;
use crate::state::State;

pub fn render_panels(f: &mut Frame, state: &State, area: Rect) {
    // The diagnoses get the most room: their lines are words, not columns of figures.
    let [itl, ttft, diag] = Layout::horizontal([
        Constraint::Percentage(43),
        Constraint::Percentage(22),
        Constraint::Percentage(35),
    ])
    .areas(area);
    render_itl_by_route(f, state, itl);
    render_ttft_over_time(f, state, ttft);
    super::diagnoses::render_diagnoses(f, state, diag);
}

pub(super) fn panel(title: &str) -> Block<'_> {
    Block::new()
        .borders(Borders::TOP | Borders::RIGHT)
        .title(Line::from(title).style(Style::new().add_modifier(Modifier::BOLD)))
}

/// Per route: a histogram of its gaps (0, <5, <10, <25, <50, <100, <250 ms, <1 s, more)
/// and the p99; the route on a line of its own when the panel is narrow.
fn render_itl_by_route(f: &mut Frame, state: &State, area: Rect) {
    let block = panel(" ITL per route: 0…≥1s, p99 ms ");
    let inner = block.inner(area);
    let width = inner.width as usize;
    let hist_width = crate::routes::ITL_BUCKET_LABELS.len();
    let stats_width = hist_width + 7;
    let narrow = width < 50;
    let route_width = if narrow {
        width
    } else {
        width.saturating_sub(stats_width + 1)
    };
    let mut lines: Vec<Line> = Vec::new();
    for r in &state.shown.routes {
        let max = r.histogram.iter().copied().max().unwrap_or(0);
        let hist: String = r.histogram.iter().map(|&n| fmt::block(n, max)).collect();
        let route = format!(
            "{:<route_width$}",
            fmt::tail(fmt::route_short(&r.route), route_width)
        );
        let stats = vec![
            Span::styled(hist, Style::new().add_modifier(Modifier::REVERSED)),
            Span::raw(format!(" {:>6}", fmt::ms_opt(r.p99_ns))),
        ];
        if narrow {
            lines.push(Line::from(route));
            lines.push(Line::from(
                std::iter::once(Span::raw(" "))
                    .chain(stats)
                    .collect::<Vec<_>>(),
            ));
        } else {
            lines.push(Line::from(
                std::iter::once(Span::raw(route + " "))
                    .chain(stats)
                    .collect::<Vec<_>>(),
            ));
        }
    }
    if lines.is_empty() {
        lines.push(Line::from("no tokens yet"));
    }
    f.render_widget(Paragraph::new(lines).block(block), area);
}

/// p50 and p99 of TTFT (first point) per second of request starts, newest right.
fn render_ttft_over_time(f: &mut Frame, state: &State, area: Rect) {
    let block = panel(" TTFT per 1 s, ms ");
    let inner = block.inner(area);
    let label = 4;
    let value = 6;
    let width = (inner.width as usize).saturating_sub(label + value + 1);
    let windows = &state.shown.ttft_windows;
    let shown = &windows[windows.len().saturating_sub(width)..];
    if shown.is_empty() {
        f.render_widget(Paragraph::new("no first tokens yet").block(block), area);
        return;
    }
    let max = shown.iter().map(|w| w.p99_ns).max().unwrap_or(0);
    let spark = |pick: fn(&crate::rows::TtftWindow) -> u64| -> String {
        shown.iter().map(|w| fmt::block(pick(w), max)).collect()
    };
    let last = shown[shown.len() - 1];
    let lines = vec![
        Line::from(format!(
            "p99 {:<width$} {:>value$}",
            spark(|w| w.p99_ns),
            fmt::ms(last.p99_ns)
        )),
        Line::from(format!(
            "p50 {:<width$} {:>value$}",
            spark(|w| w.p50_ns),
            fmt::ms(last.p50_ns)
        )),
        Line::from(Span::styled(
            format!("max {} over {} s", fmt::ms(max), shown.len()),
            Style::new().add_modifier(Modifier::DIM),
        )),
    ];
    f.render_widget(Paragraph::new(lines).block(block), area);
}
