//! JSON whose objects list their keys in sorted order, written straight from serde:
//! the bytes `serde_json::to_vec(&serde_json::to_value(x)?)` gives (a `Value`'s objects
//! are BTreeMaps), without building the `Value` (a String per key and a node per value,
//! then freed: ~180k instructions a request summary, a fifth of `report`'s main
//! thread). Each object is written as its fields come, then its entries are put in key
//! order in place. An `edit` sees each object's entries before that, with the keys
//! above it, and may drop some or add others.

use std::ops::Range;

use compact_str::CompactString;
use serde::ser::{self, Serialize};
use serde_json::Error;

/// `value` as JSON with sorted keys, each object passed to `edit` before it is closed.
pub(super) fn to_vec<T, E>(value: &T, edit: E) -> Result<Vec<u8>, Error>
where
    T: Serialize + ?Sized,
    E: FnMut(&mut Object) -> Result<(), Error>,
{
    let mut w = Writer {
        out: Vec::with_capacity(2048),
        path: Vec::new(),
        open: Vec::new(),
        spare: Vec::new(),
        scratch: Vec::new(),
        edit,
    };
    value.serialize(&mut w)?;
    Ok(w.out)
}

/// A struct's field name, or a map's key.
enum Key {
    Field(&'static str),
    Text(CompactString),
}

impl Key {
    fn head(&self) -> u64 {
        let k = self.as_str().as_bytes();
        let mut head = [0; 8];
        let n = k.len().min(8);
        head[..n].copy_from_slice(&k[..n]);
        u64::from_be_bytes(head)
    }

    fn as_str(&self) -> &str {
        match self {
            Key::Field(k) => k,
            Key::Text(k) => k,
        }
    }
}

struct Entry {
    key: Key,
    /// The key's first 8 bytes, big endian: its order, unless they are equal.
    head: u64,
    /// Its value's bytes in the writer's output.
    value: Range<usize>,
}

/// An object about to be closed: the keys above it (arrays not counted) and its entries.
pub(super) struct Object<'a> {
    path: &'a [Key],
    entries: &'a mut Vec<Entry>,
    out: &'a mut Vec<u8>,
}

impl Object<'_> {
    /// Whether it is the value of `key` in an object at the top (or an element of an
    /// array there).
    pub(super) fn under(&self, key: &str) -> bool {
        matches!(self.path, [k] if k.as_str() == key)
    }

    /// Drops the entries `keep` says no to, given each key and value (as JSON).
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&str, &[u8]) -> bool) {
        let out = &*self.out;
        self.entries
            .retain(|e| keep(e.key.as_str(), &out[e.value.clone()]));
    }

    pub(super) fn remove(&mut self, key: &str) {
        self.entries.retain(|e| e.key.as_str() != key);
    }

    /// Sets `key` to `value` (its objects' keys sorted too; no edit sees them).
    pub(super) fn insert(
        &mut self,
        key: &'static str,
        value: &impl Serialize,
    ) -> Result<(), Error> {
        self.remove(key);
        let start = self.out.len();
        // Written after the object's other values, by a writer of its own.
        let mut w = Writer {
            out: std::mem::take(self.out),
            path: Vec::new(),
            open: Vec::new(),
            spare: Vec::new(),
            scratch: Vec::new(),
            edit: |_: &mut Object| Ok(()),
        };
        let written = value.serialize(&mut w);
        *self.out = w.out;
        written?;
        self.entries.push(Entry {
            head: Key::Field(key).head(),
            key: Key::Field(key),
            value: start..self.out.len(),
        });
        Ok(())
    }
}

struct Writer<E> {
    out: Vec<u8>,
    path: Vec<Key>,
    /// Entries of the objects being written, innermost last.
    open: Vec<Vec<Entry>>,
    /// Emptied entry vectors, for the next objects.
    spare: Vec<Vec<Entry>>,
    /// An object's bytes while they are put in order.
    scratch: Vec<u8>,
    edit: E,
}

impl<E: FnMut(&mut Object) -> Result<(), Error>> Writer<E> {
    fn scalar(&mut self, v: impl Serialize) -> Result<(), Error> {
        serde_json::to_writer(&mut self.out, &v)
    }

    /// `{"variant":`, closed by the variant's `Compound::end`.
    fn open_variant(&mut self, variant: &str) -> Result<(), Error> {
        self.out.push(b'{');
        write_key(&mut self.out, variant)?;
        self.out.push(b':');
        Ok(())
    }

    fn open_object(&mut self) -> usize {
        let entries = self.spare.pop().unwrap_or_default();
        self.open.push(entries);
        self.out.len()
    }

    fn entry<T: Serialize + ?Sized>(&mut self, key: Key, v: &T) -> Result<(), Error> {
        let start = self.out.len();
        self.path.push(key);
        v.serialize(&mut *self)?;
        let key = self.path.pop().expect("pushed");
        self.open
            .last_mut()
            .expect("an object is open")
            .push(Entry {
                head: key.head(),
                key,
                value: start..self.out.len(),
            });
        Ok(())
    }

    /// Edits the innermost object, then rewrites its bytes from `start` in key order.
    fn close_object(&mut self, start: usize) -> Result<(), Error> {
        let mut entries = self.open.pop().expect("an object is open");
        (self.edit)(&mut Object {
            path: &self.path,
            entries: &mut entries,
            out: &mut self.out,
        })?;
        // Stable: of equal keys (none a derived struct writes) the last is kept, as a
        // map's insert keeps it.
        if !entries.is_sorted_by(|a, b| a.key.as_str() <= b.key.as_str()) {
            // Most keys differ in their first 8 bytes: one compare of two words.
            entries.sort_by(|a, b| {
                (a.head.cmp(&b.head)).then_with(|| a.key.as_str().cmp(b.key.as_str()))
            });
        }
        self.scratch.clear();
        self.scratch.extend_from_slice(&self.out[start..]);
        self.out.truncate(start);
        self.out.push(b'{');
        let mut first = true;
        for (i, e) in entries.iter().enumerate() {
            if entries
                .get(i + 1)
                .is_some_and(|next| next.key.as_str() == e.key.as_str())
            {
                continue;
            }
            if !first {
                self.out.push(b',');
            }
            first = false;
            write_key(&mut self.out, e.key.as_str())?;
            self.out.push(b':');
            let value = e.value.start - start..e.value.end - start;
            self.out.extend_from_slice(&self.scratch[value]);
        }
        self.out.push(b'}');
        entries.clear();
        self.spare.push(entries);
        Ok(())
    }
}

/// An object, array, or an object of one key holding either (an enum variant).
pub(super) struct Compound<'w, E> {
    w: &'w mut Writer<E>,
    /// Where the object began (None: an array).
    start: Option<usize>,
    first: bool,
    /// A map's key, until its value comes.
    key: Option<Key>,
    /// Closes the `{"variant":` a variant opened.
    variant: bool,
}

impl<'w, E: FnMut(&mut Object) -> Result<(), Error>> Compound<'w, E> {
    fn new(w: &'w mut Writer<E>, start: Option<usize>, variant: bool) -> Self {
        Compound {
            w,
            start,
            first: true,
            key: None,
            variant,
        }
    }

    fn element<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), Error> {
        if !self.first {
            self.w.out.push(b',');
        }
        self.first = false;
        v.serialize(&mut *self.w)
    }

    fn end(self) -> Result<(), Error> {
        match self.start {
            Some(start) => {
                self.w.close_object(start)?;
                if self.variant {
                    // A struct variant's name, pushed as its object opened.
                    self.w.path.pop();
                }
            }
            None => self.w.out.push(b']'),
        }
        if self.variant {
            self.w.out.push(b'}');
        }
        Ok(())
    }
}

macro_rules! scalars {
    ($($method:ident: $t:ty),* $(,)?) => {
        $(fn $method(self, v: $t) -> Result<(), Error> {
            self.scalar(v)
        })*
    };
}

impl<'w, E: FnMut(&mut Object) -> Result<(), Error>> ser::Serializer for &'w mut Writer<E> {
    type Ok = ();
    type Error = Error;
    type SerializeSeq = Compound<'w, E>;
    type SerializeTuple = Compound<'w, E>;
    type SerializeTupleStruct = Compound<'w, E>;
    type SerializeTupleVariant = Compound<'w, E>;
    type SerializeMap = Compound<'w, E>;
    type SerializeStruct = Compound<'w, E>;
    type SerializeStructVariant = Compound<'w, E>;

    // As serde_json writes them.
    scalars! {
        serialize_bool: bool, serialize_i8: i8, serialize_i16: i16, serialize_i32: i32,
        serialize_i64: i64, serialize_u8: u8, serialize_u16: u16, serialize_u32: u32,
        serialize_u64: u64, serialize_f64: f64, serialize_char: char, serialize_str: &str,
    }
    fn serialize_i128(self, v: i128) -> Result<(), Error> {
        // A Value holds what fits 64 bits; to_value errs past that.
        self.scalar(serde_json::Number::from_i128(v).ok_or_else(too_big)?)
    }
    fn serialize_u128(self, v: u128) -> Result<(), Error> {
        self.scalar(serde_json::Number::from_u128(v).ok_or_else(too_big)?)
    }
    fn serialize_f32(self, v: f32) -> Result<(), Error> {
        // A Value keeps an f32 as the f64 it widens to, and writes that.
        self.scalar(f64::from(v))
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<(), Error> {
        // As a Value has them: an array of numbers.
        self.scalar(v)
    }
    fn serialize_none(self) -> Result<(), Error> {
        self.serialize_unit()
    }
    fn serialize_some<T: Serialize + ?Sized>(self, v: &T) -> Result<(), Error> {
        v.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), Error> {
        self.out.extend_from_slice(b"null");
        Ok(())
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<(), Error> {
        self.serialize_unit()
    }
    fn serialize_unit_variant(self, _: &'static str, _: u32, v: &'static str) -> Result<(), Error> {
        self.scalar(v)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        v: &T,
    ) -> Result<(), Error> {
        v.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        v: &T,
    ) -> Result<(), Error> {
        let start = self.open_object();
        self.entry(Key::Field(variant), v)?;
        self.close_object(start)
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Compound<'w, E>, Error> {
        self.out.push(b'[');
        Ok(Compound::new(self, None, false))
    }
    fn serialize_tuple(self, len: usize) -> Result<Compound<'w, E>, Error> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_struct(self, _: &'static str, len: usize) -> Result<Compound<'w, E>, Error> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Compound<'w, E>, Error> {
        // {"variant":[...]}: one key, already in order.
        self.open_variant(variant)?;
        self.out.push(b'[');
        Ok(Compound::new(self, None, true))
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Compound<'w, E>, Error> {
        let start = self.open_object();
        Ok(Compound::new(self, Some(start), false))
    }
    fn serialize_struct(self, _: &'static str, len: usize) -> Result<Compound<'w, E>, Error> {
        self.serialize_map(Some(len))
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Compound<'w, E>, Error> {
        self.open_variant(variant)?;
        self.path.push(Key::Field(variant));
        let start = self.open_object();
        Ok(Compound::new(self, Some(start), true))
    }
}

/// A key as JSON: most are plain field names, written as they are.
fn write_key(out: &mut Vec<u8>, key: &str) -> Result<(), Error> {
    if key.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.push(b'"');
        out.extend_from_slice(key.as_bytes());
        out.push(b'"');
        return Ok(());
    }
    serde_json::to_writer(out, key)
}

fn too_big() -> Error {
    ser::Error::custom("number out of range")
}

/// serde's four kinds of array: each element written in turn.
macro_rules! array {
    ($kind:ident, $element:ident) => {
        impl<E: FnMut(&mut Object) -> Result<(), Error>> ser::$kind for Compound<'_, E> {
            type Ok = ();
            type Error = Error;
            fn $element<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), Error> {
                self.element(v)
            }
            fn end(self) -> Result<(), Error> {
                Compound::end(self)
            }
        }
    };
}

array!(SerializeSeq, serialize_element);
array!(SerializeTuple, serialize_element);
array!(SerializeTupleStruct, serialize_field);
array!(SerializeTupleVariant, serialize_field);

impl<E: FnMut(&mut Object) -> Result<(), Error>> ser::SerializeMap for Compound<'_, E> {
    type Ok = ();
    type Error = Error;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Error> {
        self.key = Some(Key::Text(key.serialize(KeyWriter)?));
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), Error> {
        let key = self
            .key
            .take()
            .ok_or_else(|| <Error as ser::Error>::custom("a map value without its key"))?;
        self.w.entry(key, v)
    }
    fn end(self) -> Result<(), Error> {
        Compound::end(self)
    }
}

/// A struct, and a struct variant's object.
macro_rules! object {
    ($kind:ident) => {
        impl<E: FnMut(&mut Object) -> Result<(), Error>> ser::$kind for Compound<'_, E> {
            type Ok = ();
            type Error = Error;
            fn serialize_field<T: Serialize + ?Sized>(
                &mut self,
                key: &'static str,
                v: &T,
            ) -> Result<(), Error> {
                self.w.entry(Key::Field(key), v)
            }
            fn end(self) -> Result<(), Error> {
                Compound::end(self)
            }
        }
    };
}

object!(SerializeStruct);
object!(SerializeStructVariant);

/// A map key as a Value's map has it: strings as they are, numbers and chars as text.
struct KeyWriter;

macro_rules! numbers {
    ($($method:ident: $t:ty),* $(,)?) => {
        $(fn $method(self, v: $t) -> Result<CompactString, Error> {
            Ok(compact_str::format_compact!("{v}"))
        })*
    };
}

impl ser::Serializer for KeyWriter {
    type Ok = CompactString;
    type Error = Error;
    type SerializeSeq = ser::Impossible<CompactString, Error>;
    type SerializeTuple = ser::Impossible<CompactString, Error>;
    type SerializeTupleStruct = ser::Impossible<CompactString, Error>;
    type SerializeTupleVariant = ser::Impossible<CompactString, Error>;
    type SerializeMap = ser::Impossible<CompactString, Error>;
    type SerializeStruct = ser::Impossible<CompactString, Error>;
    type SerializeStructVariant = ser::Impossible<CompactString, Error>;

    fn serialize_str(self, v: &str) -> Result<CompactString, Error> {
        Ok(v.into())
    }
    fn serialize_char(self, v: char) -> Result<CompactString, Error> {
        Ok(CompactString::from(v.encode_utf8(&mut [0; 4]) as &str))
    }
    fn serialize_bool(self, v: bool) -> Result<CompactString, Error> {
        Ok(if v { "true" } else { "false" }.into())
    }
    // Integers as their decimal text.
    numbers! {
        serialize_i8: i8, serialize_i16: i16, serialize_i32: i32, serialize_i64: i64,
        serialize_i128: i128, serialize_u8: u8, serialize_u16: u16, serialize_u32: u32,
        serialize_u64: u64, serialize_u128: u128,
    }
    fn serialize_f32(self, _: f32) -> Result<CompactString, Error> {
        Err(not_a_key())
    }
    fn serialize_f64(self, _: f64) -> Result<CompactString, Error> {
        Err(not_a_key())
    }
    fn serialize_bytes(self, _: &[u8]) -> Result<CompactString, Error> {
        Err(not_a_key())
    }
    fn serialize_none(self) -> Result<CompactString, Error> {
        Err(not_a_key())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, _: &T) -> Result<CompactString, Error> {
        Err(not_a_key())
    }
    fn serialize_unit(self) -> Result<CompactString, Error> {
        Err(not_a_key())
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<CompactString, Error> {
        Err(not_a_key())
    }
    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        v: &'static str,
    ) -> Result<CompactString, Error> {
        Ok(v.into())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        v: &T,
    ) -> Result<CompactString, Error> {
        v.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<CompactString, Error> {
        Err(not_a_key())
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, Error> {
        Err(not_a_key())
    }
    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, Error> {
        Err(not_a_key())
    }
    fn serialize_tuple_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleStruct, Error> {
        Err(not_a_key())
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, Error> {
        Err(not_a_key())
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, Error> {
        Err(not_a_key())
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeStruct, Error> {
        Err(not_a_key())
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, Error> {
        Err(not_a_key())
    }
}

fn not_a_key() -> Error {
    ser::Error::custom("key must be a string")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Serialize;
    use std::collections::{BTreeMap, HashMap};

    #[derive(Serialize)]
    enum Shape {
        Dot,
        Wrapped(u8),
        Pair(i32, i32),
        Boxy { z: f32, a: Option<&'static str> },
    }

    #[derive(Serialize)]
    struct Inner {
        zeta: u64,
        #[serde(skip_serializing_if = "Option::is_none")]
        skipped: Option<u8>,
        alpha: Vec<Shape>,
        nan: f64,
    }

    #[derive(Serialize)]
    struct Outer {
        name: String,
        inner: Inner,
        #[serde(flatten)]
        flat: Inner,
        by_id: HashMap<u32, bool>,
        by_name: BTreeMap<&'static str, ()>,
        big: i128,
        bytes: &'static [u8],
        tuple: (char, &'static str),
        quoted: &'static str,
    }

    fn sample() -> Outer {
        let inner = |n| Inner {
            zeta: n,
            skipped: None,
            alpha: vec![
                Shape::Dot,
                Shape::Wrapped(7),
                Shape::Pair(-1, 2),
                Shape::Boxy {
                    z: 0.1,
                    a: Some("x"),
                },
            ],
            nan: f64::NAN,
        };
        Outer {
            name: "n\u{e9}\"\n".into(),
            inner: inner(1),
            flat: inner(2),
            by_id: [(10, true), (9, false), (100, true)].into(),
            by_name: [("b", ()), ("a", ())].into(),
            big: -(1 << 40),
            bytes: b"\x00\xff",
            tuple: ('\u{1F600}', "t"),
            quoted: "\\ \u{1}",
        }
    }

    #[test]
    fn it_writes_what_a_value_writes() {
        let v = serde_json::to_value(sample()).expect("to_value");
        let want = serde_json::to_vec(&v).expect("to_vec");
        let got = to_vec(&sample(), |_| Ok(())).expect("sorted");
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(&want)
        );
    }

    #[test]
    fn an_edit_sees_each_object_with_its_path_and_changes_it() {
        let mut seen = Vec::new();
        let got = to_vec(&sample(), |o| {
            seen.push(o.path.iter().map(Key::as_str).collect::<Vec<_>>().join("/"));
            if o.under("inner") {
                o.remove("zeta");
                o.insert(
                    "added",
                    &Inner {
                        zeta: 3,
                        skipped: Some(1),
                        alpha: Vec::new(),
                        nan: 0.5,
                    },
                )?;
            }
            if o.path.is_empty() {
                o.retain(|k, v| k != "big" && v != b"null");
            }
            Ok(())
        })
        .expect("sorted");
        let v: serde_json::Value = serde_json::from_slice(&got).expect("JSON");
        assert!(v["inner"].get("zeta").is_none());
        assert_eq!(
            v["inner"]["added"],
            serde_json::json!({"alpha": [], "nan": 0.5, "skipped": 1, "zeta": 3})
        );
        assert!(v.get("big").is_none() && v.get("nan").is_none());
        assert_eq!(v["zeta"], 2, "the flattened fields are the top's");
        for path in ["inner", "inner/alpha/Boxy", "by_id", ""] {
            assert!(seen.iter().any(|p| p == path), "{path} in {seen:?}");
        }
    }
}
