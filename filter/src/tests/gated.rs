//! Writes whose body decides where they go: fields some apiservers drop or refuse while a
//! feature gate is off ([`skewgate_core::features::GATED`]).

use proxy_wasm::traits::{HttpContext, RootContext};
use proxy_wasm::types::Action;
use serde_json::{Value, json};

use super::{configured, sample};
use crate::host::fake::Fake;
use crate::root::Root;

const CLAIMS: &str = "/api/v1/namespaces/ns/persistentvolumeclaims";
const SETS_IT: &[u8] = br#"{"kind":"PersistentVolumeClaim","spec":{"volumeAttributesClassName":"gold"}}"#;
const LEAVES_IT: &[u8] = br#"{"kind":"PersistentVolumeClaim","spec":{"storageClassName":"standard"}}"#;

/// The sample with b at 1.33's defaults (VolumeAttributesClass off), a and c with it on, all
/// three serving PersistentVolumeClaims.
fn skewed() -> Value {
    let mut table = sample();
    table["apiservers"][1]["features"] = json!({"VolumeAttributesClass": false});
    table["groupVersions"][0]["resources"]["persistentvolumeclaims"] = json!(["a", "b", "c"]);
    table["sets"].as_array_mut().unwrap().push(json!({"cluster": "set-a-c", "members": ["a", "c"]}));
    table
}

fn write(
    fake: &Fake,
    root: &Root<Fake>,
    method: &str,
    path: &str,
    content_type: &str,
) -> Box<dyn HttpContext> {
    let headers =
        [(":method", method), (":path", path), ("authorization", "Bearer t"), ("content-type", content_type)];
    fake.request(&headers);
    root.create_http_context(1).expect("an HTTP context")
}

/// Envoy hands the body over in `pieces`; the filter's answer to each.
fn send_body(fake: &Fake, http: &mut Box<dyn HttpContext>, body: &[u8], pieces: usize) -> Vec<Action> {
    let size = body.len().div_ceil(pieces);
    let chunks: Vec<&[u8]> = body.chunks(size).collect();
    let last = chunks.len() - 1;
    chunks
        .into_iter()
        .enumerate()
        .map(|(i, chunk)| {
            fake.request_chunk(chunk);
            let buffered = fake.state().request_body.len();
            http.on_http_request_body(buffered, i == last)
        })
        .collect()
}

fn gated(fake: &Fake, outcome: &str) -> u64 {
    fake.counter(&format!("skewgate.gated_writes_total.outcome={outcome};"))
}

#[test]
fn a_write_that_sets_a_gated_field_goes_to_the_apiservers_with_the_gate() {
    let (fake, root) = configured(&skewed());
    for (method, path) in [("POST", CLAIMS.to_owned()), ("PUT", format!("{CLAIMS}/c1"))] {
        let mut http = write(&fake, &root, method, &path, "application/json");
        assert_eq!(http.on_http_request_headers(0, false), Action::Pause, "waits for its body");
        assert_eq!(send_body(&fake, &mut http, SETS_IT, 3), [Action::Pause, Action::Pause, Action::Continue]);
        assert_eq!(fake.header("x-skewgate-cluster"), ["set-a-c"], "{method}");
        assert_eq!(fake.header("x-kubernetes-peer-proxied"), ["true"]);
        assert_eq!(fake.header("authorization"), ["Bearer t"]);
        assert!(fake.reply().is_none());
    }
    assert_eq!(gated(&fake, "narrowed"), 2);
}

#[test]
fn a_write_that_leaves_the_fields_alone_goes_where_it_was_routed() {
    let (fake, root) = configured(&skewed());
    let patch = format!("{CLAIMS}/c1");
    for (method, path, content_type, body) in [
        ("POST", CLAIMS, "application/json", LEAVES_IT),
        ("PATCH", &patch, "application/merge-patch+json", br#"{"metadata":{"labels":{"a":"b"}}}"#),
        (
            "PATCH",
            &patch,
            "application/json-patch+json",
            br#"[{"op":"remove","path":"/spec/volumeAttributesClassName"}]"#,
        ),
    ] {
        let mut http = write(&fake, &root, method, path, content_type);
        assert_eq!(http.on_http_request_headers(0, false), Action::Pause);
        assert_eq!(send_body(&fake, &mut http, body, 1), [Action::Continue]);
        assert_eq!(fake.header("x-skewgate-cluster"), ["pool"], "{method} {content_type}");
        assert!(fake.header("x-kubernetes-peer-proxied").is_empty());
    }
    assert_eq!(gated(&fake, "as_routed"), 3);
}

#[test]
fn a_protobuf_write_is_read_too() {
    let (fake, root) = configured(&skewed());
    let claim = |class: Option<&str>| {
        skewgate_core::envelope::seal("v1", "PersistentVolumeClaim", 64, |object| {
            object.message(1, |m| m.string(1, "c1"));
            object.message(2, |s| {
                s.string(5, "standard");
                if let Some(class) = class {
                    s.string(9, class);
                }
            });
        })
    };
    for (class, cluster) in [(Some("gold"), "set-a-c"), (None, "pool")] {
        let mut http = write(&fake, &root, "POST", CLAIMS, "application/vnd.kubernetes.protobuf");
        assert_eq!(http.on_http_request_headers(0, false), Action::Pause);
        assert_eq!(send_body(&fake, &mut http, &claim(class), 2), [Action::Pause, Action::Continue]);
        assert_eq!(fake.header("x-skewgate-cluster"), [cluster], "{class:?}");
    }
}

#[test]
fn what_is_not_read_goes_to_the_apiservers_that_keep_every_field() {
    let (fake, root) = configured(&skewed());
    // Too long to read: sent on at once, unread, where nothing it carries is dropped.
    let mut http = write(&fake, &root, "POST", CLAIMS, "application/json");
    assert_eq!(http.on_http_request_headers(0, false), Action::Pause);
    assert_eq!(http.on_http_request_body(256 * 1024, false), Action::Pause);
    assert_eq!(http.on_http_request_body(256 * 1024 + 1, false), Action::Continue);
    assert_eq!(fake.header("x-skewgate-cluster"), ["set-a-c"]);
    assert_eq!(http.on_http_request_body(300 * 1024, true), Action::Continue, "the rest follows");
    // Compressed.
    let headers = [
        (":method", "POST"),
        (":path", CLAIMS),
        ("authorization", "Bearer t"),
        ("content-type", "application/json"),
        ("content-encoding", "gzip"),
    ];
    fake.request(&headers);
    let mut http = root.create_http_context(2).unwrap();
    assert_eq!(http.on_http_request_headers(0, false), Action::Pause);
    assert_eq!(send_body(&fake, &mut http, LEAVES_IT, 1), [Action::Continue]);
    assert_eq!(fake.header("x-skewgate-cluster"), ["set-a-c"]);
    assert_eq!((gated(&fake, "unread"), gated(&fake, "narrowed")), (1, 1));
    // A body Envoy does not hand over: as setting every field.
    let mut http = write(&fake, &root, "POST", CLAIMS, "application/json");
    assert_eq!(http.on_http_request_headers(0, false), Action::Pause);
    assert_eq!(http.on_http_request_body(40, true), Action::Continue);
    assert_eq!(fake.header("x-skewgate-cluster"), ["set-a-c"]);
    // An empty one sets nothing.
    let mut http = write(&fake, &root, "POST", CLAIMS, "application/json");
    assert_eq!(http.on_http_request_headers(0, false), Action::Pause);
    assert_eq!(http.on_http_request_body(0, true), Action::Continue);
    assert_eq!(fake.header("x-skewgate-cluster"), ["pool"]);
}

#[test]
fn reads_bodiless_writes_and_other_resources_are_not_held_for_a_body() {
    let (fake, root) = configured(&skewed());
    let mut http = write(&fake, &root, "POST", CLAIMS, "application/json");
    assert_eq!(http.on_http_request_headers(0, true), Action::Continue, "no body: nothing set");
    assert_eq!(fake.header("x-skewgate-cluster"), ["pool"]);
    let mut http = write(&fake, &root, "POST", "/api/v1/namespaces/ns/configmaps", "application/json");
    assert_eq!(http.on_http_request_headers(0, false), Action::Continue);
    assert_eq!(http.on_http_request_body(10, true), Action::Continue);
    // Every apiserver has the gate: nothing to read.
    let mut even = skewed();
    even["apiservers"][1]["features"] = json!({"VolumeAttributesClass": true});
    let (fake, root) = configured(&even);
    let mut http = write(&fake, &root, "POST", CLAIMS, "application/json");
    assert_eq!(http.on_http_request_headers(0, false), Action::Continue);
    assert_eq!(fake.header("x-skewgate-cluster"), ["pool"]);
}

/// The apiservers with the gate are down: the write waits for them with its body, as any
/// request for a cluster found down ([`crate::hold`]), and is never sent to b instead.
#[test]
fn a_gated_write_waits_for_its_apiservers_when_they_are_down() {
    let (fake, root) = configured(&skewed());
    let mut first = write(&fake, &root, "POST", CLAIMS, "application/json");
    first.on_http_request_headers(0, false);
    send_body(&fake, &mut first, SETS_IT, 1);
    fake.respond(&[(":status", "503")]);
    fake.set_property(&["response", "code_details"], "no_healthy_upstream");
    fake.set_property(&["xds", "cluster_name"], "set-a-c");
    assert_eq!(first.on_http_response_headers(0, true), Action::Pause, "rewritten to a Status");

    fake.request(&[
        (":method", "POST"),
        (":path", CLAIMS),
        ("authorization", "Bearer t"),
        ("content-type", "application/json"),
    ]);
    let mut second = root.create_http_context(2).unwrap();
    assert_eq!(second.on_http_request_headers(0, false), Action::Pause);
    assert_eq!(send_body(&fake, &mut second, SETS_IT, 1), [Action::Pause], "held with its body");
    assert_eq!(fake.header("x-skewgate-cluster"), ["set-a-c"]);
    // One that sets nothing gated goes to the pool, which is up.
    fake.request(&[
        (":method", "POST"),
        (":path", CLAIMS),
        ("authorization", "Bearer t"),
        ("content-type", "application/json"),
    ]);
    let mut third = root.create_http_context(3).unwrap();
    assert_eq!(third.on_http_request_headers(0, false), Action::Pause);
    assert_eq!(send_body(&fake, &mut third, LEAVES_IT, 1), [Action::Continue]);
    assert_eq!(fake.header("x-skewgate-cluster"), ["pool"]);
}
