//! The discovery ETag, computed the way kube-apiserver's `calculateETag` does, so that a client
//! holding an apiserver's ETag for the same content gets a 304 from skewgate too.

use std::fmt::Write as _;
use std::io;

use serde::Serialize;
use serde_json::ser::Formatter;
use sha2::{Digest, Sha512};

use super::model::{ApiGroupDiscovery, ApiGroupDiscoveryList, ListMeta};

/// Upper-case hex SHA-512 of `list` as Go's `json.Marshal` writes it; without quotes (the
/// `ETag` header needs them added).
///
/// Upstream hashes the list before the serializer stamps `kind` and `apiVersion` on it, so those
/// two are left out of the hash here as well: only `metadata` and `items` count.
/// Returns "" if serialization fails (it cannot for these types); upstream then serves the
/// document without ETag headers.
pub fn etag(list: &ApiGroupDiscoveryList) -> String {
    let untyped = UntypedList { metadata: &list.metadata, items: &list.items };
    let mut hasher = Sha512::new();
    let mut serializer = serde_json::Serializer::with_formatter(&mut hasher, GoJsonFormatter);
    if untyped.serialize(&mut serializer).is_err() {
        return String::new();
    }
    upper_hex(&hasher.finalize())
}

#[derive(Serialize)]
struct UntypedList<'a> {
    metadata: &'a ListMeta,
    items: &'a [ApiGroupDiscovery],
}

fn upper_hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut hex, byte| {
        // Writing to a String cannot fail.
        let _ = write!(hex, "{byte:02X}");
        hex
    })
}

/// serde_json's compact output plus the escapes Go's `json.Marshal` adds for HTML safety
/// (`<`, `>`, `&`, U+2028, U+2029); everything else already matches byte for byte.
struct GoJsonFormatter;

impl Formatter for GoJsonFormatter {
    fn write_string_fragment<W>(&mut self, writer: &mut W, fragment: &str) -> io::Result<()>
    where
        W: ?Sized + io::Write,
    {
        let mut unwritten_from = 0;
        for (index, character) in fragment.char_indices() {
            if let Some(escape) = go_html_escape(character) {
                writer.write_all(fragment.get(unwritten_from..index).unwrap_or_default().as_bytes())?;
                writer.write_all(escape.as_bytes())?;
                unwritten_from = index + character.len_utf8();
            }
        }
        writer.write_all(fragment.get(unwritten_from..).unwrap_or_default().as_bytes())
    }
}

fn go_html_escape(character: char) -> Option<&'static str> {
    match character {
        '<' => Some("\\u003c"),
        '>' => Some("\\u003e"),
        '&' => Some("\\u0026"),
        '\u{2028}' => Some("\\u2028"),
        '\u{2029}' => Some("\\u2029"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::discovery::fixtures::{self, V1_33, V1_36};
    use crate::discovery::{ApiVersionDiscovery, Freshness, ObjectMeta};

    fn one_group(name: &str) -> ApiGroupDiscoveryList {
        ApiGroupDiscoveryList::v2(vec![ApiGroupDiscovery {
            metadata: ObjectMeta { name: name.to_owned(), ..ObjectMeta::default() },
            versions: vec![ApiVersionDiscovery {
                version: "v1".to_owned(),
                resources: Vec::new(),
                freshness: Some(Freshness::Current),
            }],
            ..ApiGroupDiscovery::default()
        }])
    }

    // Expected values: SHA-512 of the Go json.Marshal text, computed outside this code.
    #[test]
    fn empty_list_hashes_like_go() {
        // sha512(`{"metadata":{},"items":[]}`)
        assert_eq!(
            etag(&ApiGroupDiscoveryList::v2(Vec::new())),
            "E31D92F2F415F58D79E51A08706C00FE868ED961736AD66A944AC75AA3682B3324F1787C9AF1250F28E111EEF86B2C3CD65FC48D3A283E0598FFA800177D68C1"
        );
    }

    #[test]
    fn html_characters_are_escaped_like_go() {
        // sha512(`{"metadata":{},"items":[{"metadata":{"name":"a\u003cb\u0026c\u003e\u2028"},"versions":[{"version":"v1","freshness":"Current"}]}]}`)
        assert_eq!(
            etag(&one_group("a<b&c>\u{2028}")),
            "9E968E16C2C92CC8F81E1EE396F5CDAE37D629F52B9D9CCA6A5A8BBC6BA6110587299C751337008E98F45FB6D2FBCC58583C6890988BADEE06B151EA9D1B2639"
        );
    }

    #[test]
    fn etag_is_128_upper_case_hex_characters() {
        let tag = etag(&fixtures::parse(V1_36));
        assert_eq!(tag.len(), 128);
        assert!(tag.chars().all(|c| c.is_ascii_digit() || ('A'..='F').contains(&c)));
        assert!(!tag.contains('"'));
    }

    #[test]
    fn etag_is_stable() {
        assert_eq!(etag(&fixtures::parse(V1_33)), etag(&fixtures::parse(V1_33)));
    }

    #[test]
    fn etag_changes_with_content() {
        let original = fixtures::parse(V1_33);
        let mut changed = original.clone();
        changed.items[0].versions[0].freshness = Some(Freshness::Stale);
        assert_ne!(etag(&original), etag(&changed));
        assert_ne!(etag(&original), etag(&fixtures::parse(V1_36)));
    }

    #[test]
    fn etag_ignores_type_meta_like_upstream() {
        let typed = fixtures::parse(V1_33);
        let mut untyped = typed.clone();
        untyped.kind.clear();
        untyped.api_version.clear();
        assert_eq!(etag(&typed), etag(&untyped));
    }

    #[test]
    fn go_formatter_leaves_plain_strings_alone() {
        let mut out = Vec::new();
        let mut serializer = serde_json::Serializer::with_formatter(&mut out, GoJsonFormatter);
        "plain \"quoted\"\n ünïcode <tag>".serialize(&mut serializer).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), r#""plain \"quoted\"\n ünïcode \u003ctag\u003e""#);
    }
}
