//! Collector side: accepts hook connections on a Unix socket, decodes their records.
//! The socket is private (0600, bound in a 0700 directory and moved into place, so it is
//! never reachable with looser modes), a peer must run as the recorder's user or root
//! (SO_PEERCRED), and a message longer than `MAX_MESSAGE_BYTES` ends its connection
//! before anything is allocated for it: a local stranger can neither feed records nor
//! make the recorder allocate.

use std::collections::HashMap;
use std::io::{self, BufReader, Read};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use prost::Message;

use crate::wire::{self, activity::Record, hook_message::Body, HookMessage};

/// One decoded GPU activity, with the pid of the process whose hook sent it.
/// Timestamps are CLOCK_MONOTONIC ns; kernel names are always resolved.
#[derive(Clone, Debug, PartialEq)]
pub enum GpuActivity {
    Kernel {
        pid: u32,
        kernel: wire::KernelRecord,
    },
    Memcpy {
        pid: u32,
        memcpy: wire::MemcpyRecord,
    },
    Graph {
        pid: u32,
        graph: wire::GraphRecord,
    },
    Marker {
        pid: u32,
        marker: wire::MarkerRecord,
    },
}

impl GpuActivity {
    pub fn pid(&self) -> u32 {
        match self {
            GpuActivity::Kernel { pid, .. }
            | GpuActivity::Memcpy { pid, .. }
            | GpuActivity::Graph { pid, .. }
            | GpuActivity::Marker { pid, .. } => *pid,
        }
    }

    pub fn start_ns(&self) -> u64 {
        match self {
            GpuActivity::Kernel { kernel, .. } => kernel.start_ns,
            GpuActivity::Memcpy { memcpy, .. } => memcpy.start_ns,
            GpuActivity::Graph { graph, .. } => graph.start_ns,
            GpuActivity::Marker { marker, .. } => marker.start_ns,
        }
    }

    pub fn end_ns(&self) -> u64 {
        match self {
            GpuActivity::Kernel { kernel, .. } => kernel.end_ns,
            GpuActivity::Memcpy { memcpy, .. } => memcpy.end_ns,
            GpuActivity::Graph { graph, .. } => graph.end_ns,
            GpuActivity::Marker { marker, .. } => marker.end_ns,
        }
    }
}

/// Longest hook message read (a batch is 512 records: well under 1 MiB with long kernel
/// names). A longer length ends the connection and is counted in `HookStats::oversized`.
pub const MAX_MESSAGE_BYTES: u64 = 16 << 20;

/// What the hooks told us so far.
#[derive(Clone, Debug, Default)]
pub struct HookStats {
    pub connections: u64,
    /// Connections refused: the peer runs as another user (not root, not the recorder's).
    pub refused: u64,
    /// Connections ended by a message longer than `MAX_MESSAGE_BYTES`.
    pub oversized: u64,
    /// Connections whose stream has ended (hook process exited or closed).
    pub closed: u64,
    pub records_received: u64,
    /// Hook-side drops (full queue), summed over connections; as of each hook's last batch.
    pub records_dropped: u64,
    /// Drops CUPTI itself reported.
    pub cupti_dropped: u64,
    pub hellos: Vec<wire::Hello>,
    pub errors: Vec<wire::HookError>,
    /// Streams that could not be decoded, one line each.
    pub decode_errors: Vec<String>,
}

#[derive(Default)]
struct Shared {
    activities: Vec<GpuActivity>,
    stats: HookStats,
    /// Per connection: last dropped_total / cupti_dropped_total seen.
    dropped_by_conn: HashMap<u64, (u64, u64)>,
}

pub struct HookListener {
    path: PathBuf,
    shared: Arc<(Mutex<Shared>, Condvar)>,
}

impl HookListener {
    /// Binds `path` (removing a stale socket file; creating missing directories 0700)
    /// and accepts hooks on a background thread.
    pub fn bind(path: impl AsRef<Path>) -> io::Result<HookListener> {
        let path = path.as_ref().to_path_buf();
        let listener = bind_private(&path)?;
        let shared: Arc<(Mutex<Shared>, Condvar)> = Arc::default();
        let accept_shared = shared.clone();
        thread::Builder::new()
            .name("cupti-hook-accept".into())
            .spawn(move || {
                for (conn_id, stream) in (0u64..).zip(listener.incoming()) {
                    let Ok(stream) = stream else { continue };
                    let conn_shared = accept_shared.clone();
                    if !peer_allowed(&stream) {
                        lock(&conn_shared.0).stats.refused += 1;
                        conn_shared.1.notify_all();
                        continue; // dropped: closed unread
                    }
                    lock(&conn_shared.0).stats.connections += 1;
                    conn_shared.1.notify_all();
                    let _ = thread::Builder::new()
                        .name("cupti-hook-conn".into())
                        .spawn(move || serve_connection(conn_id, stream, &conn_shared));
                }
            })?;
        Ok(HookListener { path, shared })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Takes every activity received since the last drain, in arrival order.
    pub fn drain(&self) -> Vec<GpuActivity> {
        std::mem::take(&mut lock(&self.shared.0).activities)
    }

    pub fn records_received(&self) -> u64 {
        lock(&self.shared.0).stats.records_received
    }

    pub fn records_dropped(&self) -> u64 {
        lock(&self.shared.0).stats.records_dropped
    }

    pub fn stats(&self) -> HookStats {
        lock(&self.shared.0).stats.clone()
    }

    /// Waits until `done(stats)` holds or `timeout` passes; returns whether it held.
    pub fn wait_until(&self, timeout: Duration, done: impl Fn(&HookStats) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        let (mutex, cond) = &*self.shared;
        let mut guard = lock(mutex);
        loop {
            if done(&guard.stats) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            guard = match cond.wait_timeout(guard, left) {
                Ok((g, _)) => g,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }
}

impl Drop for HookListener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Binds the socket in a fresh 0700 directory beside `path`, makes it 0600 and moves it
/// to `path`: at no moment can another user reach it.
fn bind_private(path: &Path) -> io::Result<UnixListener> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&parent)?;
    if path.exists() {
        std::fs::remove_file(path)?;
    }
    let private = parent.join(format!(".tokenscope-cupti-{}", std::process::id()));
    std::fs::DirBuilder::new().mode(0o700).create(&private)?;
    let staged = private.join("s");
    let bound = UnixListener::bind(&staged).and_then(|l| {
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o600))?;
        std::fs::rename(&staged, path)?;
        Ok(l)
    });
    let _ = std::fs::remove_file(&staged);
    let _ = std::fs::remove_dir(&private);
    bound
}

/// The peer runs as root or as this process's effective user (SO_PEERCRED: its
/// credentials when it connected).
fn peer_allowed(stream: &UnixStream) -> bool {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred {
        pid: 0,
        uid: u32::MAX,
        gid: u32::MAX,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: the fd is the stream's, open for this call; `cred` and `len` are valid for
    // writes of the size passed.
    let got = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            std::ptr::addr_of_mut!(cred).cast(),
            &mut len,
        )
    };
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    got == 0 && (cred.uid == 0 || cred.uid == me)
}

fn lock(m: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn serve_connection(conn_id: u64, stream: UnixStream, shared: &(Mutex<Shared>, Condvar)) {
    let mut pid = 0u32;
    let mut names: HashMap<u64, String> = HashMap::new();
    let result = read_hook_stream(stream, |msg| {
        let mut s = lock(&shared.0);
        match msg.body {
            Some(Body::Hello(hello)) => {
                pid = hello.pid;
                s.stats.hellos.push(hello);
            }
            Some(Body::Error(err)) => s.stats.errors.push(err),
            Some(Body::Batch(batch)) => {
                pid = batch.pid;
                s.stats.records_received += batch.records.len() as u64;
                let (old_dropped, old_cupti) = s
                    .dropped_by_conn
                    .insert(conn_id, (batch.dropped_total, batch.cupti_dropped_total))
                    .unwrap_or((0, 0));
                s.stats.records_dropped += batch.dropped_total.saturating_sub(old_dropped);
                s.stats.cupti_dropped += batch.cupti_dropped_total.saturating_sub(old_cupti);
                for a in batch.records {
                    let Some(record) = a.record else { continue };
                    let activity = match record {
                        Record::Kernel(mut kernel) => {
                            if kernel.name.is_empty() {
                                kernel.name =
                                    names.get(&kernel.name_hash).cloned().unwrap_or_default();
                            } else {
                                names.insert(kernel.name_hash, kernel.name.clone());
                            }
                            GpuActivity::Kernel { pid, kernel }
                        }
                        Record::Memcpy(memcpy) => GpuActivity::Memcpy { pid, memcpy },
                        Record::Graph(graph) => GpuActivity::Graph { pid, graph },
                        Record::Marker(marker) => GpuActivity::Marker { pid, marker },
                    };
                    s.activities.push(activity);
                }
            }
            None => {}
        }
        drop(s);
        shared.1.notify_all();
    });
    let mut s = lock(&shared.0);
    if let Err(e) = result {
        if e.kind() == io::ErrorKind::FileTooLarge {
            s.stats.oversized += 1;
        }
        s.stats
            .decode_errors
            .push(format!("hook connection {conn_id}: {e}"));
    }
    s.stats.closed += 1;
    drop(s);
    shared.1.notify_all();
}

/// Reads length-delimited `HookMessage`s until end of stream, handing each to `sink`.
/// Refuses a Hello of another wire version, and a length over `MAX_MESSAGE_BYTES`
/// (`ErrorKind::FileTooLarge`) before reading or allocating it.
pub fn read_hook_stream(reader: impl Read, mut sink: impl FnMut(HookMessage)) -> io::Result<()> {
    let mut reader = BufReader::with_capacity(256 * 1024, reader);
    let mut buf = Vec::new();
    while let Some(len) = read_varint(&mut reader)? {
        if len > MAX_MESSAGE_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::FileTooLarge,
                format!(
                    "a message of {len} bytes, over the {} MiB limit: connection ended",
                    MAX_MESSAGE_BYTES >> 20
                ),
            ));
        }
        buf.resize(len as usize, 0);
        reader.read_exact(&mut buf)?;
        let msg = HookMessage::decode(buf.as_slice())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        if let Some(Body::Hello(h)) = &msg.body {
            if h.wire_version != wire::WIRE_VERSION {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "hook speaks wire version {}, this collector {}",
                        h.wire_version,
                        wire::WIRE_VERSION
                    ),
                ));
            }
        }
        sink(msg);
    }
    Ok(())
}

/// None at a clean end of stream (before the first byte of a length).
fn read_varint(r: &mut impl Read) -> io::Result<Option<u64>> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let mut byte = [0u8];
        if r.read(&mut byte)? == 0 {
            return if shift == 0 {
                Ok(None)
            } else {
                Err(io::ErrorKind::UnexpectedEof.into())
            };
        }
        value |= u64::from(byte[0] & 0x7f) << shift;
        if byte[0] & 0x80 == 0 {
            return Ok(Some(value));
        }
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidData,
        "length varint too long",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(wire_version: u32) -> HookMessage {
        HookMessage {
            body: Some(Body::Hello(wire::Hello {
                wire_version,
                ..Default::default()
            })),
        }
    }

    #[test]
    fn a_hook_of_another_wire_version_is_refused() {
        let mut bytes = Vec::new();
        wire::encode_message(&hello(wire::WIRE_VERSION + 1), &mut bytes);
        let err = read_hook_stream(bytes.as_slice(), |_| {}).expect_err("other version refused");
        assert!(err.to_string().contains("wire version"), "says why: {err}");
    }

    #[test]
    fn a_stream_cut_mid_message_is_an_error_and_a_clean_end_is_not() {
        let mut bytes = Vec::new();
        wire::encode_message(&hello(wire::WIRE_VERSION), &mut bytes);
        let mut seen = 0;
        read_hook_stream(bytes.as_slice(), |_| seen += 1).expect("clean end");
        assert_eq!(seen, 1, "one message decoded");
        let cut = &bytes[..bytes.len() - 1];
        assert!(
            read_hook_stream(cut, |_| {}).is_err(),
            "a truncated message must not pass"
        );
    }

    #[test]
    fn a_huge_length_is_refused_before_anything_is_allocated() {
        let mut bytes = Vec::new();
        wire::encode_message(&hello(wire::WIRE_VERSION), &mut bytes);
        // A 4 GiB length, and nothing after it.
        let mut len = 4u64 << 30;
        while len >= 0x80 {
            bytes.push((len as u8 & 0x7f) | 0x80);
            len >>= 7;
        }
        bytes.push(len as u8);
        let mut seen = 0;
        let err = read_hook_stream(bytes.as_slice(), |_| seen += 1).expect_err("refused");
        assert_eq!(err.kind(), io::ErrorKind::FileTooLarge);
        assert!(err.to_string().contains("4294967296 bytes"), "{err}");
        assert_eq!(seen, 1, "what came before is kept");
    }

    fn rss_kib() -> u64 {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
                line.split_whitespace().nth(1)?.parse().ok()
            })
            .unwrap_or(0)
    }

    /// Privileged (the project's tests run as root): a stranger's connection (another
    /// uid, made reachable on purpose) is refused and counted; an owner's 4 GiB length
    /// ends its connection, counted, and the memory does not move.
    #[test]
    fn strangers_are_refused_and_huge_lengths_cut_without_allocating() {
        use std::io::Write;
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        assert_eq!(euid, 0, "run as root (cargo xtask test)");
        let dir = std::env::temp_dir().join(format!("ts-cupti-test-{}", std::process::id()));
        let path = dir.join("hook.sock");
        let listener = HookListener::bind(&path).expect("bind");
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(
            (mode(&dir), mode(&path)),
            (0o700, 0o600),
            "private by default"
        );

        // Open it up so that uid 65534 can reach it: only SO_PEERCRED stands in the way.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        let stranger = {
            let path = path.clone();
            std::thread::spawn(move || {
                // SAFETY: a raw setresuid changes this thread's credentials only.
                let r = unsafe { libc::syscall(libc::SYS_setresuid, 65534, 65534, 65534) };
                assert_eq!(r, 0, "setresuid");
                let mut s = UnixStream::connect(&path).expect("the kernel lets it connect");
                let mut bytes = Vec::new();
                wire::encode_message(&hello(wire::WIRE_VERSION), &mut bytes);
                let _ = s.write_all(&bytes);
            })
        };
        stranger.join().unwrap();
        assert!(
            listener.wait_until(Duration::from_secs(5), |s| s.refused == 1),
            "refused and counted: {:?}",
            listener.stats()
        );
        assert!(listener.stats().hellos.is_empty(), "nothing of it was read");

        let before = rss_kib();
        let mut s = UnixStream::connect(&path).expect("connect as root");
        s.write_all(&[0x80, 0x80, 0x80, 0x80, 0x10]).unwrap(); // 4 GiB
        assert!(
            listener.wait_until(Duration::from_secs(5), |s| s.oversized == 1
                && s.closed == 1),
            "cut and counted: {:?}",
            listener.stats()
        );
        let grew = rss_kib().saturating_sub(before);
        assert!(grew < 16 << 10, "memory did not move: +{grew} KiB");
        drop(listener);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
