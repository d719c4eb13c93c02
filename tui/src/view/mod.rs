//! `render(&mut Frame, &State)`: pure, one small function per panel.

pub mod detail;
pub mod diagnoses;
pub mod fmt;
pub mod header;
pub mod help;
pub mod panels;
pub mod table;

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;

use crate::state::{State, View};

/// Panels under the table need this much height to be worth showing.
const PANELS_MIN_HEIGHT: u16 = 20;

pub fn render(f: &mut Frame, state: &State) {
    let area = f.area();
    let [top, body, footer] = Layout::vertical([
        Constraint::Length(3),
        Constraint::Min(3),
        Constraint::Length(1),
    ])
    .areas(area);
    header::render_header(f, state, top);
    match state.view {
        View::Table => {
            let panel_height = if area.height >= 36 {
                10
            } else if area.height >= PANELS_MIN_HEIGHT {
                6
            } else {
                0
            };
            let [table_area, panels_area] =
                Layout::vertical([Constraint::Min(3), Constraint::Length(panel_height)])
                    .areas(body);
            table::render_table(f, state, table_area);
            if panel_height > 0 {
                panels::render_panels(f, state, panels_area);
            }
        }
        View::Detail => detail::render_detail(f, state, body),
    }
    render_footer(f, state, footer);
    if state.help {
        help::render_help(f, area);
    }
}

fn render_footer(f: &mut Frame, state: &State, area: Rect) {
    let dim = Style::new().add_modifier(Modifier::DIM);
    let line = if let Some(text) = &state.filter_input {
        Line::from(vec![
            Span::styled("/", Style::new().add_modifier(Modifier::BOLD)),
            Span::raw(text.clone()),
            Span::styled("█", dim),
            Span::styled(
                "  route, client, status or flag (new-conn tls coalesced stalled open); Enter keep, Esc drop",
                dim,
            ),
        ])
    } else {
        let mut spans = vec![Span::raw(format!(
            "sort {} │ {}/{} shown",
            state.sort.label(),
            state.visible.len(),
            state.shown.rows.len()
        ))];
        if !state.filter.is_empty() {
            spans.push(Span::raw(format!(" │ /{}", state.filter)));
        }
        if state.paused {
            spans.push(Span::styled(
                " │ PAUSED",
                Style::new().add_modifier(Modifier::REVERSED),
            ));
        }
        if let Some(note) = &state.note {
            spans.push(Span::styled(format!(" │ {note}"), dim));
        }
        let keys = match state.view {
            View::Table => " │ ↑↓ Enter / s p ? q",
            View::Detail => " │ ↑↓ Esc p ? q",
        };
        spans.push(Span::styled(keys, dim));
        Line::from(spans)
    };
    f.render_widget(Paragraph::new(line), area);
}
