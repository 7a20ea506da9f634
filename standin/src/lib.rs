//! Stand-in kube-apiservers: one process hosts several, each on its own loopback port with its
//! own id and version profile, all sharing one [`Store`] (as real apiservers share etcd); or,
//! one per process or container, sharing a [`RemoteStore`] served by `skewgate-harness store`.
//! Faithful enough that a real kubectl cannot tell for what skewgate routes: TLS with
//! front-proxy / x509 / token authentication, aggregated and legacy discovery, OpenAPI v3,
//! CRUD, list and watch with apiserver semantics, and upstream's Status errors.
//!
//! Every response carries `x-skewgate-served-by: <id>` so tests can see where a request went.

mod auth;
mod call;
pub mod captured;
mod catalog;
mod clock;
mod crds;
mod discovery;
mod front;
mod instance;
mod objects;
mod openapi;
mod openapi_proto;
mod params;
mod patch;
mod profile;
mod proto;
mod publish;
mod remote_store;
mod reply;
mod resources;
mod reviews;
mod selector;
pub mod startup;
mod status;
mod store;
mod store_handle;
mod store_service;
mod table;
mod tls;
mod watch;

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

pub use auth::{Auth, Identity, Method as AuthMethod, Token};
pub use instance::{MAX_BODY, SERVED_BY, Served};
pub use profile::Profile;
pub use remote_store::RemoteStore;
pub use startup::Startup;
pub use store::{Key, Store};
pub use store_handle::StoreHandle;
pub use store_service::{StoreService, serve_store};

use catalog::Catalog;
use instance::Instance;
use skewgate_pki::{FRONT_PROXY_CN, Pair, Pki};
use tls::Tls;

/// A client that neither starts nor finishes a TLS handshake in this time is dropped
/// (Go's `http.Server` does the same with its handshake timeout).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Pending connections the listener queues (Go's default on Linux: the kernel's somaxconn).
const LISTEN_BACKLOG: u32 = 4096;
/// Server shutdown waits this long for responses in flight.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// One stand-in apiserver to start.
#[derive(Debug, Clone)]
pub struct Options {
    pub id: String,
    pub profile: Profile,
    /// Port 0 picks a free one.
    pub listen: SocketAddr,
    pub serving: Pair,
    pub auth: Auth,
    /// How often watches that asked for bookmarks get one (upstream: about a minute; tests want
    /// less).
    pub bookmark_interval: Duration,
}

impl Options {
    /// The default bookmark interval.
    pub const BOOKMARK_INTERVAL: Duration = Duration::from_secs(15);

    /// A stand-in of `pki`'s cluster on a free loopback port: it serves the apiserver
    /// certificate, trusts the front proxy and the cluster CA's client certificates, knows
    /// `tokens`, lets anonymous requests in and sends bookmarks at the default interval.
    pub fn of_cluster(pki: &Pki, id: &str, profile: Profile, tokens: Vec<Token>) -> Options {
        Options {
            id: id.into(),
            profile,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            serving: pki.apiserver.clone(),
            auth: Auth {
                requestheader_ca: pki.requestheader_ca.cert_path.clone(),
                requestheader_allowed_names: vec![FRONT_PROXY_CN.into()],
                client_ca: pki.cluster_ca.cert_path.clone(),
                tokens,
                anonymous: true,
            },
            bookmark_interval: Options::BOOKMARK_INTERVAL,
        }
    }
}

/// A running stand-in. Stops (ending its watches) on `shutdown().await` or when dropped.
pub struct Standin {
    pub id: String,
    pub addr: SocketAddr,
    /// Connections whose first byte was not a TLS handshake record.
    pub plaintext_attempts: Arc<AtomicU64>,
    /// TLS handshakes that failed (untrusted client certificate, client distrusting us, ...).
    pub tls_handshake_failures: Arc<AtomicU64>,
    /// Requests served (any path, any outcome).
    pub requests: Arc<AtomicU64>,
    instance: Arc<Instance>,
    stop: tokio::sync::watch::Sender<bool>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Standin {
    /// The identities of the last authenticated requests, oldest first.
    pub fn identities(&self) -> Vec<Identity> {
        self.instance.identities.lock().unwrap_or_else(PoisonError::into_inner).iter().cloned().collect()
    }

    pub fn last_identity(&self) -> Option<Identity> {
        self.instance.identities.lock().unwrap_or_else(PoisonError::into_inner).back().cloned()
    }

    /// Makes `/readyz` fail (500) or pass, as an apiserver shutting down or starting would.
    pub fn set_ready(&self, ready: bool) {
        self.instance.starting.store(false, Ordering::SeqCst);
        self.instance.ready.store(ready, Ordering::SeqCst);
    }

    /// Makes `/readyz` pass `delay` from now (unless stopped first): the end of a starting
    /// kube-apiserver's post-start hooks.
    pub fn ready_after(&self, delay: Duration) {
        let instance = self.instance.clone();
        let mut stopping = instance.stopping.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = tokio::time::sleep(delay) => instance.ready.store(true, Ordering::SeqCst),
                _ = stopping.wait_for(|stop| *stop) => {}
            }
        });
    }

    pub fn profile(&self) -> &Profile {
        &self.instance.profile
    }

    /// The last requests served (at most a few hundred), oldest first: what arrived and what
    /// was answered, so tests can tell where a request went and what the server read.
    pub fn recent(&self) -> Vec<Served> {
        self.instance.recent.lock().unwrap_or_else(PoisonError::into_inner).iter().cloned().collect()
    }

    /// The request this stand-in answered with this `Audit-Id` response header, if it still
    /// remembers it.
    pub fn served(&self, audit_id: &str) -> Option<Served> {
        let recent = self.instance.recent.lock().unwrap_or_else(PoisonError::into_inner);
        recent.iter().rev().find(|s| s.audit_id == audit_id).cloned()
    }

    /// Watch requests received, by `resource.version.group` (`pods.v1` for core), whatever
    /// their outcome.
    pub fn watch_requests(&self) -> BTreeMap<String, u64> {
        self.instance.watches.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Publishes this stand-in in the cluster, as kube-apiserver does: its address in the
    /// `kubernetes` service's EndpointSlices and its identity Lease ([`publish`]). A graceful
    /// [`Standin::shutdown`] takes both away again; [`Standin::kill`] leaves them.
    pub fn publish(&self) -> Result<()> {
        publish::publish(&self.instance.store, &self.id, self.addr)
            .map_err(|s| anyhow::anyhow!("publishing stand-in {}: {}", self.id, s.message))?;
        *self.instance.published.lock().unwrap_or_else(PoisonError::into_inner) = true;
        Ok(())
    }

    /// The name of this stand-in's identity Lease.
    /// Makes each of Envoy's health checks (`/readyz`, `User-Agent: Envoy/HC`) that arrives in
    /// the next `window` answer only after `delay`: an apiserver too busy for a moment to answer
    /// them in time, while the sidecar's own probes still get through.
    pub fn slow_health_checks(&self, window: Duration, delay: Duration) {
        let until = tokio::time::Instant::now() + window;
        *self.instance.slow_health_checks.lock().unwrap_or_else(PoisonError::into_inner) =
            Some((until, delay));
    }

    pub fn lease_name(&self) -> String {
        publish::lease_name(&self.id)
    }

    /// How long after a CRD changes in the store this stand-in's discovery shows it (its
    /// objects are served at once, as they are by every apiserver sharing etcd).
    pub fn set_discovery_lag(&self, lag: Duration) {
        *self.instance.crds.lag.lock().unwrap_or_else(PoisonError::into_inner) = lag;
    }

    /// Stops accepting, ends every watch and waits (a few seconds at most) for connections to
    /// close. A published stand-in leaves the EndpointSlice and deletes its Lease first, as a
    /// stopping kube-apiserver removes itself before it stops serving.
    pub async fn shutdown(mut self) {
        if *self.instance.published.lock().unwrap_or_else(PoisonError::into_inner) {
            if let Err(s) = publish::unpublish(&self.instance.store, &self.id, self.addr) {
                eprintln!("stand-in {}: unpublishing: {}", self.id, s.message);
            }
        }
        self.stop.send_replace(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }

    /// Dies the way a killed process does: the listener and every connection close at once,
    /// requests in flight get no answer. Returns once the port is free again.
    pub async fn kill(mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            // Aborting drops the accept loop, its listener and (through its JoinSet) every
            // connection task; awaiting makes sure that has happened.
            let _ = task.await;
        }
    }
}

impl Drop for Standin {
    fn drop(&mut self) {
        self.stop.send_replace(true);
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Starts a stand-in. A busy port is an error naming the address.
/// `store` is an `Arc<Store>` shared in-process or a [`RemoteStore`].
pub async fn serve(options: Options, store: impl Into<StoreHandle>) -> Result<Standin> {
    start(options, store.into(), Startup::NONE, true).await
}

/// Starts a stand-in whose `/readyz` fails from its first request on, as a starting
/// kube-apiserver's does; [`Standin::ready_after`] or [`Standin::set_ready`] end that.
pub async fn serve_unready(options: Options, store: impl Into<StoreHandle>) -> Result<Standin> {
    start(options, store.into(), Startup::NONE, false).await
}

/// Starts a stand-in the way kube-apiserver starts ([`Startup`]): its port is taken at once
/// but refuses connections, then everyone but `system:masters` gets 403, then `/readyz` fails
/// while everything else is served, then it is ready.
pub async fn serve_booting(
    options: Options,
    store: impl Into<StoreHandle>,
    startup: Startup,
) -> Result<Standin> {
    start(options, store.into(), startup, true).await
}

async fn start(options: Options, store: StoreHandle, startup: Startup, ready: bool) -> Result<Standin> {
    let tls = Tls::new(&options.serving, &options.auth.requestheader_ca, &options.auth.client_ca)
        .with_context(|| format!("stand-in {}: TLS", options.id))?;
    let in_use = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::AddrInUse => anyhow::anyhow!("{} is already in use", options.listen),
        _ => anyhow::Error::new(e).context(format!("listening on {}", options.listen)),
    };
    // Bound but not listening: the port is ours and connections to it are refused.
    let socket = match options.listen {
        SocketAddr::V4(_) => TcpSocket::new_v4(),
        SocketAddr::V6(_) => TcpSocket::new_v6(),
    }
    .map_err(in_use)?;
    socket.set_reuseaddr(true).map_err(in_use)?;
    socket.bind(options.listen).map_err(in_use)?;
    let addr = socket.local_addr()?;
    // Ok: listening now; Err: to listen once the refusing phase is over.
    let listener = match startup.refusing.is_zero() {
        true => Ok(socket.listen(LISTEN_BACKLOG).map_err(in_use)?),
        false => Err(socket),
    };
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let catalog = Catalog::new(&options.profile);
    let requests = Arc::new(AtomicU64::new(0));
    let context =
        |what: &str| format!("stand-in {}: {what} of profile {}", options.id, options.profile.name());
    let starting = !startup.total().is_zero();
    let instance = Arc::new(Instance {
        id: options.id.clone(),
        discovery: discovery::Discovery::new(&options.profile, &addr.to_string())
            .with_context(|| context("discovery"))?,
        openapi: openapi::OpenApi::for_profile(&options.profile, &catalog)
            .with_context(|| context("OpenAPI"))?,
        version: version(&options.profile).with_context(|| context("/version"))?,
        catalog,
        profile: options.profile,
        auth: options.auth,
        store,
        identities: Mutex::new(VecDeque::new()),
        recent: Mutex::new(VecDeque::new()),
        watches: Mutex::new(BTreeMap::new()),
        ready: AtomicBool::new(ready && !starting),
        authorizing: AtomicBool::new(startup.refusing.is_zero() && startup.forbidding.is_zero()),
        starting: AtomicBool::new(starting),
        slow_health_checks: Mutex::default(),
        requests: requests.clone(),
        bookmark_interval: options.bookmark_interval,
        stopping: stopping.clone(),
        crds: discovery::CrdView::default(),
        published: Mutex::new(false),
    });
    tokio::spawn(crds::follow(instance.clone(), addr.to_string()));
    let counters =
        Counters { plaintext: Arc::new(AtomicU64::new(0)), handshake_failures: Arc::new(AtomicU64::new(0)) };
    let tls = Arc::new(tls);
    let (booting, counting) = (instance.clone(), counters.clone());
    let task = tokio::spawn(async move {
        let mut waiting = stopping.clone();
        let listener = match listener {
            Ok(listener) => listener,
            Err(socket) => {
                tokio::select! {
                    () = tokio::time::sleep(startup.refusing) => {}
                    _ = waiting.wait_for(|stop| *stop) => return,
                }
                match socket.listen(LISTEN_BACKLOG) {
                    Ok(listener) => listener,
                    Err(e) => {
                        eprintln!("stand-in {}: listening on {addr}: {e}", booting.id);
                        return;
                    }
                }
            }
        };
        if starting {
            tokio::spawn(boot(booting.clone(), startup, stopping.clone()));
        }
        accept_loop(listener, tls, booting, counting, stopping).await;
    });
    Ok(Standin {
        id: options.id,
        addr,
        plaintext_attempts: counters.plaintext,
        tls_handshake_failures: counters.handshake_failures,
        requests,
        instance,
        stop,
        task: Some(task),
    })
}

/// The phases after the listener opens: RBAC syncs, then the post-start hooks finish.
async fn boot(instance: Arc<Instance>, startup: Startup, mut stopping: tokio::sync::watch::Receiver<bool>) {
    let phases = async {
        tokio::time::sleep(startup.forbidding).await;
        instance.authorizing.store(true, Ordering::SeqCst);
        tokio::time::sleep(startup.unready).await;
        instance.starting.store(false, Ordering::SeqCst);
        instance.ready.store(true, Ordering::SeqCst);
    };
    tokio::select! {
        () = phases => {}
        _ = stopping.wait_for(|stop| *stop) => {}
    }
}

#[derive(Clone)]
struct Counters {
    plaintext: Arc<AtomicU64>,
    handshake_failures: Arc<AtomicU64>,
}

async fn accept_loop(
    listener: TcpListener,
    tls: Arc<Tls>,
    instance: Arc<Instance>,
    counters: Counters,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) {
    let mut connections = JoinSet::new();
    let connection_stop = stopping.clone();
    loop {
        let accepted = tokio::select! {
            _ = stopping.wait_for(|stop| *stop) => break,
            accepted = listener.accept() => accepted,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        match accepted {
            Ok((tcp, _)) => {
                let stop = connection_stop.clone();
                connections.spawn(connection(tcp, tls.clone(), instance.clone(), counters.clone(), stop));
            }
            // Out of file descriptors and the like: back off instead of spinning.
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    drop(listener);
    let drain = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(DRAIN_TIMEOUT, drain).await.is_err() {
        connections.abort_all();
    }
}

async fn connection(
    tcp: TcpStream,
    tls: Arc<Tls>,
    instance: Arc<Instance>,
    counters: Counters,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) {
    let mut first = [0u8; 1];
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, tcp.peek(&mut first)).await {
        Ok(Ok(1)) => {}
        _ => return,
    }
    if first[0] != 0x16 {
        counters.plaintext.fetch_add(1, Ordering::SeqCst);
        // What Go's TLS server answers to plain HTTP.
        let mut tcp = tcp;
        let _ = tcp
            .write_all(b"HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n")
            .await;
        let _ = tcp.shutdown().await;
        return;
    }
    let acceptor = TlsAcceptor::from(tls.config.clone());
    let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(stream)) => stream,
        _ => {
            counters.handshake_failures.fetch_add(1, Ordering::SeqCst);
            return;
        }
    };
    let peer = Arc::new(tls.classify(stream.get_ref().1.peer_certificates()));
    let service = service_fn(move |req| {
        let instance = instance.clone();
        let peer = peer.clone();
        async move { Ok::<_, std::convert::Infallible>(instance.handle(req, &peer).await) }
    });
    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => return,
        _ = stopping.wait_for(|stop| *stop) => {}
    }
    conn.as_mut().graceful_shutdown();
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, conn).await;
}

/// `/version`: the captured one, or one in the same shape for an era.
fn version(profile: &Profile) -> Result<Bytes> {
    if let Some(capture) = profile.capture {
        return Ok(captured::documents(capture)?.file("version.json")?.clone());
    }
    let (major, minor) = profile.major_minor();
    let commit: String = profile
        .git_version
        .bytes()
        .cycle()
        .take(40)
        .map(|b| char::from(b"0123456789abcdef"[usize::from(b % 16)]))
        .collect();
    let minimum =
        minor.parse::<u32>().map_or_else(|_| minor.to_string(), |m| m.saturating_sub(1).to_string());
    Ok(serde_json::to_vec_pretty(&json!({
        "major": major,
        "minor": minor,
        "emulationMajor": major,
        "emulationMinor": minor,
        "minCompatibilityMajor": major,
        "minCompatibilityMinor": minimum,
        "gitVersion": profile.git_version,
        "gitCommit": commit,
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": profile.go_version(),
        "compiler": "gc",
        "platform": "linux/amd64",
    }))?
    .into())
}
