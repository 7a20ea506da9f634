//! Property tests against reference models of the Go code.

use std::borrow::Cow;

use proptest::prelude::*;

use super::field_selector::{check_field_value, field_selector_exact_name};
use super::label_selector::is_valid_label_selector;
use super::path::{is_valid_path_segment_name, verb_for_method};
use super::{RequestInfo, decode_path, split_target};

/// What the path alone decides, owned so a reference model can produce it.
#[derive(Debug, Default, PartialEq)]
struct Shape {
    resource_request: bool,
    group: String,
    version: String,
    namespace: String,
    resource: String,
    subresource: String,
    name: String,
    parts: Vec<String>,
    error: bool,
}

impl Shape {
    fn of(info: &RequestInfo<'_>) -> Self {
        Shape {
            resource_request: info.is_resource_request,
            group: info.api_group.into(),
            version: info.api_version.into(),
            namespace: info.namespace.into(),
            resource: info.resource.into(),
            subresource: info.subresource.into(),
            name: info.name.to_string(),
            parts: info.parts().map(str::to_owned).collect(),
            error: info.error.is_some(),
        }
    }
}

/// Go's structural parse, written naively over an owned segment list, to check the zero-copy
/// walk against.
fn reference(method: &str, path: &str) -> Shape {
    let trimmed = path.trim_matches('/');
    let mut parts: Vec<&str> = if trimmed.is_empty() { vec![] } else { trimmed.split('/').collect() };
    if parts.len() < 3 || !(parts[0] == "api" || parts[0] == "apis") {
        return Shape::default();
    }
    let prefix = parts.remove(0);
    let mut shape = Shape { resource_request: true, ..Shape::default() };
    if prefix == "apis" {
        if parts.len() < 3 {
            return Shape::default();
        }
        shape.group = parts.remove(0).into();
    }
    shape.version = parts.remove(0).into();
    let mut verb = verb_for_method(method);
    if parts[0] == "watch" || parts[0] == "proxy" {
        if parts.len() < 2 {
            return Shape { error: true, ..shape };
        }
        verb = if parts[0] == "watch" { "watch" } else { "proxy" };
        parts.remove(0);
    }
    if parts[0] == "namespaces" && parts.len() > 1 {
        shape.namespace = parts[1].into();
        if parts.len() > 2 && parts[2] != "status" && parts[2] != "finalize" {
            parts.drain(..2);
        }
    }
    let part = |i: usize| parts.get(i).copied().unwrap_or("").to_owned();
    shape.resource = part(0);
    shape.name = part(1);
    shape.subresource = if verb == "proxy" { String::new() } else { part(2) };
    shape.parts = parts.iter().map(|p| p.to_string()).collect();
    shape
}

const KNOWN_VERBS: &[&str] =
    &["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection", "proxy", ""];

fn method() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec!["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "get", "ÄÖ"])
            .prop_map(str::to_owned),
        "\\PC{0,8}",
    ]
}

fn path() -> impl Strategy<Value = String> {
    let segment = prop::sample::select(vec![
        "api",
        "apis",
        "v1",
        "apps",
        "namespaces",
        "ns",
        "pods",
        "p",
        "watch",
        "proxy",
        "status",
        "finalize",
        "",
        "%2F",
        "a%2Fb",
        "%zz",
        "+",
        "é",
    ]);
    prop_oneof![
        prop::collection::vec(segment, 0..8).prop_map(|s| format!("/{}", s.join("/"))),
        "[/a-z0-9%.+]{0,30}",
        "\\PC{0,40}",
    ]
}

fn query() -> impl Strategy<Value = String> {
    let key = prop::sample::select(vec![
        "watch",
        "fieldSelector",
        "labelSelector",
        "limit",
        "timeoutSeconds",
        "wat%63h",
        "x",
        "",
        ";",
    ]);
    let value = prop_oneof![
        prop::sample::select(vec![
            "",
            "0",
            "1",
            "false",
            "TRUE",
            "metadata.name=foo",
            "metadata.name%3Dfoo",
            "a%3Db",
            "a\\,b",
            "!!",
            "a+in+(b,c)",
            "%zz",
            "%FF",
            "10",
            "-1",
            "x,metadata.name==y",
        ])
        .prop_map(str::to_owned),
        "[a-z=!,()\\\\%+.<>0-9 ]{0,12}",
    ];
    prop_oneof![
        prop::collection::vec((key, value), 0..5).prop_map(|pairs| {
            pairs.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("&")
        }),
        "\\PC{0,40}",
        "[a-zA-Z=&;%+,\\\\!()<> ]{0,40}",
    ]
}

proptest! {
    #[test]
    fn targets_never_panic(method in method(), target in "\\PC{0,60}") {
        let (raw, query) = split_target(&target);
        if let Ok(path) = decode_path(raw) {
            let _ = RequestInfo::parse(&method, &path, query);
        }
    }

    #[test]
    fn invariants(method in method(), path in path(), query in query()) {
        let info = RequestInfo::parse(&method, &path, &query);
        let lower: String = method.chars().map(|c| c.to_lowercase().next().unwrap_or(c)).collect();
        let parts: Vec<&str> = info.parts().collect();
        if info.is_resource_request {
            prop_assert!(info.api_prefix == "api" || info.api_prefix == "apis");
            prop_assert!(info.api_prefix == "apis" || info.api_group.is_empty());
            if info.error.is_some() {
                prop_assert_eq!(&*info.verb, lower.as_str());
                prop_assert!(parts.is_empty() && info.resource.is_empty());
            } else {
                prop_assert!(KNOWN_VERBS.contains(&&*info.verb), "verb {:?}", info.verb);
                prop_assert!(!parts.is_empty());
                prop_assert!(path.trim_matches('/').ends_with(&parts.join("/")));
                prop_assert_eq!(parts.first().copied(), Some(info.resource));
            }
        } else {
            prop_assert!(info.api_prefix.is_empty() || info.api_prefix == "apis");
            prop_assert_eq!(&*info.verb, lower.as_str());
            prop_assert!(info.api_group.is_empty() && info.api_version.is_empty() && info.resource.is_empty());
            prop_assert!(info.namespace.is_empty() && info.subresource.is_empty() && info.name.is_empty());
            prop_assert!(parts.is_empty() && info.error.is_none());
        }
        if info.verb == "proxy" {
            prop_assert!(info.subresource.is_empty());
        }
        if !info.field_selector.is_empty() || !info.label_selector.is_empty() {
            prop_assert!(matches!(&*info.verb, "list" | "watch" | "deletecollection"));
        }
        if parts.get(1).copied().unwrap_or("") != &*info.name {
            prop_assert!(matches!(&*info.verb, "list" | "watch"));
            prop_assert!(is_valid_path_segment_name(&info.name));
        }
    }

    #[test]
    fn path_walk_matches_reference(method in method(), path in path()) {
        prop_assert_eq!(Shape::of(&RequestInfo::parse(&method, &path, "")), reference(&method, &path));
    }

    #[test]
    fn unescaped_inputs_borrow(
        method in prop::sample::select(vec!["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "custom"]),
        path in "[/a-z0-9.]{0,30}",
        query in "[a-zA-Z=&.,!()0-9]{0,40}",
    ) {
        let info = RequestInfo::parse(method, &path, &query);
        let borrowed = |c: &Cow<'_, str>| matches!(c, Cow::Borrowed(_));
        prop_assert!(borrowed(&info.verb) && borrowed(&info.name));
        prop_assert!(borrowed(&info.field_selector) && borrowed(&info.label_selector));
    }

    #[test]
    fn decode_path_round_trips(s in "\\PC{0,40}") {
        let encoded: String = s.bytes().map(|b| format!("%{b:02X}")).collect();
        prop_assert_eq!(decode_path(&encoded).unwrap(), s.as_str());
        let plain = s.replace('%', "");
        prop_assert!(matches!(decode_path(&plain), Ok(Cow::Borrowed(p)) if p == plain));
    }

    #[test]
    fn selector_parsers_are_total(bytes in prop::collection::vec(any::<u8>(), 0..40)) {
        let _ = is_valid_label_selector(&bytes);
        let _ = field_selector_exact_name(&bytes);
        let _ = check_field_value(&bytes);
    }

    #[test]
    fn selector_grammar_fragments(s in "[a-z0-9 ,=!()<>./\\\\-]{0,30}") {
        let _ = is_valid_label_selector(s.as_bytes());
        if let Ok(Some(r)) = field_selector_exact_name(s.as_bytes()) {
            prop_assert!(s.get(r).is_some());
        }
    }
}
