//! The diagnoses panel: per diagnosis, the largest saving first, its rule and fix,
//! its share of the TTFT p95 saving and where it was seen; then what was seen, as
//! space allows. The diagnoses are computed when the window is re-stitched.

use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;

use collector::diagnose::Diagnosis;

use super::{fmt, panels};
use crate::state::State;

/// Words of one style; `true`: kept on one line when they fit in one.
type Words<'a> = (&'a str, Style, bool);
/// A wrapped line: runs of (text, style), one space apart.
type Wrapped = Vec<(String, Style)>;

pub fn render_diagnoses(f: &mut Frame, state: &State, area: Rect) {
    let title = title(state.shown.diagnoses.len(), state.shown.findings.age_ns);
    let block = panels::panel(&title);
    let inner = block.inner(area);
    let dim = Style::new().add_modifier(Modifier::DIM);
    let lines = if state.shown.diagnoses.is_empty() {
        let why = if state.shown.requests.is_empty() {
            "no requests yet"
        } else {
            "none: no rule's trigger holds in the window"
        };
        vec![Line::from(Span::styled(why, dim))]
    } else {
        fit(
            &state.shown.diagnoses,
            inner.width as usize,
            inner.height as usize,
        )
    };
    f.render_widget(Paragraph::new(lines).block(block), area);
}

/// The panel's title: how many, and how old they are once that shows (they are remade
/// at most once a second, less often when a making is dear: within 0.5% of a core).
fn title(n: usize, age_ns: u64) -> String {
    let age_s = age_ns / 1_000_000_000;
    match n {
        0 => " diagnoses ".to_string(),
        n if age_s >= 2 => format!(" diagnoses ({n}, as of {age_s} s ago) "),
        n => format!(" diagnoses ({n}) "),
    }
}

/// "~402 ms TTFT p95" (ITL p99 when the fix saves no TTFT), as the report rounds it.
pub fn saving_short(d: &Diagnosis) -> String {
    let ms = |ns: u64| format!("~{:.0} ms", ns as f64 / 1e6);
    match (d.saving.ttft_p95_ns, d.saving.itl_p99_ns) {
        (Some(t), _) => format!("{} TTFT p95", ms(t)),
        (None, Some(i)) => format!("{} ITL p99", ms(i)),
        (None, None) => "no estimate".into(),
    }
}

/// Every header that fits (without the scope when all do not fit with it), then
/// the findings sharing what is left evenly.
fn fit(diagnoses: &[Diagnosis], width: usize, height: usize) -> Vec<Line<'static>> {
    let dim = Style::new().add_modifier(Modifier::DIM);
    let mut headers = wrap_headers(diagnoses, width, true);
    if headers.iter().map(Vec::len).sum::<usize>() > height {
        headers = wrap_headers(diagnoses, width, false);
    }
    let mut shown = 0;
    let mut used = 0;
    for (i, h) in headers.iter().enumerate() {
        let more = usize::from(i + 1 < headers.len());
        if used + h.len() + more > height {
            break;
        }
        used += h.len();
        shown += 1;
    }
    let hidden = diagnoses.len() - shown;
    let mut left = height.saturating_sub(used + usize::from(hidden > 0));
    let mut lines = Vec::new();
    for (i, (d, header)) in diagnoses.iter().zip(headers).take(shown).enumerate() {
        lines.extend(header.into_iter().map(line));
        let share = left / (shown - i);
        let mut finding = wrap(&[(&d.finding, dim, false)], width.saturating_sub(1));
        if finding.len() > share {
            finding.truncate(share);
            if let Some(last) = finding.last_mut() {
                ellipsis(last, width.saturating_sub(1));
            }
        }
        left -= finding.len();
        lines.extend(finding.into_iter().map(|mut w| {
            w.insert(0, (String::new(), Style::new()));
            line(w)
        }));
    }
    if hidden > 0 {
        let more = format!("+{hidden} more (report lists all)");
        lines.push(Line::from(Span::styled(fmt::head(&more, width), dim)));
    }
    lines
}

/// "[2] turn proxy buffering off ~402 ms TTFT p95 nginx/11749", wrapped.
fn wrap_headers(diagnoses: &[Diagnosis], width: usize, scope: bool) -> Vec<Vec<Wrapped>> {
    let bold = Style::new().add_modifier(Modifier::BOLD);
    let dim = Style::new().add_modifier(Modifier::DIM);
    diagnoses
        .iter()
        .map(|d| {
            let rule = format!("[{}] {}", d.rule, d.title);
            let saving = saving_short(d);
            // "nginx/11749: 127.0.0.1:27312/v1/completions" -> "nginx/11749".
            let place = fmt::route_short(d.scope.split(": ").next().unwrap_or(""));
            let mut parts = vec![(rule.as_str(), bold, false), (&saving, Style::new(), true)];
            if scope {
                parts.push((place, dim, true));
            }
            wrap(&parts, width)
        })
        .collect()
}

fn line(runs: Wrapped) -> Line<'static> {
    let mut spans = Vec::with_capacity(runs.len() * 2);
    for (k, (text, style)) in runs.into_iter().enumerate() {
        if k > 0 {
            spans.push(Span::raw(" "));
        }
        spans.push(Span::styled(text, style));
    }
    Line::from(spans)
}

/// Marks a cut line: "…" at its end, within `width`.
fn ellipsis(runs: &mut Wrapped, width: usize) {
    let gaps = runs.len().saturating_sub(1);
    let len = runs.iter().map(|(t, _)| t.chars().count()).sum::<usize>() + gaps;
    if let Some((text, _)) = runs.last_mut() {
        if len >= width {
            text.pop();
        }
        text.push('…');
    }
}

/// Greedy word wrap into lines of at most `width` cells, words one space apart;
/// a word longer than a line is cut. Adjacent words of one style make one run.
fn wrap(parts: &[Words], width: usize) -> Vec<Wrapped> {
    let mut lines: Vec<Wrapped> = Vec::new();
    if width == 0 {
        return lines;
    }
    let mut line: Wrapped = Vec::new();
    let mut used = 0;
    for &(text, style, keep) in parts {
        let whole = keep && text.chars().count() <= width;
        let words: Vec<&str> = if whole {
            vec![text]
        } else {
            text.split_whitespace().collect()
        };
        for word in words {
            let mut word: Vec<char> = word.chars().collect();
            while !word.is_empty() {
                let gap = usize::from(used > 0);
                let n = word.len();
                if used + gap + n <= width {
                    let w: String = word.drain(..).collect();
                    match line.last_mut() {
                        Some((run, s)) if *s == style => {
                            run.push(' ');
                            run.push_str(&w);
                        }
                        _ => line.push((w, style)),
                    }
                    used += gap + n;
                } else if used == 0 {
                    let rest = word.split_off(width);
                    line.push((word.into_iter().collect(), style));
                    lines.push(std::mem::take(&mut line));
                    word = rest;
                } else {
                    lines.push(std::mem::take(&mut line));
                    used = 0;
                }
            }
        }
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(lines: &[Wrapped]) -> Vec<String> {
        lines
            .iter()
            .map(|l| {
                l.iter()
                    .map(|(t, _)| t.as_str())
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect()
    }

    #[test]
    fn the_title_says_how_old_the_diagnoses_are_once_that_shows() {
        const S: u64 = 1_000_000_000;
        assert_eq!(title(0, 9 * S), " diagnoses ");
        assert_eq!(title(3, S + S / 2), " diagnoses (3) ");
        assert_eq!(title(3, 4 * S + 1), " diagnoses (3, as of 4 s ago) ");
    }

    #[test]
    fn words_wrap_within_the_width_and_long_words_are_cut() {
        let s = Style::new();
        let b = Style::new().add_modifier(Modifier::BOLD);
        let got = wrap(
            &[("[2] turn proxy", b, false), ("buffering off", s, false)],
            10,
        );
        assert_eq!(plain(&got), ["[2] turn", "proxy", "buffering", "off"]);
        assert_eq!(got[1], vec![("proxy".to_string(), b)], "styles kept");
        let got = wrap(&[("abcdefghijkl x", s, false)], 5);
        assert_eq!(plain(&got), ["abcde", "fghij", "kl x"]);
        assert!(wrap(&[("x", s, false)], 0).is_empty(), "no width, no lines");
    }

    #[test]
    fn a_kept_part_moves_to_the_next_line_whole_when_it_fits_one() {
        let s = Style::new();
        let got = wrap(
            &[("[2] fix it", s, false), ("~402 ms TTFT p95", s, true)],
            20,
        );
        assert_eq!(plain(&got), ["[2] fix it", "~402 ms TTFT p95"]);
        let got = wrap(&[("~402 ms TTFT p95", s, true)], 8);
        assert_eq!(plain(&got), ["~402 ms", "TTFT p95"], "too long: by words");
    }
}
