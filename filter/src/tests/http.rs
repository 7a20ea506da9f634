//! One stream: header stamping, identity, local replies and the 503 rewrite.

use proxy_wasm::types::{Action, Status};
use serde_json::json;

use skewgate_core::bypass;
use skewgate_core::certificate::PEER_CERTIFICATE_HEADER;
use skewgate_core::testing::peer_certificate;

use super::{configure, configured, get, reply_json, sample, sealed, stream};
use crate::host::fake::Fake;
use crate::http::Http;
use crate::root::Root;

const SUBSET: &str = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims";
const DIGEST: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

#[test]
fn served_by_every_apiserver_goes_to_the_pool_unmarked() {
    let (fake, root) = configured(&sample());
    let mut http = stream(&fake, &root, &get("/api/v1/namespaces/default/pods"));
    assert_eq!(http.on_http_request_headers(0, true), Action::Continue);
    assert_eq!(fake.header("x-skewgate-cluster"), ["pool"]);
    assert!(fake.header("x-kubernetes-peer-proxied").is_empty());
    assert!(fake.header("x-skewgate-route").is_empty());
    assert_eq!(fake.header("authorization"), ["Bearer t"]);
    assert!(fake.reply().is_none());
    // A token client without a certificate costs one look-up: whether the connection has one.
    assert_eq!(fake.state().property_reads, [["connection", "subject_peer_certificate"]]);
}

#[test]
fn served_by_a_subset_is_rerouted_marked_and_counted() {
    let (fake, root) = configured(&sample());
    let name = "skewgate.rerouted_requests_total.group=resource.k8s.io;version=v1;resource=resourceclaims;";
    for _ in 0..2 {
        let mut http = stream(&fake, &root, &get(SUBSET));
        assert_eq!(http.on_http_request_headers(0, true), Action::Continue);
        assert_eq!(fake.header("x-skewgate-cluster"), ["set-c"]);
        assert_eq!(fake.header("x-kubernetes-peer-proxied"), ["true"]);
        assert!(fake.header("x-skewgate-route").is_empty());
    }
    // Counted in the VM, handed to Envoy once a second (on the tick after it, every 100 ms).
    assert_eq!(fake.counter(name), 0);
    let mut root = root;
    let once = |root: &mut Root<Fake>| {
        fake.state().now += std::time::Duration::from_millis(100);
        proxy_wasm::traits::RootContext::on_tick(root)
    };
    let tick = |root: &mut Root<Fake>| (0..10).for_each(|_| once(root));
    once(&mut root);
    assert_eq!(fake.counter(name), 0, "not on every tick");
    tick(&mut root);
    assert_eq!(fake.counter(name), 2);
    // Every request the filter sees is counted, rerouted or not: the rest went by the bypass.
    assert_eq!(fake.counter("skewgate.requests_total"), 2);
    let mut http = stream(&fake, &root, &get("/api/v1/namespaces/ns/pods/p"));
    http.on_http_request_headers(0, true);
    tick(&mut root);
    assert_eq!(fake.counter("skewgate.requests_total"), 3);
    assert_eq!(fake.counter(name), 2);

    let mut http = stream(&fake, &root, &get("/apis/resource.k8s.io/v1alpha3/deviceclasses/gpu"));
    http.on_http_request_headers(0, true);
    assert_eq!(fake.header("x-skewgate-cluster"), ["set-a-b"]);
    assert_eq!(fake.header("x-kubernetes-peer-proxied"), ["true"]);
}

#[test]
fn long_running_requests_get_the_route_without_timeout() {
    let (fake, root) = configured(&sample());
    for path in [&format!("{SUBSET}?watch=true"), "/api/v1/namespaces/ns/pods/p/log"] {
        let mut http = stream(&fake, &root, &get(path));
        http.on_http_request_headers(0, true);
        assert_eq!(fake.header("x-skewgate-route"), ["long-running"], "{path}");
    }
}

/// The filter carries out core's plan for the request, every edit and nothing else: a change to
/// what a decision does, made in core, reaches the filter without an edit here.
#[test]
fn the_request_leaves_as_cores_plan_says() {
    use skewgate_core::decision::{RequestHead, decide};
    use skewgate_core::edits::apply as apply_edits;
    use skewgate_core::edits::{Carrier, request_edits};
    use skewgate_core::table::RoutingTable;
    use skewgate_core::testing::SPOOFED_WATCH;

    let (fake, root) = configured(&sample());
    let mut http = stream(&fake, &root, SPOOFED_WATCH);
    assert_eq!(http.on_http_request_headers(0, true), Action::Continue);
    let table = RoutingTable::from_json(&sealed(&sample())).expect("the sample");
    let head = RequestHead { method: "GET", target: SPOOFED_WATCH[1].1, token: true, ..Default::default() };
    let decision = decide(&table, &head);
    let plan = request_edits(&decision, SPOOFED_WATCH.iter().map(|(n, _)| *n), Carrier::Filter, None);
    let mut sent: Vec<(String, String)> = fake
        .state()
        .request_headers
        .iter()
        .map(|(n, v)| (n.clone(), String::from_utf8_lossy(v).into_owned()))
        .collect();
    sent.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(sent, apply_edits(&plan, SPOOFED_WATCH));
    assert!(sent.iter().any(|(n, v)| n == "x-skewgate-route" && v == "long-running"), "{sent:?}");
}

/// A client's own steering headers never reach Envoy's routing or the apiserver.
#[test]
fn client_steering_headers_are_stripped() {
    let (fake, root) = configured(&sample());
    let mut headers = get("/api/v1/namespaces/default/pods");
    headers.extend([
        ("x-skewgate-cluster", "apiserver-a"),
        ("X-Skewgate-Route", "long-running"),
        ("x-kubernetes-peer-proxied", "true"),
    ]);
    let mut http = stream(&fake, &root, &headers);
    http.on_http_request_headers(0, true);
    assert_eq!(fake.header("x-skewgate-cluster"), ["pool"]);
    assert!(fake.header("x-skewgate-route").is_empty());
    assert!(fake.header("x-kubernetes-peer-proxied").is_empty());
}

#[test]
fn spoofed_identity_headers_are_stripped() {
    let (fake, root) = configured(&sample());
    let mut headers = get(SUBSET);
    headers.extend([
        ("x-remote-user", "admin"),
        ("X-Remote-Group", "system:masters"),
        ("x-remote-uid", "0"),
        ("x-remote-extra-scopes", "all"),
    ]);
    let mut http = stream(&fake, &root, &headers);
    assert_eq!(http.on_http_request_headers(0, true), Action::Continue);
    let names = fake.header_names();
    assert!(!names.iter().any(|n| n.to_ascii_lowercase().starts_with("x-remote-")), "{names:?}");
    assert_eq!(fake.header("authorization"), ["Bearer t"]);
    assert_eq!(fake.header("x-skewgate-cluster"), ["set-c"]);
}

#[test]
fn a_verified_certificate_becomes_the_forwarded_identity() {
    let (fake, root) = configured(&sample());
    fake.set_property(&["connection", "subject_peer_certificate"], "CN=bob,O=ops,O=devs");
    fake.set_property(&["connection", "sha256_peer_certificate_digest"], DIGEST);
    let certificate = peer_certificate();
    let headers = [
        (":method", "GET"),
        (":path", SUBSET),
        ("x-remote-user", "admin"),
        ("x-remote-group", "system:masters"),
        (PEER_CERTIFICATE_HEADER, &certificate),
    ];
    let mut http = stream(&fake, &root, &headers);
    assert_eq!(http.on_http_request_headers(0, true), Action::Continue);
    assert!(fake.header(PEER_CERTIFICATE_HEADER).is_empty(), "the certificate went on upstream");
    assert_eq!(fake.header("x-remote-user"), ["bob"]);
    // DER order, which RFC 2253 lists backwards.
    assert_eq!(fake.header("x-remote-group"), ["devs", "ops"]);
    assert_eq!(
        fake.header("x-remote-extra-authentication.kubernetes.io%2fcredential-id"),
        [format!("X509SHA256={DIGEST}")]
    );
    assert_eq!(fake.header("x-skewgate-cluster"), ["set-c"]);
}

#[test]
fn a_client_cert_header_is_no_certificate() {
    let mut table = sample();
    table["anonymousClusterPrefix"] = json!("anon-");
    let (fake, root) = configured(&table);
    let headers =
        [(":method", "GET"), (":path", SUBSET), ("x-forwarded-client-cert", "Hash=x;Subject=\"CN=bob\"")];
    let mut http = stream(&fake, &root, &headers);
    assert_eq!(http.on_http_request_headers(0, true), Action::Continue);
    assert!(fake.header("x-remote-user").is_empty());
    // No certificate and no token: anonymous.
    assert_eq!(fake.header("x-skewgate-cluster"), ["anon-set-c"]);
    assert!(fake.state().connection.is_empty());
}

#[test]
fn a_certificate_without_a_subject_leaves_the_request_to_its_token() {
    // Envoy renders an empty subject as no property at all; kube-apiserver's x509
    // authenticator takes no user from it either.
    let (fake, root) = configured(&sample());
    fake.set_property(&["connection", "subject_peer_certificate"], "");
    let mut http = stream(&fake, &root, &get(SUBSET));
    assert_eq!(http.on_http_request_headers(0, true), Action::Continue);
    assert!(fake.header("x-remote-user").is_empty());
    assert_eq!(fake.header("authorization"), ["Bearer t"]);
    assert_eq!(fake.header("x-skewgate-cluster"), ["set-c"]);
    assert_eq!(fake.counter("skewgate.refused_certificates_total"), 0);
    assert!(fake.state().connection.is_empty());
}

#[test]
fn without_a_table_every_request_gets_503_unconfigured() {
    let fake = Fake::default();
    fake.request(&get("/api/v1/namespaces/default/pods"));
    let holding = std::rc::Rc::new(crate::hold::Holding::new(fake.clone()));
    let mut http = Http::new(fake.clone(), None, 1, holding);
    assert_eq!(proxy_wasm::traits::HttpContext::on_http_request_headers(&mut http, 0, true), Action::Pause);
    let (status, body) = reply_json(&fake);
    assert_eq!(
        (status, body["code"].clone(), body["reason"].as_str()),
        (503, json!(503), Some("ServiceUnavailable"))
    );
    let message = body["message"].as_str().unwrap_or("");
    assert!(message.contains("skewgate-unconfigured") && message.contains("no routing table"), "{message}");
    assert!(fake.header("x-skewgate-cluster").is_empty());
    let (_, headers, _) = fake.reply().expect("a reply");
    assert!(headers.contains(&("retry-after".to_owned(), "1".to_owned())), "{headers:?}");
}

#[test]
fn envoy_failure_for_a_gvr_not_in_the_table_names_it() {
    let (fake, root) = configured(&sample());
    let mut http = stream(&fake, &root, &get("/api/v1/nodes/n1"));
    http.on_http_request_headers(0, true);
    assert_eq!(fake.header("x-skewgate-cluster"), ["pool"]);
    fake.respond(&[(":status", "503")]);
    fake.set_property(&["response", "code_details"], "no_healthy_upstream");
    assert_eq!(http.on_http_response_headers(0, true), Action::Pause);
    let (status, body) = reply_json(&fake);
    assert_eq!(status, 503);
    let message = body["message"].as_str().unwrap_or("");
    assert!(
        message.contains("nodes.v1 is served by [a,b,c]")
            && message.contains("cluster pool")
            && message.contains("no_healthy_upstream"),
        "{message}"
    );
    assert_eq!(fake.counter("skewgate.unavailable_replies_total.cluster=pool;"), 1);
    // Nothing reached an apiserver: client-go sends it again after a second.
    let (_, headers, _) = fake.reply().expect("a reply");
    assert!(headers.contains(&("retry-after".to_owned(), "1".to_owned())), "{headers:?}");
    assert_eq!(body["details"]["retryAfterSeconds"], 1);
}

/// A write Envoy may have got to an apiserver before it failed (a reset, a timeout) is not
/// to be sent again: no `Retry-After`, which client-go would follow; one that never left Envoy
/// is.
#[test]
fn a_write_that_may_have_been_applied_gets_no_retry_after() {
    let (fake, root) = configured(&sample());
    let post = [(":method", "POST"), (":path", SUBSET), ("authorization", "Bearer t")];
    for (detail, again) in [
        ("upstream_reset_before_response_started{remote_reset}", false),
        ("upstream_response_timeout", false),
        (
            "upstream_reset_before_response_started{remote_connection_failure|delayed_connect_error:_Connection_refused}",
            true,
        ),
        ("no_healthy_upstream", true),
    ] {
        fake.state().replies.clear();
        let mut http = stream(&fake, &root, &post);
        http.on_http_request_headers(0, true);
        fake.respond(&[(":status", "503")]);
        fake.set_property(&["response", "code_details"], detail);
        assert_eq!(http.on_http_response_headers(0, true), Action::Pause);
        let (status, headers, body) = fake.reply().expect("a reply");
        assert_eq!(status, 503);
        assert_eq!(headers.iter().any(|(n, _)| n == "retry-after"), again, "{detail}: {headers:?}");
        let body: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
        assert_eq!(body["details"]["retryAfterSeconds"].as_u64().is_some(), again, "{detail}: {body}");
    }
}

#[test]
fn envoy_failure_for_a_rerouted_gvr_names_its_set() {
    let (fake, root) = configured(&sample());
    let mut http = stream(&fake, &root, &get(SUBSET));
    http.on_http_request_headers(0, true);
    fake.respond(&[(":status", "503")]);
    fake.set_property(&["response", "code_details"], "upstream_reset_before_response_started");
    assert_eq!(http.on_http_response_headers(0, true), Action::Pause);
    let (_, body) = reply_json(&fake);
    let message = body["message"].as_str().unwrap_or("");
    assert!(message.contains("resourceclaims.v1.resource.k8s.io is served by [c]"), "{message}");
    assert!(message.contains("cluster set-c"), "{message}");
    assert_eq!(fake.counter("skewgate.unavailable_replies_total.cluster=set-c;"), 1);
    assert_eq!(fake.counter("skewgate.unavailable_replies_total.cluster=pool;"), 0);
}

#[test]
fn an_apiservers_own_errors_pass_unchanged() {
    let (fake, root) = configured(&sample());
    for (status, details) in [("503", "via_upstream"), ("404", "via_upstream"), ("429", "")] {
        let mut http = stream(&fake, &root, &get(SUBSET));
        http.on_http_request_headers(0, true);
        fake.respond(&[(":status", status)]);
        fake.set_property(&["response", "code_details"], details);
        assert_eq!(http.on_http_response_headers(0, true), Action::Continue, "{status}");
        assert!(fake.reply().is_none(), "{status}");
    }
}

const V2: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json";

/// An authorized GET of `/apis` asking for aggregated discovery, revalidating `if_none_match`.
fn discovery(if_none_match: Option<&'static str>) -> Vec<(&'static str, &'static str)> {
    let mut headers = get("/apis");
    headers.push(("accept", V2));
    headers.extend(if_none_match.map(|etag| ("if-none-match", etag)));
    headers
}

#[test]
fn merged_discovery_replaces_an_authorized_answer() {
    let (fake, root) = configured(&sample());
    let mut http = stream(&fake, &root, &discovery(Some("\"OLD\"")));
    assert_eq!(http.on_http_request_headers(0, true), Action::Continue);
    // The apiserver must authorize it, not answer 304 for its own document.
    assert!(fake.header("if-none-match").is_empty());
    assert_eq!(fake.header("x-skewgate-cluster"), ["pool"]);
    fake.respond(&[(":status", "200")]);
    // A head that ends the answer: nothing of the apiserver's is left to wait for.
    assert_eq!(http.on_http_response_headers(0, true), Action::Pause);
    let (status, headers, body) = fake.reply().expect("the merged document");
    assert_eq!(status, 200);
    assert_eq!(body, br#"{"kind":"APIGroupDiscoveryList"}"#);
    assert!(headers.contains(&("etag".to_string(), "\"ABC123\"".to_string())), "{headers:?}");
    assert_eq!(fake.counter("skewgate.merged_discovery_total.code=200;"), 1);
}

#[test]
fn merged_discovery_answers_304_to_its_own_etag() {
    let (fake, root) = configured(&sample());
    let mut http = stream(&fake, &root, &discovery(Some("\"ABC123\"")));
    http.on_http_request_headers(0, true);
    fake.respond(&[(":status", "200")]);
    assert_eq!(http.on_http_response_headers(0, true), Action::Pause);
    let (status, headers, body) = fake.reply().expect("a 304");
    assert_eq!((status, body.len()), (304, 0));
    assert!(!headers.iter().any(|(n, _)| n == "content-type"), "{headers:?}");
    assert_eq!(fake.counter("skewgate.merged_discovery_total.code=304;"), 1);
}

/// The apiserver's authorized answer to `discovery(if_none_match)`, its head then its body in two
/// chunks (the second ending it unless `trailers`), through the filter: the head paused, the
/// chunks dropped, no local reply.
fn streamed(fake: &Fake, http: &mut dyn proxy_wasm::traits::HttpContext, trailers: bool) {
    fake.respond(&[
        (":status", "200"),
        ("content-type", "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"),
        ("content-length", "11"),
        ("etag", "\"UPSTREAM\""),
        ("x-skewgate-served-by", "a"),
        ("date", "Mon, 01 Jan 2024 00:00:00 GMT"),
    ]);
    assert_eq!(http.on_http_response_headers(0, false), Action::Pause);
    fake.body_chunk(b"{\"items\":");
    assert_eq!(http.on_http_response_body(9, false), Action::Pause);
    assert!(fake.state().response_body.is_empty());
    fake.body_chunk(b"[]}");
    if trailers {
        assert_eq!(http.on_http_response_body(3, false), Action::Pause);
        assert_eq!(http.on_http_response_trailers(1), Action::Continue);
    } else {
        assert_eq!(http.on_http_response_body(3, true), Action::Continue);
    }
    assert!(fake.reply().is_none(), "a local reply resets the upstream stream");
    assert_eq!(fake.state().dropped_body, 12);
}

/// The composed answer's head as the client gets it (the apiserver's date stays).
fn composed_head(status: &str, content_type: &[(&str, &str)], length: &str) -> Vec<(String, String)> {
    let mut head = vec![(":status", status), ("date", "Mon, 01 Jan 2024 00:00:00 GMT")];
    head.extend(content_type);
    head.extend([("etag", "\"ABC123\""), ("vary", "Accept"), ("cache-control", "public")]);
    head.push(("content-length", length));
    head.into_iter().map(|(n, v)| (n.to_string(), v.to_string())).collect()
}

fn response_head(fake: &Fake) -> Vec<(String, String)> {
    let s = fake.state();
    s.response_headers.iter().map(|(n, v)| (n.clone(), String::from_utf8_lossy(v).into_owned())).collect()
}

#[test]
fn merged_discovery_replaces_the_apiservers_body_once_it_has_come() {
    const DOCUMENT: &[u8] = br#"{"kind":"APIGroupDiscoveryList"}"#;
    let content_type =
        [("content-type", "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList")];
    for trailers in [false, true] {
        let (fake, root) = configured(&sample());
        let mut http = stream(&fake, &root, &discovery(None));
        http.on_http_request_headers(0, true);
        streamed(&fake, http.as_mut(), trailers);
        assert_eq!(fake.state().response_body, DOCUMENT, "trailers: {trailers}");
        assert_eq!(response_head(&fake), composed_head("200", &content_type, "32"), "trailers: {trailers}");
        assert_eq!(fake.counter("skewgate.merged_discovery_total.code=200;"), 1, "trailers: {trailers}");
    }
}

#[test]
fn merged_discovery_replaces_the_apiservers_answer_with_304() {
    let (fake, root) = configured(&sample());
    let mut http = stream(&fake, &root, &discovery(Some("\"ABC123\"")));
    http.on_http_request_headers(0, true);
    streamed(&fake, http.as_mut(), false);
    assert!(fake.state().response_body.is_empty());
    assert_eq!(response_head(&fake), composed_head("304", &[], "0"));
    assert_eq!(fake.counter("skewgate.merged_discovery_total.code=304;"), 1);
    assert_eq!(fake.counter("skewgate.merged_discovery_total.code=200;"), 0);
}

/// Trailers without any body before them leave Envoy no body to put the document in: the
/// complete answer is replaced by a local reply instead.
#[test]
fn merged_discovery_without_a_body_to_replace_is_a_local_reply() {
    let (fake, root) = configured(&sample());
    let mut http = stream(&fake, &root, &discovery(None));
    http.on_http_request_headers(0, true);
    fake.respond(&[(":status", "200")]);
    assert_eq!(http.on_http_response_headers(0, false), Action::Pause);
    fake.state().no_response_body = true;
    assert_eq!(http.on_http_response_trailers(1), Action::Continue);
    let (status, _, body) = fake.reply().expect("the merged document");
    assert_eq!((status, body.as_slice()), (200, &br#"{"kind":"APIGroupDiscoveryList"}"#[..]));
    assert_eq!(fake.counter("skewgate.merged_discovery_total.code=200;"), 1);
}

#[test]
fn merged_discovery_denied_upstream_reaches_the_client_as_sent() {
    let (fake, root) = configured(&sample());
    let mut http = stream(&fake, &root, &discovery(None));
    http.on_http_request_headers(0, true);
    fake.respond(&[(":status", "403")]);
    assert_eq!(http.on_http_response_headers(0, false), Action::Continue);
    assert!(fake.reply().is_none());
}

const OPENAPI: &str = "/openapi/v3/apis/resource.k8s.io/v1?hash=ABC";
const PROTO: &str = "application/com.github.proto-openapi.spec.v3@v1.0+protobuf";

fn openapi_stream(fake: &Fake, root: &crate::root::Root<Fake>) -> Box<dyn proxy_wasm::traits::HttpContext> {
    let headers = [
        (":method", "GET"),
        (":path", OPENAPI),
        ("accept", PROTO),
        ("authorization", "Bearer t"),
        ("if-none-match", "\"E1\""),
        ("if-modified-since", "Mon, 01 Jan 2024 00:00:00 GMT"),
    ];
    let mut http = stream(fake, root, &headers);
    assert_eq!(http.on_http_request_headers(0, true), Action::Continue);
    http
}

#[test]
fn openapi_is_authorized_upstream_then_composed() {
    let (fake, root) = configured(&sample());
    let mut http = openapi_stream(&fake, &root);
    // The apiservers that serve the group/version authorize a cheap, unconditional JSON request.
    assert_eq!(fake.header("x-skewgate-cluster"), ["set-c"]);
    assert_eq!(fake.header(":path"), ["/openapi/v3/apis/resource.k8s.io/v1"]);
    assert_eq!(fake.header("accept"), ["application/json"]);
    assert_eq!(fake.header("range"), ["bytes=0-0"]);
    assert!(fake.header("if-none-match").is_empty() && fake.header("if-modified-since").is_empty());

    fake.respond(&[(":status", "206")]);
    assert_eq!(http.on_http_response_headers(0, false), Action::Pause);
    let dispatched = fake.state().dispatched.clone();
    let [(cluster, headers)] = &dispatched[..] else { panic!("one call expected: {dispatched:?}") };
    assert_eq!(cluster, "openapi-composer");
    for expected in [(":path", OPENAPI), ("accept", PROTO), ("if-none-match", "\"E1\"")] {
        assert!(
            headers.contains(&(expected.0.to_string(), expected.1.to_string())),
            "{expected:?} in {headers:?}"
        );
    }
    // The apiserver's body is dropped while the composer answers.
    assert_eq!(http.on_http_response_body(1, true), Action::Pause);
    assert_eq!(fake.state().dropped_body, 1);

    {
        let mut s = fake.state();
        s.call_response_headers = vec![
            (":status".into(), b"200".to_vec()),
            ("content-type".into(), PROTO.as_bytes().to_vec()),
            ("etag".into(), b"\"E2\"".to_vec()),
            ("x-internal".into(), b"no".to_vec()),
        ];
        s.call_response_body = b"document".to_vec();
    }
    http.on_http_call_response(1, 4, 8, 0);
    let (status, headers, body) = fake.reply().expect("the composed document");
    assert_eq!((status, body.as_slice()), (200, &b"document"[..]));
    assert_eq!(
        headers,
        [("content-type".to_string(), PROTO.to_string()), ("etag".to_string(), "\"E2\"".to_string())]
    );
}

#[test]
fn openapi_denied_upstream_is_not_composed() {
    let (fake, root) = configured(&sample());
    let mut http = openapi_stream(&fake, &root);
    fake.respond(&[(":status", "403")]);
    fake.set_property(&["response", "code_details"], "via_upstream");
    assert_eq!(http.on_http_response_headers(0, false), Action::Continue);
    assert!(fake.state().dispatched.is_empty());
    assert_eq!(http.on_http_response_body(10, true), Action::Continue);
    assert!(fake.reply().is_none());
}

#[test]
fn openapi_composer_unreachable_is_a_503_never_one_apiservers_document() {
    let (fake, root) = configured(&sample());
    let mut http = openapi_stream(&fake, &root);
    fake.state().dispatch_error = Some(Status::BadArgument);
    fake.respond(&[(":status", "200")]);
    assert_eq!(http.on_http_response_headers(0, false), Action::Pause);
    let (status, body) = reply_json(&fake);
    let message = body["message"].as_str().unwrap_or("");
    assert_eq!(status, 503);
    assert!(
        message.contains("composed OpenAPI document is unavailable (cluster openapi-composer"),
        "{message}"
    );

    // Dispatched, but Envoy's call failed (no :status): not the composer's answer either.
    let mut http = openapi_stream(&fake, &root);
    fake.state().dispatch_error = None;
    fake.respond(&[(":status", "200")]);
    assert_eq!(http.on_http_response_headers(0, false), Action::Pause);
    fake.state().call_response_headers.clear();
    http.on_http_call_response(1, 0, 0, 0);
    let (status, body) = reply_json(&fake);
    assert_eq!(status, 503);
    assert!(body["message"].as_str().unwrap_or("").contains("no answer"), "{body}");
    // A read of a document: asked again after a second.
    let (_, headers, _) = fake.reply().expect("a reply");
    assert!(headers.contains(&("retry-after".to_owned(), "1".to_owned())), "{headers:?}");
    assert_eq!(body["details"]["retryAfterSeconds"], 1);
}

/// A certificate client's request for `path` on the current connection.
fn certificate_request(fake: &Fake, root: &Root<Fake>, subject: &str, path: &str) {
    fake.set_property(&["connection", "subject_peer_certificate"], subject);
    fake.set_property(&["connection", "sha256_peer_certificate_digest"], DIGEST);
    let certificate = peer_certificate();
    let headers = [(":method", "GET"), (":path", path), (PEER_CERTIFICATE_HEADER, &certificate)];
    let mut http = stream(fake, root, &headers);
    assert_eq!(http.on_http_request_headers(0, true), Action::Continue);
}

fn connection(fake: &Fake) -> Vec<(String, String)> {
    fake.state().connection.clone()
}

#[test]
fn a_mapped_certificate_is_left_on_its_connection_marker_last() {
    let (fake, root) = configured(&sample());
    let declared = fake.state().declared.clone();
    assert_eq!(declared.len(), 3 + bypass::MAX_GROUPS, "{declared:?}");
    certificate_request(&fake, &root, "CN=système:node:ñ,O=ops,O=devs", SUBSET);
    let pair = |n: &str, v: &str| (n.to_owned(), v.to_owned());
    let expected = vec![
        pair(bypass::USER, "système:node:ñ"),
        pair("skewgate_group_0", "devs"),
        pair("skewgate_group_1", "ops"),
        pair(bypass::CREDENTIAL_ID, &format!("X509SHA256={DIGEST}")),
        pair(bypass::MARKER, bypass::MARKER_VALUE),
    ];
    assert_eq!(connection(&fake), expected);
    // What the filter sends itself is what the properties say.
    assert_eq!(fake.header("x-remote-user"), ["système:node:ñ"]);
    assert_eq!(fake.header("x-remote-group"), ["devs", "ops"]);
    // The next request of the connection: the marker read, nothing set (a second set would trap).
    fake.state().connection_sets = 0;
    certificate_request(&fake, &root, "CN=système:node:ñ,O=ops,O=devs", "/api/v1/namespaces/a/pods");
    assert_eq!(fake.state().connection_sets, 0);
    assert!(fake.state().property_reads.contains(&vec![bypass::MARKER.to_owned()]));
    assert_eq!(connection(&fake), expected);
}

#[test]
fn only_mapped_certificates_that_fit_the_routes_are_left_on_the_connection() {
    let many: String = std::iter::once("CN=u".to_owned())
        .chain((0..=bypass::MAX_GROUPS).map(|i| format!("O=g{i}")))
        .collect::<Vec<_>>()
        .join(",");
    for subject in [many.as_str(), "O=ops", ""] {
        let (fake, root) = configured(&sample());
        fake.set_property(&["connection", "subject_peer_certificate"], subject);
        let certificate = peer_certificate();
        let headers = [(":method", "GET"), (":path", SUBSET), (PEER_CERTIFICATE_HEADER, &certificate)];
        stream(&fake, &root, &headers).on_http_request_headers(0, true);
        assert_eq!(fake.state().connection_sets, 0, "{subject:?}");
    }
    // Nor does a token client's.
    let (fake, root) = configured(&sample());
    stream(&fake, &root, &get(SUBSET)).on_http_request_headers(0, true);
    assert_eq!(fake.state().connection_sets, 0);
}

#[test]
fn a_refused_set_never_leaves_the_marker() {
    let (fake, root) = configured(&sample());
    fake.state().refuse_set = Some("skewgate_group_0".into());
    certificate_request(&fake, &root, "CN=bob,O=ops", SUBSET);
    assert_eq!(connection(&fake), [(bypass::USER.to_owned(), "bob".to_owned())]);
    // The request itself still carries the identity.
    assert_eq!(fake.header("x-remote-group"), ["ops"]);
}

#[test]
fn the_credential_id_is_left_only_where_the_policy_sends_it() {
    let mut table = sample();
    table["policy"] = json!({"x509CredentialId": false});
    let (fake, root) = configured(&table);
    certificate_request(&fake, &root, "CN=bob", SUBSET);
    let names: Vec<String> = connection(&fake).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, [bypass::USER, bypass::MARKER]);
}

#[test]
fn refused_declarations_leave_nothing_on_connections() {
    let fake = Fake::default();
    fake.state().refuse_declarations = true;
    let mut root = super::new_vm(&fake);
    assert!(configure(&fake, &mut root, sealed(&sample())));
    certificate_request(&fake, &root, "CN=bob", SUBSET);
    assert_eq!(fake.state().connection_sets, 0);
    assert_eq!(fake.header("x-remote-user"), ["bob"]);
}

/// A certificate whose names kube-apiserver's x509 parser would refuse gives no identity: 401
/// naming why, nothing left on the connection. So does a certificate the filter was not shown.
#[test]
fn a_certificate_the_apiserver_would_refuse_gets_401() {
    use skewgate_core::testing::{CN, certificate_der, url_encoded_pem};
    let universal = url_encoded_pem(&certificate_der(&[(CN, 12, b"ca")], &[(CN, 28, b"\0\0\0a")]));
    let cases = [
        (Some(universal.as_str()), "its subject's CN is a UniversalString (ASN.1 tag 28)"),
        (None, "Envoy did not hand skewgate the certificate"),
    ];
    for (certificate, why) in cases {
        let (fake, root) = configured(&sample());
        fake.set_property(&["connection", "subject_peer_certificate"], "CN=admin,O=system:masters");
        let mut headers = vec![(":method", "GET"), (":path", SUBSET), ("authorization", "Bearer t")];
        headers.extend(certificate.map(|c| (PEER_CERTIFICATE_HEADER, c)));
        let mut http = stream(&fake, &root, &headers);
        assert_eq!(http.on_http_request_headers(0, true), Action::Pause);
        let (status, body) = reply_json(&fake);
        assert_eq!(status, 401);
        assert!(body["message"].as_str().unwrap_or("").contains(why), "{body}");
        assert!(fake.state().connection.is_empty());
    }
}
