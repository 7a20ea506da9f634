//! The front of every request to a stand-in: authentication, the body's limit, the resource /
//! non-resource split, and the record of what was served that tests read back.

use std::sync::PoisonError;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::header::{CACHE_CONTROL, HeaderValue};
use hyper::{Method, Request};
use skewgate_core::request_info::{RequestInfo, decode_path, split_target};

use super::auth::{self, Identity, Method as AuthMethod};
use super::instance::{Instance, MAX_BODY, SERVED_BY, Served};
use super::reply::{self, Reply};
use super::status::{Errors, Status};
use super::tls::PeerCert;
use super::{call, params, resources, startup};

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
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                return reply::error(&Status::too_large(MAX_BODY));
            }
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
