//! `skewgate explain` as a user runs it, against the example table of a mid-upgrade control plane
//! (a and b on the 1.33 era, c on the 1.36 era; `envoy-config/examples/table.json`).

// Helpers outside #[test] functions count as production code to clippy; here a panic is how a
// test fails.
#![allow(clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{Value, json};

const TABLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../envoy-config/examples/table.json");
const V2_ACCEPT: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

fn run(table: &Path, args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_skewgate"));
    command.arg("explain").arg("--table").arg(table).args(args);
    match command.output() {
        Ok(output) => output,
        Err(e) => panic!("cannot run skewgate: {e}"),
    }
}

/// The one JSON object `explain` prints for a request against the example table.
fn explain(args: &[&str]) -> Value {
    explain_with(Path::new(TABLE), args)
}

fn explain_with(table: &Path, args: &[&str]) -> Value {
    let output = run(table, args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{args:?}: {:?}\n{stderr}", output.status);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(stdout.lines().count(), 1, "one line of JSON: {stdout}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {stdout}"))
}

/// A file under cargo's per-test-target scratch directory, named after the test.
fn scratch(name: &str, contents: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("explain-{name}"));
    if let Err(e) = std::fs::write(&path, contents) {
        panic!("cannot write {}: {e}", path.display());
    }
    path
}

fn set_headers(v: &Value) -> Vec<(String, String)> {
    v["requestHeaders"]["set"]
        .as_array()
        .map(|pairs| {
            pairs
                .iter()
                .map(|p| (p[0].as_str().unwrap_or("").to_owned(), p[1].as_str().unwrap_or("").to_owned()))
                .collect()
        })
        .unwrap_or_default()
}

fn has_header(v: &Value, name: &str, value: &str) -> bool {
    set_headers(v).iter().any(|(n, val)| n == name && val == value)
}

/// The table's merged-discovery ETag, quoted as the `ETag` header carries it.
fn quoted_etag() -> String {
    let v = explain(&["--accept", V2_ACCEPT, "GET", "/apis"]);
    let etag = v["composed"]["responseHeaders"]["etag"].as_str().unwrap_or_default().to_owned();
    assert!(etag.starts_with('"') && etag.ends_with('"') && etag.len() == 130, "{etag}");
    etag
}

#[test]
fn resource_only_the_new_apiserver_serves_is_rerouted_to_it() {
    let v = explain(&["GET", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/claim-1"]);
    assert_eq!(v["action"], "route");
    assert_eq!(v["cluster"], "skewgate-set-c");
    assert_eq!(v["rerouted"], true);
    assert_eq!(v["longRunning"], false);
    assert_eq!(v["servingSet"], json!(["c"]));
    assert!(has_header(&v, "x-skewgate-cluster", "skewgate-set-c"));
    assert!(has_header(&v, "x-kubernetes-peer-proxied", "true"));
    assert!(v["reason"].as_str().unwrap_or_default().contains("subset"), "{v}");
}

#[test]
fn resource_only_the_old_apiservers_serve_goes_to_them() {
    let v = explain(&["GET", "/apis/resource.k8s.io/v1alpha3/deviceclasses"]);
    assert_eq!(v["cluster"], "skewgate-set-a_b");
    assert_eq!(v["servingSet"], json!(["a", "b"]));
    assert_eq!(v["rerouted"], true);
    let v = explain(&["DELETE", "/apis/networking.k8s.io/v1beta1/ipaddresses/10.0.0.1"]);
    assert_eq!(v["cluster"], "skewgate-set-a_b");
}

#[test]
fn resource_everyone_serves_goes_to_the_pool() {
    let v = explain(&["GET", "/api/v1/namespaces/default/pods/web-0"]);
    assert_eq!(v["action"], "route");
    assert_eq!(v["cluster"], "skewgate-pool");
    assert_eq!(v["rerouted"], false);
    assert_eq!(v["servingSet"], json!(["a", "b", "c"]));
    assert!(has_header(&v, "x-skewgate-cluster", "skewgate-pool"));
    assert!(!has_header(&v, "x-kubernetes-peer-proxied", "true"));
}

#[test]
fn unknown_resource_goes_to_the_pool_with_nobody_serving() {
    let v = explain(&["GET", "/apis/example.com/v1/widgets"]);
    assert_eq!(v["cluster"], "skewgate-pool");
    assert_eq!(v["servingSet"], json!([]));
    assert_eq!(v["rerouted"], false);
}

#[test]
fn watch_is_long_running() {
    let v = explain(&["GET", "/apis/resource.k8s.io/v1/resourceclaims?watch=true"]);
    assert_eq!(v["longRunning"], true);
    assert_eq!(v["cluster"], "skewgate-set-c");
    assert_eq!(v["requestInfo"]["verb"], "watch");
    assert!(has_header(&v, "x-skewgate-route", "long-running"));
    let v = explain(&["GET", "/api/v1/namespaces/default/pods"]);
    assert_eq!(v["longRunning"], false);
    let set = v["requestHeaders"]["set"].as_array().cloned().unwrap_or_default();
    assert!(!set.iter().any(|h| h[0] == "x-skewgate-route"), "{v}");
}

#[test]
fn aggregated_discovery_is_answered_with_the_merged_document() {
    let v = explain(&["--accept", V2_ACCEPT, "GET", "/apis"]);
    // An apiserver authorizes the request first; only its 2xx/304 is replaced.
    assert_eq!(v["action"], "route");
    assert_eq!(v["cluster"], "skewgate-pool");
    let composed = &v["composed"];
    assert_eq!(composed["status"], 200);
    let headers = &composed["responseHeaders"];
    assert_eq!(headers["content-type"], V2_ACCEPT);
    assert_eq!(headers["vary"], "Accept");
    assert_eq!(headers["cache-control"], "public");
    let body = composed["body"].as_str().unwrap_or_default();
    assert!(body.starts_with("peer-aggregated APIGroupDiscoveryList, 23 groups"), "{body}");
    quoted_etag();
}

#[test]
fn matching_if_none_match_gets_304() {
    let etag = quoted_etag();
    let header = format!("If-None-Match: {etag}");
    let v = explain(&["--accept", V2_ACCEPT, "--header", &header, "GET", "/apis"]);
    assert_eq!(v["action"], "route");
    // The apiserver must not answer 304 for its own document's ETag: the header stays home.
    assert_eq!(v["requestHeaders"]["remove"], serde_json::json!(["if-none-match"]));
    let composed = &v["composed"];
    assert_eq!(composed["status"], 304);
    assert_eq!(composed["body"], "(empty)");
    assert_eq!(composed["responseHeaders"]["etag"], etag.as_str());
    assert!(composed["responseHeaders"].get("content-type").is_none(), "{v}");
    let v = explain(&["--accept", V2_ACCEPT, "--header", "If-None-Match: \"0BAD\"", "GET", "/apis"]);
    assert_eq!(v["composed"]["status"], 200);
}

#[test]
fn nopeer_and_legacy_discovery_go_to_the_pool() {
    let nopeer = format!("{V2_ACCEPT};profile=nopeer");
    for accept in [nopeer.as_str(), "application/json"] {
        let v = explain(&["--accept", accept, "GET", "/apis"]);
        assert_eq!(v["action"], "route", "{accept}");
        assert_eq!(v["cluster"], "skewgate-pool", "{accept}");
        assert_eq!(v["rerouted"], false);
    }
}

#[test]
fn legacy_group_discovery_and_openapi_follow_the_group() {
    let v = explain(&["GET", "/apis/lifecycle.k8s.io"]);
    assert_eq!(v["cluster"], "skewgate-set-c");
    let v = explain(&["GET", "/apis/resource.k8s.io/v1"]);
    assert_eq!(v["cluster"], "skewgate-set-c");
    let v = explain(&["GET", "/apis/resource.k8s.io"]);
    assert_eq!(v["cluster"], "skewgate-pool");
    let v = explain(&["GET", "/openapi/v3/apis/resource.k8s.io/v1"]);
    assert_eq!(v["cluster"], "skewgate-set-c");
    let v = explain(&["GET", "/healthz"]);
    assert_eq!(v["cluster"], "skewgate-pool");
    assert_eq!(v["requestInfo"]["isResourceRequest"], false);
}

#[test]
fn client_certificate_replaces_a_forged_identity() {
    let v = explain(&[
        "--client-cert-subject",
        "CN=alice,O=devs",
        "--header",
        "X-Remote-User: admin",
        "--header",
        "X-Remote-Group: system:masters",
        "GET",
        "/api/v1/namespaces/default/configmaps",
    ]);
    let removed = v["requestHeaders"]["remove"].as_array().cloned().unwrap_or_default();
    assert!(removed.contains(&json!("X-Remote-User")), "{v}");
    assert!(removed.contains(&json!("X-Remote-Group")), "{v}");
    assert!(has_header(&v, "x-remote-user", "alice"), "{v}");
    assert!(has_header(&v, "x-remote-group", "devs"), "{v}");
    assert!(!has_header(&v, "x-remote-user", "admin"));
}

#[test]
fn forged_identity_without_a_certificate_is_only_removed() {
    let v = explain(&["--header", "x-remote-user: admin", "GET", "/api/v1/namespaces"]);
    assert_eq!(v["requestHeaders"]["remove"], json!(["x-remote-user"]));
    assert!(set_headers(&v).iter().all(|(n, _)| n != "x-remote-user"));
}

#[test]
fn request_info_fields() {
    let v = explain(&["GET", "/apis/apps/v1/namespaces/prod/deployments/web/scale"]);
    let info = &v["requestInfo"];
    assert_eq!(info["isResourceRequest"], true);
    assert_eq!(info["verb"], "get");
    assert_eq!(info["apiPrefix"], "apis");
    assert_eq!(info["apiGroup"], "apps");
    assert_eq!(info["apiVersion"], "v1");
    assert_eq!(info["namespace"], "prod");
    assert_eq!(info["resource"], "deployments");
    assert_eq!(info["subresource"], "scale");
    assert_eq!(info["name"], "web");
    assert_eq!(info["parts"], json!(["deployments", "web", "scale"]));

    let info = explain(&["POST", "/api/v1/namespaces/default/pods"])["requestInfo"].clone();
    assert_eq!(info["verb"], "create");
    assert_eq!(info["apiPrefix"], "api");
    assert_eq!(info["apiGroup"], "");
    assert_eq!(info["resource"], "pods");
    assert_eq!(info["name"], "");

    let info = explain(&["GET", "/api/v1/nodes"])["requestInfo"].clone();
    assert_eq!(info["verb"], "list");
    assert_eq!(info["namespace"], "");
    assert_eq!(info["parts"], json!(["nodes"]));

    let info = explain(&["DELETE", "/api/v1/namespaces/old"])["requestInfo"].clone();
    assert_eq!(info["verb"], "delete");
    assert_eq!(info["resource"], "namespaces");
    assert_eq!(info["name"], "old");
    assert_eq!(info["namespace"], "old");

    let info = explain(&["GET", "/version"])["requestInfo"].clone();
    assert_eq!(info["isResourceRequest"], false);
    assert_eq!(info["verb"], "get");
}

#[test]
fn unreadable_table_exits_2() {
    let missing = Path::new(env!("CARGO_TARGET_TMPDIR")).join("no-such-table.json");
    let output = run(&missing, &["GET", "/api"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(output.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.starts_with("skewgate explain: "), "{stderr}");
    assert!(stderr.contains("no-such-table.json"), "{stderr}");
}

#[test]
fn invalid_table_exits_2_naming_the_problem() {
    let path = scratch(
        "schema-2.json",
        r#"{"schema":2,"apiservers":[{"id":"a","cluster":"apiserver-a"}],"poolCluster":"pool"}"#,
    );
    let output = run(&path, &["GET", "/api"]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("schema"), "{stderr}");
    assert!(stderr.contains("unsupported schema 2"), "{stderr}");

    let path = scratch("not-json.json", "{nope");
    let output = run(&path, &["GET", "/api"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("not JSON"));
}

#[test]
fn malformed_header_argument_exits_2() {
    let output = run(Path::new(TABLE), &["--header", "no-colon", "GET", "/api"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("NAME:VALUE"));
}

#[test]
fn ecds_carrying_the_table_works_too() {
    let table_json = match std::fs::read_to_string(TABLE) {
        Ok(text) => text,
        Err(e) => panic!("cannot read {TABLE}: {e}"),
    };
    let ecds = skewgate_envoy::ecds(&table_json, Path::new("/opt/skewgate/skewgate.wasm"));
    let path = scratch("ecds.json", &ecds.to_string());
    let args = ["GET", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"];
    let v = explain_with(&path, &args);
    assert_eq!(v["cluster"], "skewgate-set-c");
    assert_eq!(v["servingSet"], json!(["c"]));
    assert_eq!(v, explain(&args));

    let empty = scratch("ecds-empty.json", r#"{"resources":[]}"#);
    let output = run(&empty, &args);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("ecds.json"));
}

/// Envoy resolves dot segments before the filter decides: explain decides on the same path and
/// shows both.
#[test]
fn the_path_is_explained_as_envoy_forwards_it() {
    let v = explain(&["GET", "/apis/../apis/resource.k8s.io/v1/namespaces/default/resourceclaims"]);
    assert_eq!(v["cluster"], "skewgate-set-c");
    assert_eq!(v["path"]["received"], "/apis/../apis/resource.k8s.io/v1/namespaces/default/resourceclaims");
    assert_eq!(v["path"]["forwarded"], "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims");
    let v = explain(&["GET", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/%2E%2e?watch=1"]);
    assert_eq!(v["cluster"], "skewgate-pool");
    assert_eq!(v["path"]["forwarded"], "/apis/resource.k8s.io/v1/namespaces/default/?watch=1");
    let v = explain(&["GET", "/apis/resource.k8s.io/v1/resourceclaims#x"]);
    assert_eq!(
        (v["action"].as_str(), v["status"].as_u64(), v["by"].as_str()),
        (Some("respond"), Some(400), Some("envoy"))
    );
}

/// b at 1.33's defaults (VolumeAttributesClass off): a write of a claim is read for the field
/// before it goes anywhere, and explain says where it goes if it sets it.
#[test]
fn a_write_of_a_gated_field_says_its_body_decides() {
    let mut table: Value = match std::fs::read(TABLE).map(|b| serde_json::from_slice(&b)) {
        Ok(Ok(table)) => table,
        other => panic!("the example table: {other:?}"),
    };
    table["apiservers"][1]["features"] = json!({"VolumeAttributesClass": false});
    if let Some(sets) = table["sets"].as_array_mut() {
        sets.push(json!({"cluster": "skewgate-set-a_c", "members": ["a", "c"]}));
    }
    let path = scratch("gated.json", &table.to_string());
    let v = explain_with(&path, &["POST", "/api/v1/namespaces/default/persistentvolumeclaims"]);
    assert_eq!(v["cluster"], "skewgate-pool", "{v}");
    assert_eq!(
        v["gatedFields"]["fields"],
        json!([{"field": "spec.volumeAttributesClassName", "gate": "VolumeAttributesClass",
                "ifSet": {"cluster": "skewgate-set-a_c", "servingSet": ["a", "c"]}}]),
        "{v}"
    );
    assert!(v.get("withNativeModule").is_none(), "the filter reads the body: {v}");
    let v = explain_with(&path, &["GET", "/api/v1/namespaces/default/persistentvolumeclaims"]);
    assert!(v.get("gatedFields").is_none(), "{v}");
}
