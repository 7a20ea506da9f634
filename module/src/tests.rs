//! The module's filter against a fake Envoy stream: what it does to a request's headers, which
//! local replies it sends, what it leaves to the proxy-wasm filter behind it.

use serde_json::json;
use skewgate_core::certificate::PEER_CERTIFICATE_HEADER;
use skewgate_core::edits::{CLUSTER_HEADER, NATIVE, NATIVE_LONG_RUNNING, ROUTE_HEADER};
use skewgate_core::testing::{CN, certificate_der, peer_certificate, sample, sealed, url_encoded_pem};

use skewgate_core::stream::fake::FakeStream as Fake;
use skewgate_core::stream::{Attribute, Next};

use crate::filter::{Config, Filter, RequestHeaders};

impl RequestHeaders for Fake {
    fn request_headers(&self) -> Vec<(&[u8], &[u8])> {
        Fake::request_headers(self)
    }
}

/// The module on the sample table without the hold: c's resourceclaims, the only rerouted
/// API of one apiserver, are the module's to route.
fn filter() -> Filter {
    let mut table = sample();
    table["policy"] = json!({"hold": {"maxWait": "0s"}});
    let table = sealed(&table).to_string();
    Filter::new(&Config::new(b"skewgate-module", table.as_bytes()).expect("the sample table"))
}

#[test]
fn only_sealed_tables_are_taken() {
    assert!(Config::new(b"m", sample().to_string().as_bytes()).is_none());
    assert!(Config::new(b"m", sealed(&sample()).to_string().as_bytes()).is_some());
}

/// A rerouted watch: the cluster of the apiservers that serve it, the module's long-running
/// class (its routes skip the proxy-wasm filter), the peer-proxied stamp; a client's own
/// reserved headers gone, Envoy asked to pick the route again.
#[test]
fn a_rerouted_watch_takes_the_native_long_running_route() {
    let mut stream = Fake::request(&[
        (":method", "GET"),
        (":path", "/apis/resource.k8s.io/v1/resourceclaims?watch=1"),
        ("authorization", "Bearer t"),
        ("x-remote-user", "admin"),
        ("x-skewgate-route", "native"),
    ]);
    assert!(matches!(filter().on_request_headers(&mut stream), Next::Continue));
    assert_eq!(stream.header(CLUSTER_HEADER), ["set-c"]);
    assert_eq!(stream.header(ROUTE_HEADER), [NATIVE_LONG_RUNNING]);
    assert_eq!(stream.header("x-kubernetes-peer-proxied"), ["true"]);
    assert!(stream.header("x-remote-user").is_empty());
    assert_eq!(stream.route_cleared, 1);
}

/// The module carries out core's plan for the request, every edit and nothing else: a change
/// to what a decision does, made in core, reaches the module without an edit here.
#[test]
fn the_request_leaves_as_cores_plan_says() {
    use skewgate_core::decision::{RequestHead, decide};
    use skewgate_core::edits::apply as apply_edits;
    use skewgate_core::edits::{Carrier, request_edits};
    use skewgate_core::table::RoutingTable;
    use skewgate_core::testing::SPOOFED_WATCH;

    let mut stream = Fake::request(SPOOFED_WATCH);
    assert!(matches!(filter().on_request_headers(&mut stream), Next::Continue));
    let mut table = sample();
    table["policy"] = json!({"hold": {"maxWait": "0s"}});
    let table = RoutingTable::from_json(sealed(&table).to_string().as_bytes()).expect("the sample");
    let head = RequestHead { method: "GET", target: SPOOFED_WATCH[1].1, token: true, ..Default::default() };
    let decision = decide(&table, &head);
    let plan = request_edits(&decision, SPOOFED_WATCH.iter().map(|(n, _)| *n), Carrier::Module, None);
    let mut sent: Vec<(String, String)> = stream
        .request
        .iter()
        .map(|(n, v)| (String::from_utf8_lossy(n).into_owned(), String::from_utf8_lossy(v).into_owned()))
        .collect();
    sent.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(sent, apply_edits(&plan, SPOOFED_WATCH));
    assert!(sent.iter().any(|(n, v)| n == ROUTE_HEADER && v == NATIVE_LONG_RUNNING), "{sent:?}");
}

/// A certificate client: its identity from the subject Envoy renders, once the certificate's
/// names pass as kube-apiserver reads them; the certificate header is not passed on.
#[test]
fn a_certificate_becomes_the_identity() {
    let certificate = peer_certificate();
    let mut stream = Fake::request(&[
        (":method", "GET"),
        (":path", "/api/v1/namespaces/default/pods"),
        (PEER_CERTIFICATE_HEADER, &certificate),
    ]);
    stream.attributes.push((Attribute::ClientSubject, b"CN=bob,O=ops,O=devs".to_vec()));
    stream.attributes.push((Attribute::ClientCertificateDigest, [b'a'; 64].to_vec()));
    assert!(matches!(filter().on_request_headers(&mut stream), Next::Continue));
    assert_eq!(stream.header("x-remote-user"), ["bob"]);
    assert_eq!(stream.header("x-remote-group"), ["devs", "ops"]);
    assert_eq!(
        stream.header("x-remote-extra-authentication.kubernetes.io%2fcredential-id"),
        [format!("X509SHA256={}", "a".repeat(64))]
    );
    assert_eq!(stream.header(ROUTE_HEADER), [NATIVE]);
    assert!(stream.header(PEER_CERTIFICATE_HEADER).is_empty());
}

/// A certificate kube-apiserver would not read: 401 naming why, nothing routed.
#[test]
fn a_certificate_the_apiserver_would_refuse_gets_401() {
    let universal = url_encoded_pem(&certificate_der(&[(CN, 12, b"ca")], &[(CN, 28, b"\0\0\0a")]));
    let mut stream = Fake::request(&[
        (":method", "GET"),
        (":path", "/api/v1/namespaces/default/pods"),
        ("authorization", "Bearer t"),
        (PEER_CERTIFICATE_HEADER, &universal),
    ]);
    stream.attributes.push((Attribute::ClientSubject, b"CN=admin".to_vec()));
    assert!(matches!(filter().on_request_headers(&mut stream), Next::Pause));
    let (status, body) = stream.reply_json().expect("a JSON reply");
    assert_eq!(status, 401);
    assert!(body["message"].as_str().unwrap_or("").contains("UniversalString"), "{body}");
    assert_eq!(stream.reply.as_ref().map(|r| r.details.as_str()), Some("skewgate_refused"));
    assert!(stream.header(CLUSTER_HEADER).is_empty());
}

/// Envoy's own 503 for a request the module routed becomes skewgate's `Status`, naming the
/// apiservers that serve the GVR; an apiserver's own 503 passes.
#[test]
fn envoys_own_failure_names_the_serving_apiservers() {
    let mut f = filter();
    let mut stream = Fake::request(&[
        (":method", "GET"),
        (":path", "/apis/resource.k8s.io/v1/resourceclaims"),
        ("authorization", "Bearer t"),
    ]);
    f.on_request_headers(&mut stream);
    stream.response.push((b":status".to_vec(), b"503".to_vec()));
    stream.attributes.push((Attribute::ResponseDetails, b"no_healthy_upstream".to_vec()));
    assert!(matches!(f.on_response_headers(&mut stream, true), Next::Pause));
    let (status, body) = stream.reply_json().expect("a JSON reply");
    assert_eq!(status, 503);
    let message = body["message"].as_str().unwrap_or("");
    assert!(message.contains("resourceclaims") && message.contains("set-c"), "{body}");
    // Nothing reached an apiserver: client-go sends it again after a second.
    assert_eq!(stream.reply_header("retry-after"), Some("1"), "{:?}", stream.reply);
    assert_eq!(body["details"]["retryAfterSeconds"], 1);

    // A write that may have reached the apiserver before the reset: not to be sent again.
    let mut f = filter();
    let mut write = Fake::request(&[
        (":method", "PATCH"),
        (":path", "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/x"),
        ("authorization", "Bearer t"),
    ]);
    f.on_request_headers(&mut write);
    write.response.push((b":status".to_vec(), b"503".to_vec()));
    let reset = b"upstream_reset_before_response_started{remote_reset}".to_vec();
    write.attributes.push((Attribute::ResponseDetails, reset));
    assert!(matches!(f.on_response_headers(&mut write, true), Next::Pause));
    assert_eq!(write.reply_header("retry-after"), None, "{:?}", write.reply);
    assert!(write.reply_json().expect("a JSON reply").1.get("details").is_none());

    let mut passed =
        Fake::request(&[(":method", "GET"), (":path", "/api/v1/pods"), ("authorization", "Bearer t")]);
    let mut f = filter();
    f.on_request_headers(&mut passed);
    passed.response.push((b":status".to_vec(), b"503".to_vec()));
    passed.attributes.push((Attribute::ResponseDetails, b"via_upstream".to_vec()));
    assert!(matches!(f.on_response_headers(&mut passed, true), Next::Continue));
    assert!(passed.reply.is_none());
}

/// An OpenAPI document composed at the edge is the proxy-wasm filter's: the module only strips
/// what the decision strips, routes nothing and keeps Envoy's route choice fresh.
#[test]
fn openapi_compositions_are_left_to_the_proxy_wasm_filter() {
    let mut table = sample();
    table["openapiCluster"] = json!("openapi-composer");
    let table = sealed(&table).to_string();
    let mut f = Filter::new(&Config::new(b"m", table.as_bytes()).expect("a table"));
    let mut stream = Fake::request(&[
        (":method", "GET"),
        (":path", "/openapi/v3/apis/resource.k8s.io/v1"),
        ("authorization", "Bearer t"),
        ("x-skewgate-route", "native"),
    ]);
    assert!(matches!(f.on_request_headers(&mut stream), Next::Continue));
    assert!(stream.header(CLUSTER_HEADER).is_empty() && stream.header(ROUTE_HEADER).is_empty());
    assert_eq!(stream.route_cleared, 1);
}

/// With the hold on, a request for an API only one apiserver serves is the proxy-wasm filter's,
/// which waits for that apiserver while it restarts: the module strips what the decision strips
/// and routes nothing. What every apiserver serves it still routes.
#[test]
fn what_the_hold_may_keep_waiting_is_left_to_the_proxy_wasm_filter() {
    let table = sealed(&sample()).to_string();
    let mut f = Filter::new(&Config::new(b"m", table.as_bytes()).expect("a table"));
    let mut stream = Fake::request(&[
        (":method", "GET"),
        (":path", "/apis/resource.k8s.io/v1/resourceclaims"),
        ("authorization", "Bearer t"),
        ("x-skewgate-route", "native"),
    ]);
    assert!(matches!(f.on_request_headers(&mut stream), Next::Continue));
    assert!(stream.header(CLUSTER_HEADER).is_empty() && stream.header(ROUTE_HEADER).is_empty());
    assert_eq!(stream.route_cleared, 1);

    let mut pods = Fake::request(&[
        (":method", "GET"),
        (":path", "/api/v1/namespaces/default/pods"),
        ("authorization", "Bearer t"),
    ]);
    assert!(matches!(f.on_request_headers(&mut pods), Next::Continue));
    assert_eq!(pods.header(ROUTE_HEADER), [NATIVE]);
}

/// A certificate whose names passed is not read again on the worker: its digest is remembered
/// (the same DER, the same verdict); another certificate is read.
#[test]
fn a_certificate_is_read_once_per_worker() {
    let request = |digest: u8, certificate: &str| {
        let mut stream = Fake::request(&[
            (":method", "GET"),
            (":path", "/api/v1/namespaces/default/pods"),
            (PEER_CERTIFICATE_HEADER, certificate),
        ]);
        stream.attributes.push((Attribute::ClientSubject, b"CN=bob".to_vec()));
        stream.attributes.push((Attribute::ClientCertificateDigest, [digest; 64].to_vec()));
        filter().on_request_headers(&mut stream);
        (stream.header("x-remote-user"), stream.reply.map(|r| r.status))
    };
    assert_eq!(request(b'a', &peer_certificate()), (vec!["bob".to_owned()], None));
    // Not read again: what the header says no longer matters for this certificate.
    assert_eq!(request(b'a', "garbage"), (vec!["bob".to_owned()], None));
    assert_eq!(request(b'b', "garbage"), (vec![], Some(401)));
}
