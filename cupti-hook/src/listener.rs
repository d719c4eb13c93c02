//! Collector side: accepts hook connections on a Unix socket, decodes their records.

use std::collections::HashMap;
use std::io::{self, BufReader, Read};
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

/// What the hooks told us so far.
#[derive(Clone, Debug, Default)]
pub struct HookStats {
    pub connections: u64,
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
    /// Binds `path` (removing a stale socket file) and accepts hooks on a background thread.
    pub fn bind(path: impl AsRef<Path>) -> io::Result<HookListener> {
        let path = path.as_ref().to_path_buf();
        if path.exists() {
            std::fs::remove_file(&path)?;
        }
        let listener = UnixListener::bind(&path)?;
        let shared: Arc<(Mutex<Shared>, Condvar)> = Arc::default();
        let accept_shared = shared.clone();
        thread::Builder::new()
            .name("cupti-hook-accept".into())
            .spawn(move || {
                for (conn_id, stream) in (0u64..).zip(listener.incoming()) {
                    let Ok(stream) = stream else { continue };
                    let conn_shared = accept_shared.clone();
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
        s.stats
            .decode_errors
            .push(format!("hook connection {conn_id}: {e}"));
    }
    s.stats.closed += 1;
    drop(s);
    shared.1.notify_all();
}

/// Reads length-delimited `HookMessage`s until end of stream, handing each to `sink`.
/// Refuses a Hello of another wire version.
pub fn read_hook_stream(reader: impl Read, mut sink: impl FnMut(HookMessage)) -> io::Result<()> {
    let mut reader = BufReader::with_capacity(256 * 1024, reader);
    let mut buf = Vec::new();
    while let Some(len) = read_varint(&mut reader)? {
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
}
