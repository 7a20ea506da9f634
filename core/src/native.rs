//! Which decisions the native fast path (the Envoy dynamic module) applies on its own: all but
//! those that need an OpenAPI document composed from every apiserver's, which takes HTTP callouts,
//! and those for an API whose only server may have to be waited for ([`crate::hold`]): both stay
//! with the proxy-wasm filter, as do writes whose body decides where they go (gated fields,
//! [`crate::decision::GatedWrite`]), which the filter reads. Composed discovery (merged `/apis`, legacy documents) the module
//! answers itself from the table, as the filter does.

use crate::decision::{Action, Decision};
use crate::table::{RoutingTable, Serving};

/// Whether the module applies `d`, decided on `table`, itself: anything but an OpenAPI
/// composition, a gated write or a request the hold may keep waiting.
pub fn module_handles(table: &RoutingTable, d: &Decision<'_, '_>) -> bool {
    match &d.action {
        Action::Refuse(_) => true,
        Action::Route(r) => {
            d.openapi.is_none()
                && r.gated.is_none()
                && !crate::hold::needs_the_filter(table, d.serving.unwrap_or(Serving::All), r.rerouted)
        }
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
        /// is composed at the edge or the request goes to c alone, the only server of its API
        /// (which the hold may keep waiting); everything else, composed discovery included, it
        /// applies alone. Without a hold, only OpenAPI compositions.
        #[test]
        fn only_openapi_composition_and_the_hold_need_the_wasm_filter(
            hold in any::<bool>(),
            method in "(GET|POST|HEAD|DELETE)",
            path in "(/(api|apis|openapi|v2|v3|v1|v1beta1|resource\\.k8s\\.io|apps|namespaces|default|watch|pods|resourceclaims|log|%2F|\\.\\.|)){0,6}",
            query in "(watch=1|profile=nopeer|hash=x|limit=5|){0,2}",
            accept in proptest::option::of("(application/json|application/json;g=apidiscovery\\.k8s\\.io;v=v2;as=APIGroupDiscoveryList|application/vnd\\.kubernetes\\.protobuf|\\*/\\*)"),
            subject in proptest::option::of("(CN=alice,O=devs|O=devs|CN=)"),
            token in any::<bool>(),
        ) {
            let mut table = sample();
            if !hold {
                table["policy"]["hold"] = serde_json::json!({"maxWait": "0s"});
            }
            let t = RoutingTable::from_json(table.to_string().as_bytes()).unwrap();
            let target = format!("{path}?{query}");
            let h = RequestHead { method: &method, target: &target, accept: accept.as_deref(), if_none_match: None, client_subject: subject.as_deref(), client_certificate: None, certificate_checked: true, token, pretty_agent: false };
            let d = decide(&t, &h);
            let openapi = matches!(d.reason, Reason::OpenApiGroupVersion | Reason::OpenApiDocument) && method == "GET" && t.openapi_cluster().is_some();
            let refused = matches!(d.action, Action::Refuse(_));
            let held = match &d.action {
                Action::Route(r) => hold && r.cluster == "set-c",
                Action::Refuse(_) => false,
            };
            prop_assert_eq!(module_handles(&t, &d), refused || !(openapi || held), "{} {}: {:?}", method, target, d.reason);
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

        /// What any decision strips, a carrier keeps the name of when it reads the head
        /// ([`crate::decision::strippable`]), whatever the policy.
        #[test]
        fn every_stripped_name_is_strippable(
            name in "([xX]-([rR][eE][mM][oO][tT][eE]|[sS][kK][eE][wW][gG][aA][tT][eE]|[kK][uU][bB][eE][rR][nN][eE][tT][eE][sS])-[a-zA-Z-]{0,12}|[a-z-]{0,12})",
            strip_peer_proxied in any::<bool>(),
        ) {
            let mut v = sample();
            v["policy"] = serde_json::json!({"stripDownstreamPeerProxied": strip_peer_proxied});
            let t = RoutingTable::from_json(v.to_string().as_bytes()).unwrap();
            let h = RequestHead { method: "GET", target: "/api/v1/pods", ..Default::default() };
            prop_assert!(!decide(&t, &h).strips(&name) || crate::decision::strippable(&name), "{}", name);
        }
    }
}
