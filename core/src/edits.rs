//! What a decision does to a request on its way upstream, as data: the proxy-wasm filter and the
//! native dynamic module carry these edits out on Envoy's headers, `skewgate explain` prints
//! them. Every header skewgate reserves for Envoy is named here.

use std::borrow::Cow;

use crate::decision::{Action, Decision, Reason, RequestHead, Route};
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

/// The edits that send a request decided on already to `route` instead: a gated write whose
/// body named where it goes ([`crate::decision::GatedWrite`]). Its identity and strips stay as
/// the decision made them.
pub fn reroute_edits<'a>(route: &Route<'a>) -> Vec<Edit<'a>> {
    let mut edits = vec![Edit::Set(CLUSTER_HEADER, Cow::Borrowed(route.cluster))];
    if route.rerouted {
        edits.push(Edit::Set(PEER_PROXIED, Cow::Borrowed("true")));
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

/// How long a client is told to wait before it sends again a request Envoy could not get to an
/// apiserver (`Retry-After`, and `details.retryAfterSeconds` in the `Status`): one second, as
/// kube-apiserver's own 429s say. client-go (kubectl, controllers, the kubelet) retries any 5xx
/// that carries `Retry-After`, up to 10 times, waiting that long in between: ten seconds in all,
/// where a real kube-apiserver restart is refused for 0.9–2.2 s and ready 2.0–4.2 s after it
/// starts.
pub const RETRY_AFTER_SECONDS: u32 = 1;
pub const RETRY_AFTER_HEADER: &str = "retry-after";

/// Whether a request Envoy failed with `envoy_detail` (its `response.code_details`) is safe
/// to send again: a read always (GET, HEAD, OPTIONS; a watch is a GET), anything else only
/// when the detail shows it never reached an apiserver. client-go resends any verb on a
/// `Retry-After`, so a write that may have been applied (a reset or a timeout after it was sent)
/// must not carry one, or it could be applied twice.
fn resend_is_safe(read: bool, envoy_detail: &str) -> bool {
    read || never_reached_an_apiserver(envoy_detail)
}

fn is_read(method: &str) -> bool {
    matches!(method, "GET" | "HEAD" | "OPTIONS")
}

fn never_reached_an_apiserver(envoy_detail: &str) -> bool {
    if matches!(
        envoy_detail,
        "no_healthy_upstream" | "cluster_not_found" | "route_not_found" | "maintenance_mode"
    ) {
        return true;
    }
    // The reasons in which no byte of the request reached an apiserver: a refused or failed
    // connection, a circuit breaker, a stream the apiserver refused before reading it.
    reset_reason(envoy_detail).is_some_and(|reason| {
        connection_failed(reason)
            || matches!(reason, "overflow" | "local_refused_stream_reset" | "remote_refused_stream_reset")
    })
}

/// A reset `reason` that says the connection to the apiserver was refused or failed (TLS
/// included).
fn connection_failed(reason: &str) -> bool {
    matches!(
        reason,
        "connection_failure"
            | "local_connection_failure"
            | "remote_connection_failure"
            | "connection_timeout"
    )
}

/// `<reason>` of `upstream_reset_before_response_started{<reason>[|<transport detail>]}`.
fn reset_reason(envoy_detail: &str) -> Option<&str> {
    let reason = envoy_detail.strip_prefix("upstream_reset_before_response_started{")?;
    reason.split(['|', '}']).next()
}

/// Envoy had no apiserver of the cluster to take the request: none healthy, by its own checks
/// (and the sidecar's marks), or, in a cluster of one (`members`), that one refused or failed the
/// connection. What marks a cluster down for the requests that follow ([`crate::hold`]). In a
/// larger cluster a refused connection names one apiserver: Envoy tries another, or ejects it and
/// then finds none healthy.
pub fn no_apiserver_took_it(envoy_detail: &str, members: usize) -> bool {
    envoy_detail == "no_healthy_upstream"
        || (members == 1 && reset_reason(envoy_detail).is_some_and(connection_failed))
}

/// What answering Envoy's own failure of a routed request needs, kept by the filter and the
/// module from the request to its response.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Routed {
    /// Who serves what the request asked for, when the table knows.
    pub serving: Option<Serving>,
    gvr_id: Option<usize>,
    /// The target of a request for a GVR the table does not list, to name it: Envoy's
    /// `request.path` attribute is empty once a retried request has failed.
    unlisted_target: Option<String>,
    /// A read (any failure of it may be sent again), kept rather than the method: no
    /// allocation on every request for a rare path.
    read: bool,
}

impl Routed {
    pub fn of(decision: &Decision<'_, '_>, head: &RequestHead<'_>) -> Routed {
        let unlisted = decision.reason == Reason::ServedByNone;
        Routed {
            serving: decision.serving,
            gvr_id: decision.gvr.map(|g| g.id),
            unlisted_target: unlisted.then(|| head.target.to_owned()),
            read: is_read(head.method),
        }
    }

    /// Envoy's own failure (no healthy upstream, a reset, a timeout) of this request, as the
    /// 503 `Status` the filter and the module answer with: the GVR (the table's entry, or, for
    /// one the table does not know, what the target asks for, parsed again on this rare path
    /// rather than kept for every request), the cluster and its apiservers, Envoy's detail, and
    /// when to send it again where that is safe (a read, or a write that never reached an apiserver).
    pub fn unavailable(&self, table: &RoutingTable, envoy_detail: &str) -> Reply {
        let retry_after = resend_is_safe(self.read, envoy_detail).then_some(RETRY_AFTER_SECONDS);
        self.reply(table, envoy_detail, retry_after)
    }

    /// A request held at the edge ([`crate::hold`]) for `waited` while no apiserver of its
    /// cluster came back: it reached none, so it may always be sent again.
    pub fn held_too_long(&self, table: &RoutingTable, waited: std::time::Duration) -> Reply {
        let detail = format!("no_healthy_upstream; held {:.1}s at the edge", waited.as_secs_f64());
        self.reply(table, &detail, Some(RETRY_AFTER_SECONDS))
    }

    /// The answer to a waiting request whose body grew past what Envoy can keep for it
    /// ([`crate::hold::MAX_HELD_BODY`], or [`crate::hold::MAX_HELD_BODIES`] for all waiting
    /// together): it reached no apiserver, so it may be sent again.
    pub fn body_too_large_to_hold(&self, table: &RoutingTable, room: crate::hold::BodyRoom) -> Reply {
        let detail = match room {
            crate::hold::BodyRoom::NoRoom => format!(
                "no_healthy_upstream; the bodies of the requests waiting for an apiserver reach {} MiB",
                crate::hold::MAX_HELD_BODIES >> 20
            ),
            crate::hold::BodyRoom::TooLarge | crate::hold::BodyRoom::Kept => format!(
                "no_healthy_upstream; its body is over {} KiB, too large to wait for an apiserver",
                crate::hold::MAX_HELD_BODY >> 10
            ),
        };
        self.reply(table, &detail, Some(RETRY_AFTER_SECONDS))
    }

    /// Whether `new`, a table that replaced `old` (the one this request was decided on), sends
    /// it to the same cluster. A request that waited at the edge ([`crate::hold`]) goes on only
    /// then: an apiserver may have come back serving other APIs, and only the live table says
    /// which cluster may have it.
    pub fn routed_alike(&self, old: &RoutingTable, new: &RoutingTable) -> bool {
        let was = self.serving.unwrap_or(Serving::All);
        let now = match self.gvr_id.and_then(|id| old.gvrs().get(id)) {
            Some(g) => match new.gvr(&g.group, &g.version, &g.resource) {
                Some(n) => n.serving,
                None => return false,
            },
            None => was,
        };
        old.cluster(was) == new.cluster(now)
    }

    /// The answer to a request that waited at the edge while the table changed under it so that
    /// it would now go elsewhere: it reached no apiserver, so it may be sent again (and decided
    /// anew).
    pub fn table_changed(&self, table: &RoutingTable) -> Reply {
        let detail = "no_healthy_upstream; the routing table changed while it waited at the edge";
        self.reply(table, detail, Some(RETRY_AFTER_SECONDS))
    }

    /// A waiting request whose place a client with fewer waiting took ([`crate::hold`]: the
    /// waiting room is shared): it reached no apiserver, so it may be sent again.
    pub fn crowded_out(&self, table: &RoutingTable, waited: std::time::Duration) -> Reply {
        let detail = format!(
            "no_healthy_upstream; held {:.1}s at the edge, then its place given to another client's request \
             (the waiting room is full and this client had the most waiting)",
            waited.as_secs_f64()
        );
        self.reply(table, &detail, Some(RETRY_AFTER_SECONDS))
    }

    fn reply(&self, table: &RoutingTable, envoy_detail: &str, retry_after: Option<u32>) -> Reply {
        let serving = self.serving.unwrap_or(Serving::All);
        let members: Vec<&str> = table.members(serving).collect();
        let cluster = table.cluster(serving);
        let unavailable = |gvr| Unavailable { gvr, cluster, members: &members, envoy_detail, retry_after };
        let body = match self.gvr_id.and_then(|id| table.gvrs().get(id)) {
            Some(g) => {
                let gvr = Some((g.group.as_str(), g.version.as_str(), g.resource.as_str()));
                status::service_unavailable(&unavailable(gvr)).to_json()
            }
            None => {
                let (raw, query) = split_target(self.unlisted_target.as_deref().unwrap_or(""));
                let path = decode_path(raw).unwrap_or(Cow::Borrowed(""));
                let info = RequestInfo::parse("GET", &path, query);
                let gvr =
                    info.is_resource_request.then_some((info.api_group, info.api_version, info.resource));
                status::service_unavailable(&unavailable(gvr)).to_json()
            }
        };
        Reply { status: 503, body, retry_after }
    }
}

/// Every request, before the filter has a routing table: nothing reached an apiserver.
pub fn unconfigured() -> Reply {
    let retry_after = Some(RETRY_AFTER_SECONDS);
    let unconfigured = Unavailable {
        gvr: None,
        cluster: "skewgate-unconfigured",
        members: &[],
        envoy_detail: "skewgate has no routing table",
        retry_after,
    };
    Reply { status: 503, body: status::service_unavailable(&unconfigured).to_json(), retry_after }
}

/// An OpenAPI document the edge composes when the composer (the sidecar) cannot answer: never
/// an incomplete document from a single apiserver instead. A read: always safe to ask again.
pub fn composer_unavailable(cluster: &str, detail: &str) -> Reply {
    let body = status::composer_unavailable(cluster, detail, RETRY_AFTER_SECONDS).to_json();
    Reply { status: 503, body, retry_after: Some(RETRY_AFTER_SECONDS) }
}

/// A local reply with a `Status` body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub status: u32,
    pub body: String,
    /// `Retry-After`, when the request may be sent again.
    pub retry_after: Option<u32>,
}

impl Reply {
    /// Its headers: a JSON body, and when to send the request again.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let mut headers = vec![("content-type", "application/json".to_owned())];
        if let Some(seconds) = self.retry_after {
            headers.push((RETRY_AFTER_HEADER, seconds.to_string()));
        }
        headers
    }
}

/// What a header list looks like once `edits` are made to it, as a plan means them: the
/// reference the adapters' fakes are held to. Sorted by name, values in order.
#[cfg(any(test, feature = "testing"))]
pub fn apply(edits: &[Edit<'_>], headers: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> =
        headers.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
    for edit in edits {
        match edit {
            Edit::Remove(name) => out.retain(|(n, _)| !n.eq_ignore_ascii_case(name)),
            Edit::Set(name, value) => {
                out.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
                out.push((name.to_string(), value.to_string()));
            }
            Edit::Add(name, value) => out.push((name.to_string(), value.to_string())),
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
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
        let routed = |method, target| {
            let head = RequestHead { method, target, token: true, ..Default::default() };
            Routed::of(&decide(&t, &head), &head)
        };
        let known = routed("GET", "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims");
        let reply = known.unavailable(&t, "no_healthy_upstream");
        assert!(
            reply.body.contains("resourceclaims") && reply.body.contains("no_healthy_upstream"),
            "{reply:?}"
        );
        assert!(reply.body.contains("is served by [c]"), "{reply:?}");
        let unknown =
            routed("GET", "/apis/x.example/v1/namespaces/n/widgets?watch=1").unavailable(&t, "reset");
        assert!(unknown.body.contains("widgets.v1.x.example is served by"), "{unknown:?}");
        assert!(unknown.body.contains("pool"), "{unknown:?}");
    }

    /// A read may always be sent again, a write only when Envoy's detail shows it never reached
    /// an apiserver; the reply says so in its header and its `Status` alike.
    #[test]
    fn retry_after_only_where_sending_again_is_safe() {
        let never_sent = [
            "no_healthy_upstream",
            "cluster_not_found",
            "upstream_reset_before_response_started{remote_connection_failure|delayed_connect_error:_Connection_refused}",
            "upstream_reset_before_response_started{connection_failure|TLS_error:_268435581:SSL_routines}",
            "upstream_reset_before_response_started{overflow}",
            "upstream_reset_before_response_started{remote_refused_stream_reset}",
        ];
        let maybe_sent = [
            "upstream_reset_before_response_started{connection_termination}",
            "upstream_reset_before_response_started{remote_reset}",
            "upstream_response_timeout",
            "upstream_per_try_timeout",
            "upstream_reset_after_response_started{remote_reset}",
            "",
        ];
        for detail in never_sent {
            assert!(resend_is_safe(is_read("POST"), detail), "{detail}");
        }
        for detail in maybe_sent {
            assert!(
                !resend_is_safe(is_read("POST"), detail) && !resend_is_safe(is_read("PATCH"), detail),
                "{detail}"
            );
            assert!(resend_is_safe(is_read("GET"), detail), "a read: {detail}");
        }
        let t = table();
        let head = RequestHead {
            method: "POST",
            target: "/api/v1/namespaces/ns/pods",
            token: true,
            ..Default::default()
        };
        let routed = Routed::of(&decide(&t, &head), &head);
        let safe = routed.unavailable(&t, "no_healthy_upstream");
        assert_eq!(safe.retry_after, Some(RETRY_AFTER_SECONDS));
        assert!(safe.headers().contains(&(RETRY_AFTER_HEADER, "1".to_owned())));
        let status: serde_json::Value = serde_json::from_str(&safe.body).unwrap();
        assert_eq!(status["details"]["retryAfterSeconds"], 1, "{status}");
        let unsafe_ = routed.unavailable(&t, "upstream_reset_before_response_started{remote_reset}");
        assert_eq!(unsafe_.retry_after, None);
        assert!(!unsafe_.headers().iter().any(|(name, _)| *name == RETRY_AFTER_HEADER));
        let status: serde_json::Value = serde_json::from_str(&unsafe_.body).unwrap();
        assert!(status.get("details").is_none(), "{status}");
        assert!(status["message"].as_str().unwrap().contains("may have reached an apiserver"), "{status}");
        assert_eq!(unconfigured().retry_after, Some(RETRY_AFTER_SECONDS));
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
