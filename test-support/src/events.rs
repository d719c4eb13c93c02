//! Reading a recording: its events, the I/O bytes and state changes of one socket.

use std::path::Path;

use collector::ingest::model::{event::Body, Direction, Event, Sock};
use collector::ingest::record::{FileHeader, RecordReader};

pub fn read_recording(path: &Path) -> (FileHeader, Vec<Event>) {
    let mut r = RecordReader::open(path).unwrap_or_else(|e| panic!("recording unreadable: {e}"));
    let events = r
        .read_all()
        .unwrap_or_else(|e| panic!("recording events unreadable: {e}"));
    (r.header, events)
}

/// Sum of I/O bytes in `dir` by `pid` on sockets whose local port is `local_port`.
pub fn io_bytes(events: &[Event], pid: u32, dir: Direction, local_port: u16) -> u64 {
    io_events(events, pid, dir, local_port)
        .map(|(_, io_bytes)| io_bytes)
        .sum()
}

pub fn io_events(
    events: &[Event],
    pid: u32,
    dir: Direction,
    local_port: u16,
) -> impl Iterator<Item = (&Event, u64)> {
    events.iter().filter_map(move |e| {
        let io = e.io()?;
        let sock = io.sock.as_ref()?;
        (e.pid == pid && io.dir() == dir && sock.sport == u32::from(local_port))
            .then_some((e, io.bytes))
    })
}

/// State transitions `(old, new)` seen on sockets with this local and remote port.
pub fn transitions(events: &[Event], sport: u16, dport: u16) -> Vec<(String, String, u32)> {
    events
        .iter()
        .filter_map(|e| match &e.body {
            Some(Body::State(s)) if matches_ports(s.sock.as_ref()?, sport, dport) => Some((
                s.old().label().to_string(),
                s.new().label().to_string(),
                e.pid,
            )),
            _ => None,
        })
        .collect()
}

fn matches_ports(sock: &Sock, sport: u16, dport: u16) -> bool {
    sock.sport == u32::from(sport) && sock.dport == u32::from(dport)
}
