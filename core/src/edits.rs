//! What a decision does to a request on its way upstream, as data: the proxy-wasm filter and the
//! native dynamic module carry these edits out on Envoy's headers, `skewgate explain` prints
//! them. Every header skewgate reserves for Envoy is named here.

use std::borrow::Cow;

use crate::decision::{Action, Decision};
use crate::identity::{CREDENTIAL_ID_HEADER, PEER_PROXIED, REMOTE_GROUP, REMOTE_USER};
use crate::request_info::{RequestInfo, decode_path, split_target};
use crate::status::{self, Unavailable};
use crate::table::{RoutingTable, Serving};

/// The cluster Envoy's route sends a decided request to (`cluster_header`).
pub const CLUSTER_HEADER: &str = "x-skewgate-cluster";
/// The route class Envoy picks a route by (its timeouts, and whether the filter runs).
pub const ROUTE_HEADER: &str = "x-skewgate-route";
/// Route classes: a long-running request through the filter (no route timeout); anything the
/// native module routed, which must skip the proxy-wasm filter, with or without a timeout.
pub const LONG_RUNNING: &str = "long-running";
pub const NATIVE: &str = "native";
pub const NATIVE_LONG_RUNNING: &str = "native-long-running";

/// Who carries the edits out. They differ in one thing: the native module names a route class
/// for every request it routes (its routes skip the proxy-wasm filter behind it), the filter only
/// for long-running ones (a host call less on every other request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Carrier {
    Filter,
    Module,
}

/// One change to the request's headers, in the order they are to be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Edit<'a> {
    Remove(&'a str),
    /// Replaces every value of the header.
    Set(&'static str, Cow<'a, str>),
    /// Adds a value after those the header has.
    Add(&'static str, Cow<'a, str>),
}

/// The edits `decision` makes to a request whose header names are `names` (as Envoy hands
/// them over, lower-case): the client's reserved headers go, then, for a routed request, the
/// cluster, route class, peer-proxied stamp and certificate identity are set. `credential_id`
/// is the x509 credential id of the client certificate, where the table's policy sends it.
pub fn request_edits<'a>(
    decision: &'a Decision<'_, '_>,
    names: impl IntoIterator<Item = &'a str>,
    carrier: Carrier,
    credential_id: Option<&'a str>,
) -> Vec<Edit<'a>> {
    let mut edits: Vec<Edit<'a>> =
        names.into_iter().filter(|n| decision.strips(n)).map(Edit::Remove).collect();
    let Action::Route(route) = &decision.action else { return edits };
    edits.push(Edit::Set(CLUSTER_HEADER, Cow::Borrowed(route.cluster)));
    if route.compose.is_some() {
        // The apiserver must answer 200 (authorized) or 401/403, not 304 for an ETag of its own
        // document.
        edits.push(Edit::Remove("if-none-match"));
    }
    let class = match (carrier, route.long_running) {
        (Carrier::Filter, true) => Some(LONG_RUNNING),
        (Carrier::Filter, false) => None,
        (Carrier::Module, true) => Some(NATIVE_LONG_RUNNING),
        (Carrier::Module, false) => Some(NATIVE),
    };
    if let Some(class) = class {
        edits.push(Edit::Set(ROUTE_HEADER, Cow::Borrowed(class)));
    }
    if route.rerouted {
        edits.push(Edit::Set(PEER_PROXIED, Cow::Borrowed("true")));
    }
    if let Some(identity) = &decision.identity {
        edits.push(Edit::Set(REMOTE_USER, Cow::Borrowed(identity.user.as_ref())));
        edits.extend(identity.groups.iter().map(|g| Edit::Add(REMOTE_GROUP, Cow::Borrowed(g.as_ref()))));
        if let Some(id) = credential_id {
            edits.push(Edit::Set(CREDENTIAL_ID_HEADER, Cow::Borrowed(id)));
        }
    }
    edits
}

/// The local reply instead of any upstream, for a refused request: status and JSON body.
pub fn refusal(decision: &Decision<'_, '_>) -> Option<(u32, String)> {
    match &decision.action {
        Action::Refuse(why) => Some((401, status::unauthorized(&why.reason()).to_json())),
        Action::Route(_) => None,
    }
}

/// Envoy's own failure (no healthy upstream, a reset, a timeout) for a request skewgate routed,
/// as the 503 `Status` body the filter and the module answer with: the GVR (the table's entry
/// `gvr_id`, or, for one the table does not know, what `unlisted_target` asks for, parsed again
/// on this rare path rather than kept for every request), the cluster and its apiservers, and
/// Envoy's detail.
pub fn unavailable_reply(
    table: &RoutingTable,
    serving: Option<Serving>,
    gvr_id: Option<usize>,
    unlisted_target: Option<&str>,
    envoy_detail: &str,
) -> String {
    let serving = serving.unwrap_or(Serving::All);
    let members: Vec<&str> = table.members(serving).collect();
    let cluster = table.cluster(serving);
    if let Some(g) = gvr_id.and_then(|id| table.gvrs().get(id)) {
        let gvr = Some((g.group.as_str(), g.version.as_str(), g.resource.as_str()));
        return status::service_unavailable(&Unavailable { gvr, cluster, members: &members, envoy_detail })
            .to_json();
    }
    let (raw, query) = split_target(unlisted_target.unwrap_or(""));
    let path = decode_path(raw).unwrap_or(Cow::Borrowed(""));
    let info = RequestInfo::parse("GET", &path, query);
    let gvr = info.is_resource_request.then_some((info.api_group, info.api_version, info.resource));
    status::service_unavailable(&Unavailable { gvr, cluster, members: &members, envoy_detail }).to_json()
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::decision::{RequestHead, decide};
    use crate::table::RoutingTable;

    fn table() -> RoutingTable {
        RoutingTable::from_json(crate::testing::sample().to_string().as_bytes()).unwrap()
    }

    fn head<'a>(target: &'a str, subject: Option<&'a str>) -> RequestHead<'a> {
        RequestHead {
            method: "GET",
            target,
            client_subject: subject,
            certificate_checked: true,
            ..Default::default()
        }
    }

    /// The client's reserved headers go first; then the cluster, the route class (the module's
    /// for every request, the filter's only for long-running ones), the stamp of a rerouted
    /// request and the certificate's identity, groups in order.
    #[test]
    fn a_rerouted_watch_of_a_certificate_client() {
        let t = table();
        let h = head("/apis/resource.k8s.io/v1/resourceclaims?watch=1", Some("CN=bob,O=ops,O=devs"));
        let d = decide(&t, &h);
        let names = ["x-remote-user", "accept", "x-skewgate-route", "x-kubernetes-peer-proxied"];
        let cluster = d.route().unwrap().cluster;
        for (carrier, class) in [(Carrier::Filter, LONG_RUNNING), (Carrier::Module, NATIVE_LONG_RUNNING)] {
            let edits = request_edits(&d, names, carrier, Some("X509SHA256=ab"));
            assert_eq!(
                edits,
                [
                    Edit::Remove("x-remote-user"),
                    Edit::Remove("x-skewgate-route"),
                    Edit::Remove("x-kubernetes-peer-proxied"),
                    Edit::Set(CLUSTER_HEADER, cluster.into()),
                    Edit::Set(ROUTE_HEADER, class.into()),
                    Edit::Set(PEER_PROXIED, "true".into()),
                    Edit::Set(REMOTE_USER, "bob".into()),
                    Edit::Add(REMOTE_GROUP, "devs".into()),
                    Edit::Add(REMOTE_GROUP, "ops".into()),
                    Edit::Set(CREDENTIAL_ID_HEADER, "X509SHA256=ab".into()),
                ]
            );
        }
        assert_eq!(refusal(&d), None);
    }

    /// A read of a resource every apiserver serves, by a token client: the filter sets the
    /// cluster alone; the module names its class too, so that its routes skip the filter.
    #[test]
    fn a_plain_read() {
        let t = table();
        let mut h = head("/api/v1/namespaces/default/pods", None);
        h.token = true;
        let d = decide(&t, &h);
        assert_eq!(
            request_edits(&d, ["authorization"], Carrier::Filter, None),
            [Edit::Set(CLUSTER_HEADER, "pool".into())]
        );
        assert_eq!(
            request_edits(&d, ["authorization"], Carrier::Module, None),
            [Edit::Set(CLUSTER_HEADER, "pool".into()), Edit::Set(ROUTE_HEADER, NATIVE.into())]
        );
    }

    /// Envoy's own 503 names the GVR: the table's entry, or, for one the table does not know,
    /// what the path asks for.
    #[test]
    fn envoys_failure_names_the_gvr_and_the_apiservers() {
        let t = table();
        let known = t.gvrs().iter().position(|g| g.resource == "resourceclaims");
        let body = unavailable_reply(&t, None, known, None, "no_healthy_upstream");
        assert!(body.contains("resourceclaims") && body.contains("no_healthy_upstream"), "{body}");
        let unknown = unavailable_reply(
            &t,
            None,
            None,
            Some("/apis/x.example/v1/namespaces/n/widgets?watch=1"),
            "reset",
        );
        assert!(unknown.contains("widgets.v1.x.example is served by"), "{unknown}");
        assert!(unknown.contains("pool"), "{unknown}");
    }

    /// A refused request loses its reserved headers and gets a 401 `Status` instead of any
    /// routing.
    #[test]
    fn a_refused_certificate() {
        let t = table();
        let h = head("/api/v1/pods", Some("CN=admin\\ "));
        let d = decide(&t, &h);
        assert_eq!(
            request_edits(&d, ["x-remote-group", "accept"], Carrier::Filter, None),
            [Edit::Remove("x-remote-group")]
        );
        let (status, body) = refusal(&d).unwrap();
        assert_eq!(status, 401);
        assert!(body.contains("whitespace"), "{body}");
    }
}
