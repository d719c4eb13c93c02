//! Several recordings read as one timeline. Each recording is a host: its own
//! CLOCK_MONOTONIC, its own pids and socket addresses. Pids and socket addresses are
//! folded with the host's index so two hosts never share one, and every host's times
//! are moved onto the first recording's clock.
//!
//! The offset between two clocks comes from the traffic both hosts saw (NTP's reasoning,
//! with every byte as a timestamp): a TCP connection seen from both ends (joined by its
//! 4-tuple, each end from its start) carries bytes one way and the other. A byte sent by
//! A at A-time `s` and read by B at B-time `r` bounds `B - A <= r - s`; a byte B sent at
//! `s` and A read at `r` bounds `B - A >= s - r`. The tightest bounds over every joined
//! connection give the offset (their midpoint) and its uncertainty (half their width),
//! which is at most half the fastest round trip. Asymmetric paths (one direction slower)
//! move the midpoint by half the asymmetry and nothing here can see it.
//!
//! Hosts with the same boot id share one clock (offset 0, exact). Hosts with no
//! connection in common fall back to the headers' wall-clock/monotonic pairs: as good
//! as the hosts' NTP, and said so.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::model::{event::Body, Direction, Event, TcpState};
use super::record::{Counters, FileHeader, RecordError, RecordReader, Source};

/// Pids are below 2^22 (the kernel's PID_MAX_LIMIT): the bits above carry the host a
/// joined event came from.
pub const PID_HOST_SHIFT: u32 = 22;
/// Recordings one joined timeline takes at most (host indexes fit above the pid bits).
pub const MAX_HOSTS: usize = 1 << (32 - PID_HOST_SHIFT);
/// Socket addresses (kernel pointers, 0xffff... on every host) get the host in bits
/// 48..: a folded address is never a real one of any host.
const SKADDR_HOST_SHIFT: u32 = 48;
/// Socket I/Os kept per connection end and direction for the clock bounds.
const IOS_PER_END: usize = 4096;

/// (host index, pid as that host knows it) of a pid in a joined timeline.
pub fn split_pid(pid: u32) -> (u32, u32) {
    (pid >> PID_HOST_SHIFT, pid & ((1 << PID_HOST_SHIFT) - 1))
}

/// A pid for display: `1234`, or `1234@2` on the third host of a joined timeline.
pub fn pid_label(pid: u32) -> String {
    match split_pid(pid) {
        (0, p) => p.to_string(),
        (h, p) => format!("{p}@{h}"),
    }
}

/// Serializes a pid as its own host numbers it (the host is said beside it).
pub fn serialize_pid<S: serde::Serializer>(pid: &u32, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u32(split_pid(*pid).1)
}

fn fold(ev: &mut Event, host: u32, offset_ns: i64) {
    ev.ts_ns = ev.ts_ns.saturating_add_signed(offset_ns);
    if host == 0 {
        return;
    }
    if ev.pid != 0 {
        ev.pid |= host << PID_HOST_SHIFT;
        ev.tid |= host << PID_HOST_SHIFT;
    }
    let sock = match &mut ev.body {
        Some(Body::State(s)) => s.sock.as_mut(),
        Some(Body::Io(s)) => s.sock.as_mut(),
        Some(Body::Accept(s)) => s.sock.as_mut(),
        Some(Body::Retransmit(s)) => s.sock.as_mut(),
        Some(Body::Gpu(g)) => {
            g.start_ns = g.start_ns.saturating_add_signed(offset_ns);
            g.end_ns = g.end_ns.saturating_add_signed(offset_ns);
            None
        }
        Some(Body::Cuda(_) | Body::Nvml(_) | Body::Ring(_)) | None => None,
    };
    if let Some(s) = sock {
        s.skaddr ^= u64::from(host) << SKADDR_HOST_SHIFT;
    }
}

/// One recording of a joined timeline.
#[derive(Clone, Debug, Serialize)]
pub struct Host {
    pub file: String,
    /// The recording host's name, boot and network namespace (from its header).
    pub name: String,
    pub boot_id: String,
    pub net_namespace: u64,
    /// Added to this recording's times to put them on the first recording's clock.
    pub offset_ns: i64,
    pub clock: Clock,
}

/// How a host's clock was put on the first recording's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "method", rename_all = "snake_case")]
pub enum Clock {
    /// The first recording: the joined timeline's clock.
    Reference,
    /// The same boot as host `with`: one CLOCK_MONOTONIC, offset exact.
    SameBoot { with: usize },
    /// Bounded by the bytes of connections seen from both ends, against host `with`.
    Traffic {
        with: usize,
        /// Connections joined by 4-tuple, each seen from its start by both hosts.
        connections: usize,
        /// Half the width of the tightest bounds: the offset is within this.
        uncertainty_ns: u64,
        /// When the tightest bounds cross (the hosts' events disagree by this much:
        /// a send stamped after its bytes left, or lost events), 0 when they do not.
        crossed_ns: u64,
    },
    /// No connection in common with any aligned host: from the wall-clock/monotonic
    /// pairs in the headers, only as good as the hosts' NTP.
    Realtime,
}

impl Host {
    /// One line on how this host's clock was aligned.
    pub fn describe(&self, index: usize) -> String {
        let who = format!(
            "host {index} {} ({}, netns {})",
            self.name, self.file, self.net_namespace
        );
        let off = self.offset_ns as f64 / 1e6;
        match &self.clock {
            Clock::Reference => format!("{who}: the reference clock"),
            Clock::SameBoot { with } => {
                format!("{who}: same boot as host {with}, one clock (offset {off:+.3} ms)")
            }
            Clock::Traffic {
                with,
                connections,
                uncertainty_ns,
                crossed_ns,
            } => {
                let crossed = if *crossed_ns > 0 {
                    format!(
                        "; the bounds cross by {:.3} ms (events disagree)",
                        *crossed_ns as f64 / 1e6
                    )
                } else {
                    String::new()
                };
                format!(
                    "{who}: offset {off:+.3} ms +- {:.3} ms against host {with}, from {connections} connection{} both saw{crossed}",
                    *uncertainty_ns as f64 / 1e6,
                    if *connections == 1 { "" } else { "s" },
                )
            }
            Clock::Realtime => format!(
                "{who}: no connection in common with another recording; offset {off:+.3} ms from the wall clocks (as good as the hosts' NTP)"
            ),
        }
    }
}

/// One connection end as a recording saw it, for the clock bounds.
#[derive(Debug, Default)]
struct End {
    local: Option<SocketAddr>,
    remote: Option<SocketAddr>,
    start_ns: u64,
    /// (time, bytes sent or read through this I/O, counted from the connection's start).
    sent: Vec<(u64, u64)>,
    recv: Vec<(u64, u64)>,
    sent_total: u64,
    recv_total: u64,
}

/// The recording's header, and the connection ends it saw from their start (connect, or the handshake's end on
/// the accepting side): only there do both ends count bytes from the same first byte.
fn ends(path: &Path) -> Result<(FileHeader, Vec<End>), RecordError> {
    let mut reader = RecordReader::open(path)?;
    let mut open: HashMap<u64, usize> = HashMap::new();
    let mut out: Vec<End> = Vec::new();
    // A batch at a time (recordings are in time order but for a reorder window's worth
    // within a batch): memory is the connections' bounded I/O lists, not the recording.
    while let Some(mut batch) = reader.next_batch()? {
        batch.sort_by_key(|e| e.ts_ns);
        for ev in &batch {
            track(ev, &mut open, &mut out);
        }
    }
    out.retain(|e| e.local.is_some() && (!e.sent.is_empty() || !e.recv.is_empty()));
    Ok((reader.header, out))
}

/// One event's part in the connection ends (`ends`).
fn track(ev: &Event, open: &mut HashMap<u64, usize>, out: &mut Vec<End>) {
    let Some(sock) = ev.sock() else { return };
    match &ev.body {
        Some(Body::State(s)) => {
            let start = s.new() == TcpState::SynSent
                || (s.old() == TcpState::SynRecv && s.new() == TcpState::Established);
            if start {
                open.insert(sock.skaddr, out.len());
                out.push(End {
                    start_ns: ev.ts_ns,
                    ..End::default()
                });
            } else if s.new() == TcpState::Close {
                open.remove(&sock.skaddr);
                return;
            }
        }
        Some(Body::Io(io)) => {
            let Some(&i) = open.get(&sock.skaddr) else {
                return;
            };
            let e = &mut out[i];
            match io.dir() {
                Direction::Send => {
                    e.sent_total += io.bytes;
                    if io.bytes > 0 && e.sent.len() < IOS_PER_END {
                        e.sent.push((ev.ts_ns, e.sent_total));
                    }
                }
                Direction::Recv => {
                    e.recv_total += io.bytes;
                    if io.bytes > 0 && e.recv.len() < IOS_PER_END {
                        e.recv.push((ev.ts_ns, e.recv_total));
                    }
                }
                Direction::Unknown => {}
            }
        }
        _ => {}
    }
    if let Some(&i) = open.get(&sock.skaddr) {
        // connect() binds the local port after SYN_SENT.
        if sock.sport != 0 {
            out[i].local = Some(sock.src());
            out[i].remote = Some(sock.dst());
        }
    }
}

/// Bounds on `clock_y - clock_x` from one connection seen by x and y: (lowest, highest).
fn bounds(x: &End, y: &End) -> (Option<i64>, Option<i64>) {
    // The send that carried byte `k - 1`: the first with a running total >= k.
    fn sender(sent: &[(u64, u64)], k: u64) -> Option<u64> {
        let i = sent.partition_point(|&(_, total)| total < k);
        sent.get(i).map(|&(t, _)| t)
    }
    let mut hi: Option<i64> = None;
    for &(r, k) in &y.recv {
        if let Some(s) = sender(&x.sent, k) {
            let b = r as i64 - s as i64;
            hi = Some(hi.map_or(b, |h| h.min(b)));
        }
    }
    let mut lo: Option<i64> = None;
    for &(r, k) in &x.recv {
        if let Some(s) = sender(&y.sent, k) {
            let b = s as i64 - r as i64;
            lo = Some(lo.map_or(b, |l| l.max(b)));
        }
    }
    (lo, hi)
}

/// `clock_y - clock_x` from the connections x and y both saw, or None without bounds
/// both ways. `coarse` (from the wall clocks) picks among ends that reused a 4-tuple.
fn traffic_offset(x: &[End], y: &[End], coarse: i64) -> Option<(i64, Clock)> {
    let mut by_tuple: HashMap<(SocketAddr, SocketAddr), Vec<&End>> = HashMap::new();
    for e in y {
        if let (Some(l), Some(r)) = (e.local, e.remote) {
            by_tuple.entry((l, r)).or_default().push(e);
        }
    }
    let (mut lo, mut hi): (Option<i64>, Option<i64>) = (None, None);
    let mut connections = 0;
    for a in x {
        let (Some(l), Some(r)) = (a.local, a.remote) else {
            continue;
        };
        let Some(candidates) = by_tuple.get(&(r, l)) else {
            continue;
        };
        let expected = a.start_ns as i64 + coarse;
        let Some(b) = candidates
            .iter()
            .min_by_key(|b| (b.start_ns as i64).abs_diff(expected))
        else {
            continue;
        };
        let (l1, h1) = bounds(a, b);
        if l1.is_none() && h1.is_none() {
            continue;
        }
        connections += 1;
        lo = lo.max(l1);
        hi = match (hi, h1) {
            (Some(h), Some(n)) => Some(h.min(n)),
            (h, n) => h.or(n),
        };
    }
    let (lo, hi) = (lo?, hi?);
    let mid = lo + (hi - lo) / 2;
    Some((
        mid,
        Clock::Traffic {
            with: 0,
            connections,
            uncertainty_ns: (hi.max(lo) - hi.min(lo)).unsigned_abs() / 2,
            crossed_ns: (lo - hi).max(0) as u64,
        },
    ))
}

/// Wall clock minus monotonic clock at the recording's start.
fn realtime_minus_monotonic(h: &FileHeader) -> i64 {
    h.start_realtime_ns as i64 - h.start_monotonic_ns as i64
}

/// Each host's offset onto host 0's clock, and how it was found.
fn align(headers: &[FileHeader], ends: &[Vec<End>]) -> Vec<(i64, Clock)> {
    let n = headers.len();
    // clock_i - clock_0, once known.
    let mut known: Vec<Option<(i64, Clock)>> = vec![None; n];
    known[0] = Some((0, Clock::Reference));
    let same_boot = |i: usize, j: usize| {
        !headers[i].boot_id.is_empty() && headers[i].boot_id == headers[j].boot_id
    };
    // Against any host already aligned, until nothing more aligns: the same boot (one
    // clock, exact) first, else the traffic.
    loop {
        let mut progress = false;
        for i in 0..n {
            if known[i].is_some() {
                continue;
            }
            if let Some((j, dj)) =
                (0..n).find_map(|j| Some((j, known[j].as_ref()?.0)).filter(|_| same_boot(i, j)))
            {
                known[i] = Some((dj, Clock::SameBoot { with: j }));
                progress = true;
                continue;
            }
            for j in 0..n {
                let Some((dj, _)) = known[j].clone() else {
                    continue;
                };
                let coarse =
                    realtime_minus_monotonic(&headers[j]) - realtime_minus_monotonic(&headers[i]);
                if let Some((d, mut clock)) = traffic_offset(&ends[j], &ends[i], coarse) {
                    if let Clock::Traffic { with, .. } = &mut clock {
                        *with = j;
                    }
                    known[i] = Some((dj + d, clock));
                    progress = true;
                    break;
                }
            }
        }
        if !progress {
            break;
        }
    }
    known
        .into_iter()
        .enumerate()
        .map(|(i, k)| {
            let (d, clock) = k.unwrap_or_else(|| {
                (
                    realtime_minus_monotonic(&headers[0]) - realtime_minus_monotonic(&headers[i]),
                    Clock::Realtime,
                )
            });
            // Host i's time t is host 0's t - d.
            (-d, clock)
        })
        .collect()
}

struct Lane {
    reader: RecordReader,
    host: u32,
    offset_ns: i64,
    /// Events read and not handed out, in time order.
    buf: VecDeque<Event>,
    /// The latest time read from this recording (after the offset).
    read_to: u64,
    done: bool,
}

impl Lane {
    fn fill(&mut self) -> Result<(), RecordError> {
        match self.reader.next_batch()? {
            None => self.done = true,
            Some(mut batch) => {
                for e in &mut batch {
                    fold(e, self.host, self.offset_ns);
                }
                batch.sort_by_key(|e| e.ts_ns);
                if let Some(last) = batch.last() {
                    self.read_to = self.read_to.max(last.ts_ns);
                }
                let mut all: Vec<Event> = self.buf.drain(..).collect();
                all.extend(batch);
                all.sort_by_key(|e| e.ts_ns); // stable: near-sorted input stays cheap
                self.buf = all.into();
            }
        }
        Ok(())
    }
}

/// What a recording's SSE prints are (`FileHeader::prints`; empty: FNV-1a).
fn prints(h: &FileHeader) -> &str {
    if h.prints.is_empty() {
        "fnv-1a"
    } else {
        &h.prints
    }
}

/// Refuses to join recordings whose prints were made by different hashes: a hop on one
/// host would never match its other end on the next (same events, other numbers).
fn same_prints(paths: &[PathBuf], headers: &[FileHeader]) -> Result<(), RecordError> {
    let Some(first) = headers.first() else {
        return Ok(());
    };
    let Some(i) = headers.iter().position(|h| prints(h) != prints(first)) else {
        return Ok(());
    };
    // The older one (FNV-1a) named first, the file to blame.
    let (old, new) = if first.prints.is_empty() {
        (0, i)
    } else {
        (i, 0)
    };
    let err = std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        format!(
            "its SSE prints are {} and those of {} are {}: the hops between hosts would \
             not match; record every host with the same tokenscope, or replay each alone",
            prints(&headers[old]),
            paths[new].display(),
            prints(&headers[new])
        ),
    );
    Err(RecordError::Io {
        path: paths[old].clone(),
        err,
    })
}

/// Recordings of several hosts as one source of events on the first one's clock, in
/// time order across recordings (within each, as recorded).
pub struct Joined {
    pub header: FileHeader,
    pub hosts: Vec<Host>,
    lanes: Vec<Lane>,
}

impl Joined {
    /// Reads each recording once for the clock bounds, then opens them for replay.
    pub fn open(paths: &[PathBuf]) -> Result<Joined, RecordError> {
        assert!(
            paths.len() <= MAX_HOSTS,
            "callers check the number of recordings"
        );
        let mut headers = Vec::new();
        let mut all_ends = Vec::new();
        for p in paths {
            let (header, e) = ends(p)?;
            headers.push(header);
            all_ends.push(e);
        }
        same_prints(paths, &headers)?;
        let aligned = align(&headers, &all_ends);
        let mut lanes = Vec::new();
        let mut hosts = Vec::new();
        for (i, (p, (offset_ns, clock))) in paths.iter().zip(aligned).enumerate() {
            let h = &headers[i];
            hosts.push(Host {
                file: p.display().to_string(),
                name: h.host.clone(),
                boot_id: h.boot_id.clone(),
                net_namespace: h.net_namespace,
                offset_ns,
                clock,
            });
            lanes.push(Lane {
                reader: RecordReader::open(p)?,
                host: i as u32,
                offset_ns,
                buf: VecDeque::new(),
                read_to: 0,
                done: false,
            });
        }
        let header = joined_header(&headers, &hosts);
        Ok(Joined {
            header,
            hosts,
            lanes,
        })
    }

    /// Lines saying how each host's clock was aligned.
    pub fn describe(&self) -> Vec<String> {
        describe(&self.hosts)
    }
}

/// Lines saying how each host's clock was aligned, and whether anything joined.
pub fn describe(hosts: &[Host]) -> Vec<String> {
    let mut lines: Vec<String> = hosts
        .iter()
        .enumerate()
        .map(|(i, h)| h.describe(i))
        .collect();
    if hosts.len() > 1
        && hosts
            .iter()
            .all(|h| matches!(h.clock, Clock::Realtime | Clock::Reference))
    {
        lines.push(
            "these recordings have no connection in common: their requests are side by side, none joined across hosts"
                .into(),
        );
    }
    lines
}

impl Source for Joined {
    fn header(&self) -> &FileHeader {
        &self.header
    }

    /// Events up to the time every unfinished recording has been read to, in time order.
    fn next_batch(&mut self) -> Result<Option<Vec<Event>>, RecordError> {
        loop {
            for lane in &mut self.lanes {
                if !lane.done && lane.buf.is_empty() {
                    lane.fill()?;
                }
            }
            let open = self.lanes.iter().filter(|l| !l.done);
            let until = open.map(|l| l.read_to).min().unwrap_or(u64::MAX);
            let mut out = Vec::new();
            for lane in &mut self.lanes {
                let n = lane.buf.partition_point(|e| e.ts_ns <= until);
                out.extend(lane.buf.drain(..n));
            }
            if !out.is_empty() {
                out.sort_by_key(|e| e.ts_ns);
                return Ok(Some(out));
            }
            if self.lanes.iter().all(|l| l.done && l.buf.is_empty()) {
                return Ok(None);
            }
            // The recording read least far holds everything back: read more of it.
            if let Some(lane) = self
                .lanes
                .iter_mut()
                .filter(|l| !l.done)
                .min_by_key(|l| l.read_to)
            {
                lane.fill()?;
            }
        }
    }
}

/// One header for the joined timeline: times on the first recording's clock, counters
/// summed, names joined.
fn joined_header(headers: &[FileHeader], hosts: &[Host]) -> FileHeader {
    let mut h = headers[0].clone();
    let shifted = |t: u64, i: usize| t.saturating_add_signed(hosts[i].offset_ns);
    h.host = join_distinct(headers.iter().map(|x| x.host.as_str()));
    h.kernel = join_distinct(headers.iter().map(|x| x.kernel.as_str()));
    h.io_source = join_distinct(headers.iter().map(|x| x.io_source.as_str()));
    h.start_monotonic_ns = (0..headers.len())
        .map(|i| shifted(headers[i].start_monotonic_ns, i))
        .min()
        .unwrap_or(0);
    h.end_monotonic_ns = (0..headers.len())
        .map(|i| shifted(headers[i].end_monotonic_ns, i))
        .max()
        .unwrap_or(0);
    h.complete = headers.iter().all(|x| x.complete);
    // Each file's own order says nothing of how far apart their lanes merge.
    h.disorder_ns = None;
    h.payload_cap = headers.iter().map(|x| x.payload_cap).min().unwrap_or(0);
    let mut c = Counters::default();
    for x in headers.iter().filter_map(|x| x.counters) {
        c.submitted += x.submitted;
        c.dropped += x.dropped;
        c.delivered += x.delivered;
        c.decode_errors += x.decode_errors;
        c.written += x.written;
        c.gpu_samples += x.gpu_samples;
        c.ring_readings += x.ring_readings;
    }
    h.counters = Some(c);
    for x in &headers[1..] {
        for p in &x.probes {
            if !h.probes.contains(p) {
                h.probes.push(p.clone());
            }
        }
        for p in &x.probes_skipped {
            if !h.probes_skipped.contains(p) {
                h.probes_skipped.push(p.clone());
            }
        }
        h.gpu_devices.extend(x.gpu_devices.iter().cloned());
        h.nvml_dropped += x.nvml_dropped;
        h.cupti_received += x.cupti_received;
        h.cupti_dropped += x.cupti_dropped;
        h.tls_untied += x.tls_untied;
    }
    h
}

fn join_distinct<'a>(names: impl Iterator<Item = &'a str>) -> String {
    let mut seen: Vec<&str> = Vec::new();
    for n in names {
        if !seen.contains(&n) {
            seen.push(n);
        }
    }
    seen.join(" + ")
}

#[cfg(test)]
#[path = "hosts_tests.rs"]
mod tests;
