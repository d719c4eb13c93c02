//! A window's requests laid out in two halves at once, on two threads, and joined as
//! if one builder had laid them out in turn.

use std::collections::HashMap;

use super::diagnoses::Cites;
use super::{Builder, OpKind, PROCESS_UUID};

impl Builder {
    /// `requests` laid out in two halves at once, the second by a builder of its own on
    /// a scoped thread (`tokenscope-layout`), then taken in as if this one had laid it
    /// out: the same tracks, uuids, names, arguments and flows in the same order, so
    /// the same trace. With one window this is after the last event, where the reading
    /// thread's core is idle (requests are most of a window's layout).
    pub(super) fn requests_in_two(&mut self, requests: &[crate::stitch::Request], cites: &Cites) {
        let (first, second) = requests.split_at(requests.len() / 2);
        let start_ns = self.plan.start_ns;
        let laid_out = || {
            let mut other = Builder::new(start_ns);
            other.requests(second, cites);
            other
        };
        let (other, ()) = crate::export::perfetto::beside("tokenscope-layout", laid_out, || {
            self.requests(first, cites)
        });
        match other {
            Some(other) => self.take_in(other),
            // No thread to be had: laid out here.
            None => self.requests(second, cites),
        }
    }

    /// What `other` laid out (requests only: tracks each described once), as if laid
    /// out here after what is here: its tracks' handles, uuids, names, arguments and
    /// flow ids follow this builder's; a process both have is this one's.
    fn take_in(&mut self, other: Builder) {
        assert!(
            other.uuids.stable.is_empty(),
            "requests describe no track another window describes"
        );
        let (p, o) = (&mut self.plan, &other.plan);
        p.request_tracks += o.request_tracks;
        p.token_instants += o.token_instants;
        p.gpu_steps += o.gpu_steps;
        p.flows += o.flows;
        p.diagnoses += o.diagnoses;
        let offset = self.uuids.last;
        let moved = |uuid: u64| {
            if uuid < PROCESS_UUID {
                uuid + offset
            } else {
                uuid
            }
        };
        self.uuids.last += other.uuids.last;
        let process_of: HashMap<u64, u32> =
            other.processes.iter().map(|(&pid, &h)| (h, pid)).collect();
        let mut handles = Vec::with_capacity(other.plan.tracks.len());
        for (i, mut t) in other.plan.tracks.into_iter().enumerate() {
            let pid = process_of.get(&(i as u64 + 1)).copied();
            if let Some(&mine) = pid.and_then(|pid| self.processes.get(&pid)) {
                handles.push(mine);
                continue;
            }
            t.uuid = moved(t.uuid);
            t.parent = t.parent.map(moved);
            self.plan.tracks.push(t);
            let mine = self.plan.tracks.len() as u64;
            if let Some(pid) = pid {
                self.processes.insert(pid, mine);
            }
            handles.push(mine);
        }
        let names: Vec<u32> = other.plan.names.iter().map(|n| self.name(n)).collect();
        let args = self.plan.args.len() as u32;
        self.plan.args.extend(other.plan.args);
        let flows = self.flows_handed;
        self.flows_handed += other.flows_handed;
        self.plan
            .ops
            .extend(other.plan.ops.into_iter().map(|mut op| {
                op.track = handles[op.track as usize - 1] as u32;
                if matches!(op.kind(), OpKind::Begin | OpKind::Instant) {
                    op.name = names[op.name as usize];
                }
                if op.args > 0 {
                    op.args += args;
                }
                if op.flow_id().is_some() {
                    op.aux += flows;
                }
                op
            }));
    }
}
