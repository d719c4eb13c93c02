//! The JSON writer of request summaries (see `Obj`).

/// A JSON object written key by key, as serde_json writes a struct's fields: the keys
/// (plain names) copied as they are, and a string copied whole when nothing in it needs
/// escaping. Through serde, each key and string was scanned and escaped byte by byte:
/// 5% of a one-core `report`'s instructions on issue 17's bench recording.
pub(super) struct Obj<'o> {
    out: &'o mut Vec<u8>,
    first: bool,
}

impl<'o> Obj<'o> {
    pub(super) fn new(out: &'o mut Vec<u8>) -> Obj<'o> {
        out.push(b'{');
        Obj { out, first: true }
    }

    /// The key written, and where its value goes.
    pub(super) fn key(&mut self, key: &'static str) -> &mut Vec<u8> {
        if !std::mem::take(&mut self.first) {
            self.out.push(b',');
        }
        self.out.push(b'"');
        self.out.extend_from_slice(key.as_bytes());
        self.out.extend_from_slice(b"\":");
        self.out
    }

    pub(super) fn u64(&mut self, key: &'static str, v: impl Into<u64>) {
        let out = self.key(key);
        out.extend_from_slice(itoa::Buffer::new().format(v.into()).as_bytes());
    }

    /// null when None.
    pub(super) fn opt_u64(&mut self, key: &'static str, v: Option<impl Into<u64>>) {
        match v {
            Some(v) => self.u64(key, v),
            None => self.key(key).extend_from_slice(b"null"),
        }
    }

    pub(super) fn bool(&mut self, key: &'static str, v: bool) {
        let text: &[u8] = if v { b"true" } else { b"false" };
        self.key(key).extend_from_slice(text);
    }

    pub(super) fn str(&mut self, key: &'static str, v: &str) {
        let out = self.key(key);
        if v.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
            out.push(b'"');
            out.extend_from_slice(v.as_bytes());
            out.push(b'"');
        } else {
            serde_json::to_writer(out, v).expect("a string serializes");
        }
    }

    /// null when None.
    pub(super) fn opt_str(&mut self, key: &'static str, v: Option<&str>) {
        match v {
            Some(v) => self.str(key, v),
            None => self.key(key).extend_from_slice(b"null"),
        }
    }

    /// `items` as an array, each written by `write`.
    pub(super) fn array<T>(
        &mut self,
        key: &'static str,
        items: &[T],
        write: impl Fn(&T, &mut Vec<u8>),
    ) {
        let out = self.key(key);
        out.push(b'[');
        for (k, item) in items.iter().enumerate() {
            if k > 0 {
                out.push(b',');
            }
            write(item, out);
        }
        out.push(b']');
    }

    pub(super) fn end(self) {
        self.out.push(b'}');
    }
}
