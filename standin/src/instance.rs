//! One stand-in's state, shared by its request handlers, and the front of every request:
//! authentication, the resource / non-resource split, and what tests can read back afterwards.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::header::{CACHE_CONTROL, HeaderValue};
use hyper::{Method, Request};
use skewgate_core::request_info::{RequestInfo, decode_path, split_target};

use super::auth::{self, Auth, Identity, Method as AuthMethod};
use super::catalog::Catalog;
use super::profile::Profile;
use super::reply::{self, Reply};
use super::status::{Errors, Status};
use super::store_handle::StoreHandle;
use super::tls::PeerCert;
use super::{call, crds, discovery, openapi, params, resources, startup};

/// The response header that names the apiserver (stand-in or echo double) that answered.
pub const SERVED_BY: &str = "x-skewgate-served-by";

/// Largest request body accepted (kube-apiserver's `MaxRequestBodyBytes`).
pub const MAX_BODY: usize = 3 * 1024 * 1024;
/// How many authenticated identities each stand-in remembers for tests.
const IDENTITIES_KEPT: usize = 32;
/// How many served requests each stand-in remembers for tests ([`crate::Standin::recent`]).
const REQUESTS_KEPT: usize = 512;

/// One request a stand-in answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    /// The `Audit-Id` response header it carried.
    pub audit_id: String,
    pub method: String,
    /// The request target (path and query) as it arrived, before any decoding.
    pub target: String,
    pub status: u16,
    /// Who it was served as (`None`: not authenticated).
    pub identity: Option<Identity>,
}

/// What the request handlers share.
pub(crate) struct Instance {
    pub(crate) id: String,
    pub(crate) profile: Profile,
    pub(crate) auth: Auth,
    pub(crate) catalog: Catalog,
    pub(crate) discovery: discovery::Discovery,
    pub(crate) openapi: Arc<openapi::OpenApi>,
    /// `/version`.
    pub(crate) version: Bytes,
    pub(crate) store: StoreHandle,
    pub(crate) identities: Mutex<VecDeque<Identity>>,
    pub(crate) recent: Mutex<VecDeque<Served>>,
    pub(crate) watches: Mutex<BTreeMap<String, u64>>,
    pub(crate) ready: AtomicBool,
    /// False while a starting server's RBAC is not synced ([`Startup::forbidding`]).
    pub(crate) authorizing: AtomicBool,
    /// Whether `/readyz` fails because post-start hooks run (rather than a shutdown).
    pub(crate) starting: AtomicBool,
    /// Until when Envoy's health checks take this long to answer
    /// ([`crate::Standin::slow_health_checks`]).
    pub(crate) slow_health_checks: Mutex<Option<(tokio::time::Instant, Duration)>>,
    pub(crate) requests: Arc<AtomicU64>,
    pub(crate) bookmark_interval: Duration,
    pub(crate) stopping: tokio::sync::watch::Receiver<bool>,
    /// Discovery with the CRDs this stand-in has seen.
    pub(crate) crds: crds::View,
    /// In the EndpointSlice and with a Lease ([`Standin::publish`]).
    pub(crate) published: Mutex<bool>,
}

impl Instance {
    pub(crate) async fn handle(&self, req: Request<Incoming>, peer: &PeerCert) -> Reply {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let trace = std::env::var_os("SKEWGATE_STANDIN_TRACE").map(|_| {
            let headers: Vec<String> = req
                .headers()
                .iter()
                .filter(|(n, _)| matches!(n.as_str(), "accept" | "content-type" | "user-agent"))
                .map(|(n, v)| format!("{n}={}", String::from_utf8_lossy(v.as_bytes())))
                .collect();
            format!("{} {} {}", req.method(), req.uri(), headers.join(" "))
        });
        let method = req.method().to_string();
        let target = req.uri().path_and_query().map_or_else(|| req.uri().to_string(), |p| p.to_string());
        let mut identity = None;
        let mut resp = self.route(req, peer, &mut identity).await;
        if let Some(line) = trace {
            // Opt-in debugging aid for kubectl trials.
            eprintln!("[standin {}] {line} -> {}", self.id, resp.status().as_u16());
        }
        let audit_id = uuid::Uuid::new_v4().to_string();
        let status = resp.status().as_u16();
        self.remember_served(Served { audit_id: audit_id.clone(), method, target, status, identity });
        let headers = resp.headers_mut();
        if let Ok(id) = HeaderValue::from_str(&self.id) {
            headers.insert(SERVED_BY, id);
        }
        if let Ok(audit) = HeaderValue::from_str(&audit_id) {
            headers.insert("audit-id", audit);
        }
        if !headers.contains_key(CACHE_CONTROL) {
            headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache, private"));
        }
        resp
    }

    /// Answers `req`; `seen` gets the identity it was authenticated as, if any.
    async fn route(&self, req: Request<Incoming>, peer: &PeerCert, seen: &mut Option<Identity>) -> Reply {
        let (parts, body) = req.into_parts();
        let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let (raw_path, query) = split_target(target);
        let Ok(path) = decode_path(raw_path) else {
            return reply::error(&Status::bad_request(format!("invalid URL escape in {raw_path:?}")));
        };
        let identity = match self.auth.authenticate(peer, &parts.headers) {
            Ok(identity) if identity.method == AuthMethod::Anonymous => {
                // system:public-info-viewer is all RBAC grants system:anonymous by default.
                if !auth::anonymous_allowed(&path) {
                    let verb = parts.method.as_str().to_ascii_lowercase();
                    return reply::error(&Status::forbidden_path(&identity.user, &verb, &path));
                }
                identity
            }
            Ok(identity) => {
                self.remember(&identity);
                *seen = Some(identity.clone());
                identity
            }
            Err(auth::Unauthorized) => return reply::error(&Status::unauthorized()),
        };
        let body = match Limited::new(body, MAX_BODY).collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => return reply::error(&Status::too_large()),
            Err(_) => Bytes::new(),
        };
        let info = RequestInfo::parse(parts.method.as_str(), &path, query);
        if !self.authorizing.load(Ordering::SeqCst)
            && let Some(denied) = startup::forbidden_while_starting(&identity, &info, &path)
        {
            return reply::error(&denied);
        }
        if info.is_resource_request && info.verb == "watch" {
            self.count_watch(&info);
        }
        if info.is_resource_request {
            let call = call::Call {
                info: &info,
                params: &params::Params::parse(query),
                headers: &parts.headers,
                body,
                identity: &identity,
            };
            return resources::handle(self, call);
        }
        let user_agent =
            parts.headers.get(hyper::header::USER_AGENT).map(hyper::header::HeaderValue::as_bytes);
        if path == "/readyz" && user_agent == Some(b"Envoy/HC") {
            let slow = *self.slow_health_checks.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some((_, delay)) = slow.filter(|(until, _)| tokio::time::Instant::now() < *until) {
                tokio::time::sleep(delay).await;
            }
        }
        self.non_resource(&parts.method, &path, query, &parts.headers)
    }

    fn remember_served(&self, served: Served) {
        let mut recent = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
        if recent.len() >= REQUESTS_KEPT {
            recent.pop_front();
        }
        recent.push_back(served);
    }

    fn count_watch(&self, info: &RequestInfo<'_>) {
        let mut key = format!("{}.{}", info.resource, info.api_version);
        if !info.api_group.is_empty() {
            key = format!("{key}.{}", info.api_group);
        }
        *self.watches.lock().unwrap_or_else(PoisonError::into_inner).entry(key).or_default() += 1;
    }

    fn remember(&self, identity: &Identity) {
        let mut seen = self.identities.lock().unwrap_or_else(PoisonError::into_inner);
        if seen.len() >= IDENTITIES_KEPT {
            seen.pop_front();
        }
        seen.push_back(identity.clone());
    }

    fn non_resource(&self, method: &Method, path: &str, query: &str, headers: &hyper::HeaderMap) -> Reply {
        if method != Method::GET && method != Method::HEAD {
            return reply::error(&Status::method_not_allowed());
        }
        match path {
            "/healthz" | "/livez" => return reply::text(200, "ok"),
            "/readyz" if self.ready.load(Ordering::SeqCst) => return reply::text(200, "ok"),
            "/readyz" if self.starting.load(Ordering::SeqCst) => {
                return reply::text(500, startup::STARTING_READYZ);
            }
            // Shutting down: only the `shutdown` check fails, and a client may leave it out.
            "/readyz" if query.split('&').any(|p| p == "exclude=shutdown") => return reply::text(200, "ok"),
            "/readyz" => {
                return reply::text(500, "[-]shutdown failed: reason withheld\nreadyz check failed\n");
            }
            "/version" | "/version/" => return reply::bytes(200, "application/json", self.version.clone()),
            // The one metric the sidecar reads, as kube-apiserver reports it.
            "/metrics" => {
                let (watch_list, vac) =
                    (u8::from(self.profile.watch_list()), u8::from(self.profile.volume_attributes_class()));
                let text = format!(
                    "# TYPE kubernetes_feature_enabled gauge\n\
                     kubernetes_feature_enabled{{name=\"VolumeAttributesClass\",stage=\"BETA\"}} {vac}\n\
                     kubernetes_feature_enabled{{name=\"WatchList\",stage=\"BETA\"}} {watch_list}\n"
                );
                return reply::bytes(200, "text/plain; version=0.0.4; charset=utf-8", text);
            }
            _ => {}
        }
        if let Some(reply) = self.openapi.respond(path, query, headers) {
            return reply;
        }
        let with_crds = self.crds.current();
        let discovery = with_crds.as_deref().unwrap_or(&self.discovery);
        discovery.respond(path, headers).unwrap_or_else(|| reply::error(&Status::no_route()))
    }
}
