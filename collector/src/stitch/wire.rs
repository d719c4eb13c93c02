//! The two ends of one TCP connection read the same byte stream: the byte a server
//! wrote at offset O is the byte its client read in the read that covers O. With
//! every socket I/O of both ends recorded from the connection's start, a time at one
//! end maps to the time the other end sent or received the same bytes, whatever the
//! bytes were (TLS records of a client whose TLS library gives no plaintext).

use crate::ingest::model::Direction;

use super::Connection;

/// Socket I/Os of one direction at one end: (time, stream offset after it).
#[derive(Clone, Debug, Default)]
pub struct Wire {
    pub sent: Vec<(u64, u64)>,
    pub recv: Vec<(u64, u64)>,
}

impl Wire {
    pub fn push(&mut self, ts_ns: u64, dir: Direction, end: u64) {
        match dir {
            Direction::Send => self.sent.push((ts_ns, end)),
            Direction::Recv => self.recv.push((ts_ns, end)),
            Direction::Unknown => {}
        }
    }
}

/// Both ends saw the connection open, so their offsets count from the same byte.
fn from_start(c: &Connection) -> bool {
    c.connect_ns.is_some() || c.established_ns.is_some() || c.accept_ns.is_some()
}

/// When `peer` read what `writer` wrote starting at `t` (the first write at or after
/// `t`, e.g. the one inside an SSL_write that began at `t`), or None without a
/// complete byte history at both ends.
pub fn peer_read_ns(writer: &Connection, peer: &Connection, t: u64) -> Option<(u64, usize)> {
    if !from_start(writer) || !from_start(peer) {
        return None;
    }
    let w = writer.wire.sent.partition_point(|&(ts, _)| ts < t);
    let (_, end) = *writer.wire.sent.get(w)?;
    let r = peer.wire.recv.partition_point(|&(_, e)| e < end);
    peer.wire.recv.get(r).map(|&(ts, _)| (ts, r))
}

/// When `peer` sent what `reader` had read by `t` (the last read at or before `t`,
/// e.g. the one inside an SSL_read that returned at `t`).
pub fn peer_send_ns(reader: &Connection, peer: &Connection, t: u64) -> Option<u64> {
    if !from_start(reader) || !from_start(peer) {
        return None;
    }
    let r = reader.wire.recv.partition_point(|&(ts, _)| ts <= t);
    let (_, end) = *reader.wire.recv.get(r.checked_sub(1)?)?;
    let s = peer.wire.sent.partition_point(|&(_, e)| e < end);
    peer.wire.sent.get(s).map(|&(ts, _)| ts)
}
