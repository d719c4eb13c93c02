//! Format 4's socket table: an event's socket written once per file, then by reference
//! or left out (see `SockTable`).

use crate::ingest::fast_hash::FastMap;
use crate::ingest::model::event::Body;
use crate::ingest::model::{Addr, Event, Sock};

/// Format 4: the sockets a file's table holds at most (see `SockTable`).
pub(in crate::ingest::record) const SOCK_SLOTS: u32 = 4096;

/// Format 4: a file's sockets, so that an event's socket seen before is not written
/// again (the 8-byte kernel address and the 4-tuple were 1.7 B of a socket I/O's
/// 12 B after zstd). A socket is written one of three ways:
/// - left out (`None`), on a socket I/O whose socket is the one its process's fd had
///   last (nearly every I/O): the reader takes that one;
/// - `Sock { skaddr: slot }` and nothing else, when the table holds it: a reference;
/// - whole, with `SOCK_WHOLE` before its source address (first sight, or the kernel
///   reused the address for a new connection), or `SOCK_ALONE` for one the table does
///   not keep; an I/O with no socket at all is `SOCK_NONE` alone.
///
/// So a written socket with no source address is always a reference, and every event,
/// an empty or partial socket's included, reads back exactly. Both sides place each
/// socket written whole the same way, so the reader's slots are the writer's without
/// the slot being written: an address keeps its slot (a reused address's new socket
/// replaces the old one), a new address takes the next slot of a ring of `SOCK_SLOTS`,
/// evicting the address that held it. The fds' last slots are forgotten all at once
/// when `FD_KEYS` of them are known, and addresses longer than `MAX_ADDR` are never
/// kept. Memory stays bounded (a few hundred KiB each side) however many connections
/// a file sees; what was evicted or forgotten is written whole or by slot once more.
#[derive(Default)]
pub(in crate::ingest::record) struct SockTable {
    slots: Vec<Sock>,
    slot_of: FastMap<u64, u32>,
    /// The ring's next slot for a new address.
    next: u32,
    /// (pid, fd) -> the slot of its socket in its last I/O.
    slot_of_fd: FastMap<FdKey, u32>,
}

/// A socket I/O's process and fd: what an I/O whose socket is left out is read by.
type FdKey = (u32, i32);

/// Format 4: the (pid, fd) pairs whose last socket `SockTable` keeps at most.
pub(in crate::ingest::record) const FD_KEYS: usize = 4096;
/// Format 4: leads the source address of a socket written whole (see `SockTable`).
const SOCK_WHOLE: u8 = 0;
/// Format 4: the whole source address of a socket that stands for an I/O's `None`.
const SOCK_NONE: u8 = 1;
/// Format 4: leads the source address of a socket written whole and kept out of the
/// table, one with an address longer than `MAX_ADDR` (never from the kernel).
const SOCK_ALONE: u8 = 2;
/// The longest address the table keeps (IPv6): with `SOCK_SLOTS` it bounds a reader's
/// memory whatever a file holds.
const MAX_ADDR: usize = 16;

impl SockTable {
    /// Writing: `sock` left out, a reference or whole (see the type's note); `fd` is the
    /// I/O's (pid, fd), None for the other kinds.
    pub(super) fn pack(&mut self, sock: &mut Option<Sock>, fd: Option<FdKey>) {
        let Some(s) = sock else {
            if fd.is_some() {
                *sock = Some(Sock {
                    saddr: Addr::from_slice(&[SOCK_NONE]),
                    ..Sock::default()
                });
            }
            return;
        };
        if s.saddr.len() > MAX_ADDR || s.daddr.len() > MAX_ADDR {
            s.saddr.insert(0, SOCK_ALONE);
            return;
        }
        let held = self.slot_of.get(&s.skaddr).copied();
        let slot = match held {
            Some(slot) if self.slots[slot as usize] == *s => {
                let implied = fd.is_some_and(|k| self.slot_of_fd.get(&k) == Some(&slot));
                if implied {
                    // Left out; its fd's slot already (as the reader's `unpack` skips).
                    *sock = None;
                    return;
                }
                *sock = Some(Sock {
                    skaddr: u64::from(slot),
                    ..Sock::default()
                });
                slot
            }
            _ => {
                let slot = self.place(s.clone());
                s.saddr.insert(0, SOCK_WHOLE);
                slot
            }
        };
        if let Some(k) = fd {
            self.remember(k, slot);
        }
    }

    /// Reading: undoes `pack`.
    pub(super) fn unpack(
        &mut self,
        sock: &mut Option<Sock>,
        fd: Option<FdKey>,
    ) -> Result<(), String> {
        let slot = match sock {
            None => {
                let Some(k) = fd else { return Ok(()) };
                let slot = *self
                    .slot_of_fd
                    .get(&k)
                    .ok_or_else(|| format!("no socket before on fd {} of pid {}", k.1, k.0))?;
                *sock = Some(self.slots[slot as usize].clone());
                // Its fd's slot already: nothing to remember (an insert per I/O saved).
                return Ok(());
            }
            Some(s) => match s.saddr.first() {
                Some(&SOCK_WHOLE) => {
                    s.saddr.remove(0);
                    let longest = s.saddr.len().max(s.daddr.len());
                    if longest > MAX_ADDR {
                        return Err(format!("a socket address of {longest} bytes in the table"));
                    }
                    self.place(s.clone())
                }
                Some(&SOCK_ALONE) => {
                    s.saddr.remove(0);
                    return Ok(());
                }
                Some(&SOCK_NONE) if s.saddr.len() == 1 && fd.is_some() => {
                    *sock = None;
                    return Ok(());
                }
                Some(b) => return Err(format!("a socket written whole marked {b}")),
                None if s.sport != 0 || !s.daddr.is_empty() || s.dport != 0 => {
                    return Err("a socket reference with an address".into())
                }
                None => {
                    let slot = s.skaddr;
                    let held = usize::try_from(slot).ok().and_then(|i| self.slots.get(i));
                    *s = held
                        .ok_or_else(|| format!("a reference to socket slot {slot}, never filled"))?
                        .clone();
                    slot as u32
                }
            },
        };
        if let Some(k) = fd {
            self.remember(k, slot);
        }
        Ok(())
    }

    fn place(&mut self, sock: Sock) -> u32 {
        let slot = match self.slot_of.get(&sock.skaddr) {
            Some(&slot) => slot,
            None => {
                let slot = self.next;
                self.next = (self.next + 1) % SOCK_SLOTS;
                if let Some(old) = self.slots.get(slot as usize) {
                    self.slot_of.remove(&old.skaddr);
                }
                self.slot_of.insert(sock.skaddr, slot);
                slot
            }
        };
        match self.slots.get_mut(slot as usize) {
            Some(held) => *held = sock,
            None => self.slots.push(sock),
        }
        slot
    }

    fn remember(&mut self, fd: FdKey, slot: u32) {
        if self.slot_of_fd.len() >= FD_KEYS && !self.slot_of_fd.contains_key(&fd) {
            self.slot_of_fd.clear();
        }
        self.slot_of_fd.insert(fd, slot);
    }
}

/// The socket of an event of a kind that has one, and for a socket I/O its (pid, fd).
pub(super) fn sock_of(e: &mut Event) -> Option<(&mut Option<Sock>, Option<FdKey>)> {
    let pid = e.pid;
    match e.body.as_mut()? {
        Body::Io(s) => Some((&mut s.sock, Some((pid, s.fd)))),
        Body::State(s) => Some((&mut s.sock, None)),
        Body::Accept(s) => Some((&mut s.sock, None)),
        Body::Retransmit(s) => Some((&mut s.sock, None)),
        Body::Cuda(_) | Body::Nvml(_) | Body::Gpu(_) | Body::Ring(_) => None,
    }
}
