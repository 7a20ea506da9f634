//! The composed documents over HTTP on a Unix socket, answered as kube-openapi answers
//! (`handler` for v2, `handler3` for v3): ETag = SHA-512, 304 on a matching `If-None-Match`,
//! a v3 document asked for with its hash is `Cache-Control: public, immutable` for a year, with
//! another hash a 301 to the current URL. Only Envoy reaches the socket (it sits in Envoy's
//! directory, mode 0600); the filter asks here only after an apiserver authorized the request.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{
    ACCEPT, CACHE_CONTROL, CONTENT_TYPE, ETAG, EXPIRES, HeaderMap, HeaderValue, IF_NONE_MATCH, LAST_MODIFIED,
    LOCATION, VARY,
};
use hyper::service::service_fn;
use hyper::{Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::UnixListener;
use tokio::task::JoinSet;

use super::fetch::fetch;
use skewgate_openapi::v2proto;

use super::{Composed, Composer, Doc, Fetched, MEMORY_BUDGET_BYTES, server_relative_url};
use crate::fetch::Fetcher;

/// What the server answers from; None until the first composition.
pub type Current = Arc<RwLock<Option<Arc<Composed>>>>;

/// The answer to a GET of `path` (`/openapi/v2`, `/openapi/v3`, `/openapi/v3/<key>`).
pub fn respond(
    composed: Option<&Composed>,
    path: &str,
    query: &str,
    headers: &HeaderMap,
) -> Response<Full<Bytes>> {
    let Some(composed) = composed else {
        return status(
            StatusCode::SERVICE_UNAVAILABLE,
            "skewgate has not composed the OpenAPI documents yet",
        );
    };
    let mut resp = match path {
        "/openapi/v2" => match v2_form(headers) {
            Some(V2Form::Json) => match &composed.v2 {
                Some(v2) => serve_content(&v2.doc, headers, composed.built, JSON),
                None => status(StatusCode::SERVICE_UNAVAILABLE, "no apiserver served /openapi/v2"),
            },
            Some(V2Form::Proto) => match &composed.v2_proto {
                Some(v2) => serve_content(&v2.doc, headers, composed.built, v2proto::MEDIA_TYPE),
                // Some apiserver does not serve it: 406, as kube-openapi answers a type it lacks.
                None => empty(StatusCode::NOT_ACCEPTABLE),
            },
            None => empty(StatusCode::NOT_ACCEPTABLE),
        },
        "/openapi/v3" => serve_content(&composed.index, headers, composed.built, JSON),
        _ => match path.strip_prefix("/openapi/v3/") {
            Some(key) => v3_document(composed, key, query, headers),
            None => empty(StatusCode::NOT_FOUND),
        },
    };
    if path != "/openapi/v3" {
        resp.headers_mut().insert(VARY, HeaderValue::from_static("Accept"));
    }
    resp
}

fn v3_document(composed: &Composed, key: &str, query: &str, headers: &HeaderMap) -> Response<Full<Bytes>> {
    if !accepts_json(headers) {
        return empty(StatusCode::NOT_ACCEPTABLE);
    }
    // kube-openapi's handler3 writes nothing for a path it has no document of.
    let Some(c) = composed.v3.get(key) else { return empty(StatusCode::OK) };
    let hash = query.split('&').find_map(|p| p.strip_prefix("hash=")).filter(|h| !h.is_empty());
    let Some(hash) = hash else { return serve_content(&c.doc, headers, composed.built, JSON) };
    if hash != c.doc.etag {
        let mut resp = empty(StatusCode::MOVED_PERMANENTLY);
        let h = resp.headers_mut();
        if let Ok(location) = HeaderValue::from_str(&server_relative_url(key, &c.doc.etag)) {
            h.insert(LOCATION, location);
        }
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Ok(tag) = HeaderValue::from_str(&format!("\"{}\"", c.doc.etag)) {
            h.insert(ETAG, tag);
        }
        return resp;
    }
    let mut resp = serve_content(&c.doc, headers, composed.built, JSON);
    let h = resp.headers_mut();
    h.insert(CACHE_CONTROL, HeaderValue::from_static("public, immutable"));
    let expires = SystemTime::now() + Duration::from_secs(365 * 24 * 3600);
    if let Ok(value) = HeaderValue::from_str(&http_date(expires).replace("GMT", "UTC")) {
        h.insert(EXPIRES, value);
    }
    resp
}

/// Go's `http.ServeContent` with an ETag set: 304 for a matching `If-None-Match`.
fn serve_content(
    doc: &Doc,
    headers: &HeaderMap,
    built: SystemTime,
    media_type: &'static str,
) -> Response<Full<Bytes>> {
    let quoted = format!("\"{}\"", doc.etag);
    let not_modified = headers.get(IF_NONE_MATCH).and_then(|v| v.to_str().ok()).is_some_and(|tags| {
        tags.split(',').map(str::trim).any(|t| t == "*" || t.trim_start_matches("W/") == quoted)
    });
    let mut resp = if not_modified {
        empty(StatusCode::NOT_MODIFIED)
    } else {
        let mut resp = Response::new(Full::new(doc.body.clone()));
        resp.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(media_type));
        if let Ok(value) = HeaderValue::from_str(&http_date(built)) {
            resp.headers_mut().insert(LAST_MODIFIED, value);
        }
        resp
    };
    if let Ok(tag) = HeaderValue::from_str(&quoted) {
        resp.headers_mut().insert(ETAG, tag);
    }
    resp
}

const JSON: &str = "application/json";

/// How long a composition waits for a push of the routing table to end.
const PUSH_FIRST: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum V2Form {
    Json,
    Proto,
}

/// The form of `/openapi/v2` the first acceptable `Accept` clause names (kube-openapi offers
/// JSON and protobuf; `*/*` gets JSON).
fn v2_form(headers: &HeaderMap) -> Option<V2Form> {
    let accept = headers.get(ACCEPT).and_then(|v| v.to_str().ok()).filter(|a| !a.trim().is_empty());
    accept.unwrap_or("*/*").split(',').find_map(|clause| {
        let mut parts = clause.split(';');
        let media = parts.next().unwrap_or_default().trim().to_ascii_lowercase();
        let q_zero = parts.any(|p| {
            p.split_once('=').is_some_and(|(n, v)| n.trim() == "q" && v.trim().parse::<f32>() == Ok(0.0))
        });
        match media.as_str() {
            _ if q_zero => None,
            "application/json" | "application/*" | "*/*" => Some(V2Form::Json),
            m if m == v2proto::MEDIA_TYPE => Some(V2Form::Proto),
            _ => None,
        }
    })
}

/// Whether `Accept` lets JSON through (kube-openapi also offers protobuf, which is not composed).
fn accepts_json(headers: &HeaderMap) -> bool {
    let accept = headers.get(ACCEPT).and_then(|v| v.to_str().ok()).filter(|a| !a.trim().is_empty());
    accept.unwrap_or("*/*").split(',').any(|clause| {
        let mut parts = clause.split(';');
        let media = parts.next().unwrap_or_default().trim().to_ascii_lowercase();
        let q_zero = parts.any(|p| {
            p.split_once('=').is_some_and(|(n, v)| n.trim() == "q" && v.trim().parse::<f32>() == Ok(0.0))
        });
        !q_zero && matches!(media.as_str(), "application/json" | "application/*" | "*/*")
    })
}

fn empty(code: StatusCode) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::new()));
    *resp.status_mut() = code;
    resp
}

/// A `Status` body, for what only the edge can fail at.
fn status(code: StatusCode, message: &str) -> Response<Full<Bytes>> {
    let body = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": "ServiceUnavailable", "code": code.as_u16(),
    });
    let mut resp = Response::new(Full::new(Bytes::from(body.to_string())));
    *resp.status_mut() = code;
    resp.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

fn http_date(t: SystemTime) -> String {
    httpdate::fmt_http_date(t)
}

/// Binds the socket, replacing a stale one, readable by this user only.
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Serves `current` on `listener` until `shutdown`.
pub async fn serve(listener: UnixListener, current: Current, shutdown: impl Future<Output = ()>) {
    tokio::pin!(shutdown);
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => accepted,
        };
        let Ok((stream, _)) = accepted else { continue };
        let current = current.clone();
        connections.spawn(async move {
            let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let composed = current.read().unwrap_or_else(PoisonError::into_inner).clone();
                let resp = respond(
                    composed.as_deref(),
                    req.uri().path(),
                    req.uri().query().unwrap_or_default(),
                    req.headers(),
                );
                async move { Ok::<_, Infallible>(resp) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
        while connections.try_join_next().is_some() {}
    }
    connections.abort_all();
}

/// Fetches every apiserver each `period` and recomposes when something changed. An apiserver
/// that fails keeps its last good documents until it answers again, as discovery does.
/// Marks the composer ready (for the sidecar's `/readyz`) when a round ends, by whatever path.
struct FirstRound<'a>(&'a crate::serve::Shared);

impl Drop for FirstRound<'_> {
    fn drop(&mut self) {
        self.0.openapi_ready.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Composes from the apiservers in `members` (id and fetcher, in the configured order), which
/// the sync loop updates as apiservers join and leave.
pub async fn run(
    shared: Arc<crate::serve::Shared>,
    mut members: tokio::sync::watch::Receiver<Vec<(String, Fetcher)>>,
    listener: UnixListener,
    socket: PathBuf,
    period: Duration,
    shutdown: impl Future<Output = ()>,
) {
    let socket_dir = socket.parent().map(Path::to_path_buf);
    let current: Current = Arc::default();
    // Dropped with this future (the sidecar stopped or killed): nothing answers for a dead sidecar.
    let _server =
        Stop { task: tokio::spawn(serve(listener, current.clone(), std::future::pending())), socket };
    tokio::pin!(shutdown);
    let mut composer = Composer::default();
    let mut last: HashMap<String, Fetched> = HashMap::new();
    let mut failing: std::collections::HashSet<String> = std::collections::HashSet::new();
    let mut poll = tokio::time::interval(period);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            _ = poll.tick() => {}
            Ok(()) = members.changed() => {}
        }
        let started = Instant::now();
        let metrics = &shared.metrics.openapi;
        let current_members = members.borrow_and_update().clone();
        // A departed apiserver's documents leave the composition with it.
        let held_before = last.len();
        last.retain(|id, _| current_members.iter().any(|(member, _)| member == id));
        failing.retain(|id| current_members.iter().any(|(member, _)| member == id));
        let mut changed = last.len() != held_before;
        let mut tasks = JoinSet::new();
        for (index, (id, fetcher)) in current_members.iter().enumerate() {
            let (fetcher, previous) = (fetcher.clone(), last.get(id).cloned());
            tasks.spawn(async move { (index, fetch(&fetcher, previous.as_ref()).await) });
        }
        let mut results: Vec<Option<Result<Fetched, crate::fetch::FetchError>>> =
            current_members.iter().map(|_| None).collect();
        while let Some(Ok((index, result))) = tasks.join_next().await {
            if let Some(slot) = results.get_mut(index) {
                *slot = Some(result);
            }
        }
        for ((id, _), result) in current_members.iter().zip(results) {
            match result {
                None => tracing::error!(apiserver = %id, "OpenAPI fetch task lost"),
                Some(Ok(f)) => {
                    if failing.remove(id) {
                        tracing::info!(apiserver = %id, "OpenAPI fetch answers again");
                    }
                    changed |= last.get(id) != Some(&f);
                    last.insert(id.clone(), f);
                }
                Some(Err(error)) => {
                    let labels = crate::metrics::FetchErrorLabels {
                        apiserver: id.clone(),
                        kind: error.kind.label().to_string(),
                    };
                    metrics.fetch_errors.get_or_create(&labels).inc();
                    // Once per outage, not at every poll; the counter has every failure.
                    if failing.insert(id.clone()) {
                        tracing::warn!(apiserver = %id, %error, "OpenAPI fetch failed; its last documents stay")
                    } else {
                        tracing::debug!(apiserver = %id, %error, "OpenAPI fetch still failing")
                    }
                }
            }
        }
        // However this round ends (composed, nothing fetched, over budget), the edge has its
        // answer for OpenAPI now: documents or a clear 503.
        let _first_round = FirstRound(&shared);
        let have_none = current.read().unwrap_or_else(PoisonError::into_inner).is_none();
        if !changed && !have_none {
            continue;
        }
        let servers: Vec<(&str, &Fetched)> =
            current_members.iter().filter_map(|(id, _)| Some((id.as_str(), last.get(id)?))).collect();
        if servers.is_empty() {
            continue;
        }
        // Seconds of CPU for a large cluster's documents: after a push of the routing table
        // under way (bounded: a push that hangs delays OpenAPI no longer than this), and off the
        // runtime's workers, so that the sync loop and a push (whose tasks could sit behind this
        // one on the same worker) go on meanwhile.
        shared.pushing.wait_idle(PUSH_FIRST).await;
        let composed = match tokio::runtime::Handle::current().runtime_flavor() {
            tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(|| composer.compose(&servers))
            }
            _ => composer.compose(&servers),
        };
        let held = servers.iter().map(|(_, f)| f.bytes()).sum::<usize>() + composed.bytes();
        if held > MEMORY_BUDGET_BYTES {
            tracing::error!(
                held,
                budget = MEMORY_BUDGET_BYTES,
                "OpenAPI documents over the memory budget; not served"
            );
            continue;
        }
        tracing::info!(
            documents = composed.v3.len(),
            merged = composed.v3.values().filter(|c| c.verbatim.is_none()).count(),
            held,
            took_ms = started.elapsed().as_millis() as u64,
            "OpenAPI composed"
        );
        if let Some(dir) = socket_dir.as_deref() {
            let summary = composed.summary().to_string();
            if let Err(error) = skewgate_envoy::write_atomic(&dir.join(super::SUMMARY), summary.as_bytes()) {
                tracing::warn!(%error, "cannot write the OpenAPI summary");
            }
        }
        metrics.compositions.inc();
        metrics.held_bytes.set(i64::try_from(held).unwrap_or(i64::MAX));
        metrics.documents.set(composed.v3.len() as i64);
        metrics.merged_documents.set(composed.v3.values().filter(|c| c.verbatim.is_none()).count() as i64);
        *current.write().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(composed));
    }
}

/// Stops the server and removes its socket when dropped.
struct Stop {
    task: tokio::task::JoinHandle<()>,
    socket: PathBuf,
}

impl Drop for Stop {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.socket);
    }
}
