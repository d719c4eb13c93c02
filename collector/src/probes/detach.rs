//! Detaching every program at the end of a recording, quickly and in an order that
//! leaves no stream broken.
//!
//! Each link's detach closes a perf event, and the kernel waits for RCU grace periods
//! before the close returns (a tracepoint's last perf user unregistered): 70-110 ms per
//! link on the 2-core VMs, 2.6 s for the 34 links of a default recording, every time
//! `record` or `top` stopped. Closed from a thread each, only part of that overlaps
//! (the kernel holds `event_mutex` across most of the wait): 1.8 s. The order still
//! matters across waves (see `Wave`), so the links go in waves, each wave's together
//! and the next only once it is done.

use aya::programs::{KProbe, TracePoint, UProbe};
use aya::Ebpf;
use probe_ebpf::{ProbeGroup, TRACEPOINTS};

use super::Probes;

/// When a link goes. Emitters first: the kprobes and socket-layer tracepoints that
/// emit I/O records go before the syscall tracepoints that give them their buffers.
/// The other way round, the I/Os of the moment that detaching takes arrived without
/// payload and broke every stream in flight (hundreds of unparsed I/Os when a
/// recording stopped mid-stream). Then the syscall exits (the syscall source's
/// emitters) and connection tracepoints, then the syscall entries that stash the
/// buffers, then the uprobes (TLS and libcuda) last, as before.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Wave {
    Emitters,
    Exits,
    Entries,
    Uprobes,
}

/// The wave of the tracepoint program `program`.
fn tracepoint_wave(program: &str) -> Wave {
    match TRACEPOINTS.iter().find(|t| t.program == program) {
        Some(t) if t.group == ProbeGroup::SockIo => Wave::Emitters,
        Some(t) if t.name.starts_with("sys_enter_") => Wave::Entries,
        _ => Wave::Exits,
    }
}

/// An owned link: dropping it detaches its program.
type Owned = Box<dyn Send>;

impl Probes {
    /// Detaches every program, so no new records arrive; the maps stay readable.
    pub fn detach(&mut self) {
        let mut waves: Vec<(Wave, Owned)> = Vec::new();
        for (program, id) in self.kprobe_links.drain(..) {
            if let Some(link) =
                program_mut::<KProbe>(&mut self.ebpf, program).and_then(|kp| kp.take_link(id).ok())
            {
                waves.push((Wave::Emitters, Box::new(link)));
            }
        }
        for (program, id) in self.links.drain(..) {
            if let Some(link) = program_mut::<TracePoint>(&mut self.ebpf, program)
                .and_then(|tp| tp.take_link(id).ok())
            {
                waves.push((tracepoint_wave(program), Box::new(link)));
            }
        }
        for (program, id) in self.uprobe_links.drain(..) {
            if let Some(link) =
                program_mut::<UProbe>(&mut self.ebpf, program).and_then(|up| up.take_link(id).ok())
            {
                waves.push((Wave::Uprobes, Box::new(link)));
            }
        }
        // Stable: within a wave, the order they were attached in (which no longer
        // matters, they go together).
        waves.sort_by_key(|(wave, _)| *wave);
        while !waves.is_empty() {
            let wave = waves[0].0;
            let end = waves.partition_point(|(w, _)| *w == wave);
            drop_together(waves.drain(..end).map(|(_, link)| link).collect());
        }
    }
}

fn program_mut<'a, P>(ebpf: &'a mut Ebpf, name: &str) -> Option<&'a mut P>
where
    &'a mut P: TryFrom<&'a mut aya::programs::Program>,
{
    ebpf.program_mut(name).and_then(|p| p.try_into().ok())
}

/// Drops every link, each on a thread of its own, and returns once all are dropped.
fn drop_together(links: Vec<Owned>) {
    std::thread::scope(|scope| {
        for link in links {
            // A thread that cannot start (a process at its limit) drops the closure, and
            // the link in it, right here: that link detaches in turn.
            let _ = std::thread::Builder::new()
                .name("tokenscope-detach".into())
                .spawn_scoped(scope, move || drop(link));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emitters_go_first_and_entries_after_exits() {
        let of = |name: &str| {
            let t = TRACEPOINTS
                .iter()
                .find(|t| t.name == name)
                .unwrap_or_else(|| panic!("{name} is a tracepoint of ours"));
            tracepoint_wave(t.program)
        };
        assert_eq!(of("sock_send_length"), Wave::Emitters);
        assert_eq!(of("sock_recv_length"), Wave::Emitters);
        assert_eq!(of("sys_exit_writev"), Wave::Exits);
        assert_eq!(of("sys_enter_writev"), Wave::Entries);
        assert!(Wave::Emitters < Wave::Exits && Wave::Exits < Wave::Entries);
        assert!(Wave::Entries < Wave::Uprobes);
    }
}
