//! A socket address's bytes, kept inline: 4 for IPv4, 16 for IPv6, and up to
//! `INLINE` (a record file's socket table leads an address with a marker byte).
//! Longer ones come only from files written by hand or damaged, and live on the heap
//! so they still read back exactly. Unlike a `SmallVec`, cloning an inline address is
//! a copy of its bytes with no allocator check: a recording's I/Os clone their socket
//! from the file's table once each, and that clone was 3% of a replay's instructions.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::{Deref, DerefMut};

/// The longest address kept inline: an IPv6 address and a marker byte fit with room
/// to spare, and `Addr` stays 24 bytes.
const INLINE: usize = 22;

pub enum Addr {
    /// `bytes[..len]`; `len <= INLINE`.
    Inline { len: u8, bytes: [u8; INLINE] },
    /// Longer than `INLINE` (never from the kernel).
    Long(Box<[u8]>),
}

impl Addr {
    pub fn from_slice(b: &[u8]) -> Addr {
        if b.len() > INLINE {
            return Addr::Long(b.into());
        }
        let mut bytes = [0; INLINE];
        bytes[..b.len()].copy_from_slice(b);
        Addr::Inline {
            len: b.len() as u8,
            bytes,
        }
    }

    /// `byte` at `index`, the bytes from there on after it (panics past the end, as
    /// `Vec::insert` does).
    pub fn insert(&mut self, index: usize, byte: u8) {
        let mut v = self.to_vec();
        v.insert(index, byte);
        *self = Addr::from_slice(&v);
    }

    /// Takes out the byte at `index` (panics past the end, as `Vec::remove` does).
    pub fn remove(&mut self, index: usize) -> u8 {
        let mut v = self.to_vec();
        let byte = v.remove(index);
        *self = Addr::from_slice(&v);
        byte
    }

    /// `len` bytes, zero: to be filled through `DerefMut`.
    pub fn zeroed(len: usize) -> Addr {
        if len > INLINE {
            return Addr::Long(vec![0; len].into());
        }
        Addr::Inline {
            len: len as u8,
            bytes: [0; INLINE],
        }
    }
}

impl Clone for Addr {
    /// The inline case a copy; the heap's out of line (derived, the two made every
    /// socket's clone a call with a register spill of 57 instructions).
    #[inline]
    fn clone(&self) -> Addr {
        match self {
            Addr::Inline { len, bytes } => Addr::Inline {
                len: *len,
                bytes: *bytes,
            },
            Addr::Long(b) => long(b),
        }
    }
}

#[cold]
#[inline(never)]
fn long(b: &[u8]) -> Addr {
    Addr::Long(b.into())
}

impl Default for Addr {
    fn default() -> Addr {
        Addr::Inline {
            len: 0,
            bytes: [0; INLINE],
        }
    }
}

impl Deref for Addr {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Addr::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Addr::Long(b) => b,
        }
    }
}

impl DerefMut for Addr {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            Addr::Inline { len, bytes } => &mut bytes[..usize::from(*len)],
            Addr::Long(b) => b,
        }
    }
}

impl From<Vec<u8>> for Addr {
    fn from(v: Vec<u8>) -> Addr {
        Addr::from_slice(&v)
    }
}

impl PartialEq for Addr {
    fn eq(&self, other: &Addr) -> bool {
        **self == **other
    }
}

impl Eq for Addr {}

impl Hash for Addr {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (**self).hash(state)
    }
}

impl fmt::Debug for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        (**self).fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_any_length_and_edits_as_a_vec_would() {
        for n in [0, 1, 4, 16, INLINE - 1, INLINE, INLINE + 1, 40] {
            let want: Vec<u8> = (0..n as u8).map(|b| b.wrapping_mul(7) + 1).collect();
            let mut a = Addr::from_slice(&want);
            assert_eq!(&*a, &want[..], "{n} bytes read back");
            assert_eq!(a.clone(), a, "a clone is equal");
            assert_eq!(
                matches!(a, Addr::Long(_)),
                n > INLINE,
                "{n} bytes inline or not"
            );
            let mut v = want.clone();
            a.insert(0, 0xee);
            v.insert(0, 0xee);
            assert_eq!(&*a, &v[..], "{n} bytes with one inserted");
            assert_eq!(a.remove(0), 0xee);
            assert_eq!(&*a, &want[..], "{n} bytes with it taken out again");
            assert_eq!(Addr::from(want.clone()), a);
            assert_eq!(
                format!("{a:?}"),
                format!("{want:?}"),
                "printed as its bytes"
            );
            let mut z = Addr::zeroed(n);
            z.copy_from_slice(&want);
            assert_eq!(z, a, "zeroed and filled");
        }
        assert_eq!(std::mem::size_of::<Addr>(), 24);
    }

    #[test]
    fn equal_bytes_hash_alike() {
        use std::collections::hash_map::DefaultHasher;
        let h = |a: &Addr| {
            let mut s = DefaultHasher::new();
            a.hash(&mut s);
            s.finish()
        };
        let a = Addr::from_slice(&[10, 0, 0, 1]);
        let b: Addr = vec![10, 0, 0, 1].into();
        assert_eq!(h(&a), h(&b));
        assert_ne!(a, Addr::from_slice(&[10, 0, 0, 2]));
    }
}
