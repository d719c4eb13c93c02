//! The recorder's user-space path on captured ring records, for instruction counts
//! (callgrind) that live timings on a shared VM cannot give. A developer tool, not
//! part of the profiler.
//!
//! ```text
//! # as root, while a load runs: the raw ring records of 20 s of ports 8000 and 8080
//! cargo run --release -p tokenscope-collector --example ring_replay -- capture /tmp/ring.raw 20 8000 8080
//! # decode and write them as `record` does (a frame per drain)
//! valgrind --tool=callgrind target/release/examples/ring_replay replay /tmp/ring.raw /tmp/out.tsr
//! ```
//!
//! The capture file: each record as a little-endian u32 length and its bytes; a zero
//! length marks the end of a drain. Unlike a recording, it holds the payloads as the
//! probes copied them (prompts, completions, headers with their credentials): it is
//! created readable by its owner only; capture test loads, never production traffic.

#![allow(unused_crate_dependencies)] // an example sees every dependency

use std::io::{BufWriter, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::time::{Duration, Instant};

use collector::ingest::record::{Counters, FileHeader, RecordWriter};
use collector::probes::{ProbeConfig, Probes};
use collector::protocol::Decoder;

/// `record`'s drain interval; it writes a frame (flushes) at the end of each drain.
const DRAIN: Duration = collector::record::DRAIN_TO_FILE;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("capture") if args.len() >= 3 => capture(&args[1], &args[2], &args[3..]),
        Some("replay") if args.len() == 3 => replay(&args[1], &args[2]),
        _ => Err("usage: ring_replay capture OUT SECONDS [PORT...] | replay IN OUT.tsr".into()),
    };
    if let Err(e) = result {
        eprintln!("ring_replay: {e}");
        std::process::exit(1);
    }
}

fn capture(out: &str, seconds: &str, ports: &[String]) -> Result<(), String> {
    let seconds: u64 = seconds
        .parse()
        .map_err(|e| format!("seconds {seconds}: {e}"))?;
    let ports = ports
        .iter()
        .map(|p| p.parse().map_err(|e| format!("port {p}: {e}")))
        .collect::<Result<Vec<u16>, String>>()?;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(out)
        .map_err(|e| format!("{out}: {e}"))?;
    let mut file = BufWriter::new(file);
    let mut probes = Probes::load(&ProbeConfig {
        ports,
        ..ProbeConfig::default()
    })
    .map_err(|e| e.to_string())?;
    let started = Instant::now();
    let (mut records, mut failed) = (0u64, None);
    while started.elapsed() < Duration::from_secs(seconds) && failed.is_none() {
        probes.wait(DRAIN);
        records += probes.drain(|raw| {
            let written = file
                .write_all(&(raw.len() as u32).to_le_bytes())
                .and_then(|()| file.write_all(raw));
            if let Err(e) = written {
                failed.get_or_insert(e);
            }
        });
        if let Err(e) = file.write_all(&0u32.to_le_bytes()) {
            failed.get_or_insert(e);
        }
    }
    if let Some(e) = failed {
        return Err(format!("{out}: {e}"));
    }
    file.flush().map_err(|e| format!("{out}: {e}"))?;
    eprintln!("ring_replay: {records} records in {seconds} s to {out}");
    Ok(())
}

fn replay(input: &str, out: &str) -> Result<(), String> {
    let mut bytes = Vec::new();
    std::fs::File::open(input)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(|e| format!("{input}: {e}"))?;
    let mut writer =
        RecordWriter::create(out.as_ref(), FileHeader::default()).map_err(|e| e.to_string())?;
    let mut decoder = Decoder::new();
    let (mut records, mut errors, mut drains) = (0u64, 0u64, 0u32);
    let mut rest = bytes.as_slice();
    while let Some((len, tail)) = rest.split_first_chunk::<4>() {
        let len = u32::from_le_bytes(*len) as usize;
        let Some((raw, tail)) = tail.split_at_checked(len) else {
            return Err(format!("{input}: a record cut short"));
        };
        rest = tail;
        if len == 0 {
            drains += 1;
            writer.flush().map_err(|e| e.to_string())?;
            continue;
        }
        records += 1;
        match decoder.decode(raw) {
            Ok(event) => writer.push(event).map_err(|e| e.to_string())?,
            Err(_) => errors += 1,
        }
    }
    let header = writer
        .finish(Counters::default(), 0)
        .map_err(|e| e.to_string())?;
    let written = header.counters.map_or(0, |c| c.written);
    eprintln!(
        "ring_replay: {records} records in {drains} drains ({errors} not decoded), {written} events written to {out}"
    );
    Ok(())
}
