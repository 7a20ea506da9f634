//! The sidecar's own HTTP: `/healthz` (the process runs), `/readyz` (Envoy has had a complete
//! table since the first full sync), `/metrics`, and `/status`: the latest sync's report as
//! JSON (what `skewgate sync --once` prints), each apiserver's standing, exclusion and error.

use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::metrics::Metrics;

/// What the endpoints report; shared with the sync loop.
#[derive(Default)]
pub struct Shared {
    /// Envoy has had a complete table.
    pub ready: AtomicBool,
    /// The OpenAPI composer has had its first round: until then every OpenAPI request through
    /// the edge would get a 503.
    pub openapi_ready: AtomicBool,
    pub metrics: Metrics,
    /// A routing table is being pushed.
    pub pushing: Pushing,
    /// The latest sync's report, as `/status` answers it.
    status: Mutex<Option<Bytes>>,
}

/// Whether a routing table is being pushed to Envoy. What is not urgent and costs seconds of
/// CPU (composing OpenAPI documents) waits for the push to end: an apiserver that restarted
/// changes both at once, and the table it holds up is what keeps requests off servers that
/// cannot serve them.
pub struct Pushing(tokio::sync::watch::Sender<bool>);

impl Default for Pushing {
    fn default() -> Self {
        Self(tokio::sync::watch::Sender::new(false))
    }
}

impl Pushing {
    pub fn set(&self, pushing: bool) {
        self.0.send_replace(pushing);
    }

    /// Until no push is under way, or for `at_most`.
    pub async fn wait_idle(&self, at_most: std::time::Duration) {
        let mut pushing = self.0.subscribe();
        let _ = tokio::time::timeout(at_most, pushing.wait_for(|p| !p)).await;
    }
}

impl Shared {
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst) && self.openapi_ready.load(Ordering::SeqCst)
    }

    pub fn set_status(&self, report: &serde_json::Value) {
        let body = Bytes::from(format!("{report}\n"));
        *self.status.lock().unwrap_or_else(PoisonError::into_inner) = Some(body);
    }

    fn status(&self) -> Option<Bytes> {
        self.status.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Serves until `shutdown` completes; connections in progress are dropped with the task.
pub async fn serve(listener: TcpListener, shared: Arc<Shared>, shutdown: impl Future<Output = ()>) {
    tokio::pin!(shutdown);
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, _) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                continue;
            }
        };
        let shared = shared.clone();
        connections.spawn(async move {
            let service = service_fn(move |req| {
                let shared = shared.clone();
                async move { Ok::<_, Infallible>(respond(&shared, &req)) }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(error = %e, "connection ended");
            }
        });
        while connections.try_join_next().is_some() {}
    }
    connections.abort_all();
}

fn respond(shared: &Shared, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n");
    }
    match req.uri().path() {
        "/healthz" | "/livez" => text(StatusCode::OK, "ok\n"),
        "/readyz" if shared.is_ready() => text(StatusCode::OK, "ok\n"),
        "/readyz" if !shared.ready.load(Ordering::SeqCst) => {
            text(StatusCode::SERVICE_UNAVAILABLE, "no complete sync yet\n")
        }
        "/readyz" => text(StatusCode::SERVICE_UNAVAILABLE, "no OpenAPI composed yet\n"),
        "/metrics" => match shared.metrics.encode() {
            Ok(body) => {
                let mut resp = Response::new(Full::new(Bytes::from(body)));
                resp.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(OPENMETRICS));
                resp
            }
            Err(_) => text(StatusCode::INTERNAL_SERVER_ERROR, "cannot encode metrics\n"),
        },
        "/status" => match shared.status() {
            Some(body) => {
                let mut resp = Response::new(Full::new(body));
                resp.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                resp
            }
            None => text(StatusCode::SERVICE_UNAVAILABLE, "no sync has ended yet\n"),
        },
        _ => text(StatusCode::NOT_FOUND, "not found: /healthz, /readyz, /metrics, /status\n"),
    }
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *resp.status_mut() = status;
    resp.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn endpoints() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared::default());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, shared.clone(), async {
            let _ = stopped.await;
        }));
        let client = reqwest::Client::new();
        let get = |path: &str| {
            let client = client.clone();
            let url = format!("http://{addr}{path}");
            async move {
                let r = client.get(url).send().await.unwrap();
                let ct = r.headers().get(CONTENT_TYPE).map(|v| v.to_str().unwrap().to_owned());
                (r.status().as_u16(), ct, r.text().await.unwrap())
            }
        };
        assert_eq!(get("/healthz").await.0, 200);
        assert_eq!(get("/readyz").await.0, 503);
        shared.ready.store(true, Ordering::SeqCst);
        let (status, _, body) = get("/readyz").await;
        assert_eq!((status, body.as_str()), (503, "no OpenAPI composed yet\n"));
        shared.openapi_ready.store(true, Ordering::SeqCst);
        assert_eq!(get("/readyz").await.0, 200);
        let (status, ct, body) = get("/metrics").await;
        assert_eq!((status, ct.as_deref()), (200, Some(OPENMETRICS)));
        assert!(body.contains("skewgate_table_pushes_total 0"), "{body}");
        assert!(body.trim_end().ends_with("# EOF"), "{body}");
        assert_eq!(get("/status").await.0, 503, "before the first sync");
        shared.set_status(&serde_json::json!({"generation": "g1"}));
        let (status, ct, body) = get("/status").await;
        assert_eq!(
            (status, ct.as_deref(), body.as_str()),
            (200, Some("application/json"), "{\"generation\":\"g1\"}\n")
        );
        assert_eq!(get("/nope").await.0, 404);
        stop.send(()).unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(5), task).await.unwrap().unwrap();
    }
}
