//! `skewgate-harness store`: one [`Store`] served over plain HTTP/JSON to stand-ins in other
//! processes or containers (the etcd of the docker-compose cluster). The wire format and the
//! client are in [`super::remote_store`]. Test infrastructure: no TLS, no authentication, so it
//! listens where only the stand-ins reach it (a container network, loopback).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::net::TcpListener;

use super::remote_store::{
    EventsReply, EventsRequest, GetReply, GetRequest, ListReply, RevisionReply, WAIT, WireEvent, WriteReply,
    WriteRequest, version_of,
};
use super::store::{Key, ListQuery, Store};

/// Largest request body: a write carries one object (kube-apiserver's limit is 3 MiB).
const MAX_REQUEST: usize = 16 * 1024 * 1024;

/// A running store service; stops when dropped.
pub struct StoreService {
    pub addr: SocketAddr,
    pub store: Arc<Store>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for StoreService {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl StoreService {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

/// Serves `store` on `listen` (port 0 picks a free one).
pub async fn serve_store(store: Arc<Store>, listen: SocketAddr) -> Result<StoreService> {
    let listener = TcpListener::bind(listen).await.map_err(|e| match e.kind() {
        std::io::ErrorKind::AddrInUse => anyhow::anyhow!("{listen} is already in use"),
        _ => anyhow::Error::new(e).context(format!("listening on {listen}")),
    })?;
    let addr = listener.local_addr()?;
    let shared = store.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                // Out of file descriptors and the like: back off instead of spinning.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let store = shared.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req| {
                    let store = store.clone();
                    async move { Ok::<_, std::convert::Infallible>(handle(&store, req).await) }
                });
                let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                let _ = builder.serve_connection(TokioIo::new(tcp), service).await;
            });
        }
    });
    Ok(StoreService { addr, store, task })
}

type Reply = Response<Full<Bytes>>;

fn reply(code: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Reply {
    let mut resp = Response::new(Full::new(body.into()));
    *resp.status_mut() = code;
    resp.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

fn json(value: &impl Serialize) -> Reply {
    match serde_json::to_vec(value) {
        Ok(body) => reply(StatusCode::OK, "application/json", body),
        Err(e) => reply(StatusCode::INTERNAL_SERVER_ERROR, "text/plain", e.to_string()),
    }
}

async fn body<T: DeserializeOwned>(req: Request<Incoming>) -> Result<T, Reply> {
    let bytes = match Limited::new(req.into_body(), MAX_REQUEST).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) => return Err(reply(StatusCode::BAD_REQUEST, "text/plain", e.to_string())),
    };
    serde_json::from_slice(&bytes).map_err(|e| reply(StatusCode::BAD_REQUEST, "text/plain", e.to_string()))
}

async fn handle(store: &Store, req: Request<Incoming>) -> Reply {
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or_default().to_string();
    let answer = match (req.method(), path.as_str()) {
        (&Method::GET, "/healthz") => return reply(StatusCode::OK, "text/plain", "ok"),
        (&Method::GET, "/v1/wait") => return wait(store, &query).await,
        (&Method::POST, "/v1/revision") => {
            Ok(json(&RevisionReply { revision: store.revision(), compacted: store.compacted() }))
        }
        (&Method::POST, "/v1/get") => body::<GetRequest>(req).await.map(|r| json(&get(store, r))),
        (&Method::POST, "/v1/list") => body::<ListQuery>(req).await.map(|r| json(&list(store, r))),
        (&Method::POST, "/v1/events") => body::<EventsRequest>(req).await.map(|r| json(&events(store, r))),
        (&Method::POST, "/v1/write") => body::<WriteRequest>(req).await.map(|r| json(&write(store, r))),
        _ => Err(reply(StatusCode::NOT_FOUND, "text/plain", "no such store call")),
    };
    answer.unwrap_or_else(|error| error)
}

fn get(store: &Store, r: GetRequest) -> GetReply {
    let namespace_missing = r.namespace.as_deref().is_some_and(|ns| store.get(&Key::namespace(ns)).is_none());
    GetReply { namespace_missing, object: store.get(&r.key).map(|o| (*o).clone()) }
}

fn list(store: &Store, query: ListQuery) -> ListReply {
    match store.list(&query) {
        Ok((objects, revision)) => {
            ListReply::Objects { objects: objects.iter().map(|o| (**o).clone()).collect(), revision }
        }
        Err(status) => ListReply::Error { code: status.code, message: status.message },
    }
}

fn events(store: &Store, r: EventsRequest) -> EventsReply {
    match store.events_after(r.after, r.max) {
        Ok(events) => EventsReply::Events { events: events.iter().map(WireEvent::from_event).collect() },
        Err(compacted) => EventsReply::Compacted { compacted },
    }
}

/// Commits only if the object is still at the version the client read: the check and the
/// write happen under the store's lock, as an etcd transaction compares and puts.
fn write(store: &Store, r: WriteRequest) -> WriteReply {
    let mut changed = false;
    let op = r.op;
    let result = store.write(&r.key, r.namespace.as_deref(), false, |current| {
        if version_of(current.map(|c| &**c)) != r.expect {
            changed = true;
            return Err(<super::status::Status as super::status::Errors>::internal("changed since read"));
        }
        Ok(op.into_write())
    });
    match result {
        Ok(object) => WriteReply::Written { object: object.map(|o| (*o).clone()) },
        Err(_) if changed => WriteReply::Changed,
        // The closure fails only when changed, so this is the namespace precondition.
        Err(_) => WriteReply::NamespaceMissing,
    }
}

/// Answers as soon as the revision differs from `after`, or after `timeoutMs` (at most
/// [`WAIT`]) with the same one.
async fn wait(store: &Store, query: &str) -> Reply {
    let param = |name: &str| {
        query.split('&').filter_map(|kv| kv.split_once('=')).find(|(k, _)| *k == name).map(|(_, v)| v)
    };
    let Some(after) = param("after").and_then(|v| v.parse::<u64>().ok()) else {
        return reply(StatusCode::BAD_REQUEST, "text/plain", "after=REVISION is required");
    };
    let timeout =
        param("timeoutMs").and_then(|v| v.parse::<u64>().ok()).map_or(WAIT, Duration::from_millis).min(WAIT);
    let mut revisions = store.subscribe();
    let changed = revisions.wait_for(|revision| *revision != after);
    // Elapsed or the store gone: either way report what the store has now.
    let _ = tokio::time::timeout(timeout, changed).await;
    json(&RevisionReply { revision: store.revision(), compacted: store.compacted() })
}
