//! A window's requests laid out in two halves at once plan what one builder plans.

use super::*;

/// A plan as lines: its tracks, names, arguments and ops, every field that is written.
fn plan_lines(p: &layout::Plan) -> Vec<String> {
    let mut out = Vec::new();
    for t in &p.tracks {
        let kind = match &t.kind {
            TrackKind::Process { pid } => format!("process {pid}"),
            TrackKind::Plain => "plain".into(),
            TrackKind::Counter { unit } => format!("counter {unit:?}"),
        };
        let order = match t.children {
            ChildOrder::Default => 0,
            ChildOrder::Chronological => 1,
            ChildOrder::Explicit => 2,
        };
        let (uuid, parent, name, rank) = (t.uuid, t.parent, &t.name, t.rank);
        out.push(format!(
            "track {uuid} {parent:?} {name} {kind} {order} {rank:?}"
        ));
    }
    out.extend(p.names.iter().map(|n| format!("name {n}")));
    for a in &p.args {
        let values = a.iter().map(|(k, v)| match v {
            Arg::Int(i) => format!("{k}={i}"),
            Arg::Str(s) => format!("{k}={s}"),
            Arg::Ints(v) => format!("{k}={v:?}"),
            Arg::Strs(v) => format!("{k}={v:?}"),
        });
        out.push(format!("args {}", values.collect::<Vec<_>>().join(" ")));
    }
    out.extend(p.ops.iter().map(|op| format!("{op:?}")));
    let counts = (p.request_tracks, p.token_instants, p.flows, p.diagnoses);
    out.push(format!("counts {counts:?}"));
    out
}

/// The requests of a window laid out in two halves at once (the second by a builder
/// of its own, then taken in) plan what one builder plans, field for field: lab
/// recordings' requests seen at four points, their processes shared by both halves,
/// flows across their points, and (untuned) diagnoses citing them.
#[test]
fn requests_laid_out_in_two_halves_plan_what_one_builder_plans() {
    for name in ["tuned-plain", "untuned"] {
        let (header, events) = fixture(name);
        let mut p = pipeline(&header);
        let mut windows = windows::Windows::new(&header, u64::MAX);
        p.push_batch(events);
        p.flush();
        windows.take(&mut p);
        let trace = windows.rest().expect("the window");
        assert!(
            trace.requests.len() >= 10,
            "{name}: {}",
            trace.requests.len()
        );
        let mut one = layout::Uuids::default();
        let mut two = layout::Uuids::default();
        let whole = plan_lines(&layout::plan_split(&trace, &mut one, usize::MAX));
        let halves = plan_lines(&layout::plan_split(&trace, &mut two, 2));
        let cited = whole.iter().filter(|l| l.contains("cited by")).count();
        println!("{name}: {} lines, {cited} cited", whole.len());
        assert!(whole.len() > 5_000, "{name}: {} lines", whole.len());
        for (k, (a, b)) in whole.iter().zip(&halves).enumerate() {
            assert_eq!(a, b, "{name}: line {k}");
        }
        assert_eq!(whole.len(), halves.len(), "{name}");
    }
}
