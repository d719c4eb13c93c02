//! Which I/O sources this kernel can run: the best one it has is chosen at start by
//! probing for what each needs.

use std::path::Path;

pub use crate::ingest::io_source::{IoSource, IoSourceChoice};

/// The kernel as the sources see it: which events and functions it has.
pub(super) struct KernelFeatures<'a> {
    pub tracefs: &'a Path,
    /// Text symbols of /proc/kallsyms that the kprobe source needs and the kernel has.
    pub kallsyms: Vec<String>,
    /// The perf kprobe PMU exists (CONFIG_KPROBES).
    pub kprobe_pmu: bool,
}

impl KernelFeatures<'_> {
    pub(super) fn probe(tracefs: &Path) -> KernelFeatures<'_> {
        let wanted: Vec<&str> = probe_ebpf::KPROBES.iter().map(|k| k.function).collect();
        KernelFeatures {
            tracefs,
            kallsyms: text_symbols("/proc/kallsyms", &wanted),
            kprobe_pmu: Path::new("/sys/bus/event_source/devices/kprobe/type").exists(),
        }
    }

    fn has_event(&self, category: &str, name: &str) -> bool {
        self.tracefs
            .join("events")
            .join(category)
            .join(name)
            .is_dir()
    }

    /// Why `source` cannot run on this kernel, or `None` when it can.
    pub(super) fn missing(&self, source: IoSource) -> Option<String> {
        let missing_events = |events: &[(&str, &str)]| {
            let absent: Vec<String> = events
                .iter()
                .filter(|(c, n)| !self.has_event(c, n))
                .map(|(c, n)| format!("{c}:{n}"))
                .collect();
            (!absent.is_empty()).then(|| format!("no tracepoint {}", absent.join(", ")))
        };
        match source {
            IoSource::Sock => {
                missing_events(&[("sock", "sock_send_length"), ("sock", "sock_recv_length")])
                    .map(|why| format!("{why} (Linux 6.3+)"))
            }
            IoSource::Kprobe if !self.kprobe_pmu => {
                Some("kprobes are not built into this kernel (no kprobe PMU)".into())
            }
            IoSource::Kprobe => {
                let absent: Vec<&str> = probe_ebpf::KPROBES
                    .iter()
                    .map(|k| k.function)
                    .filter(|f| !self.kallsyms.iter().any(|s| s == f))
                    .collect();
                (!absent.is_empty())
                    .then(|| format!("no function {} in /proc/kallsyms", absent.join(", ")))
            }
            IoSource::Syscall => {
                let events: Vec<(&str, &str)> = probe_ebpf::TRACEPOINTS
                    .iter()
                    .filter(|t| t.group == probe_ebpf::ProbeGroup::Io)
                    .map(|t| (t.category, t.name))
                    .collect();
                missing_events(&events)
            }
        }
    }

    /// The sources to try, best first, or why there is none.
    pub(super) fn candidates(
        &self,
        choice: IoSourceChoice,
    ) -> Result<Vec<IoSource>, (Option<IoSource>, String)> {
        match choice {
            IoSourceChoice::Only(s) => match self.missing(s) {
                None => Ok(vec![s]),
                Some(why) => Err((Some(s), why)),
            },
            IoSourceChoice::Auto => {
                let mut why_not = Vec::new();
                let usable: Vec<IoSource> = IoSource::ALL
                    .into_iter()
                    .filter(|&s| match self.missing(s) {
                        None => true,
                        Some(why) => {
                            why_not.push(format!("{}: {why}", s.name()));
                            false
                        }
                    })
                    .collect();
                if usable.is_empty() {
                    Err((None, why_not.join("; ")))
                } else {
                    Ok(usable)
                }
            }
        }
    }
}

/// Which of `wanted` are text symbols in a kallsyms-format file.
fn text_symbols(path: &str, wanted: &[&str]) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    let mut found: Vec<String> = text
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_addr, kind, name) = (f.next()?, f.next()?, f.next()?);
            // Module symbols carry a fourth field; tcp_* live in the kernel proper.
            let is_text = kind.eq_ignore_ascii_case("t") && f.next().is_none();
            (is_text && wanted.contains(&name)).then(|| name.to_string())
        })
        .collect();
    found.sort();
    found.dedup();
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn features<'a>(tracefs: &'a Path, kallsyms: &[&str], kprobe_pmu: bool) -> KernelFeatures<'a> {
        KernelFeatures {
            tracefs,
            kallsyms: kallsyms.iter().map(|s| s.to_string()).collect(),
            kprobe_pmu,
        }
    }

    fn tracefs_with(events: &[&str]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        for e in events {
            std::fs::create_dir_all(dir.path().join("events").join(e)).expect("mkdir");
        }
        dir
    }

    fn syscall_events() -> Vec<String> {
        probe_ebpf::TRACEPOINTS
            .iter()
            .filter(|t| t.group == probe_ebpf::ProbeGroup::Io)
            .map(|t| format!("{}/{}", t.category, t.name))
            .collect()
    }

    #[test]
    fn auto_picks_the_best_source_the_kernel_has() {
        let mut events = syscall_events();
        events.push("sock/sock_send_length".into());
        events.push("sock/sock_recv_length".into());
        let refs: Vec<&str> = events.iter().map(String::as_str).collect();
        let dir = tracefs_with(&refs);
        let f = features(dir.path(), &["tcp_sendmsg", "tcp_cleanup_rbuf"], true);
        assert_eq!(
            f.candidates(IoSourceChoice::Auto).expect("usable"),
            IoSource::ALL.to_vec()
        );

        // A 6.1 kernel: no socket-layer tracepoints, kprobes present.
        let refs: Vec<&str> = refs[..refs.len() - 2].to_vec();
        let dir = tracefs_with(&refs);
        let f = features(dir.path(), &["tcp_sendmsg", "tcp_cleanup_rbuf"], true);
        assert_eq!(
            f.candidates(IoSourceChoice::Auto).expect("usable"),
            vec![IoSource::Kprobe, IoSource::Syscall]
        );
        // Without kprobes the syscall source is what is left.
        let f = features(dir.path(), &[], false);
        assert_eq!(
            f.candidates(IoSourceChoice::Auto).expect("usable"),
            vec![IoSource::Syscall]
        );
    }

    #[test]
    fn a_kernel_with_no_source_says_why_for_each() {
        let dir = tracefs_with(&["syscalls/sys_enter_write"]);
        let f = features(dir.path(), &["tcp_sendmsg"], true);
        let (forced, why) = f.candidates(IoSourceChoice::Auto).expect_err("none usable");
        assert_eq!(forced, None);
        assert!(
            why.contains("sock: no tracepoint sock:sock_send_length"),
            "{why}"
        );
        assert!(
            why.contains("kprobe: no function tcp_cleanup_rbuf"),
            "{why}"
        );
        assert!(
            why.contains("syscall: no tracepoint syscalls:sys_exit_write"),
            "{why}"
        );
        let (forced, why) = f
            .candidates(IoSourceChoice::Only(IoSource::Kprobe))
            .expect_err("forced kprobe without its function");
        assert_eq!(forced, Some(IoSource::Kprobe));
        assert!(why.contains("tcp_cleanup_rbuf"), "{why}");
    }

    #[test]
    fn kallsyms_text_symbols_only_from_the_kernel_proper() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("kallsyms");
        std::fs::write(
            &path,
            "ffffffff8206e8a0 T tcp_sendmsg\n\
             ffffffff8206eac0 d tcp_cleanup_rbuf\n\
             ffffffffc0000000 t tcp_cleanup_rbuf\t[some_module]\n",
        )
        .expect("write");
        let found = text_symbols(
            path.to_str().expect("utf-8"),
            &["tcp_sendmsg", "tcp_cleanup_rbuf"],
        );
        assert_eq!(found, vec!["tcp_sendmsg".to_string()]);
    }
}
