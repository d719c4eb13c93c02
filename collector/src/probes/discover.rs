//! Which files to put uprobes on: libraries the traced processes map, the
//! system's own copy, and executables that carry the symbols themselves. A
//! uprobe on a file covers every process that maps it, now or later.

use std::collections::{BTreeSet, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Files whose name passes `wanted`, mapped by `pids` (every process when empty),
/// each once (one inode is never probed twice, whatever the path it was found by).
/// A process in another mount namespace (a container) is read through
/// `/proc/PID/root`: its paths name files of its own root.
pub(super) fn mapped(pids: &[u32], wanted: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let mut found = BTreeSet::new();
    for pid in pids_or_all(pids) {
        let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
            continue;
        };
        for path in maps.lines().filter_map(|l| l.split_whitespace().nth(5)) {
            let name = path.rsplit('/').next().unwrap_or_default();
            if wanted(name) {
                found.insert(from_here(pid, path));
            }
        }
    }
    once_per_inode(found)
}

/// `path` as process `pid` sees it, as this process can open it: the same path in the
/// same mount namespace (symlinked directories resolved), else through its root.
fn from_here(pid: u32, path: &str) -> PathBuf {
    let ns = |p: String| std::fs::read_link(p).ok();
    match (
        ns("/proc/self/ns/mnt".into()),
        ns(format!("/proc/{pid}/ns/mnt")),
    ) {
        (Some(ours), Some(theirs)) if ours != theirs => {
            // Never canonicalised: resolving /proc/PID/root would land in our own root.
            PathBuf::from(format!("/proc/{pid}/root{path}"))
        }
        _ => canonical(Path::new(path)),
    }
}

/// Drops paths that name an inode already listed (two containers of one image, a
/// library seen both directly and through a root); paths that cannot be read go.
fn once_per_inode(paths: BTreeSet<PathBuf>) -> Vec<PathBuf> {
    let mut seen = HashSet::new();
    paths
        .into_iter()
        .filter(|p| std::fs::metadata(p).is_ok_and(|m| seen.insert((m.dev(), m.ino()))))
        .collect()
}

/// OpenSSL for the plaintext probes: every libssl.so* a traced process maps, the
/// system's libssl from the loader cache (clients started after the recording use
/// it), and traced executables that export SSL_read themselves (node, statically
/// linked servers).
pub(super) fn libssl(pids: &[u32]) -> Vec<PathBuf> {
    let is_libssl = |name: &str| name.starts_with("libssl.so");
    let mut found: BTreeSet<PathBuf> = mapped(pids, is_libssl).into_iter().collect();
    found.extend(loader_cache(is_libssl));
    // Executables that map no libssl may carry OpenSSL themselves.
    let mut exes = BTreeSet::new();
    for pid in pids_or_all(pids) {
        let maps_libssl = std::fs::read_to_string(format!("/proc/{pid}/maps"))
            .is_ok_and(|m| m.contains("/libssl.so"));
        if let (false, Ok(exe)) = (maps_libssl, std::fs::read_link(format!("/proc/{pid}/exe"))) {
            if let Some(exe) = exe.to_str() {
                exes.insert(from_here(pid, exe));
            }
        }
    }
    found.extend(exes.into_iter().filter(|exe| exports(exe, "SSL_read")));
    once_per_inode(found)
}

/// Processes in the network namespace whose inode is `inode`.
pub(super) fn in_netns(inode: u32) -> Vec<u32> {
    pids_or_all(&[])
        .into_iter()
        .filter(|pid| {
            std::fs::metadata(format!("/proc/{pid}/ns/net"))
                .is_ok_and(|m| m.ino() == u64::from(inode))
        })
        .collect()
}

fn pids_or_all(pids: &[u32]) -> Vec<u32> {
    if !pids.is_empty() {
        return pids.to_vec();
    }
    std::fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

fn canonical(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

/// Libraries the dynamic loader's cache (`ldconfig -p`) lists under a wanted name.
fn loader_cache(wanted: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let Ok(out) = std::process::Command::new("ldconfig").arg("-p").output() else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (name, path) = l.trim().split_once(" => ")?;
            let name = name.split_whitespace().next()?;
            wanted(name).then(|| canonical(Path::new(path.trim())))
        })
        .filter(|p| p.exists())
        .collect()
}

/// Whether the ELF file at `path` defines `symbol` in its dynamic symbol table. Reads
/// only the headers and tables it needs (executables can be hundreds of MB).
pub(super) fn exports(path: &Path, symbol: &str) -> bool {
    use object::{Object, ObjectSymbol};
    let Ok(file) = std::fs::File::open(path) else {
        return false;
    };
    let cache = object::ReadCache::new(file);
    let Ok(elf) = object::File::parse(&cache) else {
        return false;
    };
    elf.dynamic_symbols()
        .any(|s| s.is_definition() && s.name() == Ok(symbol))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exports_reads_the_dynamic_symbol_table() {
        let libc = mapped(&[std::process::id()], |n| n.starts_with("libc.so"));
        let libc = libc.first().expect("this test process maps libc");
        assert!(exports(libc, "malloc"), "libc exports malloc");
        assert!(!exports(libc, "SSL_read"), "libc does not export SSL_read");
        assert!(!exports(Path::new("/nonexistent"), "malloc"));
    }

    #[test]
    fn processes_are_found_by_their_network_namespace() {
        let own = std::fs::metadata("/proc/self/ns/net")
            .expect("own netns")
            .ino();
        let found = in_netns(u32::try_from(own).expect("a 32-bit inode"));
        assert!(
            found.contains(&std::process::id()),
            "this process is in its own namespace: {found:?}"
        );
        assert!(in_netns(1).is_empty(), "no namespace has inode 1");
    }
}
