//! A [`Store`](super::store::Store) in another process, reached over HTTP/JSON: what stand-ins in
//! separate containers share, as kube-apiservers on separate machines share etcd. The server
//! side is [`super::store_service`]; this is the client and the wire format both use.
//!
//! Reads are one request each. A write is etcd's optimistic transaction, as kube-apiserver's
//! `GuaranteedUpdate` does it: read the object, decide locally, then commit only if the object
//! still has the resourceVersion that was read; if it changed meanwhile, read and decide again.
//! Watches learn about new revisions from one long poll per stand-in process.
//!
//! The stand-in's request handlers are synchronous (the in-process store is a mutex), so each
//! call blocks its worker thread with `block_in_place`: this needs tokio's multi-threaded
//! runtime, which [`RemoteStore::connect`] checks. Async tasks (watches, the CRD follower) await
//! the same calls instead of blocking.
//!
//! Every call runs on the client's own runtime (one thread), never on the caller's. A worker
//! blocked on a future that the caller's runtime drives can wait forever: while that runtime
//! shuts down, its blocking pool refuses the thread `block_in_place` hands the worker's core
//! to, so the blocked thread keeps the core, and the runtime turns its I/O and timer drivers
//! (the call's socket and its timeout) only once every core is back: nothing ever wakes the
//! call, and dropping the runtime waits for that thread forever. On a runtime of its own a
//! call always ends, answered or timed out.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::runtime::{Handle, Runtime, RuntimeFlavor};
use tokio::sync::watch;

use super::status::{Errors, Status, Target};
use super::store::{Event, EventType, Key, ListQuery, Write};

/// One store call, connect to last byte.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the store holds a long poll open when nothing is written.
pub(super) const WAIT: Duration = Duration::from_secs(20);
/// Pause after a failed long poll (the store restarting, say) before the next one.
const RETRY: Duration = Duration::from_millis(500);
/// A write that keeps losing races gives up after this many tries.
const MAX_ATTEMPTS: usize = 64;

// ---------------------------------------------------------------------------------------------
// Wire format (JSON). Paths: POST /v1/revision, /v1/get, /v1/list, /v1/events, /v1/write;
// GET /v1/wait?after=R&timeoutMs=T; GET /healthz.

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct RevisionReply {
    pub revision: u64,
    pub compacted: u64,
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct GetRequest {
    pub key: Key,
    /// When given, the reply says whether this namespace exists (a write's precondition).
    pub namespace: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct GetReply {
    pub namespace_missing: bool,
    pub object: Option<Value>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "camelCase")]
pub(super) enum ListReply {
    Objects {
        objects: Vec<Value>,
        revision: u64,
    },
    /// The store refused (today only 410 for a compacted revision), worded by the store.
    Error {
        code: u16,
        message: String,
    },
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct EventsRequest {
    pub after: u64,
    pub max: usize,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "camelCase")]
pub(super) enum EventsReply {
    Events { events: Vec<WireEvent> },
    Compacted { compacted: u64 },
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct WireEvent {
    pub revision: u64,
    #[serde(rename = "type")]
    pub kind: EventType,
    pub key: Key,
    pub object: Value,
    pub previous: Option<Value>,
}

impl WireEvent {
    pub fn from_event(e: &Event) -> WireEvent {
        WireEvent {
            revision: e.revision,
            kind: e.kind,
            key: e.key.clone(),
            object: (*e.object).clone(),
            previous: e.previous.as_deref().cloned(),
        }
    }

    fn into_event(self) -> Event {
        Event {
            revision: self.revision,
            kind: self.kind,
            key: self.key,
            object: Arc::new(self.object),
            previous: self.previous.map(Arc::new),
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct WriteRequest {
    pub key: Key,
    pub namespace: Option<String>,
    /// The object's resourceVersion when it was read (None: it did not exist); the write
    /// commits only if that is still so.
    pub expect: Option<String>,
    pub op: Op,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) enum Op {
    Put(Value),
    Delete,
    DeleteNamespace,
}

impl Op {
    pub fn into_write(self) -> Write {
        match self {
            Op::Put(object) => Write::Put(object),
            Op::Delete => Write::Delete,
            Op::DeleteNamespace => Write::DeleteNamespace,
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "camelCase")]
pub(super) enum WriteReply {
    Written {
        object: Option<Value>,
    },
    /// The object is not at the expected resourceVersion any more: read and decide again.
    Changed,
    NamespaceMissing,
}

/// What a write's expectation compares: the resourceVersion, or None for no object.
pub(super) fn version_of(object: Option<&Value>) -> Option<String> {
    object.map(|o| o["metadata"]["resourceVersion"].as_str().unwrap_or_default().to_string())
}

fn namespace_not_found(namespace: &str) -> Status {
    Status::not_found(Target { group: "", resource: "namespaces" }, namespace)
}

// ---------------------------------------------------------------------------------------------
// Client

/// A connection to `skewgate-harness store`. Cheap to clone.
#[derive(Clone)]
pub struct RemoteStore {
    inner: Arc<Inner>,
}

struct Inner {
    base: String,
    /// Used only on `io`: its pooled connections are tasks of that runtime.
    http: reqwest::Client,
    io: Io,
    /// Fed by the long poll; every watcher subscribes to a clone.
    revisions: watch::Receiver<u64>,
}

/// The runtime every store call runs on (see the module docs).
struct Io {
    handle: Handle,
    runtime: Option<Runtime>,
}

impl Io {
    fn new() -> Result<Io> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("remote-store")
            .enable_all()
            .build()
            .context("starting the object store client's runtime")?;
        Ok(Io { handle: runtime.handle().clone(), runtime: Some(runtime) })
    }
}

impl Drop for Io {
    fn drop(&mut self) {
        // The last clone of a store may go in an async task, where dropping a runtime (which
        // waits for its threads) panics. Nobody is left to wait for a call still in flight.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl RemoteStore {
    /// Connects to the store at `url` (e.g. `http://store:2379`), waiting up to `patience`
    /// for it to answer: containers start in any order.
    pub async fn connect(url: &str, patience: Duration) -> Result<RemoteStore> {
        let runtime = Handle::current();
        if runtime.runtime_flavor() == RuntimeFlavor::CurrentThread {
            bail!("a remote store needs tokio's multi-threaded runtime: its calls block the calling worker");
        }
        let base = url.trim_end_matches('/').to_string();
        let http = reqwest::Client::builder().timeout(CALL_TIMEOUT).build()?;
        let io = Io::new()?;
        let probe = {
            let (http, base) = (http.clone(), base.clone());
            async move {
                let deadline = tokio::time::Instant::now() + patience;
                loop {
                    let attempt = async {
                        let resp = http
                            .post(format!("{base}/v1/revision"))
                            .json(&serde_json::json!({}))
                            .send()
                            .await?;
                        resp.error_for_status()?.json::<RevisionReply>().await
                    };
                    match attempt.await {
                        Ok(reply) => return Ok(reply),
                        Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
                        Err(_) => tokio::time::sleep(RETRY).await,
                    }
                }
            }
        };
        let first =
            io.handle.spawn(probe).await?.with_context(|| format!("object store {base} does not answer"))?;
        let (tx, revisions) = watch::channel(first.revision);
        // The long poll is async all the way, so it may run on the caller's runtime.
        let poller = reqwest::Client::builder().timeout(WAIT + CALL_TIMEOUT).build()?;
        tokio::spawn(follow(poller, base.clone(), tx));
        Ok(RemoteStore { inner: Arc::new(Inner { base, http, io, revisions }) })
    }

    pub fn url(&self) -> &str {
        &self.inner.base
    }

    /// One request, to run on `io` only. It holds no clone of the store, so the last one is
    /// never dropped on `io`'s own thread.
    fn request<T: DeserializeOwned + Send + 'static>(
        &self,
        path: &str,
        body: &impl Serialize,
    ) -> impl Future<Output = Result<T, Status>> + Send + 'static {
        let request = self.inner.http.post(format!("{}{path}", self.inner.base)).json(body);
        let base = self.inner.base.clone();
        async move {
            let answer = async { request.send().await?.error_for_status()?.json::<T>().await };
            answer
                .await
                .map_err(|e| Status::internal(format!("the object store at {base} did not answer: {e}")))
        }
    }

    /// One request, blocking this worker until the answer (see the module docs).
    fn call<T: DeserializeOwned + Send + 'static>(
        &self,
        path: &str,
        body: &impl Serialize,
    ) -> Result<T, Status> {
        let answer = self.request(path, body);
        tokio::task::block_in_place(|| self.inner.io.handle.block_on(answer))
    }

    /// One request from an async task, awaited instead of blocking a worker.
    async fn call_async<T: DeserializeOwned + Send + 'static>(
        &self,
        path: &str,
        body: &impl Serialize,
    ) -> Result<T, Status> {
        match self.inner.io.handle.spawn(self.request(path, body)).await {
            Ok(answer) => answer,
            Err(e) => {
                Err(Status::internal(format!("the object store at {} did not answer: {e}", self.inner.base)))
            }
        }
    }

    fn revisions(&self) -> Result<RevisionReply, Status> {
        self.call("/v1/revision", &serde_json::json!({}))
    }

    pub fn revision(&self) -> Result<u64, Status> {
        Ok(self.revisions()?.revision)
    }

    /// [`Self::revision`] for async tasks.
    pub async fn revision_async(&self) -> Result<u64, Status> {
        let reply: RevisionReply = self.call_async("/v1/revision", &serde_json::json!({})).await?;
        Ok(reply.revision)
    }

    pub fn compacted(&self) -> Result<u64, Status> {
        Ok(self.revisions()?.compacted)
    }

    pub fn get(&self, key: &Key) -> Result<Option<Arc<Value>>, Status> {
        let reply: GetReply = self.call("/v1/get", &GetRequest { key: key.clone(), namespace: None })?;
        Ok(reply.object.map(Arc::new))
    }

    pub fn list(&self, query: &ListQuery) -> Result<(Vec<Arc<Value>>, u64), Status> {
        listed(self.call("/v1/list", query)?)
    }

    /// [`Self::list`] for async tasks.
    pub async fn list_async(&self, query: &ListQuery) -> Result<(Vec<Arc<Value>>, u64), Status> {
        listed(self.call_async("/v1/list", query).await?)
    }

    pub fn events_after(&self, revision: u64, max: usize) -> Result<Vec<Event>, Status> {
        events_read(revision, self.call("/v1/events", &EventsRequest { after: revision, max })?)
    }

    /// [`Self::events_after`] for async tasks.
    pub async fn events_after_async(&self, revision: u64, max: usize) -> Result<Vec<Event>, Status> {
        events_read(revision, self.call_async("/v1/events", &EventsRequest { after: revision, max }).await?)
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.inner.revisions.clone()
    }

    /// See the module docs: read, decide, commit if unchanged, else again.
    pub fn write(
        &self,
        key: &Key,
        namespace: Option<&str>,
        dry_run: bool,
        mut decide: impl FnMut(Option<&Arc<Value>>) -> Result<Write, Status>,
    ) -> Result<Option<Arc<Value>>, Status> {
        let namespace = namespace.map(str::to_string);
        for _ in 0..MAX_ATTEMPTS {
            let read: GetReply =
                self.call("/v1/get", &GetRequest { key: key.clone(), namespace: namespace.clone() })?;
            if read.namespace_missing {
                return Err(namespace_not_found(namespace.as_deref().unwrap_or_default()));
            }
            let current = read.object.map(Arc::new);
            let decision = decide(current.as_ref())?;
            if dry_run {
                return Ok(decision.preview(current));
            }
            let op = match decision {
                Write::Unchanged => return Ok(current),
                Write::Put(object) => Op::Put(object),
                Write::Delete => Op::Delete,
                Write::DeleteNamespace => Op::DeleteNamespace,
            };
            let request = WriteRequest {
                key: key.clone(),
                namespace: namespace.clone(),
                expect: version_of(current.as_deref()),
                op,
            };
            match self.call("/v1/write", &request)? {
                WriteReply::Written { object } => return Ok(object.map(Arc::new)),
                WriteReply::NamespaceMissing => {
                    return Err(namespace_not_found(namespace.as_deref().unwrap_or_default()));
                }
                WriteReply::Changed => continue,
            }
        }
        Err(Status::internal(format!(
            "gave up writing {}/{} {}/{} after {MAX_ATTEMPTS} conflicting attempts",
            key.group, key.resource, key.namespace, key.name
        )))
    }
}

fn listed(reply: ListReply) -> Result<(Vec<Arc<Value>>, u64), Status> {
    match reply {
        ListReply::Objects { objects, revision } => {
            Ok((objects.into_iter().map(Arc::new).collect(), revision))
        }
        ListReply::Error { code: 410, message } => Err(Status::failure(410, "Expired", message)),
        ListReply::Error { message, .. } => Err(Status::internal(message)),
    }
}

fn events_read(revision: u64, reply: EventsReply) -> Result<Vec<Event>, Status> {
    match reply {
        EventsReply::Events { events } => Ok(events.into_iter().map(WireEvent::into_event).collect()),
        EventsReply::Compacted { compacted } => Err(Status::expired(revision, compacted)),
    }
}

/// The long poll: publishes every new revision the store reports, until nobody listens.
async fn follow(http: reqwest::Client, base: String, tx: watch::Sender<u64>) {
    let mut known = *tx.borrow();
    loop {
        let url = format!("{base}/v1/wait?after={known}&timeoutMs={}", WAIT.as_millis());
        let poll = async {
            let resp = http.get(&url).send().await?;
            resp.error_for_status()?.json::<RevisionReply>().await
        };
        let reply = tokio::select! {
            () = tx.closed() => return,
            reply = poll => reply,
        };
        match reply {
            Ok(reply) if reply.revision != known => {
                known = reply.revision;
                tx.send_replace(known);
            }
            Ok(_) => {}
            Err(_) => tokio::select! {
                () = tx.closed() => return,
                () = tokio::time::sleep(RETRY) => {}
            },
        }
    }
}
