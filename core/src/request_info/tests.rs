//! Unit tests of the four grammars, mostly tables of upstream behaviour.

use super::field_selector::{field_selector_exact_name, unescape_field_value};
use super::label_selector::is_valid_label_selector;
use super::path::{Segments, is_valid_path_segment_name};
use super::query::{MAX_QUERY_PARAMS, equal_fold_false, lowercases_to_false};
use super::*;
use super::{Invalid, is_go_int64};

/// Expected fields; rows override what they care about.
#[derive(Debug, Clone, Copy)]
struct Want {
    resource_request: bool,
    verb: &'static str,
    prefix: &'static str,
    group: &'static str,
    version: &'static str,
    namespace: &'static str,
    resource: &'static str,
    subresource: &'static str,
    name: &'static str,
    parts: &'static [&'static str],
    field_selector: &'static str,
    label_selector: &'static str,
    error: bool,
}

const NON_RESOURCE: Want = Want {
    resource_request: false,
    verb: "get",
    prefix: "",
    group: "",
    version: "",
    namespace: "",
    resource: "",
    subresource: "",
    name: "",
    parts: &[],
    field_selector: "",
    label_selector: "",
    error: false,
};

const CORE: Want = Want { resource_request: true, prefix: "api", version: "v1", ..NON_RESOURCE };

/// Parses a request target as Go's server would hand it to `NewRequestInfo`.
fn with_info<R>(method: &str, target: &str, check: impl FnOnce(&RequestInfo<'_>) -> R) -> R {
    let (raw_path, query) = split_target(target);
    let path = decode_path(raw_path).unwrap();
    check(&RequestInfo::parse(method, &path, query))
}

fn assert_want(method: &str, target: &str, want: &Want) {
    with_info(method, target, |info| {
        let ctx = format!("{method} {target}: {info:?}");
        assert_eq!(info.is_resource_request, want.resource_request, "resource request, {ctx}");
        assert_eq!(info.verb, want.verb, "verb, {ctx}");
        assert_eq!(info.api_prefix, want.prefix, "prefix, {ctx}");
        assert_eq!(info.api_group, want.group, "group, {ctx}");
        assert_eq!(info.api_version, want.version, "version, {ctx}");
        assert_eq!(info.namespace, want.namespace, "namespace, {ctx}");
        assert_eq!(info.resource, want.resource, "resource, {ctx}");
        assert_eq!(info.subresource, want.subresource, "subresource, {ctx}");
        assert_eq!(info.name, want.name, "name, {ctx}");
        assert_eq!(info.parts().collect::<Vec<_>>(), want.parts, "parts, {ctx}");
        assert_eq!(info.field_selector, want.field_selector, "fieldSelector, {ctx}");
        assert_eq!(info.label_selector, want.label_selector, "labelSelector, {ctx}");
        assert_eq!(info.error.is_some(), want.error, "error, {ctx}");
    });
}

fn assert_rows(rows: &[(&str, &str, Want)]) {
    for (method, url, want) in rows {
        assert_want(method, url, want);
    }
}

/// Upstream's TestGetAPIRequestInfo shapes, as data: api_rows.tsv.
const API_ROWS: &str = include_str!("api_rows.tsv");

#[test]
fn api_request_shapes() {
    let rows: Vec<Vec<&str>> = API_ROWS
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.split('\t').map(|f| if f == "-" { "" } else { f }).collect())
        .collect();
    assert_eq!(rows.len(), 30, "api_rows.tsv: every upstream row");
    for row in &rows {
        let &[method, url, verb, group, version, namespace, resource, subresource, name, parts] =
            row.as_slice()
        else {
            panic!("api_rows.tsv: 10 fields per row: {row:?}");
        };
        // Want holds 'static slices; a test process leaks these few.
        let parts: &'static [&'static str] = parts.split(',').collect::<Vec<_>>().leak();
        let prefix = if url.starts_with("/apis/") { "apis" } else { "api" };
        let want =
            Want { verb, prefix, group, version, namespace, resource, subresource, name, parts, ..CORE };
        assert_want(method, url, &want);
    }
}

#[test]
fn non_resource_paths() {
    // (url, apiPrefix): the prefix sticks for `apis` paths too short to hold a resource.
    let rows: &[(&str, &str)] = &[
        ("", ""),
        ("/", ""),
        ("//", ""),
        ("/api", ""),
        ("/apis", ""),
        ("/api/v1", ""),
        ("/api/v1/", ""),
        ("/api/version/", ""),
        ("/apis/g", ""),
        ("/apis/g/v", "apis"),
        ("/apis/group/version/", "apis"),
        ("/apis/extensions/v1beta1", "apis"),
        ("/apis/extensions/v1beta1/", "apis"),
        ("/apis/version/resource", "apis"),
        ("/badprefix/version/resource", ""),
        ("/not-api/version/resource", ""),
        ("/API/v1/pods", ""),
        ("/healthz", ""),
        ("/openapi/v3/apis/apps/v1", ""),
        ("/livez/etcd", ""),
    ];
    for &(url, prefix) in rows {
        assert_want("GET", url, &Want { prefix, ..NON_RESOURCE });
    }
}

#[test]
fn resource_paths_accepted_by_upstream() {
    for url in [
        "/api/version/resource",
        "/apis/group/version/resource/name/subresource",
        "/api/version/resource/name/subresource",
        "/apis/batch/v1/job",
        "/apis/batch/v1/job/foo",
        "/apis/batch/v1/job/foo/scale",
    ] {
        with_info("GET", url, |info| assert!(info.is_resource_request, "{url}"));
    }
}

#[test]
fn methods_to_verbs() {
    // (method, resource verb, non-resource verb)
    let rows: &[(&str, &str, &str)] = &[
        ("GET", "get", "get"),
        ("HEAD", "get", "head"),
        ("POST", "create", "post"),
        ("PUT", "update", "put"),
        ("PATCH", "patch", "patch"),
        ("DELETE", "delete", "delete"),
        ("OPTIONS", "", "options"),
        ("CONNECT", "", "connect"),
        ("TRACE", "", "trace"),
        ("get", "", "get"),
        ("Post", "", "post"),
        ("PROPFIND", "", "propfind"),
        ("", "", ""),
        ("ÄB", "", "äb"),
        ("\u{130}", "", "i"),
        ("ΣΑΣ", "", "σασ"),
    ];
    for &(method, resource_verb, plain_verb) in rows {
        with_info(method, "/api/v1/pods/p", |info| assert_eq!(info.verb, resource_verb, "{method}"));
        with_info(method, "/healthz", |info| assert_eq!(info.verb, plain_verb, "{method}"));
    }
}

#[test]
    #[rustfmt::skip]
    fn legacy_path_verbs() {
        assert_rows(&[
            ("GET", "/api/v1/watch/namespaces", Want { verb: "watch", resource: "namespaces", parts: &["namespaces"], ..CORE }),
            ("GET", "/api/v1/watch/namespaces/ns", Want { verb: "watch", namespace: "ns", resource: "namespaces", name: "ns", parts: &["namespaces", "ns"], ..CORE }),
            ("GET", "/api/v1/watch/pods/p", Want { verb: "watch", resource: "pods", name: "p", parts: &["pods", "p"], ..CORE }),
            ("GET", "/api/v1/watch/pods/p/status", Want { verb: "watch", resource: "pods", name: "p", subresource: "status", parts: &["pods", "p", "status"], ..CORE }),
            ("GET", "/api/v1/watch/pods?watch=false&fieldSelector=metadata.name=x", Want { verb: "watch", resource: "pods", parts: &["pods"], ..CORE }),
            ("DELETE", "/api/v1/proxy/pods", Want { verb: "proxy", resource: "pods", parts: &["pods"], ..CORE }),
            ("POST", "/api/v1/proxy/nodes/n/some/path", Want { verb: "proxy", resource: "nodes", name: "n", parts: &["nodes", "n", "some", "path"], ..CORE }),
            ("GET", "/apis/g/v/watch/things", Want { verb: "watch", prefix: "apis", group: "g", version: "v", resource: "things", parts: &["things"], ..CORE }),
            // Only the segment right after the version is a verb.
            ("GET", "/api/v1/pods/watch", Want { verb: "get", resource: "pods", name: "watch", parts: &["pods", "watch"], ..CORE }),
            ("GET", "/api/v1/namespaces/ns/watch/pods", Want { verb: "get", namespace: "ns", resource: "watch", name: "pods", parts: &["watch", "pods"], ..CORE }),
        ]);
    }

#[test]
    #[rustfmt::skip]
    fn dangling_path_verb_is_an_error() {
        assert_rows(&[
            ("GET", "/api/v1/watch", Want { error: true, ..CORE }),
            ("GET", "/api/v1/watch/", Want { error: true, ..CORE }),
            ("DELETE", "/api/v1/proxy", Want { error: true, verb: "delete", ..CORE }),
            ("PROPFIND", "/apis/g/v/watch?watch=1", Want { error: true, verb: "propfind", prefix: "apis", group: "g", version: "v", ..CORE }),
        ]);
        let message = |target| with_info("GET", target, |info| info.error.as_ref().map(ToString::to_string));
        let prefix = "unable to determine kind and namespace from url, ";
        assert_eq!(message("/api/v1/watch?x=1"), Some(format!("{prefix}/api/v1/watch?x=1")));
        assert_eq!(message("/api/v1/proxy"), Some(format!("{prefix}/api/v1/proxy")));
    }

#[test]
    #[rustfmt::skip]
    fn namespaces_and_subresources() {
        assert_rows(&[
            ("GET", "/api/v1/namespaces/ns/status", Want { verb: "get", namespace: "ns", resource: "namespaces", name: "ns", subresource: "status", parts: &["namespaces", "ns", "status"], ..CORE }),
            ("GET", "/api/v1/namespaces/ns/status/extra", Want { verb: "get", namespace: "ns", resource: "namespaces", name: "ns", subresource: "status", parts: &["namespaces", "ns", "status", "extra"], ..CORE }),
            ("GET", "/api/v1/namespaces/status", Want { verb: "get", namespace: "status", resource: "namespaces", name: "status", parts: &["namespaces", "status"], ..CORE }),
            ("GET", "/api/v1/namespaces/ns/pods/p/status", Want { verb: "get", namespace: "ns", resource: "pods", name: "p", subresource: "status", parts: &["pods", "p", "status"], ..CORE }),
            ("GET", "/api/v1/namespaces/ns/pods/p/log/extra/segments", Want { verb: "get", namespace: "ns", resource: "pods", name: "p", subresource: "log", parts: &["pods", "p", "log", "extra", "segments"], ..CORE }),
            ("PUT", "/apis/apps/v1/namespaces/ns/deployments/d/scale", Want { verb: "update", prefix: "apis", group: "apps", namespace: "ns", resource: "deployments", name: "d", subresource: "scale", parts: &["deployments", "d", "scale"], ..CORE }),
            ("GET", "/apis/apps/v1/namespaces", Want { verb: "list", prefix: "apis", group: "apps", resource: "namespaces", parts: &["namespaces"], ..CORE }),
            ("GET", "/api/v1/namespaces/ns/namespaces/x", Want { verb: "get", namespace: "ns", resource: "namespaces", name: "x", parts: &["namespaces", "x"], ..CORE }),
            ("GET", "/api/v1/nodes/n/proxy/a/b", Want { verb: "get", resource: "nodes", name: "n", subresource: "proxy", parts: &["nodes", "n", "proxy", "a", "b"], ..CORE }),
        ]);
    }

#[test]
    #[rustfmt::skip]
    fn slashes_are_split_like_go() {
        assert_rows(&[
            ("GET", "//api//v1/pods", Want { verb: "get", version: "", resource: "v1", name: "pods", parts: &["v1", "pods"], ..CORE }),
            ("GET", "/api/v1//pods", Want { verb: "get", resource: "", name: "pods", parts: &["", "pods"], ..CORE }),
            ("GET", "///api/v1/pods///", Want { verb: "list", resource: "pods", parts: &["pods"], ..CORE }),
            // An empty name is no name: a list with a subresource.
            ("GET", "/api/v1/pods//status", Want { verb: "list", resource: "pods", subresource: "status", parts: &["pods", "", "status"], ..CORE }),
            ("GET", "/api/v1/namespaces//pods", Want { verb: "list", namespace: "", resource: "pods", parts: &["pods"], ..CORE }),
            ("GET", "/apis//v1/pods", Want { verb: "list", prefix: "apis", group: "", version: "v1", resource: "pods", parts: &["pods"], ..CORE }),
            // %2F is decoded before splitting, as Go's URL.Path is.
            ("GET", "/api/v1/namespaces/a%2Fb/pods", Want { verb: "get", namespace: "a", resource: "b", name: "pods", parts: &["b", "pods"], ..CORE }),
            ("GET", "/api/v1/pods/a+b", Want { verb: "get", resource: "pods", name: "a+b", parts: &["pods", "a+b"], ..CORE }),
            ("GET", "/api/v1/pods/caf%C3%A9", Want { verb: "get", resource: "pods", name: "café", parts: &["pods", "café"], ..CORE }),
            ("GET", "/api/v1/pods/%FF", Want { verb: "get", resource: "pods", name: "\u{FFFD}", parts: &["pods", "\u{FFFD}"], ..CORE }),
        ]);
    }

#[test]
fn deletecollection() {
    let list = Want { verb: "deletecollection", resource: "pods", parts: &["pods"], ..CORE };
    assert_want("DELETE", "/api/v1/pods", &list);
    assert_want("DELETE", "/api/v1/pods/", &list);
    assert_want(
        "DELETE",
        "/api/v1/pods/p",
        &Want { verb: "delete", name: "p", parts: &["pods", "p"], ..list },
    );
    // A delete never takes its name from the field selector, but records the selectors.
    let url = "/api/v1/pods?fieldSelector=metadata.name=p&labelSelector=a%3Db&watch=1";
    assert_want("DELETE", url, &Want { field_selector: "metadata.name=p", label_selector: "a=b", ..list });
}

/// (query, expected verb) on `GET /api/v1/pods`.
const WATCH_ROWS: &[(&str, &str)] = &[
    ("", "list"),
    ("watch", "watch"),
    ("watch=", "watch"),
    ("watch=true", "watch"),
    ("watch=TRUE", "watch"),
    ("watch=1", "watch"),
    ("watch=0", "list"),
    ("watch=00", "watch"),
    ("watch=false", "list"),
    ("watch=FALSE", "list"),
    ("watch=False", "list"),
    ("watch=no", "watch"),
    ("watch=+0", "watch"),
    ("watch=%30", "list"),
    ("watch=false&watch=true", "list"),
    ("watch=true&watch=false", "watch"),
    ("watch=%zz&watch=0", "list"),
    ("watch=0&watch=%zz", "list"),
    ("wat%63h=1", "watch"),
    ("WATCH=1", "list"),
    ("watch=1;x", "list"),
    ("x;y&watch=1", "watch"),
    ("&&watch=1&&", "watch"),
    ("=1&watch=1", "watch"),
    // Case folding makes the long s an 's' on the normal path...
    ("watch=fal%C5%BFe", "list"),
    // ...but the fallback after a decode error only lowercases.
    ("watch=fal%C5%BFe&limit=x", "watch"),
    ("watch=FALSE&limit=x", "list"),
    ("watch=true&limit=x", "watch"),
    ("watch=0&fieldSelector=bad", "list"),
    ("watch=1&labelSelector=%21%21", "watch"),
];

#[test]
fn watch_parameter() {
    for &(query, verb) in WATCH_ROWS {
        for method in ["GET", "HEAD"] {
            let target = format!("/api/v1/pods?{query}");
            with_info(method, &target, |info| assert_eq!(info.verb, verb, "{method} ?{query}"));
        }
    }
    // A named get ignores ?watch.
    with_info("GET", "/api/v1/pods/p?watch=1", |info| assert_eq!(info.verb, "get"));
}

#[test]
fn query_parameter_limit() {
    let within = format!("watch=1{}", "&".repeat(MAX_QUERY_PARAMS - 1));
    let beyond = format!("watch=1&fieldSelector=a=b{}", "&".repeat(MAX_QUERY_PARAMS - 1));
    with_info("GET", &format!("/api/v1/pods?{within}"), |info| assert_eq!(info.verb, "watch"));
    with_info("GET", &format!("/api/v1/pods?{beyond}"), |info| {
        assert_eq!((&*info.verb, &*info.field_selector), ("list", ""));
    });
}

/// (query, name, verb) on `GET /apis/group/version/resource`.
    #[rustfmt::skip]
    const FIELD_NAME_ROWS: &[(&str, &str, &str)] = &[
        ("fieldSelector=metadata.name=name1", "name1", "list"),
        ("watch=true&fieldSelector=metadata.name=name1", "name1", "watch"),
        ("fieldSelector=foo=bar", "", "list"),
        ("fieldSelector=metadata.name=name1,foo", "", "list"),
        ("fieldSelector=metadata.name=name1,foo&watch=true", "", "watch"),
        ("fieldSelector=metadata.name=name1,foo&watch=false", "", "list"),
        ("fieldSelector=metadata.name=foo&fieldSelector=metadata.name=bar", "foo", "list"),
        ("fieldSelector=metadata.name==foo", "foo", "list"),
        ("fieldSelector=metadata.name!=foo", "", "list"),
        ("fieldSelector=metadata.name=foo,spec.nodeName=n", "foo", "list"),
        ("fieldSelector=spec.nodeName!=n,metadata.name=foo", "foo", "list"),
        ("fieldSelector=,metadata.name=foo,", "foo", "list"),
        // Go sorts the raw terms and takes the first match: "=a" < "=b", and "==" < "=a".
        ("fieldSelector=metadata.name=b,metadata.name=a", "a", "list"),
        ("fieldSelector=metadata.name=a,metadata.name==b", "b", "list"),
        ("fieldSelector=metadata.name=foo%2Cmetadata.name%3D%3Dbar", "bar", "list"),
        ("fieldSelector=metadata.name%3Dfoo", "foo", "list"),
        ("fieldSelector=metadata.name=a\\,b", "a,b", "list"),
        ("fieldSelector=metadata.name=a%5C%2Cb", "a,b", "list"),
        ("fieldSelector=metadata.name=a\\\\b", "a\\b", "list"),
        ("fieldSelector=metadata.name=a\\=b", "a=b", "list"),
        ("fieldSelector=metadata.name=a\\x", "", "list"),
        ("fieldSelector=metadata.name=a\\", "", "list"),
        ("fieldSelector=metadata.name=a=b", "", "list"),
        ("fieldSelector=metadata.name===a", "", "list"),
        ("fieldSelector=metadata.name", "", "list"),
        ("fieldSelector=metadata.name=a%2Fb", "", "list"),
        ("fieldSelector=metadata.name=a%25b", "", "list"),
        ("fieldSelector=metadata.name=.", "", "list"),
        ("fieldSelector=metadata.name=..", "", "list"),
        ("fieldSelector=metadata.name=...", "...", "list"),
        ("fieldSelector=metadata.name=", "", "list"),
        ("fieldSelector=metadata.name=a+b", "a b", "list"),
        ("fieldSelector=+metadata.name=foo", "", "list"),
        ("fieldSelector=metadata.name=caf%C3%A9", "café", "list"),
        ("fieldSelector=metadata.name!foo", "", "list"),
        ("fieldSelector=metadata.name=foo&fieldSelector=metadata.name=a=b", "foo", "list"),
        ("fieldSelector=metadata.name=%zz&fieldSelector=metadata.name=foo", "foo", "list"),
        // Any parameter that fails to decode loses the name.
        ("fieldSelector=metadata.name=foo&labelSelector=!!", "", "list"),
        ("fieldSelector=metadata.name=foo&labelSelector=a%3Db", "foo", "list"),
        ("fieldSelector=metadata.name=foo&limit=10", "foo", "list"),
        ("fieldSelector=metadata.name=foo&limit=-1", "foo", "list"),
        ("fieldSelector=metadata.name=foo&limit=%2B5", "foo", "list"),
        ("fieldSelector=metadata.name=foo&limit=9223372036854775807", "foo", "list"),
        ("fieldSelector=metadata.name=foo&limit=9223372036854775808", "", "list"),
        ("fieldSelector=metadata.name=foo&limit=-9223372036854775808", "foo", "list"),
        ("fieldSelector=metadata.name=foo&limit=abc", "", "list"),
        ("fieldSelector=metadata.name=foo&limit=", "", "list"),
        ("fieldSelector=metadata.name=foo&limit=1_000", "", "list"),
        ("fieldSelector=metadata.name=foo&limit=10&limit=x", "foo", "list"),
        ("fieldSelector=metadata.name=foo&timeoutSeconds=30", "foo", "list"),
        ("fieldSelector=metadata.name=foo&timeoutSeconds=", "", "list"),
        ("fieldSelector=metadata.name=foo&timeoutSeconds=1.5&watch=1", "", "watch"),
        ("fieldSelector=metadata.name=foo&resourceVersion=x&continue=y&resourceVersionMatch=z", "foo", "list"),
        ("fieldSelector=metadata.name=foo&sendInitialEvents=maybe&allowWatchBookmarks=x", "foo", "list"),
    ];

#[test]
fn field_selector_names() {
    for &(query, name, verb) in FIELD_NAME_ROWS {
        with_info("GET", &format!("/apis/group/version/resource?{query}"), |info| {
            assert_eq!((&*info.name, &*info.verb), (name, verb), "?{query}");
            assert_eq!(info.parts().collect::<Vec<_>>(), ["resource"], "?{query}");
        });
    }
}

/// (method, url, name, verb, fieldSelector, labelSelector): upstream's TestSelectorParsing
    /// shapes, then more.
    #[rustfmt::skip]
    const SELECTOR_ROWS: &[(&str, &str, &str, &str, &str, &str)] = &[
        ("GET", "/apis/group/version/resource", "", "list", "", ""),
        ("GET", "/apis/group/version/resource?fieldSelector=metadata.name=name1", "name1", "list", "metadata.name=name1", ""),
        ("GET", "/apis/group/version/resource?watch=true&fieldSelector=metadata.name=name1", "name1", "watch", "metadata.name=name1", ""),
        ("GET", "/apis/group/version/resource?fieldSelector=foo=bar&labelSelector=baz=qux", "", "list", "foo=bar", "baz=qux"),
        ("GET", "/apis/group/version/resource?fieldSelector=metadata.name=name1,foo", "", "list", "metadata.name=name1,foo", ""),
        ("GET", "/apis/group/version/resource?fieldSelector=metadata.name=name1,foo&watch=true", "", "watch", "metadata.name=name1,foo", ""),
        ("GET", "/apis/group/version/resource?fieldSelector=metadata.name=name1,foo&watch=false", "", "list", "metadata.name=name1,foo", ""),
        ("DELETE", "/apis/group/version/resource?fieldSelector=foo=bar&labelSelector=baz=qux", "", "deletecollection", "foo=bar", "baz=qux"),
        ("GET", "/apis/group/version/resource?fieldSelector=metadata.name=foo&fieldSelector=metadata.name=bar&labelSelector=foo=bar&labelSelector=foo=baz", "foo", "list", "metadata.name=foo", "foo=bar"),
        ("GET", "/apis/group/version/resource/name?fieldSelector=foo=bar&labelSelector=foo=bar", "name", "get", "", ""),
        ("GET", "/apis/group/version/watch/resource?fieldSelector=metadata.name=foo&labelSelector=foo=bar", "", "watch", "", ""),
        ("GET", "/apis/group/version/watch/resource/name?fieldSelector=metadata.name=foo&labelSelector=foo=bar", "name", "watch", "", ""),
        // Recorded unescaped, and even when they do not parse.
        ("GET", "/api/v1/pods?labelSelector=app+in+%28a%2Cb%29", "", "list", "", "app in (a,b)"),
        ("GET", "/api/v1/pods?labelSelector=!!&fieldSelector=x", "", "list", "x", "!!"),
        ("GET", "/api/v1/pods?fieldSelector=&labelSelector=", "", "list", "", ""),
        ("GET", "/api/v1/pods?fieldSelector=%FF", "", "list", "\u{FFFD}", ""),
        ("GET", "/api/v1/pods?fieldSelector=a%3Db&fieldSelector=c", "", "list", "a=b", ""),
        ("GET", "/api/v1/pods?fieldSelector;=a&fieldSelector=c", "", "list", "c", ""),
        ("POST", "/api/v1/pods?fieldSelector=a=b&labelSelector=c", "", "create", "", ""),
        ("PUT", "/api/v1/pods/p?fieldSelector=a=b", "p", "update", "", ""),
        ("DELETE", "/api/v1/pods/p?fieldSelector=a=b", "p", "delete", "", ""),
        ("GET", "/api/v1/proxy/pods/p?fieldSelector=a=b", "p", "proxy", "", ""),
        ("OPTIONS", "/api/v1/pods?fieldSelector=a=b", "", "", "", ""),
    ];

#[test]
fn selectors_are_recorded() {
    for &(method, url, name, verb, field, label) in SELECTOR_ROWS {
        with_info(method, url, |info| {
            let got = (&*info.name, &*info.verb, &*info.field_selector, &*info.label_selector);
            assert_eq!(got, (name, verb, field, label), "{method} {url}");
            assert!(info.error.is_none(), "{method} {url}");
        });
    }
}

#[rustfmt::skip]
    const VALID_LABEL_SELECTORS: &[&[u8]] = &[
        b"", b"   ", b"a", b"a=b", b"a==b", b"a!=b", b"a=", b"a==", b" a = b ", b"a=b,c!=d,e",
        b"a in (b,c)", b"a notin (b)", b"a in ()", b"a in (,)", b"a in (b,)", b"a in (,b)", b"a in (b,,c)",
        b"a in(b)", b"x in (in)", b"in", b"notin=x", b"in in (notin)", b"!a", b"! a", b"!a,b", b"a>1",
        b"a<10", b"a>0", b"a>007", b"example.com/a=b", b"a.b-c_d=E.f-G_h", b"k8s.io/app-name", b"a=b\t",
        b"A=B", b"a=9223372036854775807", b"a>9223372036854775807",
        // Go's lexer reads a NUL as the end of input where a token would start, and swallows a
        // NUL right after a token.
        b"\0garbage", b"a=b\0\0!!!", b"a\0", b"a,b\0\0,", b"a \0!", b"a,\0b",
    ];

#[rustfmt::skip]
    const INVALID_LABEL_SELECTORS: &[&[u8]] = &[
        b",", b"a,", b",a", b"!", b"!!a", b"!a=b", b"!a in (b)", b"a=b=c", b"a b", b"a in", b"a in b",
        b"a in (b", b"a in (b c)", b"a in ((b))", b"a notin", b"a>", b"a>b", b"a>-1", b"a<+1",
        b"a>9223372036854775808", b"a=>b", b"a<=1", b"a>=1", b"-a", b"a-", b"_a", b"a/b/c", b"/a", b"a/",
        b"A.B/c", b"a..b/c", b"-a.com/c", b"a=b c", b"(a)", b"a=(b)", b"a=-b", b"a=b-", b"a!b", b"a=b\tc",
        b"a=\xC3\xA9", b"\xC3\xA9", b"a==b==c", b"a=,", b"a in (b),", b")", b"a=!", b"a in (!)",
        b"a=b\0!!!", b"a,b\0,", b"a,\0\0b",
    ];

#[test]
fn label_selector_grammar() {
    for s in VALID_LABEL_SELECTORS {
        assert!(is_valid_label_selector(s), "should parse: {:?}", String::from_utf8_lossy(s));
    }
    for s in INVALID_LABEL_SELECTORS {
        assert!(!is_valid_label_selector(s), "should not parse: {:?}", String::from_utf8_lossy(s));
    }
    let name63 = "a".repeat(63);
    let value63 = "b".repeat(63);
    let prefix253 = format!("{}.{}", "p".repeat(126), "q".repeat(126));
    assert!(is_valid_label_selector(format!("{name63}={value63}").as_bytes()));
    assert!(is_valid_label_selector(format!("{prefix253}/{name63}").as_bytes()));
    assert!(!is_valid_label_selector(format!("{name63}a").as_bytes()));
    assert!(!is_valid_label_selector(format!("a={value63}b").as_bytes()));
    assert!(!is_valid_label_selector(format!("a in (x,{value63}b)").as_bytes()));
    assert!(!is_valid_label_selector(format!("{prefix253}p/a").as_bytes()));
}

#[test]
fn field_selector_grammar() {
    let name = |s: &str| {
        field_selector_exact_name(s.as_bytes()).map(|r| r.and_then(|r| s.get(r)).map(str::to_owned))
    };
    assert_eq!(name(""), Ok(None));
    assert_eq!(name(","), Ok(None));
    assert_eq!(name("a=b"), Ok(None));
    assert_eq!(name("=b"), Ok(None));
    assert_eq!(name("="), Ok(None));
    assert_eq!(name("metadata.name=x"), Ok(Some("x".into())));
    assert_eq!(name("metadata.name=x\\,y"), Ok(Some("x\\,y".into())));
    assert_eq!(name("a!b=c,metadata.name==x"), Ok(Some("x".into())));
    assert_eq!(name("metadata.name!==x"), Err(Invalid));
    assert_eq!(name("metadata.name=x,"), Ok(Some("x".into())));
    assert_eq!(name("a"), Err(Invalid));
    assert_eq!(name("a!b"), Err(Invalid));
    assert_eq!(name("a=\\"), Err(Invalid));
    assert_eq!(name("a=\\\\\\"), Err(Invalid));
    assert_eq!(name("a=\\é"), Err(Invalid));
    assert_eq!(name("a=b\\,c=d"), Err(Invalid));
    assert_eq!(name("a=b\\,c\\=d"), Ok(None));
    assert_eq!(unescape_field_value(b"a\\\\\\,b\\="), Cow::Borrowed(b"a\\,b=".as_slice()));
    assert!(matches!(unescape_field_value(b"plain"), Cow::Borrowed(_)));
}

#[test]
fn path_decoding() {
    assert_eq!(decode_path("/api/v1/pods").unwrap(), "/api/v1/pods");
    assert!(matches!(decode_path("/api/v1/a+b").unwrap(), Cow::Borrowed("/api/v1/a+b")));
    assert_eq!(decode_path("/a%2Fb%2fc").unwrap(), "/a/b/c");
    assert_eq!(decode_path("%41%42").unwrap(), "AB");
    assert_eq!(decode_path("/caf%C3%A9").unwrap(), "/café");
    assert_eq!(decode_path("/%FF%FE").unwrap(), "/\u{FFFD}\u{FFFD}");
    assert_eq!(decode_path("/é").unwrap(), "/é");
    let bad =
        [("/%zz", "%zz"), ("/%4", "%4"), ("%", "%"), ("/a%2", "%2"), ("/%g1x", "%g1"), ("/%%41", "%%4")];
    for (raw, seq) in bad {
        let err = decode_path(raw).unwrap_err();
        assert_eq!(err.to_string(), format!("invalid URL escape {seq:?}"), "{raw}");
    }
}

#[test]
fn target_splitting() {
    assert_eq!(split_target("/a?b=c"), ("/a", "b=c"));
    assert_eq!(split_target("/a"), ("/a", ""));
    assert_eq!(split_target("/a?"), ("/a", ""));
    assert_eq!(split_target("/a?b?c"), ("/a", "b?c"));
    assert_eq!(split_target("?x"), ("", "x"));
    assert_eq!(split_target(""), ("", ""));
}

#[test]
    #[rustfmt::skip]
    fn json_shape() {
        let json = |method, target| with_info(method, target, |info| serde_json::to_string(info).unwrap());
        assert_eq!(
            json("GET", "/apis/apps/v1/namespaces/ns/deployments?fieldSelector=metadata.name%3Dd&labelSelector=a"),
            r#"{"isResourceRequest":true,"path":"/apis/apps/v1/namespaces/ns/deployments","verb":"list","apiPrefix":"apis","apiGroup":"apps","apiVersion":"v1","namespace":"ns","resource":"deployments","subresource":"","name":"d","parts":["deployments"],"fieldSelector":"metadata.name=d","labelSelector":"a"}"#
        );
        assert_eq!(
            json("GET", "/healthz"),
            r#"{"isResourceRequest":false,"path":"/healthz","verb":"get","apiPrefix":"","apiGroup":"","apiVersion":"","namespace":"","resource":"","subresource":"","name":"","parts":[],"fieldSelector":"","labelSelector":""}"#
        );
        assert_eq!(
            json("GET", "/api/v1/watch"),
            r#"{"isResourceRequest":true,"path":"/api/v1/watch","verb":"get","apiPrefix":"api","apiGroup":"","apiVersion":"v1","namespace":"","resource":"","subresource":"","name":"","parts":[],"fieldSelector":"","labelSelector":"","error":"unable to determine kind and namespace from url, /api/v1/watch"}"#
        );
    }

#[test]
fn common_requests_borrow() {
    let targets = [
        ("GET", "/api/v1/namespaces/ns/pods?watch=1&fieldSelector=metadata.name=p&labelSelector=a=b&limit=5"),
        ("DELETE", "/apis/apps/v1/namespaces/ns/deployments?labelSelector=x"),
        ("PATCH", "/api/v1/nodes/n/status"),
        ("GET", "/healthz"),
        ("PROPFIND", "/api/v1/pods"),
        ("custom", "/metrics"),
    ];
    for (method, target) in targets {
        with_info(method, target, |info| {
            let borrowed = |c: &Cow<'_, str>| matches!(c, Cow::Borrowed(_));
            assert!(borrowed(&info.verb) && borrowed(&info.name), "{method} {target}");
            assert!(borrowed(&info.field_selector) && borrowed(&info.label_selector), "{method} {target}");
        });
    }
    with_info("GET", "/api/v1/pods?fieldSelector=metadata.name=p", |info| assert_eq!(info.name, "p"));
}

#[test]
fn helper_edge_cases() {
    assert!(equal_fold_false(b"FaLsE"));
    assert!(equal_fold_false("fal\u{17F}e".as_bytes()));
    assert!(!equal_fold_false(b"fals"));
    assert!(!equal_fold_false(b"falsee"));
    assert!(!equal_fold_false(b""));
    assert!(!lowercases_to_false("fal\u{17F}e".as_bytes()));
    assert!(is_go_int64(b"-0") && is_go_int64(b"+12") && is_go_int64(b"007"));
    for bad in [&b""[..], b"+", b"-", b" 1", b"0x1", b"1 "] {
        assert!(!is_go_int64(bad), "{bad:?}");
    }
    assert!(is_valid_path_segment_name("a.b") && is_valid_path_segment_name(""));
    for bad in [".", "..", "a/b", "%", "a%20"] {
        assert!(!is_valid_path_segment_name(bad), "{bad}");
    }
    assert_eq!(Segments("a//b").iter().collect::<Vec<_>>(), ["a", "", "b"]);
    assert_eq!(Segments("").iter().count(), 0);
    assert!(Segments("a/b").has(2) && !Segments("a/b").has(3) && Segments("").has(0));
    assert_eq!(Segments("a/b/c").skip(2).0, "c");
    assert_eq!(Segments("a/b/c").skip(5).0, "");
}

#[test]
fn send_initial_events_whatever_its_value() {
    for query in [
        "sendInitialEvents=true",
        "watch=1&sendInitialEvents=false",
        "sendInitialEvents",
        "sendInitialEvents=",
        "send%49nitialEvents=true",
    ] {
        assert!(has_send_initial_events(query), "{query}");
    }
    for query in
        ["", "watch=1", "sendInitialEvents=true;x", "sendInitialEvents=%zz", "xsendInitialEvents=true"]
    {
        assert!(!has_send_initial_events(query), "{query}");
    }
}
