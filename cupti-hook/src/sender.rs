//! The bounded queue between CUPTI's thread and the socket: producers never wait (a full
//! queue drops and counts), one background thread does all socket I/O.

use std::collections::HashSet;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::parse::QueuedRecord;
use crate::wire::{self, activity::Record, hook_message::Body, HookMessage};

/// Records per Batch message: big enough to amortise the write, small enough to stay prompt.
const BATCH_RECORDS: usize = 512;

enum Outgoing {
    Record(QueuedRecord),
    Control(Body),
    /// Send what is pending plus the final counters, then acknowledge.
    Flush(SyncSender<()>),
}

pub(crate) struct Counters {
    pub(crate) dropped: AtomicU64,
    pub(crate) cupti_dropped: AtomicU64,
    pub(crate) sent: AtomicU64,
    /// The collector went away: producers stop enqueueing.
    pub(crate) dead: AtomicBool,
}

pub(crate) struct ActivitySender {
    tx: SyncSender<Outgoing>,
    pub(crate) counters: Arc<Counters>,
}

impl ActivitySender {
    /// Starts the socket thread on `stream`; `capacity` records fit in the queue.
    pub(crate) fn start(stream: UnixStream, capacity: usize) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::sync_channel(capacity.max(1));
        let counters = Arc::new(Counters {
            dropped: AtomicU64::new(0),
            cupti_dropped: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            dead: AtomicBool::new(false),
        });
        let thread_counters = counters.clone();
        thread::Builder::new()
            .name("tokenscope-cupti".into())
            .spawn(move || socket_loop(stream, rx, &thread_counters))?;
        Ok(ActivitySender { tx, counters })
    }

    /// Never blocks: a full queue (or a dead collector) drops the record and counts it.
    pub(crate) fn push(&self, record: QueuedRecord) {
        if self.counters.dead.load(Ordering::Relaxed) {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        match self.tx.try_send(Outgoing::Record(record)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Hello and errors: waits for room at most `deadline`, since they are rare and small.
    pub(crate) fn control(&self, body: Body, deadline: Duration) -> bool {
        self.send_within(Outgoing::Control(body), deadline)
    }

    /// Sends everything queued and the final counters; gives up after `deadline` so a stuck
    /// collector cannot hold the host's exit.
    pub(crate) fn flush(&self, deadline: Duration) -> bool {
        let start = Instant::now();
        let (ack_tx, ack_rx) = mpsc::sync_channel(1);
        if !self.send_within(Outgoing::Flush(ack_tx), deadline) {
            return false;
        }
        let left = deadline.saturating_sub(start.elapsed());
        ack_rx.recv_timeout(left).is_ok()
    }

    fn send_within(&self, mut item: Outgoing, deadline: Duration) -> bool {
        let start = Instant::now();
        loop {
            match self.tx.try_send(item) {
                Ok(()) => return true,
                Err(TrySendError::Disconnected(_)) => return false,
                Err(TrySendError::Full(back)) => {
                    if start.elapsed() >= deadline || self.counters.dead.load(Ordering::Relaxed) {
                        return false;
                    }
                    item = back;
                    // A full queue has no event to await from here; poll briefly.
                    thread::sleep(Duration::from_millis(1));
                }
            }
        }
    }
}

fn socket_loop(stream: UnixStream, rx: Receiver<Outgoing>, counters: &Counters) {
    let mut names_sent: HashSet<u64> = HashSet::new();
    let mut batch: Vec<wire::Activity> = Vec::with_capacity(BATCH_RECORDS);
    let mut out = Vec::with_capacity(64 * 1024);
    while let Ok(first) = rx.recv() {
        let mut next = Some(first);
        let mut acks = Vec::new();
        while let Some(item) = next.take() {
            match item {
                Outgoing::Record(QueuedRecord::Kernel(mut kernel, name)) => {
                    if names_sent.insert(kernel.name_hash) {
                        kernel.name = name.to_string();
                    }
                    batch.push(wire::Activity {
                        record: Some(Record::Kernel(kernel)),
                    });
                }
                Outgoing::Record(QueuedRecord::Other(record)) => {
                    batch.push(wire::Activity {
                        record: Some(record),
                    });
                }
                Outgoing::Control(body) => {
                    flush_batch(&mut batch, counters, &mut out);
                    wire::encode_message(&HookMessage { body: Some(body) }, &mut out);
                }
                Outgoing::Flush(ack) => {
                    acks.push(ack);
                    break;
                }
            }
            if batch.len() >= BATCH_RECORDS {
                flush_batch(&mut batch, counters, &mut out);
                break;
            }
            next = rx.try_recv().ok();
        }
        if !batch.is_empty() || !acks.is_empty() {
            // A flush always sends a batch, even empty, so the final drop count arrives.
            force_batch(&mut batch, counters, &mut out);
        }
        // A failed send means the collector is gone: the host runs on, we stop sending.
        if !out.is_empty()
            && !counters.dead.load(Ordering::Relaxed)
            && send_all(&stream, &out).is_err()
        {
            counters.dead.store(true, Ordering::Relaxed);
        }
        out.clear();
        for ack in acks {
            let _ = ack.try_send(());
        }
    }
}

fn flush_batch(batch: &mut Vec<wire::Activity>, counters: &Counters, out: &mut Vec<u8>) {
    if !batch.is_empty() {
        force_batch(batch, counters, out);
    }
}

fn force_batch(batch: &mut Vec<wire::Activity>, counters: &Counters, out: &mut Vec<u8>) {
    counters
        .sent
        .fetch_add(batch.len() as u64, Ordering::Relaxed);
    let msg = HookMessage {
        body: Some(Body::Batch(wire::Batch {
            records: std::mem::take(batch),
            dropped_total: counters.dropped.load(Ordering::Relaxed),
            cupti_dropped_total: counters.cupti_dropped.load(Ordering::Relaxed),
            pid: std::process::id(),
        })),
    };
    wire::encode_message(&msg, out);
}

/// write_all without SIGPIPE: a collector that closed its end must not kill the host.
fn send_all(stream: &UnixStream, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        // SAFETY: the fd is open for the stream's lifetime; the slice is valid for its length.
        let n = unsafe {
            libc::send(
                stream.as_raw_fd(),
                bytes.as_ptr().cast(),
                bytes.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        bytes = &bytes[n as usize..];
    }
    Ok(())
}
