//! The request table: one row per request, sorted and filtered by the state.

use ratatui::layout::{Constraint, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Cell, Row as TableRow, Table, TableState};
use ratatui::Frame;

use super::fmt;
use crate::rows::Row;
use crate::state::{SortKey, State};

/// Wide enough to show the client column too.
const WIDE: u16 = 110;

pub fn render_table(f: &mut Frame, state: &State, area: Rect) {
    let wide = area.width >= WIDE;
    let title = format!(
        " requests · ms · TTFT at the client and at the engine · sorted by {} ",
        state.sort.label()
    );
    let block = Block::new()
        .borders(Borders::TOP)
        .title(Line::from(title).style(Style::new().add_modifier(Modifier::BOLD)));
    if state.visible.is_empty() {
        let why = if state.shown.rows.is_empty() {
            "no requests yet"
        } else {
            "no request matches the filter (Esc clears it)"
        };
        f.render_widget(ratatui::widgets::Paragraph::new(why).block(block), area);
        return;
    }
    let sorted = Style::new().add_modifier(Modifier::BOLD | Modifier::UNDERLINED);
    let mark = |key: SortKey, label: &'static str| {
        let cell = Cell::from(label);
        if state.sort == key {
            cell.style(sorted)
        } else {
            cell
        }
    };
    let mut header = vec![
        Cell::from("#"),
        mark(SortKey::Start, "start"),
        Cell::from("route"),
    ];
    // The API column only where there is more than one to tell apart.
    let mut apis = state.visible.iter().map(|&i| state.shown.rows[i].api);
    let first_api = apis.next().flatten();
    let api = apis.any(|a| a != first_api);
    if api {
        header.push(Cell::from("api"));
    }
    if wide {
        header.push(Cell::from("client"));
    }
    header.extend([
        Cell::from("st"),
        mark(SortKey::Ttft, "TTFT"),
        Cell::from("@eng"),
        Cell::from("ITL50"),
        mark(SortKey::ItlP99, "ITL99"),
        Cell::from("tok"),
        Cell::from("tok/s"),
        Cell::from("NTCS"),
    ]);
    let mut widths = vec![
        Constraint::Length(3),
        Constraint::Length(6),
        Constraint::Fill(1),
    ];
    if api {
        widths.push(Constraint::Length(API_WIDTH as u16));
    }
    if wide {
        widths.push(Constraint::Length(26));
    }
    widths.extend([
        Constraint::Length(3),
        Constraint::Length(6),
        Constraint::Length(6),
        Constraint::Length(5),
        Constraint::Length(6),
        Constraint::Length(4),
        Constraint::Length(5),
        Constraint::Length(4),
    ]);
    // The route column gets what is left; cut routes from the left to keep the path.
    let fixed: u16 = widths
        .iter()
        .map(|c| match c {
            Constraint::Length(n) => *n + 1,
            _ => 1,
        })
        .sum();
    let route_width = area.width.saturating_sub(fixed) as usize;
    // Only the rows on screen are laid out: the window may hold thousands. The same
    // rows ratatui shows for the selection from offset 0 (the border and the header
    // take a line each).
    let height = (area.height as usize).saturating_sub(2).max(1);
    let first = (state.selected + 1).saturating_sub(height);
    let on_screen = &state.visible[first..state.visible.len().min(first + height)];
    let rows: Vec<TableRow> = on_screen
        .iter()
        .map(|&i| {
            let columns = Columns {
                route_width,
                api,
                wide,
            };
            table_row(&state.shown.rows[i], state.meta.start_ns, columns)
        })
        .collect();
    let table = Table::new(rows, widths)
        .header(TableRow::new(header).style(Style::new().add_modifier(Modifier::BOLD)))
        .block(block)
        .row_highlight_style(Style::new().add_modifier(Modifier::REVERSED));
    let mut ts = TableState::new().with_selected(Some(state.selected - first));
    f.render_stateful_widget(table, area, &mut ts);
}

/// Width of the API column (`openai-completions` is cut to `openai-compl`).
const API_WIDTH: usize = 12;

/// Which optional columns a row has, and the route's width.
#[derive(Clone, Copy)]
struct Columns {
    route_width: usize,
    api: bool,
    wide: bool,
}

fn table_row(r: &Row, base_ns: u64, c: Columns) -> TableRow<'static> {
    let right = |s: String| Cell::from(Line::from(s).right_aligned());
    let status = match (r.status, r.open) {
        (Some(s), _) => s.to_string(),
        (None, true) => "…".into(),
        (None, false) => "-".into(),
    };
    let mut cells = vec![
        right(r.index.to_string()),
        right(fmt::since(r.start_ns, base_ns)),
        Cell::from(fmt::tail(&r.route, c.route_width)),
    ];
    if c.api {
        cells.push(Cell::from(fmt::head(r.api.unwrap_or("-"), API_WIDTH)));
    }
    if c.wide {
        cells.push(Cell::from(fmt::head(&r.client, 26)));
    }
    cells.extend([
        Cell::from(status),
        right(fmt::ms_opt(r.ttft_first_ns)),
        right(fmt::ms_opt(r.ttft_engine_ns)),
        right(fmt::ms_opt(r.itl_p50_ns)),
        right(fmt::ms_opt(r.itl_p99_ns)),
        right(r.tokens.to_string()),
        right(
            r.tokens_per_s
                .map_or_else(|| "-".into(), |t| format!("{t:.0}")),
        ),
        Cell::from(r.flags()),
    ]);
    let row = TableRow::new(cells);
    if r.open {
        row.style(Style::new().add_modifier(Modifier::ITALIC))
    } else {
        row
    }
}
