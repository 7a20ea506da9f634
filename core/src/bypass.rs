//! Requests that need no decision, sent by an Envoy route straight to the cluster `decide` would
//! pick, without entering any filter (issue 17). Envoy routes match a request before its filters
//! run, by `:path`, headers and filter state, so the bypass takes only what it can recognise there:
//!
//! - a GET for a resource (or one object of it by name), without subresources (exec, log, ...),
//!   `%`, or `w` in the query (never a watch), or a plain watch of a collection: the regexes of a
//!   [`Target`] (RE2, for Envoy's `safe_regex` on `:path`), one target per cluster `decide` sends
//!   resources to — the pool for those every apiserver serves, a serving set's cluster for the
//!   rerouted ones — each cut into regexes that stay within RE2's fast matching
//!   ([`REGEX_BUDGET`]), Kubernetes' own group/versions in the first;
//! - from a token client (an `authorization` header, no client certificate): nothing to forward;
//! - or from a certificate client whose connection the filter has already mapped: its first
//!   request went through the filter, which left the identity on the connection as filter state
//!   ([`ConnectionIdentity`]), and the route forwards it from there byte for byte.
//!
//! The property tests below show that whatever a target's regexes take, [`crate::decision::decide`]
//! would have sent to that target's cluster, with the same identity and no header change the
//! routes do not make.

use std::collections::BTreeMap;

use crate::identity::{CREDENTIAL_ID_HEADER, Identity, REMOTE_GROUP, REMOTE_USER};
use crate::table::{RoutingTable, Serving};

/// The resources of `table` by where `decide` sends them: every apiserver's (the pool, first), then
/// each serving set's, each by group/version.
pub fn group_versions_by_target(table: &RoutingTable) -> BTreeMap<(bool, &str), GroupVersions> {
    let mut targets: BTreeMap<(bool, &str), GroupVersions> = BTreeMap::new();
    for gvr in table.gvrs() {
        let key = (matches!(gvr.serving, Serving::Set(_)), table.cluster(gvr.serving));
        let gvs = targets.entry(key).or_default();
        gvs.entry((gvr.group.clone(), gvr.version.clone())).or_default().push(gvr.resource.clone());
    }
    targets
}

/// Resources by group/version.
pub type GroupVersions = BTreeMap<(String, String), Vec<String>>;

/// Where one set of bypass routes sends the requests its regexes take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub cluster: String,
    /// A serving set's cluster: the route stamps `x-kubernetes-peer-proxied: true`, as the
    /// filter does for a rerouted request.
    pub rerouted: bool,
    /// `:path` (path and query) of the requests the bypass takes, watches excepted: one regex per
    /// slice of the target's group/versions that fits [`REGEX_BUDGET`], Kubernetes' own first.
    pub path_regexes: Vec<String>,
    /// `:path` of watches of those resources (kube-apiserver's long-running requests, which a
    /// route must not time out), slice by slice as `path_regexes`.
    pub watch_regexes: Vec<String>,
}

/// What the bypass routes of a table are: rendered into Envoy routes by the sidecar.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The pool's target first (when every apiserver serves something), then each serving set's.
    pub targets: Vec<Target>,
    /// Certificate clients too (the table maps certificates to `X-Remote-*`).
    pub certificates: bool,
    /// The headers the certificate route adds, in order, each from a connection property.
    pub identity_headers: Vec<(&'static str, String)>,
    /// Headers the bypass routes remove besides every `x-remote-*` (which the listener's early
    /// header mutation removes from every request before routing) and `x-skewgate-*`.
    pub removed: Vec<&'static str>,
}

impl Plan {
    /// The target of resources every apiserver serves.
    pub fn pool(&self) -> Option<&Target> {
        self.targets.first().filter(|t| !t.rerouted)
    }
}

/// The bypass of `table`, or `None` when it has no resources.
pub fn plan(table: &RoutingTable) -> Option<Plan> {
    plan_within(table, REGEX_BUDGET)
}

/// [`plan`] with regexes of at most `budget` bytes of alternatives each.
fn plan_within(table: &RoutingTable, budget: usize) -> Option<Plan> {
    let targets: Vec<Target> = group_versions_by_target(table)
        .into_iter()
        .map(|((rerouted, cluster), gvs)| {
            let slices = resource_alternatives(&gvs, budget);
            Target {
                cluster: cluster.to_owned(),
                rerouted,
                path_regexes: slices.iter().map(|s| path_regex(s)).collect(),
                watch_regexes: slices.iter().map(|s| watch_regex(s)).collect(),
            }
        })
        .collect();
    if targets.is_empty() {
        return None;
    }
    let policy = table.policy();
    let mut identity_headers = vec![(REMOTE_USER, envoy_key(USER))];
    identity_headers.extend((0..MAX_GROUPS).map(|i| (REMOTE_GROUP, envoy_key(&group_property(i)))));
    if policy.x509_credential_id {
        identity_headers.push((CREDENTIAL_ID_HEADER, envoy_key(CREDENTIAL_ID)));
    }
    Some(Plan {
        targets,
        certificates: policy.client_cert_identity,
        identity_headers,
        removed: match policy.strip_downstream_peer_proxied {
            true => vec![crate::identity::PEER_PROXIED],
            false => Vec::new(),
        },
    })
}

/// The `:path` (path and query) regex of requests the bypass takes of `resources` (alternatives
/// of [`resource_alternatives`]): a collection or one object by name, and a query without `w`
/// (so never `watch`), `%`, `;` or `#`.
fn path_regex(resources: &str) -> String {
    format!("^(?:{resources})(?:/{NAME})?(?:\\?[^w#%;]*)?$")
}

/// The `:path` regex of watches the bypass takes of `resources`: a collection with exactly one
/// parameter beginning with `w`, `watch=true` or `watch=1` (Go's `ParseBool` takes more
/// spellings; those, and a repeated `watch`, go through the filter).
fn watch_regex(resources: &str) -> String {
    const OTHER: &str = "[^w&#%;][^&#%;]*";
    format!("^(?:{resources})\\?(?:{OTHER}&)*watch=(?:true|1)(?:&{OTHER})*$")
}

/// How long the alternatives of one bypass regex may grow. RE2 (Envoy's regex engine, with its
/// default 8 MiB budget) runs its fast DFA out of memory on a regex of every uniform group/version
/// of a 10,000-GVR table (137 KB: searched with RE2 itself, "DFA out of memory" on every search,
/// 2× slower, and the bypass cost 1.29 × plain Envoy instead of 1.04 ×); at 35 KB it did not.
/// Larger tables get one regex (one route of each kind) per slice.
pub const REGEX_BUDGET: usize = 24 * 1024;

/// `/api/v1/(namespaces/NAME/)?(pods|...)|/apis/apps/v1/...` over `gvs`,
/// cut into slices that fit `budget` ([`REGEX_BUDGET`]; a group/version larger than that alone gets a
/// slice of its own). Kubernetes' own come first (the core group, groups without a dot and
/// `*.k8s.io`: pods, nodes, leases, events, deployments — most of a control plane's requests), so
/// that they match the first route of each kind; then the others in the table's order.
fn resource_alternatives(gvs: &GroupVersions, budget: usize) -> Vec<String> {
    let own = |group: &str| group.is_empty() || !group.contains('.') || group.ends_with(".k8s.io");
    let mut alternatives: Vec<(bool, String)> = gvs
        .iter()
        .map(|((group, version), resources)| {
            let prefix = match group.is_empty() {
                true => format!("/api/{}", escape(version)),
                false => format!("/apis/{}/{}", escape(group), escape(version)),
            };
            let resources: Vec<String> = resources.iter().map(|r| escape(r)).collect();
            (!own(group), format!("{prefix}/(?:namespaces/{NAME}/)?(?:{})", resources.join("|")))
        })
        .collect();
    // Stable: within each kind, the table's order.
    alternatives.sort_by_key(|(other, _)| *other);
    let mut slices: Vec<String> = Vec::new();
    for (_, alternative) in alternatives {
        match slices.last_mut() {
            Some(slice) if slice.len() + 1 + alternative.len() <= budget => {
                slice.push('|');
                slice.push_str(&alternative);
            }
            _ => slices.push(alternative),
        }
    }
    slices
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

/// Connection properties (proxy-wasm `set_property`, Envoy filter state `wasm.<name>`, declared
/// read-only with the connection's lifespan) that carry a mapped certificate identity to the
/// bypass route. [`MARKER`] is set last: a route that sees it sees the rest.
pub const MARKER: &str = "skewgate_identity";
pub const USER: &str = "skewgate_user";
pub const CREDENTIAL_ID: &str = "skewgate_credential_id";
/// Certificates with more O values than this always go through the filter (routes name each
/// header they add; kubelets, controllers and admins carry one or two).
pub const MAX_GROUPS: usize = 8;
/// The value of [`MARKER`].
pub const MARKER_VALUE: &str = "1";

pub fn group_property(index: usize) -> String {
    format!("skewgate_group_{index}")
}

/// Envoy's filter-state key of a property the filter sets.
pub fn envoy_key(property: &str) -> String {
    format!("wasm.{property}")
}

/// What the filter leaves on a connection for its identity to be forwarded by the bypass route,
/// in the order to set it, or `None` when this identity must always go through the filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionIdentity {
    pub properties: Vec<(String, String)>,
}

impl ConnectionIdentity {
    /// `credential_id` is the x509 credential id of the connection's certificate when the
    /// filter would send it ([`crate::identity::x509_credential_id`]).
    pub fn new(identity: &Identity<'_>, credential_id: Option<&str>) -> Option<Self> {
        if identity.groups.len() > MAX_GROUPS {
            return None;
        }
        let mut properties = vec![(USER.to_owned(), identity.user.to_string())];
        properties
            .extend(identity.groups.iter().enumerate().map(|(i, g)| (group_property(i), g.to_string())));
        if let Some(id) = credential_id {
            properties.push((CREDENTIAL_ID.to_owned(), id.to_owned()));
        }
        properties.push((MARKER.to_owned(), MARKER_VALUE.to_owned()));
        Some(Self { properties })
    }
}

#[cfg(test)]
#[cfg(not(target_arch = "wasm32"))]
mod tests {
    use super::*;
    use crate::decision::{Action, RequestHead, decide};
    use crate::identity::{self, CREDENTIAL_ID_HEADER, Identity, REMOTE_GROUP, REMOTE_USER};
    use crate::testing::sample;
    use proptest::prelude::*;
    use serde_json::json;

    #[allow(clippy::unwrap_used)] // a test helper: the sample table always compiles
    fn table() -> RoutingTable {
        RoutingTable::from_json(sample().to_string().as_bytes()).unwrap()
    }

    #[test]
    fn sample_has_uniform_and_rerouted_group_versions() {
        let t = table();
        let targets = group_versions_by_target(&t);
        assert_eq!(targets.keys().next(), Some(&(false, t.pool_cluster())), "the pool first");
        assert!(targets.len() > 1, "sample has no rerouted GVR");
        for ((rerouted, cluster), gvs) in &targets {
            for ((g, v), resources) in gvs {
                for r in resources {
                    let serving = t.gvr(g, v, r).unwrap().serving;
                    assert_eq!(
                        (matches!(serving, Serving::Set(_)), t.cluster(serving)),
                        (*rerouted, *cluster)
                    );
                }
            }
        }
        let plan = plan(&t).unwrap();
        assert_eq!(plan.targets.len(), targets.len());
        let pool = plan.pool().unwrap();
        assert_eq!((pool.path_regexes.len(), pool.watch_regexes.len()), (1, 1));
        let re = regex_automata::meta::Regex::new(&pool.path_regexes[0]).unwrap();
        assert!(re.is_match("/api/v1/namespaces/default/pods/web-1"));
        assert!(!re.is_match("/api/v1/namespaces/default/pods?watch=true"));
        assert!(!re.is_match("/api/v1/namespaces/default/pods/web-1/log"));
        let watch = regex_automata::meta::Regex::new(&pool.watch_regexes[0]).unwrap();
        assert!(watch.is_match(
            "/api/v1/namespaces/default/pods?allowWatchBookmarks=true&resourceVersion=1&watch=true"
        ));
        assert!(watch.is_match("/api/v1/configmaps?watch=1"));
        assert!(!watch.is_match("/api/v1/namespaces/default/pods?watch=true&watch=false"));
        assert!(!watch.is_match("/api/v1/namespaces/default/pods/web-1?watch=true"));
    }

    /// The regexes of `regexes`, compiled.
    fn compiled(regexes: &[String]) -> Vec<regex_automata::meta::Regex> {
        regexes.iter().map(|r| regex_automata::meta::Regex::new(r).unwrap()).collect()
    }

    fn any_match(regexes: &[regex_automata::meta::Regex], path: &str) -> bool {
        regexes.iter().any(|r| r.is_match(path))
    }

    /// A table of 2,000 CRD group/versions besides Kubernetes' own: every group/version bypasses,
    /// over regexes that each stay within RE2's reach, Kubernetes' own in the first.
    #[test]
    fn large_tables_cut_their_regexes_into_slices_within_the_budget() {
        let all = ["a", "b", "c"];
        let mut gvs = vec![
            json!({"group": "", "version": "v1", "servedBy": all, "resources": {"pods": all}}),
            json!({"group": "apps", "version": "v1", "servedBy": all, "resources": {"deployments": all}}),
        ];
        // Listed first, so only the ordering puts Kubernetes' own in the first slice.
        gvs.splice(
            0..0,
            (0..2000).map(|i| {
                json!({"group": format!("g{i}.example.com"), "version": "v1", "servedBy": all, "resources": {"widgets": all}})
            }),
        );
        gvs.push(json!({"group": "coordination.k8s.io", "version": "v1", "servedBy": all, "resources": {"leases": all}}));
        let mut t = sample();
        t["groupVersions"] = json!(gvs);
        let t = RoutingTable::from_json(t.to_string().as_bytes()).unwrap();
        let plan = plan(&t).unwrap();
        let plan = plan.pool().unwrap();
        assert!(plan.path_regexes.len() > 1, "{}", plan.path_regexes.len());
        assert_eq!(plan.path_regexes.len(), plan.watch_regexes.len());
        for regex in plan.path_regexes.iter().chain(&plan.watch_regexes) {
            assert!(regex.len() < REGEX_BUDGET + 200, "{}", regex.len());
        }
        let (read, watch) = (compiled(&plan.path_regexes), compiled(&plan.watch_regexes));
        for path in [
            "/api/v1/namespaces/kube-system/pods/coredns",
            "/apis/apps/v1/namespaces/default/deployments/web",
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/node-1",
        ] {
            assert!(read[0].is_match(path), "{path} is not in the first slice");
        }
        for i in [0, 999, 1999] {
            let path = format!("/apis/g{i}.example.com/v1/namespaces/default/widgets/w");
            assert!(any_match(&read, &path), "{path}");
            let watched = format!("/apis/g{i}.example.com/v1/widgets?watch=true");
            assert!(any_match(&watch, &watched) && !any_match(&read, &watched), "{watched}");
        }
        assert!(!any_match(&read, "/apis/g2000.example.com/v1/widgets"));
    }

    /// The headers the certificate route adds for a connection: each of the plan's headers whose
    /// property the filter set (Envoy adds no header for an absent filter-state value).
    fn route_adds(plan: &Plan, conn: &ConnectionIdentity) -> Vec<(String, String)> {
        plan.identity_headers
            .iter()
            .filter_map(|(header, key)| {
                conn.properties
                    .iter()
                    .find(|(p, _)| envoy_key(p) == *key)
                    .map(|(_, v)| (header.to_string(), v.clone()))
            })
            .collect()
    }

    /// What the filter adds for a routed request with this identity (filter/src/http.rs).
    fn filter_adds(
        t: &RoutingTable,
        identity: &Identity<'_>,
        credential_id: Option<&str>,
    ) -> Vec<(String, String)> {
        let mut adds = vec![(REMOTE_USER.to_owned(), identity.user.to_string())];
        adds.extend(identity.groups.iter().map(|g| (REMOTE_GROUP.to_owned(), g.to_string())));
        if let (true, Some(id)) = (t.policy().x509_credential_id, credential_id) {
            adds.push((CREDENTIAL_ID_HEADER.to_owned(), id.to_owned()));
        }
        adds
    }

    #[test]
    fn a_connection_identity_sets_its_marker_last_and_skips_large_group_lists() {
        let id = Identity { user: "system:node:n1".into(), groups: vec!["system:nodes".into()] };
        let conn = ConnectionIdentity::new(&id, Some("X509SHA256=ab")).unwrap();
        assert_eq!(conn.properties.last(), Some(&(MARKER.to_owned(), MARKER_VALUE.to_owned())));
        let many =
            Identity { user: "u".into(), groups: (0..=MAX_GROUPS).map(|i| i.to_string().into()).collect() };
        assert_eq!(ConnectionIdentity::new(&many, None), None);
    }

    proptest! {
        /// Whatever a bypass route matches, for a GET from a token client or from a certificate
        /// client whose connection carries a mapped identity, `decide` picks the route's
        /// cluster (the pool, or the serving set's for rerouted resources), long-running exactly
        /// for watches, no composed answer, not anonymous, with the identity the route adds: the
        /// filter would only have set that cluster header, added those identity headers (and
        /// `x-kubernetes-peer-proxied` when rerouted, which the route sets too) and stripped
        /// headers the bypass strips too.
        #[test]
        fn bypassed_requests_go_where_decide_sends_them(
            // Half collections of uniform and rerouted resources as they are (the routes then
            // match often), half paths built from pieces of uniform and rerouted group/versions.
            path in "(/api/v1/namespaces/default/pods|/api/v1/configmaps|/api/v1/namespaces/a\\.b/configmaps|/api/v1/pods|/apis/resource\\.k8s\\.io/v1/resourceclaims|/apis/resource\\.k8s\\.io/v1/namespaces/default/resourceclaims|/apis/resource\\.k8s\\.io/v1alpha3/deviceclasses){1}|(/api/v1/namespaces/default/pods|/api/v1/nodes|/api/v1|/apis/resource\\.k8s\\.io/v1beta1|/apis/resource\\.k8s\\.io/v1|/apis/apps/v1|/apis|)(/(namespaces|default|kube-system|watch|proxy|pods|configmaps|deployments|resourceclaims|log|exec|status|web-1|a\\.b|%2F|\\.\\.|\\.|v1|)){0,5}",
            query in proptest::option::of(proptest::collection::vec(
                "(watch=(true|1|false|True|t|0|)|watch|allowWatchBookmarks=true|limit=500|resourceVersion=1|labelSelector=app%3Dweb|fieldSelector=metadata\\.name=x|;|[a-zW=;+]{0,6})",
                0..4,
            ).prop_map(|params| params.join("&"))),
            // A certificate subject as Envoy renders it (RFC 2253), or a token client.
            subject in proptest::option::of("(CN=[a-z:é, \\\\]{0,12}|O=[a-z:]{0,6}|OU=x|CN=)(,(O=[a-z:%\"]{0,8}|CN=[a-z]{1,5}|O=)){0,10}"),
            credential in proptest::option::of("[0-9a-f]{64}"),
            // The sample's group/versions in one regex, or cut into slices of one or two.
            budget in prop_oneof![Just(REGEX_BUDGET), 1usize..400],
        ) {
            let t = table();
            let plan = plan_within(&t, budget).unwrap();
            let whole = plan_within(&t, usize::MAX).unwrap();
            let target = match &query { Some(q) => format!("{path}?{q}"), None => path.clone() };
            // Which target's routes take it (Envoy takes the first route that matches; at most
            // one may).
            let mut taken = Vec::new();
            for (sliced, one) in plan.targets.iter().zip(&whole.targets) {
                prop_assert_eq!((&sliced.cluster, sliced.rerouted), (&one.cluster, one.rerouted));
                let plain = any_match(&compiled(&sliced.path_regexes), &target);
                let watched = any_match(&compiled(&sliced.watch_regexes), &target);
                // Slicing takes what one regex over the target's group/versions would, no more.
                prop_assert_eq!(one.path_regexes.len(), 1);
                prop_assert_eq!(plain, any_match(&compiled(&one.path_regexes), &target), "{}", target);
                prop_assert_eq!(watched, any_match(&compiled(&one.watch_regexes), &target), "{}", target);
                if plain || watched {
                    taken.push((sliced, plain, watched));
                }
            }
            prop_assert!(taken.len() <= 1, "{}: {} targets", target, taken.len());
            let Some(&(bypass, plain, watched)) = taken.first() else { return Ok(()) };
            prop_assert!(!(plain && watched), "{}: both routes", target);
            // The filter's earlier request on the same connection: what it left there.
            let conn = match subject.as_deref().map(identity::from_subject) {
                None => None,
                Some(identity::CertIdentity::User(id)) => {
                    let credential_id = credential.as_deref().and_then(identity::x509_credential_id);
                    let Some(conn) = ConnectionIdentity::new(&id, credential_id.as_deref()) else { return Ok(()) };
                    prop_assert_eq!(route_adds(&plan, &conn), filter_adds(&t, &id, credential_id.as_deref()));
                    Some(conn)
                }
                // The filter leaves nothing: the route cannot match.
                Some(_) => return Ok(()),
            };
            prop_assert!(plan.certificates || conn.is_none());
            let h = RequestHead {
                method: "GET",
                target: &target,
                accept: None,
                if_none_match: None,
                client_subject: subject.as_deref(),
                token: conn.is_none(),
            };
            let d = decide(&t, &h);
            let Action::Route(route) = d.action else { return Err(TestCaseError::fail(format!("{target}: refused"))) };
            prop_assert_eq!(route.cluster, bypass.cluster.as_str(), "{}", target);
            prop_assert_eq!(route.rerouted, bypass.rerouted, "{}", target);
            prop_assert!(route.compose.is_none(), "{}: {:?}", target, route);
            // The watch route has no timeout; the other one must never take a long-running request.
            prop_assert_eq!(route.long_running, watched, "{}", target);
            prop_assert!(d.openapi.is_none() && !d.anonymous, "{}", target);
            prop_assert_eq!(d.identity.is_some(), conn.is_some(), "{}", target);
            // What the filter would strip, the bypass strips too: every x-remote-* (the
            // header-mutation filter), x-skewgate-* (the virtual host) and the plan's removals.
            for name in ["authorization", "accept", "user-agent", "x-remote-user", "x-remote-uid", "x-remote-extra-a", "x-kubernetes-peer-proxied", "x-skewgate-route"] {
                // A rerouted route sets x-kubernetes-peer-proxied over whatever the client sent.
                let sets = bypass.rerouted && name == crate::identity::PEER_PROXIED;
                let bypass_strips = name.starts_with("x-remote-") || name.starts_with("x-skewgate-") || plan.removed.contains(&name) || sets;
                prop_assert!(!d.strips(name) || bypass_strips, "{}: {}", target, name);
            }
        }
    }
}
