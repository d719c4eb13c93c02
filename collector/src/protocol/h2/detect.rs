//! Telling an HTTP/2 byte stream from HTTP/1, TLS and garbage at the start of an
//! I/O: the client preface, a server's first SETTINGS, or (joined mid-connection)
//! a run of plausible frame headers.

use super::{FrameHead, DEFAULT_MAX_FRAME, FRAME_HEADER, PREFACE, SETTINGS};

/// Whether `b` could open an HTTP/2 client stream: at least "PRI " of the preface.
pub fn starts_client_preface(b: &[u8]) -> bool {
    let n = b.len().min(PREFACE.len());
    n >= 4 && b[..n] == PREFACE[..n]
}

/// Whether `b` is only "P", "PR" or "PRI": an HTTP/1 method or the preface, too short to tell.
pub fn too_short_for_client_preface(b: &[u8]) -> bool {
    !b.is_empty() && b.len() < 4 && PREFACE.starts_with(b)
}

/// Whether `b`, shorter than a frame header, could begin a server's first SETTINGS.
pub fn too_short_for_server_preface(b: &[u8]) -> bool {
    // Length under 0x200 (at most 64 settings), type 4, no flags, stream 0.
    let template: [fn(u8) -> bool; FRAME_HEADER] = [
        |x| x == 0,
        |x| x <= 1,
        |_| true,
        |x| x == SETTINGS,
        |x| x == 0,
        |x| x == 0,
        |x| x == 0,
        |x| x == 0,
        |x| x == 0,
    ];
    !b.is_empty() && b.len() < FRAME_HEADER && b.iter().zip(template).all(|(x, ok)| ok(*x))
}

/// Whether `b` starts with a server's first frame: a SETTINGS (not an ack) on stream 0.
pub fn starts_server_preface(b: &[u8]) -> bool {
    FrameHead::read(b)
        .is_some_and(|h| h.kind == SETTINGS && h.flags == 0 && h.plausible() && h.len <= 6 * 64)
}

/// Whether `b`, the captured start of an I/O, reads as a run of plausible frame
/// headers that ends exactly at its end, or past it only when bytes went
/// uncaptured (`cut`) and the frame is of a common size (a lone header of random
/// bytes would pass otherwise). How a stream joined mid-connection (or lost) is found.
pub fn looks_like_frames(b: &[u8], cut: bool) -> bool {
    let mut at = 0usize;
    let mut last = 0;
    while at < b.len() {
        match FrameHead::read(&b[at..]) {
            Some(h) if h.plausible() => {
                at += FRAME_HEADER + h.len as usize;
                last = h.len;
            }
            _ => return false, // implausible, or a header cut short
        }
    }
    at > 0 && (at == b.len() || (cut && last <= DEFAULT_MAX_FRAME))
}
