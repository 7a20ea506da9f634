//! Protobuf's wire format, as far as the Kubernetes documents skewgate reads and writes need it:
//! one writer and one field reader for every codec of the project (discovery in protobuf, the
//! stand-in's request bodies, the OpenAPI v2 merge done field by field).
//!
//! Each codec knows its messages' field numbers itself; what is here knows none.

/// A field's value as it sits on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value<'a> {
    Varint(u64),
    /// Length-delimited: a string, bytes, an embedded message or a packed repeated field.
    Bytes(&'a [u8]),
    /// A fixed32 or fixed64, skipped (no Kubernetes document skewgate reads has one).
    Fixed,
}

/// One field of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field<'a> {
    pub number: u32,
    pub value: Value<'a>,
    /// The whole field, its key included, to copy it as it is.
    pub raw: &'a [u8],
}

impl<'a> Field<'a> {
    /// A length-delimited field's content; empty for other wire types.
    pub fn payload(&self) -> &'a [u8] {
        match self.value {
            Value::Bytes(bytes) => bytes,
            _ => &[],
        }
    }
}

/// Why a message could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Malformed(pub &'static str);

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "malformed protobuf: {}", self.0)
    }
}

impl std::error::Error for Malformed {}

/// The fields of `message`, in wire order. The first malformed one ends the iteration with an
/// error.
pub fn fields(message: &[u8]) -> Fields<'_> {
    Fields { rest: message }
}

pub struct Fields<'a> {
    rest: &'a [u8],
}

impl<'a> Fields<'a> {
    fn varint(&mut self) -> Result<u64, Malformed> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = self.rest.split_first().ok_or(Malformed("truncated varint"))?;
            self.rest = rest;
            value |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                return Ok(value);
            }
        }
        Err(Malformed("varint too long"))
    }

    fn take(&mut self, len: usize) -> Result<&'a [u8], Malformed> {
        if len > self.rest.len() {
            return Err(Malformed("truncated field"));
        }
        let (taken, rest) = self.rest.split_at(len);
        self.rest = rest;
        Ok(taken)
    }

    fn field(&mut self) -> Result<Field<'a>, Malformed> {
        let start = self.rest;
        let key = self.varint()?;
        let number = u32::try_from(key >> 3).map_err(|_| Malformed("field number out of range"))?;
        let value = match key & 7 {
            0 => Value::Varint(self.varint()?),
            1 => self.take(8).map(|_| Value::Fixed)?,
            2 => {
                let len = usize::try_from(self.varint()?).map_err(|_| Malformed("length out of range"))?;
                Value::Bytes(self.take(len)?)
            }
            5 => self.take(4).map(|_| Value::Fixed)?,
            _ => return Err(Malformed("unsupported wire type")),
        };
        let raw = &start[..start.len() - self.rest.len()];
        Ok(Field { number, value, raw })
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<Field<'a>, Malformed>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let field = self.field();
        if field.is_err() {
            self.rest = &[];
        }
        Some(field)
    }
}

/// A protobuf writer for the wire types Kubernetes documents use.
#[derive(Debug, Default)]
pub struct Writer(Vec<u8>);

impl Writer {
    pub fn with_capacity(capacity: usize) -> Self {
        Self(Vec::with_capacity(capacity))
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.0
    }

    /// Bytes as they are: a prefix (Kubernetes' magic), or fields copied from another message.
    pub fn raw(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
    }

    fn varint(&mut self, mut value: u64) {
        while value >= 0x80 {
            self.0.push((value as u8) | 0x80);
            value >>= 7;
        }
        self.0.push(value as u8);
    }

    fn key(&mut self, field: u32, wire_type: u8) {
        self.varint(u64::from(field) << 3 | u64::from(wire_type));
    }

    pub fn bytes(&mut self, field: u32, bytes: &[u8]) {
        self.key(field, 2);
        self.varint(bytes.len() as u64);
        self.0.extend_from_slice(bytes);
    }

    pub fn string(&mut self, field: u32, text: &str) {
        self.bytes(field, text.as_bytes());
    }

    pub fn strings(&mut self, field: u32, items: &[String]) {
        for item in items {
            self.string(field, item);
        }
    }

    pub fn bool(&mut self, field: u32, value: bool) {
        self.key(field, 0);
        self.0.push(u8::from(value));
    }

    pub fn int64(&mut self, field: u32, value: i64) {
        self.key(field, 0);
        // Negative numbers are ten bytes, as Go's uint64 conversion makes them.
        self.varint(value as u64);
    }

    /// A length-delimited message; its length is known only once its fields are written, so the
    /// key and length go in front of them afterwards.
    pub fn message(&mut self, field: u32, fields: impl FnOnce(&mut Writer)) {
        let start = self.0.len();
        fields(self);
        let len = self.0.len() - start;
        let mut head = Writer::with_capacity(6);
        head.key(field, 2);
        head.varint(len as u64);
        self.0.splice(start..start, head.0);
    }

    pub fn messages<T>(&mut self, field: u32, items: &[T], encode: impl Fn(&T, &mut Writer)) {
        for item in items {
            self.message(field, |w| encode(item, w));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_and_numbers_take_several_bytes() {
        let mut w = Writer::default();
        w.string(1, &"x".repeat(300));
        assert_eq!(w.0.get(..3), Some(&b"\x0a\xac\x02"[..]));
        let mut w = Writer::default();
        w.int64(4, -1);
        assert_eq!(w.0, b"\x20\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01");
        let mut w = Writer::default();
        w.message(2, |w| w.string(1, &"y".repeat(200)));
        assert_eq!(w.0.get(..5), Some(&b"\x12\xcb\x01\x0a\xc8"[..]));
    }

    #[test]
    fn what_is_written_reads_back_field_by_field() {
        let mut w = Writer::default();
        w.string(1, "a");
        w.bool(3, true);
        w.message(200, |w| w.int64(1, 7));
        let bytes = w.into_bytes();
        let read: Vec<Field<'_>> = fields(&bytes).collect::<Result<_, _>>().unwrap();
        assert_eq!(read.iter().map(|f| f.number).collect::<Vec<_>>(), [1, 3, 200]);
        assert_eq!(read[0].value, Value::Bytes(b"a"));
        assert_eq!(read[1].value, Value::Varint(1));
        assert_eq!(read[2].payload(), b"\x08\x07");
        assert_eq!(read.iter().flat_map(|f| f.raw.iter().copied()).collect::<Vec<_>>(), bytes);
    }

    #[test]
    fn fixed_fields_are_skipped_and_bad_ones_end_the_message() {
        let read: Vec<_> = fields(b"\x09\x01\x02\x03\x04\x05\x06\x07\x08\x15\x01\x02\x03\x04").collect();
        assert_eq!(read.len(), 2);
        assert!(read.iter().all(|f| f.as_ref().is_ok_and(|f| f.value == Value::Fixed)));
        for bad in [
            &b"\x09\x01"[..],
            b"\x0a\x05ab",
            b"\x80",
            b"\x0b",
            b"\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01",
        ] {
            let read: Vec<_> = fields(bad).collect();
            assert!(matches!(read.last(), Some(Err(_))), "{bad:?}: {read:?}");
        }
    }
}
