//! The resources themselves: the clusters (CDS) that reach the apiservers, the routes (RDS) that
//! send each request to the cluster the filter named or, for requests that need no decision,
//! straight to the pool, and the filter configurations (ECDS) that carry the routing table, the
//! proxy-wasm filter's and the native module's (docs/native-module.md). JSON, as Envoy's
//! filesystem xDS reads it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_json::{Value, json};
use skewgate_core::bypass;
use skewgate_core::certificate::PEER_CERTIFICATE_HEADER;
use skewgate_core::edits::{CLUSTER_HEADER, LONG_RUNNING, ROUTE_HEADER};
use skewgate_core::identity::{PEER_PROXIED, WEBSOCKET_BEARER};
use skewgate_core::table::{RoutingTable, TableConfig};

/// Name of the HTTP filter in the bootstrap; the ECDS resource must carry the same name.
pub const FILTER_NAME: &str = "skewgate";
/// The bootstrap's header mutation ahead of the filter that hands it the client certificate
/// ([`PEER_CERTIFICATE_HEADER`]): the routes that skip the filter skip it too.
pub const CERTIFICATE_FILTER_NAME: &str = "skewgate-certificate";
/// Name of the native module's HTTP filter in the bootstrap; its ECDS resource carries it too.
pub const MODULE_FILTER_NAME: &str = "skewgate-module";
/// The module's shared object without `lib` and `.so`, as Envoy looks it up in
/// `ENVOY_DYNAMIC_MODULES_SEARCH_PATH`.
pub const MODULE_NAME: &str = "skewgate_module";
/// The namespace of the bypass routes' metadata, which the bootstrap's local reply reads
/// (`%METADATA(ROUTE:skewgate:servers)%`).
pub const ROUTE_METADATA: &str = "skewgate";

/// The type of the module's ECDS resource, which the bootstrap's `type_urls` must name.
pub const DYNAMIC_MODULE_FILTER_TYPE: &str =
    "type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter";
const CLUSTER_TYPE: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const ROUTE_CONFIG_TYPE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
/// The route configuration the bootstrap's `rds` asks for.
pub const ROUTE_CONFIG_NAME: &str = "apiservers";
/// The routes that send requests to the pool without the filter.
pub const BYPASS_TOKEN_ROUTE: &str = "bypass-token";
pub const BYPASS_CERTIFICATE_ROUTE: &str = "bypass-certificate";
pub const BYPASS_TOKEN_WATCH_ROUTE: &str = "bypass-token-watch";
pub const BYPASS_CERTIFICATE_WATCH_ROUTE: &str = "bypass-certificate-watch";
pub const BYPASS_ANONYMOUS_ROUTE: &str = "bypass-anonymous";
pub const BYPASS_ANONYMOUS_WATCH_ROUTE: &str = "bypass-anonymous-watch";
pub const BYPASS_ANONYMOUS_HEALTH_ROUTE: &str = "bypass-anonymous-health";
/// The last route: a request on its way to the filter, which names its cluster.
pub const UNROUTED: &str = "unrouted";
/// The statistics of a serving set's bypass routes: `vhost.apiservers.route.` this, then the
/// set's cluster with `_` for any dot (`rerouted_skewgate-set-cp-3`: Envoy's Prometheus output
/// tags a route's statistics with `envoy_route` up to the first dot).
pub const REROUTED_STAT_PREFIX: &str = "rerouted_";

/// Where an apiserver listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub id: String,
    pub address: String,
    pub port: u16,
}

/// Envoy's side of the apiservers' TLS: it checks their serving certificates against the peer
/// CA and presents the front-proxy client certificate (docs/upstream-facts.md, "Front-proxy authentication").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamTls {
    pub peer_ca: String,
    pub client_cert: String,
    pub client_key: String,
    /// SNI and the DNS SAN required in every apiserver's serving certificate.
    pub server_name: String,
    /// Who Envoy's health checks are, in `X-Remote-User` / `X-Remote-Group`: kube-apiserver
    /// answers 401 to the front-proxy certificate without a user (it is then an unverifiable
    /// client certificate, not an anonymous request), which would mark every apiserver down.
    pub health_user: String,
    pub health_groups: Vec<String>,
}

/// How Envoy watches the apiservers' health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Health {
    pub interval_ms: u64,
    pub timeout_ms: u64,
    pub connect_timeout_ms: u64,
}

impl Default for Health {
    fn default() -> Self {
        Self { interval_ms: 2000, timeout_ms: 1000, connect_timeout_ms: 1000 }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CdsError(pub String);

impl std::fmt::Display for CdsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CdsError {}

/// `cds.json`: the pool, one cluster per apiserver and one per serving set of `table`, and the
/// pool's and every set's twin without the front-proxy certificate when the table has twins.
pub fn cds(
    table: &TableConfig,
    endpoints: &[Endpoint],
    tls: &UpstreamTls,
    health: Health,
) -> Result<Value, CdsError> {
    let endpoint_of = |id: &str| {
        endpoints
            .iter()
            .find(|e| e.id == id)
            .ok_or_else(|| CdsError(format!("apiserver {id:?} of the table has no endpoint")))
    };
    let all: Vec<&Endpoint> =
        table.apiservers.iter().map(|a| endpoint_of(&a.id)).collect::<Result<_, _>>()?;
    let mut resources = vec![cluster(&table.pool_cluster, &all, tls, health, Upstream::FrontProxy)];
    for (a, e) in table.apiservers.iter().zip(&all) {
        resources.push(cluster(&a.cluster, &[*e], tls, health, Upstream::FrontProxy));
    }
    let mut sets = vec![(&table.pool_cluster, all.clone())];
    for set in &table.sets {
        let members: Vec<&Endpoint> = set.members.iter().map(|m| endpoint_of(m)).collect::<Result<_, _>>()?;
        resources.push(cluster(&set.cluster, &members, tls, health, Upstream::FrontProxy));
        sets.push((&set.cluster, members));
    }
    for (name, members) in sets {
        if let Some(twin) = table.anonymous_cluster(name) {
            resources.push(cluster(&twin, &members, tls, health, Upstream::Anonymous));
        }
    }
    Ok(json!({ "resources": resources }))
}

/// How Envoy presents itself to the apiservers of a cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Upstream {
    /// The front-proxy client certificate: the filter's `X-Remote-*` headers (or a token) say
    /// who the request is.
    FrontProxy,
    /// No client certificate, for requests without any credential: the apiserver treats them
    /// as it treats an anonymous client, allowing or refusing them by its own flags.
    Anonymous,
}

fn cluster(
    name: &str,
    members: &[&Endpoint],
    tls: &UpstreamTls,
    health: Health,
    upstream: Upstream,
) -> Value {
    let is_ip = members.iter().all(|e| e.address.parse::<std::net::IpAddr>().is_ok());
    let lb_endpoints: Vec<Value> = members
        .iter()
        .map(|e| {
            json!({
                "endpoint": {"address": {"socket_address": {"address": e.address, "port_value": e.port}}},
                "metadata": {"filter_metadata": {"skewgate": {"apiserver": e.id}}}
            })
        })
        .collect();
    let mut common_tls = json!({
        "validation_context": {
            "trusted_ca": {"filename": tls.peer_ca},
            "match_typed_subject_alt_names": [
                {"san_type": "DNS", "matcher": {"exact": tls.server_name}}
            ]
        }
    });
    let http_health_check = match upstream {
        Upstream::FrontProxy => {
            common_tls["tls_certificates"] = json!([{
                "certificate_chain": {"filename": tls.client_cert},
                "private_key": {"filename": tls.client_key}
            }]);
            let identity = std::iter::once(("X-Remote-User", &tls.health_user))
                .chain(tls.health_groups.iter().map(|g| ("X-Remote-Group", g)))
                .map(|(key, value)| add_header(key, value, "APPEND_IF_EXISTS_OR_ADD"))
                .collect::<Vec<_>>();
            json!({"path": READINESS_PATH, "request_headers_to_add": identity})
        }
        // Without credentials `/readyz` is the apiserver's to allow: 200 or 500 where anonymous
        // access is on, 401 always where it is off. Either way the apiserver is up and answers
        // anonymous requests as it would directly.
        Upstream::Anonymous => json!({
            "path": READINESS_PATH,
            "expected_statuses": [{"start": 200, "end": 201}, {"start": 401, "end": 402}]
        }),
    };
    json!({
        "@type": CLUSTER_TYPE,
        "name": name,
        "type": if is_ip { "STATIC" } else { "STRICT_DNS" },
        "connect_timeout": duration(health.connect_timeout_ms),
        "lb_policy": "RANDOM",
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": lb_endpoints}]},
        // Never fall back to an unhealthy apiserver: a 503 Status beats a request to a server
        // that is down or was never meant to get it.
        "common_lb_config": {"healthy_panic_threshold": {"value": 0.0}},
        "health_checks": [{
            "timeout": duration(health.timeout_ms),
            "interval": duration(health.interval_ms),
            "no_traffic_interval": duration(health.interval_ms),
            "unhealthy_threshold": 2,
            "healthy_threshold": 1,
            "http_health_check": http_health_check
        }],
        // Eject on connection-level failures only; apiservers' own 5xx answers are the client's.
        "outlier_detection": {
            "split_external_local_origin_errors": true,
            "consecutive_local_origin_failure": 2,
            "enforcing_consecutive_local_origin_failure": 100,
            "enforcing_consecutive_5xx": 0,
            "enforcing_consecutive_gateway_failure": 0,
            "enforcing_success_rate": 0,
            "enforcing_local_origin_success_rate": 0,
            "base_ejection_time": "5s",
            // Never all of a cluster: a host goes out only while at least half stay, so a set of
            // one or two always keeps one. A burst of local failures that is the edge's own (a
            // busy machine's connect timeouts, a flood of watches) ejected every apiserver of a
            // cluster at once, which then answered no_healthy_upstream though each was up; an
            // apiserver truly down leaves by its health checks.
            "max_ejection_percent": 50
        },
        // Each request of an HTTP/1.1 client holds an upstream connection of its own, a watch
        // for as long as it lasts: Envoy's default of 1024 would turn the 1025th into a 503.
        "circuit_breakers": {"thresholds": [{
            "max_connections": 1_000_000, "max_pending_requests": 1_000_000,
            "max_requests": 1_000_000, "max_retries": 1000
        }]},
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                // Before kube-apiserver's own 90 s (`http.Server` IdleTimeout) closes it under a
                // request Envoy has just sent on it.
                "common_http_protocol_options": {"idle_timeout": "60s"},
                // HTTP/2 clients' requests share HTTP/2 connections, as the aggregator in
                // kube-apiserver carries long-running ones to the apiservers behind it: what a
                // client holds upstream grows with its connections, which the listener counts,
                // not with its watches, each of which took a connection and descriptor of its
                // own. HTTP/1.1 clients' requests stay HTTP/1.1, which upgrades need (exec,
                // attach, port-forward: SPDY and WebSocket). 100 streams a connection,
                // kube-apiserver's default (`--http2-max-streams-per-connection`), and another
                // connection past them. With 1,000, 817 watch requests were refused while the
                // 1,647 watches a stopping apiserver ended came back at once (`make scale`'s
                // drain; BENCHMARKS.md), with 100 none.
                "use_downstream_protocol_config": {
                    "http_protocol_options": {},
                    "http2_protocol_options": {"max_concurrent_streams": 100}
                }
            }
        },
        "transport_socket": {
            "name": "envoy.transport_sockets.tls",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                "sni": tls.server_name,
                "common_tls_context": common_tls
            }
        }
    })
}

fn duration(ms: u64) -> String {
    format!("{}.{:03}s", ms / 1000, ms % 1000)
}

/// `d` as an Envoy duration, to the millisecond; whole seconds as a person writes them (`65s`).
pub fn envoy_duration(d: std::time::Duration) -> String {
    match d.subsec_millis() {
        0 => format!("{}s", d.as_secs()),
        _ => duration(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
    }
}

/// `rds.json`: the route configuration [`route_configuration`], its `version_info` a hash of its
/// content (what the sidecar reads back from Envoy's admin API).
pub fn rds(table: Option<&RoutingTable>, timeout: &str) -> Value {
    let mut config = route_configuration(table, timeout);
    let version = routes_version(&config);
    if let Some(fields) = config.as_object_mut() {
        fields.insert("@type".into(), json!(ROUTE_CONFIG_TYPE));
    }
    json!({"version_info": version, "resources": [config]})
}

/// Every route's timeout but the long-running one's, unless configured: a little longer than
/// kube-apiserver's own `--request-timeout` (60s), so that the apiserver's answer wins when it
/// has one.
pub const DEFAULT_ROUTE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(65);

/// What Envoy's health checks ask each apiserver: whether it serves requests. kube-apiserver
/// fails its `shutdown` check from SIGTERM on, yet serves every request for its shutdown
/// delay; whether a stopping apiserver gets new requests is the sidecar's call, per cluster
/// ([`Overlay::stopping`]), so that the last server of an API keeps them. Starting, or with a
/// failing dependency, it fails this too. Servers without the check ignore the exclusion.
pub const READINESS_PATH: &str = "/readyz?exclude=shutdown";

/// The `version_info` of an `rds.json` (the one Envoy reports back for it).
pub fn rds_version(rds: &Value) -> Option<&str> {
    rds.get("version_info")?.as_str()
}

/// The key of a bypass route's metadata that names the apiserver it is only there for while
/// that apiserver is up ([`bypass::Target::while_up`]).
const WHILE_UP: &str = "whileUp";

/// `rds` without the bypass routes that are only there while their apiserver is up, for the
/// apiservers `overlay` takes out of Envoy's clusters (draining or stopping): the requests
/// those routes took meet the filter instead, which sends them where it sent them and holds
/// them while their apiserver is away. Its `version_info` is the rendering's, then `+` and the
/// apiservers whose routes it left out (the routes' version [`routes_base_version`] reads back),
/// so that a push confirms its routes under whatever overlay Envoy runs them.
pub fn rds_with_overlay(rds: &Value, overlay: &Overlay) -> Value {
    let pointer = format!("/metadata/filter_metadata/{ROUTE_METADATA}/{WHILE_UP}");
    let away = overlay.away();
    let mut rds = rds.clone();
    let mut left_out = BTreeSet::new();
    let routes = rds.pointer_mut("/resources/0/virtual_hosts/0/routes").and_then(Value::as_array_mut);
    if let Some(routes) = routes {
        routes.retain(|route| {
            let server = route.pointer(&pointer).and_then(Value::as_str);
            match server.filter(|s| away.contains(s)) {
                Some(server) => {
                    left_out.insert(server.to_owned());
                    false
                }
                None => true,
            }
        });
    }
    if !left_out.is_empty() {
        let version = rds_version(&rds).unwrap_or_default();
        let ids: Vec<String> = left_out.into_iter().collect();
        rds["version_info"] = json!(format!("{version}+{}", ids.join(",")));
    }
    rds
}

/// The version of the rendering an `rds.json`'s `version_info` (as Envoy reports it) carries,
/// whatever overlay it was written under ([`rds_with_overlay`]).
pub fn routes_base_version(version: &str) -> &str {
    version.split_once('+').map_or(version, |(base, _)| base)
}

fn routes_version(config: &Value) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(config.to_string().as_bytes());
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// The one virtual host in front of the apiservers. `timeout` (an Envoy duration, e.g. `65s`)
/// is every route's but the long-running one's.
///
/// Envoy picks a request's route before any filter runs (whether the filter runs at all is the
/// route's to say), and again once the filter has named the request's cluster in its header.
/// The routes of a request the filter has routed come first, each with that header: on its
/// second pass such a request stops at one of them without trying the bypass routes again, and
/// on its first pass any request leaves them at their first check. Then, with `table`, the
/// bypass routes of [`bypass::plan`]: a request they take never enters the skewgate filter.
/// Last, what none of them takes: it meets the filter. (Every route a request tries costs it
/// about a thousand instructions: a discovery request that met the bypass routes twice cost
/// 420.2k instructions, 401.6k with the filter's routes first; a uniform read, which a bypass
/// route takes, 189.1k before, 190.3k after; callgrind, BENCHMARKS.md.)
pub fn route_configuration(table: Option<&RoutingTable>, timeout: &str) -> Value {
    let routed = present(CLUSTER_HEADER, true);
    let mut routes = vec![
        // Watches, exec, attach, port-forward, logs, proxy: the filter marks them the way
        // kube-apiserver's long-running check does. They outlive any request timeout.
        json!({
            "name": LONG_RUNNING,
            "match": {"prefix": "/", "headers": [routed, exact(ROUTE_HEADER, LONG_RUNNING)]},
            "route": {"cluster_header": CLUSTER_HEADER, "timeout": "0s", "idle_timeout": "3600s"}
        }),
        // Reads may also be retried when the connection drops before any answer (an apiserver
        // exiting with requests on its connections): repeating one changes nothing. Upgrades in
        // place otherwise turned such GETs into 503s.
        json!({
            "name": "read",
            "match": {"prefix": "/", "headers": [routed, exact(":method", "GET")]},
            "route": read_route(json!({"cluster_header": CLUSTER_HEADER}), timeout)
        }),
        json!({
            "name": "read-head",
            "match": {"prefix": "/", "headers": [routed, exact(":method", "HEAD")]},
            "route": read_route(json!({"cluster_header": CLUSTER_HEADER}), timeout)
        }),
        json!({
            "name": "default",
            "match": {"prefix": "/", "headers": [routed]},
            "route": request_timeout(json!({"cluster_header": CLUSTER_HEADER}), timeout)
        }),
    ];
    routes.extend(table.map(|t| bypass_routes(t, timeout)).unwrap_or_default());
    // A request no route above takes, on its first pass: the filter runs and names its cluster
    // (or answers it). Should it name none, the same as the default route: Envoy's 503.
    routes.push(json!({
        "name": UNROUTED,
        "match": {"prefix": "/"},
        "route": request_timeout(json!({"cluster_header": CLUSTER_HEADER}), timeout)
    }));
    json!({
        "name": ROUTE_CONFIG_NAME,
        // The bypass routes name the pool itself, a cluster that arrives by CDS (Envoy's
        // default for a dynamic route configuration, stated).
        "validate_clusters": false,
        "virtual_hosts": [{
            "name": ROUTE_CONFIG_NAME,
            "domains": ["*"],
            // The filter's routing headers are for Envoy only.
            "request_headers_to_remove": [CLUSTER_HEADER, ROUTE_HEADER, PEER_CERTIFICATE_HEADER],
            // Only failures where the apiserver never saw the request: retrying after it did
            // could repeat a create or a delete.
            "retry_policy": retry_policy("connect-failure,refused-stream,reset-before-request"),
            "routes": routes
        }]
    })
}

/// `route` (where to) with the read routes' timeout and retries.
///
/// A read that gets no byte back for a third of `timeout` (22 s of the shipped 65 s) is given up
/// on and sent to another apiserver of its cluster: an apiserver that froze (stopped, paused, cut
/// off) keeps what Envoy sent it in the second before its health checks failed, and Envoy does
/// not close an HTTP connection that has a request under way when its host fails them
/// (measured). Three tries fit in the route's own timeout. A third, not less: kube-apiserver
/// writes nothing of an answer until it has it, and a large list that is not paginated nor
/// served from the watch cache may take many seconds; a read slower than that before its first
/// byte is tried again elsewhere, and fails after the third try, where without this it would
/// have waited out the whole timeout.
fn read_route(route: Value, timeout: &str) -> Value {
    let mut route = request_timeout(route, timeout);
    let mut retry = retry_policy("connect-failure,refused-stream,reset-before-request,reset");
    if let Some(per_try) = parse_duration(timeout).filter(|t| !t.is_zero()).map(|t| t / 3) {
        retry["per_try_idle_timeout"] = json!(envoy_duration(per_try));
    }
    if let Some(fields) = route.as_object_mut() {
        fields.insert("retry_policy".into(), retry);
    }
    route
}

/// An Envoy duration as [`envoy_duration`] writes it (`65s`, `1.500s`).
fn parse_duration(d: &str) -> Option<std::time::Duration> {
    let seconds: f64 = d.strip_suffix('s')?.parse().ok()?;
    (seconds.is_finite() && seconds >= 0.0)
        .then(|| std::time::Duration::from_millis((seconds * 1000.0).round() as u64))
}

/// `route` (where to) for a request that is not long-running: given up on once `timeout` (the
/// `envoy.routeTimeout`, a little longer than kube-apiserver's own --request-timeout of 60s, so
/// that the apiserver's answer wins when it has one) passes without a byte either way, Envoy's
/// 504 `stream_idle_timeout` before an answer (a 503 `Status` on every route). An idle timeout,
/// not a total one: the stream's idle timer is armed anyway, a total one arms a second timer on
/// every request (1.9k instructions, 1 % of Envoy's own; callgrind, BENCHMARKS.md), and a slow
/// client still reading a large answer the apiserver has finished is not cut off.
fn request_timeout(mut route: Value, timeout: &str) -> Value {
    if let Some(fields) = route.as_object_mut() {
        fields.insert("timeout".into(), json!("0s"));
        fields.insert("idle_timeout".into(), json!(timeout));
    }
    route
}

fn retry_policy(retry_on: &str) -> Value {
    json!({
        "retry_on": retry_on,
        "num_retries": 2,
        "retry_host_predicate": [{
            "name": "envoy.retry_host_predicates.previous_hosts",
            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"}
        }],
        // The pick is random: with 3 re-picks a retry in a set of two went back to the host that
        // had just failed once in 16 (measured: 10 of 152 retries), and a read failed when both
        // retries did (flaky e2e tests while an apiserver reset or left). With 10, once in 2,048.
        "host_selection_retry_max_attempts": 10
    })
}

fn exact(header: &str, value: &str) -> Value {
    json!({"name": header, "string_match": {"exact": value}})
}

fn present(header: &str, present: bool) -> Value {
    match present {
        true => json!({"name": header, "present_match": true}),
        false => json!({"name": header, "present_match": true, "invert_match": true}),
    }
}

/// Who sends a request a bypass route takes: what it checks, and what it forwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Client {
    Token,
    /// On a connection the filter has mapped.
    Certificate,
    /// No credential at all.
    Anonymous,
}

/// The routes that take, for `table`, requests that need no decision straight to the cluster the
/// filter would pick (the pool, or the serving set of a rerouted GVR) with the skewgate filter
/// disabled (what they may take is [`bypass::plan`]'s, proven there). Envoy picks a
/// route before any filter runs, so a request these do not match meets the filter and the
/// routes after them as before. Every `x-remote-*` and `x-kubernetes-peer-proxied` a client sent
/// is already gone (the listener's early header mutation, before routing: `bypass::LISTENER_STRIPS`),
/// `x-skewgate-*` goes with the virtual host.
fn bypass_routes(table: &RoutingTable, timeout: &str) -> Vec<Value> {
    let Some(plan) = bypass::plan(table) else { return Vec::new() };
    // A token client: nothing to forward but what it sent, on a connection without a
    // certificate (`tls_context`, checked after the headers): kube-apiserver would take the
    // user from a certificate before any token.
    let token = [present("authorization", true)];
    let mut kinds =
        vec![(BYPASS_TOKEN_ROUTE, false, Client::Token), (BYPASS_TOKEN_WATCH_ROUTE, true, Client::Token)];
    // A certificate client whose connection the filter has mapped already (its first request
    // went through the filter, which left the identity as filter state, the marker last): the
    // route adds the filter's X-Remote-* from there. An absent group adds no header. The marker
    // says the connection has a certificate; no `Authorization` is the check that fails a
    // token client's request before the regex does (one with both goes through the filter).
    let certificate = [present("authorization", false)];
    if plan.certificates {
        kinds.extend([
            (BYPASS_CERTIFICATE_ROUTE, false, Client::Certificate),
            (BYPASS_CERTIFICATE_WATCH_ROUTE, true, Client::Certificate),
        ]);
    }
    // A client without any credential, on a connection without a certificate: no
    // `Authorization`, and no bearer token in a WebSocket subprotocol (kube-apiserver takes one
    // from there too); to the anonymous twin, as the filter sends it.
    let anonymous = [
        present("authorization", false),
        json!({
            "name": "sec-websocket-protocol",
            "string_match": {"contains": WEBSOCKET_BEARER},
            "invert_match": true,
            "treat_missing_header_as_empty": true
        }),
    ];
    let marker = json!([{
        "key": bypass::envoy_key(bypass::MARKER),
        "string_match": {"exact": bypass::MARKER_VALUE}
    }]);
    let identity: Vec<Value> = plan
        .identity_headers
        .iter()
        .map(|(header, key)| {
            add_header(header, &format!("%FILTER_STATE({key}:PLAIN)%"), "APPEND_IF_EXISTS_OR_ADD")
        })
        .collect();
    let route = |name: String, target: &bypass::Target, watch: bool, client: Client, regex: &str| {
        // No request with the filter's cluster header gets here (the filter's routes, before
        // these, take every one): a request the filter took, whose identity it forwards itself,
        // never meets a bypass route, which would add that identity a second time.
        // Envoy checks them in this order and stops at the first miss: the regex, the one that
        // costs, goes last.
        let mut headers = Vec::new();
        headers.extend_from_slice(match client {
            Client::Token => &token[..],
            Client::Certificate => &certificate[..],
            Client::Anonymous => &anonymous[..],
        });
        headers.push(exact(":method", "GET"));
        // Every request the read routes leave tries the watch routes: a substring search spares
        // all but watches their regexes.
        if watch {
            headers.push(json!({"name": ":path", "string_match": {"contains": "watch="}}));
        }
        headers.push(json!({"name": ":path", "string_match": {"safe_regex": {"regex": regex}}}));
        headers.extend(target.except.iter().map(|except| {
            json!({"name": ":path", "string_match": {"safe_regex": {"regex": except}}, "invert_match": true})
        }));
        let to = match client {
            Client::Anonymous => &target.anonymous_cluster,
            Client::Token | Client::Certificate => &target.cluster,
        };
        let action = match watch {
            true => json!({"cluster": to, "timeout": "0s", "idle_timeout": "3600s"}),
            false => read_route(json!({"cluster": to}), timeout),
        };
        let mut added = match client {
            Client::Certificate => identity.clone(),
            Client::Token | Client::Anonymous => Vec::new(),
        };
        let mut route = json!({
            "name": name,
            "match": {"prefix": "/", "headers": headers},
            "route": action,
            "typed_per_filter_config": {
                FILTER_NAME: {"@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig", "disabled": true},
                CERTIFICATE_FILTER_NAME: {"@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig", "disabled": true}
            },
            // For the bootstrap's Status 503 when none of them answers.
            "metadata": {"filter_metadata": {ROUTE_METADATA: {"servers": target.servers.join(",")}}}
        });
        if let Some(server) = &target.while_up {
            route["metadata"]["filter_metadata"][ROUTE_METADATA][WHILE_UP] = json!(server);
        }
        match client {
            Client::Certificate => route["match"]["filter_state"] = marker.clone(),
            Client::Token | Client::Anonymous => route["match"]["tls_context"] = json!({"presented": false}),
        }
        // A serving set's routes are counted, under the set's name whichever kind took the
        // request (vhost.apiservers.route.rerouted_<set>), and stamp what the filter stamps on
        // a rerouted request, over whatever the client sent. The pool's are not counted: a
        // route's statistics cost each request it took 4,100 instructions, 2% of Envoy's own
        // (callgrind, BENCHMARKS.md); the filter counts the requests it sees instead.
        if target.rerouted {
            route["stat_prefix"] =
                json!(format!("{REROUTED_STAT_PREFIX}{}", target.cluster.replace('.', "_")));
            added.push(add_header(PEER_PROXIED, "true", "OVERWRITE_IF_EXISTS_OR_ADD"));
        }
        if !added.is_empty() {
            route["request_headers_to_add"] = json!(added);
        }
        route
    };
    // Each target gets, for each client kind, a route for reads and one for watches (a watch
    // outlives any request timeout, as the long-running route below does; a set has none),
    // each once per slice of its regexes: `bypass-token` (any group/version), then
    // `bypass-token-2`, ... for the pool's named resources, `bypass-token/skewgate-set-cp-3`,
    // ... for a serving set's rerouted GVRs, in the plan's order: any group/version's first,
    // where most requests stop, then the targets naming the most resources. One set of routes per
    // set, not per GVR: every request the filter routes passes each route before the filter
    // names its cluster, and 152 routes of 38 rerouted GVRs made each such request 12 µs dearer
    // (make bench, when it passed them twice).
    let mut all = Vec::new();
    let mut count: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    let mut routes_of = |kinds: &[(&'static str, bool, Client)], all: &mut Vec<Value>| {
        for target in &plan.targets {
            for &(kind, watch, client) in kinds {
                let regexes = if watch { &target.watch_regexes } else { &target.path_regexes };
                for regex in regexes {
                    let n = count.entry((kind, &target.cluster)).or_default();
                    *n += 1;
                    let mut name = match n {
                        1 => kind.to_owned(),
                        _ => format!("{kind}-{n}"),
                    };
                    if target.rerouted {
                        name = format!("{name}/{}", target.cluster);
                    }
                    all.push(route(name, target, watch, client, regex));
                }
                // `<kind>` names the uniform group/versions' route alone, even when there is none.
                let n = count.entry((kind, &target.cluster)).or_default();
                *n = (*n).max(1);
            }
        }
    };
    routes_of(&kinds, &mut all);
    // Clients without credentials (probes, load balancers' checks, unauthenticated discovery),
    // after the others: each target's routes to its anonymous twin, named as above; then the
    // health and version endpoints. Every route costs a request that meets the filter (it passes
    // them all first), ~0.4k instructions each: the sets' four took the anonymous mix from
    // 271.4k instructions per request to 224.2k, discovery from 345.9k to 347.6k (callgrind).
    routes_of(
        &[
            (BYPASS_ANONYMOUS_ROUTE, false, Client::Anonymous),
            (BYPASS_ANONYMOUS_WATCH_ROUTE, true, Client::Anonymous),
        ],
        &mut all,
    );
    if let Some(pool) = plan.pool() {
        all.push(route(BYPASS_ANONYMOUS_HEALTH_ROUTE.into(), pool, false, Client::Anonymous, bypass::HEALTH));
    }
    all
}

/// An Envoy `HeaderValueOption`: `key: value`, added as `action` says.
fn add_header(key: &str, value: &str, action: &str) -> Value {
    json!({"header": {"key": key, "value": value}, "append_action": action})
}

/// `ecds.json`: the skewgate filter with `table_json` as its plugin configuration.
pub fn ecds(table_json: &str, wasm: &Path) -> Value {
    json!({"resources": [{
        "@type": "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig",
        "name": FILTER_NAME,
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
            "config": {
                "name": FILTER_NAME,
                "root_id": FILTER_NAME,
                // A trapped VM is replaced on the next request instead of failing every request
                // until the next table push.
                "failure_policy": "FAIL_RELOAD",
                // A paused response head still gets the body callbacks (the filter replaces an
                // authorized apiserver body with a composed document chunk by chunk); without
                // this Envoy holds the body back until the filter resumes, which it never does.
                "allow_on_headers_stop_iteration": true,
                "vm_config": {
                    "vm_id": FILTER_NAME,
                    "runtime": "envoy.wasm.runtime.v8",
                    "code": {"local": {"filename": wasm.display().to_string()}}
                },
                "configuration": {
                    "@type": "type.googleapis.com/google.protobuf.StringValue",
                    "value": table_json
                }
            }
        }
    }]})
}

/// The native module's ECDS resource: the same `table_json` as [`ecds`] carries, for the
/// module's filter (`filter_name` is the one the module's `new_http_filter_config` answers to).
pub fn module_ecds(table_json: &str) -> Value {
    json!({"resources": [{
        "@type": "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig",
        "name": MODULE_FILTER_NAME,
        "typed_config": {
            "@type": DYNAMIC_MODULE_FILTER_TYPE,
            "dynamic_module_config": {"name": MODULE_NAME},
            "filter_name": "skewgate",
            "filter_config": {"@type": "type.googleapis.com/google.protobuf.StringValue", "value": table_json}
        }
    }]})
}

/// Which apiservers Envoy may send new requests to, beyond its own health checks: the sidecar's
/// verdict, laid over `cds.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overlay {
    /// No new request, in any cluster: down, starting, or no longer serving what the live table
    /// sends it.
    pub draining: BTreeSet<String>,
    /// Stopping (kube-apiserver after SIGTERM, serving out its shutdown delay): new requests
    /// only in the clusters where nobody else can take them, so that the last server of an API
    /// keeps that API's requests until it stops answering.
    pub stopping: BTreeSet<String>,
}

impl Overlay {
    pub fn draining(draining: BTreeSet<String>) -> Overlay {
        Overlay { draining, stopping: BTreeSet::new() }
    }

    /// The apiservers it takes out of some cluster, draining or stopping: their own routes
    /// ([`rds_with_overlay`]) leave with them.
    pub fn away(&self) -> BTreeSet<&str> {
        self.draining.iter().chain(&self.stopping).map(String::as_str).collect()
    }

    /// Whether `id`'s endpoint is marked in a cluster whose apiservers are `members`.
    fn marks(&self, id: &str, members: &[Option<&str>]) -> bool {
        if self.draining.contains(id) {
            return true;
        }
        let takes =
            |m: &Option<&str>| m.is_some_and(|m| !self.draining.contains(m) && !self.stopping.contains(m));
        self.stopping.contains(id) && members.iter().any(takes)
    }
}

/// `cds` with the endpoints `overlay` marks `DRAINING` (and left out of active health checks)
/// and every other endpoint without a health status of its own (Envoy's active health checks
/// decide alone). Envoy sends no new request to a `DRAINING` host, whatever its health checks
/// say; requests under way (watches included) go on. STATIC and STRICT_DNS clusters both honour
/// it.
pub fn with_draining(cds: &Value, overlay: &Overlay) -> Value {
    let mut cds = cds.clone();
    let clusters = cds.get_mut("resources").and_then(Value::as_array_mut);
    for cluster in clusters.into_iter().flatten() {
        let members: Vec<Option<String>> =
            endpoints_of(cluster).map(|e| apiserver_of(e).map(str::to_owned)).collect();
        let members: Vec<Option<&str>> = members.iter().map(Option::as_deref).collect();
        let localities = cluster.pointer_mut("/load_assignment/endpoints").and_then(Value::as_array_mut);
        for locality in localities.into_iter().flatten() {
            let endpoints = locality.get_mut("lb_endpoints").and_then(Value::as_array_mut);
            for endpoint in endpoints.into_iter().flatten() {
                let drain = apiserver_of(endpoint).is_some_and(|id| overlay.marks(id, &members));
                if let Some(lb_endpoint) = endpoint.as_object_mut() {
                    match drain {
                        true => lb_endpoint.insert("health_status".into(), json!("DRAINING")),
                        false => lb_endpoint.remove("health_status"),
                    };
                }
                // A changed cluster takes over only once each of its hosts has been health-checked
                // (warming): an apiserver that hangs while it stops would hold its own exclusion
                // back for a whole check timeout. It gets no requests anyway.
                if let Some(inner) = endpoint.get_mut("endpoint").and_then(Value::as_object_mut) {
                    match drain {
                        true => inner.insert(
                            "health_check_config".into(),
                            json!({"disable_active_health_check": true}),
                        ),
                        false => inner.remove("health_check_config"),
                    };
                }
            }
        }
    }
    cds
}

fn endpoints_of(cluster: &Value) -> impl Iterator<Item = &Value> {
    let localities =
        cluster.pointer("/load_assignment/endpoints").and_then(Value::as_array).into_iter().flatten();
    localities.filter_map(|l| l.get("lb_endpoints").and_then(Value::as_array)).flatten()
}

fn apiserver_of(endpoint: &Value) -> Option<&str> {
    endpoint.pointer("/metadata/filter_metadata/skewgate/apiserver").and_then(Value::as_str)
}

/// The overlay `cds` carries (what [`with_draining`] wrote): an apiserver marked in every
/// cluster it is in is draining, one marked in some of them stopping.
pub fn draining_in(cds: &Value) -> Overlay {
    let mut marked: BTreeMap<&str, (bool, bool)> = BTreeMap::new();
    let clusters = cds.get("resources").and_then(Value::as_array).into_iter().flatten();
    for endpoint in clusters.flat_map(endpoints_of) {
        let Some(id) = apiserver_of(endpoint) else { continue };
        let drained = endpoint.get("health_status").and_then(Value::as_str) == Some("DRAINING");
        let (some, all) = marked.entry(id).or_insert((false, true));
        *some |= drained;
        *all &= drained;
    }
    let mut overlay = Overlay::default();
    for (id, (some, all)) in marked {
        match (some, all) {
            (true, true) => overlay.draining.insert(id.to_owned()),
            (true, false) => overlay.stopping.insert(id.to_owned()),
            _ => false,
        };
    }
    overlay
}

/// The routing table inside an `ecds.json` (the filter's or the module's), so tools accept any
/// of the files.
pub fn table_from_ecds(ecds: &Value) -> Option<&str> {
    table_of_filter(ecds.get("resources")?.get(0)?)
}

/// The table one ECDS resource carries: the proxy-wasm filter's plugin configuration or the
/// native module's filter configuration.
pub fn table_of_filter(filter: &Value) -> Option<&str> {
    ["/typed_config/config/configuration/value", "/typed_config/filter_config/value"]
        .into_iter()
        .find_map(|at| filter.pointer(at)?.as_str())
}

fn resources_of(cds: Option<&Value>) -> impl Iterator<Item = &Value> {
    cds.and_then(|c| c.get("resources")).and_then(Value::as_array).into_iter().flatten()
}

/// The names of the clusters a `cds.json` defines.
pub fn cluster_names(cds: Option<&Value>) -> BTreeSet<String> {
    resources_of(cds).filter_map(|r| r.get("name").and_then(Value::as_str)).map(str::to_owned).collect()
}

/// The new clusters, then the old ones the new CDS no longer has (new definitions win).
pub fn union_cds(new: &Value, old: Option<&Value>) -> Value {
    let names = cluster_names(Some(new));
    let mut resources: Vec<Value> = resources_of(Some(new)).cloned().collect();
    resources.extend(
        resources_of(old)
            .filter(|r| r.get("name").and_then(Value::as_str).is_some_and(|n| !names.contains(n)))
            .cloned(),
    );
    json!({ "resources": resources })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn table() -> TableConfig {
        serde_json::from_value(json!({
            "schema": 1,
            "apiservers": [{"id": "a", "cluster": "ap-a"}, {"id": "b", "cluster": "ap-b"}],
            "poolCluster": "pool",
            "sets": [{"cluster": "set-b", "members": ["b"]}]
        }))
        .unwrap()
    }

    pub(crate) fn tls() -> UpstreamTls {
        UpstreamTls {
            peer_ca: "/ca.crt".into(),
            client_cert: "/c.crt".into(),
            client_key: "/c.key".into(),
            server_name: "kubernetes.default.svc".into(),
            health_user: "system:apiserver".into(),
            health_groups: vec!["system:authenticated".into()],
        }
    }

    #[test]
    fn clusters_for_pool_apiservers_and_sets() {
        let endpoints = [
            Endpoint { id: "a".into(), address: "127.0.0.1".into(), port: 7001 },
            Endpoint { id: "b".into(), address: "apiserver-b".into(), port: 6443 },
        ];
        let v = cds(&table(), &endpoints, &tls(), Health::default()).unwrap();
        let names: Vec<&str> =
            v["resources"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["pool", "ap-a", "ap-b", "set-b"]);
        assert_eq!(v["resources"][1]["type"], "STATIC");
        assert_eq!(v["resources"][3]["type"], "STRICT_DNS");
        assert_eq!(
            v["resources"][0]["load_assignment"]["endpoints"][0]["lb_endpoints"].as_array().unwrap().len(),
            2
        );
        assert_eq!(v["resources"][0]["connect_timeout"], "1.000s");
        let e = cds(&table(), &endpoints[..1], &tls(), Health::default()).unwrap_err();
        assert!(e.0.contains("\"b\""), "{e}");
    }

    /// R1: a real apiserver answers the front-proxy certificate without X-Remote-User with 401.
    #[test]
    fn health_checks_assert_an_identity_and_twins_carry_no_certificate() {
        let endpoints = [
            Endpoint { id: "a".into(), address: "127.0.0.1".into(), port: 7001 },
            Endpoint { id: "b".into(), address: "127.0.0.1".into(), port: 7002 },
        ];
        let mut t = table();
        t.anonymous_cluster_prefix = Some("anon-".into());
        let v = cds(&t, &endpoints, &tls(), Health::default()).unwrap();
        let clusters = v["resources"].as_array().unwrap();
        let names: Vec<&str> = clusters.iter().map(|c| c["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["pool", "ap-a", "ap-b", "set-b", "anon-pool", "anon-set-b"]);
        for c in &clusters[..4] {
            let check = &c["health_checks"][0]["http_health_check"];
            let headers: Vec<(&str, &str)> = check["request_headers_to_add"]
                .as_array()
                .unwrap()
                .iter()
                .map(|h| (h["header"]["key"].as_str().unwrap(), h["header"]["value"].as_str().unwrap()))
                .collect();
            assert_eq!(
                headers,
                [("X-Remote-User", "system:apiserver"), ("X-Remote-Group", "system:authenticated")]
            );
            let tls = &c["transport_socket"]["typed_config"]["common_tls_context"];
            assert_eq!(tls["tls_certificates"][0]["certificate_chain"]["filename"], "/c.crt");
        }
        for c in &clusters[4..] {
            let tls = &c["transport_socket"]["typed_config"]["common_tls_context"];
            assert!(tls.get("tls_certificates").is_none(), "{c}");
            assert_eq!(tls["validation_context"]["trusted_ca"]["filename"], "/ca.crt");
            let check = &c["health_checks"][0]["http_health_check"];
            assert!(check.get("request_headers_to_add").is_none());
            assert_eq!(check["expected_statuses"][1]["start"], 401);
        }
        let hosts = |i: usize| {
            clusters[i]["load_assignment"]["endpoints"][0]["lb_endpoints"].as_array().unwrap().len()
        };
        assert_eq!((hosts(4), hosts(5)), (2, 1));
    }

    #[test]
    fn draining_marks_every_endpoint_of_an_apiserver() {
        let endpoints = [
            Endpoint { id: "a".into(), address: "127.0.0.1".into(), port: 7001 },
            Endpoint { id: "b".into(), address: "apiserver-b".into(), port: 6443 },
        ];
        let v = cds(&table(), &endpoints, &tls(), Health::default()).unwrap();
        assert_eq!(draining_in(&v), Overlay::default());
        let b = Overlay::draining(BTreeSet::from(["b".to_string()]));
        let drained = with_draining(&v, &b);
        assert_eq!(draining_in(&drained), b);
        // pool: a then b; ap-b; set-b (STRICT_DNS: b has a host name).
        assert_eq!((status(&drained, 0, 0), status(&drained, 0, 1)), (None, Some(json!("DRAINING"))));
        assert_eq!(status(&drained, 1, 0), None);
        assert_eq!(status(&drained, 2, 0), Some(json!("DRAINING")));
        assert_eq!(status(&drained, 3, 0), Some(json!("DRAINING")));
        let b_endpoint =
            &drained["resources"][3]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"];
        assert_eq!(b_endpoint["health_check_config"], json!({"disable_active_health_check": true}));
        assert_eq!(
            with_draining(&drained, &Overlay::default()),
            v,
            "undraining restores the clusters exactly"
        );
    }

    /// A stopping apiserver is marked only where another apiserver takes the requests: in the
    /// pool (a is there), not in its own clusters nor in a set of stopping or draining ones.
    #[test]
    fn a_stopping_apiserver_keeps_the_clusters_nobody_else_takes() {
        let endpoints = [
            Endpoint { id: "a".into(), address: "127.0.0.1".into(), port: 7001 },
            Endpoint { id: "b".into(), address: "apiserver-b".into(), port: 6443 },
        ];
        let v = cds(&table(), &endpoints, &tls(), Health::default()).unwrap();
        let stopping = Overlay { stopping: BTreeSet::from(["b".to_string()]), ..Overlay::default() };
        let marked = with_draining(&v, &stopping);
        assert_eq!((status(&marked, 0, 0), status(&marked, 0, 1)), (None, Some(json!("DRAINING"))), "pool");
        assert_eq!(status(&marked, 2, 0), None, "b's own cluster");
        assert_eq!(status(&marked, 3, 0), None, "set-b: b alone serves it");
        assert_eq!(draining_in(&marked), stopping, "read back as stopping: marked in some clusters only");
        // a draining too: nobody else takes the pool's requests either.
        let both = Overlay { draining: BTreeSet::from(["a".to_string()]), ..stopping };
        let marked = with_draining(&v, &both);
        assert_eq!((status(&marked, 0, 0), status(&marked, 0, 1)), (Some(json!("DRAINING")), None), "pool");
        assert_eq!(draining_in(&marked), Overlay::draining(both.draining.clone()), "b marked nowhere");
    }

    fn status(v: &Value, cluster: usize, endpoint: usize) -> Option<Value> {
        v["resources"][cluster]["load_assignment"]["endpoints"][0]["lb_endpoints"][endpoint]
            .get("health_status")
            .cloned()
    }

    #[test]
    fn ecds_round_trips_the_table() {
        let v = ecds("{\"schema\":1}", Path::new("/x/skewgate.wasm"));
        assert_eq!(table_from_ecds(&v), Some("{\"schema\":1}"));
        assert_eq!(v["resources"][0]["name"], FILTER_NAME);
        assert_eq!(v["resources"][0]["typed_config"]["config"]["failure_policy"], "FAIL_RELOAD");
        assert_eq!(v["resources"][0]["typed_config"]["config"]["allow_on_headers_stop_iteration"], true);
    }

    /// Core's sample without the hold, so that set-c's routes, c's alone, are there whatever
    /// the overlay (with a hold they are for while c is up: [`a_sole_servers_routes_leave_with_it`]).
    fn routing_table(edit: impl FnOnce(&mut Value)) -> RoutingTable {
        let mut t = skewgate_core::testing::sample();
        t["policy"] = json!({"hold": {"maxWait": "0s"}});
        edit(&mut t);
        RoutingTable::from_json(t.to_string().as_bytes()).unwrap()
    }

    /// With the hold, set-c's routes (c alone serves its APIs) carry c as the apiserver they are
    /// for while it is up: an overlay that takes c out of Envoy's clusters, draining or
    /// stopping, takes them out too and nothing else, and says so in the version; one that takes
    /// out only servers of others leaves the routes as rendered.
    #[test]
    fn a_sole_servers_routes_leave_with_it() {
        let t = RoutingTable::from_json(skewgate_core::testing::sample().to_string().as_bytes()).unwrap();
        let rendered = rds(Some(&t), "65s");
        let names = route_names(&rendered);
        let of_c: Vec<&str> = names.iter().copied().filter(|n| n.ends_with("/set-c")).collect();
        assert!(!of_c.is_empty(), "{names:?}");
        let routes = rendered["resources"][0]["virtual_hosts"][0]["routes"].as_array().unwrap();
        for route in routes {
            let while_up = &route["metadata"]["filter_metadata"][ROUTE_METADATA][WHILE_UP];
            let name = route["name"].as_str().unwrap();
            assert_eq!(while_up.as_str(), name.ends_with("/set-c").then_some("c"), "{name}");
        }
        let version = rds_version(&rendered).unwrap();
        let ids = |ids: &[&str]| ids.iter().map(|s| s.to_string()).collect::<BTreeSet<String>>();
        for overlay in [
            Overlay::draining(ids(&["c"])),
            Overlay { stopping: ids(&["c"]), ..Overlay::default() },
            Overlay { draining: ids(&["a", "c"]), stopping: ids(&["b"]) },
        ] {
            let without = rds_with_overlay(&rendered, &overlay);
            let left: Vec<&str> = names.iter().copied().filter(|n| !of_c.contains(n)).collect();
            assert_eq!(route_names(&without), left, "{overlay:?}");
            let overlaid = rds_version(&without).unwrap();
            assert_eq!(overlaid, format!("{version}+c"));
            assert_eq!(routes_base_version(overlaid), version);
        }
        for overlay in
            [Overlay::default(), Overlay::draining(ids(&["a"])), Overlay::draining(ids(&["a", "b"]))]
        {
            assert_eq!(rds_with_overlay(&rendered, &overlay), rendered, "{overlay:?}");
        }
        assert_eq!(routes_base_version(version), version);
        let no_hold = rds(Some(&routing_table(|_| {})), "65s");
        assert_eq!(rds_with_overlay(&no_hold, &Overlay::draining(ids(&["c"]))), no_hold, "without a hold");
    }

    fn route_names(rds: &Value) -> Vec<&str> {
        let routes = rds["resources"][0]["virtual_hosts"][0]["routes"].as_array().unwrap();
        routes.iter().map(|r| r["name"].as_str().unwrap()).collect()
    }

    fn header_matches(route: &Value) -> Vec<String> {
        route["match"]["headers"].as_array().unwrap().iter().map(Value::to_string).collect()
    }

    const SHIPPED: [&str; 4] = ["long-running", "read", "read-head", "default"];

    const KINDS: [&str; 4] = [
        BYPASS_TOKEN_ROUTE,
        BYPASS_TOKEN_WATCH_ROUTE,
        BYPASS_CERTIFICATE_ROUTE,
        BYPASS_CERTIFICATE_WATCH_ROUTE,
    ];

    /// The routes of clients without credentials, after the rest: the pool's any resource and
    /// its watches, the health and version endpoints.
    const ANONYMOUS: [&str; 3] =
        [BYPASS_ANONYMOUS_ROUTE, BYPASS_ANONYMOUS_WATCH_ROUTE, BYPASS_ANONYMOUS_HEALTH_ROUTE];

    /// The pool's anonymous routes when it has named resources too (`-2`), as the sample has.
    const ANONYMOUS_NAMED: [&str; 5] = [
        BYPASS_ANONYMOUS_ROUTE,
        BYPASS_ANONYMOUS_WATCH_ROUTE,
        "bypass-anonymous-2",
        "bypass-anonymous-watch-2",
        BYPASS_ANONYMOUS_HEALTH_ROUTE,
    ];

    fn path_matcher(regex: &str) -> String {
        json!({"name": ":path", "string_match": {"safe_regex": {"regex": regex}}}).to_string()
    }

    /// `headers` but the `:path` regex, then `regex` after them.
    fn with_path(headers: &[String], regex: &str) -> Vec<String> {
        let mut headers: Vec<String> =
            headers.iter().filter(|h| !h.contains("safe_regex")).cloned().collect();
        headers.push(path_matcher(regex));
        headers
    }

    /// The bypass routes of `rds`: after the filter's, before the last.
    fn bypass_of(rds: &Value) -> &[Value] {
        let routes = rds["resources"][0]["virtual_hosts"][0]["routes"].as_array().unwrap();
        assert_eq!(route_names(rds)[..SHIPPED.len()], SHIPPED);
        assert_eq!(routes.last().unwrap()["name"], UNROUTED);
        &routes[SHIPPED.len()..routes.len() - 1]
    }

    fn bypass_names(rds: &Value) -> Vec<&str> {
        bypass_of(rds).iter().map(|r| r["name"].as_str().unwrap()).collect()
    }

    /// The routes but the serving sets' (named `<kind>/<set cluster>`).
    fn without_rerouted<'a>(names: &[&'a str]) -> Vec<&'a str> {
        names.iter().copied().filter(|n| !n.contains('/')).collect()
    }

    #[test]
    fn without_a_table_only_the_shipped_routes() {
        let none = rds(None, "65s");
        assert_eq!(route_names(&none), [&SHIPPED[..], &[UNROUTED]].concat());
        let config = &none["resources"][0];
        assert_eq!(config["@type"], ROUTE_CONFIG_TYPE);
        assert_eq!(config["name"], ROUTE_CONFIG_NAME);
        let host = &config["virtual_hosts"][0];
        assert_eq!(
            host["request_headers_to_remove"],
            json!(["x-skewgate-cluster", "x-skewgate-route", "x-skewgate-peer-certificate"])
        );
        assert_eq!(host["retry_policy"]["retry_on"], "connect-failure,refused-stream,reset-before-request");
        let routes = host["routes"].as_array().unwrap();
        assert_eq!(
            routes[0]["route"],
            json!({"cluster_header": "x-skewgate-cluster", "timeout": "0s", "idle_timeout": "3600s"})
        );
        for read in &routes[1..3] {
            assert_eq!(
                (&read["route"]["timeout"], &read["route"]["idle_timeout"]),
                (&json!("0s"), &json!("65s"))
            );
            assert_eq!(
                read["route"]["retry_policy"]["retry_on"],
                "connect-failure,refused-stream,reset-before-request,reset"
            );
        }
        assert_eq!(
            routes[3]["route"],
            json!({"cluster_header": "x-skewgate-cluster", "timeout": "0s", "idle_timeout": "65s"})
        );
        // The filter's routes take only what it routed; the last one anything else, on its way
        // to the filter, and should the filter name no cluster, goes as the default one.
        let routed = json!({"name": "x-skewgate-cluster", "present_match": true}).to_string();
        for route in &routes[..4] {
            assert_eq!(header_matches(route)[0], routed, "{}", route["name"]);
        }
        assert_eq!(routes[4]["match"], json!({"prefix": "/"}));
        assert_eq!(routes[4]["route"], routes[3]["route"]);
        // A table whose every group/version is served by some apiservers only: no resource goes
        // to the pool (what the table does not know goes through the filter), and of the
        // discovery documents only the core group's, which `decide` sends to the pool whoever
        // serves it: the pool's routes take those alone, no watch.
        let rerouted = routing_table(|t| {
            for gv in t["groupVersions"].as_array_mut().unwrap() {
                gv["servedBy"] = json!(["a", "b"]);
                for served in gv["resources"].as_object_mut().unwrap().values_mut() {
                    *served = json!(["a", "b"]);
                }
            }
        });
        let plan = bypass::plan(&rerouted).unwrap();
        assert!(plan.targets[1..].iter().all(|t| t.rerouted), "no named pool resources");
        let pool = plan.pool().unwrap();
        assert_eq!(pool.path_regexes, ["^(?:/api|/api/v1)(?:\\?[^w#%;]*)?$"]);
        assert_eq!(pool.watch_regexes, Vec::<String>::new());
        let rendered = rds(Some(&rerouted), "65s");
        let bypass = bypass_names(&rendered);
        let pools = [
            BYPASS_TOKEN_ROUTE,
            BYPASS_CERTIFICATE_ROUTE,
            BYPASS_ANONYMOUS_ROUTE,
            BYPASS_ANONYMOUS_HEALTH_ROUTE,
        ];
        assert_eq!(without_rerouted(&bypass), pools, "the core group's documents, the health endpoints");
        let sets: Vec<&str> = bypass.iter().copied().filter(|n| n.contains('/')).collect();
        assert!(
            sets.iter().any(|n| n.starts_with(BYPASS_TOKEN_ROUTE))
                && sets.iter().any(|n| n.starts_with(BYPASS_ANONYMOUS_ROUTE)),
            "the serving sets' {sets:?}"
        );
        assert_ne!(rds(None, "10s")["version_info"], none["version_info"], "the version follows the content");
    }

    #[test]
    fn a_plan_puts_the_bypass_routes_in_front() {
        let t = routing_table(|_| {});
        let plan = bypass::plan(&t).unwrap();
        let v = rds(Some(&t), "65s");
        let bypass = KINDS;
        // Any resource of the uniform group/versions, then the named resources of v1alpha3, then
        // the sets'.
        let named_pool = bypass.map(|kind| format!("{kind}-2"));
        let named_pool: Vec<&str> = named_pool.iter().map(String::as_str).collect();
        assert_eq!(
            without_rerouted(&route_names(&v)),
            [&SHIPPED[..], &bypass, &named_pool, &ANONYMOUS_NAMED, &[UNROUTED]].concat()
        );
        let routes = bypass_of(&v);
        let pool = plan.pool().unwrap();
        let path = json!({"name": ":path", "string_match": {"safe_regex": {"regex": pool.path_regexes[0]}}});
        let get = json!({"name": ":method", "string_match": {"exact": "GET"}});
        let (token, certificate) = (&routes[0], &routes[2]);
        let all = v["resources"][0]["virtual_hosts"][0]["routes"].as_array().unwrap();
        let read = all.iter().find(|r| r["name"] == "read").unwrap();
        assert_eq!(
            header_matches(token),
            [json!({"name": "authorization", "present_match": true}), get.clone(), path.clone(),]
                .map(|h| h.to_string())
        );
        assert_eq!(
            header_matches(certificate),
            [json!({"name": "authorization", "present_match": true, "invert_match": true}), get, path]
                .map(|h| h.to_string())
        );
        // Neither takes a request the other would: a certificate on the connection keeps a
        // token client's requests off the token route (kube-apiserver would read the
        // certificate first), and the certificate route needs the filter's marker.
        assert_eq!(token["match"]["tls_context"], json!({"presented": false}));
        assert_eq!(certificate["match"].get("tls_context"), None);
        assert_eq!(token["match"].get("filter_state"), None);
        assert_eq!(
            certificate["match"]["filter_state"],
            json!([{"key": "wasm.skewgate_identity", "string_match": {"exact": "1"}}])
        );
        let added: Vec<(&str, &str)> = certificate["request_headers_to_add"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| {
                assert_eq!(h["append_action"], "APPEND_IF_EXISTS_OR_ADD");
                (h["header"]["key"].as_str().unwrap(), h["header"]["value"].as_str().unwrap())
            })
            .collect();
        assert_eq!(added.len(), plan.identity_headers.len());
        assert_eq!(added[0], ("x-remote-user", "%FILTER_STATE(wasm.skewgate_user:PLAIN)%"));
        assert_eq!(added[1], ("x-remote-group", "%FILTER_STATE(wasm.skewgate_group_0:PLAIN)%"));
        for ((header, value), (plan_header, key)) in added.iter().zip(&plan.identity_headers) {
            assert_eq!((*header, *value), (*plan_header, format!("%FILTER_STATE({key}:PLAIN)%").as_str()));
        }
        assert_eq!(token.get("request_headers_to_add"), None);
        for route in [token, certificate] {
            // Not counted (the filter counts what it sees), and nothing removed: the listener
            // strips what the filter would.
            assert_eq!(route.get("stat_prefix"), None);
            assert_eq!(route.get("request_headers_to_remove"), None);
            assert_eq!(route["metadata"], json!({"filter_metadata": {"skewgate": {"servers": "a,b,c"}}}));
            assert_eq!(route["route"]["cluster"], "pool");
            assert_eq!(
                (&route["route"]["timeout"], &route["route"]["idle_timeout"]),
                (&json!("0s"), &json!("65s"))
            );
            assert_eq!(
                route["route"]["retry_policy"], read["route"]["retry_policy"],
                "the read route's retries"
            );
            // Neither the filter nor the header mutation that hands it the certificate.
            for filter in [FILTER_NAME, CERTIFICATE_FILTER_NAME] {
                assert_eq!(
                    route["typed_per_filter_config"][filter],
                    json!({"@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig", "disabled": true})
                );
            }
        }
        // The watch routes: the same clients and additions, the watch regex after a cheap check,
        // no timeout.
        for (watch, read_twin) in [(&routes[1], token), (&routes[3], certificate)] {
            let watches = json!({"name": ":path", "string_match": {"contains": "watch="}});
            let mut expected = header_matches(read_twin);
            expected.insert(expected.len() - 1, watches.to_string());
            assert_eq!(header_matches(watch), with_path(&expected, &pool.watch_regexes[0]));
            assert_eq!(watch["match"].get("filter_state"), read_twin["match"].get("filter_state"));
            assert_eq!(watch.get("request_headers_to_add"), read_twin.get("request_headers_to_add"));
            assert_eq!(watch["route"], json!({"cluster": "pool", "timeout": "0s", "idle_timeout": "3600s"}));
            assert_eq!(watch["typed_per_filter_config"], read_twin["typed_per_filter_config"]);
        }
        // The pool's named resources and a serving set's, after any group/version's: the same
        // checks and clients with their own regexes and no exceptions, each to its cluster, a
        // set's stamped as the filter stamps a rerouted request.
        let named = |name: String| routes.iter().position(|r| r["name"] == name.as_str()).unwrap();
        let devicetaintrules = &plan.targets[2];
        assert_eq!((devicetaintrules.cluster.as_str(), devicetaintrules.rerouted), ("pool", false));
        let first = named(format!("{BYPASS_TOKEN_ROUTE}-2"));
        for (k, (route, pool_twin)) in routes[first..first + 4].iter().zip(&routes[..4]).enumerate() {
            assert_eq!(route["name"], format!("{}-2", KINDS[k]));
            assert_eq!(route.get("stat_prefix"), None);
            let regexes =
                if k % 2 == 1 { &devicetaintrules.watch_regexes } else { &devicetaintrules.path_regexes };
            assert_eq!(header_matches(route), with_path(&header_matches(pool_twin), &regexes[0]));
            for field in [
                "route",
                "filter_state",
                "request_headers_to_add",
                "request_headers_to_remove",
                "typed_per_filter_config",
            ] {
                assert_eq!(
                    route.get(field).or(route["match"].get(field)),
                    pool_twin.get(field).or(pool_twin["match"].get(field)),
                    "{field}"
                );
            }
        }
        // set-c names more resources than the pool's v1alpha3 and set-a-b: its routes come right
        // after any group/version's.
        let claims = &plan.targets[1];
        let set = claims.cluster.as_str();
        assert_eq!((set, claims.rerouted), ("set-c", true));
        // Reads only: a set's watches go through the filter.
        assert!(!route_names(&v).iter().any(|n| n.starts_with(&format!("{BYPASS_TOKEN_WATCH_ROUTE}/"))));
        let kinds = [BYPASS_TOKEN_ROUTE, BYPASS_CERTIFICATE_ROUTE].map(|kind| named(format!("{kind}/{set}")));
        assert_eq!(kinds, [4, 5], "one after another, after any group/version's");
        assert!(first > kinds[1], "the targets in the plan's order");
        let peer_proxied = json!({"header": {"key": "x-kubernetes-peer-proxied", "value": "true"}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"});
        for (i, pool_twin) in kinds.iter().zip([&routes[0], &routes[2]]) {
            let route = &routes[*i];
            assert_eq!(route["stat_prefix"], format!("rerouted_{set}"));
            assert_eq!(route["metadata"]["filter_metadata"]["skewgate"]["servers"], claims.servers.join(","));
            assert_eq!(header_matches(route), with_path(&header_matches(pool_twin), &claims.path_regexes[0]));
            assert_eq!(route["match"].get("filter_state"), pool_twin["match"].get("filter_state"));
            let mut added = pool_twin.get("request_headers_to_add").cloned().unwrap_or(json!([]));
            added.as_array_mut().unwrap().push(peer_proxied.clone());
            assert_eq!(route["request_headers_to_add"], added);
            assert_eq!(route.get("request_headers_to_remove"), None, "set over a client's value");
            let mut action = pool_twin["route"].clone();
            action["cluster"] = json!(claims.cluster);
            assert_ne!(claims.cluster, "pool");
            assert_eq!(route["route"], action);
            assert_eq!(route["typed_per_filter_config"], pool_twin["typed_per_filter_config"]);
        }
    }

    /// A table too large for one regex per route: each kind of route for the pool's named
    /// resources once per slice, in the plan's order, every slice of a kind under the kind's
    /// statistics.
    #[test]
    fn large_tables_get_a_bypass_route_of_each_kind_per_slice() {
        let t = routing_table(|t| {
            let gvs = t["groupVersions"].as_array_mut().unwrap();
            let all = gvs[0]["servedBy"].clone();
            gvs.extend((0..2000).map(|i| {
                json!({"group": format!("g{i}.example.com"), "version": "v1", "servedBy": all, "resources": {"widgets": all, "gadgets": ["c"]}})
            }));
            gvs.extend((0..2000).map(|i| {
                json!({"group": format!("u{i}.example.com"), "version": "v1", "servedBy": all, "resources": {"widgets": all}})
            }));
        });
        let whole = bypass::plan(&t).unwrap();
        let plan = whole.targets.iter().skip(1).find(|t| !t.rerouted).unwrap();
        assert_eq!(plan.cluster, "pool");
        let slices = plan.path_regexes.len();
        assert!(slices > 1, "{slices}");
        let v = rds(Some(&t), "65s");
        let routes = bypass_of(&v);
        let kinds = [
            (BYPASS_TOKEN_ROUTE, &plan.path_regexes),
            (BYPASS_TOKEN_WATCH_ROUTE, &plan.watch_regexes),
            (BYPASS_CERTIFICATE_ROUTE, &plan.path_regexes),
            (BYPASS_CERTIFICATE_WATCH_ROUTE, &plan.watch_regexes),
        ];
        let expected: Vec<(String, &str)> = kinds
            .iter()
            .flat_map(|(kind, regexes)| {
                regexes
                    .iter()
                    .enumerate()
                    .map(move |(i, regex)| (format!("{kind}-{}", i + 2), regex.as_str()))
            })
            .collect();
        let start = routes.iter().position(|r| r["name"] == format!("{BYPASS_TOKEN_ROUTE}-2")).unwrap();
        let taken: Vec<(String, &str)> = routes[start..start + expected.len()]
            .iter()
            .map(|r| {
                let regex = r["match"]["headers"].as_array().unwrap().last().unwrap()["string_match"]["safe_regex"]
                    ["regex"]
                    .as_str()
                    .unwrap();
                assert_eq!(r.get("stat_prefix"), None, "the pool's are not counted");
                (r["name"].as_str().unwrap().to_owned(), regex)
            })
            .collect();
        assert_eq!(taken, expected);
        // Too many uniform group/versions to name them: the pool's first routes take any, but
        // their exceptions (inverted, after the regex), the mixed group/versions.
        let pool = whole.pool().unwrap();
        assert!(pool.except.len() > 1, "{}", pool.except.len());
        let except: Vec<String> = pool
            .except
            .iter()
            .map(|e| {
                json!({"name": ":path", "string_match": {"safe_regex": {"regex": e}}, "invert_match": true})
                    .to_string()
            })
            .collect();
        for route in &routes[..KINDS.len()] {
            let headers = header_matches(route);
            assert_eq!(headers[headers.len() - except.len()..], except[..], "{}", route["name"]);
        }
        assert_eq!(without_rerouted(&bypass_names(&v)[..start]), KINDS);
        // Clients without credentials: each slice's routes again, the pool's first target's
        // first, then the health endpoints.
        let anonymous = without_rerouted(&bypass_names(&v)[start + expected.len()..]);
        let named = (2..slices + 2).flat_map(|i| {
            [format!("{BYPASS_ANONYMOUS_ROUTE}-{i}"), format!("{BYPASS_ANONYMOUS_WATCH_ROUTE}-{i}")]
        });
        let named: Vec<String> = named.collect();
        let mut named: Vec<&str> = named.iter().map(String::as_str).collect();
        named.sort_by_key(|n| n.contains("-watch"));
        assert_eq!(anonymous, [&ANONYMOUS[..2], &named, &ANONYMOUS[2..]].concat());
    }

    /// A client without any credential, on a connection without a certificate, goes to the
    /// anonymous twin of the cluster a token client's request would: no `Authorization`, no
    /// bearer token in a WebSocket subprotocol; nothing added. Its health checks go to the pool's.
    #[test]
    fn anonymous_requests_take_the_twins_routes() {
        let t = routing_table(|t| t["anonymousClusterPrefix"] = json!("anon-"));
        let v = rds(Some(&t), "65s");
        let routes = v["resources"][0]["virtual_hosts"][0]["routes"].as_array().unwrap();
        let named = |name: &str| routes.iter().find(|r| r["name"] == name).unwrap();
        let (token, anonymous) = (named(BYPASS_TOKEN_ROUTE), named(BYPASS_ANONYMOUS_ROUTE));
        let headers = header_matches(anonymous);
        assert_eq!(
            headers[0],
            json!({"name": "authorization", "present_match": true, "invert_match": true}).to_string()
        );
        assert_eq!(
            headers[1],
            json!({"name": "sec-websocket-protocol", "string_match": {"contains": "base64url.bearer.authorization.k8s.io."}, "invert_match": true, "treat_missing_header_as_empty": true}).to_string()
        );
        assert_eq!(header_matches(token)[1..], headers[2..], "the same paths");
        assert_eq!(anonymous["match"]["tls_context"], json!({"presented": false}));
        assert_eq!(
            (&token["route"]["cluster"], &anonymous["route"]["cluster"]),
            (&json!("pool"), &json!("anon-pool"))
        );
        assert_eq!(anonymous.get("request_headers_to_add"), None);
        // A serving set's: to its twin, stamped as a rerouted request, nothing else added.
        let set = named("bypass-anonymous/set-c");
        assert_eq!(set["route"]["cluster"], "anon-set-c");
        assert_eq!(
            set["request_headers_to_add"],
            json!([{"header": {"key": "x-kubernetes-peer-proxied", "value": "true"}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}])
        );
        let health = named(BYPASS_ANONYMOUS_HEALTH_ROUTE);
        assert_eq!(health["route"]["cluster"], "anon-pool");
        assert!(header_matches(health).last().unwrap().contains("healthz|livez|readyz|version"));
    }

    /// Without a uniform group/version the pool's first target takes discovery documents alone,
    /// and the pool's named resources keep their names from `-2` on: `bypass-token` only ever
    /// names the route of the uniform group/versions and the documents, in the access log and
    /// the docs.
    #[test]
    fn the_pool_named_routes_keep_their_names_without_uniform_group_versions() {
        let t = routing_table(|t| {
            for gv in t["groupVersions"].as_array_mut().unwrap() {
                match (gv["group"].as_str(), gv["version"].as_str()) {
                    (Some(""), _) => gv["resources"]["configmaps"] = json!(["a", "b"]),
                    (Some("resource.k8s.io"), Some("v1beta1")) => {
                        gv["resources"]["resourceclaims"] = json!(["c"])
                    }
                    _ => {}
                }
            }
        });
        let plan = bypass::plan(&t).unwrap();
        let first = plan.pool().unwrap();
        assert_eq!(first.watch_regexes, Vec::<String>::new());
        // Documents only: no resource (each of those is `<group/version>/(?:namespaces/...)`).
        assert_eq!(first.path_regexes.len(), 1);
        assert!(first.path_regexes[0].contains("|/api/v1|") && !first.path_regexes[0].contains("namespaces"));
        let names = route_names(&rds(Some(&t), "65s")).into_iter().map(str::to_owned).collect::<Vec<_>>();
        let pool: Vec<&str> = names
            .iter()
            .map(String::as_str)
            .filter(|n| n.starts_with("bypass-") && !n.contains('/') && !n.starts_with("bypass-anonymous"))
            .collect();
        let named = KINDS.map(|kind| format!("{kind}-2"));
        let named: Vec<&str> = named.iter().map(String::as_str).collect();
        assert_eq!(pool, [&[BYPASS_TOKEN_ROUTE, BYPASS_CERTIFICATE_ROUTE], &named[..]].concat());
    }

    #[test]
    fn the_policy_shapes_the_bypass_routes() {
        let policy = |p: Value| routing_table(move |t| t["policy"] = p);
        let no_certificates = rds(Some(&policy(json!({"clientCertIdentity": false}))), "65s");
        let kinds = [BYPASS_TOKEN_ROUTE, BYPASS_TOKEN_WATCH_ROUTE];
        let named = kinds.map(|kind| format!("{kind}-2"));
        assert_eq!(
            without_rerouted(&route_names(&no_certificates)),
            [&SHIPPED[..], &kinds, &named.each_ref().map(String::as_str), &ANONYMOUS_NAMED, &[UNROUTED]]
                .concat()
        );
        assert!(!no_certificates.to_string().contains("bypass-certificate"));
        let no_credential_id = rds(Some(&policy(json!({"x509CredentialId": false}))), "65s");
        let added = &bypass_of(&no_credential_id)[2]["request_headers_to_add"];
        assert!(!added.to_string().contains("credential"), "{added}");
        let with_it = rds(Some(&policy(json!({}))), "65s");
        assert!(bypass_of(&with_it)[2]["request_headers_to_add"].to_string().contains("credential"));
    }

    /// Every read route (the filter's and the bypass routes') gives each try a third of the route
    /// timeout without a byte, so that a read a frozen apiserver holds goes to another; writes
    /// and long-running requests get none.
    #[test]
    fn reads_get_a_third_of_the_route_timeout_per_try() {
        let t = routing_table(|_| {});
        for (timeout, per_try) in [("65s", json!("21.666s")), ("30s", json!("10s")), ("0s", Value::Null)] {
            let v = rds(Some(&t), timeout);
            for route in v["resources"][0]["virtual_hosts"][0]["routes"].as_array().unwrap() {
                let retry = &route["route"]["retry_policy"]["per_try_idle_timeout"];
                let read = route["route"]["retry_policy"]["retry_on"]
                    .as_str()
                    .is_some_and(|r| r.ends_with(",reset"));
                let expected = if read { &per_try } else { &Value::Null };
                assert_eq!(retry, expected, "{timeout}: {}", route["name"]);
            }
        }
    }

    /// The listener's `stream_idle_timeout` (10 s) is its request-header timeout: a route without
    /// an `idle_timeout` of its own would cut off an answer that takes longer, or a quiet watch.
    #[test]
    fn every_route_replaces_the_listeners_header_timeout() {
        let t = routing_table(|_| {});
        for v in [rds(None, "65s"), rds(Some(&t), "65s")] {
            let routes = v["resources"][0]["virtual_hosts"][0]["routes"].as_array().unwrap();
            for route in routes {
                let (timeout, idle) = (&route["route"]["timeout"], &route["route"]["idle_timeout"]);
                let long =
                    route["name"] == "long-running" || route["name"].as_str().unwrap().contains("watch");
                let want = if long { "3600s" } else { "65s" };
                assert_eq!((timeout, idle), (&json!("0s"), &json!(want)), "{}", route["name"]);
            }
        }
    }

    #[test]
    fn module_ecds_carries_the_same_table() {
        let v = module_ecds("{\"schema\":1}");
        assert_eq!(table_from_ecds(&v), Some("{\"schema\":1}"));
        assert_eq!(v["resources"][0]["name"], MODULE_FILTER_NAME);
        assert_eq!(v["resources"][0]["typed_config"]["@type"], DYNAMIC_MODULE_FILTER_TYPE);
        assert_eq!(v["resources"][0]["typed_config"]["dynamic_module_config"]["name"], MODULE_NAME);
    }

    #[test]
    fn union_keeps_new_definitions() {
        let new = json!({"resources": [{"name": "x", "v": 2}, {"name": "y"}]});
        let old = json!({"resources": [{"name": "x", "v": 1}, {"name": "z"}]});
        assert_eq!(
            union_cds(&new, Some(&old)),
            json!({"resources": [{"name": "x", "v": 2}, {"name": "y"}, {"name": "z"}]})
        );
        assert_eq!(union_cds(&new, None), new);
    }
}
