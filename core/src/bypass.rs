//! Requests that need no decision, sent by an Envoy route straight to the cluster `decide` would
//! pick, without entering any filter: a Wasm filter on every request costs Envoy ~40 % more
//! instructions per request (BENCHMARKS.md). Envoy routes match a request before its filters
//! run, by `:path`, headers and filter state, so the bypass takes only what it can recognise there:
//!
//! - a GET for a resource (or one object of it by name), without subresources (exec, log, ...),
//!   `%`, or `w` in the query (never a watch), or a plain watch of a collection: the regexes of a
//!   [`Target`] (RE2, for Envoy's `safe_regex` on `:path`). The pool's first target takes any
//!   resource of the group/versions whose resources all go to the pool (`decide` sends a
//!   resource it does not know to the pool too): named while their names are short
//!   ([`NAMED_GROUP_VERSIONS_BUDGET`]), else as any group/version but the others (an exception
//!   list), so that the regexes of a large table do not grow with it. The resources of the other
//!   group/versions are named one by one, in the targets of the cluster `decide` sends each to —
//!   the pool, or a serving set's for the rerouted ones (reads only). Each target's regexes are
//!   cut into slices that stay within RE2's fast matching ([`REGEX_BUDGET`]), Kubernetes' own
//!   first;
//! - a GET for a legacy discovery document the table composes nothing for (`/api`, `/api/v1`,
//!   `/apis/<group>`, `/apis/<group>/<version>`: the apiservers answer alike, whatever the
//!   request's `Accept`), in the regexes of the target of the cluster `decide` sends it to
//!   ([`documents`]);
//! - from a token client (an `authorization` header, no client certificate): nothing to forward;
//! - from a certificate client whose connection the filter has already mapped: its first
//!   request went through the filter, which left the identity on the connection as filter state
//!   ([`ConnectionIdentity`]), and the route forwards it from there byte for byte;
//! - or from a client without any credential (no `authorization`, no bearer WebSocket protocol,
//!   no client certificate), and, for the pool's first target alone ([`Plan::pool`]),
//!   `/healthz`, `/livez`, `/readyz`, `/version` and their checks from it: to the target's
//!   anonymous twin, as `decide` sends them, where each apiserver answers as it would a direct
//!   request (load balancers' and probes' checks, unauthenticated discovery).
//!
//! The property tests below show that whatever a target's regexes take, [`crate::decision::decide`]
//! would have sent to that target's cluster, with the same identity and no header change the
//! routes do not make.

use std::collections::{BTreeMap, BTreeSet};

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
    /// Where the same requests go from a client without any credential: `cluster`'s anonymous
    /// twin, or `cluster` itself where the table has none.
    pub anonymous_cluster: String,
    /// The apiservers of `cluster`, for Envoy's 503 when none answers (as the filter's names them).
    pub servers: Vec<String>,
    /// A serving set's cluster: the route stamps `x-kubernetes-peer-proxied: true`, as the
    /// filter does for a rerouted request.
    pub rerouted: bool,
    /// `:path` (path and query) of the requests the bypass takes, watches excepted: one regex per
    /// slice of the target's group/versions that fits [`REGEX_BUDGET`], Kubernetes' own first,
    /// with the legacy discovery documents that go to its cluster as they are.
    pub path_regexes: Vec<String>,
    /// `:path` of watches of those resources (kube-apiserver's long-running requests, which a
    /// route must not time out), slice by slice as `path_regexes`; none for a serving set.
    pub watch_regexes: Vec<String>,
    /// `:path` regexes of requests the target's routes leave to others although its regexes take
    /// them: the pool's first target's, when it takes any group/version, are those whose
    /// resources are not all the pool's.
    pub except: Vec<String>,
    /// The one apiserver of a serving set whose requests the hold keeps waiting while it is away
    /// ([`crate::hold::needs_the_filter`]): its routes are for while it is up. Whoever knows it
    /// is away (the sidecar, from its connection to it) takes them out, and its requests meet
    /// the filter, which holds them; while it serves, they skip the filter as any other.
    pub while_up: Option<String>,
}

/// What the bypass routes of a table are: rendered into Envoy routes by the sidecar.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The pool's target of the group/versions whose resources all go to the pool first (when
    /// every apiserver serves something), then those that name their resources (the pool's in
    /// the other group/versions, each serving set's), most resources first.
    pub targets: Vec<Target>,
    /// Certificate clients too (the table maps certificates to `X-Remote-*`).
    pub certificates: bool,
    /// The headers the certificate route adds, in order, each from a connection property.
    /// The routes remove none: every `x-remote-*` and `x-kubernetes-peer-proxied` a client sent is
    /// gone before routing ([`LISTENER_STRIPS`]), `x-skewgate-*` goes with the virtual host.
    pub identity_headers: Vec<(&'static str, String)>,
}

/// What the listener's early header mutation (envoy-config/bootstrap.yaml) removes from every
/// request before routing: a header prefix, and a header. Removing the header on the bypass routes
/// instead cost each request they took 3,400 instructions more (callgrind, BENCHMARKS.md).
pub const LISTENER_STRIPS: (&str, &str) = ("x-remote-", crate::identity::PEER_PROXIED);

impl Plan {
    /// The target of the group/versions whose resources all go to the pool (always the first).
    pub fn pool(&self) -> Option<&Target> {
        self.targets.first().filter(|t| !t.rerouted)
    }
}

/// The bypass of `table`, or `None` when it has no resources.
pub fn plan(table: &RoutingTable) -> Option<Plan> {
    plan_within(table, REGEX_BUDGET, NAMED_GROUP_VERSIONS_BUDGET)
}

/// [`plan`] with regexes of at most `budget` bytes of alternatives each, naming the uniform
/// group/versions while their names take at most `named` bytes.
fn plan_within(table: &RoutingTable, budget: usize, named: usize) -> Option<Plan> {
    let by_target = group_versions_by_target(table);
    if by_target.is_empty() {
        return None;
    }
    // Group/versions some resource of which goes elsewhere than the pool: their pool resources
    // are named. In the others, the uniform ones, the first target takes any resource: `decide`
    // sends one it does not know to the pool too.
    let mixed: BTreeSet<&(String, String)> =
        by_target.iter().filter(|((rerouted, _), _)| *rerouted).flat_map(|(_, gvs)| gvs.keys()).collect();
    let uniform = by_target.get(&(false, table.pool_cluster())).into_iter().flat_map(BTreeMap::keys);
    let uniform: Vec<(bool, String)> = uniform
        .filter(|gv| !mixed.contains(gv))
        .map(|(g, v)| (!own(g), group_version_prefix(g, v)))
        .collect();
    let resource = format!("/(?:namespaces/{NAMESPACE}/)?{}", any_resource());
    // While they are few, the uniform group/versions are named, in one regex: no exception list
    // to run, which cost each request the bypass took 1,100 instructions (callgrind,
    // BENCHMARKS.md); a group/version the table does not know goes through the filter. Past
    // that, any group/version but the mixed ones, so that a large table's regexes, which Envoy
    // compiles again on each new rds.json, do not grow with its uniform group/versions.
    let mut documents = documents(table, named);
    let (any, except) = match uniform.iter().map(|(_, gv)| gv.len() + 1).sum::<usize>() <= named {
        true => {
            let slices = slices(uniform.into_iter(), budget.saturating_sub(resource.len()));
            (slices.iter().map(|gvs| format!("(?:{gvs}){resource}")).collect(), Vec::new())
        }
        false => {
            const VERSION: &str = "[a-z0-9]+";
            let prefixes = mixed.iter().map(|(g, v)| (false, group_version_prefix(g, v)));
            let except = slices(prefixes, budget).iter().map(|s| prefix_regex(s)).collect();
            (vec![format!("(?:/api/{VERSION}|/apis/{NAME}/{VERSION}){resource}")], except)
        }
    };
    let mut targets = vec![Target {
        cluster: table.pool_cluster().to_owned(),
        anonymous_cluster: table.anonymous_cluster(Serving::All).to_owned(),
        servers: servers(table, table.pool_cluster()),
        rerouted: false,
        path_regexes: path_regexes(&any, documents.remove(table.pool_cluster()), budget),
        watch_regexes: any.iter().map(|a| watch_regex(a)).collect(),
        except,
        while_up: None,
    }];
    // The named targets' regexes are disjoint, so their order decides only how many a request
    // runs before its own: the target with most resources first (a serving set of the newest
    // apiservers, as a rule), which took a rerouted read from 226.5k instructions to 217.9k with
    // the real table's four sets (callgrind, BENCHMARKS.md).
    let mut named: Vec<(bool, &str, GroupVersions)> = by_target
        .iter()
        .map(|((rerouted, cluster), gvs)| {
            let gvs = gvs.iter().filter(|(gv, _)| mixed.contains(gv)).map(|(gv, r)| (gv.clone(), r.clone()));
            (*rerouted, *cluster, gvs.collect::<GroupVersions>())
        })
        .filter(|(_, _, gvs)| !gvs.is_empty())
        .collect();
    named.sort_by_key(|(_, _, gvs)| std::cmp::Reverse(gvs.values().map(Vec::len).sum::<usize>()));
    for (rerouted, cluster, gvs) in &named {
        let slices = resource_alternatives(gvs, budget);
        targets.push(Target {
            cluster: cluster.to_string(),
            anonymous_cluster: table.anonymous_cluster(serving(table, cluster)).to_owned(),
            servers: servers(table, cluster),
            rerouted: *rerouted,
            path_regexes: path_regexes(&slices, documents.remove(*cluster), budget),
            // A serving set's watches go through the filter: Envoy compiles every route's regex
            // again on each new rds.json, a set's regexes name all its GVRs, and a watch, one
            // request for minutes of events, costs next to nothing per event there.
            watch_regexes: match rerouted {
                true => Vec::new(),
                false => slices.iter().map(|s| watch_regex(s)).collect(),
            },
            except: Vec::new(),
            while_up: crate::hold::needs_the_filter(table, serving(table, cluster), *rerouted)
                .then(|| servers(table, cluster).pop())
                .flatten(),
        });
    }
    let policy = table.policy();
    let mut identity_headers = vec![(REMOTE_USER, envoy_key(USER))];
    identity_headers.extend((0..MAX_GROUPS).map(|i| (REMOTE_GROUP, envoy_key(&group_property(i)))));
    if policy.x509_credential_id {
        identity_headers.push((CREDENTIAL_ID_HEADER, envoy_key(CREDENTIAL_ID)));
    }
    Some(Plan { targets, certificates: policy.client_cert_identity, identity_headers })
}

/// The apiservers behind `cluster`, the pool's or a serving set's.
fn servers(table: &RoutingTable, cluster: &str) -> Vec<String> {
    table.members(serving(table, cluster)).map(str::to_owned).collect()
}

/// Which apiservers `cluster` reaches: a serving set's, or the pool's.
fn serving(table: &RoutingTable, cluster: &str) -> Serving {
    table.sets().iter().position(|s| s.cluster == cluster).map_or(Serving::All, Serving::Set)
}

/// The `:path` of the health and version endpoints, their checks included (`/readyz/etcd`,
/// `/livez/poststarthook/...`): `decide` sends every one to the pool, as a non-resource request.
/// The pool's routes take them ([`Plan::pool`]).
pub const HEALTH: &str = "^/(?:healthz|livez|readyz|version)(?:/[-a-z0-9]+)*/?(?:\\?[^#%;]*)?$";

/// The `:path` (path and query) regexes of requests the bypass takes of a target: of each slice
/// of its resources (alternatives of [`resource_alternatives`]) a collection or one object by
/// name, and the legacy discovery documents among `documents` ([`documents`]); with a query
/// without `w` (so never `watch`), `%`, `;` or `#`. The documents are sliced as the resources
/// are, each slice beside the first slice of resources it fits with within `budget`, or alone.
fn path_regexes(resources: &[String], documents: Option<Vec<(bool, String)>>, budget: usize) -> Vec<String> {
    let documents = slices(documents.unwrap_or_default().into_iter(), budget);
    let mut regexes: Vec<(Option<&str>, Option<&str>)> =
        resources.iter().map(|r| (Some(r.as_str()), None)).collect();
    for slice in &documents {
        let fits = |(r, d): &&mut (Option<&str>, Option<&str>)| {
            d.is_none() && r.map_or(0, str::len) + slice.len() <= budget
        };
        match regexes.iter_mut().find(fits) {
            Some(regex) => regex.1 = Some(slice),
            None => regexes.push((None, Some(slice))),
        }
    }
    regexes
        .into_iter()
        .map(|(resources, documents)| {
            let resources = resources.map(|r| format!("(?:{r})(?:/{NAME})?"));
            let alternatives: Vec<String> =
                resources.into_iter().chain(documents.map(str::to_owned)).collect();
            format!("^(?:{})(?:\\?[^w#%;]*)?$", alternatives.join("|"))
        })
        .collect()
}

/// The legacy discovery documents that `decide` leaves to an apiserver as they are, by the
/// cluster it sends each to: those the table composes no document for (the apiservers answer
/// alike), so that whatever the `Accept` asks, an apiserver's answer is the answer: `/api`, and
/// `/api/<version>`, `/apis/<group>`, `/apis/<group>/<version>` of the table's group/versions
/// (`/apis` is the merged document, never one of them). Kubernetes' own groups' always; the
/// others' while their paths take at most `named` bytes, as the uniform group/versions are named:
/// past that a large table's regexes would grow with it, and those documents go through the
/// filter.
fn documents(table: &RoutingTable, named: usize) -> BTreeMap<&str, Vec<(bool, String)>> {
    use crate::decision::{Action, RequestHead, decide};
    let group_versions: BTreeSet<(&str, &str)> =
        table.gvrs().iter().map(|g| (g.group.as_str(), g.version.as_str())).collect();
    let groups: BTreeSet<&str> = group_versions.iter().map(|(g, _)| *g).filter(|g| !g.is_empty()).collect();
    // (another group's, path, its regex)
    let mut paths = vec![(false, "/api".to_owned(), "/api".to_owned())];
    paths.extend(groups.iter().map(|g| (!own(g), format!("/apis/{g}"), format!("/apis/{}", escape(g)))));
    paths.extend(group_versions.iter().map(|&(g, v)| {
        let path = if g.is_empty() { format!("/api/{v}") } else { format!("/apis/{g}/{v}") };
        (!own(g), path, group_version_prefix(g, v))
    }));
    let others: usize = paths.iter().filter(|(other, ..)| *other).map(|(.., regex)| regex.len() + 1).sum();
    let mut by_cluster: BTreeMap<&str, Vec<(bool, String)>> = BTreeMap::new();
    for (other, path, regex) in paths.into_iter().filter(|(other, ..)| !other || others <= named) {
        // A legacy `Accept` (none said): `decide` composes exactly where the table has a
        // document for the path.
        let head = RequestHead { method: "GET", target: &path, token: true, ..RequestHead::default() };
        if let Action::Route(route) = decide(table, &head).action
            && route.compose.is_none()
        {
            by_cluster.entry(route.cluster).or_default().push((other, regex));
        }
    }
    by_cluster
}

/// The `:path` regex of watches the bypass takes of `resources`: a collection with exactly one
/// parameter beginning with `w`, `watch=true` or `watch=1` (Go's `ParseBool` takes more
/// spellings; those, and a repeated `watch`, go through the filter), and none beginning with `s`:
/// `sendInitialEvents` makes a streaming list, which goes only to apiservers that have the
/// feature (`RoutingTable::with_watch_list`).
fn watch_regex(resources: &str) -> String {
    const OTHER: &str = "[^ws&#%;][^&#%;]*";
    format!("^(?:{resources})\\?(?:{OTHER}&)*watch=(?:true|1)(?:&{OTHER})*$")
}

/// How long the alternatives of one bypass regex may grow. RE2 (Envoy's regex engine, with its
/// default 8 MiB budget) runs its fast DFA out of memory on a regex of every uniform group/version
/// of a 10,000-GVR table (137 KB: searched with RE2 itself, "DFA out of memory" on every search,
/// 2× slower, and the bypass cost 1.29 × plain Envoy instead of 1.04 ×); at 35 KB it did not.
/// Larger tables get one regex (one route of each kind) per slice.
pub const REGEX_BUDGET: usize = 24 * 1024;

/// `/api/v1/(namespaces/NAME/)?(pods|...)|/apis/apps/v1/...` over `gvs`, in [`slices`].
/// A resource named as one of kube-apiserver's verbs is left to the filter: `decide` takes
/// `/apis/g/v/watch/x` for a watch of `x`.
fn resource_alternatives(gvs: &GroupVersions, budget: usize) -> Vec<String> {
    let alternatives = gvs.iter().filter_map(|((group, version), resources)| {
        let resources: Vec<String> =
            resources.iter().filter(|r| !SPECIAL_VERBS.contains(&r.as_str())).map(|r| escape(r)).collect();
        let prefix = group_version_prefix(group, version);
        let alternative = format!("{prefix}/(?:namespaces/{NAMESPACE}/)?(?:{})", resources.join("|"));
        (!resources.is_empty()).then_some((!own(group), alternative))
    });
    slices(alternatives, budget)
}

/// Alternatives joined into slices that fit `budget` ([`REGEX_BUDGET`]; one larger than that
/// alone gets a slice of its own), those marked `false` first (Kubernetes' own group/versions:
/// the core group, groups without a dot and `*.k8s.io`, pods, nodes, leases, events,
/// deployments — most of a control plane's requests, which then match the first route of each
/// kind), each kind in the order given.
fn slices(alternatives: impl Iterator<Item = (bool, String)>, budget: usize) -> Vec<String> {
    let mut alternatives: Vec<(bool, String)> = alternatives.collect();
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

/// The escaped path of a group/version: `/api/v1`, `/apis/apps/v1`.
fn group_version_prefix(group: &str, version: &str) -> String {
    match group.is_empty() {
        true => format!("/api/{}", escape(version)),
        false => format!("/apis/{}/{}", escape(group), escape(version)),
    }
}

/// How long the names of the uniform group/versions may grow for the pool's first target to
/// name them: the real table's take 0.7 KB, those of `make bench`'s 1,000-GVR table 3 KB and of
/// its 10,000-GVR table 28 KB.
pub const NAMED_GROUP_VERSIONS_BUDGET: usize = 8 * 1024;

/// A `:path` regex (Envoy matches the whole value) of paths that begin with one of
/// `prefixes`, then end or go on with `/` or `?`.
fn prefix_regex(prefixes: &str) -> String {
    format!("^(?:{prefixes})(?s:[/?].*)?$")
}

/// Kubernetes' own group/versions: the core group, groups without a dot and `*.k8s.io`.
fn own(group: &str) -> bool {
    group.is_empty() || !group.contains('.') || group.ends_with(".k8s.io")
}

/// Any resource of a group/version whose resources all go to the pool: named as kube-apiserver
/// names them (a DNS label), but for its verbs in the place of a resource (`/api/v1/watch/pods`,
/// `/api/v1/proxy/nodes/n1`), which `decide` marks long-running and the read route is not. What
/// `decide` takes for the resource may differ (`namespaces/x/status` is `namespaces`, not
/// `status`), but whatever it takes goes to the pool too. RE2 has no look-ahead: a label that
/// is not `watch` is one that differs from it somewhere, is shorter, or goes on.
fn any_resource() -> String {
    let others: String = SPECIAL_VERBS.iter().filter_map(|v| v.chars().next()).collect();
    let mut alternatives = vec![format!("{}(?:{LABEL_TAIL})?", class_without(LABEL_END, &others))];
    for verb in SPECIAL_VERBS {
        let mut chars = verb.chars();
        if let Some(first) = chars.next() {
            alternatives.push(format!("{first}{}", tail_other_than(chars.as_str())));
        }
    }
    format!("(?:{})", alternatives.join("|"))
}

/// kube-apiserver's verbs in the place of a resource (lower-case letters only).
const SPECIAL_VERBS: [&str; 2] = ["watch", "proxy"];
/// The characters of a DNS label, and those it may end (and begin) with.
const LABEL_MIDDLE: &str = "-abcdefghijklmnopqrstuvwxyz0123456789";
const LABEL_END: &str = "abcdefghijklmnopqrstuvwxyz0123456789";
/// What follows a DNS label's first character, when anything does.
const LABEL_TAIL: &str = "[-a-z0-9]*[a-z0-9]";

/// A label's tail (nothing, or [`LABEL_TAIL`]) other than `rest`.
fn tail_other_than(rest: &str) -> String {
    let mut chars = rest.chars();
    let Some(c) = chars.next() else { return format!("(?:{LABEL_TAIL})") };
    let c_str = c.to_string();
    format!(
        "(?:|{}|{}{LABEL_TAIL}|{c}{})",
        class_without(LABEL_END, &c_str),
        class_without(LABEL_MIDDLE, &c_str),
        tail_other_than(chars.as_str())
    )
}

/// A character class of `chars` without `without`, in ranges: `[-a-oq-vx-z0-9]`.
fn class_without(chars: &str, without: &str) -> String {
    let mut runs: Vec<(char, char)> = Vec::new();
    for c in chars.chars().filter(|c| !without.contains(*c)) {
        match runs.last_mut() {
            Some((_, end)) if u32::from(*end) + 1 == u32::from(c) => *end = c,
            _ => runs.push((c, c)),
        }
    }
    let ranges: String = runs
        .iter()
        .map(|&(first, last)| match u32::from(last) - u32::from(first) {
            0 => first.to_string(),
            1 => format!("{first}{last}"),
            _ => format!("{first}-{last}"),
        })
        .collect();
    format!("[{ranges}]")
}

/// A Kubernetes object name (DNS subdomain), never a dot segment.
const NAME: &str = "[a-z0-9](?:[-a-z0-9.]*[a-z0-9])?";

/// A namespace's name (a DNS label, or a wrong one that `decide` would route the same way: it
/// never looks at the namespace), without dots; short, as it is repeated for every group/version.
const NAMESPACE: &str = "[a-z0-9][-a-z0-9]*";

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

    /// The sample where only c has `WatchList`: streaming lists of what all serve go to c.
    fn table_with_watch_list_skew() -> RoutingTable {
        let mut v = sample();
        for i in 0..2 {
            v["apiservers"][i]["features"] = serde_json::json!({"WatchList": false});
        }
        RoutingTable::from_json(v.to_string().as_bytes()).unwrap()
    }

    #[test]
    fn streaming_lists_are_never_bypassed() {
        let t = table_with_watch_list_skew();
        let plan = plan(&t).unwrap();
        let watches: Vec<String> = plan.targets.iter().flat_map(|t| t.watch_regexes.clone()).collect();
        let watches = compiled(&watches);
        assert!(any_match(&watches, "/api/v1/configmaps?watch=1"));
        for query in [
            "watch=1&sendInitialEvents=true",
            "sendInitialEvents=false&watch=true",
            "watch=1&resourceVersionMatch=NotOlderThan&sendInitialEvents=",
        ] {
            let target = format!("/api/v1/configmaps?{query}");
            assert!(!any_match(&watches, &target), "{target}");
            let head = RequestHead { method: "GET", target: &target, token: true, ..RequestHead::default() };
            assert_eq!(decide(&t, &head).route().map(|r| r.cluster), Some("set-c"), "{target}");
        }
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
        // Any resource of the uniform group/versions, then the targets naming their resources, most first:
        // set-c's, whose routes are for while c is up (c alone serves its resources, whose requests wait
        // in the filter while c restarts), the pool's of v1alpha3 (devicetaintrules: its deviceclasses
        // are a and b's), set-a-b's.
        let clusters: Vec<(&str, bool, Option<&str>)> =
            plan.targets.iter().map(|t| (t.cluster.as_str(), t.rerouted, t.while_up.as_deref())).collect();
        assert_eq!(
            clusters,
            [
                ("pool", false, None),
                ("set-c", true, Some("c")),
                ("pool", false, None),
                ("set-a-b", true, None)
            ]
        );
        let servers: Vec<String> = plan.targets.iter().map(|t| t.servers.join(",")).collect();
        assert_eq!(servers, ["a,b,c", "c", "a,b,c", "a,b"]);
        let pool = plan.pool().unwrap();
        assert_eq!((pool.path_regexes.len(), pool.watch_regexes.len()), (1, 1));
        let takes = |target: &Target, path: &str| {
            target.path_regexes.iter().any(|r| regex_automata::meta::Regex::new(r).unwrap().is_match(path))
        };
        assert!(takes(pool, "/api/v1/namespaces/default/pods/web-1"));
        assert!(takes(pool, "/api/v1/configmaps?limit=5"));
        assert!(takes(pool, "/apis/resource.k8s.io/v1beta1/namespaces/default/resourceclaims?limit=5"));
        assert!(takes(pool, "/api/v1/namespaces/default/watches/w"), "a resource like a verb is not one");
        assert!(
            takes(pool, "/api/v1/namespaces/default/not-in-the-table"),
            "decide sends a resource it does not know to the pool"
        );
        for path in [
            // A group/version the table does not know goes through the filter.
            "/apis/not-in.the.table/v1/widgets",
            "/apis/apps/v1/namespaces/default/deployments",
            "/api/v1/watch/namespaces/default/pods",
            "/Api/v1/pods",
            "/api/v1/../v1/pods",
            "/api/v1/namespaces/default/pods?watch=true",
            "/api/v1/namespaces/default/pods/web-1/log",
            "/api/v1/namespaces/default/pods/web-1?x=%41",
            "/api/v1/watch/pods",
            "/api/v1/watch",
            "/api/v1/proxy/nodes/n1",
            "/api/v1/namespaces/default/proxy/x",
            "/apis/apps/v1/watch/namespaces/default/deployments",
            "/apis/resource.k8s.io/v1/resourceclaims",
            "/apis/resource.k8s.io/v1alpha3/devicetaintrules",
            "/apis/resource.k8s.io/v1alpha3/namespaces/default/deviceclasses?limit=1",
            "/apis/lifecycle.k8s.io/v1alpha1/evictions",
            "/apis/Apps/v1/deployments",
            "/apis/apps/v1/../v1/deployments",
            "/apis/apps/v1",
            "/api/v1/",
        ] {
            assert!(!takes(pool, path), "{path}");
        }
        assert!(takes(&plan.targets[2], "/apis/resource.k8s.io/v1alpha3/devicetaintrules/t"));
        assert!(!takes(&plan.targets[2], "/apis/resource.k8s.io/v1alpha3/deviceclasses/gpu"));
        assert!(takes(&plan.targets[3], "/apis/resource.k8s.io/v1alpha3/deviceclasses/gpu"));
        let claim = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/c";
        let takers: Vec<&Target> = plan.targets.iter().filter(|t| takes(t, claim)).collect();
        assert_eq!(takers.iter().map(|t| t.while_up.as_deref()).collect::<Vec<_>>(), [Some("c")]);
        let mut no_hold = sample();
        no_hold["policy"] = json!({"hold": {"maxWait": "0s"}});
        let no_hold = super::plan(&RoutingTable::from_json(no_hold.to_string().as_bytes()).unwrap()).unwrap();
        let set_c =
            no_hold.targets.iter().find(|t| t.cluster == "set-c").expect("set-c's routes without a hold");
        assert!(takes(set_c, claim));
        assert!(no_hold.targets.iter().all(|t| t.while_up.is_none()), "without a hold, nothing waits");
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

    /// Any DNS label but kube-apiserver's verbs, `watch` and `proxy`, which RE2 cannot take away
    /// with a look-ahead.
    #[test]
    fn any_resource_is_any_label_but_a_verb() {
        let any = regex_automata::meta::Regex::new(&format!("^{}$", any_resource())).unwrap();
        let label = regex_automata::meta::Regex::new("^[a-z0-9](?:[-a-z0-9]*[a-z0-9])?$").unwrap();
        let mut words: Vec<String> = [
            "watch", "proxy", "w", "p", "wa", "watc", "watchx", "watch-1", "proxies", "pods", "a", "0", "-a",
            "a-", "w-", "p-1", "prox", "watches", "xwatch", "",
        ]
        .iter()
        .map(|w| w.to_string())
        .collect();
        // Every string of up to three characters from those that matter.
        let chars = ["", "w", "a", "p", "r", "-", "0", "x"];
        for a in chars {
            for b in chars {
                for c in chars {
                    words.push(format!("{a}{b}{c}"));
                }
            }
        }
        for w in &words {
            let wanted = label.is_match(w) && !SPECIAL_VERBS.contains(&w.as_str());
            assert_eq!(any.is_match(w), wanted, "{w:?}");
        }
        assert!(any_resource().len() < 600, "{}", any_resource());
    }

    /// A table of 2,000 CRD group/versions besides Kubernetes' own, each with a resource only a
    /// and b serve, and 2,000 that every apiserver serves alike: the named resources (the pool's
    /// and set-a-b's) and the exceptions, or the uniform group/versions when they are named, are cut
    /// into regexes that each stay within RE2's reach, Kubernetes' own in the first.
    #[test]
    fn large_tables_cut_their_regexes_into_slices_within_the_budget() {
        let all = ["a", "b", "c"];
        let gv = |group: &str, resource: &str| json!({"group": group, "version": "v1", "servedBy": all, "resources": {resource: all, "gadgets": ["a", "b"]}});
        let uniform = |group: &str| json!({"group": group, "version": "v1", "servedBy": all, "resources": {"widgets": all}});
        let mut gvs = vec![gv("", "pods"), gv("apps", "deployments")];
        // Listed first, so only the ordering puts Kubernetes' own in the first slice.
        gvs.splice(0..0, (0..2000).map(|i| gv(&format!("g{i}.example.com"), "widgets")));
        gvs.splice(0..0, (0..2000).map(|i| uniform(&format!("u{i}.example.com"))));
        gvs.push(gv("coordination.k8s.io", "leases"));
        gvs.push(uniform("batch"));
        let mut t = sample();
        t["groupVersions"] = json!(gvs);
        let t = RoutingTable::from_json(t.to_string().as_bytes()).unwrap();
        let plan = plan(&t).unwrap();
        let clusters: Vec<&str> = plan.targets.iter().map(|t| t.cluster.as_str()).collect();
        assert_eq!(clusters, ["pool", "pool", "set-a-b"]);
        let (pool, named, set) = (&plan.targets[0], &plan.targets[1], &plan.targets[2]);
        for target in [named, set] {
            assert!(target.path_regexes.len() > 1, "{}", target.path_regexes.len());
        }
        assert_eq!(named.path_regexes.len(), named.watch_regexes.len());
        assert_eq!(set.watch_regexes, Vec::<String>::new(), "a set's watches go through the filter");
        // Too many uniform group/versions to name: any but the exceptions.
        assert_eq!((pool.path_regexes.len(), pool.watch_regexes.len()), (1, 1));
        assert!(pool.except.len() > 1, "{}", pool.except.len());
        let with_names = plan_within(&t, REGEX_BUDGET, usize::MAX).unwrap();
        let named_pool = &with_names.targets[0];
        assert!(named_pool.path_regexes.len() > 1 && named_pool.except.is_empty());
        // With the legacy discovery documents of every group/version named too.
        assert!(named_pool.path_regexes.len() > named_pool.watch_regexes.len());
        // Too many CRD groups for their documents: Kubernetes' own alone, in the first regex.
        assert!(compiled(&pool.path_regexes[..1]).iter().all(|r| r.is_match("/apis/coordination.k8s.io/v1")));
        assert!(!any_match(&compiled(&pool.path_regexes), "/apis/u1.example.com/v1"));
        assert!(any_match(&compiled(&named_pool.path_regexes), "/apis/u1.example.com/v1"));
        for regex in plan
            .targets
            .iter()
            .chain(&with_names.targets)
            .flat_map(|t| t.path_regexes.iter().chain(&t.watch_regexes).chain(&t.except))
        {
            assert!(regex.len() < REGEX_BUDGET + 200, "{}", regex.len());
        }
        let (read, watch) = (compiled(&named.path_regexes), compiled(&named.watch_regexes));
        for path in [
            "/api/v1/namespaces/kube-system/pods/coredns",
            "/apis/apps/v1/namespaces/default/deployments/web",
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/node-1",
        ] {
            assert!(read[0].is_match(path), "{path} is not in the first slice");
        }
        let (any, except) = (compiled(&pool.path_regexes), compiled(&pool.except));
        let takes = |path: &str| any_match(&any, path) && !any_match(&except, path);
        let names = compiled(&named_pool.path_regexes);
        assert!(names[0].is_match("/apis/batch/v1/namespaces/default/cronjobs/c"), "not in the first slice");
        for i in [0, 999, 1999] {
            let path = format!("/apis/g{i}.example.com/v1/namespaces/default/widgets/w");
            assert!(any_match(&read, &path) && !takes(&path) && !any_match(&names, &path), "{path}");
            let path = format!("/apis/u{i}.example.com/v1/namespaces/default/anything/w");
            assert!(takes(&path) && any_match(&names, &path) && !any_match(&read, &path), "{path}");
            let watched = format!("/apis/g{i}.example.com/v1/widgets?watch=true");
            assert!(any_match(&watch, &watched) && !any_match(&read, &watched), "{watched}");
            let gadgets = format!("/apis/g{i}.example.com/v1/gadgets");
            assert!(any_match(&compiled(&set.path_regexes), &gadgets) && !any_match(&read, &gadgets));
        }
        assert!(!any_match(&read, "/apis/g2000.example.com/v1/widgets"));
        // What the table does not know: to the pool when it takes any group/version.
        assert!(takes("/apis/u2000.example.com/v1/widgets"));
        assert!(!any_match(&names, "/apis/u2000.example.com/v1/widgets"));
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
        /// Whatever a bypass route matches, for a GET from a token client, from a certificate
        /// client whose connection carries a mapped identity, or from a client without any
        /// credential, `decide` picks the route's cluster (the pool, or the serving set's for
        /// rerouted resources; their anonymous twins for the last), long-running exactly for
        /// watches, no composed answer, with the identity the route adds: the
        /// filter would only have set that cluster header, added those identity headers (and
        /// `x-kubernetes-peer-proxied` when rerouted, which the route sets too) and stripped
        /// headers the bypass strips too.
        #[test]
        fn bypassed_requests_go_where_decide_sends_them(
            // Half collections of uniform and rerouted resources and discovery documents as they
            // are (the routes then match often), half paths built from pieces of uniform and
            // rerouted group/versions.
            path in "(/healthz|/livez/poststarthook/start-informers|/readyz/etcd|/version/|/api|/api/v1|/apis/resource\\.k8s\\.io|/apis/resource\\.k8s\\.io/v1|/apis/resource\\.k8s\\.io/v1alpha3|/apis/lifecycle\\.k8s\\.io|/apis/lifecycle\\.k8s\\.io/v1alpha1|/apis/apps|/apis/apps/v1|/api/v1/namespaces/default/pods|/api/v1/configmaps|/api/v1/namespaces/a\\.b/configmaps|/api/v1/pods|/apis/resource\\.k8s\\.io/v1/resourceclaims|/apis/resource\\.k8s\\.io/v1/namespaces/default/resourceclaims|/apis/resource\\.k8s\\.io/v1alpha3/deviceclasses|/apis/resource\\.k8s\\.io/v1alpha3/devicetaintrules|/apis/x\\.io/v2/namespaces/default/widgets|/apis/lifecycle\\.k8s\\.io/v1alpha1/evictions){1}|(/api/v1/namespaces/default/pods|/api/v1/nodes|/api/v1|/api/v2|/apis/resource\\.k8s\\.io/v1beta1|/apis/resource\\.k8s\\.io/v1|/apis/resource\\.k8s\\.io/v1alpha3|/apis/resource\\.k8s\\.io/v1alpha|/apis/lifecycle\\.k8s\\.io/v1alpha1|/apis/x\\.io/v2|/apis/apps/v1|/apis|/api|)(/(namespaces|default|watch|proxy|pods|resourceclaims|deviceclasses|devicetaintrules|widgets|log|status|finalize|web-1|a\\.b|%2F|\\.\\.|v1|)){0,4}",
            query in proptest::option::of(proptest::collection::vec(
                "(watch=(true|1|false|True|t|0|)|watch|pretty(=true)?|allowWatchBookmarks=true|limit=500|resourceVersion=1|labelSelector=app%3Dweb|fieldSelector=metadata\\.name=x|sendInitialEvents=(true|false|)|resourceVersionMatch=NotOlderThan|;|[a-zW=;+]{0,6})",
                0..4,
            ).prop_map(|params| params.join("&"))),
            // A certificate subject as Envoy renders it (RFC 2253), or a token client.
            subject in proptest::option::of("(CN=[a-z:é, \\\\]{0,12}|O=[a-z:]{0,6}|OU=x|CN=)(,(O=[a-z:%\"]{0,8}|CN=[a-z]{1,5}|O=)){0,10}"),
            credential in proptest::option::of("[0-9a-f]{64}"),
            // The sample's group/versions in one regex, or cut into slices of one or two.
            budget in prop_oneof![Just(REGEX_BUDGET), 1usize..400],
            // The pool's first target naming the uniform group/versions, or taking any.
            named in prop_oneof![Just(NAMED_GROUP_VERSIONS_BUDGET), Just(0)],
            // Without a certificate: no credential at all, or a token.
            anonymous in any::<bool>(),
            // The table has anonymous twins of its clusters.
            twins in any::<bool>(),
            // What a discovery client asks for: a legacy document, an aggregated one, in any
            // encoding, or nothing said.
            accept in proptest::option::of(prop_oneof![
                Just("application/json"),
                Just("application/json, */*"),
                Just("application/vnd.kubernetes.protobuf,application/json"),
                Just("application/yaml"),
                Just("application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"),
                Just("application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;profile=nopeer"),
                Just("*/*"),
            ]),
            // The table composes legacy documents for some paths (the apiservers answer them
            // differently): those always meet the filter.
            composed in any::<bool>(),
        ) {
            // Half the time only c has WatchList: a streaming list must then not be bypassed.
            let mut v = sample();
            if budget % 2 == 0 {
                for i in 0..2 {
                    v["apiservers"][i]["features"] = json!({"WatchList": false});
                }
            }
            if twins {
                v["anonymousClusterPrefix"] = json!("anon-");
            }
            if composed {
                let paths = ["/api", "/api/v1", "/apis/resource.k8s.io", "/apis/resource.k8s.io/v1alpha3", "/apis/lifecycle.k8s.io/v1alpha1"];
                v["legacyDiscovery"] = paths.iter().map(|p| json!({"path": p, "inputs": ["a", "c"], "document": "{}"})).collect();
            }
            let t = RoutingTable::from_json(v.to_string().as_bytes()).unwrap();
            let plan = plan_within(&t, budget, named).unwrap();
            let whole = plan_within(&t, usize::MAX, named).unwrap();
            let target = match &query { Some(q) => format!("{path}?{q}"), None => path.clone() };
            // Which target's routes take it (Envoy takes the first route that matches; at most
            // one may).
            let mut taken = Vec::new();
            prop_assert_eq!(plan.targets.len(), whole.targets.len());
            for (i, (sliced, one)) in plan.targets.iter().zip(&whole.targets).enumerate() {
                prop_assert_eq!((&sliced.cluster, sliced.rerouted), (&one.cluster, one.rerouted));
                let except = any_match(&compiled(&sliced.except), &target);
                let plain = !except && any_match(&compiled(&sliced.path_regexes), &target);
                // Requests without credentials: every target's, and the health and version
                // endpoints on the pool's first.
                let health = anonymous && subject.is_none() && i == 0 && !except && any_match(&compiled(&[HEALTH.to_owned()]), &target);
                let watched = !except && any_match(&compiled(&sliced.watch_regexes), &target);
                // Slicing takes what one regex over the target's group/versions would, no more.
                prop_assert!(one.path_regexes.len() == 1 && one.except.len() <= 1);
                prop_assert_eq!(except, any_match(&compiled(&one.except), &target), "{}", target);
                prop_assert_eq!(plain, !except && any_match(&compiled(&one.path_regexes), &target), "{}", target);
                prop_assert_eq!(watched, !except && any_match(&compiled(&one.watch_regexes), &target), "{}", target);
                prop_assert!(!(health && (plain || watched)), "{}: a health path is no resource", target);
                if plain || watched || health {
                    taken.push((sliced, plain || health, watched));
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
            let anonymous = anonymous && conn.is_none();
            let h = RequestHead {
                method: "GET",
                target: &target,
                accept,
                if_none_match: None,
                client_subject: subject.as_deref(),
                client_certificate: None,
                certificate_checked: true,
                token: conn.is_none() && !anonymous, pretty_agent: false };
            let d = decide(&t, &h);
            let Action::Route(route) = d.action else { return Err(TestCaseError::fail(format!("{target}: refused"))) };
            let cluster = if anonymous { &bypass.anonymous_cluster } else { &bypass.cluster };
            prop_assert_eq!(route.cluster, cluster.as_str(), "{}", target);
            prop_assert_eq!(cluster.starts_with("anon-"), anonymous && twins, "{}", target);
            prop_assert_eq!(route.rerouted, bypass.rerouted, "{}", target);
            prop_assert!(route.compose.is_none(), "{}: {:?}", target, route);
            // The watch route has no timeout; the other one must never take a long-running request.
            prop_assert_eq!(route.long_running, watched, "{}", target);
            prop_assert!(d.openapi.is_none(), "{}", target);
            prop_assert_eq!(d.anonymous, anonymous, "{}", target);
            prop_assert_eq!(d.identity.is_some(), conn.is_some(), "{}", target);
            // What the filter would strip, the bypass strips too: every x-remote-* and
            // x-kubernetes-peer-proxied (the listener), x-skewgate-* (the virtual host).
            for name in ["authorization", "accept", "user-agent", "x-remote-user", "x-remote-uid", "x-remote-extra-a", "x-kubernetes-peer-proxied", "x-skewgate-route"] {
                // A rerouted route sets x-kubernetes-peer-proxied over whatever the client sent.
                let sets = bypass.rerouted && name == crate::identity::PEER_PROXIED;
                let (prefix, header) = LISTENER_STRIPS;
                let bypass_strips = name.starts_with(prefix) || name == header || name.starts_with("x-skewgate-") || sets;
                prop_assert!(!d.strips(name) || bypass_strips, "{}: {}", target, name);
            }
        }
    }
}
