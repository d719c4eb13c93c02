//! The record file reader (`ingest::record`): a file of any bytes opened and read to
//! its end, batch by batch. The file lives in a memfd, opened by its /proc path as
//! `tokenscope report` opens a recording.
//!
//! Mode byte odd: the rest is the whole file. Even: the rest is a header length
//! (u16, little-endian, free to lie), the header's bytes, then the frames; the
//! magic and the 4 KiB header region are added around them, so that mutations go
//! to what is parsed rather than to the region's padding.
#![no_main]

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd};
use std::path::PathBuf;

use collector::ingest::record::{RecordReader, FORMAT_VERSION, HEADER_REGION, MAGIC};
use libfuzzer_sys::fuzz_target;

/// The file's bytes for an input (see the module's doc).
fn file_bytes(data: &[u8]) -> Vec<u8> {
    let Some((&mode, rest)) = data.split_first() else {
        return Vec::new();
    };
    if mode & 1 == 1 || rest.len() < 2 {
        return rest.to_vec();
    }
    let declared = u16::from_le_bytes([rest[0], rest[1]]);
    let rest = &rest[2..];
    let room = HEADER_REGION as usize - MAGIC.len() - 4;
    let (header, frames) = rest.split_at(usize::from(declared).min(rest.len()).min(room));
    let mut file = Vec::with_capacity(HEADER_REGION as usize + frames.len());
    file.extend_from_slice(MAGIC);
    file.extend_from_slice(&u32::from(declared).to_le_bytes());
    file.extend_from_slice(header);
    file.resize(HEADER_REGION as usize, 0);
    file.extend_from_slice(frames);
    file
}

fuzz_target!(|data: &[u8]| {
    let bytes = file_bytes(data);
    // SAFETY: a static NUL-terminated name; memfd_create has no other preconditions.
    let fd = unsafe { libc::memfd_create(c"tokenscope-fuzz-record".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: `fd` was just created and nothing else owns it.
    let mut memfd = unsafe { File::from_raw_fd(fd) };
    memfd.write_all(&bytes).expect("writing a memfd");
    let path = PathBuf::from(format!("/proc/self/fd/{}", memfd.as_raw_fd()));
    let Ok(mut reader) = RecordReader::open(&path) else {
        return;
    };
    assert!(
        (1..=FORMAT_VERSION).contains(&reader.header.format_version),
        "format version {} opened",
        reader.header.format_version
    );
    let mut events = 0usize;
    while let Ok(Some(batch)) = reader.next_batch() {
        events += batch.len();
    }
    // In plain frames (format 1) an event takes at least two bytes of the file (its tag
    // and length). Compressed frames may expand many times over (each frame's batch is
    // capped at MAX_FRAME, and libFuzzer's RSS limit catches a blow-up past it).
    if reader.header.format_version == 1 {
        assert!(
            events <= bytes.len(),
            "{events} events from {} bytes",
            bytes.len()
        );
    }
    if let Some(at) = reader.cut_off_at {
        assert!(at <= bytes.len() as u64, "cut off at {at}, past the end");
    }
});
