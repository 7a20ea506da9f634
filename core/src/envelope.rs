//! kube-apiserver's protobuf encoding of an object (`application/vnd.kubernetes.protobuf`): the
//! four bytes `k8s\0`, then a `runtime.Unknown` (`typeMeta` 1 with `apiVersion` 1 and `kind` 2,
//! `raw` 2: the object's own message, `contentEncoding` 3, `contentType` 4;
//! apimachinery's runtime/generated.proto). One home for every body skewgate writes or reads in
//! it: discovery documents, write requests read for gated fields, the stand-ins' and the tests'.

use crate::protowire::{self, Writer};

/// Every protobuf body kube-apiserver writes or reads starts with these four bytes.
pub const MAGIC: &[u8] = b"k8s\0";

/// An opened envelope.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Envelope<'a> {
    pub api_version: &'a str,
    pub kind: &'a str,
    /// The object's message.
    pub raw: &'a [u8],
    /// Empty unless the object is compressed.
    pub content_encoding: &'a str,
}

/// The envelope of `body`, or `None` if it has no magic or is malformed.
pub fn open(body: &[u8]) -> Option<Envelope<'_>> {
    let mut envelope = Envelope::default();
    for field in protowire::fields(body.strip_prefix(MAGIC)?) {
        let field = field.ok()?;
        let payload = field.payload();
        match field.number {
            1 => {
                for meta in protowire::fields(payload) {
                    let meta = meta.ok()?;
                    let value = std::str::from_utf8(meta.payload()).ok()?;
                    match meta.number {
                        1 => envelope.api_version = value,
                        2 => envelope.kind = value,
                        _ => {}
                    }
                }
            }
            2 => envelope.raw = payload,
            3 => envelope.content_encoding = std::str::from_utf8(payload).ok()?,
            _ => {}
        }
    }
    Some(envelope)
}

/// The body kube-apiserver writes for an object of `api_version` and `kind` whose fields
/// `encode` writes: `contentEncoding` and `contentType` present and empty, as it sends them.
pub fn seal(api_version: &str, kind: &str, capacity: usize, encode: impl FnOnce(&mut Writer)) -> Vec<u8> {
    let mut wire = Writer::with_capacity(capacity);
    wire.raw(MAGIC);
    wire.message(1, |w| {
        w.string(1, api_version);
        w.string(2, kind);
    });
    wire.message(2, encode);
    wire.string(3, "");
    wire.string(4, "");
    wire.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_sealed_opens() {
        let body = seal("v1", "PersistentVolumeClaim", 64, |w| w.string(1, "x"));
        let e = open(&body).unwrap();
        assert_eq!((e.api_version, e.kind, e.content_encoding), ("v1", "PersistentVolumeClaim", ""));
        assert_eq!(protowire::fields(e.raw).next().unwrap().unwrap().payload(), b"x");
        assert_eq!(open(b"not protobuf"), None);
        assert_eq!(open(&body[..body.len() - 3]), None, "truncated");
    }
}
