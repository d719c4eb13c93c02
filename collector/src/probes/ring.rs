//! The consumer side of the kernel's BPF ring buffer, with its data pages mapped once.
//!
//! The kernel lays the ring out as a consumer page (the reader's position, writable), a
//! producer page (the writers' position) and the data pages; each record is an 8-byte
//! header (length, busy and discard bits) and its bytes, 8-byte aligned. libbpf and aya
//! map the data twice in a row so that a record that wraps past the end reads as one
//! slice; the kernel maps every page of that mapping at once, so an 8 MiB ring showed
//! as 16 MiB of the profiler's resident memory for 8 MiB of physical pages. Here the
//! data is mapped once and the rare record that wraps is copied into a scratch buffer.

use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use aya::maps::MapData;

/// `BPF_RINGBUF_BUSY_BIT`: reserved, not committed yet.
const BUSY: u32 = 1 << 31;
/// `BPF_RINGBUF_DISCARD_BIT`: committed as discarded (skipped).
const DISCARD: u32 = 1 << 30;
/// `BPF_RINGBUF_HDR_SZ`
const HEADER: usize = 8;

/// A ring buffer map, read in place.
pub(crate) struct Ring {
    map: MapData,
    consumer: Mapping,
    /// The producer page, then the data pages once.
    producer: Mapping,
    page: usize,
    /// What `consumer` holds, kept here so that it is read once.
    pos: u64,
    /// A record that wraps past the end of the data, made whole.
    scratch: Vec<u8>,
}

impl Ring {
    /// Maps the ring `map` of `size` bytes (its `max_entries`: a power of two, whole pages).
    pub(crate) fn new(map: MapData, size: u32) -> std::io::Result<Ring> {
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
            .map_err(|_| std::io::Error::last_os_error())?;
        let size = size as usize;
        if !size.is_power_of_two() || !size.is_multiple_of(page) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("ring buffer of {size} bytes: not a power of two of whole pages"),
            ));
        }
        let fd = map.fd().as_fd().as_raw_fd();
        let consumer = Mapping::new(fd, page, libc::PROT_READ | libc::PROT_WRITE, 0)?;
        let producer = Mapping::new(fd, page + size, libc::PROT_READ, page)?;
        let mut ring = Ring {
            map,
            consumer,
            producer,
            page,
            pos: 0,
            scratch: Vec::new(),
        };
        ring.pos = ring.consumer.position().load(Ordering::Acquire);
        Ok(ring)
    }

    pub(crate) fn fd(&self) -> RawFd {
        self.map.fd().as_fd().as_raw_fd()
    }

    /// Hands every committed record to `f`, in order, and gives its space back to the
    /// writers once `f` returned; stops at the first record still being written.
    /// Returns how many records `f` saw.
    pub(crate) fn drain(&mut self, f: impl FnMut(&[u8])) -> u64 {
        // SAFETY: the producer mapping is the producer page followed by the data
        // pages, mapped for as long as `self`.
        let view = unsafe {
            View::new(
                self.producer.ptr.cast_const(),
                self.producer.ptr.add(self.page).cast_const(),
                self.producer.len - self.page,
            )
        };
        let consumer = self.consumer.position();
        let mut pos = self.pos;
        let n = view.read(&mut pos, &mut self.scratch, f, |p| {
            consumer.store(p, Ordering::Release)
        });
        self.pos = pos;
        n
    }
}

/// The producer position and the data pages of a ring, wherever they are mapped.
struct View {
    producer: *const u8,
    data: *const u8,
    mask: u64,
}

impl View {
    /// # Safety
    /// `producer` points to 8 readable bytes (the producer position), `data` to `size`
    /// readable bytes laid out as the kernel's ring data; both stay valid while the
    /// view is used. `size` is a power of two.
    unsafe fn new(producer: *const u8, data: *const u8, size: usize) -> View {
        View {
            producer,
            data,
            mask: size as u64 - 1,
        }
    }

    fn producer_pos(&self) -> u64 {
        // SAFETY: `new`'s contract; the kernel stores it with release semantics.
        unsafe { AtomicU64::from_ptr(self.producer.cast_mut().cast()) }.load(Ordering::Acquire)
    }

    /// The header word of the record at `pos`.
    fn header(&self, pos: u64) -> u32 {
        // SAFETY: headers are 8-aligned inside the data, which is whole pages.
        unsafe { AtomicU32::from_ptr(self.data.add((pos & self.mask) as usize).cast_mut().cast()) }
            .load(Ordering::Acquire)
    }

    /// The `len` bytes from data offset `at` (masked), copied into `scratch` when they
    /// wrap past the end.
    fn bytes<'a>(&'a self, at: u64, len: usize, scratch: &'a mut Vec<u8>) -> &'a [u8] {
        let size = (self.mask + 1) as usize;
        let start = (at & self.mask) as usize;
        let first = len.min(size - start);
        // SAFETY: `start + first <= size` and `len - first <= size` bytes of the data
        // (a record is never larger than the ring); committed, so no writer touches
        // them until the consumer position passes them.
        unsafe {
            let head = std::slice::from_raw_parts(self.data.add(start), first);
            if first == len {
                return head;
            }
            let tail = std::slice::from_raw_parts(self.data, len - first);
            scratch.clear();
            scratch.extend_from_slice(head);
            scratch.extend_from_slice(tail);
        }
        scratch
    }

    /// Reads records from `*pos` until the writers' position or a busy record, handing
    /// each to `f` and then the position after it to `release`.
    fn read(
        &self,
        pos: &mut u64,
        scratch: &mut Vec<u8>,
        mut f: impl FnMut(&[u8]),
        mut release: impl FnMut(u64),
    ) -> u64 {
        let mut n = 0;
        loop {
            let producer = self.producer_pos();
            if *pos >= producer {
                return n;
            }
            while *pos < producer {
                let header = self.header(*pos);
                if header & BUSY != 0 {
                    return n;
                }
                let len = (header & !(BUSY | DISCARD)) as usize;
                if HEADER + len > (self.mask + 1) as usize {
                    // The kernel never commits a record larger than its ring: not
                    // read past the mapping if it ever did.
                    return n;
                }
                if header & DISCARD == 0 {
                    f(self.bytes(*pos + HEADER as u64, len, scratch));
                    n += 1;
                }
                *pos += (HEADER + len).next_multiple_of(8) as u64;
                release(*pos);
            }
        }
    }
}

/// One shared mapping of the ring's file descriptor; unmapped on drop.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

impl Mapping {
    fn new(fd: RawFd, len: usize, prot: libc::c_int, offset: usize) -> std::io::Result<Mapping> {
        let offset = libc::off_t::try_from(offset)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        // SAFETY: a fresh shared mapping of a file descriptor; checked below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                fd,
                offset,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mapping {
            ptr: ptr.cast(),
            len,
        })
    }
}

impl Mapping {
    /// The position at the start of a producer or consumer page.
    fn position(&self) -> &AtomicU64 {
        // SAFETY: the page is mapped for as long as `self` and page-aligned; its first
        // 8 bytes are the position (the consumer's written only by this reader).
        unsafe { AtomicU64::from_ptr(self.ptr.cast()) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: mapped in `new` with this length, and not used after this.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

// SAFETY: the mappings are owned by the ring and only read (or the consumer position
// written) through `&mut self` or atomics.
unsafe impl Send for Ring {}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ring of `SIZE` bytes in ordinary memory, written as the kernel writes it.
    struct Fake {
        producer: Box<u64>,
        data: Vec<u64>,
        pos: u64,
    }

    const SIZE: usize = 256;

    impl Fake {
        fn new(start: u64) -> Fake {
            Fake {
                producer: Box::new(start),
                data: vec![0; SIZE / 8],
                pos: start,
            }
        }

        fn bytes(&mut self) -> &mut [u8] {
            // SAFETY: the u64 vector is SIZE bytes, viewed as bytes.
            unsafe { std::slice::from_raw_parts_mut(self.data.as_mut_ptr().cast(), SIZE) }
        }

        /// A record of `body` with header flags `flags`, committed unless busy.
        fn write(&mut self, body: &[u8], flags: u32) {
            let at = (self.pos as usize) % SIZE;
            let header = body.len() as u32 | flags;
            self.bytes()[at..at + 4].copy_from_slice(&header.to_ne_bytes());
            for (i, b) in body.iter().enumerate() {
                let k = (at + HEADER + i) % SIZE;
                self.bytes()[k] = *b;
            }
            self.pos += (HEADER + body.len()).next_multiple_of(8) as u64;
            *self.producer = self.pos;
        }

        fn view(&self) -> View {
            // SAFETY: both live as long as `self`, which the tests keep.
            unsafe {
                View::new(
                    (&*self.producer as *const u64).cast(),
                    self.data.as_ptr().cast(),
                    SIZE,
                )
            }
        }
    }

    fn read_all(fake: &Fake, pos: &mut u64) -> (Vec<Vec<u8>>, Vec<u64>) {
        let mut got = Vec::new();
        let mut released = Vec::new();
        let mut scratch = Vec::new();
        fake.view().read(
            pos,
            &mut scratch,
            |b| got.push(b.to_vec()),
            |p| released.push(p),
        );
        (got, released)
    }

    #[test]
    fn records_come_whole_in_order_and_discarded_ones_are_skipped() {
        let mut fake = Fake::new(0);
        fake.write(b"first", 0);
        fake.write(b"gone", DISCARD);
        fake.write(&[7; 20], 0);
        let mut pos = 0;
        let (got, released) = read_all(&fake, &mut pos);
        assert_eq!(got, [b"first".to_vec(), vec![7; 20]]);
        // Each record's space goes back as soon as it was read: 16, 16 and 32 bytes.
        assert_eq!(released, [16, 32, 64]);
        assert_eq!(pos, 64);
    }

    #[test]
    fn a_record_that_wraps_past_the_end_is_made_whole() {
        // Start 24 bytes before the end: the header fits, its 40 bytes wrap.
        let start = (SIZE - 24) as u64 + 3 * SIZE as u64;
        let mut fake = Fake::new(start);
        let body: Vec<u8> = (0..40).collect();
        fake.write(&body, 0);
        // And one whose header is the last 8 bytes: its body starts at 0.
        let mut fake2 = Fake::new((SIZE - 8) as u64);
        fake2.write(b"after the header", 0);
        let mut pos = start;
        assert_eq!(read_all(&fake, &mut pos).0, [body]);
        let mut pos2 = (SIZE - 8) as u64;
        assert_eq!(
            read_all(&fake2, &mut pos2).0,
            [b"after the header".to_vec()]
        );
    }

    #[test]
    fn a_length_larger_than_the_ring_is_not_read() {
        let mut fake = Fake::new(0);
        fake.write(b"ok", 0);
        let at = fake.pos as usize;
        fake.bytes()[at..at + 4].copy_from_slice(&(SIZE as u32).to_ne_bytes());
        *fake.producer += 8;
        let mut pos = 0;
        assert_eq!(read_all(&fake, &mut pos).0, [b"ok".to_vec()]);
        assert_eq!(pos, 16);
    }

    #[test]
    fn reading_stops_at_a_record_still_being_written() {
        let mut fake = Fake::new(0);
        fake.write(b"done", 0);
        fake.write(b"busy", BUSY);
        fake.write(b"later", 0);
        let mut pos = 0;
        let (got, released) = read_all(&fake, &mut pos);
        assert_eq!(got, [b"done".to_vec()]);
        assert_eq!(released, [16]);
        assert_eq!(pos, 16, "the busy record is read again next time");
    }
}
