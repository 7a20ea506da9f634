//! Idea (a) of issue 17, kept for measuring: an Envoy route that sends requests for resources
//! every apiserver serves straight to the pool, without any filter. Envoy can only match
//! such requests by their `:path` and by the presence of headers, so the route is narrow: a GET
//! with a token and without a client certificate (which needs the CN/O → X-Remote-* mapping no
//! Envoy route can do), for such a resource (or one object of it by name), without `%`, without
//! `w` in the query (so never a watch), and without subresources (exec, log, ...).
//!
//! [`path_regex`] is that match (RE2 syntax, for Envoy's `safe_regex` on `:path`); the property
//! test below shows that whatever it matches, [`crate::decision::decide`] would have sent to the
//! pool with no header change besides stripping identity headers (which the route does too).

use std::collections::BTreeMap;

use crate::table::{RoutingTable, Serving};

/// Resources every apiserver serves, by group/version.
pub fn uniform_group_versions(table: &RoutingTable) -> BTreeMap<(String, String), Vec<String>> {
    let mut gvs: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for gvr in table.gvrs().iter().filter(|g| g.serving == Serving::All) {
        gvs.entry((gvr.group.clone(), gvr.version.clone())).or_default().push(gvr.resource.clone());
    }
    gvs
}

/// The `:path` (path and query) regex of requests the bypass route takes, or `None` when no
/// group/version is uniform.
pub fn path_regex(table: &RoutingTable) -> Option<String> {
    let gvs = uniform_group_versions(table);
    if gvs.is_empty() {
        return None;
    }
    let alternatives: Vec<String> = gvs
        .iter()
        .map(|((group, version), resources)| {
            let prefix = match group.is_empty() {
                true => format!("/api/{}", escape(version)),
                false => format!("/apis/{}/{}", escape(group), escape(version)),
            };
            let resources: Vec<String> = resources.iter().map(|r| escape(r)).collect();
            format!("{prefix}/(?:namespaces/{NAME}/)?(?:{})", resources.join("|"))
        })
        .collect();
    Some(format!("^(?:{})(?:/{NAME})?(?:\\?[^w#%]*)?$", alternatives.join("|")))
}

/// A Kubernetes object name (DNS subdomain), never a dot segment.
const NAME: &str = "[a-z0-9](?:[-a-z0-9.]*[a-z0-9])?";

fn escape(s: &str) -> String {
    s.chars()
        .flat_map(|c| match c.is_ascii_alphanumeric() || c == '-' {
            true => vec![c],
            false => vec!['\\', c],
        })
        .collect()
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;
    use crate::decision::{Action, RequestHead, decide};
    use crate::identity;
    use crate::testing::sample;
    use proptest::prelude::*;

    #[allow(clippy::unwrap_used)] // a test helper: the sample table always compiles
    fn table() -> RoutingTable {
        RoutingTable::from_json(sample().to_string().as_bytes()).unwrap()
    }

    #[test]
    fn sample_has_uniform_and_rerouted_group_versions() {
        let t = table();
        let gvs = uniform_group_versions(&t);
        assert!(!gvs.is_empty());
        for ((g, v), resources) in &gvs {
            for r in resources {
                assert_eq!(t.gvr(g, v, r).map(|x| x.serving), Some(Serving::All));
            }
        }
        assert!(t.gvrs().iter().any(|g| g.serving != Serving::All), "sample has no rerouted GVR");
        let re = regex_automata::meta::Regex::new(&path_regex(&t).unwrap()).unwrap();
        assert!(re.is_match("/api/v1/namespaces/default/pods/web-1"));
        assert!(!re.is_match("/api/v1/namespaces/default/pods?watch=true"));
        assert!(!re.is_match("/api/v1/namespaces/default/pods/web-1/log"));
    }

    proptest! {
        /// Whatever the bypass route matches (for a GET with a token and no client certificate),
        /// `decide` picks the pool, not long-running, no composed answer, no identity to assert,
        /// not anonymous: the filter would only have set the pool's cluster header and stripped
        /// identity headers, which the route strips too.
        #[test]
        fn bypassed_requests_are_pool_requests(
            // Mostly prefixes of uniform and rerouted group/versions, so that many cases match.
            prefix in "(/api/v1|/apis/resource\\.k8s\\.io/v1beta1|/apis/resource\\.k8s\\.io/v1|/apis/apps/v1|/apis|)",
            tail in "(/(namespaces|default|kube-system|watch|proxy|pods|configmaps|deployments|resourceclaims|log|exec|status|web-1|a\\.b|%2F|\\.\\.|\\.|v1|)){0,5}",
            query in proptest::option::of("(watch=(true|1|false)|limit=500|resourceVersion=1|labelSelector=app%3Dweb|fieldSelector=metadata\\.name=x|&|[a-z=&]{0,10}){0,3}"),
        ) {
            let path = format!("{prefix}{tail}");
            let t = table();
            let re = regex_automata::meta::Regex::new(&path_regex(&t).unwrap()).unwrap();
            let target = match &query { Some(q) => format!("{path}?{q}"), None => path.clone() };
            if re.is_match(&target) {
                let h = RequestHead { method: "GET", target: &target, accept: None, if_none_match: None, client_subject: None, token: true };
                let d = decide(&t, &h);
                let Action::Route(route) = d.action else { return Err(TestCaseError::fail(format!("{target}: refused"))) };
                prop_assert_eq!(route.cluster, t.pool_cluster(), "{}", target);
                prop_assert!(!route.rerouted && !route.long_running && route.compose.is_none(), "{}: {:?}", target, route);
                prop_assert!(d.openapi.is_none() && d.identity.is_none() && !d.anonymous, "{}", target);
                // What the filter would strip, the bypass route strips too: identity headers,
                // x-kubernetes-peer-proxied, x-skewgate-* (removed by the virtual host).
                for name in ["authorization", "accept", "user-agent", "x-remote-user", "x-remote-extra-a", "x-kubernetes-peer-proxied", "x-skewgate-route"] {
                    let bypass_strips = identity::is_identity_header(name) || name == identity::PEER_PROXIED || name.starts_with("x-skewgate-");
                    prop_assert!(!d.strips(name) || bypass_strips, "{}: {}", target, name);
                }
            }
        }
    }
}
