//! `/openapi/v2` in protobuf (`application/com.github.proto-openapi.spec.v2@v1.0+protobuf`,
//! gnostic's `openapi.v2.Document`), merged at the wire level: the named maps of a Document are
//! repeated `Named*` messages whose field 1 is the name, so a union by name needs no model of the
//! values. Field numbers from gnostic-models' `openapiv2/OpenAPIv2.proto`:
//! `Document.paths = 8` (`Paths.path = 2`, `Paths.vendor_extension = 1`),
//! `definitions = 9`, `parameters = 10`, `responses = 11`, `security_definitions = 13` (each
//! `additional_properties = 1`); `Named*.name = 1`, `Named*.value = 2`.
//!
//! Rule, as for JSON ([`crate::merge`]): the first input's Document (priority order) with every
//! named entry of the later inputs whose name it lacks; other fields from the first input.

use std::collections::BTreeSet;

use skewgate_core::protowire::{self, Field, Writer};

/// Document field → the field of its entries inside that map message.
const MAPS: [(u32, u32, &str); 5] = [
    (8, 2, "paths"),
    (9, 1, "definitions"),
    (10, 1, "parameters"),
    (11, 1, "responses"),
    (13, 1, "securityDefinitions"),
];

pub const MEDIA_TYPE: &str = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";

/// The fields of one message, in wire order.
pub fn fields(buf: &[u8]) -> Result<Vec<Field<'_>>, String> {
    protowire::fields(buf).collect::<Result<_, _>>().map_err(|e| e.to_string())
}

/// The name (field 1) of a `Named*` entry.
fn name(entry: &[u8]) -> Result<&[u8], String> {
    Ok(fields(entry)?.into_iter().find(|f| f.number == 1).map_or(&[][..], |f| f.payload()))
}

/// The merged Document of `inputs` (priority order).
pub fn merge(inputs: &[&[u8]]) -> Result<Vec<u8>, String> {
    let docs: Vec<Vec<Field<'_>>> = inputs.iter().map(|d| fields(d)).collect::<Result<_, _>>()?;
    let Some(first) = docs.first() else { return Ok(Vec::new()) };
    let mut out = Writer::default();
    let mut emitted = BTreeSet::new();
    for field in first {
        match MAPS.iter().find(|(n, _, _)| *n == field.number) {
            None => out.raw(field.raw),
            Some(&(number, entry, _)) => {
                if emitted.insert(number) {
                    out.bytes(number, &merged_map(&docs, number, entry)?);
                }
            }
        }
    }
    for (number, entry, _) in MAPS {
        if !emitted.contains(&number) && docs.iter().flatten().any(|f| f.number == number) {
            out.bytes(number, &merged_map(&docs, number, entry)?);
        }
    }
    Ok(out.into_bytes())
}

/// One map message: the first input's other fields, then every entry, first-seen by name.
fn merged_map(docs: &[Vec<Field<'_>>], number: u32, entry: u32) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let mut seen: BTreeSet<&[u8]> = BTreeSet::new();
    let mut others_taken = false;
    for doc in docs {
        let mut had_map = false;
        for map in doc.iter().filter(|f| f.number == number) {
            had_map = true;
            for field in fields(map.payload())? {
                if field.number == entry {
                    if seen.insert(name(field.payload())?) {
                        out.extend_from_slice(field.raw);
                    }
                } else if !others_taken {
                    out.extend_from_slice(field.raw);
                }
            }
        }
        others_taken |= had_map;
    }
    Ok(out)
}

/// `paths/<name>`, `definitions/<name>`, ... of a Document.
pub fn names(doc: &[u8]) -> Result<BTreeSet<String>, String> {
    let mut out = BTreeSet::new();
    for field in fields(doc)? {
        let Some((_, entry, label)) = MAPS.iter().find(|(n, _, _)| *n == field.number) else { continue };
        for f in fields(field.payload())?.into_iter().filter(|f| f.number == *entry) {
            out.insert(format!("{label}/{}", String::from_utf8_lossy(name(f.payload())?)));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(w: &mut Writer, number: u32, name: &str, value: impl FnOnce(&mut Writer)) {
        w.message(number, |entry| {
            entry.string(1, name);
            entry.message(2, value);
        });
    }

    fn doc(swagger: &str, paths: &[&str], definitions: &[(&str, &str)]) -> Vec<u8> {
        let mut out = Writer::default();
        out.string(1, swagger);
        out.message(8, |p| {
            p.string(1, "vendor");
            for path in paths {
                named(p, 2, path, |_| {});
            }
        });
        out.message(9, |d| {
            for (name, description) in definitions {
                named(d, 1, name, |schema| schema.string(4, description));
            }
        });
        out.into_bytes()
    }

    #[test]
    fn union_by_name_first_seen() {
        let a = doc("2.0", &["/a"], &[("A", "a"), ("S", "from a")]);
        let b = doc("2.0-b", &["/b"], &[("B", "b"), ("S", "from b")]);
        let merged = merge(&[&a, &b]).unwrap();
        let expected: BTreeSet<String> =
            ["paths//a", "paths//b", "definitions/A", "definitions/B", "definitions/S"]
                .map(String::from)
                .into();
        assert_eq!(names(&merged).unwrap(), expected);
        // First-seen: S is a's; the swagger field and Paths' vendor extension are a's, once.
        assert_eq!(merge(&[&merged, &a, &b]).unwrap(), merged, "idempotent");
        let top = fields(&merged).unwrap();
        assert_eq!(top[0].payload(), b"2.0");
        let paths = fields(top[1].payload()).unwrap();
        assert_eq!(paths.iter().filter(|f| f.number == 1).count(), 1);
        let defs = fields(top[2].payload()).unwrap();
        let s = defs.iter().find(|f| name(f.payload()).unwrap() == b"S").unwrap();
        assert!(s.payload().windows(6).any(|w| w == b"from a"));
        assert!(merge(&[b"\x0a\x05ab"]).is_err(), "truncated");
        assert!(fields(b"\x09\x01").is_err(), "truncated fixed64");
    }
}
