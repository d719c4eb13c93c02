//! `tokenscope-lab replicate`: one recording played N times end to end, as if the
//! same processes had served N times the traffic, for the scaling bench
//! (`cargo xtask bench scaling`). Streamed: a batch in, a batch out.
//!
//! Copy `i` is shifted by `i * (span + gap)` and given its own connections and
//! requests, so no copy stitches into another: socket addresses (`skaddr`) and IP
//! addresses (so 4-tuples differ) are remapped, and payload fingerprints salted (so
//! bodies, prompt prefixes and token events differ). Pids stay: a longer
//! recording of one serving chain has the same processes.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use collector::ingest::model::{event::Body, Sniff, Sock};
use collector::ingest::record::{Counters, RecordReader, RecordWriter};
use collector::ingest::Event;

#[derive(Args, Debug, Clone)]
pub struct ReplicateArgs {
    /// A recording written by `tokenscope record` (uncompressed).
    pub input: PathBuf,
    /// How many copies to write, one after the other.
    #[arg(long, default_value_t = 10)]
    pub times: u32,
    /// Idle time between the end of one copy and the start of the next.
    #[arg(long, default_value = "1s", value_parser = collector::duration::parse)]
    pub gap: Duration,
    #[arg(short, long, value_name = "FILE")]
    pub output: PathBuf,
}

/// What was written: events, and the span of one copy (first to last timestamp).
pub struct Replicated {
    pub events: u64,
    pub span_ns: u64,
}

pub fn run(args: &ReplicateArgs) -> Result<()> {
    let done = replicate(&args.input, &args.output, args.times, args.gap)?;
    eprintln!(
        "replicate: {} x {} ns -> {} events in {}",
        args.times,
        done.span_ns,
        done.events,
        args.output.display()
    );
    Ok(())
}

pub fn replicate(input: &Path, output: &Path, times: u32, gap: Duration) -> Result<Replicated> {
    if times == 0 || times > u32::from(u16::MAX) {
        bail!(
            "--times must be 1 to {} (copies are numbered in 16 bits)",
            u16::MAX
        );
    }
    let (first, last) = time_bounds(input)?;
    let span_ns = last - first;
    let stride = span_ns + u64::try_from(gap.as_nanos()).context("--gap")?;
    let mut header = RecordReader::open(input)?.header;
    let end = header.end_monotonic_ns.max(last);
    let counters = header.counters.take().unwrap_or_default();
    let mut writer = RecordWriter::create(output, header)?;
    for copy in 0..times {
        let mut reader = RecordReader::open(input)?;
        let copy = Copy {
            // Ring readings are running totals: each copy's count on from those before.
            ring_before: (counters.submitted, counters.dropped),
            ..Copy::new(copy, stride)
        };
        while let Some(batch) = reader.next_batch()? {
            for mut event in batch {
                copy.apply(&mut event);
                writer.push(event)?;
            }
        }
    }
    let n = u64::from(times);
    let scaled = Counters {
        submitted: counters.submitted * n,
        dropped: counters.dropped * n,
        delivered: counters.delivered * n,
        decode_errors: counters.decode_errors * n,
        written: 0, // set by finish
        gpu_samples: counters.gpu_samples * n,
        ring_readings: counters.ring_readings * n,
    };
    let events = writer.written();
    writer.finish(scaled, end + (n - 1) * stride)?;
    Ok(Replicated { events, span_ns })
}

/// First and last time in the recording, GPU activity ends included.
fn time_bounds(input: &Path) -> Result<(u64, u64)> {
    let mut reader = RecordReader::open(input)?;
    let (mut first, mut last) = (u64::MAX, 0);
    while let Some(batch) = reader.next_batch()? {
        for e in &batch {
            let end = match &e.body {
                Some(Body::Gpu(g)) => g.end_ns.max(e.ts_ns),
                _ => e.ts_ns,
            };
            first = first.min(e.ts_ns);
            last = last.max(end);
        }
    }
    if first > last {
        bail!("{}: no events to replicate", input.display());
    }
    Ok((first, last))
}

/// How copy `index` differs from the original; copy 0 is the original.
struct Copy {
    index: u16,
    shift_ns: u64,
    salt: u64,
    /// One copy's (submitted, dropped), times this copy's index, goes onto its readings.
    ring_before: (u64, u64),
}

impl Copy {
    fn new(index: u32, stride_ns: u64) -> Self {
        let index = u16::try_from(index).expect("checked by replicate");
        Copy {
            index,
            shift_ns: u64::from(index) * stride_ns,
            salt: u64::from(index).wrapping_mul(0x9e37_79b9_7f4a_7c15),
            ring_before: (0, 0),
        }
    }

    fn apply(&self, e: &mut Event) {
        e.ts_ns += self.shift_ns;
        match &mut e.body {
            Some(Body::State(s)) => self.sock(&mut s.sock),
            Some(Body::Accept(a)) => self.sock(&mut a.sock),
            Some(Body::Retransmit(r)) => self.sock(&mut r.sock),
            Some(Body::Io(io)) => {
                self.sock(&mut io.sock);
                if let Some(sniff) = &mut io.sniff {
                    self.sniff(sniff);
                }
            }
            Some(Body::Gpu(g)) => {
                g.start_ns += self.shift_ns;
                g.end_ns += self.shift_ns;
            }
            Some(Body::Ring(r)) => {
                let k = u64::from(self.index);
                r.submitted += self.ring_before.0 * k;
                r.dropped += self.ring_before.1 * k;
            }
            Some(Body::Cuda(_) | Body::Nvml(_)) | None => {}
        }
    }

    fn sock(&self, sock: &mut Option<Sock>) {
        let Some(s) = sock else { return };
        // Kernel addresses have their top 16 bits all set: flipping them keeps copies
        // apart from each other and from every real socket.
        s.skaddr ^= u64::from(self.index) << 48;
        self.ip(&mut s.saddr);
        self.ip(&mut s.daddr);
    }

    /// The copy number in two bytes inside the network part that keeps loopback
    /// loopback (127.X.X.1, ::ffff:127.X.X.1), so connection peers still pair up by
    /// 4-tuple within a copy and never across copies.
    fn ip(&self, addr: &mut [u8]) {
        let at = match addr.len() {
            4 => 1,
            16 => 13,
            _ => return,
        };
        let [hi, lo] = self.index.to_be_bytes();
        addr[at] ^= hi;
        addr[at + 1] ^= lo;
    }

    fn sniff(&self, s: &mut Sniff) {
        s.fingerprint ^= self.salt;
        if let Some(p) = &mut s.body_print {
            p.hash ^= self.salt;
        }
        for p in &mut s.prefix_prints {
            *p ^= self.salt;
        }
        for e in &mut s.sse {
            e.fingerprint ^= self.salt;
        }
        for h2 in &mut s.h2_streams {
            if let Some(inner) = &mut h2.sniff {
                self.sniff(inner);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use collector::ingest::model::{Direction, SockIo, SseEvent};
    use collector::ingest::record::FileHeader;

    fn io(ts: u64, skaddr: u64, print: u64) -> Event {
        Event {
            ts_ns: ts,
            pid: 7,
            tid: 7,
            cpu: 0,
            comm: "engine".into(),
            body: Some(Body::Io(SockIo {
                sock: Some(Sock {
                    skaddr,
                    saddr: vec![127, 0, 0, 1].into(),
                    sport: 40000,
                    daddr: vec![127, 0, 0, 1].into(),
                    dport: 8000,
                }),
                dir: Direction::Send as i32,
                sniff: Some(Sniff {
                    fingerprint: print,
                    sse: vec![SseEvent {
                        fingerprint: print,
                        kind: 1,
                        ..Default::default()
                    }]
                    .into(),
                    ..Default::default()
                }),
                ..Default::default()
            })),
        }
    }

    #[test]
    fn copies_follow_each_other_in_time_with_their_own_identity() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (input, output) = (dir.path().join("in.tsrec"), dir.path().join("out.tsrec"));
        let mut w = RecordWriter::create(&input, FileHeader::default()).expect("create");
        let skaddr = 0xffff_8881_0000_1000;
        for (ts, print) in [(1_000, 11), (1_500, 12), (3_000, 13)] {
            w.push(io(ts, skaddr, print)).expect("push");
        }
        w.finish(Counters::default(), 3_000).expect("finish");

        let done = replicate(&input, &output, 3, Duration::from_nanos(100)).expect("replicate");
        assert_eq!((done.events, done.span_ns), (9, 2_000));
        let mut r = RecordReader::open(&output).expect("open");
        assert_eq!(r.header.end_monotonic_ns, 3_000 + 2 * 2_100);
        let events = r.read_all().expect("read");
        let times: Vec<u64> = events.iter().map(|e| e.ts_ns).collect();
        assert_eq!(
            times,
            [1_000, 1_500, 3_000, 3_100, 3_600, 5_100, 5_200, 5_700, 7_200],
            "each copy starts span + gap after the one before"
        );
        assert_eq!(events[..3], io_events(&input)[..], "copy 0 is the original");
        let socks: std::collections::HashSet<(u64, std::net::SocketAddr)> = events
            .iter()
            .map(|e| e.sock().map(|s| (s.skaddr, s.src())).expect("sock"))
            .collect();
        assert_eq!(socks.len(), 3, "one socket and address per copy: {socks:?}");
        let prints: std::collections::HashSet<u64> = events
            .iter()
            .filter_map(|e| e.io()?.sniff.as_ref())
            .flat_map(|s| [s.fingerprint, s.sse[0].fingerprint])
            .collect();
        assert_eq!(prints.len(), 9, "fingerprints differ between copies");
        let src = events[3].sock().expect("sock").src();
        assert!(src.ip().is_loopback(), "{src} is still loopback");
    }

    fn io_events(path: &Path) -> Vec<Event> {
        RecordReader::open(path)
            .expect("open")
            .read_all()
            .expect("read")
    }
}
