//! Which decisions the native fast path (the Envoy dynamic module) applies on its own: all but
//! those that need an OpenAPI document composed from every apiserver's, which takes HTTP callouts
//! and stays with the proxy-wasm filter. Composed discovery (merged `/apis`, legacy documents) the
//! module answers itself from the table, as the filter does.

use crate::decision::{Action, Decision};

/// Whether the module applies `d` itself: anything but an OpenAPI composition.
pub fn module_handles(d: &Decision<'_, '_>) -> bool {
    match &d.action {
        Action::Refuse(_) => true,
        Action::Route(_) => d.openapi.is_none(),
    }
}

#[cfg(test)]
#[cfg(not(target_arch = "wasm32"))]
mod tests {
    use super::*;
    use crate::decision::{Reason, RequestHead, decide};
    use crate::table::RoutingTable;
    use crate::testing::sample;
    use proptest::prelude::*;

    proptest! {
        /// The module hands a request to the proxy-wasm filter exactly when an OpenAPI document
        /// is composed at the edge; everything else, composed discovery included, it applies alone.
        #[test]
        fn only_openapi_composition_needs_the_wasm_filter(
            method in "(GET|POST|HEAD|DELETE)",
            path in "(/(api|apis|openapi|v2|v3|v1|v1beta1|resource\\.k8s\\.io|apps|namespaces|default|watch|pods|resourceclaims|log|%2F|\\.\\.|)){0,6}",
            query in "(watch=1|profile=nopeer|hash=x|limit=5|){0,2}",
            accept in proptest::option::of("(application/json|application/json;g=apidiscovery\\.k8s\\.io;v=v2;as=APIGroupDiscoveryList|application/vnd\\.kubernetes\\.protobuf|\\*/\\*)"),
            subject in proptest::option::of("(CN=alice,O=devs|O=devs|CN=)"),
            token in any::<bool>(),
        ) {
            let t = RoutingTable::from_json(sample().to_string().as_bytes()).unwrap();
            let target = format!("{path}?{query}");
            let h = RequestHead { method: &method, target: &target, accept: accept.as_deref(), if_none_match: None, client_subject: subject.as_deref(), client_certificate: None, certificate_checked: true, token };
            let d = decide(&t, &h);
            let openapi = matches!(d.reason, Reason::OpenApiGroupVersion | Reason::OpenApiDocument) && method == "GET" && t.openapi_cluster().is_some();
            let refused = matches!(d.action, Action::Refuse(_));
            prop_assert_eq!(module_handles(&d), refused || !openapi, "{} {}: {:?}", method, target, d.reason);
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
