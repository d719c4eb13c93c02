//! Diagnoses as annotations: a top-level "tokenscope diagnoses" track with a row
//! per diagnosis, the largest saving first (their evidence spans overlap, and the
//! slices of one track must nest), each a slice over its evidence; every request
//! a diagnosis cites shows it on its own track.

use std::collections::HashMap;

use super::{Arg, Builder, Cat, ChildOrder, Flow, Item, TrackKind};
use crate::diagnose::Diagnosis;
use crate::export::perfetto::DIAGNOSES_TRACK;
use crate::export::report::saving_line;

/// What the request tracks show of the diagnoses that cite them.
#[derive(Default)]
pub(crate) struct Cites {
    /// Per request id, the diagnoses (indices, largest saving first) citing it.
    by_request: HashMap<usize, Vec<usize>>,
    /// Per diagnosis: "[2] turn proxy buffering off", its slice's name, its finding.
    labels: Vec<String>,
    names: Vec<String>,
    findings: Vec<String>,
}

impl Cites {
    /// What `diagnoses` (the largest saving first) cite.
    pub(crate) fn of(diagnoses: &[Diagnosis]) -> Cites {
        let mut cites = Cites::default();
        for (rank, d) in diagnoses.iter().enumerate() {
            let label = format!("[{}] {}", d.rule, d.title);
            for &id in &d.evidence.request_ids {
                cites.by_request.entry(id).or_default().push(rank);
            }
            cites.names.push(format!("{label}: {}", saving_line(d)));
            cites.labels.push(label);
            cites.findings.push(d.finding.clone());
        }
        cites
    }

    /// "[2] turn proxy buffering off" for each diagnosis citing request `id`.
    pub(super) fn labels(&self, id: usize) -> Vec<String> {
        let of = self.by_request.get(&id).map_or(&[][..], |v| v.as_slice());
        of.iter().map(|&d| self.labels[d].clone()).collect()
    }
}

impl Builder {
    /// The rows of a window's diagnoses (the largest saving first). A row per window
    /// (a track of its own): the same rule found in the next window has evidence that
    /// may overlap this one's, and a track's slices must not go back in time.
    pub(super) fn diagnoses(&mut self, diagnoses: &[Diagnosis]) {
        let mut root = None;
        for (rank, d) in diagnoses.iter().enumerate() {
            let ev = &d.evidence;
            let root = *root.get_or_insert_with(|| {
                let t = self.track(None, DIAGNOSES_TRACK.into(), TrackKind::Plain);
                self.plan.tracks[t as usize - 1].children = ChildOrder::Explicit;
                t
            });
            let label = format!("[{}] {}", d.rule, d.title);
            let track = self.track_once(Some(root), label.clone(), TrackKind::Plain);
            self.plan.tracks[track as usize - 1].rank = Some(rank as i32);
            let name = format!("{label}: {}", saving_line(d));
            let args = self.args(diagnosis_args(d));
            let slice = self.slice(ev.start_ns, ev.end_ns, &name, Cat::Diagnosis, args);
            self.nest(track, vec![slice]);
            self.plan.diagnoses += 1;
        }
    }

    /// One instant at `ts` naming every diagnosis that cites request `id` (one,
    /// not one each: instants at one time on one track hide each other).
    pub(super) fn cited(&mut self, cites: &Cites, id: usize, ts: u64) -> Option<Item> {
        let of = cites.by_request.get(&id)?;
        let pick = |v: &[String]| of.iter().map(|&d| v[d].clone()).collect::<Vec<_>>();
        let name = format!("cited by {}", pick(&cites.labels).join(", "));
        let args = self.args(vec![
            ("diagnoses", Arg::Strs(pick(&cites.names))),
            ("findings", Arg::Strs(pick(&cites.findings))),
        ]);
        Some(Item {
            start: ts,
            end: None,
            name: self.name(&name),
            cat: Cat::Diagnosis,
            flow: Flow::None,
            args,
            depth: 3,
        })
    }
}

fn diagnosis_args(d: &Diagnosis) -> Vec<(&'static str, Arg)> {
    let ns = |v: Option<u64>| v.map(|v| Arg::Int(v as i64));
    let s = &d.saving;
    let mut a = vec![
        ("rule", Arg::Int(i64::from(d.rule))),
        ("key", Arg::Str(d.key.into())),
        ("finding", Arg::Str(d.finding.clone())),
        ("scope", Arg::Str(d.scope.clone())),
        ("saving", Arg::Str(saving_line(d))),
    ];
    for (name, v) in [
        ("ttft_p95_saving_ns", s.ttft_p95_ns),
        ("itl_p99_saving_ns", s.itl_p99_ns),
        ("ttft_p95_saving_alone_ns", s.ttft_p95_alone_ns),
        ("itl_p99_saving_alone_ns", s.itl_p99_alone_ns),
    ] {
        if let Some(v) = ns(v) {
            a.push((name, v));
        }
    }
    a.push(("saving_basis", Arg::Str(s.basis.clone())));
    a.push((
        "fix",
        Arg::Strs(
            d.fix
                .iter()
                .flat_map(|f| f.lines.iter().map(move |l| format!("{}: {l}", f.target)))
                .collect(),
        ),
    ));
    a.push((
        "figures",
        Arg::Strs(
            d.evidence
                .figures
                .iter()
                .map(|f| format!("{}: {} {}", f.name, f.value, f.unit))
                .collect(),
        ),
    ));
    a.push(("requests", Arg::Int(d.evidence.requests as i64)));
    a.push((
        "request_ids",
        Arg::Ints(d.evidence.request_ids.iter().map(|&i| i as i64).collect()),
    ));
    a
}
