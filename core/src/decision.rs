//! The per-request decision (docs/architecture.md, "Request path"): one pure function from a request head and a routing
//! table to what Envoy must do. The filter and `skewgate explain` both call [`decide`].

use crate::accept::{DiscoveryAccept, Encoding, negotiate};
use crate::certificate;
use crate::discovery::MEDIA_TYPE_V2_JSON;
use crate::discovery::protobuf::{MEDIA_TYPE_PROTOBUF, MEDIA_TYPE_V2_PROTOBUF};
use crate::features::{self, GatedResource};
use crate::identity::{self, CertIdentity, Identity, Unforwardable};
use crate::pretty;
use crate::request_info::{RequestInfo, decode_path, has_send_initial_events, split_target};
use crate::table::{Gvr, LegacyPath, RoutingTable, Serving};

/// What the decision needs to know about a request: the few headers it reads.
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestHead<'r> {
    pub method: &'r str,
    /// `:path`: path and query, as received.
    pub target: &'r str,
    pub accept: Option<&'r str>,
    pub if_none_match: Option<&'r str>,
    /// Subject of the verified downstream client certificate (Envoy's RFC 2253 rendering):
    /// [`crate::identity::client_subject`].
    pub client_subject: Option<&'r str>,
    /// The certificate itself as Envoy renders it (`%DOWNSTREAM_PEER_CERT%`, URL-encoded PEM),
    /// when the filter has it: an identity is taken from the subject only if kube-apiserver
    /// would read the certificate ([`crate::certificate`]).
    pub client_certificate: Option<&'r [u8]>,
    /// The connection's certificate was checked and mapped on an earlier request (the filter
    /// left its identity on the connection): not checked again.
    pub certificate_checked: bool,
    /// The request carries a token (`Authorization`, or the WebSocket bearer subprotocol).
    pub token: bool,
    /// The `User-Agent` is curl's, Wget's or a browser's, for which kube-apiserver writes JSON
    /// indented ([`crate::pretty::agent_wants`]).
    pub pretty_agent: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision<'t, 'r> {
    pub action: Action<'t>,
    pub reason: Reason,
    /// The table's entry for the requested GVR, when it has one.
    pub gvr: Option<&'t Gvr>,
    /// Who serves what the request asks for (GVR, group/version or group), when the table knows.
    pub serving: Option<Serving>,
    /// Identity to assert upstream (from the client certificate), after stripping the client's.
    pub identity: Option<Identity<'r>>,
    /// No credential at all: routed to the cluster's twin without the front-proxy certificate.
    pub anonymous: bool,
    /// An OpenAPI document composed from every apiserver's: once an apiserver has authorized
    /// the request, the filter fetches the answer from this cluster.
    pub openapi: Option<&'t str>,
    strip_peer_proxied: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action<'t> {
    Route(Route<'t>),
    /// 401: the client certificate's identity cannot be forwarded unchanged.
    Refuse(Unforwardable),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route<'t> {
    pub cluster: &'t str,
    /// Sent to a subset of apiservers: stamp `x-kubernetes-peer-proxied: true`.
    pub rerouted: bool,
    /// Watches, exec, logs and the like (kube-apiserver's long-running check): no route timeout.
    pub long_running: bool,
    /// A document composed at the edge: the request still goes upstream without
    /// `If-None-Match`, so that an apiserver authenticates and authorizes it; only a 2xx or 304
    /// answer is replaced by this reply, a 401 or 403 reaches the client as the apiserver sent it.
    pub compose: Option<Reply<'t>>,
    /// A write whose body may set fields that some of the apiservers it goes to drop or refuse:
    /// its body decides ([`GatedWrite::route`]).
    pub gated: Option<GatedWrite>,
}

/// A write of a resource with gated fields ([`crate::features::GATED`]) whose gates only some of
/// its apiservers have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GatedWrite {
    pub resource: &'static GatedResource,
    /// The gates of its fields that narrow where it goes (a mask of [`crate::features::bit`]s).
    pub gates: u32,
    pub serving: Serving,
}

impl GatedWrite {
    /// The gates among [`GatedWrite::gates`] whose fields the body sets
    /// ([`crate::field_use::gates_used`]).
    pub fn used(&self, content_type: Option<&str>, content_encoding: Option<&str>, body: &[u8]) -> u32 {
        crate::field_use::gates_used(self.resource, self.gates, content_type, content_encoding, body)
    }

    /// Where the write goes once its body is known to use `gates`: to the apiservers that have
    /// them all, or `None` to where it was routed.
    pub fn route<'t>(&self, table: &'t RoutingTable, gates: u32) -> Option<(Serving, Route<'t>)> {
        let narrowed = table.with_features(self.serving, gates & self.gates)?;
        Some((narrowed, to_serving(table, narrowed, false)))
    }
}

/// What the filter answers in place of an authorized upstream answer: the merged aggregated
/// discovery document (or a 304 when the client already has it), a composed legacy discovery
/// document, in JSON or protobuf, or 406 for a composed document asked for in YAML.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply<'t> {
    pub status: u16,
    pub content_type: &'static str,
    /// Quoted, as sent in the `ETag` header; "" for documents that upstream serves without one
    /// (legacy discovery).
    pub etag: &'t str,
    /// Empty for 304.
    pub body: &'t [u8],
    /// Which document, so that the filter can find it again when the apiserver's answer comes.
    pub source: Composed,
}

/// How a composed document is written: the negotiated encoding and, for JSON, whether indented
/// as kube-apiserver writes it for a pretty request ([`crate::pretty`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Form {
    pub encoding: Encoding,
    pub pretty: bool,
}

impl Form {
    fn of(encoding: Encoding, head: &RequestHead<'_>) -> Form {
        let pretty =
            encoding == Encoding::Json && pretty::wanted(split_target(head.target).1, head.pretty_agent);
        Form { encoding, pretty }
    }
}

/// Which composed document a [`Reply`] carries, in which form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Composed {
    /// The peer-aggregated `/apis`.
    MergedDiscovery(Form),
    /// Index into the table's composed legacy documents.
    Legacy(usize, Form),
    /// 406 Not Acceptable: the Accept header allows only YAML, or the table's document does not
    /// decode as its kind (so no faithful protobuf form exists).
    NotAcceptable,
}

const MEDIA_TYPE_JSON: &str = "application/json";

/// kube-apiserver's wording for a media type it cannot produce, and why skewgate cannot.
/// YAML is left out: Go's YAML writer (key order, quoting) is not one to imitate byte for byte
/// for a type no Kubernetes client asks discovery in.
const NOT_ACCEPTABLE: &str = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"only the following media types are accepted: application/json, application/vnd.kubernetes.protobuf (skewgate composes this discovery document from several apiservers' documents, and not in YAML)","reason":"NotAcceptable","code":406}"#;

const NOT_ACCEPTABLE_REPLY: Reply<'static> = Reply {
    status: 406,
    content_type: MEDIA_TYPE_JSON,
    etag: "",
    body: NOT_ACCEPTABLE.as_bytes(),
    source: Composed::NotAcceptable,
};

impl Reply<'_> {
    /// Response headers besides `:status`; an empty value means "no such header".
    pub fn headers(&self) -> [(&'static str, &str); 4] {
        let content_type = if self.status == 304 { "" } else { self.content_type };
        let (vary, cache_control) = if self.etag.is_empty() { ("", "") } else { ("Accept", "public") };
        [
            ("content-type", content_type),
            ("etag", self.etag),
            ("vary", vary),
            ("cache-control", cache_control),
        ]
    }
}

/// The reply for `source` in `table`: what the decision chose, found again from the filter's
/// response callback (the table a request was decided on stays with the request).
pub fn composed_reply(table: &RoutingTable, source: Composed, status: u16) -> Option<Reply<'_>> {
    let reply = match source {
        Composed::MergedDiscovery(form) => {
            let merged = table.merged_discovery()?;
            // The ETag names the document, not its encoding: kube-apiserver answers 304 before it
            // negotiates.
            let encoded = match status {
                304 => Some((MEDIA_TYPE_V2_JSON, &[][..])),
                _ => encoded(
                    form,
                    [MEDIA_TYPE_V2_JSON, MEDIA_TYPE_V2_PROTOBUF],
                    &merged.document,
                    || merged.pretty(),
                    || merged.protobuf(),
                ),
            };
            let Some((content_type, body)) = encoded else { return Some(NOT_ACCEPTABLE_REPLY) };
            Reply { status, content_type, etag: &merged.quoted_etag, body, source }
        }
        Composed::Legacy(index, form) => {
            let document = table.legacy_discovery().at(index)?;
            let encoded = encoded(
                form,
                [MEDIA_TYPE_JSON, MEDIA_TYPE_PROTOBUF],
                &document.document,
                || document.pretty(),
                || document.protobuf(),
            );
            let Some((content_type, body)) = encoded else { return Some(NOT_ACCEPTABLE_REPLY) };
            Reply { status: 200, content_type, etag: "", body, source }
        }
        Composed::NotAcceptable => NOT_ACCEPTABLE_REPLY,
    };
    Some(reply)
}

/// A composed document in `form`, with its media type (`media`: JSON's, protobuf's); `None`
/// for YAML, which skewgate does not compose.
fn encoded<'t>(
    form: Form,
    media: [&'static str; 2],
    json: &'t str,
    pretty: impl FnOnce() -> &'t [u8],
    protobuf: impl FnOnce() -> Option<&'t [u8]>,
) -> Option<(&'static str, &'t [u8])> {
    match form.encoding {
        Encoding::Json if form.pretty => Some((media[0], pretty())),
        Encoding::Json => Some((media[0], json.as_bytes())),
        Encoding::Protobuf => Some((media[1], protobuf()?)),
        Encoding::Yaml => None,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Not a resource request and not a discovery path skewgate routes: any apiserver answers.
    NonResource,
    /// The path does not decode (bad `%` escape); every apiserver rejects it alike.
    UndecodablePath,
    /// The apiserver's own parser rejects this path too; any apiserver answers the error.
    InvalidResourcePath,
    ServedByAll,
    /// Nobody lists it: any apiserver answers 404, or serves a CRD newer than the table.
    ServedByNone,
    ServedBySubset,
    /// A streaming list (`watch` with `sendInitialEvents`): to the apiservers of its resource
    /// that have the `WatchList` feature, when only some do.
    WatchListSubset,
    MergedDiscovery,
    MergedDiscoveryNotModified,
    /// `/apis` asked for one apiserver's own view (`profile=nopeer`, legacy, v2beta1, protobuf).
    LocalDiscovery,
    /// `/apis` in v2 with no merged document in the table.
    NoMergedDocument,
    LegacyGroupDiscovery,
    LegacyGroupVersionDiscovery,
    /// Legacy discovery whose apiservers' documents differ: answered with the composed one.
    ComposedLegacyDiscovery,
    /// A document composed at the edge (legacy or aggregated), asked for in YAML: 406.
    ComposedNotAcceptable,
    OpenApiGroupVersion,
    /// `/openapi/v2`, the `/openapi/v3` index or a v3 document not of a group/version.
    OpenApiDocument,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::NonResource => "non-resource request: any apiserver",
            Reason::UndecodablePath => "path has an invalid %-escape: any apiserver rejects it",
            Reason::InvalidResourcePath => {
                "resource path the apiserver cannot parse: any apiserver answers the error"
            }
            Reason::ServedByAll => "GVR served by every apiserver",
            Reason::ServedByNone => {
                "GVR served by no apiserver in the table: any apiserver answers (404, or a CRD newer than the table)"
            }
            Reason::ServedBySubset => "GVR served by a subset of apiservers: rerouted to them",
            Reason::WatchListSubset => {
                "streaming list (sendInitialEvents): to the apiservers of the GVR that have the WatchList feature"
            }
            Reason::MergedDiscovery => "aggregated discovery v2: answered with the peer-aggregated document",
            Reason::MergedDiscoveryNotModified => {
                "aggregated discovery v2: If-None-Match matches the peer-aggregated document"
            }
            Reason::LocalDiscovery => {
                "discovery without peer aggregation (nopeer, or legacy documents the apiservers answer alike), or a media type no apiserver serves: any apiserver"
            }
            Reason::NoMergedDocument => {
                "aggregated discovery v2 but the table has no merged document: any apiserver"
            }
            Reason::LegacyGroupDiscovery => {
                "legacy group discovery, nothing composed (the apiservers answer alike, or their legacy documents are unknown): apiservers that list the group"
            }
            Reason::LegacyGroupVersionDiscovery => {
                "legacy group/version discovery, nothing composed (the apiservers answer alike, or their legacy documents are unknown): apiservers that list the group/version"
            }
            Reason::ComposedLegacyDiscovery => {
                "legacy discovery the apiservers answer differently: answered with the composed document"
            }
            Reason::ComposedNotAcceptable => {
                "discovery document composed at the edge (in JSON and protobuf), asked for in YAML: 406"
            }
            Reason::OpenApiGroupVersion => "OpenAPI v3 of a group/version: apiservers that serve it",
            Reason::OpenApiDocument => "OpenAPI document: any apiserver",
        }
    }
}

impl<'t> Decision<'t, '_> {
    /// Whether the filter must remove this downstream request header before anything else.
    pub fn strips(&self, header_name: &str) -> bool {
        strippable(header_name)
            && (self.strip_peer_proxied || !header_name.eq_ignore_ascii_case(identity::PEER_PROXIED))
    }
}

/// Whether some decision may strip this header ([`Decision::strips`] with every policy): the
/// only names a carrier need keep from a request's head.
pub fn strippable(header_name: &str) -> bool {
    identity::is_identity_header(header_name)
        || is_reserved(header_name)
        || header_name.eq_ignore_ascii_case(identity::PEER_PROXIED)
}

impl<'t> Decision<'t, '_> {
    pub fn route(&self) -> Option<&Route<'t>> {
        match &self.action {
            Action::Route(r) => Some(r),
            Action::Refuse(_) => None,
        }
    }
}

/// `x-skewgate-*` headers steer Envoy (cluster, route without timeout): only the filter sets them.
fn is_reserved(header_name: &str) -> bool {
    header_name
        .as_bytes()
        .get(..RESERVED_PREFIX.len())
        .is_some_and(|p| p.eq_ignore_ascii_case(RESERVED_PREFIX.as_bytes()))
}

const RESERVED_PREFIX: &str = "x-skewgate-";

/// Decides what to do with a request. Allocates nothing unless the path or the certificate
/// subject carries escapes.
pub fn decide<'t, 'r>(table: &'t RoutingTable, head: &RequestHead<'r>) -> Decision<'t, 'r> {
    let (raw_path, query) = split_target(head.target);
    match decode_path(raw_path) {
        Ok(path) => decide_parsed(table, head, &RequestInfo::parse(head.method, &path, query)),
        Err(_) => finish(table, head, pool(table, Reason::UndecodablePath)),
    }
}

/// [`decide`] for a request already parsed, so `skewgate explain` can show the parse too.
pub fn decide_parsed<'t, 'r>(
    table: &'t RoutingTable,
    head: &RequestHead<'r>,
    info: &RequestInfo<'_>,
) -> Decision<'t, 'r> {
    let outcome = if info.is_resource_request {
        resource(table, info, split_target(head.target).1)
    } else {
        non_resource(table, head, info.path)
    };
    finish(table, head, outcome)
}

struct Outcome<'t> {
    action: Action<'t>,
    reason: Reason,
    gvr: Option<&'t Gvr>,
    serving: Option<Serving>,
}

fn finish<'t, 'r>(table: &'t RoutingTable, head: &RequestHead<'r>, o: Outcome<'t>) -> Decision<'t, 'r> {
    let policy = table.policy();
    let mut action = o.action;
    // kube-apiserver authenticates a verified certificate before any token; a certificate it
    // would not take a user from leaves the decision to the token, or to anonymous access.
    let (identity, cert_decides) = match (&action, head.client_subject, policy.client_cert_identity) {
        (Action::Route(_), Some(subject), true) => match certificate_identity(head, subject) {
            CertIdentity::User(identity) => (Some(identity), true),
            CertIdentity::NoUser => (None, false),
            CertIdentity::Refused(why) => {
                action = Action::Refuse(why);
                (None, true)
            }
        },
        (_, Some(_), false) => (None, true),
        _ => (None, false),
    };
    let anonymous = !cert_decides && !head.token;
    if let (Action::Route(route), true) = (&mut action, anonymous) {
        route.cluster = table.anonymous_cluster(o.serving.unwrap_or(Serving::All));
    }
    let openapi = match (o.reason, head.method) {
        (Reason::OpenApiGroupVersion | Reason::OpenApiDocument, "GET") => table.openapi_cluster(),
        _ => None,
    };
    Decision {
        openapi,
        action,
        reason: o.reason,
        gvr: o.gvr,
        serving: o.serving,
        identity,
        anonymous,
        strip_peer_proxied: policy.strip_downstream_peer_proxied,
    }
}

/// The identity of a verified certificate, if kube-apiserver would read the certificate at all:
/// Go's parser refuses a certificate Envoy's takes, and the apiserver would then take no user
/// and no token from its connection.
fn certificate_identity<'r>(head: &RequestHead<'r>, subject: &'r str) -> CertIdentity<'r> {
    if !head.certificate_checked {
        let names = head.client_certificate.map_or(Err(certificate::Refusal::Unseen), certificate::check_pem);
        if let Err(why) = names {
            return CertIdentity::Refused(Unforwardable::Certificate(why));
        }
    }
    identity::from_subject(subject)
}

fn pool(table: &RoutingTable, reason: Reason) -> Outcome<'_> {
    let route = Route {
        cluster: table.pool_cluster(),
        rerouted: false,
        long_running: false,
        compose: None,
        gated: None,
    };
    Outcome { action: Action::Route(route), reason, gvr: None, serving: None }
}

fn to_serving(table: &RoutingTable, serving: Serving, long_running: bool) -> Route<'_> {
    Route {
        cluster: table.cluster(serving),
        rerouted: matches!(serving, Serving::Set(_)),
        long_running,
        compose: None,
        gated: None,
    }
}

fn resource<'t>(table: &'t RoutingTable, info: &RequestInfo<'_>, query: &str) -> Outcome<'t> {
    if info.error.is_some() {
        return pool(table, Reason::InvalidResourcePath);
    }
    let long_running = is_long_running(info);
    // The subresource never matters (docs/upstream-facts.md, "Decision"): the apiserver serving `pods` answers
    // `pods/resize` too, or 404s it, as upstream does.
    let Some(gvr) = table.gvr(info.api_group, info.api_version, info.resource) else {
        let mut o = pool(table, Reason::ServedByNone);
        o.action = Action::Route(Route {
            cluster: table.pool_cluster(),
            rerouted: false,
            long_running,
            compose: None,
            gated: None,
        });
        return o;
    };
    let reason = match gvr.serving {
        Serving::All => Reason::ServedByAll,
        Serving::Set(_) => Reason::ServedBySubset,
    };
    // A streaming list, to the apiservers of the resource that have the feature. Only a watch
    // is one: the parameter on a list is refused by every apiserver alike.
    let (serving, reason) = match info.verb == "watch" && has_send_initial_events(query) {
        true => match table.with_features(gvr.serving, features::bit(features::WATCH_LIST)) {
            Some(narrowed) => (narrowed, Reason::WatchListSubset),
            None => (gvr.serving, reason),
        },
        false => (gvr.serving, reason),
    };
    let mut route = to_serving(table, serving, long_running);
    route.gated = gated_write(table, info, serving);
    Outcome { action: Action::Route(route), reason, gvr: Some(gvr), serving: Some(serving) }
}

/// A write of gated fields, when some of the apiservers `serving` lack a gate of one.
fn gated_write(table: &RoutingTable, info: &RequestInfo<'_>, serving: Serving) -> Option<GatedWrite> {
    if !matches!(&*info.verb, "create" | "update" | "patch") {
        return None;
    }
    let resource = features::gated(info.api_group, info.resource, info.subresource)?;
    let gates = (0..features::ROUTED.len())
        .map(|i| 1u32 << i)
        .filter(|&bit| resource.gates() & bit != 0 && table.with_features(serving, bit).is_some())
        .fold(0, |m, bit| m | bit);
    (gates != 0).then_some(GatedWrite { resource, gates, serving })
}

/// kube-apiserver's `BasicLongRunningRequestCheck`: these requests outlive its request timeout.
fn is_long_running(info: &RequestInfo<'_>) -> bool {
    matches!(&*info.verb, "watch" | "proxy")
        || matches!(info.subresource, "attach" | "exec" | "proxy" | "log" | "portforward")
}

fn non_resource<'t>(table: &'t RoutingTable, head: &RequestHead<'_>, path: &str) -> Outcome<'t> {
    let mut segments = path.trim_matches('/').split('/');
    let first = [segments.next(), segments.next(), segments.next(), segments.next(), segments.next()];
    let more = segments.next().is_some();
    let served = |serving: Option<Serving>, reason: Reason| match serving {
        Some(s) => Outcome {
            action: Action::Route(to_serving(table, s, false)),
            reason,
            gvr: None,
            serving: Some(s),
        },
        None => pool(table, Reason::NonResource),
    };
    let legacy = |path: LegacyPath<'_>, base: Outcome<'t>| {
        compose_legacy(table, head, path, negotiate(path, head.accept), base)
    };
    match (first, more) {
        ([Some("apis"), None, ..], _) if path == "/apis" && head.method == "GET" => discovery(table, head),
        ([Some("api"), None, ..], _) if path == "/api" => {
            let base = pool(table, Reason::NonResource);
            compose_legacy(
                table,
                head,
                LegacyPath::Versions,
                negotiate(LegacyPath::Versions, head.accept),
                base,
            )
        }
        ([Some("api"), Some(v), None, ..], _) => {
            legacy(LegacyPath::GroupVersion("", v), pool(table, Reason::NonResource))
        }
        ([Some("apis"), Some(g), None, ..], _) => {
            legacy(LegacyPath::Group(g), served(table.group(g), Reason::LegacyGroupDiscovery))
        }
        ([Some("apis"), Some(g), Some(v), None, _], _) => legacy(
            LegacyPath::GroupVersion(g, v),
            served(table.group_version(g, v), Reason::LegacyGroupVersionDiscovery),
        ),
        ([Some("openapi"), Some("v3"), Some("apis"), Some(g), Some(v)], false) => {
            match table.group_version(g, v) {
                Some(s) => served(Some(s), Reason::OpenApiGroupVersion),
                None => pool(table, Reason::OpenApiDocument),
            }
        }
        ([Some("openapi"), Some("v2" | "v3"), ..], _) => pool(table, Reason::OpenApiDocument),
        _ => pool(table, Reason::NonResource),
    }
}

/// `base` (where the request goes, so that an apiserver authorizes it), answered with the
/// composed legacy document for `path` if the table has one and the request is a GET.
fn compose_legacy<'t>(
    table: &'t RoutingTable,
    head: &RequestHead<'_>,
    path: LegacyPath<'_>,
    accept: DiscoveryAccept,
    mut base: Outcome<'t>,
) -> Outcome<'t> {
    if head.method != "GET" {
        return base;
    }
    let Some((index, _)) = table.legacy_discovery().get(path) else { return base };
    let (source, reason) = match accept {
        DiscoveryAccept::Legacy(Encoding::Yaml) => (Composed::NotAcceptable, Reason::ComposedNotAcceptable),
        DiscoveryAccept::Legacy(encoding) => {
            (Composed::Legacy(index, Form::of(encoding, head)), Reason::ComposedLegacyDiscovery)
        }
        DiscoveryAccept::MergedV2(_) | DiscoveryAccept::NoPeerV2(_) | DiscoveryAccept::Local => return base,
    };
    if let Action::Route(route) = &mut base.action {
        route.compose = composed_reply(table, source, 200);
        base.reason = reason;
    }
    base
}

fn discovery<'t>(table: &'t RoutingTable, head: &RequestHead<'_>) -> Outcome<'t> {
    let encoding = match negotiate(LegacyPath::GroupList, head.accept) {
        DiscoveryAccept::MergedV2(encoding) => encoding,
        accept @ DiscoveryAccept::Legacy(_) => {
            return compose_legacy(
                table,
                head,
                LegacyPath::GroupList,
                accept,
                pool(table, Reason::LocalDiscovery),
            );
        }
        DiscoveryAccept::NoPeerV2(_) | DiscoveryAccept::Local => return pool(table, Reason::LocalDiscovery),
    };
    let Some(merged) = table.merged_discovery() else {
        return pool(table, Reason::NoMergedDocument);
    };
    let (status, reason) = if head.if_none_match == Some(merged.quoted_etag.as_str()) {
        (304, Reason::MergedDiscoveryNotModified)
    } else if encoding == Encoding::Yaml {
        (406, Reason::ComposedNotAcceptable)
    } else {
        (200, Reason::MergedDiscovery)
    };
    let mut o = pool(table, reason);
    if let Action::Route(route) = &mut o.action {
        route.compose = composed_reply(table, Composed::MergedDiscovery(Form::of(encoding, head)), status);
    }
    o
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::testing::sample;

    const V2: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json";
    const NOPEER: &str =
        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;profile=nopeer";

    fn table() -> RoutingTable {
        RoutingTable::from_json(sample().to_string().as_bytes()).unwrap()
    }

    /// A request whose certificate, if it gets a subject, was checked already.
    fn head<'a>(method: &'a str, target: &'a str) -> RequestHead<'a> {
        RequestHead { method, target, certificate_checked: true, ..Default::default() }
    }

    /// (method, target, cluster or "respond:<status>", rerouted, long-running, reason)
    #[test]
    fn routes() {
        let t = table();
        let cases = [
            ("GET", "/api/v1/namespaces/default/pods", "pool", false, false, Reason::ServedByAll),
            ("GET", "/api/v1/nodes", "pool", false, false, Reason::ServedByNone),
            ("GET", "/apis/resource.k8s.io/v1/resourceclaims", "set-c", true, false, Reason::ServedBySubset),
            (
                "POST",
                "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims",
                "set-c",
                true,
                false,
                Reason::ServedBySubset,
            ),
            (
                "GET",
                "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims?watch=true",
                "set-c",
                true,
                true,
                Reason::ServedBySubset,
            ),
            (
                "GET",
                "/apis/resource.k8s.io/v1/watch/namespaces/ns/resourceclaims",
                "set-c",
                true,
                true,
                Reason::ServedBySubset,
            ),
            (
                "PUT",
                "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/x/status",
                "set-c",
                true,
                false,
                Reason::ServedBySubset,
            ),
            (
                "GET",
                "/apis/resource.k8s.io/v1beta1/resourceclaims",
                "pool",
                false,
                false,
                Reason::ServedByAll,
            ),
            (
                "GET",
                "/apis/resource.k8s.io/v1alpha3/deviceclasses/gpu",
                "set-a-b",
                true,
                false,
                Reason::ServedBySubset,
            ),
            (
                "DELETE",
                "/apis/resource.k8s.io/v1alpha3/deviceclasses",
                "set-a-b",
                true,
                false,
                Reason::ServedBySubset,
            ),
            (
                "GET",
                "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/x/log",
                "set-c",
                true,
                true,
                Reason::ServedBySubset,
            ),
            (
                "POST",
                "/api/v1/namespaces/ns/pods/p/exec?command=ls",
                "pool",
                false,
                true,
                Reason::ServedByAll,
            ),
            ("GET", "/api/v1/watch", "pool", false, false, Reason::InvalidResourcePath),
            (
                "GET",
                "/apis/resource.k8s.io%2Fv1/resourceclaims",
                "set-c",
                true,
                false,
                Reason::ServedBySubset,
            ),
            (
                "GET",
                "/apis/resource.k8s.io/v1/resourceclaims%zz",
                "pool",
                false,
                false,
                Reason::UndecodablePath,
            ),
            ("GET", "/healthz", "pool", false, false, Reason::NonResource),
            ("GET", "/version", "pool", false, false, Reason::NonResource),
            ("GET", "/api", "pool", false, false, Reason::NonResource),
            ("GET", "/api/v1", "pool", false, false, Reason::NonResource),
            ("GET", "/apis/lifecycle.k8s.io", "set-c", true, false, Reason::LegacyGroupDiscovery),
            ("GET", "/apis/resource.k8s.io", "pool", false, false, Reason::LegacyGroupDiscovery),
            ("GET", "/apis/resource.k8s.io/v1", "set-c", true, false, Reason::LegacyGroupVersionDiscovery),
            ("GET", "/apis/resource.k8s.io/v1/", "set-c", true, false, Reason::LegacyGroupVersionDiscovery),
            (
                "GET",
                "/apis/resource.k8s.io/v1beta1",
                "pool",
                false,
                false,
                Reason::LegacyGroupVersionDiscovery,
            ),
            ("GET", "/apis/unknown.example.com/v1", "pool", false, false, Reason::NonResource),
            (
                "GET",
                "/openapi/v3/apis/resource.k8s.io/v1?hash=ABC",
                "set-c",
                true,
                false,
                Reason::OpenApiGroupVersion,
            ),
            (
                "GET",
                "/openapi/v3/apis/resource.k8s.io/v1/extra",
                "pool",
                false,
                false,
                Reason::OpenApiDocument,
            ),
            ("GET", "/openapi/v3", "pool", false, false, Reason::OpenApiDocument),
            ("GET", "/openapi/v2", "pool", false, false, Reason::OpenApiDocument),
            ("GET", "/openapi/v3/apis/unknown.example.com/v1", "pool", false, false, Reason::OpenApiDocument),
            ("GET", "/apis", "pool", false, false, Reason::LocalDiscovery),
            ("", "", "pool", false, false, Reason::NonResource),
        ];
        for (method, target, cluster, rerouted, long_running, reason) in cases {
            let d = decide(&t, &head(method, target));
            let r = d.route().unwrap_or_else(|| panic!("{method} {target}: {d:?}"));
            assert_eq!(
                (r.cluster, r.rerouted, r.long_running, d.reason),
                (cluster, rerouted, long_running, reason),
                "{method} {target}"
            );
        }
    }

    /// a and b without WatchList, c with it (its metrics say so, or nothing: unknown is "may").
    fn watch_list_table(c_reports: bool) -> RoutingTable {
        let mut v = sample();
        v["apiservers"][0]["features"] = serde_json::json!({"WatchList": false});
        v["apiservers"][1]["features"] = serde_json::json!({"WatchList": false});
        if c_reports {
            v["apiservers"][2]["features"] = serde_json::json!({"WatchList": true});
        }
        RoutingTable::from_json(v.to_string().as_bytes()).unwrap()
    }

    #[test]
    fn streaming_lists_go_to_the_apiservers_that_have_the_feature() {
        for c_reports in [true, false] {
            let t = watch_list_table(c_reports);
            let route = |target: &str| {
                let d = decide(&t, &head("GET", target));
                let r = *d.route().unwrap();
                (r.cluster, r.rerouted, r.long_running, d.reason)
            };
            let stream =
                "?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true";
            // Served by all: only c has the feature.
            assert_eq!(
                route(&format!("/api/v1/configmaps{stream}")),
                ("set-c", true, true, Reason::WatchListSubset)
            );
            assert_eq!(
                route(
                    "/api/v1/namespaces/x/pods?watch=true&sendInitialEvents=false&resourceVersionMatch=NotOlderThan"
                ),
                ("set-c", true, true, Reason::WatchListSubset)
            );
            // Only c serves it: nothing to narrow.
            assert_eq!(
                route(&format!("/apis/resource.k8s.io/v1/resourceclaims{stream}")),
                ("set-c", true, true, Reason::ServedBySubset)
            );
            // Nobody who serves it has the feature: each answers the same 422.
            assert_eq!(
                route(&format!("/apis/resource.k8s.io/v1alpha3/deviceclasses{stream}")),
                ("set-a-b", true, true, Reason::ServedBySubset)
            );
            // Not a streaming list: as ever.
            assert_eq!(route("/api/v1/configmaps?watch=1"), ("pool", false, true, Reason::ServedByAll));
            assert_eq!(
                route("/api/v1/configmaps?sendInitialEvents=true"),
                ("pool", false, false, Reason::ServedByAll)
            );
        }
        // Every apiserver may have it (no metrics read): nothing narrows.
        let t = table();
        let d = decide(&t, &head("GET", "/api/v1/configmaps?watch=1&sendInitialEvents=true"));
        assert_eq!((d.route().unwrap().cluster, d.reason), ("pool", Reason::ServedByAll));
    }

    /// b without VolumeAttributesClass (a 1.33 apiserver), a and c with it, all three serving
    /// PersistentVolumeClaims.
    fn gated_table(b_has_it: bool) -> RoutingTable {
        let mut v = sample();
        v["apiservers"][1]["features"] = serde_json::json!({"VolumeAttributesClass": b_has_it});
        v["groupVersions"][0]["resources"]["persistentvolumeclaims"] = serde_json::json!(["a", "b", "c"]);
        v["sets"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::json!({"cluster": "set-a-c", "members": ["a", "c"]}));
        RoutingTable::from_json(v.to_string().as_bytes()).unwrap()
    }

    #[test]
    fn writes_of_gated_fields_go_where_their_body_says() {
        let t = gated_table(false);
        let gated = |method: &str, target: &str| decide(&t, &head(method, target)).route().unwrap().gated;
        let claims = "/api/v1/namespaces/x/persistentvolumeclaims";
        let json = Some("application/json");
        for (method, target) in
            [("POST", claims.to_owned()), ("PUT", format!("{claims}/c1")), ("PATCH", format!("{claims}/c1"))]
        {
            let g = gated(method, &target).unwrap_or_else(|| panic!("{method} {target}"));
            assert_eq!(g.gates, features::bit(features::VOLUME_ATTRIBUTES_CLASS));
            let sets = g.used(json, None, br#"{"spec":{"volumeAttributesClassName":"gold"}}"#);
            let (serving, route) = g.route(&t, sets).unwrap();
            assert_eq!((t.cluster(serving), route.cluster, route.rerouted), ("set-a-c", "set-a-c", true));
            let plain = g.used(json, None, br#"{"spec":{"storageClassName":"standard"}}"#);
            assert_eq!(plain, 0);
            assert!(g.route(&t, plain).is_none(), "{method} {target}: where it was routed");
            let d = decide(&t, &head(method, &target));
            assert_eq!(d.route().unwrap().cluster, "pool");
            assert!(!crate::native::module_handles(&t, &d), "the filter reads the body");
        }
        // Reads, deletes, other resources and subresources without gated fields: no body read.
        for (method, target) in [
            ("GET", claims.to_owned()),
            ("DELETE", format!("{claims}/c1")),
            ("POST", "/api/v1/namespaces/x/configmaps".to_owned()),
            ("PUT", format!("{claims}/c1/finalize")),
        ] {
            assert_eq!(gated(method, &target), None, "{method} {target}");
        }
        // Every apiserver has the gate: nothing to narrow, nothing to read.
        let t = gated_table(true);
        assert_eq!(decide(&t, &head("POST", claims)).route().unwrap().gated, None);
    }

    #[test]
    fn gvr_and_serving_are_reported() {
        let t = table();
        let d = decide(&t, &head("GET", "/apis/resource.k8s.io/v1/resourceclaims"));
        let gvr = d.gvr.unwrap();
        assert_eq!(
            (gvr.group.as_str(), gvr.version.as_str(), gvr.resource.as_str()),
            ("resource.k8s.io", "v1", "resourceclaims")
        );
        assert_eq!(t.members(d.serving.unwrap()).collect::<Vec<_>>(), ["c"]);
        let d = decide(&t, &head("GET", "/api/v1/nodes"));
        assert!(d.gvr.is_none() && d.serving.is_none());
    }

    /// curl, Wget and browsers, or `?pretty=true`, get the composed JSON indented, as
    /// kube-apiserver writes it for them; the ETag and protobuf are the same for everyone.
    #[test]
    fn composed_documents_are_pretty_where_kube_apiserver_is() {
        let mut v = sample();
        v["discovery"]["document"] = serde_json::json!("{\"kind\":\"APIGroupDiscoveryList\",\"items\":[]}\n");
        let t = RoutingTable::from_json(v.to_string().as_bytes()).unwrap();
        let body = |target: &str, accept: &str, pretty_agent: bool| {
            let mut h = head("GET", target);
            h.accept = Some(accept);
            h.pretty_agent = pretty_agent;
            let reply = decide(&t, &h).route().and_then(|r| r.compose).unwrap();
            (String::from_utf8_lossy(reply.body).into_owned(), reply.etag)
        };
        let pretty = "{\n  \"kind\": \"APIGroupDiscoveryList\",\n  \"items\": []\n}";
        let compact = "{\"kind\":\"APIGroupDiscoveryList\",\"items\":[]}\n";
        assert_eq!(body("/apis", V2, true), (pretty.to_owned(), "\"ABC123\""));
        assert_eq!(body("/apis", V2, false).0, compact);
        assert_eq!(body("/apis?pretty=true", V2, false).0, pretty);
        assert_eq!(body("/apis?pretty=0", V2, true).0, compact);
        let protobuf =
            "application/vnd.kubernetes.protobuf;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
        assert_eq!(body("/apis", protobuf, true).0, body("/apis", protobuf, false).0);
    }

    #[test]
    fn merged_discovery() {
        let t = table();
        let mut h = head("GET", "/apis");
        h.accept = Some(V2);
        let d = decide(&t, &h);
        // F2: composed only after an apiserver has authorized the request.
        assert_eq!(d.route().map(|r| r.cluster), Some("pool"));
        let reply = d.route().and_then(|r| r.compose).unwrap();
        assert_eq!(
            (reply.status, reply.etag, reply.body),
            (200, "\"ABC123\"", &b"{\"kind\":\"APIGroupDiscoveryList\"}"[..])
        );
        assert_eq!(reply.headers()[0], ("content-type", MEDIA_TYPE_V2_JSON));
        assert_eq!(reply.headers()[2], ("vary", "Accept"));
        assert_eq!(d.reason, Reason::MergedDiscovery);

        h.if_none_match = Some("\"ABC123\"");
        let reply = decide(&t, &h).route().and_then(|r| r.compose).unwrap();
        assert_eq!((reply.status, reply.body), (304, &b""[..]));

        h.if_none_match = Some("\"OLD\"");
        let reply = decide(&t, &h).route().and_then(|r| r.compose).unwrap();
        assert_eq!(reply.status, 200);

        for (method, target, accept) in [
            ("GET", "/apis", NOPEER),
            ("GET", "/apis", "application/json"),
            ("HEAD", "/apis", V2),
            ("GET", "/apis/", V2),
            ("GET", "/api", V2),
        ] {
            let mut h = head(method, target);
            h.accept = Some(accept);
            assert_eq!(decide(&t, &h).route().map(|r| r.cluster), Some("pool"), "{method} {target} {accept}");
        }

        let mut v = sample();
        v.as_object_mut().unwrap().remove("discovery");
        let t = RoutingTable::from_json(v.to_string().as_bytes()).unwrap();
        let mut h = head("GET", "/apis");
        h.accept = Some(V2);
        assert_eq!(decide(&t, &h).reason, Reason::NoMergedDocument);
    }

    fn table_with_legacy() -> RoutingTable {
        let mut v = sample();
        let doc = |path: &str, body: &str| serde_json::json!({"path": path, "inputs": ["a", "c"], "document": body});
        v["legacyDiscovery"] = serde_json::json!([
            doc("/api", r#"{"kind":"APIVersions","versions":["v1"]}"#),
            doc("/apis", r#"{"kind":"APIGroupList"}"#),
            doc("/apis/resource.k8s.io", r#"{"kind":"APIGroup"}"#),
            doc(
                "/apis/resource.k8s.io/v1alpha3",
                r#"{"kind":"APIResourceList","groupVersion":"resource.k8s.io/v1alpha3"}"#
            ),
            doc("/api/v1", r#"{"kind":"APIResourceList","groupVersion":"v1"}"#),
        ]);
        RoutingTable::from_json(v.to_string().as_bytes()).unwrap()
    }

    /// The `kind` of a JSON or protobuf body.
    fn kind_of(body: &[u8]) -> String {
        if let Some((_, kind)) = crate::discovery::protobuf::type_meta(body) {
            return kind.to_owned();
        }
        let document: serde_json::Value = serde_json::from_slice(body).unwrap();
        document["kind"].as_str().unwrap_or_default().to_owned()
    }

    /// (method, target, accept) → (cluster, reason, composed status and body kind).
    #[test]
    fn composed_legacy_discovery() {
        let t = table_with_legacy();
        let protobuf = "application/vnd.kubernetes.protobuf";
        type Case<'a> = (&'a str, &'a str, Option<&'a str>, &'a str, Reason, Option<(u16, &'a str)>);
        let yaml = "application/yaml";
        let cases: [Case<'_>; 17] = [
            (
                "GET",
                "/apis",
                Some("application/json"),
                "pool",
                Reason::ComposedLegacyDiscovery,
                Some((200, "APIGroupList")),
            ),
            ("GET", "/apis", None, "pool", Reason::ComposedLegacyDiscovery, Some((200, "APIGroupList"))),
            ("GET", "/apis", Some(V2), "pool", Reason::MergedDiscovery, Some((200, "APIGroupDiscoveryList"))),
            ("GET", "/apis", Some(NOPEER), "pool", Reason::LocalDiscovery, None),
            (
                "GET",
                "/apis",
                Some(protobuf),
                "pool",
                Reason::ComposedLegacyDiscovery,
                Some((200, "APIGroupList")),
            ),
            ("GET", "/apis", Some(yaml), "pool", Reason::ComposedNotAcceptable, Some((406, "Status"))),
            (
                "GET",
                "/apis/resource.k8s.io",
                Some("application/vnd.kubernetes.protobuf, */*"),
                "pool",
                Reason::ComposedLegacyDiscovery,
                Some((200, "APIGroup")),
            ),
            (
                "GET",
                "/api/v1",
                Some(protobuf),
                "pool",
                Reason::ComposedLegacyDiscovery,
                Some((200, "APIResourceList")),
            ),
            (
                "GET",
                "/api",
                Some("application/json, */*"),
                "pool",
                Reason::ComposedLegacyDiscovery,
                Some((200, "APIVersions")),
            ),
            ("GET", "/api", Some(V2), "pool", Reason::NonResource, None),
            ("GET", "/api/v1", None, "pool", Reason::ComposedLegacyDiscovery, Some((200, "APIResourceList"))),
            (
                "GET",
                "/apis/resource.k8s.io",
                None,
                "pool",
                Reason::ComposedLegacyDiscovery,
                Some((200, "APIGroup")),
            ),
            (
                "GET",
                "/apis/resource.k8s.io/v1alpha3",
                Some(V2),
                "pool",
                Reason::ComposedLegacyDiscovery,
                Some((200, "APIResourceList")),
            ),
            (
                "GET",
                "/apis/resource.k8s.io/v1alpha3/",
                None,
                "pool",
                Reason::ComposedLegacyDiscovery,
                Some((200, "APIResourceList")),
            ),
            // Identical everywhere (nothing composed): the serving apiservers answer.
            ("GET", "/apis/resource.k8s.io/v1", None, "set-c", Reason::LegacyGroupVersionDiscovery, None),
            (
                "HEAD",
                "/apis/resource.k8s.io/v1alpha3",
                None,
                "pool",
                Reason::LegacyGroupVersionDiscovery,
                None,
            ),
            ("POST", "/apis", None, "pool", Reason::NonResource, None),
        ];
        for (method, target, accept, cluster, reason, composed) in cases {
            let mut h = head(method, target);
            h.accept = accept;
            let d = decide(&t, &h);
            let route = d.route().unwrap();
            assert_eq!((route.cluster, d.reason), (cluster, reason), "{method} {target} {accept:?}");
            let got = route.compose.map(|r| (r.status, kind_of(r.body)));
            assert_eq!(got, composed.map(|(s, k)| (s, k.to_owned())), "{method} {target} {accept:?}");
        }
        let mut h = head("GET", "/apis/resource.k8s.io/v1alpha3");
        h.accept = Some(protobuf);
        let reply = decide(&t, &h).route().and_then(|r| r.compose).unwrap();
        assert_eq!(reply.headers()[0], ("content-type", "application/vnd.kubernetes.protobuf"));
        assert_eq!(composed_reply(&t, reply.source, 200), Some(reply));
        h.accept = Some(yaml);
        let reply = decide(&t, &h).route().and_then(|r| r.compose).unwrap();
        assert_eq!(reply.status, 406);
        assert_eq!(
            reply.headers(),
            [("content-type", "application/json"), ("etag", ""), ("vary", ""), ("cache-control", "")]
        );
        // The filter finds the same reply again from its source.
        h.accept = None;
        let reply = decide(&t, &h).route().and_then(|r| r.compose).unwrap();
        assert_eq!(composed_reply(&t, reply.source, 200), Some(reply));
        assert_eq!(reply.headers()[0], ("content-type", "application/json"));
        assert_eq!(reply.headers()[1], ("etag", ""));
        // Without composed documents, legacy discovery goes where it went before.
        let plain = table();
        let d = decide(&plain, &head("GET", "/apis/resource.k8s.io/v1alpha3"));
        assert_eq!(
            (d.reason, d.route().and_then(|r| r.compose)),
            (Reason::LegacyGroupVersionDiscovery, None)
        );
    }

    #[test]
    fn openapi_is_composed_only_with_a_composer_and_only_for_get() {
        let t = table();
        assert_eq!(decide(&t, &head("GET", "/openapi/v3")).openapi, None);
        let mut v = sample();
        v["openapiCluster"] = serde_json::json!("composer");
        let t = RoutingTable::from_json(v.to_string().as_bytes()).unwrap();
        for target in
            ["/openapi/v3", "/openapi/v2", "/openapi/v3/apis/resource.k8s.io/v1?hash=X", "/openapi/v3/api/v1"]
        {
            let d = decide(&t, &head("GET", target));
            assert_eq!(d.openapi, Some("composer"), "{target}");
            // Still sent to an apiserver first, which authorizes it.
            assert!(d.route().is_some_and(|r| r.compose.is_none()), "{target}");
        }
        let d = decide(&t, &head("GET", "/openapi/v3/apis/resource.k8s.io/v1"));
        assert_eq!(d.route().map(|r| r.cluster), Some("set-c"));
        for (method, target) in [
            ("POST", "/openapi/v3"),
            ("HEAD", "/openapi/v2"),
            ("GET", "/apis/apps/v1"),
            ("GET", "/openapiv3"),
        ] {
            assert_eq!(decide(&t, &head(method, target)).openapi, None, "{method} {target}");
        }
        v["openapiCluster"] = serde_json::json!("pool");
        assert!(RoutingTable::from_json(v.to_string().as_bytes()).is_err());
    }

    #[test]
    fn identity_and_stripping() {
        let t = table();
        let mut h = head("GET", "/api/v1/pods");
        h.client_subject = Some("CN=alice,O=devs");
        let d = decide(&t, &h);
        let id = d.identity.clone().unwrap();
        assert_eq!((id.user.as_ref(), id.groups.len()), ("alice", 1));
        assert!(
            d.strips("X-Remote-User")
                && d.strips("x-remote-extra-foo")
                && d.strips("x-kubernetes-peer-proxied")
        );
        assert!(!d.strips("authorization") && !d.strips("accept"));
        // F6: a client must not pick the route without timeout, or a cluster.
        assert!(
            d.strips("x-skewgate-route") && d.strips("X-Skewgate-Cluster") && d.strips("x-skewgate-anything")
        );
        assert!(!d.strips("x-skewgat") && !d.strips("skewgate-route"));

        let mut v = sample();
        v["policy"] = serde_json::json!({"stripDownstreamPeerProxied": false, "clientCertIdentity": false});
        let t = RoutingTable::from_json(v.to_string().as_bytes()).unwrap();
        let d = decide(&t, &h);
        assert!(d.identity.is_none());
        assert!(!d.strips("x-kubernetes-peer-proxied") && d.strips("x-remote-group"));
    }

    fn table_with_twins() -> RoutingTable {
        let mut v = sample();
        v["anonymousClusterPrefix"] = serde_json::json!("anon-");
        RoutingTable::from_json(v.to_string().as_bytes()).unwrap()
    }

    /// Who sends what: (client subject, token) → (cluster, anonymous, refused).
    #[test]
    fn requests_without_credentials_take_the_twin() {
        let t = table_with_twins();
        let cases: [(Option<&str>, bool, &str, bool); 7] = [
            (None, false, "anon-set-c", true),
            (None, true, "set-c", false),
            (Some("CN=alice,O=devs"), false, "set-c", false),
            (Some("CN=alice,O=devs"), true, "set-c", false),
            // No CN: kube-apiserver's x509 authenticator yields; the token or anonymous decides.
            (Some("O=devs"), false, "anon-set-c", true),
            (Some("O=devs"), true, "set-c", false),
            (Some("CN=,O=devs"), false, "anon-set-c", true),
        ];
        for (subject, token, cluster, anonymous) in cases {
            let mut h = head("GET", "/apis/resource.k8s.io/v1/resourceclaims");
            (h.client_subject, h.token) = (subject, token);
            let d = decide(&t, &h);
            assert_eq!(d.route().map(|r| r.cluster), Some(cluster), "{subject:?} token={token}");
            assert_eq!(d.anonymous, anonymous, "{subject:?} token={token}");
        }
        let d = decide(&t, &head("GET", "/version"));
        assert_eq!(d.route().map(|r| r.cluster), Some("anon-pool"));
        // Without twins in the table, everything keeps its cluster.
        let plain = table();
        let d = decide(&plain, &head("GET", "/version"));
        assert_eq!(d.route().map(|r| r.cluster), Some("pool"));
    }

    /// A certificate kube-apiserver would not read gives no identity, nor leaves the request to
    /// a token or to anonymous access: the apiserver would not have let the connection in.
    #[test]
    fn only_a_certificate_the_apiserver_reads_gives_an_identity() {
        use crate::testing::{CN, certificate_der, peer_certificate, url_encoded_pem};
        let t = table_with_twins();
        let universal = url_encoded_pem(&certificate_der(&[(CN, 12, b"ca")], &[(CN, 28, b"\0\0\0a")]));
        let good = peer_certificate();
        let cases: [(Option<&str>, &str); 3] = [
            (Some(&good), ""),
            (Some(&universal), "its subject's CN is a UniversalString (ASN.1 tag 28)"),
            (None, "Envoy did not hand skewgate the certificate"),
        ];
        for (certificate, refused) in cases {
            for token in [false, true] {
                let mut h = head("GET", "/apis/resource.k8s.io/v1/resourceclaims");
                h.certificate_checked = false;
                h.client_certificate = certificate.map(str::as_bytes);
                (h.client_subject, h.token) = (Some("CN=admin,O=system:masters"), token);
                let d = decide(&t, &h);
                match d.action {
                    Action::Refuse(why) => {
                        assert!(why.reason().contains(refused) && !refused.is_empty(), "{}", why.reason());
                        assert!(d.identity.is_none() && !d.anonymous);
                    }
                    Action::Route(_) => {
                        assert!(refused.is_empty(), "taken: {refused}");
                        assert_eq!(d.identity.map(|i| i.user), Some("admin".into()));
                    }
                }
                // Checked on the connection's first request: not again.
                h.certificate_checked = true;
                assert!(decide(&t, &h).identity.is_some());
            }
        }
    }

    #[test]
    fn an_identity_a_header_would_change_is_refused_not_forwarded() {
        let t = table_with_twins();
        for subject in ["CN=mallory,O=\\ system:masters", "CN=admin\\ "] {
            for token in [false, true] {
                let mut h = head("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews");
                (h.client_subject, h.token) = (Some(subject), token);
                let d = decide(&t, &h);
                assert!(matches!(d.action, Action::Refuse(_)), "{subject:?}: {:?}", d.action);
                assert!(d.identity.is_none() && !d.anonymous);
            }
        }
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod prop {
    use super::*;
    use crate::testing::sample;
    use proptest::prelude::*;

    proptest! {
        /// Every request gets a decision. Half the paths are hostile soup (whose GVR only a parser
        /// can tell: a rerouted one must go to the set serving what the parser reads); half are
        /// built from a GVR of the table (mostly ones served by a subset) with hostile methods,
        /// queries and certificates around them, and must reach exactly the cluster the table's
        /// JSON names for that GVR — an oracle that shares no code with `decide`.
        #[test]
        fn total_and_never_misroutes(
            method in "(GET|POST|PUT|PATCH|DELETE|HEAD|OPTIONS|[A-Z]{0,8})",
            path in prop_oneof![
                "(/(api|apis|openapi|v3|v1|v1alpha3|resource\\.k8s\\.io|lifecycle\\.k8s\\.io|namespaces|ns|watch|proxy|resourceclaims|deviceclasses|evictions|pods|status|%2F|%zz|\\.\\.|)){0,9}".prop_map(|p| (p, None)),
                (0usize..64, proptest::option::of("[a-z0-9]{1,4}"), proptest::option::of("[a-z0-9]{1,5}"), proptest::option::of("(status|scale|log|exec)"))
                    .prop_map(|(gvr, namespace, name, subresource)| aimed_path(gvr, namespace, name, subresource)),
            ],
            query in "(watch=(true|false|0|1|)|fieldSelector=metadata\\.name%3Dx|[a-z=&%]{0,12}){0,3}",
            subject in proptest::option::of("(CN|O)=[a-z\\\\,]{0,6}(,(CN|O)=[a-z]{0,4}){0,2}"),
        ) {
            let (path, known) = path;
            let t = RoutingTable::from_json(sample().to_string().as_bytes()).unwrap();
            let target = format!("{path}?{query}");
            let h = RequestHead { method: &method, target: &target, accept: None, if_none_match: None, client_subject: subject.as_deref(), client_certificate: None, certificate_checked: true, token: false , pretty_agent: false };
            let d = decide(&t, &h);
            if let (Action::Route(r), Some((group, version, resource))) = (&d.action, &known) {
                let expected = expected_cluster(&sample(), group, version, resource);
                prop_assert_eq!(r.cluster, expected, "{} {}", method, target);
            } else if let (Action::Route(r), Some(gvr)) = (&d.action, d.gvr) {
                prop_assert_eq!(r.cluster, t.cluster(gvr.serving));
                let (raw, q) = split_target(&target);
                let decoded = decode_path(raw).unwrap();
                let info = RequestInfo::parse(&method, &decoded, q);
                prop_assert_eq!((info.api_group, info.api_version, info.resource), (gvr.group.as_str(), gvr.version.as_str(), gvr.resource.as_str()));
            }
        }

        /// Requests built from their parts, so the GVR each one asks for is known without
        /// parsing; the expected cluster comes straight from the table's JSON (who serves the
        /// GVR, and which set has exactly those members), not from the compiled look-ups that
        /// `decide` uses. Aimed at GVRs served by a subset: sending them to the pool fails it.
        #[test]
        fn resource_requests_go_to_exactly_their_servers(
            gvr in 0usize..9,
            namespace in proptest::option::of("[a-z][a-z0-9]{0,5}"),
            name in proptest::option::of("[a-z][a-z0-9]{0,5}"),
            subresource in proptest::option::of("(status|scale|binding)"),
            form in 0usize..3,
            method in "(GET|POST|PUT|PATCH|DELETE)",
        ) {
            let config = sample();
            // (group, version, resource) the table serves, and two it does not.
            let mut gvrs: Vec<(String, String, String)> = Vec::new();
            for gv in config["groupVersions"].as_array().into_iter().flatten() {
                for resource in gv["resources"].as_object().into_iter().flatten().map(|(r, _)| r) {
                    gvrs.push((gv["group"].as_str().unwrap_or("").into(), gv["version"].as_str().unwrap_or("").into(), resource.clone()));
                }
            }
            gvrs.push(("resource.k8s.io".into(), "v1".into(), "deviceclasses".into()));
            gvrs.push(("".into(), "v1".into(), "nodes".into()));
            let (group, version, resource) = &gvrs[gvr % gvrs.len()];
            let prefix = if group.is_empty() { format!("/api/{version}") } else { format!("/apis/{group}/{version}") };
            let scope = namespace.as_ref().map(|n| format!("/namespaces/{n}")).unwrap_or_default();
            let (path, query) = match (form, &name) {
                // The legacy watch prefix: `/<prefix>/watch/<scope>/<resource>[/<name>]`.
                (1, _) => (format!("{prefix}/watch{scope}/{resource}{}", name.as_ref().map(|n| format!("/{n}")).unwrap_or_default()), ""),
                (2, None) => (format!("{prefix}{scope}/{resource}"), "watch=true"),
                (_, Some(n)) => (format!("{prefix}{scope}/{resource}/{n}{}", subresource.as_ref().map(|s| format!("/{s}")).unwrap_or_default()), ""),
                (_, None) => (format!("{prefix}{scope}/{resource}"), ""),
            };
            let target = if query.is_empty() { path } else { format!("{path}?{query}") };

            let expected = expected_cluster(&config, group, version, resource);

            let t = RoutingTable::from_json(config.to_string().as_bytes()).unwrap();
            let h = RequestHead { method: &method, target: &target, accept: None, if_none_match: None, client_subject: None, client_certificate: None, certificate_checked: true, token: true , pretty_agent: false };
            let d = decide(&t, &h);
            let route = d.route().unwrap();
            prop_assert_eq!(route.cluster, expected.as_str(), "{} {}", method, target);
            prop_assert_eq!(route.rerouted, expected != "pool", "{} {}", method, target);
        }

        #[test]
        fn arbitrary_input_never_panics(method in ".{0,10}", target in ".{0,200}", accept in proptest::option::of(".{0,80}"), subject in proptest::option::of(".{0,60}")) {
            let t = RoutingTable::from_json(sample().to_string().as_bytes()).unwrap();
            let h = RequestHead { method: &method, target: &target, accept: accept.as_deref(), if_none_match: None, client_subject: subject.as_deref(), client_certificate: None, certificate_checked: true, token: false , pretty_agent: false };
            let _ = decide(&t, &h);
        }
    }

    /// A resource path for one of the sample table's GVRs, three in four served by a subset
    /// (those are the ones a wrong decision would misroute), with the GVR it asks for.
    fn aimed_path(
        pick: usize,
        namespace: Option<String>,
        name: Option<String>,
        subresource: Option<String>,
    ) -> (String, Option<(String, String, String)>) {
        const SUBSET: [(&str, &str, &str); 3] = [
            ("resource.k8s.io", "v1", "resourceclaims"),
            ("resource.k8s.io", "v1alpha3", "deviceclasses"),
            ("lifecycle.k8s.io", "v1alpha1", "evictions"),
        ];
        const OTHERS: [(&str, &str, &str); 3] =
            [("", "v1", "pods"), ("resource.k8s.io", "v1beta1", "resourceclaims"), ("", "v1", "nodes")];
        let (group, version, resource) =
            if pick % 4 == 3 { OTHERS[pick / 4 % OTHERS.len()] } else { SUBSET[pick % SUBSET.len()] };
        let prefix =
            if group.is_empty() { format!("/api/{version}") } else { format!("/apis/{group}/{version}") };
        let scope = namespace.map(|n| format!("/namespaces/{n}")).unwrap_or_default();
        let tail = match (name, subresource) {
            (Some(n), Some(s)) => format!("/{n}/{s}"),
            (Some(n), None) => format!("/{n}"),
            (None, _) => String::new(),
        };
        let path = format!("{prefix}{scope}/{resource}{tail}");
        (path, Some((group.to_string(), version.to_string(), resource.to_string())))
    }

    /// The cluster the table's JSON names for a GVR: the set whose members are exactly the
    /// apiservers that list it, or the pool when all or none do.
    fn expected_cluster(config: &serde_json::Value, group: &str, version: &str, resource: &str) -> String {
        let served_by: Option<Vec<&str>> = config["groupVersions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|gv| gv["group"] == group && gv["version"] == version)
            .find_map(|gv| gv["resources"].get(resource))
            .map(|ids| ids.as_array().into_iter().flatten().filter_map(|i| i.as_str()).collect());
        let all: Vec<&str> =
            config["apiservers"].as_array().into_iter().flatten().filter_map(|a| a["id"].as_str()).collect();
        let pool = config["poolCluster"].as_str().unwrap_or("pool").to_string();
        match served_by {
            Some(ids) if ids != all => config["sets"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|s| {
                    s["members"].as_array().map(|m| m.iter().filter_map(|v| v.as_str()).collect::<Vec<_>>())
                        == Some(ids.clone())
                })
                .and_then(|s| s["cluster"].as_str())
                .unwrap_or("no set for these members")
                .to_string(),
            _ => pool,
        }
    }
}
