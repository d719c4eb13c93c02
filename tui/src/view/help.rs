//! `?`: keys, columns, flags and panels, over whatever is on screen.

use ratatui::layout::{Constraint, Flex, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Clear, Paragraph, Wrap};
use ratatui::Frame;

const HELP: &[&str] = &[
    "q Ctrl-C  quit          j k ↑ ↓  move   PgUp PgDn g G",
    "Enter     open request  Esc      back / clear filter",
    "/         filter        s        sort: start, TTFT, ITL p99",
    "p         pause screen  ?        this help",
    "",
    "Times in ms. TTFT: first token - request start (connect when",
    "the request opened its connection), at the first point traced",
    "(the client's read) and @eng at the engine's write.",
    "ITL50/99: gaps between tokens at that point; 0 = same read.",
    "tok/s: (tokens - 1) / (last - first token).",
    "Flags NTCS: New connection, TLS, Coalesced (several tokens",
    "in one I/O), Stalled (a decode gap waited on another",
    "request's prefill). Italic rows are still open.",
    "ITL panel buckets: 0 <5 <10 <25 <50 <100 <250 ms <1 s ≥1 s.",
    "Filter text matches route, client, status or flag names",
    "(new-conn tls coalesced stalled http2 open).",
    "Diagnoses panel: what tokenscope report's rules find in the",
    "window, largest saving first: [rule] fix, ~its share of the",
    "TTFT p95 saving, where; then what was seen. A request's",
    "detail names the diagnoses citing it; the report has fixes.",
];

pub fn render_help(f: &mut Frame, area: Rect) {
    let width =
        (HELP.iter().map(|l| l.chars().count()).max().unwrap_or(0) as u16 + 2).min(area.width);
    let height = (HELP.len() as u16 + 2).min(area.height);
    let [row] = Layout::vertical([Constraint::Length(height)])
        .flex(Flex::Center)
        .areas(area);
    let [popup] = Layout::horizontal([Constraint::Length(width)])
        .flex(Flex::Center)
        .areas(row);
    f.render_widget(Clear, popup);
    let lines: Vec<Line> = HELP.iter().map(|l| Line::from(*l)).collect();
    f.render_widget(
        Paragraph::new(lines).wrap(Wrap { trim: false }).block(
            Block::bordered()
                .title(" help (? or Esc closes) ")
                .title_style(Style::new().add_modifier(Modifier::BOLD)),
        ),
        popup,
    );
}
