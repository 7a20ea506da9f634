//! A loopback apiserver double for Envoy tests: TLS with the peer CA's serving certificate,
//! client certificates required from the requestheader CA (only Envoy gets in), and an echo of
//! what arrived; a request to switch protocols (exec, attach, port-forward) gets its bytes echoed.
//! Paths under `/apis/test.skewgate.io/` misbehave on purpose.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Result;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::RootCertStore;
use rustls::server::WebPkiClientVerifier;
use serde_json::{Map, Value, json};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use skewgate_pki::{Pair, load_certs, load_key};

pub use skewgate_standin::SERVED_BY;

/// A running double; stops when dropped.
pub struct Echo {
    pub id: String,
    pub addr: SocketAddr,
    pub requests: Arc<AtomicU64>,
    ready: Arc<AtomicBool>,
    stopping: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Echo {
    /// Makes `/readyz` fail (500) or pass.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }

    /// Makes `/readyz` fail as kube-apiserver's does after SIGTERM, its `shutdown` check alone:
    /// `/readyz?exclude=shutdown` passes.
    pub fn set_stopping(&self, stopping: bool) {
        self.stopping.store(stopping, Ordering::SeqCst);
    }
}

pub fn tls_config(serving: &Pair, client_ca: &std::path::Path) -> Result<Arc<rustls::ServerConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    for cert in load_certs(client_ca)? {
        roots.add(cert)?;
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone()).build()?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(load_certs(&serving.cert)?, load_key(&serving.key)?)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

pub async fn start(id: &str, tls: Arc<rustls::ServerConfig>) -> Result<Echo> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let acceptor = TlsAcceptor::from(tls);
    let requests = Arc::new(AtomicU64::new(0));
    let ready = Arc::new(AtomicBool::new(true));
    let stopping = Arc::new(AtomicBool::new(false));
    let state = Arc::new(State {
        id: id.to_string(),
        requests: requests.clone(),
        ready: ready.clone(),
        stopping: stopping.clone(),
    });
    let task = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else { continue };
            let acceptor = acceptor.clone();
            let state = state.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else { return };
                let service = service_fn(move |req| {
                    let state = state.clone();
                    async move { state.handle(req).await }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection_with_upgrades(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    Ok(Echo { id: id.to_string(), addr, requests, ready, stopping, task })
}

/// `/apis/test.skewgate.io/v1/[namespaces/<ns>/]<resource>...`
fn is_test(path: &str, resource: &str) -> bool {
    path.strip_prefix("/apis/test.skewgate.io/v1/").is_some_and(|rest| {
        let rest = rest.strip_prefix("namespaces/").and_then(|r| r.split_once('/')).map_or(rest, |(_, r)| r);
        rest.split('/').next() == Some(resource)
    })
}

struct State {
    id: String,
    requests: Arc<AtomicU64>,
    ready: Arc<AtomicBool>,
    stopping: Arc<AtomicBool>,
}

#[derive(Debug)]
struct Reset;

impl std::fmt::Display for Reset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("reset on purpose")
    }
}

impl std::error::Error for Reset {}

impl State {
    async fn handle(&self, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Reset> {
        let path = req.uri().path().to_string();
        if path == "/readyz" {
            let shutdown_excluded =
                req.uri().query().is_some_and(|q| q.split('&').any(|p| p == "exclude=shutdown"));
            let stopping = self.stopping.load(Ordering::SeqCst) && !shutdown_excluded;
            let ok = self.ready.load(Ordering::SeqCst) && !stopping;
            let status = if ok { StatusCode::OK } else { StatusCode::INTERNAL_SERVER_ERROR };
            return Ok(self.respond(status, Value::String(if ok { "ok" } else { "not ready" }.into())));
        }
        self.requests.fetch_add(1, Ordering::SeqCst);
        // exec, attach and port-forward: kube-apiserver switches protocols (SPDY/3.1, or a
        // WebSocket's channel protocols) on the connection the request came on, HTTP/1.1 only.
        if let Some(protocol) = req.headers().get(hyper::header::UPGRADE).cloned() {
            return Ok(self.switch_protocols(req, protocol));
        }
        // `flaky` fails only on d, so a retry elsewhere can succeed; `vanishes`, which no table
        // lists, fails everywhere.
        let resets = is_test(&path, "resets") || is_test(&path, "vanishes");
        if resets || (self.id == "d" && is_test(&path, "flaky")) {
            // hyper drops the connection without an answer when the service fails.
            return Err(Reset);
        }
        if is_test(&path, "fails") {
            let body = Bytes::from_static(b"apiserver says no\n");
            return Ok(self.answer(StatusCode::SERVICE_UNAVAILABLE, Some("text/plain"), body));
        }
        if is_test(&path, "hangs") {
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        // Longer than Envoy's request-header timeout (10 s), shorter than a route's idle timeout.
        if is_test(&path, "slow") {
            tokio::time::sleep(Duration::from_secs(12)).await;
        }
        let mut headers = Map::new();
        for (name, value) in req.headers() {
            let entry = headers.entry(name.as_str()).or_insert_with(|| Value::Array(Vec::new()));
            if let Value::Array(values) = entry {
                values.push(Value::String(String::from_utf8_lossy(value.as_bytes()).into_owned()));
            }
        }
        let method = req.method().to_string();
        let target = req.uri().path_and_query().map(|p| p.to_string()).unwrap_or_default();
        let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        let echo = json!({
            "servedBy": self.id,
            "method": method,
            "target": target,
            "headers": headers,
            "bodyBytes": body.len(),
        });
        Ok(self.respond(StatusCode::OK, echo))
    }

    /// 101, then every byte the client sends on the upgraded connection comes back to it,
    /// after a first line `<id> <method> <target> <HTTP version>`.
    fn switch_protocols(
        &self,
        req: Request<Incoming>,
        protocol: hyper::header::HeaderValue,
    ) -> Response<Full<Bytes>> {
        let greeting = format!("{} {} {} {:?}\n", self.id, req.method(), req.uri(), req.version());
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            let Ok(upgraded) = hyper::upgrade::on(req).await else { return };
            let mut io = TokioIo::new(upgraded);
            if io.write_all(greeting.as_bytes()).await.is_ok() {
                let (mut from, mut to) = tokio::io::split(io);
                let _ = tokio::io::copy(&mut from, &mut to).await;
            }
        });
        let mut resp = self.answer(StatusCode::SWITCHING_PROTOCOLS, None, Bytes::new());
        let headers = resp.headers_mut();
        headers.insert(hyper::header::CONNECTION, hyper::header::HeaderValue::from_static("Upgrade"));
        headers.insert(hyper::header::UPGRADE, protocol);
        resp
    }

    fn respond(&self, status: StatusCode, body: Value) -> Response<Full<Bytes>> {
        self.answer(status, Some("application/json"), Bytes::from(body.to_string()))
    }

    /// `body` with `status`, its content type, and who served it.
    fn answer(
        &self,
        status: StatusCode,
        content_type: Option<&'static str>,
        body: Bytes,
    ) -> Response<Full<Bytes>> {
        let mut resp = Response::new(Full::new(body));
        *resp.status_mut() = status;
        let headers = resp.headers_mut();
        if let Some(content_type) = content_type {
            headers.insert("content-type", hyper::header::HeaderValue::from_static(content_type));
        }
        if let Ok(v) = hyper::header::HeaderValue::from_str(&self.id) {
            headers.insert(SERVED_BY, v);
        }
        resp
    }
}
