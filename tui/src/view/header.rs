//! Three lines: where the events come from; how healthy the tracing is and
//! what it saw; the GPU.

use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;

use super::fmt;
use crate::state::State;

pub fn render_header(f: &mut Frame, state: &State, area: Rect) {
    let bold = Style::new().add_modifier(Modifier::BOLD);
    let m = &state.meta;
    let drops = match m.dropped {
        Some(0) => Span::raw("drops 0"),
        Some(d) => Span::styled(
            format!("drops {}", fmt::count(d)),
            Style::new().add_modifier(Modifier::REVERSED),
        ),
        None => Span::raw("drops ?"),
    };
    let mut first = vec![
        Span::styled("tokenscope top", bold),
        Span::raw(format!(
            " │ {} │ {} │ {}",
            m.host,
            m.source,
            fmt::since(state.shown.clock_ns, m.start_ns)
        )),
    ];
    if let Some(why) = &state.ended {
        first.push(Span::styled(format!(" │ {why}"), bold));
    }
    let open = state.shown.rows.iter().filter(|r| r.open).count();
    let tokens: usize = state.shown.rows.iter().map(|r| r.tokens).sum();
    let mut second = vec![
        Span::raw(format!(
            "{} probes │ {} ev/s │ ",
            m.probes_attached,
            fmt::count(state.shown.events_per_s)
        )),
        drops,
        Span::raw(format!(
            " │ {} requests ({} open) │ {} tokens",
            state.shown.rows.len(),
            open,
            fmt::count(tokens as u64)
        )),
    ];
    if state.shown.pass_ns > 0 {
        // top's own cost: the last pass over the window, off the screen's thread.
        second.push(Span::raw(format!(
            " │ pass {} ms",
            state.shown.pass_ns / 1_000_000
        )));
    }
    if state.shown.window_capped {
        second.push(Span::raw(" │ window capped"));
    }
    let third = Line::from(gpu_spans(state));
    f.render_widget(
        Paragraph::new(vec![Line::from(first), Line::from(second), third]),
        area,
    );
}

fn gpu_spans(state: &State) -> Vec<Span<'static>> {
    if state.shown.gpu.is_empty() {
        let line = if state.shown.gpu_steps > 0 {
            format!("{} GPU steps (libcuda); no NVML", state.shown.gpu_steps)
        } else {
            "GPU: no samples".into()
        };
        return vec![Span::raw(line)];
    }
    let mut spans = Vec::new();
    for (i, g) in state.shown.gpu.iter().enumerate() {
        if i > 0 {
            spans.push(Span::raw(" │ "));
        }
        let mut parts = vec![format!("GPU{}", g.device)];
        if let Some(u) = g.util_pct {
            parts.push(format!("{u}%"));
        }
        if let Some(c) = g.sm_clock_mhz {
            parts.push(format!("SM {c} MHz"));
        }
        if let Some(b) = g.mem_used_bytes {
            parts.push(format!("mem {}", fmt::bytes(b)));
        }
        if let Some(p) = g.power_mw {
            parts.push(format!("{} W", p / 1000));
        }
        spans.push(Span::raw(parts.join(" ")));
    }
    spans
}
