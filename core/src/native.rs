//! Which decisions a native fast path (the Envoy dynamic module) may apply on its own: those
//! complete once the request headers are rewritten. A composed answer (merged or legacy
//! discovery, an OpenAPI document) needs the response path and a callout, which stay with the
//! proxy-wasm filter.

use crate::decision::{Action, Decision};

/// Whether `d` is fully applied by rewriting the request headers (or refusing the request): no
/// composed reply and no OpenAPI callout follow.
pub fn request_path_only(d: &Decision<'_, '_>) -> bool {
    match &d.action {
        Action::Refuse(_) => true,
        Action::Route(route) => route.compose.is_none() && d.openapi.is_none(),
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;
    use crate::decision::{Reason, RequestHead, decide};
    use crate::table::RoutingTable;
    use crate::table::tests::sample;
    use proptest::prelude::*;

    proptest! {
        /// The module hands a request to the proxy-wasm filter exactly when the answer is
        /// composed at the edge; everything else it applies alone.
        #[test]
        fn only_composed_answers_need_the_wasm_filter(
            method in "(GET|POST|HEAD|DELETE)",
            path in "(/(api|apis|openapi|v2|v3|v1|v1beta1|resource\\.k8s\\.io|apps|namespaces|default|watch|pods|resourceclaims|log|%2F|\\.\\.|)){0,6}",
            query in "(watch=1|profile=nopeer|hash=x|limit=5|){0,2}",
            accept in proptest::option::of("(application/json|application/json;g=apidiscovery\\.k8s\\.io;v=v2;as=APIGroupDiscoveryList|application/vnd\\.kubernetes\\.protobuf|\\*/\\*)"),
            subject in proptest::option::of("(CN=alice,O=devs|O=devs|CN=)"),
            token in any::<bool>(),
        ) {
            let t = RoutingTable::from_json(sample().to_string().as_bytes()).unwrap();
            let target = format!("{path}?{query}");
            let h = RequestHead { method: &method, target: &target, accept: accept.as_deref(), if_none_match: None, client_subject: subject.as_deref(), token };
            let d = decide(&t, &h);
            let composed = matches!(d.reason, Reason::MergedDiscovery | Reason::MergedDiscoveryNotModified | Reason::ComposedLegacyDiscovery | Reason::ComposedLegacyNotAcceptable)
                || (matches!(d.reason, Reason::OpenApiGroupVersion | Reason::OpenApiDocument) && method == "GET" && t.openapi_cluster().is_some());
            let refused = matches!(d.action, Action::Refuse(_));
            prop_assert_eq!(request_path_only(&d), refused || !composed, "{} {}: {:?}", method, target, d.reason);
        }

        /// A client's own route class or cluster header never survives the module: otherwise
        /// `x-skewgate-route: native` would skip the proxy-wasm filter on a request the module
        /// left to it.
        #[test]
        fn client_routing_headers_are_always_stripped(name in "[xX]-[sS][kK][eE][wW][gG][aA][tT][eE]-[a-zA-Z-]{0,12}", target in "/[a-z/]{0,20}") {
            let t = RoutingTable::from_json(sample().to_string().as_bytes()).unwrap();
            let h = RequestHead { method: "GET", target: &target, ..Default::default() };
            prop_assert!(decide(&t, &h).strips(&name));
        }
    }
}
