//! The root context: which configurations it takes, and that a refused one leaves the last good
//! table in place.

use proxy_wasm::traits::RootContext;
use proxy_wasm::types::{Action, ContextType};
use serde_json::json;

use super::{configure, configured, get, reply_json, sample, sealed, stream};
use crate::host::fake::Fake;
use crate::root::Root;

const SUBSET: &str = "/apis/resource.k8s.io/v1/resourceclaims";
const ACCEPTED: &str = "skewgate.configs_total.result=accepted;";
const REJECTED: &str = "skewgate.configs_total.result=rejected;";

/// Where a new stream on `root` sends the request for `path`.
fn routes(fake: &Fake, root: &Root<Fake>, path: &str) -> Vec<String> {
    let mut http = stream(fake, root, &get(path));
    assert_eq!(http.on_http_request_headers(0, true), Action::Continue);
    fake.header("x-skewgate-cluster")
}

#[test]
fn a_valid_table_is_taken_and_the_tick_set() {
    let (fake, root) = configured(&sample());
    assert_eq!(fake.counter(ACCEPTED), 1);
    assert_eq!(fake.state().tick_period, Some(std::time::Duration::from_millis(100)));
    assert_eq!(root.get_type(), Some(ContextType::HttpContext));
    assert_eq!(routes(&fake, &root, SUBSET), ["set-c"]);
}

#[test]
fn refused_configurations_keep_the_last_good_table() {
    let (fake, mut root) = configured(&sample());
    let mut too_many = sample();
    too_many["apiservers"] =
        (0..65).map(|i| json!({"id": format!("s{i}"), "cluster": format!("apiserver-{i}")})).collect();
    let mut newer_schema = sample();
    newer_schema["schema"] = json!(2);
    let mut unknown_member = sample();
    unknown_member["sets"][0]["members"] = json!(["z"]);
    let mut seal_removed = skewgate_core::testing::sealed(&sample());
    seal_removed.as_object_mut().expect("a table").remove("clusters");
    let seal_removed = seal_removed.to_string().into_bytes();
    let refused: Vec<(&str, Vec<u8>)> = vec![
        ("garbage", b"\x00\xffnot json".to_vec()),
        ("truncated", sample().to_string().as_bytes()[..40].to_vec()),
        ("empty", Vec::new()),
        // Nested past serde_json's recursion limit: refused, not a stack overflow.
        ("deep", [vec![b'['; 100_000], vec![b']'; 100_000]].concat()),
        ("65 apiservers", sealed(&too_many)),
        // 8 MiB of a string nobody asked for.
        ("oversized", format!("{{\"schema\":1,\"generation\":\"{}\"}}", "x".repeat(8 << 20)).into_bytes()),
        ("schema 2", sealed(&newer_schema)),
        ("unknown member", sealed(&unknown_member)),
        // Envoy takes only tables the sidecar sealed: none, or one whose seal was removed.
        ("unsealed", sample().to_string().into_bytes()),
        ("seal removed", seal_removed),
    ];
    for (i, (what, bytes)) in refused.into_iter().enumerate() {
        assert!(!configure(&fake, &mut root, bytes), "{what} taken");
        assert_eq!(fake.counter(REJECTED), i as u64 + 1, "{what}");
        assert_eq!(routes(&fake, &root, SUBSET), ["set-c"], "{what}: the last good table is gone");
    }
    // No configuration at all (Envoy sent none).
    fake.state().plugin_configuration = None;
    assert!(!root.on_configure(0));
    assert_eq!(routes(&fake, &root, SUBSET), ["set-c"]);
    assert_eq!(fake.counter(ACCEPTED), 1);
}

#[test]
fn an_announced_size_over_the_limit_is_refused_before_the_bytes_are_read() {
    let (fake, mut root) = configured(&sample());
    let mut other = sample();
    other["sets"][0]["cluster"] = json!("set-other");
    let other = sealed(&other);
    fake.state().plugin_configuration = Some(other.clone());
    // Envoy announces the size first; past the limit the (here valid) bytes are never taken.
    assert!(!root.on_configure(skewgate_core::table::MAX_TABLE_BYTES + 1));
    assert_eq!(fake.counter(REJECTED), 1);
    assert_eq!(routes(&fake, &root, SUBSET), ["set-c"]);
    assert!(root.on_configure(other.len()));
    assert_eq!(routes(&fake, &root, SUBSET), ["set-other"]);
}

#[test]
fn without_any_good_table_requests_get_503_unconfigured() {
    let fake = Fake::default();
    let mut root = super::new_vm(&fake);
    assert!(!configure(&fake, &mut root, b"{}".to_vec()));
    let mut http = stream(&fake, &root, &get(SUBSET));
    assert_eq!(http.on_http_request_headers(0, true), Action::Pause);
    let (status, body) = reply_json(&fake);
    assert_eq!(status, 503);
    assert!(body["message"].as_str().unwrap_or("").contains("skewgate-unconfigured"), "{body}");
}

#[test]
fn a_new_table_applies_to_new_streams_and_old_streams_keep_theirs() {
    let (fake, mut root) = configured(&sample());
    let name = "skewgate.rerouted_requests_total.group=resource.k8s.io;version=v1;resource=resourceclaims;";
    let mut old = stream(&fake, &root, &get(SUBSET));
    old.on_http_request_headers(0, true);
    assert_eq!(fake.header("x-skewgate-cluster"), ["set-c"]);

    // resourceclaims v1 now on every apiserver.
    let mut next = sample();
    next["groupVersions"][1]["servedBy"] = json!(["a", "b", "c"]);
    next["groupVersions"][1]["resources"]["resourceclaims"] = json!(["a", "b", "c"]);
    assert!(configure(&fake, &mut root, sealed(&next)));
    // The retired table's counts are handed over with the swap, not lost with it.
    assert_eq!(fake.counter(name), 1);
    assert_eq!(routes(&fake, &root, SUBSET), ["pool"]);

    // The old stream's 503 still names the set it was sent to.
    fake.respond(&[(":status", "503")]);
    fake.set_property(&["response", "code_details"], "no_healthy_upstream");
    assert_eq!(old.on_http_response_headers(0, true), Action::Pause);
    let (_, body) = reply_json(&fake);
    assert!(body["message"].as_str().unwrap_or("").contains("cluster set-c"), "{body}");
}

/// Envoy refuses a second declaration of a property on a root context: a new table declares
/// nothing again.
#[test]
fn connection_properties_are_declared_once_per_root_context() {
    let (fake, mut root) = configured(&sample());
    let declared = fake.state().declared.clone();
    assert_eq!(declared.len(), 3 + skewgate_core::bypass::MAX_GROUPS, "{declared:?}");
    let mut next = sample();
    next["apiservers"][0]["cluster"] = json!("apiserver-next");
    assert!(configure(&fake, &mut root, sealed(&next)));
    assert_eq!(fake.state().declared, declared);
}
