//! A track per request: stages as nested slices, a child track per observation
//! point with an instant per token, and flows linking a token across points; an
//! instant per diagnosis that cites the request.

use super::diagnoses::Cites;
use super::{Arg, Builder, Cat, ChildOrder, Flow, Item, TrackKind};
use crate::stitch::{PointKind, Request};

impl Builder {
    /// `requests`: those that begin in this window.
    pub(super) fn requests(&mut self, requests: &[Request], cites: &Cites) {
        for r in requests {
            let parent = self.process(r.client_pid, &r.client_comm);
            let title = format!("{} {}", r.method, r.route());
            let track = self.track_once(
                parent,
                format!("request {} {title}", r.id),
                TrackKind::Plain,
            );
            self.plan.request_tracks += 1;
            let mut items = self.stages(r);
            let end = r
                .last_seen_ns()
                .max(items.iter().filter_map(|i| i.end).max().unwrap_or(0));
            let mut a = vec![("request_id", Arg::Int(r.id as i64))];
            if let Some(s) = r.status {
                a.push(("status", Arg::Int(i64::from(s))));
            }
            a.push(("tokens", Arg::Int(r.tokens() as i64)));
            if let Some(t) = r.first_point().and_then(|p| p.ttft_ns) {
                a.push(("ttft_ns", Arg::Int(t as i64)));
            }
            a.push((
                "client",
                Arg::Str(format!("{} {}", r.client_comm, r.client_addr)),
            ));
            let cited_by = cites.labels(r.id);
            if !cited_by.is_empty() {
                a.push(("diagnoses", Arg::Strs(cited_by)));
            }
            let args = self.args(a);
            let start = items.iter().map(|i| i.start).fold(r.start_ns, u64::min);
            let mut root = self.slice(start, end, &title, Cat::Request, args);
            root.depth = 0;
            items.push(root);
            // At the request's start, where a reader of its track looks first.
            items.extend(self.cited(cites, r.id, start));
            self.nest(track, items);
            self.plan.tracks[track as usize - 1].children = ChildOrder::Explicit;
            self.points(r, track);
        }
    }

    /// Stages as slices on the request's own track: where the stitcher placed them on
    /// the hops (`Request::spans`), else from their lengths.
    fn stages(&mut self, r: &Request) -> Vec<Item> {
        let mut items = Vec::new();
        let st = &r.stages;
        match &r.spans {
            Some(sp) => {
                for (span, name) in [
                    (sp.connect, "connect"),
                    (sp.tls, "tls"),
                    (sp.upload, "upload"),
                    (sp.gateway, "gateway"),
                ] {
                    if let Some((a, b)) = span {
                        items.push(self.slice(a, b, name, Cat::Stage, 0));
                    }
                }
                for (path, a, b) in &sp.subrequests {
                    let name = format!("subrequest {path}");
                    let mut sub = self.slice(*a, *b, &name, Cat::Stage, 0);
                    sub.depth = 2;
                    items.push(sub);
                }
            }
            None => {
                if let Some(c) = st.connect_ns {
                    items.push(self.slice(r.start_ns, r.start_ns + c, "connect", Cat::Stage, 0));
                }
                if let Some(u) = st.upload_ns {
                    let a = r.first_byte_ns;
                    items.push(self.slice(a, a + u, "upload", Cat::Stage, 0));
                }
            }
        }
        let engine = r.point(PointKind::EngineWrite);
        let first = engine.and_then(|p| p.token_ns.first().copied());
        if let (Some(received), Some(first)) = (r.engine_received_ns, first) {
            match r.gpu.as_ref().and_then(|g| Some((g, g.queue_ns?))) {
                Some((g, q)) => {
                    let queued = (received + q).min(first);
                    items.push(self.slice(received, queued, "queue", Cat::Stage, 0));
                    let args = self.args(vec![
                        ("prefill_steps", Arg::Int(i64::from(g.prefill_steps))),
                        ("prefill_gpu_ns", Arg::Int(g.prefill_ns as i64)),
                    ]);
                    items.push(self.slice(queued, first, "prefill", Cat::Stage, args));
                }
                None => items.push(self.slice(received, first, "queue + prefill", Cat::Stage, 0)),
            }
        }
        if let Some(p) = engine.filter(|p| p.token_ns.len() > 1) {
            let (a, b) = (p.token_ns[0], p.token_ns[p.token_ns.len() - 1]);
            let mut v = vec![("tokens", Arg::Int(p.token_ns.len() as i64))];
            if let Some(g) = &r.gpu {
                v.push(("decode_steps", Arg::Int(i64::from(g.decode_steps))));
                v.push(("stalled_gaps", Arg::Int(g.stalled_by.len() as i64)));
            }
            let args = self.args(v);
            items.push(self.slice(a, b, "decode", Cat::Stage, args));
        }
        items
    }

    /// A child track per observation point, an instant per token, flows from the engine to the client.
    fn points(&mut self, r: &Request, request_track: u64) {
        let linked = if r.points.len() > 1 {
            r.points.iter().map(|p| p.token_ns.len()).min().unwrap_or(0)
        } else {
            0
        };
        // A flow runs engine -> client; where the probes' firing order puts a token's read a
        // few microseconds before its write (the reader can return before the writer's
        // tracepoint fires), that token gets no flow rather than one that runs backwards.
        let forward: Vec<bool> = (0..linked)
            .map(|k| {
                r.points
                    .windows(2)
                    .all(|w| w[0].token_ns[k] >= w[1].token_ns[k])
            })
            .collect();
        self.plan.flows += forward.iter().filter(|f| **f).count();
        let first_flow = self.flows(linked);
        let mut points = Vec::with_capacity(r.points.len());
        for (j, p) in r.points.iter().enumerate() {
            let name = format!("{} ({} {})", p.kind.label(), p.comm, p.pid);
            let t = self.track_once(Some(request_track), name, TrackKind::Plain);
            self.plan.tracks[t as usize - 1].rank = Some(j as i32);
            let mut items = Vec::with_capacity(p.token_ns.len() + p.record_ns.len());
            for (k, &ts) in p.token_ns.iter().enumerate() {
                let flow = if k >= linked || !forward[k] {
                    Flow::None
                } else if j == 0 {
                    Flow::Last(first_flow + k as u64)
                } else {
                    Flow::Step(first_flow + k as u64)
                };
                items.push(self.instant(ts, "token", Cat::Token, flow));
            }
            self.plan.token_instants += p.token_ns.len();
            for &ts in &p.record_ns {
                items.push(self.instant(ts, "tls record", Cat::Token, Flow::None));
            }
            points.push((t, items));
        }
        // Engine first: where a token is at two points at the same nanosecond, the
        // (stable) sort by time keeps its flow's end last, as trace processor must
        // read it to close the flow and free its id.
        for (t, items) in points.into_iter().rev() {
            self.nest(t, items);
        }
    }
}
